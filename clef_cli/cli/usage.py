"""The command class of every `clef` command: usage lines name arguments as `SCORED`, the
convention of man pages and of the README, where Typer writes `{scored}`."""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand


class ClefCommand(TyperCommand):
    """A Typer command whose arguments read `NAME`, `[NAME]` (optional) and `NAME...` (several),
    in the usage line, the argument list and "Missing argument" errors alike."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.param_type_name == "argument" and param.metavar is None and param.name:
                param.metavar = param.name.upper()

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name != "argument":
                pieces.extend(param.get_usage_pieces(ctx))
                continue
            name = param.metavar or (param.name or "").upper()
            name = name if param.required else f"[{name}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
        return pieces
