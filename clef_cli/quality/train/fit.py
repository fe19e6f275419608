"""Fitting the joint head on stored hidden states: the loss, the optimiser schedule, the epoch
loop and held-out prediction. The job around it (folds, gate, files) is `train_head.py`.

The backbone is frozen, so a training example is a stored record's hidden states plus, per
question, the position of its gold option. States are read from the checkpoint batch by batch
(`hidden_store.load_states`), never all at once.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from clef_cli.encoding.batching import PlanEntry, plan_batches
from clef_cli.inputs.records import QUESTION_TYPES
from clef_cli.model.head import JointSchemaHead, SchemaLayout, build_layout
from clef_cli.store.hidden_store import StoredRecord, load_states, pad_states

SCORE_TYPE = QUESTION_TYPES["score"]
MAX_BATCH_SIZE = 64
GRADIENT_CLIP = 1.0


@dataclass(frozen=True)
class Example:
    """One gold-labelled stored record (read without its states)."""

    stored: StoredRecord
    targets: tuple[int, ...]
    """Per question (head order): the gold option's position, -1 when the question has no gold."""


@dataclass(frozen=True)
class FitSettings:
    epochs: int = 30
    """Most epochs; the learning-rate schedule spans them."""
    lr: float = 1e-3
    batch_tokens: int = 4096
    label_smoothing: float = 0.05
    brier_weight: float = 1.0
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    patience: int = 5
    """Epochs without a better inner-validation log loss before training stops."""
    min_epochs: int = 10
    """No early stop before this many epochs: the validation loss can sit on a plateau near
    chance for several epochs before the head finds the signal (measured: up to 6)."""
    validation_fraction: float = 0.15
    """Share of the training records held out (by duplicate group) for early stopping."""


