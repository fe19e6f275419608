"""The joint schema head (DESIGN §1, §5), vectorised over a padded batch of records.

Parameter names are the release's, so `joint_head.safetensors` loads strictly. The batch
forward reads only each record's real tokens: padded memory positions are masked out of every
attention, span means and the last-token vector come from real positions, and padded option or
question slots never reach a softmax that a real one shares.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from clef_cli.encoding.encoded import EncodedQuestion
from clef_cli.errors import ModelLoadError
from clef_cli.inputs.records import QUESTION_TYPES
from clef_cli.release import HEAD_CONFIG, HEAD_WEIGHTS

MAX_LOGIT_SCALE = math.log(100.0)


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    width: int
    routing_layers: int
    layers: int
    heads: int
    feedforward: int

    @classmethod
    def from_file(cls, path: Path) -> HeadConfig:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelLoadError(f"missing {path.name} in {path.parent}") from None
        except (OSError, json.JSONDecodeError) as error:
            raise ModelLoadError(f"cannot read {path}: {error}") from None
        names = [name for name in cls.__dataclass_fields__]
        missing = [name for name in names if name not in data]
        if missing:
            raise ModelLoadError(f"{path} lacks {', '.join(missing)}")
        return cls(**{name: int(data[name]) for name in names})


class EvidenceRoutingLayer(nn.Module):
    """Option queries cross-attend to the whole record's memory, then a feed-forward block."""

    def __init__(self, width: int, heads: int, feedforward: int) -> None:
        super().__init__()
        self.query_norm = nn.LayerNorm(width)
        self.memory_norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.feedforward_norm = nn.LayerNorm(width)
        self.feedforward = nn.Sequential(
            nn.Linear(width, feedforward), nn.GELU(), nn.Identity(), nn.Linear(feedforward, width)
        )

    def forward(
        self, queries: torch.Tensor, memory: torch.Tensor, memory_padding: torch.Tensor | None = None
    ) -> torch.Tensor:
        memory = self.memory_norm(memory)
        attended, _ = self.attention(
            self.query_norm(queries), memory, memory, key_padding_mask=memory_padding, need_weights=False
        )
        queries = queries + attended
        return queries + self.feedforward(self.feedforward_norm(queries))


@dataclass
class SchemaLayout:
    """Index tensors that place every question and option of a padded batch.

    Spans are numbered questions first (all questions of the batch), then options.
    """

    batch_size: int
    max_questions: int
    max_options: int
    max_options_per_question: int
    span_token_positions: torch.Tensor  # [T] flat indices into [B * L]
    span_token_owner: torch.Tensor  # [T] span of each of those tokens
    span_lengths: torch.Tensor  # [Qn + On]
    question_record: torch.Tensor  # [Qn]
    question_slot: torch.Tensor  # [Qn] position among its record's questions
    question_types: torch.Tensor  # [Qn]
    option_question: torch.Tensor  # [On] flat question of each option
    option_record: torch.Tensor  # [On]
    option_slot: torch.Tensor  # [On] position among its record's options
    option_rank: torch.Tensor  # [On] position among its question's options
    lexical_token_ids: torch.Tensor  # [Tl] vocabulary ids of every option token
    lexical_owner: torch.Tensor  # [Tl] option of each of those tokens
    last_positions: torch.Tensor  # [B] flat index of each record's last real token
    memory_padding: torch.Tensor  # [B, L] True at padding
    options_per_record: list[int]
    options_per_question: list[int]

    @property
    def num_questions(self) -> int:
        return int(self.question_record.shape[0])

    def to(self, device: torch.device | str) -> SchemaLayout:
        moved = {
            name: value.to(device) if isinstance(value, torch.Tensor) else value
            for name, value in self.__dict__.items()
        }
        return SchemaLayout(**moved)


