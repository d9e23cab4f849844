"""Later waves of dependent fields on the rows' KV cache (`Engine.score(follow_up=...)`).

Each wave is one fields pass per group of rows that ask the same questions: their
earlier answers agree, so the same answers are written before the new fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import ContextTooLongError
from ..prompt import Question
from .pack import Plan
from .passes import LayerKV
from .platform import import_mlx
from .prune import Pruning
from .trie import FieldTrie

if TYPE_CHECKING:
    from .engine import Engine, FollowUp, PassMode

mx = import_mlx()

__all__ = ["run_waves"]


def run_waves(
    engine: Engine,
    plan: Plan,
    kv: LayerKV,
    valid: list[int],
    lengths: list[int],
    mode: PassMode,
    follow_up: FollowUp,
    edge: list[list[np.ndarray]],
    asked: list[list[Question]],
    tries: list[list[FieldTrie]],
    pruning: Pruning | None = None,
) -> int:
    """Later waves on the rows' KV: each wave is one pass per group of rows that ask
    the same questions (their earlier answers agree); appends to `edge`, `asked` and
    `tries` in place and returns the model calls that ran one after another."""
    passes = 0
    while True:
        groups: dict[tuple[Question, ...], list[int]] = {}
        for r in range(len(valid)):
            nxt = follow_up(list(zip(asked[r], tries[r], edge[r])))
            if nxt:
                groups.setdefault(tuple(nxt), []).append(r)
        if not groups:
            return passes
        for qs, idx in groups.items():
            sub = engine.wave_plan(plan, qs)
            need = max(lengths[r] for r in idx) + sub.extra_tokens
            if need > engine.context_window:
                raise ContextTooLongError(
                    need,
                    engine.context_window,
                    detail=f"A later wave ({', '.join(q.key for q in qs)}) writes the "
                    f"earlier answers first and needs {sub.extra_tokens} tokens after the "
                    "prompt.",
                )
            rows_kv = kv
            if len(idx) < len(valid):
                sel = mx.array(idx)
                rows_kv = [(k[sel], v[sel]) for k, v in kv]
            got, n = engine._fields_pass(sub, rows_kv, [valid[r] for r in idx], mode, pruning)
            passes += n
            for j, r in enumerate(idx):
                edge[r] = [*edge[r], *got[j]]
                asked[r] = [*asked[r], *sub.questions]
                tries[r] = [*tries[r], *sub.tries]
