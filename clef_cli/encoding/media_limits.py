"""What a media entry may cost and where it may come from: the limits every decoder checks, the
remote-fetch policy and the local media roots. One picklable object, so that encoding workers
(processes, Ray actors) apply exactly the job's rules."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_cli.encoding.remote_fetch import FetchPolicy


class MediaError(Exception):
    """A media entry that cannot be used; the encoder attaches the record and field. `transient`:
    it may work next time (a remote fetch that failed), so the result is not stored as final."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class MediaLimits:
    """Bounds on what one media entry may cost; each breach is that record's error."""

    max_image_pixels: int = 40_000_000
    max_audio_seconds: float = 1800.0
    max_video_seconds: float = 300.0
    max_file_bytes: int = 256 * 1024 * 1024
    allow_remote: bool = False
    remote_timeout_seconds: float = 30.0
    allowed_media_domains: tuple[str, ...] = ()
    """Hosts remote media may come from, at every redirect hop (`*.example.com`: its subdomains);
    empty: any public host."""
    allow_private_media_hosts: bool = False
    """Fetch from loopback, private and link-local addresses too (a local media server)."""
    media_roots: tuple[Path, ...] = ()
    """Folders every local media path must lie in, symlinks and `..` resolved; empty: anywhere."""
    remote_spool: Path | None = None
    """Where the job keeps each remote medium it fetched while keying (set by the job): workers
    decode those bytes, so a URL is fetched once per job and the key hashes what is decoded."""

    def as_dict(self) -> dict[str, Any]:
        """The limits that shape a prompt (in the record key's prompt digest). Where media may
        come from does not: a refused entry is keyed by why, a fetched one by its bytes."""
        return {
            "max_image_pixels": self.max_image_pixels,
            "max_audio_seconds": self.max_audio_seconds,
            "max_video_seconds": self.max_video_seconds,
            "max_file_bytes": self.max_file_bytes,
            "allow_remote": self.allow_remote,
        }

    def fetch_policy(self) -> FetchPolicy:
        return FetchPolicy(
            max_bytes=self.max_file_bytes,
            timeout_seconds=self.remote_timeout_seconds,
            allowed_domains=self.allowed_media_domains,
            allow_private=self.allow_private_media_hosts,
        )
