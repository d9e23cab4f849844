"""The package's layout: layers point down, no import loops, modules stay small.

The import graph is read with `ast` (nothing is imported), so the test sees every import:
at module level, inside functions and under `if TYPE_CHECKING:`. The layers, bottom to top:

    errors → schema → prompt → answers → engine → decide
           → {agents, serve, eval, bench, baselines, batch, ray, mcp} → cli

An import at module level may only point to the same layer or one below it. An import
inside a function may point up only where `LAZY_UP` names the edge: a thin hook that
exists for that wrapper (`Decider.as_tool`). The direction check reads the runtime edges
(a `TYPE_CHECKING` import is not checked for direction, except inside `engine/`). The loop
search reads every edge, lazy and `TYPE_CHECKING` ones included, so neither a hook nor a
type hint may close a loop: the decider's orchestrators take a `decide.state.DecideState`
and a `DecidesMany`, not the `Decider`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2] / "pcd_tools"

# Module (or package) name prefix → layer. The longest matching prefix wins; the package
# root's row matches `pcd_tools/__init__.py` only, so every module needs a row of its own
# (`test_every_module_has_a_layer`).
LAYERS: dict[str, int] = {
    "pcd_tools.errors": 0,
    "pcd_tools._lazy": 0,  # the lazy `__getattr__` the packages share
    "pcd_tools.schema": 1,
    "pcd_tools.prompt": 2,
    "pcd_tools.answers": 3,
    "pcd_tools.engine": 4,
    "pcd_tools.decide": 5,
    "pcd_tools.baselines": 6,  # used by bench and eval, not a wrapper of its own
    "pcd_tools": 5,  # the package's own lazy surface sits with the decider
    "pcd_tools.agents": 6,
    "pcd_tools.serve": 6,
    "pcd_tools.eval": 6,
    "pcd_tools.bench": 6,
    "pcd_tools.batch": 6,
    "pcd_tools.ray": 6,
    "pcd_tools.mcp": 6,
    "pcd_tools.cli": 7,
    "pcd_tools.__main__": 7,
}
ROOT_ROW = "pcd_tools"
WRAPPER_LAYER = 6

# Wrappers on the same layer stay independent of each other at module level.
WRAPPERS = ("agents", "serve", "eval", "bench", "batch", "ray", "mcp")

# Upward imports allowed inside a function: (importer prefix, imported prefix). Only the
# direction check reads this table; the loop search does not.
LAZY_UP: set[tuple[str, str]] = {
    # `Decider.as_tool` / `Decider.with_structured_output`: thin hooks into the extra.
    ("pcd_tools.decide.decider", "pcd_tools.agents.tools"),
    ("pcd_tools.decide.decider", "pcd_tools.agents.structured"),
    # `pcd_tools.ray` runs the other wrappers on a cluster: the `pcd batch` file job (same
    # columns and checkpoint) and the `pcd serve` app (as a Ray Serve deployment).
    ("pcd_tools.ray", "pcd_tools.batch"),
    ("pcd_tools.ray", "pcd_tools.serve"),
}

# The engine's rooms, bottom to top: a module imports only its own room or one below, at
# module level, inside a function and under `TYPE_CHECKING` alike. Modules directly in
# `engine/` (the facade: `Engine` in `scorer`, `hybrid`, `doctor`) sit on top.
ENGINE_ROOMS = ("host", "kernels", "load", "passes", "decode")

MAX_LINES = 600
# One idea that cannot be cut, with the reason in the module's docstring.
LONG_MODULES: set[str] = set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                for n in ast.walk(sub):
                    if hasattr(n, "lineno"):
                        lines.add(n.lineno)
    return lines


def _function_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for n in ast.walk(node):
                if hasattr(n, "lineno"):
                    lines.add(n.lineno)
    return lines


def _resolve(importer: str, is_pkg: bool, node: ast.ImportFrom, known: set[str]) -> list[str]:
    if node.level:
        base = importer.split(".") if is_pkg else importer.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, *([node.module] if node.module else [])])
    else:
        target = node.module or ""
    if not target.startswith("pcd_tools"):
        return []
    # `from .engine import cpu_kernels` imports the submodule, not just the package.
    subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
    return subs or [target]


def import_edges(typing: bool = False) -> list[tuple[str, str, bool, int]]:
    """Every (importer, imported, lazy, line) edge inside `pcd_tools`; with `typing`, the
    imports under `if TYPE_CHECKING:` too (as module-level edges)."""
    mods = _modules()
    known = set(mods)
    edges: list[tuple[str, str, bool, int]] = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        typing_only = _type_checking_lines(tree)
        in_function = _function_lines(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                targets = _resolve(name, path.name == "__init__.py", node, known)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("pcd_tools")]
            else:
                continue
            if node.lineno in typing_only and not typing:
                continue
            for t in targets:
                if t != name:
                    lazy = node.lineno in in_function and node.lineno not in typing_only
                    edges.append((name, t, lazy, node.lineno))
    return edges


def _row(module: str) -> str | None:
    rows = [p for p in LAYERS if module == p or (p != ROOT_ROW and module.startswith(p + "."))]
    return max(rows, key=len) if rows else None


def layer(module: str) -> int:
    row = _row(module)
    if row is None:
        raise KeyError(f"{module} has no row in LAYERS")
    return LAYERS[row]


def _wrapper(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in WRAPPERS else None


def _allowed_lazy(importer: str, imported: str) -> bool:
    return any(
        (importer == a or importer.startswith(a + "."))
        and (imported == b or imported.startswith(b + "."))
        for a, b in LAZY_UP
    )


def test_the_graph_is_read() -> None:
    edges = import_edges()
    pairs = {(a, b) for a, b, _, _ in edges}
    # Known edges, so that a broken reader cannot pass the tests below by finding nothing.
    assert ("pcd_tools.decide.decider", "pcd_tools.answers.result") in pairs
    assert ("pcd_tools.engine.kernels.cpu_ops", "pcd_tools.engine.host.blas") in pairs
    assert any(a.startswith("pcd_tools.cli") for a, _, _, _ in edges)
    assert len(edges) > 100


def test_no_upward_edge() -> None:
    bad = []
    for a, b, lazy, line in import_edges():
        if b == "pcd_tools" and a.startswith("pcd_tools."):
            continue  # `import pcd_tools` from inside: the package's lazy surface
        up = layer(b) > layer(a)
        sideways = _wrapper(a) is not None and _wrapper(b) not in (None, _wrapper(a))
        if (up or sideways) and not (lazy and _allowed_lazy(a, b)):
            kind = "lazy" if lazy else "module-level"
            bad.append(f"{a}:{line} imports {b} ({kind}, layer {layer(a)} -> {layer(b)})")
    assert bad == []


def find_loops(edges: list[tuple[str, str]]) -> list[list[str]]:
    """Every cycle's closing edge found by a depth-first search, as the path round it."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    loops: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                loops.append([*stack[stack.index(m) :], m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return loops