def build_layout(
    questions: Sequence[Sequence[EncodedQuestion]],
    input_ids: Sequence[Sequence[int]],
    padded_length: int,
) -> SchemaLayout:
    """The layout of a right-padded batch: record b's tokens sit at [b * L, b * L + len_b)."""
    question_spans: list[tuple[int, int]] = []
    option_spans: list[tuple[int, int]] = []
    question_record, question_slot, question_types = [], [], []
    option_question, option_record, option_slot, option_rank = [], [], [], []
    lexical_token_ids: list[int] = []
    lexical_owner: list[int] = []
    options_per_record, options_per_question = [], []
    lengths = [len(ids) for ids in input_ids]
    for record, record_questions in enumerate(questions):
        offset = record * padded_length
        ids = input_ids[record]
        slot = 0
        for number, question in enumerate(record_questions):
            flat_question = len(question_spans)
            question_spans.append((offset + question.question_span[0], offset + question.question_span[1]))
            question_record.append(record)
            question_slot.append(number)
            question_types.append(question.question_type)
            options_per_question.append(len(question.option_spans))
            for rank, (start, end) in enumerate(question.option_spans):
                flat_option = len(option_spans)
                option_spans.append((offset + start, offset + end))
                option_question.append(flat_question)
                option_record.append(record)
                option_slot.append(slot)
                option_rank.append(rank)
                lexical_token_ids.extend(int(token) for token in ids[start:end])
                lexical_owner.extend([flat_option] * (end - start))
                slot += 1
        options_per_record.append(slot)
    spans = question_spans + option_spans
    if any(end <= start for start, end in spans):
        raise ValueError("every question and option span must hold at least one token")
    span_lengths = torch.tensor([end - start for start, end in spans])
    positions = torch.cat([torch.arange(start, end) for start, end in spans])
    owners = torch.repeat_interleave(torch.arange(len(spans)), span_lengths)
    memory_padding = torch.arange(padded_length)[None, :] >= torch.tensor(lengths)[:, None]
    as_long = lambda values: torch.tensor(values, dtype=torch.long)  # noqa: E731
    return SchemaLayout(
        batch_size=len(questions),
        max_questions=max(len(qs) for qs in questions),
        max_options=max(options_per_record),
        max_options_per_question=max(options_per_question),
        span_token_positions=positions,
        span_token_owner=owners,
        span_lengths=span_lengths,
        question_record=as_long(question_record),
        question_slot=as_long(question_slot),
        question_types=as_long(question_types),
        option_question=as_long(option_question),
        option_record=as_long(option_record),
        option_slot=as_long(option_slot),
        option_rank=as_long(option_rank),
        lexical_token_ids=as_long(lexical_token_ids),
        lexical_owner=as_long(lexical_owner),
        last_positions=as_long([record * padded_length + length - 1 for record, length in enumerate(lengths)]),
        memory_padding=memory_padding,
        options_per_record=options_per_record,
        options_per_question=options_per_question,
    )


