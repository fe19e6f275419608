"""A run resolved once: what the settings name, looked at in the contract's order (every exit 2
before anything is written, a bucket store answering before any record is read), into the typed
plan every engine receives. The settings stay what the user said (`ScoreSettings.validate` checks
their values alone); the plan holds what they resolve to: where the output goes, where the store
lives, the inputs listed once, the questions and calibration read once, the release.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clef_cli.errors import UsageError
from clef_cli.inputs.readers import load_questions_file
from clef_cli.inputs.sources import InputFile, expand_inputs, unfound_local
from clef_cli.job.settings import ScoreSettings
from clef_cli.locations.buckets import forget as forget_buckets
from clef_cli.locations.object_store import forget as forget_objects
from clef_cli.locations.overlap import refuse_inside_store, refuse_overlap
from clef_cli.locations.uris import local_path
from clef_cli.progress import Progress
from clef_cli.release import Release, resolve_release
from clef_cli.store.atomic import ensure_writable, ensure_writable_folder, is_character_device, is_stream
from clef_cli.store.location import UPLOADS, StoreLocation, remote_location
from clef_cli.store.opening import check_store

if TYPE_CHECKING:
    from clef_cli.quality.calibrate.temperature import Calibration

Preflight = Callable[[ScoreSettings, Release], None]
"""An engine's own start-up checks (vLLM: its Python, the family), run before anything is written."""


@dataclass(frozen=True)
class OutputTarget:
    """Where the job's Parquet file is written, and where it then goes."""

    path: Path
    """The file written: the output itself, or a remote `-o`'s stage in the store's upload folder."""
    upload: str | None = None
    """The object's URI the staged file is uploaded to, whole, once written (`job/output.py`)."""
    keep_staged: bool = False
    """Keep the stage after its upload succeeded (`--keep-staged-output`)."""

    @property
    def shown(self) -> Path | str:
        """As messages, the summary and the store's history name it: the URI of a remote `-o`."""
        return self.upload or self.path

    def staged_in(self, folder: Path) -> OutputTarget:
        """A remote `-o` staged in the store folder a job locked (`lock_slot`: maybe not the first)."""
        return self if self.upload is None else replace(self, path=folder / UPLOADS / self.path.name)


@dataclass(frozen=True)
class JobPlan:
    """One run, resolved: picklable, so a Ray actor gets the same plan as the driver."""

    settings: ScoreSettings
    """As given and checked, with the model family's defaults filled in (`for_release`)."""
    release: Release
    store: StoreLocation
    output: OutputTarget
    sources: tuple[InputFile, ...]
    """The inputs, listed once: every stage reads these (a bucket prefix is one listing a run)."""
    questions: dict[str, Any] | None = None
    """The `--questions` schema, read once."""
    calibration: Calibration | None = None
    """The `--calibration` file, read once."""

    def in_store(self, store: StoreLocation) -> JobPlan:
        """The plan in the store folder a job locked: a remote `-o` staged there too."""
        return replace(self, store=store, output=self.output.staged_in(store.folder))

    def with_settings(self, settings: ScoreSettings) -> JobPlan:
        return replace(self, settings=settings)


