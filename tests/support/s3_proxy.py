"""A forwarding HTTP proxy in front of a test S3 server: it counts the requests a job makes, can
answer 503 to the next N requests for a key (a throttling store), and can add a fixed delay to
every request (a cloud GET's latency, for the feed benchmark), or hold the requests naming a key
until the test lets them go (an upload in flight, to kill its job)."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

SLOW_DOWN = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code><Message>Slow down</Message></Error>"
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


@dataclass(frozen=True)
class Answered:
    method: str
    path: str
    """With the query, unquoted."""
    status: int
    range: str | None
    """The request's Range header (a ranged GET), if any."""


@dataclass
class S3Proxy:
    upstream: str
    delay_seconds: float = 0.0
    requests: list[tuple[str, str]] = field(default_factory=list)
    """(method, path with the query) of every request, in order."""
    answered: list[Answered] = field(default_factory=list)
    """Every request the store answered (not those the proxy failed), with its status and range."""
    bytes_sent: int = 0
    """Response body bytes the proxy passed on (what the job downloaded)."""
    bytes_received: int = 0
    """Request body bytes the proxy passed on (what the job uploaded)."""
    failures: dict[str, int] = field(default_factory=dict)
    """Substring of "METHOD /path?query" (a key, or "PUT /bucket/key" for one method) -> how many
    more requests it matches get `failure_status`."""
    failure_status: int = 503
    """What a failing request is answered (503 SlowDown: retried; 400: refused at once)."""
    failure_code: str = "SlowDown"
    """The S3 error code a failing request's body names (AccessDenied: a role that may not write)."""
    hold: Callable[[str, str], bool] | None = None
    """Which requests, by (method, path with the query), wait after their body arrived until
    `release` is set; `held` is set when the first one arrives."""
    dropped_headers: set[str] = field(default_factory=set)
    """Request headers (lower case) not passed on: `if-none-match`, a store that ignores the condition."""
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> str:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes | None:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    parts = []
                    while (size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)) > 0:
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                    while self.rfile.readline().strip():  # trailers
                        pass
                    return b"".join(parts)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None

            def _forward(self) -> None:
                body = self._body()
                with proxy.lock:
                    proxy.requests.append((self.command, unquote(self.path)))
                    proxy.bytes_received += len(body or b"")
                    named = f"{self.command} {self.path}"
                    failing = next((key for key, left in proxy.failures.items() if left > 0 and key in named), None)
                    if failing is not None:
                        proxy.failures[failing] -= 1
                if proxy.delay_seconds:
                    time.sleep(proxy.delay_seconds)
                if proxy.hold is not None and proxy.hold(self.command, unquote(self.path)):
                    proxy.held.set()
                    proxy.release.wait(120)
                if failing is not None:
                    code = proxy.failure_code
                    body = SLOW_DOWN.replace(b"SlowDown", code.encode()) if code != "SlowDown" else SLOW_DOWN
                    payload = b"" if self.command == "HEAD" else body
                    self.send_response(proxy.failure_status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                target = urlsplit(proxy.upstream)
                connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                dropped = HOP_HEADERS | proxy.dropped_headers
                headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                payload = answer.read()
                with proxy.lock:
                    seen = Answered(self.command, unquote(self.path), answer.status, self.headers.get("Range"))
                    proxy.answered.append(seen)
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_HEADERS and key.lower() != "content-length":
                        self.send_header(key, value)
                length_header = answer.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length_header or str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                    with proxy.lock:
                        proxy.bytes_sent += len(payload)
                connection.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def count(self, method: str, key_part: str = "") -> int:
        with self.lock:
            return sum(1 for m, path in self.requests if m == method and key_part in path)

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()
            self.answered.clear()
            self.bytes_sent = self.bytes_received = 0


TEST_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "clef-test",
    "AWS_SECRET_ACCESS_KEY": "clef-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
"""The credentials every S3 test gives the job (moto accepts any)."""


def point_at(monkeypatch: object, endpoint: str) -> None:
    """The job's environment aimed at `endpoint` (a proxy's URL) with the test credentials, and
    nothing else of the caller's AWS setup (profiles, tokens, another endpoint)."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)  # type: ignore[attr-defined]
    for name, value in {"AWS_ENDPOINT_URL": endpoint, **TEST_ENVIRONMENT}.items():
        monkeypatch.setenv(name, value)  # type: ignore[attr-defined]


def emptied(client: object, bucket: str) -> None:
    """Delete every object of `bucket` (boto3 `client`), then the bucket."""
    for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):  # type: ignore[attr-defined]
        client.delete_object(Bucket=bucket, Key=item["Key"])  # type: ignore[attr-defined]
    client.delete_bucket(Bucket=bucket)  # type: ignore[attr-defined]
