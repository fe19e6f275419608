"""What a scoring job is told (`ScoreSettings`); what it reports back is `job/summary.py`.

Torch-free: the CLI builds and checks these before any model code is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from clef_cli.choices import (
    DEFAULT_KEEP_BELOW,
    DEFAULT_KEEP_SAMPLE,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_SYNC_EVERY,
    DEFAULT_SYNC_FAILURE_LIMIT,
    DEFAULT_WINDOW,
    Choice,
    Engine,
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
from clef_cli.locations.uploads import checked_uri
from clef_cli.locations.uris import local_path, option_location
from clef_cli.release import DEFAULT_MODEL, Release

C = TypeVar("C", bound=Choice)

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
    """Local paths or URIs (resolved by `locations/`, expanded once by `job/plan.py`)."""
    output: Path | str
    """A local path, or an object's URI (`s3://bucket/out/x.parquet`): written in the store's
    folder first, then uploaded whole (`job/plan.OutputTarget`)."""
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
    layout: Layout = Layout.wide
    keep_columns: tuple[str, ...] = ()
    columns: ColumnMapping | None = None
    """`--columns` / `--state-columns`: the input columns the record fields come from."""
    limit: int | None = None
    allow_empty: bool = False
    """Inputs with no record write a 0-row output instead of being refused (`--allow-empty`)."""
    workers: int | None = None
    """Background encoding processes; None: none on the CPU (the model already uses every core);
    beside a GPU every usable core but one, bounded by memory (`pool_size.default_workers`)."""
    window: int = DEFAULT_WINDOW
    checkpoint: Path | str | None = None
    """A local folder (a path or a file: URI) or a bucket's prefix
    (`s3://bucket/prefix/`: a store in the bucket, with a local cache folder; store/remote/)."""
    cache_dir: Path | None = None
    """Where a bucket store's cache folders live (default $CLEF_CACHE_DIR, $XDG_CACHE_HOME/clef, ~/.cache/clef)."""
    sync_every: float = DEFAULT_SYNC_EVERY
    """Seconds between two syncs of a bucket store (a kill loses at most that much work)."""
    sync_failure_limit: float = DEFAULT_SYNC_FAILURE_LIMIT
    """Seconds a bucket store's syncs may keep failing before the job stops (exit 1, its work kept in the cache)."""
    confirm_restart: bool = False
    """--restart on a bucket store discards what every machine shares: refused without this."""
    hidden_states: HiddenStates = HiddenStates.keep
    keep_below: float = DEFAULT_KEEP_BELOW
    """`selective`: keep the states of records whose confidence (as `clef review` orders) is below this."""
    keep_sample: float = DEFAULT_KEEP_SAMPLE
    """`selective`: and of this fraction of the rest, chosen by a hash of the record key."""
    hidden_dtype: HiddenDtype = HiddenDtype.bfloat16
    restart: bool = False
    verify_media: bool = False
    """Hash every local media file again instead of trusting the store's stat cache
    (store/media_stats.py)."""
    row_group_size: int = 16384
    rehead: Path | None = None
    calibration: Path | str | None = None
    """A `clef calibrate` file applied when the output is written; not part of the checkpoint's
    settings, so a finished job can be recalibrated without running the model."""
    engine: Engine = Engine.hf
    """hf: transformers in this process; vllm: vLLM as the backbone, in its own process (engines/vllm/)."""
    vllm: VllmOptions | None = None
    keep_staged_output: bool = False
    """Keep that local copy after its upload succeeded (`--keep-staged-output`); by default it goes."""
    media_spool_bytes: int = 32 << 30
    """Disk for media tensors kept from planning (beside the checkpoint, a quarter of the free
    space at most), so that media are decoded once, not twice."""

    def __post_init__(self) -> None:
        """Enums stay enums: a library caller may pass a choice by its name."""
        self.struct_nulls = _choice(StructNulls, self.struct_nulls, "--struct-nulls")
        self.special_tokens = _choice(SpecialTokens, self.special_tokens, "--special-tokens")
        self.overflow = _choice(OverflowPolicy, self.overflow, "--on-overflow")
        self.layout = _choice(Layout, self.layout, "--layout")
        self.hidden_states = _choice(HiddenStates, self.hidden_states, "--hidden-states")
        self.hidden_dtype = _choice(HiddenDtype, self.hidden_dtype, "--hidden-dtype")
        self.engine = _choice(Engine, self.engine, "--engine")

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
    def remote_store(self) -> bool:
        """`--checkpoint` names a store in a bucket (its cache folder is the plan's: job/plan.py)."""
        return isinstance(self.checkpoint, str) and local_path(self.checkpoint) is None

    @property
    def remote_output(self) -> bool:
        """`-o` names an object (written in the store's folder first, then uploaded whole)."""
        return isinstance(self.output, str) and local_path(self.output) is None

    def validate(self) -> None:
        """The values alone, as given: no file is looked at, nothing is changed (what they name is
        checked by `job/plan.plan_job`, in the order of the contract: exit 2 before anything)."""
        self._validate_locations()
        if self.model is None and self.rehead is None:
            raise UsageError("give --model: only --rehead takes the model from the checkpoint")
        if self.max_record_bytes < 1:
            raise UsageError(f"--max-record-bytes must be 1 byte or more, not {self.max_record_bytes}")
        for name in ("keep_below", "keep_sample"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UsageError(f"--{name.replace('_', '-')} must be between 0 and 1, not {getattr(self, name)}")
        if self.vllm is not None:
            self.vllm.validate()
        self._validate_output()
        self._validate_checkpoint()
        if self.keep_columns:
            from clef_cli.job.output import check_keep_columns

            check_keep_columns(self.keep_columns)

    def _validate_locations(self) -> None:
        """Every location the job is given passes the one check (`uris.location_problem`): no
        control character, no credentials (put them in the environment), before anything is read."""
        for location in self.inputs:
            option_location(location, "input")
        option_location(self.output, "-o")
        if self.checkpoint is not None:
            option_location(self.checkpoint, "--checkpoint")

    def _validate_output(self) -> None:
        """An object's `-o` is staged in the job's store before its upload: it needs one."""
        if not self.remote_output:
            return
        checked_uri(str(self.output), "-o")
        if self.checkpoint is None:
            raise UsageError(
                f"-o {self.output}: an output in an object store needs --checkpoint (a local folder, or a store "
                "in a bucket: s3://bucket/store/)"
            )

    def _validate_checkpoint(self) -> None:
        """`--checkpoint` names a folder (an unset variable in a cron line names none); a store in
        a bucket takes its sync options and discards nothing shared without a confirmation."""
        if self.checkpoint is not None and not str(self.checkpoint).strip():
            raise UsageError(
                f"--checkpoint {str(self.checkpoint)!r} names no folder; give the store's folder, or leave "
                "--checkpoint out for OUTPUT.ckpt"
            )
        if not self.remote_store:
            return
        if not self.sync_every > 0:
            raise UsageError(f"--sync-every must be above 0 seconds, not {self.sync_every:g}")
        if not self.sync_failure_limit > 0:
            raise UsageError(f"--sync-failure-limit must be above 0 seconds, not {self.sync_failure_limit:g}")
        if self.restart and not self.confirm_restart:
            raise UsageError(
                f"--restart on the store {self.checkpoint} would discard what every machine using it shares: "
                "add --confirm-restart to do it"
            )


def _choice(kind: type[C], value: C | str, option: str) -> C:
    try:
        return kind(value)
    except ValueError:
        allowed = " or ".join(", ".join(member.value for member in kind).rsplit(", ", 1))
        raise UsageError(f"{option} must be {allowed}, not {value!r}") from None
