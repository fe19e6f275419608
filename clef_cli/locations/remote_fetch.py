"""The one way clef fetches a remote medium: every http(s) request a record causes goes here.

Each hop is checked before anything is sent: http or https only, no user:password@, the host
spelled unambiguously and within --allowed-media-domains, and every address it resolves to
public (unless --allow-private-media-hosts). The host is resolved once and the connection goes to
a checked address, so no second DNS answer is ever used; https still sends the host name (SNI)
and verifies the certificate against it. Redirects are followed by hand, each hop checked again,
at most `MAX_REDIRECTS`, never back to a URL already visited. At most `max_bytes` are read.
Proxy variables are not used: the address checked must be the one connected to.
"""

from __future__ import annotations

import functools
import http.client
import io
import ipaddress
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import quote, urljoin, urlsplit

from clef_cli.locations.public_address import (
    IPAddress,
    address_problem,
    allow_list_problem,
    described,
    domain_allowed,
    literal_address,
    spelling_problem,
)
from clef_cli.locations.uris import masked

MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)
CHUNK = 1 << 20
URL_SAFE = "!#$%&'()*+,/:;=?@[]~"
"""Kept as written in a request target; anything else (spaces, non-ASCII) is percent-encoded."""
PRIVATE_HINT = "pass --allow-private-media-hosts to fetch from a local server"


class FetchError(Exception):
    """A remote medium that was not fetched. `transient`: it may work next time (a network
    failure); a refusal (an address, a domain, a size) is not, so it is never retried. A URL it
    quotes has its credentials masked (`uris.masked`)."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(masked(message))
        self.transient = transient


@dataclass(frozen=True)
class FetchPolicy:
    """What a fetch may do (built from `MediaLimits.fetch_policy`)."""

    max_bytes: int
    timeout_seconds: float = 30.0
    allowed_domains: tuple[str, ...] = ()
    allow_private: bool = False

    def __post_init__(self) -> None:
        """An allow-list fails closed: one string (whose emptiness would mean any host) or an
        entry that is no host name is refused, never read as no restriction."""
        if isinstance(self.allowed_domains, str) or not isinstance(self.allowed_domains, (tuple, list)):
            raise ValueError(f"allowed_domains must be a tuple of host names, not {self.allowed_domains!r}")
        for entry in self.allowed_domains:
            if (problem := allow_list_problem(entry)) is not None:
                raise ValueError(f"allowed_domains: {entry!r} {problem}")
        object.__setattr__(self, "allowed_domains", tuple(self.allowed_domains))


Resolver = Callable[[str, int], list[IPAddress]]


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to (one lookup), in the resolver's order."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise FetchError(f"cannot resolve {host}: {error}", transient=True) from None
    found = [ipaddress.ip_address(str(info[4][0])) for info in infos]
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Hop:
    """One checked request: where it goes and the addresses it may connect to."""

    url: str
    scheme: str
    host: str
    port: int
    target: str
    addresses: tuple[IPAddress, ...]


def checked_hop(url: str, policy: FetchPolicy, resolver: Resolver = resolve) -> Hop:
    """The hop to `url`, or a `FetchError` saying why a record may not make it."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as error:
        raise FetchError(f"not a usable URL ({error}): {url}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise FetchError(f"only http and https media are fetched, not {scheme or 'a relative URL'}: {url}")
    if not host:
        raise FetchError(f"no host in {url}")
    if parts.username is not None or parts.password is not None:
        raise FetchError(f"a user name or password in a media URL is refused: {url}")
    try:  # the name as DNS and the Host header see it (full-width digits become ASCII ones here)
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise FetchError(f"not a usable host name in {url}") from None
    if problem := spelling_problem(host):
        raise FetchError(f"{url}: {problem}")
    if not domain_allowed(host, policy.allowed_domains):
        raise FetchError(f"{url}: host {host} is not in --allowed-media-domains")
    port = port or (443 if scheme == "https" else 80)
    literal = literal_address(host)
    addresses = [literal] if literal is not None else resolver(host, port)
    if not addresses:
        raise FetchError(f"cannot resolve {host}: no address", transient=True)
    if not policy.allow_private:
        for address in addresses:
            if (problem := address_problem(address)) is not None:
                shown = described(address)
                raise FetchError(f"{url}: host {host} resolves to a {problem} address {shown}; {PRIVATE_HINT}")
    target = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe=URL_SAFE)
    return Hop(url, scheme, host, port, target, tuple(addresses))


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The system's CA store, certificates and host names verified (built once: loading it is slow)."""
    return ssl.create_default_context()


