"""The Qwen3-Omni thinker: strict loading of only its weights, and hidden states for a batch.

The talker and code2wav (speech output) are never built: the thinker class is constructed from
`thinker_config` alone and checkpoint keys under `talker.` / `code2wav.` are skipped. The
`lm_head` is never multiplied; its weight is kept as the head's lexical lookup table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from clef_cli.batching import ModelBatch
from clef_cli.errors import ModelLoadError
from clef_cli.release import Release

SPEECH_OUTPUT_KEYS = re.compile(r"^(talker|code2wav)\.")
DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


def resolve_device(device: str = "auto") -> torch.device:
    """auto: the first GPU when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ModelLoadError(f"unknown device {device!r} (use auto, cpu, cuda or cuda:N)") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {device!r} asked for, but no CUDA GPU is available")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {device!r} does not exist ({torch.cuda.device_count()} GPUs)")
    elif resolved.type != "cpu":
        raise ModelLoadError(f"unsupported device {device!r} (use auto, cpu, cuda or cuda:N)")
    return resolved


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """Default: bf16 on a GPU, fp32 on the CPU."""
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r} (use auto, bfloat16, float16 or float32)") from None


def _describe_mismatch(item: object) -> str:
    if isinstance(item, tuple) and len(item) == 3:
        key, in_checkpoint, in_model = item
        return f"{key} (checkpoint {tuple(in_checkpoint)}, model {tuple(in_model)})"
    return str(item)


def _check_loading_info(info: dict[str, object], release: Release) -> None:
    missing = sorted(info.get("missing_keys") or ())
    unexpected = sorted(key for key in info.get("unexpected_keys") or () if not SPEECH_OUTPUT_KEYS.match(key))
    mismatched = sorted(_describe_mismatch(item) for item in info.get("mismatched_keys") or ())
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected)}")
    if mismatched:
        problems.append(f"mismatched keys: {', '.join(mismatched)}")
    if problems:
        raise ModelLoadError(f"the thinker weights in {release.path} do not match its config: {'; '.join(problems)}")


