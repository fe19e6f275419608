"""The media options (limits, remote fetching, media roots), declared once and given to every
command that decodes media (`with_media_limits`), which receives them as one `MediaLimits`."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from clef_cli.cli.options import DIR_OR_URI, PANEL_MEDIA, PANEL_SECURITY, read_location, size
from clef_cli.encoding.media import MediaLimits
from clef_cli.errors import UsageError
from clef_cli.locations.uris import is_object_uri, local_path, option_location
from clef_cli.sizes import parse_size

DEFAULT_LIMITS = MediaLimits()
MEDIA_LIMIT_OPTIONS = {
    "max_image_pixels": (
        int,
        DEFAULT_LIMITS.max_image_pixels,
        typer.Option(
            "--max-image-pixels",
            min=1,
            rich_help_panel=PANEL_MEDIA,
            help="Largest image (or video frame) accepted, in pixels.",
        ),
    ),
    "max_audio_seconds": (
        float,
        DEFAULT_LIMITS.max_audio_seconds,
        typer.Option(
            "--max-audio-seconds", min=0.1, rich_help_panel=PANEL_MEDIA, help="Longest audio clip accepted, in seconds."
        ),
    ),
    "max_video_seconds": (
        float,
        DEFAULT_LIMITS.max_video_seconds,
        typer.Option(
            "--max-video-seconds", min=0.1, rich_help_panel=PANEL_MEDIA, help="Longest video accepted, in seconds."
        ),
    ),
    "max_file_bytes": (
        int,
        "256M",
        typer.Option(
            "--max-file-bytes",
            parser=size,
            metavar="SIZE",
            rich_help_panel=PANEL_MEDIA,
            help="Largest media file accepted (bytes, or with K/M/G suffix).",
        ),
    ),
    "allow_remote": (
        bool,
        False,
        typer.Option(
            "--allow-remote-media",
            rich_help_panel=PANEL_SECURITY,
            help="Fetch http(s) media URLs (public addresses only, every redirect checked). Off by default: "
            "records may come from untrusted sources.",
        ),
    ),
    "allowed_media_domains": (
        list[str] | None,
        None,
        typer.Option(
            "--allowed-media-domains",
            metavar="HOST",
            rich_help_panel=PANEL_SECURITY,
            help="With --allow-remote-media, fetch only from these hosts (repeat the option, or separate them "
            "with commas): exact names, '*.example.com' for its subdomains; checked at every redirect.",
        ),
    ),
    "allow_private_media_hosts": (
        bool,
        False,
        typer.Option(
            "--allow-private-media-hosts",
            rich_help_panel=PANEL_SECURITY,
            help="With --allow-remote-media, also fetch from loopback, private and link-local addresses "
            "(a local media server). Off by default: a record's URL must not reach the machine's own network.",
        ),
    ),
    "media_roots": (
        list[str] | None,  # as typed: Path("") would be the working folder, so an empty value must be seen
        None,
        typer.Option(
            "--media-root",
            callback=read_location,
            metavar=DIR_OR_URI,
            rich_help_panel=PANEL_SECURITY,
            help="Allow media only under these roots (repeatable): a folder for local paths (symlinks and '..' "
            "resolved; an escape is that record's error), a URI (s3://bucket/media/) for objects. Any root "
            "fences every local path. Without one: a local input's records may name any file the user can "
            "read, a bucket's records no local file; objects are always allowed under the input's folder.",
        ),
    ),
}
REMOTE_ONLY = {
    "allowed_media_domains": "--allowed-media-domains",
    "allow_private_media_hosts": "--allow-private-media-hosts",
}


def media_limits(values: dict[str, Any]) -> MediaLimits:
    """The options' values as `MediaLimits`; a remote-fetch option without --allow-remote-media
    is refused (exit 2) rather than silently doing nothing, and so is a narrowing option whose
    value could not narrow (`MediaLimits` checks the rest): every guard fails closed."""
    if isinstance(values["max_file_bytes"], str):
        values["max_file_bytes"] = parse_size(values["max_file_bytes"])
    if not values["allow_remote"]:
        for name, option in REMOTE_ONLY.items():
            if values[name]:
                raise UsageError(f"{option} applies to remote media only: add --allow-remote-media")
    values["allowed_media_domains"] = allowed_domains(values["allowed_media_domains"] or ())
    roots = [media_root(value) for value in values["media_roots"] or ()]
    values["media_roots"] = tuple(root for root in roots if isinstance(root, Path))
    values["object_roots"] = tuple(root for root in roots if isinstance(root, str))
    return MediaLimits(**values)


def allowed_domains(values: list[str]) -> tuple[str, ...]:
    """--allowed-media-domains as entries. An empty value or part (`""`, `","`, an unset `$HOSTS`)
    is refused: dropping it would leave no list, which means any host."""
    domains: list[str] = []
    for value in values:
        parts = [part.strip() for part in value.split(",")]
        if not all(parts):
            shown = "is empty" if not value.strip() else "has an empty entry"
            raise UsageError(
                f"--allowed-media-domains: {value!r} {shown}; give host names, like example.com "
                "(to allow every public host, leave the option out)"
            )
        domains += parts
    return tuple(domains)


def media_root(value: str) -> Path | str:
    """One --media-root: an object-store folder's URI as given, else a local folder resolved (a
    local-filesystem URI too); an empty value is refused (as a path it would be the working
    folder), the rest (it exists and is a folder; a URI is usable) is `MediaLimits`'s check."""
    if not value.strip():
        raise UsageError(f"--media-root: {value!r} is empty; give a folder, like --media-root /data/media")
    option_location(value, "--media-root")
    if is_object_uri(value):
        return value
    local = local_path(value)
    if local is None:
        raise UsageError(f"--media-root: {value!r} is not a folder or an object-store URI")
    return local.resolve()


def with_media_limits(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command the media options (limits, remote fetching, media roots), written once here;
    it receives them as one `limits: MediaLimits` argument (which must be its last parameter)."""
    signature = inspect.signature(command)
    hints = typing.get_type_hints(command, include_extras=True)  # evaluated in the command's module
    kept = [
        parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(name, parameter.annotation))
        for name, parameter in signature.parameters.items()
        if name != "limits"
    ]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, option])
        for name, (kind, default, option) in MEDIA_LIMIT_OPTIONS.items()
    ]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        limits = media_limits({name: kwargs.pop(name) for name in MEDIA_LIMIT_OPTIONS})
        return command(**kwargs, limits=limits)

    wrapper.__signature__ = signature.replace(parameters=kept + added, return_annotation=None)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {parameter.name: parameter.annotation for parameter in kept + added}
    del wrapper.__wrapped__  # Typer must read the signature above, not the command's own
    return wrapper