def test_no_import_loop() -> None:
    # Every edge: lazy ones, the `LAZY_UP` hooks and the `TYPE_CHECKING` imports included.
    assert find_loops([(a, b) for a, b, _, _ in import_edges(typing=True)]) == []


def test_the_loop_search_finds_a_loop_through_a_lazy_edge() -> None:
    edges = [(a, b) for a, b, _, _ in import_edges(typing=True)]
    # A hook from the agents back into the decider, as `Decider.as_tool` goes the other way.
    assert find_loops([*edges, ("pcd_tools.agents.tools", "pcd_tools.decide.decider")]) != []
    assert find_loops([("a", "b"), ("b", "c"), ("c", "a")]) == [["a", "b", "c", "a"]]


def test_type_only_imports_are_edges() -> None:
    # The loop search reads them: an orchestrator typing its argument as the `Decider` would
    # close a loop (`decide.decider` calls `decide.scored`).
    typed = {(a, b) for a, b, _, _ in import_edges(typing=True)}
    assert ("pcd_tools.decide.scored", "pcd_tools.decide.state") in typed
    assert ("pcd_tools.decide.scored", "pcd_tools.decide.state") not in {
        (a, b) for a, b, _, _ in import_edges()
    }
    assert find_loops([*typed, ("pcd_tools.decide.scored", "pcd_tools.decide.decider")]) != []