class _PinnedConnection(http.client.HTTPConnection):
    """An HTTP(S) connection to `host` (its Host header, SNI and certificate name) made to one
    already checked address, never to whatever a new lookup of `host` would answer."""

    def __init__(self, hop: Hop, address: IPAddress, timeout: float) -> None:
        super().__init__(hop.host, hop.port, timeout=timeout)
        self.address = address
        self.tls = _tls_context() if hop.scheme == "https" else None

    def connect(self) -> None:
        sock = socket.create_connection((str(self.address), self.port), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        self.sock = sock


def _response(hop: Hop, timeout: float) -> tuple[_PinnedConnection, http.client.HTTPResponse]:
    """The response of the first checked address that takes the connection."""
    failure: Exception = OSError("no address to connect to")
    for address in hop.addresses:
        connection = _PinnedConnection(hop, address, timeout)
        try:
            connection.request("GET", hop.target, headers={"User-Agent": "clef", "Accept": "*/*"})
            return connection, connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            failure = error
    raise failure


def _read_body(url: str, response: http.client.HTTPResponse, into: BinaryIO, max_bytes: int) -> int:
    declared = response.getheader("Content-Length")
    if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
        raise FetchError(f"{url} is {int(declared)} bytes, over the limit of {max_bytes}")
    total = 0
    while chunk := response.read(min(CHUNK, max_bytes + 1 - total)):
        total += len(chunk)
        if total > max_bytes:
            raise FetchError(f"{url} is over the limit of {max_bytes} bytes")
        into.write(chunk)
    return total


def _follow(hop: Hop, policy: FetchPolicy, into: BinaryIO) -> int | str:
    """One request: the body's size (the body written to `into`), or where a redirect leads."""
    connection, response = _response(hop, policy.timeout_seconds)
    try:
        location = response.getheader("Location")
        if response.status in REDIRECTS and location:
            return urljoin(hop.url, location.strip()).partition("#")[0]
        if not 200 <= response.status < 300:
            raise FetchError(f"cannot fetch {hop.url}: HTTP {response.status} {response.reason}", transient=True)
        return _read_body(hop.url, response, into, policy.max_bytes)
    finally:
        connection.close()


def fetch_into(url: str, policy: FetchPolicy, into: BinaryIO, resolver: Resolver = resolve) -> int:
    """Write the body `url` leads to into `into` (redirects followed, every hop checked); its size."""
    visited = {url}
    for _ in range(MAX_REDIRECTS + 1):
        hop = checked_hop(url, policy, resolver)
        try:
            followed = _follow(hop, policy, into)
        except (OSError, http.client.HTTPException) as error:
            raise FetchError(f"cannot fetch {url}: {error}", transient=True) from None
        except ValueError as error:  # an answer too malformed for http.client
            raise FetchError(f"cannot fetch {url}: {error}") from None
        if isinstance(followed, int):
            return followed
        if followed in visited:
            raise FetchError(f"a redirect loop: {url} leads back to {followed}")
        visited.add(followed)
        url = followed
    raise FetchError(f"more than {MAX_REDIRECTS} redirects, the last to {url}")


def fetch(url: str, policy: FetchPolicy, resolver: Resolver = resolve) -> bytes:
    """The bytes `url` leads to, within the policy (`fetch_into` on memory)."""
    buffer = io.BytesIO()
    fetch_into(url, policy, buffer, resolver)
    return buffer.getvalue()
