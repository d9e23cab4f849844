"""Dependent fields: `json_schema_extra={"depends_on": [...]}` and the waves they make.

A field that depends on others is answered after them: a topological sort puts the
fields into waves, wave 1 being the fields that depend on nothing. Each later wave is
one more pass whose JSON text already holds the earlier answers the field depends on.
A parent may be any scored field; a multi-label parent is written as its JSON holds it,
an object of every label with `true` for the chosen ones (`pcd_tools.prompt.answer_text`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..errors import DependencyCycleError, UnknownParentError
from .spec import FieldSpec, _where

__all__ = ["ancestors", "parse_depends_on", "resolve_dependencies", "resolve_parent", "waves"]


def parse_depends_on(model: str, path: str, extra: Mapping[str, Any]) -> tuple[str, ...]:
    """The raw `depends_on` names of a field (not yet resolved)."""
    raw = extra.get("depends_on", ())
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, (list, tuple)) or not all(isinstance(r, str) for r in raw):
        raise UnknownParentError(
            f"{_where(model, path)}: depends_on={raw!r}; accepted: a list of field names.",
            model=model,
            field=path,
        )
    return tuple(raw)


def resolve_parent(model: str, path: str, name: str, known: Sequence[str]) -> str:
    """A parent's full name: a sibling in the same nested model first, then a top name.

    Raises:
        UnknownParentError: naming the fields that exist.
    """
    prefix = path.rsplit(".", 1)[0] + "." if "." in path else ""
    for cand in (prefix + name, name):
        if cand in known and cand != path:
            return cand
    raise UnknownParentError(
        f"{_where(model, path)}: depends on {name!r}, which is not another field of {model}; "
        f"accepted: one of {[k for k in known if k != path]}.",
        model=model,
        field=path,
    )


def waves(model: str, fields: Sequence[FieldSpec]) -> list[list[str]]:
    """The fields in waves (declaration order inside each): wave k holds the fields
    whose longest chain of parents has k - 1 links.

    Raises:
        DependencyCycleError: naming the cycle.
    """
    parents = {f.name: f.depends_on for f in fields}
    level: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> int:
        if name in level:
            return level[name]
        if name in trail:
            cycle = [*trail[trail.index(name) :], name]
            raise DependencyCycleError(
                f"{model}: the fields depend on each other in a cycle ({' -> '.join(cycle)}); "
                "accepted: dependencies that form no cycle.",
                model=model,
                field=name,
            )
        lv = 1 + max((visit(p, [*trail, name]) for p in parents[name]), default=-1)
        level[name] = lv
        return lv

    for f in fields:
        visit(f.name, [])
    out: list[list[str]] = [[] for _ in range(max(level.values(), default=0) + 1)]
    for f in fields:
        out[level[f.name]].append(f.name)
    return out


def ancestors(fields: Sequence[FieldSpec], name: str) -> list[str]:
    """Every field `name` depends on, directly or not, in declaration order."""
    parents = {f.name: f.depends_on for f in fields}
    seen: set[str] = set()
    todo = list(parents[name])
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(parents[p])
    return [f.name for f in fields if f.name in seen]


def resolve_dependencies(model: str, fields: Sequence[FieldSpec]) -> list[FieldSpec]:
    """The fields with their `depends_on` names resolved to full (dotted) names; checks
    that every parent exists and that there is no cycle."""
    known = [f.name for f in fields]
    out = []
    for f in fields:
        if f.depends_on:
            names = tuple(
                dict.fromkeys(resolve_parent(model, f.name, p, known) for p in f.depends_on)
            )
            f = replace(f, depends_on=names)
        out.append(f)
    waves(model, out)
    return out
