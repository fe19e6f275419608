"""The scoring actor of a `--ray` run: one scorer per actor, built by the job's own engine.

Each actor asks the engine the settings name (`engines.choice.local_engine`: the HF engine, or
vLLM as its backbone) for its scorer, its refusals and its end, through the same calls a local
run makes, so an engine added there runs on Ray unchanged. With `--engine vllm` the actor owns
one vLLM worker (a child process on the actor's GPUs, `--tensor-parallel-size` of them), which
ends with the actor: closed when Ray lets the actor go, killed with it otherwise (the worker asks
Linux for that), and the shared-memory files of a killed actor are removed by the next actor on
the node that starts a worker (transport.remove_orphans).

A block's objects in a store are read ahead of its encoding, a few at a time (`ObjectPrefetch`),
into the job's copy where this node sees it (keying filled it: an object costs one GET per job),
else into a folder of the actor's own in the node's temporary folder, emptied after each block.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from clef_cli import faults
from clef_cli.encoding.batching import PlanEntry, plan_batches
from clef_cli.encoding.encoded import EncodedRecord
from clef_cli.encoding.media_limits import MediaLimits
from clef_cli.encoding.object_prefetch import ObjectPrefetch
from clef_cli.encoding.remote_spool import RemoteSpool
from clef_cli.engines.ray.hidden import tag, write_hidden
from clef_cli.errors import RecordError
from clef_cli.inputs.records import InvalidRecord, Record, RecordBuilder
from clef_cli.job.settings import ScoreSettings
from clef_cli.locations.fence import media_base
from clef_cli.model.scoring import BatchOutcome, BatchRunner
from clef_cli.release import resolve_release
from clef_cli.results import FailedRecord, results_table
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


def node_spool(limits: MediaLimits) -> tuple[MediaLimits, RemoteSpool | None]:
    """The limits the actor encodes with, and its own spool: the job's copy of its objects where
    this node sees it (None), else a fresh folder of the actor's own in the node's temporary
    folder, so a block's objects are read ahead on any node."""
    folder = limits.remote_spool
    if folder is None or folder.is_dir():
        return limits, None
    own = RemoteSpool.fresh(Path(tempfile.mkdtemp(prefix="clef-actor-media-")))
    return replace(limits, remote_spool=own.folder), own


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
        self.own_spool: RemoteSpool | None = None
        release = resolve_release(settings.model, revision=settings.revision)
        settings = settings.for_release(release)
        limits, self.own_spool = node_spool(settings.limits)
        settings = replace(settings, limits=limits)
        self.prefetch = ObjectPrefetch(limits)
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
        self.hidden_dir = hidden_dir
        """Where the store's writers put hidden-state shards (a folder, or a store in a bucket)."""
        self.keep = (keep or KeepPolicy()) if self.hidden_dir is not None else KeepPolicy(DROP)
        """Whose states are written (the driver's policy, its sample drawn from the driver's ledger)."""
        self.hidden_dtype = HIDDEN_DTYPES[settings.hidden_dtype]

    def __del__(self) -> None:
        """Ray lets the actor go (the pool is done): the engine's worker ends with it."""
        if getattr(self, "engine", None) is not None:
            self.engine.close()
        if getattr(self, "prefetch", None) is not None:
            self.prefetch.close()
        if getattr(self, "own_spool", None) is not None:
            shutil.rmtree(self.own_spool.folder, ignore_errors=True)

    def _record(self, row: dict[str, Any]) -> Record | FailedRecord:
        index = row["record_index"]
        if row["problem"] is not None:
            return FailedRecord(None, index, row["problem"])  # a line whose id cannot be read
        base_dir = media_base(row["base_dir"])
        record = self.builder.build(pickle.loads(row["payload"]), index, base_dir, row["cells"])
        if isinstance(record, InvalidRecord):
            return FailedRecord(record.id, record.index, record.error)
        return record

    def _encoded(self, rows: list[dict[str, Any]]) -> Iterator[EncodedRecord | FailedRecord]:
        """The block's records in order, each encoded once its objects are in the spool (the
        block's reads all started first); the actor's own spool is emptied after the block."""
        built = [self._record(row) for row in rows]
        records = [item for item in built if isinstance(item, Record)]
        ready = dict(zip((record.index for record in records), self.prefetch.records(records), strict=True))
        try:
            for item in built:
                if isinstance(item, FailedRecord):
                    yield item
                    continue
                if (reading := ready[item.index]) is not None:
                    reading.result()  # a record's own failure is kept in the spool, for the encoder
                yield self._encode(item)
        finally:
            if self.own_spool is not None:
                self.own_spool = RemoteSpool.fresh(self.own_spool.folder)

    def _encode(self, record: Record) -> EncodedRecord | FailedRecord:
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
        for item in self._encoded(block.to_pylist()):
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