def test_every_module_has_a_layer() -> None:
    # No module falls through to the package root's row.
    missing = [m for m in _modules() if m != ROOT_ROW and _row(m) in (None, ROOT_ROW)]
    assert missing == []
    assert _row("pcd_tools.not_a_module") is None


def test_schema_does_not_reach_the_decider() -> None:
    # `Model.decide()` lives with `@decision` in `decide/`, so the schema layer stays a leaf
    # under everything that compiles a schema.
    bad = [
        f"{a}:{line} imports {b}"
        for a, b, _, line in import_edges()
        if a.startswith("pcd_tools.schema") and layer(b) > layer("pcd_tools.schema")
    ]
    assert bad == []


def test_core_never_imports_a_wrapper_at_module_level() -> None:
    bad = [
        f"{a}:{line} imports {b}"
        for a, b, lazy, line in import_edges()
        if not lazy and layer(a) < WRAPPER_LAYER and layer(b) >= WRAPPER_LAYER
    ]
    assert bad == []


def test_argparse_only_in_cli() -> None:
    bad = []
    for name, path in _modules().items():
        if name.startswith("pcd_tools.cli"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if "argparse" in names:
                bad.append(f"{name}:{node.lineno}")
    assert bad == []


def test_modules_stay_small() -> None:
    long = {
        name: n
        for name, path in _modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES and name not in LONG_MODULES
    }
    assert long == {}


def test_the_layer_table_catches_an_upward_edge() -> None:
    # The rule itself: an engine module importing the decider at module level is refused.
    assert layer("pcd_tools.engine.passes.forward") < layer("pcd_tools.decide.decider")
    assert layer("pcd_tools.eval.calibration") > layer("pcd_tools.answers.calibration")
    assert layer("pcd_tools.cli.eval") > layer("pcd_tools.eval.evaluate")
    assert not _allowed_lazy("pcd_tools.engine.scorer", "pcd_tools.decide.decider")
    assert _allowed_lazy("pcd_tools.decide.decider", "pcd_tools.agents.tools")


def engine_room(module: str) -> int:
    """The room's rank in `ENGINE_ROOMS` (the facade: one past the last)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[2] in ENGINE_ROOMS:
        return ENGINE_ROOMS.index(parts[2])
    return len(ENGINE_ROOMS)


def test_engine_rooms_point_down() -> None:
    bad = [
        f"{a}:{line} imports {b}"
        for a, b, _, line in import_edges(typing=True)
        if a.startswith("pcd_tools.engine.")
        and b.startswith("pcd_tools.engine.")
        and engine_room(b) > engine_room(a)
    ]
    assert bad == []
    # the rule itself: a pass importing the decode steps, or the host a kernel, is refused
    assert engine_room("pcd_tools.engine.decode.native_steps") > engine_room(
        "pcd_tools.engine.passes.forward"
    )
    assert engine_room("pcd_tools.engine.kernels.qgemm") > engine_room("pcd_tools.engine.host.blas")
    assert engine_room("pcd_tools.engine.scorer") == len(ENGINE_ROOMS)


def test_engine_modules_sit_in_rooms() -> None:
    # Nothing but the facade directly in `engine/`: every other module is in a room.
    loose = [
        m
        for m in _modules()
        if m.startswith("pcd_tools.engine.")
        and m.count(".") == 2
        and m.split(".")[2] not in ENGINE_ROOMS
    ]
    assert sorted(loose) == [
        "pcd_tools.engine.doctor",
        "pcd_tools.engine.hybrid",
        "pcd_tools.engine.scorer",
    ]
