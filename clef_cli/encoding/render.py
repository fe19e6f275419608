"""How a record's values become prompt text (DESIGN §3): the state, each option and each
instruction. Torch-free on purpose: the record key hashes exactly these strings, and `clef
review` recomputes keys without the model's stack."""

from __future__ import annotations

import json
from typing import Any

from clef_cli.inputs.records import Question


def render(value: Any) -> str:
    """A string as is; anything else compact JSON with sorted keys, non-ASCII kept."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def render_option(option_id: str, description: Any) -> str:
    body: dict[str, Any] = {"option_id": option_id}
    if description is not None:
        body["description"] = description
    return render(body)


def render_instructions(question: Question) -> str:
    instructions = question.instructions
    if instructions is None or instructions == "":
        return question.id
    return render(instructions)