def question_grid(flat_logits: torch.Tensor, layout: SchemaLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Per question log-probabilities `[Qn, K]` (softmax over its own options) and the mask of
    real option slots; padded slots hold -inf."""
    grid = flat_logits.new_full((layout.num_questions, layout.max_options_per_question), float("-inf"))
    grid[layout.option_question, layout.option_rank] = flat_logits.float()
    present = torch.zeros_like(grid, dtype=torch.bool)
    present[layout.option_question, layout.option_rank] = True
    return grid.log_softmax(dim=-1), present


def question_losses(
    log_probs: torch.Tensor,
    present: torch.Tensor,
    targets: torch.Tensor,
    question_types: torch.Tensor,
    label_smoothing: float,
    brier_weight: float,
) -> torch.Tensor:
    """Per labelled question: label-smoothed cross-entropy + brier_weight x multiclass Brier
    (+ the ranked probability score for `score` questions); `targets` >= 0 only."""
    probs = log_probs.exp()
    options = present.sum(dim=-1).to(probs.dtype)
    onehot = torch.zeros_like(probs).scatter_(1, targets[:, None], 1.0)
    safe_log = log_probs.masked_fill(~present, 0.0)
    smoothed = (1 - label_smoothing) * onehot + label_smoothing * present.to(probs.dtype) / options[:, None]
    cross_entropy = -(smoothed * safe_log).sum(dim=-1)
    brier = ((probs - onehot) ** 2).sum(dim=-1)
    cumulative = (probs.cumsum(dim=-1) - onehot.cumsum(dim=-1)) ** 2
    steps = present.clone()
    steps[torch.arange(len(options), device=steps.device), options.long() - 1] = False  # the last CDF step is always 0
    rps = (cumulative * steps).sum(dim=-1) / (options - 1).clamp(min=1)
    return cross_entropy + brier_weight * brier + (question_types == SCORE_TYPE).to(probs.dtype) * rps


def _autocast(device: torch.device) -> Any:
    """bf16 autocast for the stored states on a GPU; plain fp32 on the CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def _forward(
    head: JointSchemaHead, lexical: torch.Tensor, chosen: Sequence[Example], device: torch.device
) -> tuple[torch.Tensor, SchemaLayout]:
    states = load_states([example.stored for example in chosen])
    length = max(state.shape[0] for state in states)
    stored_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hidden = pad_states(states, length, stored_dtype).to(device)
    records = [example.stored.encoded for example in chosen]
    layout = build_layout([r.questions for r in records], [r.input_ids for r in records], length).to(device)
    with _autocast(device):
        flat = head(hidden, lexical, layout)
    return flat.float(), layout


def _plan(examples: Sequence[Example], batch_tokens: int) -> list[list[int]]:
    """Length-sorted token-budget batches, exactly as the scorer plans its forwards."""
    entries = [PlanEntry(position, example.stored.length) for position, example in enumerate(examples)]
    return [batch.indices for batch in plan_batches(entries, batch_tokens, MAX_BATCH_SIZE)]


@dataclass
class FitResult:
    curve: list[float]
    """Mean training loss per epoch run."""
    validation_curve: list[float] = field(default_factory=list)
    """Inner-validation log loss per epoch (empty without a validation split)."""
    best_epoch: int = 0
    """Epochs run by the weights kept (the best on the inner validation, or all of them)."""


def _schedule(settings: FitSettings, steps_per_epoch: int) -> Callable[[int], float]:
    """Linear warm-up over `warmup_fraction` of the planned steps, then a cosine to zero."""
    total = max(1, settings.epochs * steps_per_epoch)
    warmup = max(1, math.ceil(settings.warmup_fraction * total))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    return factor


def _batch_loss(
    head: JointSchemaHead, lexical: torch.Tensor, chosen: Sequence[Example], settings: FitSettings, device: torch.device
) -> torch.Tensor:
    """The training loss, averaged over each record's labelled questions, then over the records."""
    flat, layout = _forward(head, lexical, chosen, device)
    log_probs, present = question_grid(flat, layout)
    targets = torch.tensor([t for example in chosen for t in example.targets], device=device)
    labelled = targets >= 0
    losses = question_losses(
        log_probs[labelled],
        present[labelled],
        targets[labelled],
        layout.question_types[labelled],
        settings.label_smoothing,
        settings.brier_weight,
    )
    owners = layout.question_record[labelled]
    per_record = losses.new_zeros(len(chosen)).index_add_(0, owners, losses)
    counts = torch.bincount(owners, minlength=len(chosen)).clamp(min=1)
    return (per_record / counts).mean()


def held_out_log_loss(
    head: JointSchemaHead, lexical: torch.Tensor, examples: Sequence[Example], batch_tokens: int, device: torch.device
) -> float:
    """Mean over records of the mean over labelled questions of -ln p(gold)."""
    per_record = []
    for example, probs in zip(examples, predict(head, lexical, examples, batch_tokens, device), strict=True):
        losses = [-math.log(max(float(p[t]), 1e-300)) for p, t in zip(probs, example.targets, strict=True) if t >= 0]
        per_record.append(sum(losses) / len(losses))
    head.train()
    return sum(per_record) / len(per_record)


def fit(
    head: JointSchemaHead,
    lexical: torch.Tensor,
    examples: Sequence[Example],
    settings: FitSettings,
    seed: int,
    device: torch.device,
    on_epoch: Callable[[int, float], None] | None = None,
    validation: Sequence[Example] = (),
    stop_after: int | None = None,
) -> FitResult:
    """Train `head` (fp32, in place) on `examples`.

    AdamW; the learning rate follows `_schedule` over `settings.epochs` epochs. With `validation`
    records, their log loss is measured after every epoch, training stops `patience` epochs after
    the best one (never before `min_epochs`), and the best epoch's weights are kept. `stop_after`
    ends the run after that many epochs on the same schedule (the final head repeats the folds'
    stopping point). Batch order is shuffled per epoch with `seed`, so a seed fixes every number
    on one CPU.
    """
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    plan = _plan(examples, settings.batch_tokens)
    head.float().to(device).train()
    optimizer = torch.optim.AdamW(head.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(settings, len(plan)))
    result, best_loss, best_state, best_epoch = FitResult([]), math.inf, None, 0
    for epoch in range(min(settings.epochs, stop_after or settings.epochs)):
        loss_sum = 0.0
        for batch_number in torch.randperm(len(plan), generator=generator).tolist():
            chosen = [examples[position] for position in plan[batch_number]]
            loss = _batch_loss(head, lexical, chosen, settings, device)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), GRADIENT_CLIP)
            optimizer.step()
            scheduler.step()
            loss_sum += float(loss.detach()) * len(chosen)
        result.curve.append(loss_sum / max(1, len(examples)))
        result.best_epoch = epoch + 1
        if on_epoch is not None:
            on_epoch(epoch, result.curve[-1])
        if validation:
            result.validation_curve.append(held_out_log_loss(head, lexical, validation, settings.batch_tokens, device))
            if result.validation_curve[-1] < best_loss:
                best_loss, best_epoch = result.validation_curve[-1], epoch + 1
                best_state = copy.deepcopy(head.state_dict())
            elif epoch + 1 - best_epoch >= settings.patience and epoch + 1 >= settings.min_epochs:
                break
    if best_state is not None:
        head.load_state_dict(best_state)
        result.best_epoch = best_epoch
    return result


def predict(
    head: JointSchemaHead,
    lexical: torch.Tensor,
    examples: Sequence[Example],
    batch_tokens: int,
    device: torch.device,
) -> list[list[torch.Tensor]]:
    """Per example, per question: option probabilities (head order, float64 on the CPU)."""
    head.to(device).eval()
    results: list[list[torch.Tensor] | None] = [None] * len(examples)
    with torch.no_grad():
        for indices in _plan(examples, batch_tokens):
            chosen = [examples[position] for position in indices]
            flat, layout = _forward(head, lexical, chosen, device)
            log_probs, _ = question_grid(flat, layout)
            probs = log_probs.double().exp().cpu()
            sizes = layout.options_per_question
            question = 0
            for position, example in zip(indices, chosen, strict=True):
                count = len(example.targets)
                results[position] = [probs[question + q, : sizes[question + q]] for q in range(count)]
                question += count
    return [result for result in results if result is not None]
