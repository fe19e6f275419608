"""Options shared by several commands, and the fixed choices as `str` Enums, so Typer checks them:
a bad value exits 2 with the choices listed, and `--help` shows them. Nothing here imports torch:
the library takes these values as strings (or, for --on-overflow, `choices.OverflowPolicy`)."""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from clef_cli.choices import OverflowPolicy, SpecialTokens
from clef_cli.encoding.media import MediaLimits
from clef_cli.errors import UsageError
from clef_cli.inputs.parquet_rows import StructNulls
from clef_cli.inputs.sources import local_path
from clef_cli.locations.object_store import is_object_uri
from clef_cli.sizes import parse_size
from clef_cli.store.atomic import ensure_writable, ensure_writable_folder

PANEL_INPUTS = "Inputs and prompt"
PANEL_OUTPUT = "Output"
PANEL_BATCHING = "Batching and device"
PANEL_STORE = "Store and hidden states"
PANEL_ENGINE = "Engine"
PANEL_RAY = "Ray"
PANEL_MEDIA = "Media limits"
PANEL_SECURITY = "Remote media and security"
PANELS = (PANEL_INPUTS, PANEL_OUTPUT, PANEL_BATCHING, PANEL_STORE, PANEL_ENGINE, PANEL_RAY, PANEL_MEDIA, PANEL_SECURITY)
"""The sections of a long command's `--help` (`usage.PanelledCommand`), in this order after its
unpanelled options; an option names its section with Typer's `rich_help_panel`."""


class Dtype(str, Enum):
    auto = "auto"
    bfloat16 = "bfloat16"
    float16 = "float16"
    float32 = "float32"


class TableFormat(str, Enum):
    table = "table"
    tsv = "tsv"
    markdown = "markdown"


class CalibrationMethod(str, Enum):
    auto = "auto"
    global_ = "global"
    type = "type"
    question = "question"


def size(value: Any) -> int:
    """Typer parser of a byte count: `268435456`, `256M`, `1.5G`, `64KiB`; a bad one exits 2.
    (Typer vendors its own click, with no `click.ParamType`; a parser is its way to add a type.)"""
    if isinstance(value, int):
        return value
    try:
        return parse_size(str(value))
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def device(value: Any) -> str:
    """Typer parser of auto, cpu, cuda or cuda:N; whether that GPU exists is checked at load."""
    if not DEVICE.fullmatch(str(value)):
        raise typer.BadParameter(f"{value!r} is not a device (use auto, cpu, cuda or cuda:N)")
    return str(value)


def _option_name(param: typer.CallbackParam) -> str:
    return "/".join(param.opts)


def writable_file(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """Callback of every output file option: refuse at parse time, before any work, what could
    only fail at the end (see `atomic.ensure_writable`)."""
    if value is not None:
        ensure_writable(value, _option_name(param))
    return value


def writable_location(param: typer.CallbackParam, value: str | None) -> Path | str | None:
    """`writable_file` for an output that may also be an object URI (kept as the URI: the job
    writes it locally and uploads it whole, `store/remote_output.py`)."""
    if value is None or is_object_uri(value):
        return value
    return writable_file(param, Path(value))


def writable_file_or_stdout(param: typer.CallbackParam, value: Path | str | None) -> Path | str | None:
    """The same for the JSON and report writers, which also take `-` for stdout and an object URI
    (kept as the URI: written whole by `atomic.write_file`); other text becomes a `Path`."""
    if value is None:
        return None
    if isinstance(value, str) and not (value == "-" or is_object_uri(value)):
        value = Path(value)
    ensure_writable(value, _option_name(param), stdout=True)
    return value


def writable_folder(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """The same for an output folder (train-head's head)."""
    if value is not None:
        ensure_writable_folder(value, _option_name(param))
    return value


ModelOption = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        rich_help_panel=PANEL_INPUTS,
        help="Release folder or hub id (found through the HF cache; HF_HOME and HF_HUB_OFFLINE apply).",
        envvar="CLEF_MODEL",
    ),
]
RevisionOption = Annotated[
    str | None, typer.Option("--revision", rich_help_panel=PANEL_INPUTS, help="Hub revision (branch, tag or commit).")
]
MaxLengthOption = Annotated[
    int | None,
    typer.Option(
        "--max-length",
        min=16,
        rich_help_panel=PANEL_INPUTS,
        help="Prompt token budget; the state is cut to fit. Default: the model's "
        "(64000 Clef-Omni, 16384 Clef/Clef-Flash).",
        show_default=False,
    ),
]
OverflowOption = Annotated[
    OverflowPolicy,
    typer.Option(
        "--on-overflow",
        rich_help_panel=PANEL_INPUTS,
        help="When the state does not fit: 'truncate' cuts it (the reference's behaviour), 'error' refuses the record.",
    ),
]
StructNullsOption = Annotated[
    StructNulls,
    typer.Option(
        "--struct-nulls",
        rich_help_panel=PANEL_INPUTS,
        case_sensitive=False,
        help="What a null inside a Parquet struct column of state or questions means. A struct column gives "
        "every row the keys of every record, so by default ('refuse') such a record is refused rather than "
        "scored on a prompt it may not have meant. 'absent': the record has no such key. 'null': the record "
        "set it to null. JSON-text and map columns keep each record's own keys and need no choice.",
    ),
]
SpecialTokensOption = Annotated[
    SpecialTokens,
    typer.Option(
        "--special-tokens",
        rich_help_panel=PANEL_INPUTS,
        case_sensitive=False,
        help="Special-token strings in a record's text (<|im_end|>, <|image_pad|>...): 'text' keeps them ordinary "
        "text, so a record cannot write control tokens into its prompt; 'parse' reads them as control tokens, as "
        "the reference does (trusted data only). Records without such strings get the same prompt either way.",
    ),
]
QuestionsOption = Annotated[
    Path | None,
    typer.Option(
        "--questions",
        rich_help_panel=PANEL_INPUTS,
        help="JSON file with one question schema for records that carry none.",
    ),
]
DeviceOption = Annotated[
    str,
    typer.Option(
        "--device", parser=device, metavar="DEVICE", rich_help_panel=PANEL_BATCHING, help="auto, cpu, cuda or cuda:N."
    ),
]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")]

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
            metavar="DIR|URI",
            rich_help_panel=PANEL_SECURITY,
            help="Confine local media paths to this folder (repeatable; symlinks and '..' resolved; an escape "
            "is that record's error). Default: any file the user can read. A URI (s3://bucket/media/) "
            "allows objects under it; objects are always allowed under the folder of the input naming them.",
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


class ReviewOrder(str, Enum):
    uncertainty = "uncertainty"
    margin = "margin"
    entropy = "entropy"
    random = "random"
    stratified = "stratified"


class ReviewFormat(str, Enum):
    label_studio = "label-studio"
    argilla = "argilla"
    jsonl = "jsonl"
    csv = "csv"


ReportOption = Annotated[
    str | None,
    typer.Option(
        "--report",
        callback=writable_file_or_stdout,
        metavar="<path>",
        help="Write a self-contained HTML report here (- for stdout).",
    ),
]


ScoredArgument = Annotated[
    str,
    typer.Argument(help="Parquet written by `clef score` (wide or long layout); a path or a URI (s3://...)."),
]
"""The scored file a quality command reads: text, not a Path (`Path` would fold `s3://b` into `s3:/b`)."""
