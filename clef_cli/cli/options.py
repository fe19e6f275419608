"""Options shared by several commands, and the fixed choices as `str` Enums, so Typer checks them:
a bad value exits 2 with the choices listed, and `--help` shows them. Nothing here imports torch:
the library takes these values as strings (or, for --on-overflow, `choices.OverflowPolicy`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from clef_cli.choices import OverflowPolicy, SpecialTokens
from clef_cli.errors import UsageError
from clef_cli.inputs.parquet_rows import StructNulls
from clef_cli.locations.uris import is_object_uri, local_path, option_location, shown
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


def parameter_source(ctx: typer.Context, name: str) -> str:
    """Where an option's value came from: COMMANDLINE, ENVIRONMENT, DEFAULT (click's
    `ParameterSource`, read by its name: Typer vendors click in a private module)."""
    source = ctx.get_parameter_source(name)
    return "DEFAULT" if source is None else source.name


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
    return "/".join(param.opts) if param.param_type_name == "option" else (param.name or "").upper()


Callback = TypeVar("Callback", bound=Callable[..., Any])
TAKES_URI, LOCAL_ONLY = "uri", "local"
PATH_OR_URI, DIR_OR_URI = "PATH|URI", "DIR|URI"
"""The metavars of the options that take a URI (a local-only one says PATH or DIR)."""


def location(kind: str) -> Callable[[Callback], Callback]:
    """Marks a callback as the decision of the options it checks: they name a location, and
    either take a URI (`TAKES_URI`) or only a local path (`LOCAL_ONLY`). tests/test_uri_options.py
    walks every command and feeds each marked option an s3:// URI; an unmarked option typed as
    text must be listed there as no location."""

    def marked(callback: Callback) -> Callback:
        callback.location = kind  # type: ignore[attr-defined]
        return callback

    return marked


@location(TAKES_URI)
def read_location(param: typer.CallbackParam, value: Any) -> Any:
    """Callback of every option that reads a table, a file or a folder (or a store): the text as
    given, never a `Path`, which folds `s3://b/k` into `s3:/b/k`; checked once here
    (`option_location`) and resolved by the library (`locations/`, `inputs/sources`)."""
    for one in value if isinstance(value, (list, tuple)) else [value]:
        if one is not None:
            option_location(one, _option_name(param))
    return value


def _local(param: typer.CallbackParam, value: str) -> Path:
    option_location(value, _option_name(param))  # a refusal names the option
    found = local_path(value)
    if found is None:
        raise UsageError(f"{_option_name(param)} takes a local path, not a URI: {shown(value)}")
    return found


@location(LOCAL_ONLY)
def local_location(param: typer.CallbackParam, value: str | None) -> Path | None:
    """Callback of an option that names what only this machine holds (a cache folder, a head
    folder, the folder review's media URLs are made from): a URI is refused in one line naming
    the option (exit 2), never folded into a local path; a local-filesystem URI is its path."""
    return None if value is None else _local(param, value)


@location(LOCAL_ONLY)
def release_location(param: typer.CallbackParam, value: str | None) -> str | None:
    """Callback of --model: a release folder or a hub id, as given; an object URI is refused in one
    line (a release is loaded from a local folder or the hub's cache, never from a bucket)."""
    if value is not None and is_object_uri(value):
        raise UsageError(f"{_option_name(param)} takes a release folder or a hub id, not a URI: {shown(value)}")
    return value


def writable_file(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """Callback of every output file option: refuse at parse time, before any work, what could
    only fail at the end (see `atomic.ensure_writable`)."""
    if value is not None:
        ensure_writable(value, _option_name(param))
    return value


@location(TAKES_URI)
def writable_location(param: typer.CallbackParam, value: str | None) -> Path | str | None:
    """`writable_file` for an output that may also be an object URI (kept as the URI: the job
    writes it locally and uploads it whole, `job/output.py`, which refuses one with a
    query string); a local-filesystem URI is its path."""
    if value is None:
        return None
    option_location(value, _option_name(param))  # a refusal names the option
    path = local_path(value)
    if path is None:
        return value
    return writable_file(param, path)


@location(TAKES_URI)
def writable_file_or_stdout(param: typer.CallbackParam, value: Path | str | None) -> Path | str | None:
    """The same for the JSON and report writers, which also take `-` for stdout and an object URI
    (kept as the URI: written whole by `atomic.write_file`); other text becomes a `Path`."""
    if value is None:
        return None
    if isinstance(value, str) and not (value == "-" or is_object_uri(value)):
        value = Path(value)
    ensure_writable(value, _option_name(param), stdout=True)
    return value


@location(LOCAL_ONLY)
def writable_folder(param: typer.CallbackParam, value: str | None) -> Path | None:
    """The same for an output folder (train-head's head, written file by file): a local folder;
    a URI is refused in one line."""
    if value is None:
        return None
    path = _local(param, value)
    ensure_writable_folder(path, _option_name(param))
    return path


ModelOption = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        callback=release_location,
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
    str | None,
    typer.Option(
        "--questions",
        callback=read_location,
        metavar=PATH_OR_URI,
        rich_help_panel=PANEL_INPUTS,
        help="JSON file with one question schema for records that carry none (a path or a URI).",
    ),
]
ColumnsOption = Annotated[
    str | None,
    typer.Option(
        "--columns",
        rich_help_panel=PANEL_INPUTS,
        help="FIELD=COLUMN[,...]: the input columns (Parquet or CSV/TSV columns, JSONL keys, Hive partition "
        "keys) the record fields id, state, questions, images, audio, videos come from; a column read this way "
        "reads as a column of the field's own name.",
    ),
]
StateColumnsOption = Annotated[
    str | None,
    typer.Option(
        "--state-columns",
        rich_help_panel=PANEL_INPUTS,
        help="COL[,...]: the state is a JSON object of these input columns, keyed by column name.",
    ),
]
DeviceOption = Annotated[
    str,
    typer.Option(
        "--device", parser=device, metavar="DEVICE", rich_help_panel=PANEL_BATCHING, help="auto, cpu, cuda or cuda:N."
    ),
]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")]


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
        metavar=PATH_OR_URI,
        help="Write a self-contained HTML report here (- for stdout).",
    ),
]


ScoredArgument = Annotated[
    str,
    typer.Argument(
        callback=read_location,
        help="Parquet written by `clef score` (wide, long or flat layout); a path or a URI (s3://...).",
    ),
]
"""The scored file a quality command reads: text, not a Path (`Path` would fold `s3://b` into `s3:/b`)."""
