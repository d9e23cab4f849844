"""Later waves of dependent fields on the rows' KV cache (`Engine.score(follow_up=...)`).

Each wave is one fields pass per group of rows that ask the same questions: their
earlier answers agree, so the same answers are written before the new fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ...errors import ContextTooLongError
from ...prompt import Question
from ..host.blas import import_mlx
from .forward import FollowUp, LayerKV, PassMode
from .pack import Plan
from .prune import Pruning
from .trie import FieldTrie

mx = import_mlx()

__all__ = ["FieldsPass", "WavePlan", "run_waves"]

# The engine's cached plan of a later wave's questions after a plan's prompt
# (`Engine.wave_plan`), and its fields pass over the rows of a KV cache
# (`Engine._fields_pass`): what a wave needs from the engine, and nothing else.
WavePlan = Callable[[Plan, Sequence[Question]], Plan]
FieldsPass = Callable[..., tuple[list[list[np.ndarray]], int]]


def run_waves(
    wave_plan: WavePlan,
    fields_pass: FieldsPass,
    context_window: int,
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
    `tries` in place and returns the model calls that ran one after another.

    `wave_plan` and `fields_pass` are the engine's (`Engine.wave_plan`,
    `Engine._fields_pass`), `context_window` its model's window."""
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
            sub = wave_plan(plan, qs)
            need = max(lengths[r] for r in idx) + sub.extra_tokens
            if need > context_window:
                raise ContextTooLongError(
                    need,
                    context_window,
                    detail=f"A later wave ({', '.join(q.key for q in qs)}) writes the "
                    f"earlier answers first and needs {sub.extra_tokens} tokens after the "
                    "prompt.",
                )
            rows_kv = kv
            if len(idx) < len(valid):
                sel = mx.array(idx)
                rows_kv = [(k[sel], v[sel]) for k, v in kv]
            got, n = fields_pass(sub, rows_kv, [valid[r] for r in idx], mode, pruning)
            passes += n
            for j, r in enumerate(idx):
                edge[r] = [*edge[r], *got[j]]
                asked[r] = [*asked[r], *sub.questions]
                tries[r] = [*tries[r], *sub.tries]
