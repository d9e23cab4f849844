"""The code blocks of the user documents (README.md and the guides in docs/), by name.

A block is named by an HTML comment on the line right above its fence, which renders as
nothing:

    <!-- block: quick-start -->
    ```python
    ...
    ```

`run_checked` runs a Python block statement by statement and compares what each statement
prints with its `# -> text` comments (on the statement, or on comment lines right after
it).
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# The documents whose Python blocks must all run: the README and every guide.
DOCUMENTS = [
    "README.md",
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")),
]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.M | re.S)
_NAMED = re.compile(r"^<!-- block: ([\w-]+) -->\n```(\w*)\n(.*?)^```", flags=re.M | re.S)


@dataclass(frozen=True)
class Block:
    doc: str
    name: str
    lang: str
    src: str


def text(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


def fences(doc: str, lang: str = "python") -> list[str]:
    """Every fenced block of `lang` in the document, named or not."""
    return [src for lng, src in _FENCE.findall(text(doc)) if lng == lang]


def named_blocks(doc: str) -> dict[str, Block]:
    """The document's named blocks, in order (a repeated name keeps its last block; the
    tests check that names are unique)."""
    return {n: Block(doc, n, lng, src) for n, lng, src in _NAMED.findall(text(doc))}


def all_named_blocks() -> list[Block]:
    return [b for doc in DOCUMENTS for b in named_blocks(doc).values()]


def block(name: str) -> Block:
    (found,) = [b for b in all_named_blocks() if b.name == name]
    return found


_NUMBER = re.compile(r"-?\d+\.(\d+)(?:e[-+]?\d+)?")


def same_output(got: str, expected: str) -> bool:
    """`got` prints what the document shows: the same text, and the same decimal numbers
    to the float32 noise of the machine's BLAS kernels (SkylakeX, Haswell and others sum
    in different orders): within one unit of the last digit shown, and within 1e-5."""
    if _NUMBER.sub("#", got) != _NUMBER.sub("#", expected):
        return False
    for g, e in zip(_NUMBER.finditer(got), _NUMBER.finditer(expected)):
        if len(g.group(1)) != len(e.group(1)):  # printed to another precision
            return False
        unit = 10.0 ** -len(e.group(1))
        if abs(float(g.group(0)) - float(e.group(0))) > max(1e-5, 1.01 * unit):
            return False
    return True


def run_checked(src: str, ns: dict[str, Any], label: str) -> list[str]:
    """Runs `src` statement by statement in `ns`; checks every `# ->` output."""
    lines = src.splitlines()
    body = ast.parse(src).body
    checked = []
    for i, node in enumerate(body):
        stop = body[i + 1].lineno - 1 if i + 1 < len(body) else len(lines)
        segment = lines[node.lineno - 1 : stop]
        expected = [ln.split("# -> ", 1)[1].rstrip() for ln in segment if "# -> " in ln]
        code = compile(ast.Module([node], []), label, "exec", dont_inherit=True)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, ns)
        if expected:
            got = [ln.rstrip() for ln in out.getvalue().splitlines()]
            assert len(got) == len(expected) and all(
                same_output(g, e) for g, e in zip(got, expected)
            ), f"{label}, line {node.lineno}: printed {got}, the document shows {expected}"
            checked.extend(expected)
    return checked
