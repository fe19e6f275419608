"""What a scoring job is told (`ScoreSettings`); what it reports back is `job/summary.py`.

Torch-free: the CLI builds and checks these before any model code is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from clef_cli.choices import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_BATCH_TOKENS,
    HiddenDtype,
    HiddenStates,
    Layout,
    OverflowPolicy,
    SpecialTokens,
)
from clef_cli.encoding.media import MediaLimits
from clef_cli.errors import UsageError
from clef_cli.inputs.columns import ColumnMapping
from clef_cli.inputs.parquet_rows import StructNulls
from clef_cli.inputs.record_size import MAX_RECORD_BYTES, ReadLimits
from clef_cli.inputs.sources import unfound_local
from clef_cli.locations.overlap import refuse_inside_store, refuse_overlap
from clef_cli.locations.uris import local_path, option_location
from clef_cli.release import DEFAULT_MODEL, Release
from clef_cli.store.atomic import ensure_writable, ensure_writable_folder, is_character_device, is_stream
from clef_cli.store.location import UPLOADS, StoreLocation, lock_slot, remote_location

if TYPE_CHECKING:
    from clef_cli.store.locks import JobLock

ENGINES = ("hf", "vllm")
MIN_CPU_KV_CACHE_GIB = 1
"""The least `--cpu-kv-cache-gib`: vLLM reads VLLM_CPU_KVCACHE_SPACE as a whole number of GiB."""


@dataclass
class VllmOptions:
    """`--engine vllm`'s options, passed through to vLLM's engine (None: vLLM's default)."""

    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int | None = None
    cpu_kv_cache_gib: float | None = None
    """The KV-cache space on the CPU build (VLLM_CPU_KVCACHE_SPACE), in whole GiB."""
    enforce_eager: bool = False
    """No compiled mode or CUDA graphs on a GPU (the CPU build always runs eager)."""

    def validate(self) -> None:
        """What vLLM would refuse only after minutes of loading, refused at once (exit 2)."""
        kv = self.cpu_kv_cache_gib
        if kv is not None and (kv < MIN_CPU_KV_CACHE_GIB or kv != int(kv)):
            raise UsageError(
                f"--cpu-kv-cache-gib must be a whole number of GiB, {MIN_CPU_KV_CACHE_GIB} or more, not {kv:g}"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise UsageError(f"--max-model-len must be 1 or more, not {self.max_model_len}")
        memory = self.gpu_memory_utilization
        if memory is not None and not 0 < memory <= 1:
            raise UsageError(f"--gpu-memory-utilization must be above 0 and at most 1, not {memory:g}")
        if self.tensor_parallel_size is not None and self.tensor_parallel_size < 1:
            raise UsageError(f"--tensor-parallel-size must be 1 or more, not {self.tensor_parallel_size}")


@dataclass
class ScoreSettings:
    """Everything `clef score` can be told; a library caller builds this directly."""

    inputs: Sequence[str | Path]
    """Local paths or URIs (resolved by `locations/`, expanded by `inputs/sources`)."""
    output: Path
    model: str | None = DEFAULT_MODEL
    """None with `rehead`: the model the checkpoint's manifest names (as train-head does)."""
    revision: str | None = None
    questions: Path | str | None = None
    """`--questions`: a path or a URI (`readers.load_questions_file`)."""
    max_length: int | None = None
    """None: the model family's default (64000 for Clef-Omni, 16384 for the dense family)."""
    overflow: OverflowPolicy = OverflowPolicy.truncate
    struct_nulls: StructNulls = StructNulls.refuse
    """What a null inside a Parquet struct column of state/questions means (see parquet_rows)."""
    special_tokens: SpecialTokens = SpecialTokens.text
    """Whether special-token strings in a record's text stay text (default) or become control
    tokens, as the reference reads them (`parse`, for trusted data)."""
    limits: MediaLimits = field(default_factory=MediaLimits)
    max_record_bytes: int = MAX_RECORD_BYTES
    """`--max-record-bytes`: a bigger JSONL line, table cell or state is that record's error,
    refused unread (inputs/record_size.py)."""
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    device: str = "auto"
    dtype: str | None = None
    layout: str = "wide"
    keep_columns: tuple[str, ...] = ()
    columns: ColumnMapping | None = None
    """`--columns` / `--state-columns`: the input columns the record fields come from."""
    limit: int | None = None
    allow_empty: bool = False
    """Inputs with no record write a 0-row output instead of being refused (`--allow-empty`)."""
    workers: int | None = None
    """Background encoding processes; None: none on the CPU (the model already uses every core);
    beside a GPU every usable core but one, bounded by memory (`pool_size.default_workers`)."""
    window: int = 8192
    checkpoint: Path | str | None = None
    """A local folder (a path or a file: URI; `validate` makes it a Path) or a bucket's prefix
    (`s3://bucket/prefix/`: a store in the bucket, with a local cache folder; store/remote/)."""
    cache_dir: Path | None = None
    """Where a bucket store's cache folders live (default $CLEF_CACHE_DIR, $XDG_CACHE_HOME/clef, ~/.cache/clef)."""
    sync_every: float = 30.0
    """Seconds between two syncs of a bucket store (a kill loses at most that much work)."""
    sync_failure_limit: float = 300.0
    """Seconds a bucket store's syncs may keep failing before the job stops (exit 1, its work kept in the cache)."""
    confirm_restart: bool = False
    """--restart on a bucket store discards what every machine shares: refused without this."""
    store_folder: Path | None = None
    """A bucket store's cache folder: where `validate` expects it (the first free one), then the one
    a job chose and locked (`with_locked_slot`: a second job takes the next free one)."""
    hidden_states: str = "keep"
    keep_below: float = 0.6
    """`selective`: keep the states of records whose confidence (as `clef review` orders) is below this."""
    keep_sample: float = 0.02
    """`selective`: and of this fraction of the rest, chosen by a hash of the record key."""
    hidden_dtype: str = "bfloat16"
    restart: bool = False
    verify_media: bool = False
    """Hash every local media file again instead of trusting the store's stat cache
    (store/media_stats.py)."""
    row_group_size: int = 16384
    rehead: Path | None = None
    calibration: Path | str | None = None
    """A `clef calibrate` file applied when the output is written; not part of the checkpoint's
    settings, so a finished job can be recalibrated without running the model."""
    engine: str = "hf"
    """hf: transformers in this process; vllm: vLLM as the backbone, in its own process (engines/vllm/)."""
    vllm: VllmOptions | None = None
    upload: str | None = None
    """An object-store URI the output is uploaded to, whole, once written; `output` is then its
    local copy in the checkpoint (`job/output.py`)."""
    keep_staged_output: bool = False
    """Keep that local copy after its upload succeeded (`--keep-staged-output`); by default it goes."""
    media_spool_bytes: int = 32 << 30
    """Disk for media tensors kept from planning (beside the checkpoint, a quarter of the free
    space at most), so that media are decoded once, not twice."""

    def for_release(self, release: Release) -> ScoreSettings:
        """These settings with the defaults that depend on the model family filled in."""
        if self.max_length is not None:
            return self
        from clef_cli.families import family_of

        return replace(self, max_length=family_of(release).default_max_length)

    @property
    def read_limits(self) -> ReadLimits:
        """What the job's readers refuse unread: a record over --max-record-bytes, an inline
        medium over --max-file-bytes."""
        return ReadLimits(self.max_record_bytes, self.limits.max_file_bytes)

    @property
    def destination(self) -> Path | str:
        """Where the output ends up, as messages name it: the URI of a remote `-o`, else the file."""
        return self.upload or self.output

    @property
    def checkpoint_path(self) -> Path:
        """The store's local folder: the store itself, or a bucket store's cache."""
        if self.store_folder is not None:
            return self.store_folder
        return Path(self.checkpoint) if self.checkpoint else self.output.with_name(self.output.name + ".ckpt")

    @property
    def store(self) -> StoreLocation:
        """Where the store lives (store/location.py): a bucket store's cache folder is chosen once
        (the first free one), then kept, also by copies of these settings."""
        if self.store_folder is None and isinstance(self.checkpoint, str) and local_path(self.checkpoint) is None:
            location = remote_location(self.checkpoint, self.cache_dir)
            self.checkpoint, self.store_folder = location.uri, location.folder
        return StoreLocation(self.checkpoint_path, str(self.checkpoint) if self.store_folder is not None else None)

    def with_locked_slot(self) -> tuple[ScoreSettings, JobLock | None]:
        """A bucket store's cache folder chosen and locked in one step (one another job on this
        machine holds is skipped: `lock_slot`), with these settings moved into it (a remote -o's
        stage too); the lock is the caller's. A folder store: no lock (`job_locks` takes it)."""
        location = self.store
        if not location.remote:
            return self, None
        chosen, lock = lock_slot(location)
        if chosen.folder == self.store_folder:
            return self, lock
        staged = self.upload is not None and self.store_folder is not None
        staged = staged and self.output.is_relative_to(self.store_folder / UPLOADS)  # type: ignore[operator]
        output = chosen.folder / UPLOADS / self.output.name if staged else self.output
        return replace(self, store_folder=chosen.folder, output=output), lock

    def validate(self) -> None:
        self._validate_locations()
        if self.model is None and self.rehead is None:
            raise UsageError("give --model: only --rehead takes the model from the checkpoint")
        try:
            self.struct_nulls = StructNulls(self.struct_nulls)  # a library caller may pass the name
        except ValueError:
            raise UsageError(f"--struct-nulls must be refuse, absent or null, not {self.struct_nulls!r}") from None
        try:
            self.special_tokens = SpecialTokens(self.special_tokens)
        except ValueError:
            raise UsageError(f"--special-tokens must be text or parse, not {self.special_tokens!r}") from None
        for name, choice in (("layout", Layout), ("hidden_states", HiddenStates), ("hidden_dtype", HiddenDtype)):
            value = getattr(self, name)
            if value not in {member.value for member in choice}:
                allowed = ", ".join(member.value for member in choice)
                raise UsageError(f"--{name.replace('_', '-')} must be one of {allowed}, not {value!r}")
        if self.max_record_bytes < 1:
            raise UsageError(f"--max-record-bytes must be 1 byte or more, not {self.max_record_bytes}")
        for name in ("keep_below", "keep_sample"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UsageError(f"--{name.replace('_', '-')} must be between 0 and 1, not {getattr(self, name)}")
        if self.engine not in ENGINES:
            raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
        if self.vllm is not None:
            self.vllm.validate()
        if self.output.suffix.lower() not in (".parquet", ".pq") and not is_stream(self.output):
            raise UsageError(f"output {self.upload or self.output} must end in .parquet")
        if self.upload is None:  # else the output goes to the checkpoint's upload folder, made then
            ensure_writable(self.output, "-o")
        else:
            ensure_writable(self.upload, "-o")  # the bucket, before any record is read
        self._validate_checkpoint()
        if self.keep_columns:
            from clef_cli.job.output import check_keep_columns

            check_keep_columns(self.keep_columns)
        if self.questions is not None:
            from clef_cli.inputs.readers import load_questions_file

            load_questions_file(self.questions)  # before anything is made: a refused run writes nothing
        if self.calibration is not None:
            from clef_cli.quality.calibrate.temperature import load_calibration

            load_calibration(self.calibration)
        for location in self.inputs:
            if unfound_local(location):  # before the checkpoint is made: nothing done
                raise UsageError(f"input not found: {location}")
        if self.columns:
            from clef_cli.inputs.table_shape import check_columns

            check_columns(self.columns, self.inputs)  # a column no input has: refused before anything is made

    def _validate_locations(self) -> None:
        """Every location the job is given passes the one check (`uris.location_problem`): no
        control character, no credentials (put them in the environment), before anything is read."""
        for location in self.inputs:
            option_location(location, "input")
        option_location(self.upload or self.output, "-o")
        if self.checkpoint is not None:
            option_location(self.checkpoint, "--checkpoint")
        self._validate_overlaps()

    def _validate_overlaps(self) -> None:
        """An output never replaces an input nor lands where a later night reads its input from,
        and the store shares no place with an input or the output (`locations/overlap`), before
        anything is probed or read."""
        if self.upload is not None or not is_stream(self.output):  # a stream replaces no file
            refuse_overlap("-o", self.destination, [*self.inputs, self.questions, self.calibration, self.rehead])
        if self.checkpoint is not None and str(self.checkpoint).strip():
            refuse_overlap("--checkpoint", self.checkpoint, self.inputs, folder=True)
            refuse_overlap("--checkpoint", self.checkpoint, [self.destination], folder=True, what="output")
        refuse_inside_store("--media-root", [*self.limits.media_roots, *self.limits.object_roots], self.checkpoint)

    def _validate_checkpoint(self) -> None:
        """The store's folder through the checks an output folder gets (`atomic`), before it is
        made: a local folder (`locations/uris` tells a URI's), never a file, in a folder that exists and
        can be written; a character device output has no folder to hold a store beside it."""
        if self.checkpoint is None and is_character_device(self.output):
            raise UsageError(f"-o {self.output} is a character device: give --checkpoint, the job's store folder")
        if self.checkpoint is not None and not str(self.checkpoint).strip():  # an unset variable in a cron line
            raise UsageError(
                f"--checkpoint {str(self.checkpoint)!r} names no folder; give the store's folder, or leave "
                "--checkpoint out for OUTPUT.ckpt"
            )
        if self.checkpoint is not None:
            path = local_path(self.checkpoint)
            if path is None:
                self._validate_remote_store(str(self.checkpoint))
                return
            self.checkpoint = path
        ensure_writable_folder(self.checkpoint_path, "the checkpoint" if self.checkpoint is None else "--checkpoint")

    def _validate_remote_store(self, text: str) -> None:
        """A store in a bucket: its URI's form, its options, where its cache folder will be made; a
        remote -o is staged in that cache."""
        if self.store_folder is None:
            location = remote_location(text, self.cache_dir)
            self.checkpoint, self.store_folder = location.uri, location.folder
        assert self.store_folder is not None
        if not self.sync_every > 0:
            raise UsageError(f"--sync-every must be above 0 seconds, not {self.sync_every:g}")
        if not self.sync_failure_limit > 0:
            raise UsageError(f"--sync-failure-limit must be above 0 seconds, not {self.sync_failure_limit:g}")
        if self.restart and not self.confirm_restart:
            raise UsageError(
                f"--restart on the store {self.checkpoint} would discard what every machine using it shares: "
                "add --confirm-restart to do it"
            )
        existing = next(folder for folder in (self.store_folder, *self.store_folder.parents) if folder.exists())
        ensure_writable_folder(existing, "--cache-dir")  # made when the store is opened
        if self.upload is not None and not self.output.is_absolute():  # named, not yet placed (cli/score_options)
            self.output = self.store_folder / UPLOADS / self.output.name
