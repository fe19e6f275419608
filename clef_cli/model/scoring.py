"""The library entry point: encoded records in, per-question probabilities out.

`Scorer` joins the backbone and the head for padded batches; `load_scorer` builds one from a
release. A Python user or a distributed worker calls these directly, without the CLI.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from clef_cli.choices import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_BATCH_TOKENS
from clef_cli.encoding.batching import ModelBatch, PlanEntry, plan_batches
from clef_cli.encoding.encoded import EncodedRecord
from clef_cli.errors import RecordError
from clef_cli.families import family_of
from clef_cli.inputs.json_values import child_path
from clef_cli.model.answers import question_result
from clef_cli.model.backbone import Backbone, resolve_device, resolve_dtype
from clef_cli.model.head import JointSchemaHead, build_layout, load_joint_head
from clef_cli.release import Release, resolve_release
from clef_cli.results import FailedRecord, ScoredRecord
from clef_cli.stats import JobStats, timed

MIN_BATCH_TOKENS = 256


def head_logits(
    head: JointSchemaHead,
    hidden_states: torch.Tensor,
    lexical_rows: torch.Tensor,
    records: Sequence[EncodedRecord],
) -> list[list[torch.Tensor]]:
    """Per record, per question: the option logits (head order), from padded hidden states."""
    hidden_states = hidden_states.to(lexical_rows.device, non_blocking=True)  # states an engine lent on the host
    layout = build_layout(
        [record.questions for record in records],
        [record.input_ids for record in records],
        hidden_states.shape[1],
    ).to(hidden_states.device)
    with torch.inference_mode():
        flat = head(hidden_states, lexical_rows, layout).float().cpu()
    per_question = torch.split(flat, layout.options_per_question)
    grouped, start = [], 0
    for record in records:
        grouped.append(list(per_question[start : start + len(record.questions)]))
        start += len(record.questions)
    return grouped


def scored_record(record: EncodedRecord, logits: Sequence[torch.Tensor]) -> ScoredRecord:
    return ScoredRecord(
        record_id=record.record.id,
        index=record.record.index,
        prompt_tokens=record.length,
        state_tokens_cut=record.state_tokens_cut,
        questions=tuple(
            question_result(question, question_logits)
            for question, question_logits in zip(record.record.questions, logits, strict=True)
        ),
    )


@dataclass
class Scorer:
    """A loaded thinker plus joint head; scores batches of encoded records."""

    backbone: Backbone
    head: JointSchemaHead
    pad_token_id: int
    release: Release | None = None

    def hidden_states(self, records: Sequence[EncodedRecord], batch: ModelBatch | None = None) -> torch.Tensor:
        """One right-padded forward: `[B, L, hidden]`, padding rows beyond each record's length
        (`batch`: the records already collated, by an encoding worker)."""
        return self.backbone.forward(records, batch, self.pad_token_id)

    def score_batch(self, records: Sequence[EncodedRecord]) -> list[ScoredRecord]:
        """Score records that may share a forward (same audio-in-video flag)."""
        hidden = self.hidden_states(records)
        logits = head_logits(self.head, hidden, self.backbone.lexical_rows, records)
        return [scored_record(record, record_logits) for record, record_logits in zip(records, logits, strict=True)]

    def score(
        self,
        records: Sequence[EncodedRecord],
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    ) -> list[ScoredRecord]:
        """Score any records: planned into length-sorted batches, returned in the given order."""
        entries = [PlanEntry(i, record.length, record.use_audio_in_video) for i, record in enumerate(records)]
        results: list[ScoredRecord | None] = [None] * len(records)
        for batch in plan_batches(entries, max_batch_tokens, max_batch_size):
            scored = self.score_batch([records[i] for i in batch.indices])
            for i, result in zip(batch.indices, scored, strict=True):
                results[i] = result
        return [result for result in results if result is not None]


def load_scorer(
    model: str | Release,
    device: str = "auto",
    dtype: str | None = None,
    revision: str | None = None,
) -> Scorer:
    """Load the backbone of the release's family (weights strictly checked) and its joint head."""
    from clef_cli.release import load_processor

    release = model if isinstance(model, Release) else resolve_release(model, revision=revision)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    backbone = family_of(release).load_backbone(release, torch_device, torch_dtype)
    head = load_joint_head(release.path).to(torch_device)
    if head.config.hidden_size != backbone.hidden_size:
        from clef_cli.errors import ModelLoadError

        raise ModelLoadError(
            f"the joint head expects hidden size {head.config.hidden_size}, the backbone has {backbone.hidden_size}"
        )
    tokenizer = load_processor(release).tokenizer
    return Scorer(backbone=backbone, head=head, pad_token_id=int(tokenizer.pad_token_id), release=release)


@dataclass
class BatchOutcome:
    """What one forward produced: scores for `records` (and their hidden states), failures."""

    records: list[EncodedRecord] = field(default_factory=list)
    scored: list[ScoredRecord] = field(default_factory=list)
    failures: list[FailedRecord] = field(default_factory=list)
    hidden_states: torch.Tensor | None = None


