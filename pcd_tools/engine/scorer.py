"""The PCD algorithm: prefill once, then score every field's candidates in one shared pass.

Three ways of running the fields pass over the prefix KV cache, all exact (DESIGN §2):

- ``packed``: all field stems and trie nodes concatenated into one sequence with a block
  mask (each token sees the prefix, its own stem and its trie ancestors) and per-token
  positions. On CPU the pack is cut into chunks spread over two CPU streams.
- ``batched``: one row per trie path, right-padded, the prefix broadcast over rows.
- ``sequential``: one model call per row, trimming an mlx-lm ``KVCache`` after each; the
  slow reference.

The model's own modules run every pass. Two small adapters make that possible: a cache
object that serves the fixed prefix keys and values with a given mask, and a RoPE wrapper
that accepts one position per token by moving the token axis into the batch axis.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..errors import ContextTooLongError, InvalidArgumentError
from ..prompt import build_prompt, candidate_text, terminator_for
from ..schema import Schema
from . import cpu_kernels as _kernels
from .platform import import_mlx, set_blas_threads
from .trie import FieldTrie, build_trie

mx = import_mlx()
import mlx.nn as nn  # noqa: E402

__all__ = ["Engine", "PassMode", "ScoredBatch"]

PassMode = Literal["packed", "batched", "sequential"]
_ALL_THREADS = os.cpu_count() or 1
# Architectures whose attention reads positions only through `rope(x, offset=cache.offset)`
# and keys through `cache.update_and_fetch`: the packed layout is verified for these.
PACKABLE = {"llama", "qwen2", "qwen3", "mistral", "smollm3"}
SPLIT_TOKENS = 160


class _PassCache:
    """One layer's cache for a pass: fixed prefix K/V, the pass's positions and mask."""

    def __init__(self, k: Any, v: Any, offset: Any, mask: Any, keep: bool = True):
        self.pk, self.pv = k, v
        self.offset = offset
        self.mask = mask
        self.keep = keep  # a fields pass drops each layer's K/V as soon as it is used
        self.keys: Any = None
        self.values: Any = None

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        if self.pk is not None:
            keys = mx.concatenate([self.pk, keys], axis=2)
            values = mx.concatenate([self.pv, values], axis=2)
        if self.keep:
            self.keys, self.values = keys, values
        return keys, values

    def make_mask(self, n: int, return_array: bool = False, window_size: Any = None) -> Any:
        return self.mask


class _PerTokenRoPE(nn.Module):
    """Wraps a model's RoPE so `offset` may be a (batch, length) array of positions."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def __call__(self, x: Any, offset: Any = 0) -> Any:
        if isinstance(offset, mx.array) and offset.ndim == 2:
            b, h, n, d = x.shape
            y = x.transpose(0, 2, 1, 3).reshape(b * n, h, 1, d)
            y = self.inner(y, offset=offset.reshape(-1))
            return y.reshape(b, n, h, d).transpose(0, 2, 1, 3)
        return self.inner(x, offset=offset)


@dataclass
class _Chunk:
    """A group of field parts packed into one sequence.

    A part is a field's trie, or (for a big field) a subset of its root's subtrees.
    """

    fields: list[int]  # per part: the field
    part_nodes: list[np.ndarray]  # per part: the trie nodes it evaluates
    tokens: np.ndarray  # (T,)
    rel_pos: np.ndarray  # (T,) position after the prompt
    allow: np.ndarray  # (T, T) bool
    node_index: list[np.ndarray]  # per part: pack index of each of its nodes
    slots: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    node_rows: list[np.ndarray] = field(default_factory=list)  # per part: rows of `slots`

    def __post_init__(self) -> None:
        self.slots = np.unique(np.concatenate(self.node_index)).astype(np.int32)
        self.node_rows = [np.searchsorted(self.slots, idx) for idx in self.node_index]


# What a chunk scored: per field part, (field, edge indices, (B, edges) log p).
_Edges = list[tuple[int, np.ndarray, np.ndarray]]