def plan_job(
    settings: ScoreSettings,
    preflight: Preflight | None = None,
    with_weights: bool = True,
    progress: Progress | None = None,
) -> JobPlan:
    """Everything a run can check before it touches the disk, once: the settings' values, what
    their locations name, the inputs, the job's first records, the release and the engine's own
    checks (`preflight`). A run refused here leaves the filesystem as it was; the dry run plans
    the same, so it refuses what the run would."""
    from clef_cli.inputs.first_window import check_first_window

    forget_objects()  # the clients and listings of this job's environment (credentials, endpoint)
    forget_buckets()
    settings.validate()
    refuse_overlaps(settings)
    output = output_target(settings)
    store = checked_store(settings)
    output = output.staged_in(store.folder)
    questions = load_questions_file(settings.questions) if settings.questions is not None else None
    calibration = _calibration(settings.calibration)
    for location in settings.inputs:
        if unfound_local(location):  # before the checkpoint is made: nothing done
            raise UsageError(f"input not found: {location}")
    sources = tuple(expand_inputs(settings.inputs))
    if settings.columns:
        from clef_cli.inputs.table_shape import check_columns

        check_columns(settings.columns, sources)  # a column no input has: refused before anything is made
    check_store(store)  # a bucket store answers (exit 1) and is one (exit 2) before any record is read
    given, claimed, nulls = settings.questions is not None, settings.keep_columns, settings.struct_nulls
    for warning in check_first_window(
        sources, given, claimed, nulls, settings.limit, settings.columns, settings.allow_empty
    ):
        (progress or Progress()).warn(warning)
    release = resolve_release(settings.model, revision=settings.revision, with_weights=with_weights)
    settings = settings.for_release(release)
    if preflight is not None:
        preflight(settings, release)
    return JobPlan(settings, release, store, output, sources, questions, calibration)


def refuse_overlaps(settings: ScoreSettings) -> None:
    """An output never replaces an input nor lands where a later night reads its input from,
    and the store shares no place with an input or the output (`locations/overlap`), before
    anything is probed or read."""
    if settings.remote_output or not is_stream(settings.output):  # a stream replaces no file
        read = [*settings.inputs, settings.questions, settings.calibration, settings.rehead]
        refuse_overlap("-o", settings.output, read)
    if settings.checkpoint is not None:
        refuse_overlap("--checkpoint", settings.checkpoint, settings.inputs, folder=True)
        refuse_overlap("--checkpoint", settings.checkpoint, [settings.output], folder=True, what="output")
    media_roots = [*settings.limits.media_roots, *settings.limits.object_roots]
    refuse_inside_store("--media-root", media_roots, settings.checkpoint)


def output_target(settings: ScoreSettings) -> OutputTarget:
    """The output's file, checked writable (an object's bucket probed, before any record is
    read); a remote `-o` is staged in the store's upload folder (`staged_in`, once the store is
    placed)."""
    keep = settings.keep_staged_output
    if settings.remote_output:
        uri = str(settings.output)
        ensure_writable(uri, "-o")  # the bucket, before any record is read
        return OutputTarget(Path(uri.rsplit("/", 1)[1]), uri, keep)
    path = Path(settings.output)
    if path.suffix.lower() not in (".parquet", ".pq") and not is_stream(path):
        raise UsageError(f"output {path} must end in .parquet")
    ensure_writable(path, "-o")
    return OutputTarget(path, None, keep)


def store_of(settings: ScoreSettings) -> StoreLocation:
    """Where the job's store lives: a local folder (`--checkpoint`, else OUTPUT.ckpt), or a
    bucket's prefix and the cache folder it will likely use (`lock_slot` takes the one it gets)."""
    checkpoint = settings.checkpoint
    if checkpoint is None:
        path = Path(settings.output)
        return StoreLocation(path.with_name(path.name + ".ckpt"))
    local = local_path(checkpoint)
    if local is not None:
        return StoreLocation(local)
    return remote_location(str(checkpoint), settings.cache_dir)


def checked_store(settings: ScoreSettings) -> StoreLocation:
    """`store_of`, checked as an output folder is before it is made: in a folder that exists and
    can be written (a bucket store's cache folder too); never beside a character device output,
    which has no folder of its own."""
    if settings.checkpoint is None and is_character_device(Path(settings.output)):
        raise UsageError(f"-o {settings.output} is a character device: give --checkpoint, the job's store folder")
    location = store_of(settings)
    if location.remote:
        existing = next(folder for folder in (location.folder, *location.folder.parents) if folder.exists())
        ensure_writable_folder(existing, "--cache-dir")  # made when the store is opened
    else:
        ensure_writable_folder(location.folder, "the checkpoint" if settings.checkpoint is None else "--checkpoint")
    return location


def _calibration(path: Path | str | None) -> Calibration | None:
    if path is None:
        return None
    from clef_cli.quality.calibrate.temperature import load_calibration

    return load_calibration(path)