def _failure(record: EncodedRecord, message: str, kind: str) -> FailedRecord:
    return FailedRecord(record.record.id, record.record.index, message, record.length, kind)


def non_finite_question(result: ScoredRecord) -> str | None:
    """The first question whose logits or probabilities are NaN or infinite, or None."""
    for question in result.questions:
        if not all(math.isfinite(value) for value in (*question.logits, *question.probabilities)):
            return question.question_id
    return None


def non_finite_failure(result: ScoredRecord, prompt_tokens: int | None = None) -> FailedRecord | None:
    """The last guard before a result is committed: no output row holds a non-finite number."""
    question_id = non_finite_question(result)
    if question_id is None:
        return None
    error = RecordError(
        result.record_id,
        child_path("questions", question_id),
        "the model gave non-finite logits (NaN or infinity); no scores are written for this record",
    )
    return FailedRecord(result.record_id, result.index, str(error), prompt_tokens, "media")


@dataclass
class BatchRunner:
    """Runs planned batches through a scorer without ever letting one batch stop the job.

    Out of GPU memory halves the token budget and splits the batch (a record that does not fit
    even alone becomes that record's error); any other forward failure is narrowed down to the
    records that cause it, and the others are scored.
    """

    scorer: Scorer
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    on_budget_change: Callable[[int], None] | None = None
    stats: JobStats | None = None
    """Where forward and head times and padding are added up, when someone is measuring."""

    def submit(self, records: list[EncodedRecord]) -> None:
        """Start the forward of a batch `run` will take whole, where the backbone runs ahead."""
        if records and self._whole(_padded(records), len(records)):
            self.scorer.backbone.submit(records)

    def _whole(self, padded: int, count: int) -> bool:
        """Whether `run` takes `count` records, padded to `padded` tokens, in one forward."""
        return count == 1 or padded <= self.max_batch_tokens

    def run(self, records: list[EncodedRecord], batch: ModelBatch | None = None) -> Iterator[BatchOutcome]:
        """`batch`: these records already collated (by an encoding worker); when it must be split,
        its records' media are views of its tensors."""
        if not records:
            return
        padded = _padded(records)
        if not self._whole(padded, len(records)):
            yield from self._halves(batch.records if batch is not None else records)
            return
        try:
            with timed(self.stats, "forward"):
                hidden = self.scorer.hidden_states(records, batch)
                if self.stats is not None and hidden.is_cuda:  # else the head's .cpu() absorbs the forward
                    torch.cuda.synchronize(hidden.device)
            with timed(self.stats, "head"):
                logits = head_logits(self.scorer.head, hidden, self.scorer.backbone.lexical_rows, records)
        except torch.OutOfMemoryError:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if len(records) == 1:
                message = f"out of GPU memory even alone ({padded} tokens)"
                yield BatchOutcome(failures=[_failure(records[0], message, "transient")])
                return
            self.max_batch_tokens = max(MIN_BATCH_TOKENS, min(self.max_batch_tokens, padded) // 2)
            if self.on_budget_change is not None:
                self.on_budget_change(self.max_batch_tokens)
            yield from self._halves(batch.records if batch is not None else records)
            return
        except (RuntimeError, ValueError, IndexError) as error:
            if len(records) == 1:
                kind = getattr(error, "kind", None)  # an engine's refusal names its own (vllm/limits.py)
                message = str(error) if kind else f"model forward failed: {error}"
                yield BatchOutcome(failures=[_failure(records[0], message, kind or "media")])
                return
            for record in batch.records if batch is not None else records:
                yield from self.run([record])  # find the records that break the forward; score the others
            return
        if self.stats is not None:
            self.stats.forwarded([record.length for record in records])
        scored = [scored_record(record, record_logits) for record, record_logits in zip(records, logits, strict=True)]
        yield finite_outcome(records, scored, hidden)

    def _halves(self, records: list[EncodedRecord]) -> Iterator[BatchOutcome]:
        middle = len(records) // 2
        yield from self.run(records[:middle])
        yield from self.run(records[middle:])


def _padded(records: Sequence[EncodedRecord]) -> int:
    """The tokens a right-padded forward of these records runs."""
    return max(record.length for record in records) * len(records)


def finite_outcome(records: list[EncodedRecord], scored: list[ScoredRecord], hidden: torch.Tensor) -> BatchOutcome:
    """A forward's outcome with every non-finite result turned into its record's error; such a
    record's hidden states are dropped with it (they would only give the same NaN again)."""
    failures = [non_finite_failure(result, record.length) for record, result in zip(records, scored, strict=True)]
    if not any(failures):
        return BatchOutcome(records=list(records), scored=scored, hidden_states=hidden)
    rows = [row for row, failure in enumerate(failures) if failure is None]
    return BatchOutcome(
        records=[records[row] for row in rows],
        scored=[scored[row] for row in rows],
        failures=[failure for failure in failures if failure is not None],
        hidden_states=hidden[rows] if rows else None,
    )
