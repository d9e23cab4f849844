"""The model passes of a request: the prefill, the packed fields pass, and the batched and
sequential reference passes, all exact (DESIGN §2).

- ``packed``: all field stems and trie nodes of a chunk in one sequence with a block
  mask and per-token positions (see `pack`).
- ``batched``: one row per trie path, right-padded, the prefix broadcast over rows.
- ``sequential``: one model call per row, trimming an mlx-lm ``KVCache`` after each; the
  slow reference.

The model's own modules run every pass. Two small adapters make that possible: a cache
object that serves the fixed prefix keys and values with a given mask, and a RoPE wrapper
that accepts one position per token by moving the token axis into the batch axis.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..._lazy import mlx_lm_module
from ...prompt import Question
from ..host.blas import import_mlx
from ..kernels import cpu_ops as cpu_kernels
from .edges import chunk_edges, edge_logp, packed_result
from .head import head_at
from .kv_parts import kv_parts
from .pack import Chunk, Edges, Plan
from .pass_cache import PassCache, piece_tokens
from .trie import FieldTrie

mx = import_mlx()
import mlx.nn as nn  # noqa: E402

__all__ = [
    "PACKABLE",
    "FollowUp",
    "PassCache",
    "PassMode",
    "Passes",
    "PerTokenRoPE",
    "ScoredBatch",
]

# How a fields pass lays out its rows: one packed sequence, padded batch rows, or one
# prompt per question (the reference).
PassMode = Literal["packed", "batched", "sequential"]
# Given each context's scored (question, trie, edge log p) so far, its next questions
# ([] when it is done): how dependent fields ask for later waves on the same KV cache.
FollowUp = Callable[[list[tuple[Question, FieldTrie, np.ndarray]]], list[Question]]

# Architectures whose attention reads positions only through `rope(x, offset=cache.offset)`
# and keys through `cache.update_and_fetch`: the packed layout is verified for these.
PACKABLE = {"llama", "qwen2", "qwen3", "mistral", "smollm3", "gemma3", "phi3"}

# Per layer, (keys, values) of a pass, (B, kv_heads, tokens, head_dim).
LayerKV = list[tuple[Any, Any]]


@dataclass
class ScoredBatch:
    """Raw scores for a batch of contexts.

    Args:
        edge_logp: Per context, per field: full-vocabulary log p of every trie edge.
        prompt_tokens: Per context, prompt length in tokens.
        prefill_ms: Wall time of the prefill(s).
        suffix_eval_ms: Wall time of the fields pass.
        sequential_forward_passes: Model calls that ran one after another.
        prefix_cache_hit: Whether the schema part came from the cache.
        questions: Per context, the question each `edge_logp` entry answers; empty when
            every context ran only the plan's own pass (`Plan.questions`).
        tries: Per context, the trie of each entry, alongside `questions`.
        attention_ms: Of those, the time in the native attention kernel, summed over the
            threads that ran the passes (0.0 where attention ran elsewhere).
    """

    edge_logp: list[list[np.ndarray]]
    prompt_tokens: list[int]
    prefill_ms: float
    suffix_eval_ms: float
    sequential_forward_passes: int
    prefix_cache_hit: bool
    questions: list[list[Question]] = field(default_factory=list)
    tries: list[list[FieldTrie]] = field(default_factory=list)
    attention_ms: float = 0.0


class PerTokenRoPE(nn.Module):
    """Wraps a model's RoPE so `offset` may be a (batch, length) array of positions."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def __call__(self, x: Any, offset: Any = 0) -> Any:
        native = cpu_kernels.rope(self.inner, x, offset)
        if native is not None:
            return native
        if isinstance(offset, mx.array) and offset.ndim == 2:
            b, h, n, d = x.shape
            y = x.transpose(0, 2, 1, 3).reshape(b * n, h, 1, d)
            y = self.inner(y, offset=offset.reshape(-1))
            return y.reshape(b, n, h, d).transpose(0, 2, 1, 3)
        return self.inner(x, offset=offset)


def _hidden_and_head(model: nn.Module) -> tuple[Any, Any]:
    """(inner transformer, head) if the model splits that way, else (None, None)."""
    inner = getattr(model, "model", None)
    if inner is None or not callable(inner):
        return None, None
    if hasattr(model, "lm_head"):
        return inner, model.lm_head
    args = getattr(model, "args", None)
    tied = getattr(args, "tie_word_embeddings", False) or getattr(
        model, "tie_word_embeddings", False
    )
    if tied and hasattr(inner, "embed_tokens"):  # gemma3 keeps the flag on the model
        return inner, inner.embed_tokens.as_linear
    return None, None


