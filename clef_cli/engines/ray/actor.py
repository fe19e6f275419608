"""The scoring actor of a `--ray` run: one scorer per actor, built by the job's own engine.

Each actor asks the engine the settings name (`engines.choice.local_engine`: the HF engine, or
vLLM as its backbone) for its scorer, its refusals and its end, through the same calls a local
run makes, so an engine added there runs on Ray unchanged. With `--engine vllm` the actor owns
one vLLM worker (a child process on the actor's GPUs, `--tensor-parallel-size` of them), which
ends with the actor: closed when Ray lets the actor go, killed with it otherwise (the worker asks
Linux for that), and the shared-memory files of a killed actor are removed by the next actor on
the node that starts a worker (transport.remove_orphans).
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa

from clef_cli import faults
from clef_cli.encoding.batching import PlanEntry, plan_batches
from clef_cli.encoding.encoded import EncodedRecord
from clef_cli.engines.ray.hidden import tag, write_hidden
from clef_cli.errors import RecordError
from clef_cli.inputs.records import InvalidRecord, RecordBuilder
from clef_cli.inputs.sources import media_base
from clef_cli.model.scoring import BatchOutcome, BatchRunner
from clef_cli.release import resolve_release
from clef_cli.results import FailedRecord, results_table
from clef_cli.settings import ScoreSettings
from clef_cli.store.hidden_store import HIDDEN_DTYPES
from clef_cli.store.keep_policy import DROP, KeepPolicy, split_outcome

ENGINE_VERSION = "engine_version"
"""A column of each block an actor returns: the version of the engine that scored it (vLLM's;
"" for the HF engine), for the output's provenance. The driver drops it before committing."""


def _assigned_cpus() -> int:
    """The CPUs Ray gave this actor (--cpus-per-worker), at least one."""
    import ray

    return max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))


def _log_folder(folder: str | None) -> Path:
    """Where the engine's own log goes: the checkpoint folder when this node sees it, else the
    node's temporary folder (a `--hidden-states drop` job on a cluster without a shared disk)."""
    if folder and os.path.isdir(folder) and os.access(folder, os.W_OK):
        return Path(folder)
    return Path(tempfile.gettempdir())


class ScoreActor:
    """One scorer per actor; scores blocks of rows with the single-process job's own pieces."""

    def __init__(
        self,
        settings: ScoreSettings,
        questions: dict[str, Any] | None,
        hidden_dir: str | None,
        keep: KeepPolicy | None = None,
        log_dir: str | None = None,
    ) -> None:
        from clef_cli.encoding.media import set_decode_threads
        from clef_cli.encoding.prompt import PromptEncoder
        from clef_cli.engines.choice import local_engine
        from clef_cli.families import family_of
        from clef_cli.release import load_processor

        self.engine = None
        release = resolve_release(settings.model, revision=settings.revision)
        settings = settings.for_release(release)
        set_decode_threads(_assigned_cpus())  # video decoding uses the actor's CPUs (frame threading)
        self.encoder = PromptEncoder(
            load_processor(release),
            settings.max_length,
            settings.overflow,
            settings.limits,
            family_of(release),
            settings.special_tokens,
        )
        self.engine = local_engine(settings)
        scorer = self.engine.start_scorer(release, settings, _log_folder(log_dir))
        self.runner = BatchRunner(scorer, settings.max_batch_tokens)
        self.version = getattr(self.engine, "version", "")
        claimed = frozenset(settings.keep_columns)  # as the driver's ledger built them (job.job_records)
        self.builder = RecordBuilder(
            default_questions=questions, check_duplicates=False, columns=settings.columns, claimed=claimed
        )
        self.max_batch_size = settings.max_batch_size
        self.hidden_dir = Path(hidden_dir) if hidden_dir else None
        self.keep = (keep or KeepPolicy()) if self.hidden_dir is not None else KeepPolicy(DROP)
        """Whose states are written (the driver's policy, its sample drawn from the driver's ledger)."""
        self.hidden_dtype = HIDDEN_DTYPES[settings.hidden_dtype]

    def __del__(self) -> None:
        """Ray lets the actor go (the pool is done): the engine's worker ends with it."""
        if getattr(self, "engine", None) is not None:
            self.engine.close()

    def _encode(self, row: dict[str, Any]) -> EncodedRecord | FailedRecord:
        index = row["record_index"]
        if row["problem"] is not None:
            return FailedRecord(str(index), index, row["problem"])
        base_dir = media_base(row["base_dir"])
        record = self.builder.build(pickle.loads(row["payload"]), index, base_dir, json_text=row["parquet"])
        if isinstance(record, InvalidRecord):
            return FailedRecord(record.id, record.index, record.error)
        faults.in_ray_actor(record.id)
        try:
            encoded = self.encoder.encode(record)
        except RecordError as error:
            return FailedRecord(record.id, record.index, str(error), kind=error.kind or "media")
        refusal = self.engine.engine_refusal(encoded.length)
        if refusal is not None:  # what the engine cannot run (vLLM: a prompt over its limit)
            kind, message = refusal
            return FailedRecord(record.id, record.index, message, encoded.length, kind)
        return encoded

    def __call__(self, block: pa.Table) -> pa.Table:
        failures: list[FailedRecord] = []
        encoded: dict[int, EncodedRecord] = {}
        for row in block.to_pylist():
            item = self._encode(row)
            if isinstance(item, FailedRecord):
                failures.append(item)
            else:
                encoded[item.record.index] = item
        entries = [PlanEntry(index, item.length, item.use_audio_in_video) for index, item in encoded.items()]
        batches = [[encoded[index] for index in batch.indices] for batch in
                   plan_batches(entries, self.runner.max_batch_tokens, self.max_batch_size)]  # fmt: skip
        pieces = [tag(results_table([], failures), None)]
        for number, records in enumerate(batches):
            if number + 1 < len(batches):  # an engine in another process starts the next batch now
                self.runner.submit(batches[number + 1])
            for outcome in self.runner.run(records):
                pieces.extend(self._pieces(outcome))
            self.runner.scorer.backbone.release_states()  # its states are copied: the engine may reuse them
        table = pa.concat_tables(pieces)
        return table.append_column(ENGINE_VERSION, pa.array([self.version] * table.num_rows, pa.string()))

    def _pieces(self, outcome: BatchOutcome) -> list[pa.Table]:
        """One batch's result rows, tagged with the hidden shard written for those it keeps."""
        split = split_outcome(self.keep, outcome, self.hidden_dtype)
        described = None
        if split.hidden is not None and self.hidden_dir is not None:
            described = write_hidden(self.hidden_dir, split.hidden)
        pieces = [tag(results_table(split.kept, outcome.failures), described)]
        if split.rest:
            pieces.append(tag(results_table(split.rest, []), None))
        return pieces
