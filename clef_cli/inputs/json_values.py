"""Checking that a record's values are JSON the prompt can carry, before anything renders them.

A record's `state`, question instructions and option descriptions are rendered as JSON text and
tokenized; ids, question ids and option ids are written to the output. A value that is not JSON
(bytes or a timestamp from a Parquet column), text that is not Unicode (a lone UTF-16
surrogate, which JSON's `"\\ud800"` escape allows), or nesting deeper than a record may hold would
fail later, far from the record, and end the whole job. Here it becomes a message naming the
field path (`state.items[0].name`), so the caller can make it that record's error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_NESTING = 200
"""Levels of arrays and objects one value may nest. Records cross process boundaries pickled
(encoding workers, Ray), and pickle stops near 500 levels; real records nest a few levels."""
JSON_SCALARS = (str, int, float, bool, type(None))


def unencodable(text: str) -> bool:
    """True for text that has no UTF-8 form (it holds a lone surrogate)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def text_problem(text: str) -> str | None:
    if unencodable(text):
        return "text holding a lone UTF-16 surrogate (not Unicode text; it cannot be tokenized or written)"
    return None


def kind_of(value: Any) -> str:
    """A value's JSON kind as a user reads it (`object`, `array`, `number`...), or its Python type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "binary data"  # a Parquet binary column
    return f"a value of type {type(value).__name__} (not JSON)"


def without_lone_surrogates(text: str) -> str:
    """The text with each character that is not Unicode (a lone surrogate) shown as U+FFFD."""
    if not unencodable(text):
        return text
    return "".join("\ufffd" if 0xD800 <= ord(char) <= 0xDFFF else char for char in text)


def child_path(path: str, key: Any) -> str:
    """`path.key`; a character that is not Unicode shows as U+FFFD, so a message is always text."""
    if isinstance(key, str) and key:
        return f"{path}.{without_lone_surrogates(key)}"
    return f"{path}[{key!r}]"


def json_problem(value: Any, path: str) -> tuple[str, str] | None:
    """(field path, what is wrong) for the first value under `path` that is not JSON the prompt
    can carry, or None. Walks without recursion, so no nesting can overflow the stack."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return where, problem
        elif isinstance(item, JSON_SCALARS):
            continue
        elif isinstance(item, (Mapping, list, tuple)):
            if depth >= MAX_NESTING:
                return shortened(where), f"nested deeper than {MAX_NESTING} levels of arrays and objects"
            if isinstance(item, Mapping):
                problem = _keys_problem(item, where)
                if problem:
                    return problem
                stack.extend((child, child_path(where, key), depth + 1) for key, child in item.items())
            else:
                stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in enumerate(item))
        else:
            return where, f"{kind_of(item)} where JSON was expected"
    return None


def shortened(path: str, limit: int = 80) -> str:
    """A long field path with its middle left out (a path 200 levels deep is no help in a message)."""
    return path if len(path) <= limit else f"{path[: limit - 30]}...{path[-25:]}"


def _keys_problem(item: Mapping[Any, Any], where: str) -> tuple[str, str] | None:
    """Object keys are strings (or, from a Parquet map, all integers: they sort and render alike)."""
    keys = list(item)
    if all(isinstance(key, str) for key in keys):
        for key in keys:
            problem = text_problem(key)
            if problem:
                return child_path(where, key), f"a key that is {problem}"
        return None
    if all(isinstance(key, int) and not isinstance(key, bool) for key in keys):
        return None
    odd = next(key for key in keys if not isinstance(key, str))
    return where, f"object keys must be strings, got {kind_of(odd)} key {shown(odd)}"


def shown(value: Any, limit: int = 60) -> str:
    """A short, printable repr of a user's value for a message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def unreadable_json(error: Exception) -> str:
    """Why json.loads gave up on text that may be valid JSON: nesting, or an integer too long."""
    if isinstance(error, RecursionError):
        return "nested deeper than the JSON parser allows"
    return str(error).split(";")[0]  # drop Python's hint at sys.set_int_max_str_digits
