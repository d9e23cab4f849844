"""`Taxonomy`: a field's candidates as the leaves of a tree of labels (built by
`pcd_tools.schema.labels`, decided by `pcd_tools.answers.taxonomy`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Taxonomy"]


@dataclass(frozen=True)
class Taxonomy:
    """A field's candidates as the leaves of a tree of labels.

    Args:
        separator: What joins the levels of a path in the written answer.
        paths: Per candidate (in the field's order), its nodes from the top level down,
            the leaf last; `()` for the `null` candidate of an optional field.
        top: The top-level nodes, in first-seen order.
        descriptions: `(node, text)` for the internal nodes that have one (shown in the
            prompt beside the top level).
        decide: `"path"` (level by level: the most probable top-level node, then the
            most probable child of it, down to a leaf) or `"leaf"` (the most probable
            leaf of the whole tree). Not part of the prompt.
    """

    separator: str
    paths: tuple[tuple[Any, ...], ...]
    top: tuple[Any, ...]
    descriptions: tuple[tuple[Any, str], ...] = ()
    decide: Literal["path", "leaf"] = "path"

    @property
    def depth(self) -> int:
        """The most levels a path has."""
        return max((len(p) for p in self.paths), default=0)

    def description(self, node: Any) -> str | None:
        """An internal node's description, if it has one."""
        for n, d in self.descriptions:
            if n == node:
                return d
        return None

    def to_spec(self) -> dict[str, Any]:
        """What of the tree reaches the prompt beyond the candidates' own texts."""
        return {
            "separator": self.separator,
            "top": list(self.top),
            **({"descriptions": [list(d) for d in self.descriptions]} if self.descriptions else {}),
        }
