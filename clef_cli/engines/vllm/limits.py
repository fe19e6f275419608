"""What the vLLM engine cannot run, known before it starts: prompts longer than its
max_model_len. Such a record gets an error of its own kind (`overflow`) that is no verdict on the
record (errors.RETRIED_KINDS): it is refused again at planning while the limit stands, without
loading vLLM, and scored once the limit is raised. (Records refused as `unsupported` by earlier
versions, audio in video, are retried the same way and now score.)"""

from __future__ import annotations

from clef_cli.job.settings import ScoreSettings
from clef_cli.release import Release


def prompt_limit(settings: ScoreSettings, release: Release) -> int | None:
    """The longest prompt vLLM takes: --max-model-len, else what vLLM derives from the release
    (its text config's max_position_embeddings); None when neither says."""
    given = settings.vllm.max_model_len if settings.vllm is not None else None
    if given:
        return int(given)
    derived = release.text_config.get("max_position_embeddings")
    return int(derived) if derived else None


def too_long(length: int, limit: int | None) -> str | None:
    """Why a prompt of `length` tokens cannot run, or None."""
    if limit is None or length <= limit:
        return None
    return (
        f"the prompt has {length:,} tokens, more than vLLM's max_model_len of {limit:,}: "
        "raise --max-model-len, or score it with --engine hf"
    )


def engine_refusal(length: int, limit: int | None) -> tuple[str, str] | None:
    """(error_kind, message) for a planned prompt vLLM cannot run, or None."""
    message = too_long(length, limit)
    return ("overflow", message) if message else None


class EngineRefusal(ValueError):
    """vLLM cannot run this record (over its limit): a ValueError, so the batch runner
    narrows a batch down to the record; `kind` is its error_kind."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind
