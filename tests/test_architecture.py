"""The house rules the folders promise: imports point one way (no cycles, type-only imports
included), a small package root, no giant functions or modules. benchmarks/ is held to the same
rules: its scripts import each other only by their full names (`benchmarks.scale.scale_records`),
so every edge between them is in the graph."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "clef_cli"
BENCHMARKS = PACKAGE.parent / "benchmarks"
TOPS = ("clef_cli", "benchmarks")
MAX_ROOT_MODULES = 15
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for top in (PACKAGE, BENCHMARKS) for path in top.rglob("*.py")}


def _ours(name: str) -> bool:
    return any(name == top or name.startswith(top + ".") for top in TOPS)


def _resolve(name: str) -> str | None:
    """The module an import names: `a.b.c` is module `a.b` when `c` is a name inside it."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(node: ast.Import | ast.ImportFrom, name: str, path: Path) -> set[str]:
    if isinstance(node, ast.Import):
        return {_resolve(alias.name) for alias in node.names if _ours(alias.name)} - {None}
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if node.level:
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
    if not _ours(source):
        return set()
    found = {_resolve(f"{source}.{alias.name}") for alias in node.names}
    return found - {None}


def import_graph() -> dict[str, set[str]]:
    """Every import of every module: at module level, inside functions, under TYPE_CHECKING."""
    graph = {}
    for name, path in MODULES.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges |= _imported(node, name, path)
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}
    trail: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        trail.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*trail[trail.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = 2
        trail.pop()
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    scale = "benchmarks.scale."  # the circle that came back once: bench_scale <-> scale_ray
    planted = {**import_graph(), f"{scale}scale_ray": {f"{scale}bench_scale"}}
    assert find_cycle(planted) == [f"{scale}bench_scale", f"{scale}scale_ray", f"{scale}bench_scale"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_type_only_and_function_level_imports() -> None:
    graph = import_graph()
    assert "clef_cli.families" in graph["clef_cli.encoding.prompt"]  # a lazy import inside __init__
    assert "clef_cli.model.answers" in graph["clef_cli.results"]  # under TYPE_CHECKING


def test_the_graph_sees_the_benchmarks_imports() -> None:
    graph = import_graph()
    assert "benchmarks.score.bench_score" in graph["benchmarks.scale.scale_records"]  # module level
    assert "benchmarks.scale.scale_ray" in graph["benchmarks.scale.bench_scale"]  # inside a function
    assert "clef_cli.engines.ray.actor" in graph["benchmarks.scale.scale_ray"]


def bare_sibling_imports() -> list[str]:
    """Imports in benchmarks/ of another benchmark by its bare name (`from bench_score import`,
    found through a sys.path entry): the graph cannot see them, so a cycle through them hides."""
    stems = {path.stem for path in BENCHMARKS.rglob("*.py")}
    bare = []
    for name, path in MODULES.items():
        if not name.startswith("benchmarks."):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                bare += [f"{name}: import {a.name}" for a in node.names if a.name.split(".")[0] in stems]
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in stems:
                bare.append(f"{name}: from {node.module} import")
    return sorted(bare)


def test_benchmarks_import_each_other_by_full_name_and_the_product_never_imports_them() -> None:
    assert bare_sibling_imports() == []
    graph = import_graph()
    product = (m for m in graph if m.split(".")[0] == "clef_cli")
    assert [f"{m} -> {t}" for m in product for t in graph[m] if t.split(".")[0] == "benchmarks"] == []


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_small_package_root() -> None:
    root = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_no_giant_functions_or_modules() -> None:
    too_long = []
    for name, path in MODULES.items():
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {lines} lines")
    assert not too_long, too_long


QUALITY_ROOMS = ["labels", "", "calibrate", "evaluate", "train", "review", "compare"]
"""`clef_cli.quality`'s rooms, lowest first ("" is the shared modules at its root); see its docstring."""


def quality_room(module: str) -> int | None:
    """The rank of a quality module's room, or None outside `clef_cli.quality`."""
    prefix = "clef_cli.quality"
    if module != prefix and not module.startswith(prefix + "."):
        return None
    parts = module.removeprefix(prefix).lstrip(".").split(".")
    room = parts[0] if len(parts) > 1 or parts[0] in QUALITY_ROOMS else ""
    return QUALITY_ROOMS.index(room)


def quality_imports_pointing_up(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in graph.items():
        rank = quality_room(module)
        for target in targets if rank is not None else ():
            target_rank = quality_room(target)
            if target_rank is not None and target_rank > rank:
                wrong.append(f"{module} -> {target}")
    return sorted(wrong)


def test_quality_rooms_import_only_their_own_the_shared_or_lower_rooms() -> None:
    graph = import_graph()
    rooms = {path.name for path in (PACKAGE / "quality").iterdir() if (path / "__init__.py").exists()}
    assert rooms == set(QUALITY_ROOMS) - {""}, "a room was added: place it in QUALITY_ROOMS"
    assert quality_imports_pointing_up(graph) == []
    planted = {**graph, "clef_cli.quality.labels.gold": {"clef_cli.quality.train.fit"}}
    assert quality_imports_pointing_up(planted) == ["clef_cli.quality.labels.gold -> clef_cli.quality.train.fit"]


LOCATIONS_MAY_IMPORT = ("clef_cli.errors",)
"""`clef_cli.locations` is the lowest room above the shared bottom: the resolver and the fence
every other room uses, so it imports nothing of theirs."""


def locations_imports_up(graph: dict[str, set[str]]) -> list[str]:
    prefix = "clef_cli.locations"
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module == prefix or module.startswith(prefix + ".")
        for target in targets
        if not target.startswith(prefix) and target not in LOCATIONS_MAY_IMPORT
    )


def test_locations_import_only_the_shared_bottom() -> None:
    graph = import_graph()
    assert "clef_cli.locations.fence" in graph, "the fence moved: update this test"
    assert locations_imports_up(graph) == []
    planted = {**graph, "clef_cli.locations.fence": {"clef_cli.encoding.media_limits"}}
    assert locations_imports_up(planted) == ["clef_cli.locations.fence -> clef_cli.encoding.media_limits"]
