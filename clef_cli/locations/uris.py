"""What a location string is: a local path, a local-filesystem URI (`file:///abs`, `local:`), or
an object in a store (`s3://bucket/key`), and an object URI's one normal form.

A record's object URI is untrusted text the job's credentials would act on, so it is normalised
once (`normalized`: the scheme in lower case, `.` and `..` resolved as in a path, no query string,
which could point the credentials at another endpoint) and the same text is then tested against
the roots (`is_under`, separator aware) and read.

Every location string, a record's or an option's, first passes one check (`location_problem`):
no control character (C0, DEL, C1, and the line and paragraph separators U+2028 and U+2029, which
log viewers break lines at), no lone surrogate, no credentials in it. What pyarrow's S3 client
(the AWS SDK for C++ over libcurl) sends was measured against an S3 server: it cuts each path
segment at a NUL (the SDK URL-encodes a segment's C string) and libcurl then resolves `.` and `..`
segments, so `media/..\\x00/media-private/x.png` was sent as `media-private/x.png`; every other
character (the rest of C0, DEL, backslash, `%`, `?`, `#`, spaces, trailing dots, any Unicode) is
percent-encoded and reaches the store as written, and pyarrow refuses an empty segment. So with
control characters refused and `.`, `..` and empty segments resolved here, the string tested
against the roots is the key the store is asked for. Credentials (`s3://KEY:SECRET@bucket`,
`https://user:pass@host`) are refused and, in every message, masked (`shown`). A secret may hold a
`/` (about half of AWS secret keys do) or an `@`, so the user info is not only what stands before
the first `/` (RFC 3986): an authority whose head holds a `:` that is no port (a bucket never holds
one) runs to the location's last `@`, and masking more than the secret is the safe mistake.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from clef_cli.errors import UsageError

LOCAL_SCHEMES = ("file", "local")
"""pyarrow's schemes for the local filesystem; they also work without `//` (`file:/abs`)."""
NOT_OBJECT_SCHEMES = ("http", "https", "data", *LOCAL_SCHEMES)
"""Schemes that are not an object store: http(s) media go through the checked fetcher, data: URLs
are bytes, file:/local: are local paths."""
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")
_OBJECT_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(/[^?#]*)?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""C0, DEL, C1 (U+0085 ends a line to many log viewers, U+009B starts a terminal's escape) and the
Unicode line and paragraph separators: refused in a location, escaped wherever text is shown."""
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SCHEME_AT = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*)://")
"""Where a URI starts, in a location or in free text (a message quoting one)."""
_HEAD_END = {True: re.compile(r"[/?#]"), False: re.compile(r"[/?#\s'\"]")}
"""Where an authority ends as RFC 3986 reads it: in a whole location, in free text."""
_TEXT_END = re.compile(r"[\s'\"]")
"""Where a location quoted in free text ends (a secret may hold `/`, `?`, `#` and `@`)."""
_HOST_PORT = re.compile(r"(?:[^:@]*@)?(?:\[[^\]]*\]|[^:@\[\]]*)(?::\d*)?")
"""An authority's head that is a host with a port (`host:8020`, `[::1]:80`, `user@host:8020`)."""
CREDENTIAL_SCHEMES = ("s3", "s3a", "gs", "gcs", "http", "https")
"""Schemes whose user info is a credential (an access key, a user name): all of it is refused and
masked. Elsewhere (`abfs://container@account...`, `hdfs://user@host`) only a password is."""
BUCKET_SCHEMES = ("s3", "s3a", "gs", "gcs")
"""Schemes whose authority is a bucket: no `:` stands in one, so any `:` there starts a secret."""
CREDENTIALS = "a user name or password in a location is refused; put credentials in the environment"


class LocationProblem(Exception):
    """A location one record named cannot be used (missing, outside the fence, unreadable): that
    record's error. `transient`: it may work next run (the store kept failing)."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(masked(message))
        self.transient = transient


def location_problem(text: str) -> str | None:
    """Why `text` may not name a location, or None: THE check every location string passes (a
    record's media entry, an input, an output, a root, the store's URIs) before it is resolved,
    fenced or sent. Refused: a control character (C0 or DEL: a NUL cuts an S3 key, see the module's
    note), a lone surrogate (no bytes to send), credentials in the URI (`CREDENTIALS`)."""
    if _CONTROL.search(text):
        return "a control character in a location is refused"
    if _SURROGATE.search(text):
        return "a lone surrogate (text that is not Unicode) in a location is refused"
    if (match := _SCHEME_AT.match(text)) is not None:
        end = _user_info(text, match, whole=True)
        if end is not None and _is_credential(match.group(1), text[match.end() : end]):
            return CREDENTIALS
    return None


def checked(text: str) -> str:
    """`text` if it passes `location_problem`, else a `LocationProblem` naming it (`shown`)."""
    problem = location_problem(text)
    if problem is not None:
        raise LocationProblem(f"{problem}: {shown(text)}")
    return text


def option_location(location: str | Path, option: str) -> None:
    """An option's location (an input, -o, --checkpoint, --media-root): a usage error if it fails
    `location_problem`."""
    problem = location_problem(str(location))
    if problem is not None:
        raise UsageError(f"{option} {shown(str(location))}: {problem}")


def _user_info(text: str, scheme: re.Match[str], whole: bool) -> int | None:
    """Where the user info of the URI `scheme` starts ends (the index of its `@`), or None: the last
    `@` before the path, or, when the authority's head holds a `:` that is no port, the last `@` of
    the location (a secret may hold `/`: `s3://KEY:se/cret@bucket/a.png`). `whole`: `text` is one
    location (else it ends at a space or a quote)."""
    start = scheme.end()
    end = len(text) if whole else _first(_TEXT_END, text, start, len(text))
    head_end = _first(_HEAD_END[whole], text, start, end)
    head = text[start:head_end]
    if ":" in head and (scheme.group(1).lower() in BUCKET_SCHEMES or not _HOST_PORT.fullmatch(head)):
        at = text.rfind("@", start, end)
        if at >= head_end:
            return at
    at = text.rfind("@", start, head_end)
    return at if at >= 0 else None


def _first(pattern: re.Pattern[str], text: str, start: int, end: int) -> int:
    found = pattern.search(text, start, end)
    return end if found is None else found.start()


def _is_credential(scheme: str, info: str) -> bool:
    """Whether a scheme's user info holds a credential (see `CREDENTIAL_SCHEMES`)."""
    return scheme.lower() in CREDENTIAL_SCHEMES or ":" in info


def masked(text: str) -> str:
    """`text` with every credential in a URI masked (`s3://***@bucket/...`,
    `abfs://container:***@account...`): what any message, error cell or log may say. A text that
    starts with a URI is read as one location (a secret may then hold a space)."""
    pieces, done = [], 0
    for scheme in _SCHEME_AT.finditer(text):
        if scheme.start() < done:
            continue
        end = _user_info(text, scheme, whole=scheme.start() == 0)
        info = "" if end is None else text[scheme.end() : end]
        if end is None or not _is_credential(scheme.group(1), info):
            continue
        kept = "" if scheme.group(1).lower() in CREDENTIAL_SCHEMES else info.partition(":")[0] + ":"
        pieces += [text[done : scheme.end()], kept, "***"]
        done = end
    return "".join(pieces) + text[done:]


def escaped(text: str) -> str:
    """`text` with control characters (`_CONTROL`) and lone surrogates escaped (`\\x85`,
    `\\u2028`): one line that can neither hide nor forge another, in a message, a cell or a log."""
    found = _CONTROL.sub(lambda match: _escape(match.group()), text)
    return _SURROGATE.sub(lambda match: _escape(match.group()), found)


def _escape(character: str) -> str:
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> str:
    """A location as messages name it: `masked`, and control characters and lone surrogates
    escaped (`escaped`), so nothing a record wrote can hide or forge a line."""
    return escaped(masked(text))


def is_uri(location: str | Path) -> bool:
    """A string with a scheme (`s3://...`, `file:/...`); a `Path` is always local."""
    if isinstance(location, Path):
        return False
    match = _SCHEME.match(location)
    return match is not None and ("://" in location or match.group(1).lower() in LOCAL_SCHEMES)


def is_object_uri(location: str) -> bool:
    """A URI of an object store (`s3://b/k`), not http(s), data: or a local-filesystem URI."""
    match = _OBJECT_URI.match(location) if "://" in location else None
    return match is not None and match.group(1).lower() not in NOT_OBJECT_SCHEMES


def opened(uri: str) -> tuple[Any, str]:
    """(pyarrow filesystem, its path) for a URI; one it cannot open is a usage error."""
    import pyarrow.fs as pafs

    option_location(uri, "cannot open")
    try:
        return pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError, ImportError) as error:
        raise UsageError(f"cannot open {shown(uri)}: {shown(str(error))}") from None


def local_path(location: str | Path) -> Path | None:
    """The local path a location names (a plain path or a local-filesystem URI); None if remote,
    told by the scheme alone (no filesystem is opened, so a bucket is never asked). A location
    that fails `location_problem` is a usage error (only options come here)."""
    option_location(location, "location")
    if not is_uri(location):
        return Path(location)
    match = _SCHEME.match(str(location))
    if match is None or match.group(1).lower() not in LOCAL_SCHEMES:
        return None
    import pyarrow.fs as pafs

    filesystem, path = opened(str(location))
    return Path(path) if isinstance(filesystem, pafs.LocalFileSystem) else None


def normalized(uri: str, folder: bool = False) -> str:
    """`uri` with its scheme in lower case and `.`/`..`/empty segments resolved; a query string,
    a fragment, a climb above the bucket or a string `location_problem` refuses is a
    `LocationProblem`. `folder`: end in `/`."""
    match = _OBJECT_URI.match(checked(uri))
    if match is None:
        raise LocationProblem(f"not a usable object URI (no query strings or fragments): {shown(uri)!r}")
    scheme, bucket, path = match.group(1).lower(), match.group(2), match.group(3) or "/"
    if not bucket:
        raise LocationProblem(f"no bucket in {shown(uri)!r}")
    parts: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if not parts:
                raise LocationProblem(f"{shown(uri)!r} climbs above its bucket")
            parts.pop()
        elif segment not in ("", "."):
            parts.append(segment)
    tail = "/".join(parts)
    if folder or (path.endswith("/") and tail):
        tail = tail + "/" if tail else ""
    return f"{scheme}://{bucket}/{tail}"


def object_uri(text: str, what: str) -> str:
    """`text` as one object's normalised URI (not a folder), or a usage error naming `what` (the
    option or table it came as)."""
    try:
        uri = normalized(text)
    except LocationProblem as problem:
        raise UsageError(f"{what} {shown(text)!r}: {problem}") from None
    if uri.endswith("/"):
        raise UsageError(f"{what} {shown(text)!r}: give an object's URI, not a folder")
    return uri


def joined(folder: str, entry: str) -> str:
    """A relative media entry resolved against an object folder, as a path is against a folder."""
    return normalized(normalized(folder, folder=True) + entry)


def is_under(uri: str, root: str) -> bool:
    """Whether normalised `uri` lies inside the folder `root` (`s3://b/media-x/a` is not under
    `s3://b/media`): the root is compared with its trailing separator."""
    return uri.startswith(normalized(root, folder=True)) and not uri.endswith("/")


def parent(uri: str) -> str:
    return uri.rsplit("/", 1)[0] + "/"


def bucket_root(uri: str) -> str:
    """`scheme://bucket` of an object URI."""
    scheme, _, rest = uri.partition("://")
    return f"{scheme}://{rest.partition('/')[0]}"
