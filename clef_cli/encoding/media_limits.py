"""What a media entry may cost and where it may come from: the limits every decoder checks, the
remote-fetch policy and the local media roots. One picklable object, so that encoding workers
(processes, Ray actors) apply exactly the job's rules."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_cli.errors import UsageError
from clef_cli.inputs.record_size import MAX_FILE_BYTES
from clef_cli.locations.fence import Roots
from clef_cli.locations.public_address import allow_list_problem
from clef_cli.locations.remote_fetch import FetchPolicy
from clef_cli.locations.uris import LocationProblem, is_object_uri, masked, normalized, option_location

KEY_FIELDS = ("max_image_pixels", "max_audio_seconds", "max_video_seconds", "max_file_bytes", "allow_remote")
"""The fields that shape a prompt, in `as_dict` (every record key hashes them): never add one here
without meaning to change every stored key."""
COUNTS = {"max_image_pixels": ("--max-image-pixels", "40000000"), "max_file_bytes": ("--max-file-bytes", "256M")}
SECONDS = {
    "max_audio_seconds": ("--max-audio-seconds", "1800"),
    "max_video_seconds": ("--max-video-seconds", "300"),
    "remote_timeout_seconds": ("remote_timeout_seconds", "30"),
}


class MediaError(Exception):
    """A media entry that cannot be used; the encoder attaches the record and field. `transient`:
    it may work next time (a remote fetch that failed), so the result is not stored as final.
    Credentials in a URI it quotes are masked (`uris.masked`): it becomes an error cell."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(masked(message))
        self.transient = transient


@dataclass(frozen=True)
class MediaLimits:
    """Bounds on what one media entry may cost; each breach is that record's error."""

    max_image_pixels: int = 40_000_000
    max_audio_seconds: float = 1800.0
    max_video_seconds: float = 300.0
    max_file_bytes: int = MAX_FILE_BYTES
    allow_remote: bool = False
    remote_timeout_seconds: float = 30.0
    allowed_media_domains: tuple[str, ...] = ()
    """Hosts remote media may come from, at every redirect hop (`*.example.com`: its subdomains);
    empty: any public host."""
    allow_private_media_hosts: bool = False
    """Fetch from loopback, private and link-local addresses too (a local media server)."""
    media_roots: tuple[Path, ...] = ()
    """Folders every local media path must lie in, symlinks and `..` resolved; empty: anywhere."""
    object_roots: tuple[str, ...] = ()
    """Object-store folders (`s3://bucket/media/`) media may come from besides the folder of the
    input that names them (--media-root given as a URI)."""
    remote_spool: Path | None = None
    """Where the job keeps each remote medium it fetched while keying (set by the job): workers
    decode those bytes, so a URL is fetched once per job and the key hashes what is decoded."""

    def __post_init__(self) -> None:
        """Every guard fails closed: a limit that is not a positive number, or an allow-list or
        media root that could not mean what it says, is refused here (a `UsageError` naming the
        option), so no caller, the CLI or a library one, can build limits that let more through."""
        _check_numbers(self)
        domains, roots = self.allowed_media_domains, self.media_roots
        if isinstance(domains, str) or not isinstance(domains, (tuple, list)):
            raise UsageError(f"--allowed-media-domains: {domains!r} is not a list of host names; give a tuple of them")
        if isinstance(roots, (str, Path)) or not isinstance(roots, (tuple, list)):
            raise UsageError(f"--media-root: {roots!r} is not a list of folders; give a tuple of paths")
        for entry in domains:
            if (problem := allow_list_problem(entry)) is not None:
                raise UsageError(f"--allowed-media-domains: {entry!r} {problem}")
        for root in roots:
            _check_root(root)
        object.__setattr__(self, "object_roots", _object_roots(self.object_roots))
        object.__setattr__(self, "allowed_media_domains", tuple(domains))
        object.__setattr__(self, "media_roots", tuple(Path(root) for root in roots))

    @property
    def roots(self) -> Roots:
        """--media-root, local folders and object folders: the fence's allow-list (`fence.place`)."""
        return Roots(self.media_roots, self.object_roots)

    def as_dict(self) -> dict[str, Any]:
        """The limits that shape a prompt (in the record key's prompt digest). Where media may
        come from does not: a refused entry is keyed by why, a fetched one by its bytes."""
        return {name: getattr(self, name) for name in KEY_FIELDS}

    def as_metadata(self) -> dict[str, Any]:
        """`as_dict` plus where remote media may come from, for the output's `clef.media_limits`:
        a reader sees the allow-list and the private-hosts flag a job ran under (readers that
        recompute keys take only `KEY_FIELDS` from it)."""
        return {
            **self.as_dict(),
            "allowed_media_domains": list(self.allowed_media_domains),
            "allow_private_media_hosts": self.allow_private_media_hosts,
        }

    def fetch_policy(self) -> FetchPolicy:
        return FetchPolicy(
            max_bytes=self.max_file_bytes,
            timeout_seconds=self.remote_timeout_seconds,
            allowed_domains=self.allowed_media_domains,
            allow_private=self.allow_private_media_hosts,
        )


def key_limits(metadata: dict[str, Any]) -> dict[str, Any]:
    """The `KEY_FIELDS` of an output's `clef.media_limits` (`as_metadata`, or an older `as_dict`):
    what a reader that recomputes record keys may pass to `MediaLimits`."""
    return {name: value for name, value in metadata.items() if name in KEY_FIELDS}


def _check_numbers(limits: MediaLimits) -> None:
    """Counts are whole numbers of at least 1, durations finite and above 0 (NaN compares false
    with everything, so it would lift the limit it stands for)."""
    for name, (option, example) in COUNTS.items():
        value = getattr(limits, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{option}: {value!r} is not a positive whole number; give one, like {example}")
    for name, (option, example) in SECONDS.items():
        value = getattr(limits, name)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value <= 0:
            raise UsageError(f"{option}: {value!r} is not a finite number of seconds above 0; give one, like {example}")


def _check_root(root: Any) -> None:
    """A media root is an absolute path to an existing folder: a relative one would depend on
    where a worker runs, a missing one or a file could not hold any media."""
    if not isinstance(root, (str, Path)) or not str(root).strip():
        raise UsageError(f"--media-root: {str(root)!r} is empty; give a folder, like --media-root /data/media")
    option_location(root, "--media-root")
    path = Path(root)
    if not path.is_absolute():
        raise UsageError(f"--media-root: '{path}' is not an absolute path; resolve it first (Path.resolve)")
    if not path.exists():
        raise UsageError(f"--media-root: '{path}' does not exist; give an existing folder")
    if not path.is_dir():
        raise UsageError(f"--media-root: '{path}' is not a folder; give the folder that holds the media")


def _object_roots(roots: Any) -> tuple[str, ...]:
    """Object-store roots, normalised as folders (`s3://b/media` means `s3://b/media/`, so the
    prefix test respects the separator); anything else is refused (fails closed)."""
    if isinstance(roots, str) or not isinstance(roots, (tuple, list)):
        raise UsageError(f"--media-root: {roots!r} is not a list of URIs; give a tuple of them")
    found = []
    for root in roots:
        if not isinstance(root, str) or not is_object_uri(root):
            raise UsageError(f"--media-root: {root!r} is not an object-store URI, like s3://bucket/media/")
        try:
            found.append(normalized(root, folder=True))
        except LocationProblem as problem:
            raise UsageError(f"--media-root: {problem}") from None
    return tuple(found)