def _install_rope(inner: Any) -> bool:
    """Wraps every layer's RoPE in `PerTokenRoPE`; False at the first layer without one."""
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        rope = getattr(attn, "rope", None)
        if attn is None or rope is None:
            return False
        if not isinstance(rope, PerTokenRoPE):
            attn.rope = PerTokenRoPE(rope)
    return True


class Passes:
    """The passes of one loaded model over a prefix KV cache.

    Args:
        model: An mlx-lm model (callable as `model(tokens, cache=[...])`).
        model_type: mlx-lm model type; the packed pass is offered for `PACKABLE` ones.

    Attributes:
        packable: Whether the packed pass is available (per-token RoPE installed).
        prefix_apart: Whether a packed pass hands the attention the prefix K/V apart
            from its own instead of a copy of both (`PassCache`); the engine turns it on
            where `cpu_kernels.takes_prefix_apart` says the model's attention reads them.
    """

    def __init__(self, model: nn.Module, model_type: str = "") -> None:
        self.model = model
        self.prefix_apart = False
        self.inner, self.head = _hidden_and_head(model)
        self.packable = model_type in PACKABLE and self.inner is not None
        if self.packable:
            self.packable = _install_rope(self.inner)

    # --- model calls ----------------------------------------------------------------------

    def run(self, tokens: Any, caches: list[PassCache]) -> Any:
        """Hidden states (split models) or logits (others) for `tokens` (B, L)."""
        if self.inner is not None:
            return self.inner(tokens, cache=caches)
        return self.model(tokens, cache=caches)

    def logits_at(self, out: Any, rows: Any, cols: Any) -> Any:
        """Logits at (row, col) pairs of a pass's output, in float32."""
        picked = out[rows, cols]
        if self.inner is not None:
            picked = self.head(picked)
        return picked.astype(mx.float32)

    def chunk_scored(self, plan: Plan, ch: Chunk, out: Any, offset: int = 0) -> Edges:
        """The edges chunk `ch` scored, from its call's output `out` (its slots at
        `ch.slots + offset` of every row). A narrow field's slots go through the head at
        its allowed tokens only (`Chunk.narrow`, `head_at`)."""
        if not ch.narrow or self.inner is None:
            logits = self.logits_at(out, slice(None), mx.array(ch.slots + offset))
            mx.eval(logits)
            return chunk_edges(plan, ch, np.asarray(logits))  # zero-copy view
        full, narrow = ch.slot_split()
        logits = None
        if len(full):
            logits = self.logits_at(out, slice(None), mx.array(ch.slots[full] + offset))
            mx.eval(logits)
        picked = out[:, mx.array(ch.slots[narrow] + offset)]
        at = head_at(self.head, picked, ch.narrow_tokens)
        return chunk_edges(plan, ch, None if logits is None else np.asarray(logits), at)

    def packed_after(
        self, plan: Plan, kv: LayerKV, valid: list[int], ch: Chunk, stems: list[list[int]]
    ) -> tuple[Edges, LayerKV]:
        """One packed chunk after per-row tokens not yet in `kv` (a generated value just
        decoded), in the same call: each row's stem runs causally after its prefix, and
        the chunk after the stem, as if the stem had been written first.

        Returns:
            The edges the chunk scored, and per layer the stems' K/V, (B, KH, S, D) with S
            the longest stem (a row's own stem is its first `len(stems[r])` positions).
        """
        found, caches, s = self._after(plan, kv, valid, ch, stems)
        new = [c.kept(s, with_prefix=False) for c in caches]
        mx.eval([x for pair in new for x in pair])
        return found, new

    def prefill_and_pack(
        self, plan: Plan, prefix: LayerKV, rows: list[list[int]], ch: Chunk, stem: int = 0
    ) -> tuple[Edges, LayerKV, LayerKV | None]:
        """`prefill(rows, prefix)` and the packed pass of one chunk over it, in one model
        call: each row's tokens run causally after the shared prefix, the chunk after
        them, as `packed` runs it after the prefill. A request whose fields pass starts
        with one chunk saves a model call: its fixed cost (every weight read, and each
        layer's kernel calls) is 90 ms of the tariff request on the embedded model.

        Args:
            stem: With one row, whose chunk starts with a chain of this many tokens (one
                field's stem, root included, as `pack_parts` lays it out first), also
                keep their K/V after the row's: a later level of that field reads them
                there instead of running them again (`make_chunks(stem_cached=True)`).

        Returns:
            The chunk's edges; per layer the K/V of the prefix and the rows, (B, KH,
            P + S, D), right-padded as `prefill` gives them; and with `stem`, the same
            followed by the stem's, else None.
        """
        b = len(rows)
        if stem and (
            b != 1 or len(ch.tokens) < stem or (ch.rel_pos[:stem] != np.arange(stem)).any()
        ):
            raise ValueError("a kept stem needs one row and a chunk that starts with it")
        if b == 1:  # a long row's leading pieces first, in calls of bounded size
            got, rest = self.prefill_pieces(rows[0], prefix)
            assert got is not None  # it starts from `prefix`, never None here
            prefix, rows = got, [rest]
        p = int(prefix[0][0].shape[2])
        kv = [
            (k, v)
            if k.shape[0] == b
            else (mx.broadcast_to(k, (b, *k.shape[1:])), mx.broadcast_to(v, (b, *v.shape[1:])))
            for k, v in prefix
        ]
        found, caches, s = self._after(plan, kv, [p] * b, ch, rows)
        mx.eval([x for c in caches for x in c.evaluate(s + stem)])
        kept = [c.kept(s) for c in caches]
        kept_stem = [c.kept(s + stem) for c in caches] if stem else None
        # The parts a later pass reads in place (`kv_parts`: slices of what was just
        # evaluated, zero-copy) are made ready here, on this thread's stream: a stream
        # worker that ran a lazy slice made here would find no such stream in its thread.
        mx.eval(
            [x for k, v in (*kept, *(kept_stem or ())) for part in kv_parts(k, v) for x in part]
        )
        return found, kept, kept_stem

    def _after(
        self, plan: Plan, kv: LayerKV, valid: list[int], ch: Chunk, stems: list[list[int]]
    ) -> tuple[Edges, list[PassCache], int]:
        """The call of `packed_after` and `prefill_and_pack`: the chunk's edges, the
        layers' caches (prefix, stems and chunk K/V) and the longest stem."""
        b, t = len(valid), len(ch.tokens)
        width = kv[0][0].shape[2]
        lens = np.array([len(x) for x in stems])
        s = int(lens.max())
        toks = np.zeros((b, s + t), np.int32)
        pos = np.zeros((b, s + t), np.int32)
        for r, stem in enumerate(stems):
            toks[r, : len(stem)] = stem
            toks[r, s:] = ch.tokens
            pos[r, :s] = valid[r] + np.arange(s)
            pos[r, s:] = valid[r] + len(stem) + ch.rel_pos
        prefix_ok = np.arange(width)[None, :] < np.array(valid)[:, None]  # (B, K)
        stem_ok = np.arange(s)[None, :] < lens[:, None]  # (B, S)
        mask = np.zeros((b, s + t, width + s + t), bool)
        mask[:, :, :width] = prefix_ok[:, None, :]
        mask[:, :s, width : width + s] = np.tril(np.ones((s, s), bool))[None] & stem_ok[:, None]
        mask[:, s:, width : width + s] = stem_ok[:, None, :]
        mask[:, s:, width + s :] = ch.allow[None]
        pos_a, mask_a = mx.array(pos), mx.array(mask[:, None])
        caches = [PassCache(k, v, pos_a, mask_a, apart=self.prefix_apart) for k, v in kv]
        out = self.run(mx.array(toks), caches)
        return self.chunk_scored(plan, ch, out, s), caches, s

    def layers(self) -> list[Any]:
        """The model's transformer layers."""
        inner: Any = (
            self.inner if self.inner is not None else getattr(self.model, "model", self.model)
        )
        return list(inner.layers)

    def prefill_pieces(
        self, row: list[int], prefix: LayerKV | None
    ) -> tuple[LayerKV | None, list[int]]:
        """Runs a long row's leading tokens in calls of `piece_tokens(len(row))` each,
        causal after the prefix and the pieces before them, and returns the K/V so far
        (the prefix's and the pieces', joined lazily: `join_kv`) and the tokens left for
        the caller's own call (1 to a piece's worth; the whole row when it is short).

        A call's transient memory follows its token count (a 1.5B model's MLP holds
        3 x 8,960 floats a token), so pieces bound it; the attention kernel reads the
        pieces' K/V in place as parts, and each query sees exactly the keys it would in
        one call, so the numbers are those of one call up to the products' own rounding.
        """
        size = piece_tokens(len(row))
        head = (len(row) - 1) // size * size
        kv = prefix
        for start in range(0, head, size):
            piece = row[start : start + size]
            caches = [
                PassCache(None, None, 0, "causal")
                if kv is None
                else PassCache(*kv[li], int(kv[li][0].shape[2]), "causal", apart=self.prefix_apart)
                for li in range(len(self.layers()))
            ]
            self.run(mx.array([piece]), caches)
            mx.eval([x for c in caches for x in c.evaluate(len(piece))])
            kv = [c.kept(len(piece)) for c in caches]
        return kv, row[head:]

    def prefill(self, tokens: list[list[int]], prefix: LayerKV | None) -> LayerKV:
        """Runs the prefill of right-padded rows after an optional shared prefix; returns
        each layer's K/V, evaluated."""
        return self.prefill_with_logits(tokens, prefix, last=False)[0]

    def prefill_with_logits(
        self, tokens: list[list[int]], prefix: LayerKV | None, last: bool = True
    ) -> tuple[LayerKV, np.ndarray | None]:
        """`prefill`, and with `last` each row's float32 logits at its last token, (B, V)
        (only those positions go through the head): what a generated field that starts
        right after the prompt decodes its first token from. A long single row runs in
        pieces (`prefill_pieces`); the K/V come back the same way."""
        if len(tokens) == 1:
            prefix, rest = self.prefill_pieces(tokens[0], prefix)
            tokens = [rest]
        width = max(len(r) for r in tokens)
        arr = np.zeros((len(tokens), width), dtype=np.int32)
        for i, r in enumerate(tokens):
            arr[i, : len(r)] = r
        b = len(tokens)
        mask = "causal" if width > 1 else None
        caches = []
        for li in range(len(self.layers())):
            if prefix is None:
                caches.append(PassCache(None, None, 0, mask))
            else:
                k, v = prefix[li]
                offset = int(k.shape[2])
                if b > 1 and k.shape[0] == 1:
                    k = mx.broadcast_to(k, (b, *k.shape[1:]))
                    v = mx.broadcast_to(v, (b, *v.shape[1:]))
                caches.append(PassCache(k, v, offset, mask, apart=self.prefix_apart))
        out = self.run(mx.array(arr), caches)
        logits = None
        if last:
            ends = mx.array([len(r) - 1 for r in tokens])
            logits = self.logits_at(out, mx.arange(b), ends)
        mx.eval(
            [x for c in caches for x in c.evaluate(width)]
            + ([logits] if logits is not None else [])
        )
        kv = [c.kept(width) for c in caches]
        return kv, (None if logits is None else np.array(logits))

    # --- the packed fields pass -----------------------------------------------------------

    def packed(self, plan: Plan, kv: LayerKV, valid: list[int], chunks: list[Chunk]) -> list[Edges]:
        """Runs the packed passes of `chunks` one after another on the current stream;
        returns the edge log-probabilities each chunk scored. A chunk's full-vocabulary
        logits (B, slots, V) are reduced as soon as it is evaluated, so at most one
        chunk's logits per stream are alive (tariff: 6 x 48 MB otherwise)."""
        b = len(valid)
        width = kv[0][0].shape[2]
        prefix_ok = np.arange(width)[None, :] < np.array(valid)[:, None]  # (B, K)
        outs: list[Edges] = []
        for ch in chunks:
            t = len(ch.tokens)
            mask = np.concatenate(
                [
                    np.broadcast_to(prefix_ok[:, None, :], (b, t, width)),
                    np.broadcast_to(ch.allow, (b, t, t)),
                ],
                axis=2,
            )[:, None]
            pos = (np.array(valid)[:, None] + ch.rel_pos[None, :]).astype(np.int32)
            pos_a, mask_a = mx.array(pos), mx.array(mask)
            caches = [
                PassCache(k, v, pos_a, mask_a, keep=False, apart=self.prefix_apart) for k, v in kv
            ]
            toks = mx.array(np.broadcast_to(ch.tokens, (b, t)).astype(np.int32))
            out = self.run(toks, caches)
            outs.append(self.chunk_scored(plan, ch, out))
            del out, caches
        return outs

    def group_job(
        self, plan: Plan, rows: list[list[int]], valid: list[int], prefix: LayerKV | None
    ) -> tuple[list[list[np.ndarray]], float, float]:
        """Prefills `rows` after the prefix and runs all their fields passes; returns the
        per-row edge scores and the seconds spent on each phase."""
        t0 = time.perf_counter()
        kv = self.prefill(rows, prefix)
        t1 = time.perf_counter()
        outs = self.packed(plan, kv, valid, plan.chunks)
        fields = packed_result(plan, outs, len(rows))
        return fields, t1 - t0, time.perf_counter() - t1

    # --- the reference passes -------------------------------------------------------------

    def batched(
        self, plan: Plan, kv: LayerKV, valid: list[int], pack_budget: int
    ) -> tuple[list[list[np.ndarray]], int]:
        """One row per trie path, right-padded, the prefix broadcast over the rows.

        Returns:
            Per context row, per field edge log-probabilities; and the model calls run.
        """
        rows = _reference_rows(plan)
        result: list[list[np.ndarray]] = []
        passes = 0
        for r, n_valid in enumerate(valid):
            pre = [(k[r : r + 1, :, :n_valid], v[r : r + 1, :, :n_valid]) for k, v in kv]
            node_logits: dict[tuple[int, int], Any] = {}
            budget = max(1, pack_budget * 4 // max(len(t) for _, t, _ in rows))
            for start in range(0, len(rows), budget):
                group = rows[start : start + budget]
                width = max(len(t) for _, t, _ in group)
                arr = np.zeros((len(group), width), dtype=np.int32)
                for i, (_, t, _) in enumerate(group):
                    arr[i, : len(t)] = t
                g = len(group)
                caches = [
                    PassCache(
                        mx.broadcast_to(k, (g, *k.shape[1:])),
                        mx.broadcast_to(v, (g, *v.shape[1:])),
                        n_valid,
                        "causal" if width > 1 else None,
                    )
                    for k, v in pre
                ]
                out = self.run(mx.array(arr), caches)
                ri, ci, keys = [], [], []
                seen = set(node_logits)
                for i, (fi, _, nodes) in enumerate(group):
                    for node, p in nodes:
                        if (fi, node) not in seen:
                            seen.add((fi, node))
                            ri.append(i)
                            ci.append(p)
                            keys.append((fi, node))
                logits = self.logits_at(out, mx.array(ri), mx.array(ci))
                mx.eval(logits)
                passes += 1
                for j, key in enumerate(keys):
                    node_logits[key] = logits[j]
            result.append(_fields_from_nodes(plan, node_logits))
        return result, passes

    def sequential(
        self, plan: Plan, kv: LayerKV, valid: list[int]
    ) -> tuple[list[list[np.ndarray]], int]:
        """One model call per trie path, trimming an mlx-lm `KVCache` after each.

        Returns:
            Per context row, per field edge log-probabilities; and the model calls run.
        """
        cache_module = mlx_lm_module("models.cache")
        KVCache, trim_prompt_cache = cache_module.KVCache, cache_module.trim_prompt_cache

        rows = _reference_rows(plan)
        result: list[list[np.ndarray]] = []
        passes = 0
        for r, n_valid in enumerate(valid):
            cache = []
            for k, v in kv:
                c = KVCache()
                c.state = (k[r : r + 1, :, :n_valid], v[r : r + 1, :, :n_valid], n_valid)
                cache.append(c)
            node_logits: dict[tuple[int, int], Any] = {}
            for fi, toks, nodes in rows:
                logits = self.model(mx.array([toks]), cache=cache)[0].astype(mx.float32)
                for node, p in nodes:
                    node_logits.setdefault((fi, node), logits[p])
                mx.eval(list(node_logits.values()))
                trim_prompt_cache(cache, len(toks))
                passes += 1
            result.append(_fields_from_nodes(plan, node_logits))
        return result, passes


# --- the reference passes' rows and logits ---------------------------------------------------


def _reference_rows(plan: Plan) -> list[tuple[int, list[int], list[tuple[int, int]]]]:
    """The reference passes' rows: (field, tokens, [(node, position in row)])."""
    rows = []
    for fi, trie in enumerate(plan.tries):
        s = len(trie.stem)
        for path in trie.paths():
            toks = list(trie.stem) + [trie.node_tokens[n] for n in path]
            nodes = [(0, s - 1)] + [(n, s - 1 + trie.node_depth[n]) for n in path]
            rows.append((fi, toks, nodes))
    return rows


def _fields_from_nodes(plan: Plan, node_logits: dict[tuple[int, int], Any]) -> list[np.ndarray]:
    """Per field edge log-probabilities from each (field, trie node)'s logits."""
    out = []
    for fi, trie in enumerate(plan.tries):
        stacked = mx.stack([node_logits[(fi, n)] for n in range(trie.n_nodes)])[None]
        out.append(edge_logp(np.asarray(stacked), trie)[0])
    return out