def _segment_mean(values: torch.Tensor, owners: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    sums = values.new_zeros(counts.shape[0], values.shape[-1]).index_add_(0, owners, values)
    return sums / counts.to(values.dtype)[:, None]


class JointSchemaHead(nn.Module):
    """One logit per option of every question, from a prompt's final hidden states."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        width = config.width
        self.config = config
        self.hidden_norm = nn.LayerNorm(config.hidden_size)
        self.memory_projection = nn.Linear(config.hidden_size, width, bias=False)
        self.question_projection = nn.Linear(config.hidden_size, width, bias=False)
        self.option_question_projection = nn.Linear(config.hidden_size, width, bias=False)
        self.global_projection = nn.Linear(config.hidden_size, width, bias=False)
        self.option_context_projection = nn.Linear(config.hidden_size, width, bias=False)
        self.option_lexical_projection = nn.Linear(config.hidden_size, width, bias=False)
        self.type_embedding = nn.Embedding(len(QUESTION_TYPES), width)
        self.evidence_layers = nn.ModuleList(
            EvidenceRoutingLayer(width, config.heads, config.feedforward) for _ in range(config.routing_layers)
        )
        self.option_summary_norm = nn.LayerNorm(width)
        self.layers = nn.ModuleList(
            nn.TransformerDecoderLayer(
                d_model=width,
                nhead=config.heads,
                dim_feedforward=config.feedforward,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(config.layers)
        )
        self.field_norm = nn.LayerNorm(width)
        self.option_norm = nn.LayerNorm(width)
        self.residual_scorer = nn.Sequential(nn.Linear(width * 4, width), nn.GELU(), nn.Identity(), nn.Linear(width, 1))
        self.prior_logit_scale = nn.Parameter(torch.zeros(()))
        self.joint_logit_scale = nn.Parameter(torch.zeros(()))
        self.residual_gate = nn.Parameter(torch.zeros(()))

    def forward(self, hidden_states: torch.Tensor, lexical_rows: torch.Tensor, layout: SchemaLayout) -> torch.Tensor:
        """Flat option logits `[On]` (records, then questions, then options in head order).

        `hidden_states` is the padded `[B, L, hidden]` backbone output; `lexical_rows` is the
        `[vocab, hidden]` lm_head table (only option tokens' rows are read).
        """
        dtype = self.hidden_norm.weight.dtype
        batch, length, _ = hidden_states.shape
        width = self.config.width
        num_questions = layout.num_questions

        states = self.hidden_norm(hidden_states.to(dtype))
        flat_states = states.reshape(batch * length, -1)
        memory = self.memory_projection(states)
        padding = layout.memory_padding
        global_vectors = flat_states[layout.last_positions]

        means = _segment_mean(flat_states[layout.span_token_positions], layout.span_token_owner, layout.span_lengths)
        question_vectors, contexts = means[:num_questions], means[num_questions:]
        lexical = _segment_mean(
            lexical_rows[layout.lexical_token_ids].to(dtype),
            layout.lexical_owner,
            layout.span_lengths[num_questions:],
        )

        flat_options = (
            self.option_context_projection(contexts)
            + self.option_lexical_projection(lexical)
            + self.option_question_projection(question_vectors)[layout.option_question]
        )
        options = flat_options.new_zeros(batch, layout.max_options, width)
        options[layout.option_record, layout.option_slot] = flat_options
        for layer in self.evidence_layers:
            options = layer(options, memory, padding)
        flat_options = options[layout.option_record, layout.option_slot]

        # Each field summarises its own options, weighted by their match to it.
        base_fields = self.question_projection(question_vectors)
        grid = flat_options.new_zeros(num_questions, layout.max_options_per_question, width)
        grid[layout.option_question, layout.option_rank] = flat_options
        present = torch.zeros(num_questions, layout.max_options_per_question, dtype=torch.bool, device=grid.device)
        present[layout.option_question, layout.option_rank] = True
        routing = torch.einsum("qow,qw->qo", grid, base_fields) / math.sqrt(width)
        routing = routing.masked_fill(~present, float("-inf")).softmax(dim=-1)
        summaries = torch.einsum("qo,qow->qw", routing, grid)
        flat_fields = (
            base_fields
            + self.option_summary_norm(summaries)
            + self.global_projection(global_vectors)[layout.question_record]
            + self.type_embedding(layout.question_types)
        )
        fields = flat_fields.new_zeros(batch, layout.max_questions, width)
        fields[layout.question_record, layout.question_slot] = flat_fields
        field_padding = torch.ones(batch, layout.max_questions, dtype=torch.bool, device=fields.device)
        field_padding[layout.question_record, layout.question_slot] = False
        for layer in self.layers:
            fields = layer(fields, memory, tgt_key_padding_mask=field_padding, memory_key_padding_mask=padding)
        flat_fields = self.field_norm(fields[layout.question_record, layout.question_slot])
        option_fields = flat_fields[layout.option_question]

        anchors = F.normalize(question_vectors + global_vectors[layout.question_record], dim=-1)
        prior_scale = self.prior_logit_scale.clamp(max=MAX_LOGIT_SCALE).exp()
        prior = prior_scale * (F.normalize(lexical, dim=-1) * anchors[layout.option_question]).sum(dim=-1)
        normed_options = self.option_norm(flat_options)
        cosine = F.cosine_similarity(option_fields, normed_options, dim=-1)
        features = torch.cat(
            [option_fields, normed_options, option_fields * normed_options, (option_fields - normed_options).abs()],
            dim=-1,
        )
        residual = self.residual_scorer(features).squeeze(-1)
        joint_scale = self.joint_logit_scale.clamp(max=MAX_LOGIT_SCALE).exp()
        return prior + torch.sigmoid(self.residual_gate) * (joint_scale * cosine + residual)


def load_joint_head(directory: Path, dtype: torch.dtype = torch.float32) -> JointSchemaHead:
    """Build the head from a release (or head-only) directory; missing or extra keys are errors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config = HeadConfig.from_file(directory / HEAD_CONFIG)
    weights_path = directory / HEAD_WEIGHTS
    if not weights_path.is_file():
        raise ModelLoadError(f"missing {HEAD_WEIGHTS} in {directory}")
    try:
        state = load_file(str(weights_path))
    except (SafetensorError, OSError) as error:
        raise ModelLoadError(f"cannot read {weights_path}: {error}") from None
    head = JointSchemaHead(config)
    expected = head.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(unexpected)}")
        raise ModelLoadError(f"{weights_path} does not match {HEAD_CONFIG}: {'; '.join(parts)}")
    mismatched = [
        f"{name} {tuple(state[name].shape)} != {tuple(value.shape)}"
        for name, value in expected.items()
        if state[name].shape != value.shape
    ]
    if mismatched:
        raise ModelLoadError(f"{weights_path} has mismatched shapes: {', '.join(mismatched)}")
    head.load_state_dict(state, strict=True)
    return head.to(dtype).eval()
