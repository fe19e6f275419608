"""The straightforward per-record head formula of DESIGN §5, kept as the oracle for the
vectorised batch head. One record at a time, no padding, no masks, a loop per question."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from clef_cli.model.head import JointSchemaHead

MAX_LOGIT_SCALE = math.log(100.0)
"""DESIGN §5's cap on the logit scales, written here, not imported from the code under test."""


def span_mean(values: torch.Tensor, span: tuple[int, int]) -> torch.Tensor:
    return values[span[0] : span[1]].mean(dim=0)


@torch.no_grad()
def oracle_logits(
    head: JointSchemaHead,
    hidden: torch.Tensor,
    input_ids: list[int],
    questions: list[tuple[int, tuple[int, int], list[tuple[int, int]]]],
    lexical_rows: torch.Tensor,
) -> list[torch.Tensor]:
    """`hidden` is one record's `[L, d]`; `questions` are (type, question span, option spans)."""
    H = head.hidden_norm(hidden)
    M = head.memory_projection(H).unsqueeze(0)
    g = H[-1]
    q_vectors = [span_mean(H, span) for _, span, _ in questions]
    R, e, owner = [], [], []
    for f, (_, _, option_spans) in enumerate(questions):
        for span in option_spans:
            c = span_mean(H, span)
            e_o = lexical_rows[torch.tensor(input_ids[span[0] : span[1]])].mean(dim=0)
            R.append(
                head.option_context_projection(c)
                + head.option_lexical_projection(e_o)
                + head.option_question_projection(q_vectors[f])
            )
            e.append(e_o)
            owner.append(f)
    R = torch.stack(R).unsqueeze(0)
    for layer in head.evidence_layers:
        memory = layer.memory_norm(M)
        R = R + layer.attention(layer.query_norm(R), memory, memory, need_weights=False)[0]
        R = R + layer.feedforward(layer.feedforward_norm(R))
    R = R[0]
    width = R.shape[-1]
    fields = []
    for f, (qtype, _, _) in enumerate(questions):
        b = head.question_projection(q_vectors[f])
        mine = R[[o for o, q in enumerate(owner) if q == f]]
        weights = torch.softmax(mine @ b / math.sqrt(width), dim=0)
        s = (weights[:, None] * mine).sum(dim=0)
        fields.append(b + head.option_summary_norm(s) + head.global_projection(g) + head.type_embedding.weight[qtype])
    Fd = torch.stack(fields).unsqueeze(0)
    for layer in head.layers:
        Fd = layer(Fd, M)
    Fd = head.field_norm(Fd[0])
    U = head.option_norm(R)
    prior_scale = math.exp(min(head.prior_logit_scale.item(), MAX_LOGIT_SCALE))
    joint_scale = math.exp(min(head.joint_logit_scale.item(), MAX_LOGIT_SCALE))
    gate = torch.sigmoid(head.residual_gate)
    logits = []
    for o, f in enumerate(owner):
        prior = prior_scale * torch.dot(F.normalize(e[o], dim=0), F.normalize(q_vectors[f] + g, dim=0))
        u, field = U[o], Fd[f]
        joint = joint_scale * F.cosine_similarity(field, u, dim=0) + head.residual_scorer(
            torch.cat([field, u, field * u, (field - u).abs()])
        ).squeeze(-1)
        logits.append(prior + gate * joint)
    logits = torch.stack(logits)
    return [logits[[o for o, q in enumerate(owner) if q == f]] for f in range(len(questions))]
