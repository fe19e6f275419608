"""The command classes of `clef`: usage lines name arguments as `SCORED`, the convention of man
pages and of the README, where Typer writes `{scored}`; a long command lists its options in
sections (`PanelledCommand`)."""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

from clef_cli.cli.options import PANELS

OPTIONS = "Options"
"""The section of the options that name no panel (--dry-run, --quiet, --help)."""
TERM_COLUMN = 30
"""The widest option column (click's `write_dl` default): longer names wrap their help below."""


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


class PanelledCommand(ClefCommand):
    """A command with many options (`clef score`: 49), listed in sections by their
    `rich_help_panel`: the unpanelled ones first, then `options.PANELS` in order. Typer draws
    panels only in its rich boxes, which clef does not print (plain text reads alike in a pipe,
    a terminal and the README); every section shares one column, so the help aligns throughout."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments: list[tuple[str, str]] = []
        sections: dict[str, list[tuple[str, str]]] = {OPTIONS: []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            else:
                sections.setdefault(getattr(param, "rich_help_panel", None) or OPTIONS, []).append(record)
        options = [term for rows in sections.values() for term, _ in rows]
        width = min(TERM_COLUMN, max(map(len, options), default=0))
        ordered = sorted(sections, key=lambda name: -1 if name == OPTIONS else _panel_place(name))
        for name, rows in [("Arguments", arguments), *((name, sections[name]) for name in ordered)]:
            if rows:
                with formatter.section(name):
                    formatter.write_dl([(term.ljust(width), text) for term, text in rows], col_max=TERM_COLUMN)


def _panel_place(name: str) -> int:
    """A panel's place in `PANELS`; one not listed there comes after them (sorted keeps its order)."""
    return PANELS.index(name) if name in PANELS else len(PANELS)