@dataclass
class Plan:
    """Everything a (schema, tokenizer) pair needs, computed once and cached."""

    schema: Schema
    head_ids: list[int]
    tail_ids: list[int]
    tries: list[FieldTrie]
    chunks: list[_Chunk] = field(default_factory=list)

    @property
    def extra_tokens(self) -> int:
        """Longest field stem plus trie depth: positions needed beyond the prompt."""
        return max(len(t.stem) + max(t.node_depth) for t in self.tries)


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
    """

    edge_logp: list[list[np.ndarray]]
    prompt_tokens: list[int]
    prefill_ms: float
    suffix_eval_ms: float
    sequential_forward_passes: int
    prefix_cache_hit: bool


def _hidden_and_head(model: nn.Module) -> tuple[Any, Any]:
    """(inner transformer, head) if the model splits that way, else (None, None)."""
    inner = getattr(model, "model", None)
    if inner is None or not callable(inner):
        return None, None
    if hasattr(model, "lm_head"):
        return inner, model.lm_head
    args = getattr(model, "args", None)
    if getattr(args, "tie_word_embeddings", False) and hasattr(inner, "embed_tokens"):
        return inner, inner.embed_tokens.as_linear
    return None, None


class _StreamWorkers:
    """A fixed number of daemon threads, each with its own CPU stream, that run the
    concurrent parts of passes for every engine that uses that many streams.

    They never exit. A thread that holds MLX streams and exits while the interpreter
    shuts down can abort the process ("terminate called without an active exception",
    seen with a `ThreadPoolExecutor`, whose threads are joined at exit).
    """

    def __init__(self, n: int) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]]
        self._jobs = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._loop, name=f"pcd-stream-{n}-{i}", daemon=True)
            for i in range(n)
        ]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., Any], arg: Any) -> Future[Any]:
        """Queues `fn(arg)`; the first free worker runs it."""
        fut: Future[Any] = Future()
        self._jobs.put((fn, (arg,), fut))
        return fut

    def _loop(self) -> None:
        stream = mx.new_stream(mx.cpu)
        while True:
            fn, args, fut = self._jobs.get()
            if not fut.set_running_or_notify_cancel():  # pragma: no cover - never cancelled
                continue
            try:
                with mx.stream(stream):
                    fut.set_result(fn(*args))
            except BaseException as e:  # handed to the waiting caller
                fut.set_exception(e)


_POOLS: dict[int, _StreamWorkers] = {}
_POOLS_LOCK = threading.Lock()


def _workers(n: int) -> _StreamWorkers:
    """The shared pool of exactly `n` stream workers (at most `n` jobs run at once)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(n)
        if pool is None:
            pool = _POOLS[n] = _StreamWorkers(n)
        return pool


