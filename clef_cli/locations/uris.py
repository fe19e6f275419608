"""What a location string is: a local path, a local-filesystem URI (`file:///abs`, `local:`), or
an object in a store (`s3://bucket/key`), and an object URI's one normal form.

A record's object URI is untrusted text the job's credentials would act on, so it is normalised
once (`normalized`: the scheme in lower case, `.` and `..` resolved as in a path, no query string,
which could point the credentials at another endpoint) and the same text is then tested against
the roots (`is_under`, separator aware) and read.

Every location string, a record's or an option's, first passes one check (`location_problem`):
no control character (C0 or DEL), no lone surrogate, no credentials in it. What pyarrow's S3 client
(the AWS SDK for C++ over libcurl) sends was measured against an S3 server: it cuts each path
segment at a NUL (the SDK URL-encodes a segment's C string) and libcurl then resolves `.` and `..`
segments, so `media/..\\x00/media-private/x.png` was sent as `media-private/x.png`; every other
character (the rest of C0, DEL, backslash, `%`, `?`, `#`, spaces, trailing dots, any Unicode) is
percent-encoded and reaches the store as written, and pyarrow refuses an empty segment. So with
control characters refused and `.`, `..` and empty segments resolved here, the string tested
against the roots is the key the store is asked for. Credentials (`s3://KEY:SECRET@bucket`,
`https://user:pass@host`) are refused and, in every message, masked (`shown`).
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
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_AUTHORITY = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#]*)@")
"""A location's user info: all of its authority before the last `@` (as pyarrow parses it)."""
_USER_INFO = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://)([^/?#\s'\"]*)@")
"""User info in free text (a message quoting a location): up to its last `@` before the path, as
`_AUTHORITY` (a secret may hold an `@`)."""
CREDENTIAL_SCHEMES = ("s3", "s3a", "gs", "gcs", "http", "https")
"""Schemes whose user info is a credential (an access key, a user name): all of it is refused and
masked. Elsewhere (`abfs://container@account...`, `hdfs://user@host`) only a password is."""
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
    if (match := _AUTHORITY.match(text)) is not None and _is_credential(match):
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


def _is_credential(match: re.Match[str]) -> bool:
    """Whether a (scheme, user info) match holds a credential (see `CREDENTIAL_SCHEMES`)."""
    return match.group(1)[:-3].lower() in CREDENTIAL_SCHEMES or ":" in match.group(2)


def masked(text: str) -> str:
    """`text` with every credential in a URI masked (`s3://***@bucket/...`,
    `abfs://container:***@account...`): what any message, error cell or log may say."""
    return _USER_INFO.sub(_mask, _AUTHORITY.sub(_mask, text, count=1))


def shown(text: str) -> str:
    """A location as messages name it: `masked`, and control characters and lone surrogates
    escaped (`\\x00`), so nothing a record wrote can hide or forge a line."""
    found = _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", masked(text))
    return _SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", found)


def _mask(match: re.Match[str]) -> str:
    scheme, info = match.group(1), match.group(2)
    if not _is_credential(match):
        return match.group()
    if scheme[:-3].lower() in CREDENTIAL_SCHEMES:
        return f"{scheme}***@"
    user, _, _ = info.partition(":")
    return f"{scheme}{user}:***@"


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