@dataclass
class Backbone:
    """A loaded thinker and the lm_head rows the head reads."""

    thinker: torch.nn.Module
    lexical_rows: torch.Tensor
    device: torch.device
    dtype: torch.dtype
    hidden_size: int

    @classmethod
    def load(cls, release: Release, device: torch.device, dtype: torch.dtype) -> Backbone:
        from transformers.models.qwen3_omni_moe import (
            Qwen3OmniMoeConfig,
            Qwen3OmniMoeThinkerForConditionalGeneration,
        )
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            config = Qwen3OmniMoeConfig.from_pretrained(str(release.path))
            thinker, info = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(
                str(release.path),
                config=config.thinker_config,
                key_mapping={r"^thinker\.": ""},
                dtype=dtype,
                device_map=str(device) if device.type == "cuda" else None,
                output_loading_info=True,
                ignore_mismatched_sizes=True,  # reported below, with the others, as one error
            )
        except (OSError, ValueError, RuntimeError, KeyError) as error:
            raise ModelLoadError(f"cannot load the thinker from {release.path}: {error}") from None
        finally:
            hf_logging.set_verbosity(verbosity)
            hf_logging.enable_progress_bar()
        _check_loading_info(info, release)
        thinker = thinker.to(device).eval()
        lexical_rows = thinker.lm_head.weight.detach()
        thinker.lm_head = torch.nn.Identity()
        return cls(
            thinker=thinker,
            lexical_rows=lexical_rows,
            device=device,
            dtype=dtype,
            hidden_size=int(config.thinker_config.text_config.hidden_size),
        )

    @torch.inference_mode()
    def hidden_states(self, batch: ModelBatch) -> torch.Tensor:
        """Final-norm hidden states `[B, L, hidden]` of a right-padded batch.

        The multimodal rope positions are computed with the padding mask (as the thinker would),
        then attention runs causally without it: with right padding no real token can see a pad,
        so real tokens' states are unchanged, and causal attention skips the masked half of the
        score matrix that an explicit padding mask forces the kernel to compute.
        """
        inputs = batch.model_inputs(self.device, self.dtype)
        attention_mask = inputs.pop("attention_mask")
        feature_mask = inputs.get("feature_attention_mask")
        position_ids, _ = self.thinker.model.get_rope_index(
            inputs["input_ids"],
            inputs.get("image_grid_thw"),
            inputs.get("video_grid_thw"),
            attention_mask,
            batch.use_audio_in_video,
            feature_mask.sum(-1) if isinstance(feature_mask, torch.Tensor) else None,
            inputs.get("video_second_per_grid"),
        )
        if "input_features" in inputs:
            inputs["inputs_embeds"] = self._embeddings_with_audio(
                inputs["input_ids"], inputs.pop("input_features"), inputs.pop("feature_attention_mask"), batch
            )
        outputs = self.thinker.model(**inputs, position_ids=position_ids, attention_mask=None, use_cache=False)
        return outputs.last_hidden_state

    def _embeddings_with_audio(
        self, input_ids: torch.Tensor, features: torch.Tensor, feature_mask: torch.Tensor, batch: ModelBatch
    ) -> torch.Tensor:
        """Token embeddings with every audio placeholder filled, each record's clips encoded with
        exactly the padding they get when the record is scored alone.

        The audio encoder cuts clips into chunks of `2 * n_window` mel frames and pads every chunk
        of one call to the longest. Padded frames are not neutral: the first convolution's bias
        makes them non-zero, the next two convolutions (kernel 3) carry them into the last real
        frames of a shorter chunk, and the attention window size follows the longest chunk too.
        So a record whose longest chunk is shorter than its neighbours' would change with them.
        Records are therefore grouped by their own longest chunk, and each group is encoded alone.
        """
        model = self.thinker.model
        embeds = model.get_input_embeddings()(input_ids)
        clip_rows: list[range] = []
        groups: dict[int, list[int]] = {}
        row = 0
        for position, record in enumerate(batch.records):
            clips = int(record.media["feature_attention_mask"].shape[0]) if "input_features" in record.media else 0
            clip_rows.append(range(row, row + clips))
            row += clips
            if clips:
                lengths = feature_mask[clip_rows[-1].start : clip_rows[-1].stop].sum(-1)
                groups.setdefault(longest_audio_chunk(lengths, self.audio_window), []).append(position)
        per_record: dict[int, torch.Tensor] = {}
        for positions in groups.values():
            rows = [r for position in positions for r in clip_rows[position]]
            encoded = model.get_audio_features(features[rows], feature_mask[rows], return_dict=True).last_hidden_state
            counts = [int((input_ids[position] == self.audio_token_id).sum()) for position in positions]
            if sum(counts) != encoded.shape[0]:
                raise ValueError(f"audio placeholders ({sum(counts)}) and audio features ({encoded.shape[0]}) differ")
            per_record.update(zip(positions, torch.split(encoded, counts)))
        audio = torch.cat([per_record[position] for position in sorted(per_record)]).to(embeds.dtype)
        placeholders = (input_ids == self.audio_token_id).unsqueeze(-1).expand_as(embeds)
        return embeds.masked_scatter(placeholders, audio)

    @property
    def audio_window(self) -> int:
        return int(self.thinker.config.audio_config.n_window)

    @property
    def audio_token_id(self) -> int:
        return int(self.thinker.config.audio_token_id)


def longest_audio_chunk(frame_lengths: torch.Tensor, n_window: int) -> int:
    """The longest of the chunks the audio encoder cuts these clips into (`2 * n_window` frames
    each, the rest in a last, shorter chunk): the length every chunk of their call is padded to."""
    return int(torch.clamp(frame_lengths, max=2 * n_window).max())


def load_lexical_rows(release: Release) -> torch.Tensor:
    """Only the thinker's lm_head weight, read from its shard: re-scoring stored hidden states
    with another head needs these rows and nothing else of the backbone."""
    import json

    from safetensors import safe_open

    key = "thinker.lm_head.weight"
    index = release.path / "model.safetensors.index.json"
    if index.is_file():
        shard_name = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).get(key)
        candidates = [release.path / shard_name] if shard_name else []
    else:
        candidates = sorted(p for p in release.path.glob("*.safetensors") if not p.name.startswith("joint_head"))
    for shard in candidates:
        with safe_open(str(shard), framework="pt") as handle:
            if key in handle.keys():  # noqa: SIM118 - safe_open has no __contains__
                return handle.get_tensor(key)
    raise ModelLoadError(f"{release.path} holds no {key}")
