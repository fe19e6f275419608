"""The command classes of `clef`: usage lines name arguments as `SCORED`, the convention of man
pages and of the README, where Typer writes `{scored}`; a value outside a fixed choice is
answered with the allowed values in clef's words (`--layout flatt`: "'flatt' is not one of
wide, long or flat"), not a validation library's; a long command lists its options in sections
(`PanelledCommand`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import Enum
from typing import Any

import typer
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
            allowed = choices_of(param)
            if allowed:
                param.process_value = _in_own_words(param, param.process_value, allowed)  # type: ignore[method-assign]

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


def choices_of(param: Any) -> tuple[str, ...]:
    """The allowed values of an option of a fixed choice (an `Enum`), as typed; () for others.
    Typer keeps them in its type descriptor (0.16 on) or a click `Choice` (before)."""
    descriptor = getattr(param, "type_descriptor", None)
    found = getattr(descriptor, "choices", None) if getattr(descriptor, "is_choice", False) else None
    found = found or getattr(getattr(param, "type", None), "choices", None)
    return tuple(str(choice.value if isinstance(choice, Enum) else choice) for choice in found or ())


def _in_own_words(param: Any, process_value: Callable[..., Any], allowed: tuple[str, ...]) -> Callable[..., Any]:
    """`process_value` that answers a value outside the choice in clef's words (exit 2, click's usage lines)."""
    settings = getattr(getattr(param, "type_descriptor", None), "parameter_info", None) or getattr(param, "type", None)
    folded = getattr(settings, "case_sensitive", True) is False

    @functools.wraps(process_value)
    def checked(ctx: Any, value: Any) -> Any:
        if isinstance(value, str) and not isinstance(value, Enum):
            known = {choice.casefold() for choice in allowed} if folded else set(allowed)
            if (value.casefold() if folded else value) not in known:
                listed = f"{', '.join(allowed[:-1])} or {allowed[-1]}" if len(allowed) > 1 else allowed[0]
                raise typer.BadParameter(f"{value!r} is not one of {listed}", ctx=ctx, param=param)
        return process_value(ctx, value)

    return checked


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
