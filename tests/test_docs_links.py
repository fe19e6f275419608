"""Every relative link and anchor in README.md and docs/*.md leads somewhere.

Anchors follow the code host's heading slugs: lower case, every character that is not a letter,
digit, space, hyphen or underscore dropped, spaces turned into hyphens, and a repeated slug
numbered `-1`, `-2`, ... Links inside code blocks and inline code are not links.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a linked heading keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not heading:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
    return found


def broken_links(page: Path, text: str | None = None) -> list[str]:
    """Each relative link of `page` whose file or anchor does not exist, as `target (why)`."""
    text = page.read_text() if text is None else text
    problems = []
    for target in LINK.findall(prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...: not ours to check
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            problems.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            problems.append(f"{target} (no such heading in {linked.name})")
    return problems


@pytest.mark.parametrize("page", pages(), ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


def test_the_checker_finds_a_broken_file_an_unknown_anchor_and_ignores_code(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "store.md").write_text(
        "# The store\n\n## Crash safety: what survives\n\n## Crash safety: what survives\n"
    )
    page = tmp_path / "README.md"
    page.write_text(
        "# Top\n\n[ok](docs/store.md#crash-safety-what-survives) [second](docs/store.md#crash-safety-what-survives-1)\n"
        "[self](#top) ![image](docs/store.md)\n"
        "[gone](docs/missing.md) [bad anchor](docs/store.md#crash) [bad self](#nowhere)\n"
        "`[not a link](docs/nothing.md)`\n\n```\n[in a block](docs/void.md)\n```\n[web](https://example.org/x)\n"
    )
    assert broken_links(page) == [
        "docs/missing.md (no such file)",
        "docs/store.md#crash (no such heading in store.md)",
        "#nowhere (no such heading in README.md)",
    ]


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("`clef score INPUT... -o OUTPUT.parquet`", "clef-score-input--o-outputparquet"),
        ("Is it good enough? clef eval / clef calibrate", "is-it-good-enough-clef-eval--clef-calibrate"),
        (
            "The human loop: clef review, reviewed labels as gold, clef compare",
            "the-human-loop-clef-review-reviewed-labels-as-gold-clef-compare",
        ),
        (
            "Does the GPU wait for the CPU? `benchmarks/feed/bench_feed.py`",
            "does-the-gpu-wait-for-the-cpu-benchmarksfeedbench_feedpy",
        ),
    ],
)
def test_slugs_are_the_code_hosts(heading, expected):
    assert slug(heading) == expected