class Engine:
    """Scores compiled schemas on one loaded model. Thread-safe: one pass at a time.

    Args:
        model: An mlx-lm model (callable as `model(tokens, cache=[...])`).
        tokenizer: A `TextTokenizer` (encode, decode, apply_chat_template).
        context_window: Maximum positions the model supports.
        device: `"cpu"`, `"metal"` or `"cuda"`.
        model_type: mlx-lm model type, used to decide whether packing is safe.
        bos_token_id: Prepended to the prompt when `add_bos` is set.
        add_bos: Whether the model expects a BOS token.
        pack_budget: Tokens per packed chunk (CPU); GPU runs one chunk.
        streams: CPU streams to spread chunks over.
        prefix_cache_size: Schema prefixes kept (LRU).
        prefix_cache_bytes: Byte budget for cached prefix K/V.
        stream_blas_threads: BLAS threads while several CPU streams run at once.
        batch_tokens: Padded context tokens per row group when several contexts are
            scored together (CPU); groups run concurrently on the stream workers.
        cpu_kernels: Run attention softmax and SiLU in numpy (`cpu_kernels` module) on
            CPU; default on for CPU engines unless `PCD_CPU_KERNELS=0`.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        context_window: int,
        device: str = "cpu",
        model_type: str = "",
        bos_token_id: int | None = None,
        add_bos: bool = False,
        pack_budget: int = 256,
        streams: int = 2,
        prefix_cache_size: int = 16,
        prefix_cache_bytes: int = 1 << 30,
        stream_blas_threads: int = 1,
        cpu_kernels: bool | None = None,
        batch_tokens: int = 1024,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.context_window = int(context_window)
        self.device = device
        self.model_type = model_type
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos
        self.pack_budget = pack_budget if device == "cpu" else 1 << 30
        self.stream_blas_threads = stream_blas_threads
        self.batch_tokens = batch_tokens if device == "cpu" else 1 << 30
        self.lock = threading.RLock()
        self._plans: OrderedDict[Any, Plan] = OrderedDict()
        self._prefix: OrderedDict[tuple[int, ...], list[tuple[Any, Any]]] = OrderedDict()
        self._prefix_size = prefix_cache_size
        self._prefix_bytes = prefix_cache_bytes
        self._inner, self._head = _hidden_and_head(model)
        self.packable = model_type in PACKABLE and self._inner is not None
        if self.packable:
            self._install_rope()
        self.n_streams = max(1, streams) if device == "cpu" else 1
        self._local = threading.local()
        self.default_mode: PassMode = "packed" if self.packable else "batched"
        self.stats = {"prefix_hits": 0, "prefix_misses": 0}
        if cpu_kernels is None:
            cpu_kernels = device == "cpu" and os.environ.get("PCD_CPU_KERNELS", "1") != "0"
        self.cpu_kernels = bool(cpu_kernels) and device == "cpu" and _kernels.install(model)

    def kernels(self) -> Any:
        """Context manager: this engine's kernel choice for model calls on this thread."""
        return _kernels.active(self.cpu_kernels, threads=_ALL_THREADS)

    def _parallel(self, jobs: list[Callable[[], Any]]) -> list[Any]:
        """Runs jobs at once, each on a stream worker thread with its own CPU stream (MLX
        evaluation and numpy release the GIL). A single job runs on this thread."""
        if len(jobs) == 1:
            with mx.stream(self.stream), self.kernels():
                return [jobs[0]()]
        kernels = self.cpu_kernels

        def run(job: Callable[[], Any]) -> Any:
            with _kernels.active(kernels, threads=self.stream_blas_threads):
                return job()

        set_blas_threads(self.stream_blas_threads)
        try:
            pool = _workers(self.n_streams)
            futures = [pool.submit(run, job) for job in jobs]
            return [f.result() for f in futures]
        finally:
            set_blas_threads(_ALL_THREADS)

    @property
    def stream(self) -> Any:
        """This thread's stream for this engine (MLX streams belong to their thread)."""
        stream = getattr(self._local, "stream", None)
        if stream is None:
            if self.device == "cpu":
                stream = mx.new_stream(mx.cpu)
            else:
                stream = mx.default_stream(mx.default_device())
            self._local.stream = stream
        return stream

    # --- set-up -------------------------------------------------------------------------

    def _install_rope(self) -> None:
        for layer in self._inner.layers:
            attn = getattr(layer, "self_attn", None)
            rope = getattr(attn, "rope", None)
            if attn is None or rope is None:
                self.packable = False
                return
            if not isinstance(rope, _PerTokenRoPE):
                attn.rope = _PerTokenRoPE(rope)

    def encode_ids(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS)."""
        return list(self.tokenizer.encode(text))

    def plan(self, schema: Schema, choice_order: dict[str, Sequence[int]] | None = None) -> Plan:
        """The cached token plan of a schema (prompt pieces, tries, pack chunks)."""
        key = (schema.fingerprint(), _order_key(choice_order))
        with self.lock:
            hit = self._plans.get(key)
            if hit is not None:
                self._plans.move_to_end(key)
                return hit
        parts = build_prompt(self.tokenizer, schema, choice_order=choice_order)
        head = self.encode_ids(parts.head)
        if (
            self.add_bos
            and self.bos_token_id is not None
            and (not head or head[0] != self.bos_token_id)
        ):
            head = [self.bos_token_id, *head]
        tail = self.encode_ids(parts.tail)
        term = terminator_for(schema)
        tries = []
        for f in schema.fields:
            seqs = [self.encode_ids(candidate_text(f, c.literal, term)) for c in f.choices]
            tries.append(build_trie(seqs, what=f"{schema.name}.{f.name}"))
        plan = Plan(schema, head, tail, tries)
        plan.chunks = self._make_chunks(tries)
        with self.lock:
            self._plans[key] = plan
            while len(self._plans) > 64:
                self._plans.popitem(last=False)
        return plan

    def _make_chunks(self, tries: list[FieldTrie]) -> list[_Chunk]:
        """Splits the fields pass into about `pack_budget`-token chunks (at least one per
        CPU stream when there is enough work), splitting big fields by root subtrees."""
        total = sum(len(t.pack_tokens) for t in tries)
        n = max(1, math.ceil(total / self.pack_budget))
        # Below about 160 pack tokens a pass is bound by reading the weights, not by
        # compute: one chunk on one stream beats two (measured: 50 tokens, 162 vs 240 ms).
        if self.device == "cpu" and self.n_streams > 1 and total >= SPLIT_TOKENS:
            # a whole number of chunks per stream: the streams finish together
            n = math.ceil(n / self.n_streams) * self.n_streams
        target = math.ceil(total / n)
        parts: list[tuple[int, list[int], int]] = []  # (field, nodes, size)
        for fi, t in enumerate(tries):
            for nodes in _split_trie(t, target):
                parts.append((fi, nodes, len(t.stem) + len(nodes) - 1))
        n = min(n, len(parts))
        bins: list[list[int]] = [[] for _ in range(n)]
        load = [0] * n
        for i in sorted(range(len(parts)), key=lambda i: -parts[i][2]):
            j = int(np.argmin(load))
            bins[j].append(i)
            load[j] += parts[i][2]
        return [_pack(tries, [parts[i][:2] for i in sorted(b)]) for b in bins if b]

    # --- prefix cache -------------------------------------------------------------------

    def _prefix_get(self, head: list[int]) -> list[tuple[Any, Any]] | None:
        key = tuple(head)
        kv = self._prefix.get(key)
        if kv is not None:
            self._prefix.move_to_end(key)
        return kv

    def _prefix_put(self, head: list[int], kv: list[tuple[Any, Any]]) -> None:
        # Materialise compact copies: a lazy slice would keep the whole prompt's K/V alive
        # and could only be evaluated on the storing thread's stream.
        kv = [(mx.contiguous(k), mx.contiguous(v)) for k, v in kv]
        mx.eval([x for pair in kv for x in pair])
        self._prefix[tuple(head)] = kv
        self._prefix.move_to_end(tuple(head))

        def nbytes() -> int:
            return sum(k.nbytes + v.nbytes for kvs in self._prefix.values() for k, v in kvs)

        while len(self._prefix) > 1 and (
            len(self._prefix) > self._prefix_size or nbytes() > self._prefix_bytes
        ):
            self._prefix.popitem(last=False)

    def clear_cache(self) -> None:
        """Drops cached schema prefixes and plans."""
        with self.lock:
            self._prefix.clear()
            self._plans.clear()

    # --- model calls ----------------------------------------------------------------------

    def _run(self, tokens: Any, caches: list[_PassCache]) -> Any:
        """Hidden states (split models) or logits (others) for `tokens` (B, L)."""
        if self._inner is not None:
            return self._inner(tokens, cache=caches)
        return self.model(tokens, cache=caches)

    def _logits_at(self, out: Any, rows: Any, cols: Any) -> Any:
        """Logits at (row, col) pairs of a pass's output, in float32."""
        picked = out[rows, cols]
        if self._inner is not None:
            picked = self._head(picked)
        return picked.astype(mx.float32)

    def _prefill(
        self, tokens: list[list[int]], prefix: list[tuple[Any, Any]] | None
    ) -> list[tuple[Any, Any]]:
        """Runs the prefill of right-padded rows after an optional shared prefix; returns
        each layer's K/V, evaluated."""
        width = max(len(r) for r in tokens)
        arr = np.zeros((len(tokens), width), dtype=np.int32)
        for i, r in enumerate(tokens):
            arr[i, : len(r)] = r
        b = len(tokens)
        mask = "causal" if width > 1 else None
        caches = []
        for li in range(len(self._layers())):
            if prefix is None:
                caches.append(_PassCache(None, None, 0, mask))
            else:
                k, v = prefix[li]
                offset = int(k.shape[2])
                if b > 1 and k.shape[0] == 1:
                    k = mx.broadcast_to(k, (b, *k.shape[1:]))
                    v = mx.broadcast_to(v, (b, *v.shape[1:]))
                caches.append(_PassCache(k, v, offset, mask))
        self._run(mx.array(arr), caches)
        kv = [(c.keys, c.values) for c in caches]
        mx.eval([x for pair in kv for x in pair])
        return kv

    def _layers(self) -> list[Any]:
        inner: Any = (
            self._inner if self._inner is not None else getattr(self.model, "model", self.model)
        )
        return list(inner.layers)

    # --- public ---------------------------------------------------------------------------

    def check_length(self, plan: Plan, ctx_ids: list[int], index: int | None = None) -> int:
        """Prompt length; raises `ContextTooLongError` if the passes would overflow."""
        n = len(plan.head_ids) + len(ctx_ids) + len(plan.tail_ids)
        need = n + plan.extra_tokens
        if need > self.context_window:
            where = f" (context #{index})" if index is not None else ""
            raise ContextTooLongError(
                need,
                self.context_window,
                detail=f"Prompt {n} tokens{where}: schema part {len(plan.head_ids)}, context "
                f"{len(ctx_ids)}, answer start {len(plan.tail_ids)}; field passes need "
                f"{plan.extra_tokens} more.",
            )
        return n

    def score(
        self,
        schema: Schema,
        contexts: Sequence[str],
        *,
        mode: PassMode | None = None,
        choice_order: dict[str, Sequence[int]] | None = None,
        use_prefix_cache: bool = True,
    ) -> ScoredBatch:
        """Scores every field of `schema` for each context.

        Args:
            schema: Compiled schema.
            contexts: One or more context strings.
            mode: Fields pass layout; default packed where supported, else batched.
            choice_order: Per-field listing order of allowed values in the prompt.
            use_prefix_cache: Reuse (and fill) the schema-prefix KV cache.
        """
        mode = mode or self.default_mode
        if mode == "packed" and not self.packable:
            raise InvalidArgumentError(
                f"mode='packed' is not available for model type {self.model_type!r}; "
                f"accepted: 'batched' or 'sequential' (packing is verified for {sorted(PACKABLE)})."
            )
        if mode not in ("packed", "batched", "sequential"):
            raise InvalidArgumentError(
                f"unknown mode {mode!r}; accepted: 'packed', 'batched', 'sequential'"
            )
        plan = self.plan(schema, choice_order)
        ctx_ids = [self.encode_ids(c) for c in contexts]
        lengths = [
            self.check_length(plan, c, i if len(contexts) > 1 else None)
            for i, c in enumerate(ctx_ids)
        ]
        with self.lock:
            return self._score_locked(plan, ctx_ids, lengths, mode, use_prefix_cache)

    def _score_locked(
        self,
        plan: Plan,
        ctx_ids: list[list[int]],
        lengths: list[int],
        mode: PassMode,
        use_cache: bool,
    ) -> ScoredBatch:
        t0 = time.perf_counter()
        passes = 0
        head = plan.head_ids
        prefix = self._prefix_get(head) if use_cache else None
        hit = prefix is not None
        self.stats["prefix_hits" if hit else "prefix_misses"] += 1
        rows = [c + plan.tail_ids for c in ctx_ids]
        valid = [len(head) + len(r) for r in rows]
        edge: list[list[np.ndarray]] = [[] for _ in rows]
        set_blas_threads(_ALL_THREADS)
        if prefix is None and len(rows) == 1:
            kv = self._parallel([lambda: self._prefill([head + rows[0]], None)])[0]
            passes += 1
            if use_cache:
                self._prefix_put(
                    head, [(k[:, :, : len(head)], v[:, :, : len(head)]) for k, v in kv]
                )
            kvs = [kv]
        else:
            if prefix is None:
                prefix = self._parallel([lambda: self._prefill([head], None)])[0]
                passes += 1
                if use_cache:
                    self._prefix_put(head, prefix)
            groups = (
                self._row_groups(rows, sum(len(c.tokens) for c in plan.chunks))
                if mode == "packed"
                else [list(range(len(rows)))]
            )
            if len(groups) > 1:
                # Several row groups: each job prefills its rows and runs their fields
                # passes; the stream workers take jobs as they free up.
                t1 = time.perf_counter()
                done = self._parallel(
                    [
                        lambda g=g: self._group_job(  # type: ignore[misc]
                            plan, [rows[i] for i in g], [valid[i] for i in g], prefix
                        )
                        for g in groups
                    ]
                )
                pre_s = sum(d[1] for d in done)
                all_s = pre_s + sum(d[2] for d in done)
                for g, (fields, _, _) in zip(groups, done):
                    for r, f in zip(g, fields):
                        edge[r] = f
                t2 = time.perf_counter()
                # prefill and fields passes overlap: split the wall time by compute time
                share = pre_s / all_s if all_s > 0 else 0.5
                return ScoredBatch(
                    edge_logp=edge,
                    prompt_tokens=lengths,
                    prefill_ms=(t1 - t0) * 1e3 + (t2 - t1) * 1e3 * share,
                    suffix_eval_ms=(t2 - t1) * 1e3 * (1 - share),
                    sequential_forward_passes=passes
                    + math.ceil(len(groups) / self.n_streams) * (1 + len(plan.chunks)),
                    prefix_cache_hit=hit,
                )
            kvs = self._parallel([lambda: self._prefill(rows, prefix)])
            passes += 1
        t1 = time.perf_counter()
        if mode == "packed":
            # One row group: its chunks are spread over the stream workers.
            n_jobs = min(self.n_streams, len(plan.chunks))
            jobs = [plan.chunks[j::n_jobs] for j in range(n_jobs)]
            done = self._parallel(
                [
                    lambda chunks=chunks: self._packed_eval(plan, kvs[0], valid, chunks)  # type: ignore[misc]
                    for chunks in jobs
                ]
            )
            outs = [o for d in done for o in d]
            edge = self._packed_result(plan, outs, len(rows))
            n = max(len(chunks) for chunks in jobs)
        else:
            kv = kvs[0]
            run = self._batched if mode == "batched" else self._sequential
            with self.kernels():
                edge, n = run(plan, kv, valid)
        passes += n
        t2 = time.perf_counter()
        return ScoredBatch(
            edge_logp=edge,
            prompt_tokens=lengths,
            prefill_ms=(t1 - t0) * 1e3,
            suffix_eval_ms=(t2 - t1) * 1e3,
            sequential_forward_passes=passes,
            prefix_cache_hit=hit,
        )

    # --- the three layouts ----------------------------------------------------------------

    def _row_groups(self, rows: list[list[int]], pack_tokens: int = 0) -> list[list[int]]:
        """Splits context rows into jobs of similar length (little padding).

        A job holds rows while its padded prefill tokens plus the rows' fields-pass tokens
        stay within `batch_tokens`, and there is at least one job per CPU stream. Longest
        first, so the stream workers, which take jobs as they free up, finish together.
        """
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        groups: list[list[int]] = []
        for i in order:
            g = groups[-1] if groups else None
            cost = (len(g) + 1) * (len(rows[g[0]]) + pack_tokens) if g else 0
            if g is not None and cost <= self.batch_tokens:
                g.append(i)
            else:
                groups.append([i])
        want = min(len(rows), self.n_streams)
        while len(groups) < want:  # split the biggest group until every stream has work
            j = max(range(len(groups)), key=lambda j: len(groups[j]))
            g = groups.pop(j)
            groups[j:j] = [g[: len(g) // 2], g[len(g) // 2 :]]
        return [sorted(g) for g in groups]

    def _group_job(
        self,
        plan: Plan,
        rows: list[list[int]],
        valid: list[int],
        prefix: list[tuple[Any, Any]] | None,
    ) -> tuple[list[list[np.ndarray]], float, float]:
        """Prefills `rows` after the prefix and runs all their fields passes; returns the
        per-row edge scores and the seconds spent on each phase."""
        t0 = time.perf_counter()
        kv = self._prefill(rows, prefix)
        t1 = time.perf_counter()
        outs = self._packed_eval(plan, kv, valid, plan.chunks)
        fields = self._packed_result(plan, outs, len(rows))
        return fields, t1 - t0, time.perf_counter() - t1

    def _packed_eval(
        self, plan: Plan, kv: list[tuple[Any, Any]], valid: list[int], chunks: list[_Chunk]
    ) -> list[_Edges]:
        """Runs the packed passes of `chunks` one after another on the current stream;
        returns the edge log-probabilities each chunk scored. A chunk's full-vocabulary
        logits (B, slots, V) are reduced as soon as it is evaluated, so at most one
        chunk's logits per stream are alive (tariff: 6 x 48 MB otherwise)."""
        b = len(valid)
        width = kv[0][0].shape[2]
        prefix_ok = np.arange(width)[None, :] < np.array(valid)[:, None]  # (B, K)
        outs: list[_Edges] = []
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
            caches = [_PassCache(k, v, pos_a, mask_a, keep=False) for k, v in kv]
            toks = mx.array(np.broadcast_to(ch.tokens, (b, t)).astype(np.int32))
            out = self._run(toks, caches)
            logits = self._logits_at(out, slice(None), mx.array(ch.slots))
            mx.eval(logits)
            outs.append(self._chunk_edges(plan, ch, np.asarray(logits)))  # zero-copy view
            del out, logits, caches
        return outs

    @staticmethod
    def _chunk_edges(plan: Plan, ch: _Chunk, logits: np.ndarray) -> _Edges:
        """(field, edge indices, (B, edges) log p) for every trie edge scored by `ch`,
        from its slot logits (B, slots, V)."""
        lse = _logsumexp(logits)  # (B, slots)
        found = []
        for fi, nodes, rows in zip(ch.fields, ch.part_nodes, ch.node_rows):
            trie = plan.tries[fi]
            row_of = np.full(trie.n_nodes, -1)
            row_of[nodes] = rows
            sel = np.nonzero(row_of[trie.edge_node] >= 0)[0]
            r = row_of[trie.edge_node[sel]]
            found.append((fi, sel, logits[:, r, trie.edge_token[sel]] - lse[:, r]))
        return found

    def _packed_result(self, plan: Plan, outs: list[_Edges], b: int) -> list[list[np.ndarray]]:
        """Per row, per field edge log-probabilities from the chunks' scored edges."""
        acc = [np.full((b, len(t.edge_node)), np.nan) for t in plan.tries]
        for found in outs:
            for fi, sel, logp in found:
                acc[fi][:, sel] = logp
        if any(np.isnan(a).any() for a in acc):  # pragma: no cover - a packing bug
            raise RuntimeError("internal error: a trie edge was not evaluated")
        return [[acc[fi][r] for fi in range(len(plan.tries))] for r in range(b)]

    def _rows(self, plan: Plan) -> list[tuple[int, list[int], list[tuple[int, int]]]]:
        """Batched rows: (field, tokens, [(node, position in row)])."""
        rows = []
        for fi, trie in enumerate(plan.tries):
            s = len(trie.stem)
            for path in trie.paths():
                toks = list(trie.stem) + [trie.node_tokens[n] for n in path]
                nodes = [(0, s - 1)] + [(n, s - 1 + trie.node_depth[n]) for n in path]
                rows.append((fi, toks, nodes))
        return rows

    def _batched(
        self, plan: Plan, kv: list[tuple[Any, Any]], valid: list[int]
    ) -> tuple[list[list[np.ndarray]], int]:
        rows = self._rows(plan)
        result: list[list[np.ndarray]] = []
        passes = 0
        for r, n_valid in enumerate(valid):
            pre = [(k[r : r + 1, :, :n_valid], v[r : r + 1, :, :n_valid]) for k, v in kv]
            node_logits: dict[tuple[int, int], Any] = {}
            budget = max(1, self.pack_budget * 4 // max(len(t) for _, t, _ in rows))
            for start in range(0, len(rows), budget):
                group = rows[start : start + budget]
                width = max(len(t) for _, t, _ in group)
                arr = np.zeros((len(group), width), dtype=np.int32)
                for i, (_, t, _) in enumerate(group):
                    arr[i, : len(t)] = t
                g = len(group)
                caches = [
                    _PassCache(
                        mx.broadcast_to(k, (g, *k.shape[1:])),
                        mx.broadcast_to(v, (g, *v.shape[1:])),
                        n_valid,
                        "causal" if width > 1 else None,
                    )
                    for k, v in pre
                ]
                out = self._run(mx.array(arr), caches)
                ri, ci, keys = [], [], []
                seen = set(node_logits)
                for i, (fi, _, nodes) in enumerate(group):
                    for node, p in nodes:
                        if (fi, node) not in seen:
                            seen.add((fi, node))
                            ri.append(i)
                            ci.append(p)
                            keys.append((fi, node))
                logits = self._logits_at(out, mx.array(ri), mx.array(ci))
                mx.eval(logits)
                passes += 1
                for j, key in enumerate(keys):
                    node_logits[key] = logits[j]
            result.append(_fields_from_nodes(plan, node_logits))
        return result, passes

    def _sequential(
        self, plan: Plan, kv: list[tuple[Any, Any]], valid: list[int]
    ) -> tuple[list[list[np.ndarray]], int]:
        from mlx_lm.models.cache import KVCache, trim_prompt_cache

        rows = self._rows(plan)
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


def _split_trie(trie: FieldTrie, target: int) -> list[list[int]]:
    """The trie's nodes in parts of about `target` pack tokens, by root subtrees.

    Every part holds the root (node 0) and whole subtrees of the root's children, so it
    is closed under ancestors.
    """
    size = len(trie.stem) + trie.n_nodes - 1
    if size <= target or trie.n_nodes <= 2:
        return [list(range(trie.n_nodes))]
    top = [0] * trie.n_nodes  # each node's ancestor among the root's children
    for n in range(1, trie.n_nodes):
        p = trie.node_parent[n]
        top[n] = n if p == 0 else top[p]
    subtrees: dict[int, list[int]] = {}
    for n in range(1, trie.n_nodes):
        subtrees.setdefault(top[n], []).append(n)
    k = min(len(subtrees), math.ceil(size / target))
    if k <= 1:
        return [list(range(trie.n_nodes))]
    groups: list[list[int]] = [[] for _ in range(k)]
    load = [0] * k
    for nodes in sorted(subtrees.values(), key=len, reverse=True):
        j = int(np.argmin(load))
        groups[j].extend(nodes)
        load[j] += len(nodes)
    return [[0, *sorted(g)] for g in groups if g]


def _pack(tries: list[FieldTrie], parts: list[tuple[int, list[int]]]) -> _Chunk:
    """Packs field parts into one sequence: a prefix tree over every evaluated path.

    Every path the parts need (a stem, or a stem plus trie nodes) is inserted into one
    token prefix tree, so tokens shared by several fields (`\\n `, ` "`...) are evaluated
    once. Each tree node is one slot; it sits at position `P + depth` and attends to the
    prompt, its tree ancestors and itself, exactly as in its own full prompt.
    """
    slot_of: dict[tuple[int, ...], int] = {}
    tokens: list[int] = []
    depth: list[int] = []
    parent: list[int] = []

    def slot(path: tuple[int, ...]) -> int:
        hit = slot_of.get(path)
        if hit is not None:
            return hit
        up = slot(path[:-1]) if len(path) > 1 else -1
        slot_of[path] = len(tokens)
        tokens.append(path[-1])
        depth.append(len(path) - 1)
        parent.append(up)
        return slot_of[path]

    node_index = []
    for fi, nodes in parts:
        trie = tries[fi]
        paths: dict[int, tuple[int, ...]] = {0: trie.stem}
        for n in nodes:  # ancestors come first: node ids grow with depth-first insertion
            if n:
                paths[n] = paths[trie.node_parent[n]] + (trie.node_tokens[n],)
        node_index.append(np.array([slot(paths[n]) for n in nodes]))
    t = len(tokens)
    allow = np.zeros((t, t), dtype=bool)
    for i in range(t):
        j = i
        while j >= 0:
            allow[i, j] = True
            j = parent[j]
    return _Chunk(
        [fi for fi, _ in parts],
        [np.array(nodes) for _, nodes in parts],
        np.array(tokens, dtype=np.int32),
        np.array(depth, dtype=np.int32),
        allow,
        node_index,
    )


def _logsumexp(logits: np.ndarray, block_bytes: int = 4 << 20) -> np.ndarray:
    """Log-sum-exp over the last axis, returned in float64 (numpy's exp is vectorised,
    MLX's CPU exp is not). Works through about `block_bytes` of rows at a time, so the
    temporaries stay small next to the (B, slots, V) logits (33 MB per triage chunk)."""
    lg = logits.astype(np.float32, copy=False)
    flat = lg.reshape(-1, lg.shape[-1])
    out = np.empty(flat.shape[0], dtype=np.float64)
    step = max(1, block_bytes // max(1, flat.shape[1] * 4))
    for i in range(0, flat.shape[0], step):
        rows = flat[i : i + step]
        m = rows.max(axis=-1, keepdims=True)
        tmp = rows - m
        np.exp(tmp, out=tmp)
        out[i : i + step] = np.log(tmp.sum(axis=-1)) + m[:, 0]
    return out.reshape(lg.shape[:-1])


def _fields_from_nodes(plan: Plan, node_logits: dict[tuple[int, int], Any]) -> list[np.ndarray]:
    """Per field edge log-probabilities from each (field, trie node)'s logits."""
    out = []
    for fi, trie in enumerate(plan.tries):
        stacked = mx.stack([node_logits[(fi, n)] for n in range(trie.n_nodes)])[None]
        out.append(_edge_logp(np.asarray(stacked), trie)[0])
    return out


def _edge_logp(logits: np.ndarray, trie: FieldTrie) -> np.ndarray:
    """(rows, nodes, V) logits -> (rows, edges) full-vocabulary log p, in numpy.

    numpy's vectorised exp is several times faster than MLX's CPU exp for this reduction.
    """
    lse = _logsumexp(logits)
    return logits[:, trie.edge_node, trie.edge_token].astype(np.float64) - lse[:, trie.edge_node]


def _order_key(order: dict[str, Sequence[int]] | None) -> Any:
    if not order:
        return None
    return tuple(sorted((k, tuple(v)) for k, v in order.items()))
