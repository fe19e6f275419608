"""The vectorised joint head against the per-record oracle, and strict head loading."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from clef_cli.encoding.encoded import EncodedQuestion
from clef_cli.errors import ModelLoadError
from clef_cli.model.head import HeadConfig, JointSchemaHead, build_layout, load_joint_head

from .support.head_oracle import oracle_logits
from .support.helpers import LOGIT_TOLERANCE, TINY_MODEL

VOCAB = 50


def random_head(seed: int) -> JointSchemaHead:
    torch.manual_seed(seed)
    head = JointSchemaHead(HeadConfig(hidden_size=24, width=16, routing_layers=2, layers=2, heads=4, feedforward=20))
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if parameter.dim() == 0:
                parameter.fill_({"prior_logit_scale": 2.3, "joint_logit_scale": 1.5}.get(name, -0.5))
            elif name.endswith("bias"):
                parameter.normal_(0, 0.1)
            elif "norm" in name:
                parameter.normal_(1, 0.2)
            else:
                parameter.normal_(0, 0.4)
    return head.eval()


def random_record(rng: random.Random, length: int) -> tuple[list[int], list[EncodedQuestion]]:
    ids = [rng.randrange(VOCAB) for _ in range(length)]

    def span() -> tuple[int, int]:
        start = rng.randrange(length - 4)
        return start, start + rng.randint(1, 4)

    questions = []
    for number in range(rng.randint(1, 8)):
        count = rng.randint(2, 20)
        questions.append(
            EncodedQuestion(
                question_id=f"q{number}",
                question_type=rng.randrange(3),
                question_span=span(),
                option_spans=tuple(span() for _ in range(count)),
                option_ids=tuple(str(o) for o in range(count)),
            )
        )
    return ids, questions


def oracle_for(head, hidden, ids, questions, lexical):
    return oracle_logits(
        head,
        hidden,
        ids,
        [(q.question_type, q.question_span, list(q.option_spans)) for q in questions],
        lexical,
    )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_vectorised_head_equals_the_per_record_oracle(seed):
    rng = random.Random(seed)
    head = random_head(seed)
    lexical = torch.randn(VOCAB, 24)
    lengths = [rng.randint(30, 90) for _ in range(rng.randint(2, 5))]
    records = [random_record(rng, length) for length in lengths]
    padded = max(lengths)
    hidden = torch.randn(len(records), padded, 24) * 50  # garbage everywhere, padding included
    real = [torch.randn(length, 24) for length in lengths]
    for row, states in enumerate(real):
        hidden[row, : states.shape[0]] = states
    layout = build_layout([questions for _, questions in records], [ids for ids, _ in records], padded)
    with torch.no_grad():
        flat = head(hidden, lexical, layout)
    per_question = torch.split(flat, layout.options_per_question)
    position = 0
    for (ids, questions), states in zip(records, real, strict=True):
        expected = oracle_for(head, states, ids, questions, lexical)
        for want in expected:
            got = per_question[position]
            position += 1
            assert got.shape == want.shape
            assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    assert position == len(per_question)


def test_oracle_reproduces_the_golden_logits(scorer, golden_encoded, expected):
    """The independent oracle, on the thinker's own hidden states, gives every golden record's logits."""
    head, lexical = scorer.head, scorer.backbone.lexical_rows
    assert len(golden_encoded) == len(expected) == 15
    for encoded, reference in zip(golden_encoded, expected, strict=True):
        hidden = scorer.hidden_states([encoded])[0]
        logits = oracle_for(head, hidden, encoded.input_ids, list(encoded.questions), lexical)
        for got, golden in zip(logits, reference["questions"], strict=True):
            want = torch.tensor(golden["logits"])
            assert got.shape == want.shape
            assert (got - want).abs().max().item() <= LOGIT_TOLERANCE, encoded.record.id


def copy_head(tmp_path, state: dict[str, torch.Tensor]):
    folder = tmp_path / "head"
    folder.mkdir(parents=True)
    shutil.copy(TINY_MODEL / "joint_head_config.json", folder)
    save_file(state, str(folder / "joint_head.safetensors"))
    return folder


def test_head_with_a_missing_key_is_refused_naming_it(tmp_path):
    state = load_file(str(TINY_MODEL / "joint_head.safetensors"))
    del state["residual_gate"]
    with pytest.raises(ModelLoadError, match="missing keys: residual_gate"):
        load_joint_head(copy_head(tmp_path, state))


def test_head_with_an_extra_key_is_refused_naming_it(tmp_path):
    state = load_file(str(TINY_MODEL / "joint_head.safetensors"))
    state["calibration.temperature"] = torch.ones(())
    with pytest.raises(ModelLoadError, match=r"unexpected keys: calibration\.temperature"):
        load_joint_head(copy_head(tmp_path, state))


def test_head_with_a_wrong_shape_is_refused(tmp_path):
    state = load_file(str(TINY_MODEL / "joint_head.safetensors"))
    state["type_embedding.weight"] = torch.zeros(4, 32)
    with pytest.raises(ModelLoadError, match=r"type_embedding\.weight \(4, 32\) != \(3, 32\)"):
        load_joint_head(copy_head(tmp_path, state))


def test_head_config_missing_a_field(tmp_path):
    folder = copy_head(tmp_path, load_file(str(TINY_MODEL / "joint_head.safetensors")))
    config = json.loads((folder / "joint_head_config.json").read_text())
    del config["width"]
    (folder / "joint_head_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="lacks width"):
        load_joint_head(folder)


def test_bf16_head_file_loads_and_runs_in_fp32(tmp_path):
    """A bf16 head file (as the release ships) computes in fp32: exactly the fp32 head whose weights
    are the same bf16 values, run on the same inputs."""
    fp32 = load_file(str(TINY_MODEL / "joint_head.safetensors"))
    bf16_head = load_joint_head(copy_head(tmp_path / "bf16", {k: v.to(torch.bfloat16) for k, v in fp32.items()}))
    rounded = {k: v.to(torch.bfloat16).to(torch.float32) for k, v in fp32.items()}
    oracle_head = load_joint_head(copy_head(tmp_path / "rounded", rounded))
    assert all(parameter.dtype == torch.float32 for parameter in bf16_head.parameters())
    rng = random.Random(11)
    ids, questions = random_record(rng, 70)
    hidden = torch.randn(1, 70, bf16_head.config.hidden_size)
    lexical = torch.randn(VOCAB, bf16_head.config.hidden_size)
    layout = build_layout([questions], [ids], 70)
    with torch.no_grad():
        got = bf16_head(hidden, lexical, layout)
        want = oracle_head(hidden, lexical, layout)
    assert got.dtype == torch.float32 and got.shape == (sum(len(q.option_ids) for q in questions),)
    assert torch.equal(got, want)


def test_scales_above_the_cap_are_clamped_like_the_oracle():
    rng = random.Random(7)
    head = random_head(7).double()
    with torch.no_grad():
        head.prior_logit_scale.fill_(6.0)
        head.joint_logit_scale.fill_(9.0)
    lexical = torch.randn(VOCAB, 24, dtype=torch.float64)
    ids, questions = random_record(rng, 60)
    hidden = torch.randn(1, 60, 24, dtype=torch.float64)
    layout = build_layout([questions], [ids], 60)
    with torch.no_grad():
        flat = head(hidden, lexical, layout)
    want = torch.cat(oracle_for(head, hidden[0], ids, questions, lexical))
    assert torch.allclose(flat, want, atol=1e-9, rtol=0)
