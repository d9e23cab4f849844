"""`Engine`: the PCD algorithm on one loaded model. Prefill once, then score every field's
candidates in one shared pass (DESIGN §2).

The engine coordinates the pieces: the cached `Plan` of a schema (`pack`), the
schema-prefix KV cache (`prefix_cache`), the model passes (`passes`) and the CPU stream
workers that run independent parts at once (`workers`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ContextTooLongError, InvalidArgumentError
from ..prompt import Question
from ..schema import Schema
from .decode.native_steps import check_decode, decoder_for
from .host.blas import import_mlx, set_blas_threads
from .host.threads import thread_budget
from .kernels import cpu_ops as _kernels
from .passes.forward import (
    PACKABLE,
    FollowUp,
    LayerKV,
    Passes,
    PassMode,
    ScoredBatch,
    packed_result,
)
from .passes.kv_parts import kv_head
from .passes.pack import Plan, build_plan, plan_key, question_plan
from .passes.prefix_cache import PrefixCache
from .passes.prune import Pruning, first_chunks, pruned_pass
from .passes.trie import FieldTrie
from .passes.waves import run_waves
from .passes.workers import ThreadFit, row_groups, run_on_workers

if TYPE_CHECKING:
    import mlx.nn as nn

mx = import_mlx()

__all__ = ["Engine", "FollowUp", "PassMode", "ScoredBatch"]

_PLANS_KEPT = 64


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
        streams: CPU streams to spread chunks over (default 2, or 1 where this process
            has a thread budget of one: `threads.thread_budget`).
        prefix_cache_size: Schema prefixes kept (LRU).
        prefix_cache_bytes: Byte budget for cached prefix K/V.
        stream_blas_threads: BLAS threads while several CPU streams run at once.
        batch_tokens: Padded context tokens per row group when several contexts are
            scored together (CPU); groups run concurrently on the stream workers.
        cpu_kernels: Run attention softmax and SiLU in numpy (`cpu_kernels` module) on
            CPU; default on for CPU engines unless `PCD_CPU_KERNELS=0`.
        decode: How generated tokens are decoded: `"auto"` (native int8 steps,
            `fast_decode`, on CPU engines of llama / qwen2 models with a C compiler; MLX
            otherwise), `"int8"` (native, else `DecodeUnavailableError`) or `"mlx"` (MLX
            float32 steps). Default: `$PCD_DECODE`, else `"auto"`.
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
        streams: int | None = None,
        prefix_cache_size: int = 16,
        prefix_cache_bytes: int = 1 << 30,
        stream_blas_threads: int = 1,
        cpu_kernels: bool | None = None,
        batch_tokens: int = 1024,
        decode: str | None = None,
    ):
        for name, value, default in (
            ("pack_budget", pack_budget, 256),
            ("batch_tokens", batch_tokens, 1024),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(
                    f"{name}={value!r}: accepted: a whole number of tokens, at least 1 "
                    f"(default {default})."
                )
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
        self.prefix_cache = PrefixCache(prefix_cache_size, prefix_cache_bytes)
        self.passes = Passes(model, model_type)
        self.packable = self.passes.packable
        if streams is None:  # two halves of a pass, if this process may use two CPUs
            streams = min(2, thread_budget())
        self.n_streams = max(1, streams) if device == "cpu" else 1
        self._local = threading.local()
        self.default_mode: PassMode = "packed" if self.packable else "batched"
        self.stats = {"prefix_hits": 0, "prefix_misses": 0, "fewer_threads": 0}
        # This request's threads and streams (`fit_threads`): the thread budget
        # (`host.threads`), fewer while other processes hold CPUs.
        self.threads = thread_budget()
        self.streams_now = self.n_streams
        self._fit = ThreadFit()
        if cpu_kernels is None:
            cpu_kernels = device == "cpu" and os.environ.get("PCD_CPU_KERNELS", "1") != "0"
        self.cpu_kernels = bool(cpu_kernels) and device == "cpu" and _kernels.install(model)
        # A fields pass's attention reads the cached prefix K/V in place, not a copy of it
        # joined to the pass's own (on the tariff prompt 235 MB copied per pass, 100 ms of a
        # 2.3 s request on the embedded model).
        self.passes.prefix_apart = self.cpu_kernels and _kernels.takes_prefix_apart(model)
        # Over file-encoded matrices every attention and SwiGLU call takes the kernels,
        # whatever its size, so that a row's scores do not depend on the call it is in
        # (in int8 / bf16 a float32 rounding difference becomes a whole activation step).
        self.every_size = self.cpu_kernels and any(
            getattr(m, "gguf_encoded", False) for _, m in model.named_modules()
        )
        # Where those matrices compute in int8 or bf16, attention's scores take bf16
        # products of Q and K on the AMX tiles, if this CPU has them: the attention kernel
        # 1.6-1.7x faster at 2k-4k tokens (Xeon), far finer than int8's rounding after it.
        self.bf16_scores = (
            self.every_size
            and _kernels.bf16_scores_run()
            and any(
                getattr(getattr(m, "weight", None), "compute", "float32") != "float32"
                for _, m in model.named_modules()
                if getattr(m, "gguf_encoded", False)
            )
        )
        self.decode = check_decode(decode)
        if self.decode == "int8":
            decoder_for(self)  # build now: say at load time when it cannot run

    # --- threads and streams --------------------------------------------------------------

    def kernels(self) -> Any:
        """Context manager: this engine's kernel choice for model calls on this thread."""
        return _kernels.active(
            self.cpu_kernels,
            threads=self.threads,
            every_size=self.every_size,
            bf16_scores=self.bf16_scores,
        )

    def fit_threads(self) -> int:
        """Sizes BLAS threads and CPU streams for the request about to run (call it under
        `lock`): the thread budget (`threads.thread_budget`) on a quiet machine; beside
        busy neighbours, the budget or the CPUs they leave of it, whichever ran faster
        lately (`workers.ThreadFit`; `PCD_THREADS` fixes the count). Counts the requests that ran on fewer in
        `stats["fewer_threads"]`. Returns the thread count.
        """
        if self.device != "cpu":
            return self.threads
        n = self._fit.pick()
        self.threads, self.streams_now = n, min(self.n_streams, n)
        if n < self._fit.budget:
            self.stats["fewer_threads"] += 1
        set_blas_threads(n)
        return n

    def _record_fit(self, plan: Plan, rows: list[list[int]], hit: bool, seconds: float) -> None:
        """Tells `ThreadFit` how fast this request ran: seconds over the tokens it put
        through the model (the rows, the schema part on a miss, every row's fields pass)."""
        pack = sum(len(c.tokens) for c in plan.chunks)
        tokens = sum(len(r) + pack for r in rows) + (0 if hit else len(plan.head_ids))
        self._fit.record(self.threads, seconds, tokens)

    @contextmanager
    def request(self) -> Iterator[None]:
        """Context manager for a request's model calls on this thread (hold `lock`):
        `fit_threads`, then `kernels`."""
        self.fit_threads()
        with self.kernels():
            yield

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

    def _parallel(self, jobs: list[Callable[[], Any]]) -> list[Any]:
        """Runs jobs at once, each on a stream worker thread with its own CPU stream (MLX
        evaluation and numpy release the GIL). A single job runs on this thread."""
        if len(jobs) == 1 or self.streams_now == 1:  # one stream: the jobs in turn
            with mx.stream(self.stream), self.kernels():
                return [job() for job in jobs]
        return run_on_workers(
            jobs,
            self.n_streams,
            kernels=self.cpu_kernels,
            blas_threads=self.stream_blas_threads,
            after=self.threads,
            every_size=self.every_size,
            bf16_scores=self.bf16_scores,
        )

    # --- plans and the prefix cache -------------------------------------------------------

    def encode_ids(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS)."""
        return list(self.tokenizer.encode(text))

    def plan(self, schema: Schema, choice_order: dict[str, Sequence[int]] | None = None) -> Plan:
        """The cached token plan of a schema (prompt pieces, tries, pack chunks)."""
        key = plan_key(schema, choice_order)
        with self.lock:
            hit = self._plans.get(key)
            if hit is not None:
                self._plans.move_to_end(key)
                return hit
        plan = build_plan(
            self.tokenizer,
            schema,
            choice_order,
            bos_token_id=self.bos_token_id if self.add_bos else None,
            pack_budget=self.pack_budget,
            streams=self.n_streams if self.device == "cpu" else 1,
        )
        with self.lock:
            self._plans[key] = plan
            while len(self._plans) > _PLANS_KEPT:
                self._plans.popitem(last=False)
        return plan

    def clear_cache(self) -> None:
        """Drops cached schema prefixes and plans."""
        with self.lock:
            self.prefix_cache.clear()
            self._plans.clear()

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

    # --- scoring --------------------------------------------------------------------------

    def score(
        self,
        schema: Schema,
        contexts: Sequence[str],
        *,
        mode: PassMode | None = None,
        choice_order: dict[str, Sequence[int]] | None = None,
        use_prefix_cache: bool = True,
        follow_up: FollowUp | None = None,
        pruning: Pruning | None = None,
    ) -> ScoredBatch:
        """Scores every field of `schema` for each context.

        Args:
            schema: Compiled schema.
            contexts: One or more context strings.
            mode: Fields pass layout; default packed where supported, else batched.
            choice_order: Per-field listing order of allowed values in the prompt.
            use_prefix_cache: Reuse (and fill) the schema-prefix KV cache.
            follow_up: For schemas with dependent fields: asked after each pass for every
                context's next questions; each later wave is one more pass on the same
                KV cache, one per group of contexts that ask the same questions.
            pruning: Which questions to score by certified pruned search (`prune`), in
                the packed pass; None scores every question whole.
        """
        if schema.hybrid:
            raise InvalidArgumentError(
                f"{schema.name} has generated fields, which are decoded, not scored; accepted "
                "here: a schema of scored fields only. Decide it with Decider.decide or "
                "decide_many (pcd_tools.engine.hybrid.run_hybrid)."
            )
        mode = self.check_mode(mode)
        plan = self.plan(schema, choice_order)
        ctx_ids = [self.encode_ids(c) for c in contexts]
        lengths = [
            self.check_length(plan, c, i if len(contexts) > 1 else None)
            for i, c in enumerate(ctx_ids)
        ]
        with self.lock, _kernels.metering() as meter:
            batch = self._score_locked(
                plan, ctx_ids, lengths, mode, use_prefix_cache, follow_up, pruning
            )
        return replace(batch, attention_ms=meter.ms)

    def check_mode(self, mode: PassMode | None) -> PassMode:
        """The pass layout to use: `mode`, or the fastest exact one.

        Raises:
            InvalidArgumentError: for an unknown mode, or `"packed"` on a model type whose
                packing is not verified.
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
        return mode

    def _score_locked(
        self,
        plan: Plan,
        ctx_ids: list[list[int]],
        lengths: list[int],
        mode: PassMode,
        use_cache: bool,
        follow_up: FollowUp | None = None,
        pruning: Pruning | None = None,
    ) -> ScoredBatch:
        t0 = time.perf_counter()
        passes = 0
        first_done: list[Any] | None = None  # the first fields chunk's edges, if it ran
        stem_kv: tuple[LayerKV, int] | None = None  # and the K/V after its stem, if kept
        head = plan.head_ids
        prefix = self.prefix_cache.get(head) if use_cache else None
        hit = prefix is not None
        self.stats["prefix_hits" if hit else "prefix_misses"] += 1
        rows = [c + plan.tail_ids for c in ctx_ids]
        valid = [len(head) + len(r) for r in rows]
        self.fit_threads()
        if prefix is None and len(rows) == 1:
            kv = self._parallel([lambda: self.passes.prefill([head + rows[0]], None)])[0]
            passes += 1
            if use_cache:
                self.prefix_cache.put(head, [kv_head(k, v, len(head)) for k, v in kv])
            kvs = [kv]
        else:
            if prefix is None:
                prefix = self._parallel([lambda: self.passes.prefill([head], None)])[0]
                passes += 1
                if use_cache:
                    self.prefix_cache.put(head, prefix)
            groups = (
                [list(range(len(rows)))]  # waves and levels need every row's KV
                if follow_up is not None or self._pruned(plan, mode, pruning)
                else row_groups(
                    rows,
                    sum(len(c.tokens) for c in plan.chunks),
                    batch_tokens=self.batch_tokens,
                    n_streams=self.streams_now,
                )
                if mode == "packed"
                else [list(range(len(rows)))]
            )
            if len(groups) > 1:
                return self._score_groups(
                    plan, rows, valid, prefix, groups, lengths, t0, passes, hit
                )
            first = self._first_chunks(plan, mode, pruning)
            if first is not None and len(first) == 1:
                # the fields pass's first chunk runs in the prefill's call, after the rows
                stem = self._stem_to_keep(plan, mode, pruning, len(rows))
                found, kv, kv_stem = self._parallel(
                    [lambda: self.passes.prefill_and_pack(plan, prefix, rows, first[0], stem)]
                )[0]
                kvs, first_done = [kv], [found]
                if kv_stem is not None:
                    stem_kv = (kv_stem, stem)
            else:
                kvs = self._parallel([lambda: self.passes.prefill(rows, prefix)])
            passes += 1
        t1 = time.perf_counter()
        edge, n = self._fields_pass(plan, kvs[0], valid, mode, pruning, first_done, stem_kv)
        passes += n
        asked: list[list[Question]] = []
        tries: list[list[FieldTrie]] = []
        if follow_up is not None:
            asked = [list(plan.questions) for _ in rows]
            tries = [list(plan.tries) for _ in rows]
            passes += self._waves(
                plan, kvs[0], valid, lengths, mode, follow_up, edge, asked, tries, pruning
            )
        t2 = time.perf_counter()
        self._record_fit(plan, rows, hit, t2 - t0)
        return ScoredBatch(
            edge_logp=edge,
            prompt_tokens=lengths,
            prefill_ms=(t1 - t0) * 1e3,
            suffix_eval_ms=(t2 - t1) * 1e3,
            sequential_forward_passes=passes,
            prefix_cache_hit=hit,
            questions=asked,
            tries=tries,
        )

    def _pruned(self, plan: Plan, mode: PassMode, pruning: Pruning | None) -> list[int]:
        """The questions of `plan` to score by pruned search (packed passes only)."""
        if pruning is None or mode != "packed":
            return []
        return [
            i for i, (q, t) in enumerate(zip(plan.questions, plan.tries)) if pruning.select(q, t)
        ]

    def _first_chunks(
        self, plan: Plan, mode: PassMode, pruning: Pruning | None
    ) -> list[Any] | None:
        """The chunks of a packed fields pass's first model call (a pruned pass's first
        level, else the whole pass); None for the other modes."""
        if mode != "packed":
            return None
        pruned = self._pruned(plan, mode, pruning)
        if pruned and pruning is not None:
            streams = self.streams_now if self.device == "cpu" else 1
            return first_chunks(
                plan, pruned, pack_budget=self.pack_budget, streams=streams, pruning=pruning
            )
        return plan.chunks

    def _stem_to_keep(self, plan: Plan, mode: PassMode, pruning: Pruning | None, rows: int) -> int:
        """How many stem tokens the prefill's call keeps for a pruned field's levels: a
        single-field plan's whole stem with one context row (each level then reads it
        instead of running it again: 8 of tariff's 46 level tokens), else 0."""
        if rows != 1 or len(plan.tries) != 1 or self._pruned(plan, mode, pruning) != [0]:
            return 0
        return len(plan.tries[0].stem)

    def _fields_pass(
        self,
        plan: Plan,
        kv: LayerKV,
        valid: list[int],
        mode: PassMode,
        pruning: Pruning | None = None,
        first_done: list[Any] | None = None,
        stem_kv: tuple[LayerKV, int] | None = None,
    ) -> tuple[list[list[np.ndarray]], int]:
        """One fields pass over every row of `kv`: per row, per question edge log p; and
        the model calls that ran one after another. `first_done`: the edges of its first
        chunks where they ran with the prefill (`Passes.prefill_and_pack`); `stem_kv`:
        the K/V after the one field's stem and its length, which the pruned levels then
        run after (`Engine._stem_to_keep`)."""
        if stem_kv is not None:
            kv, valid = stem_kv[0], [v + stem_kv[1] for v in valid]
        if mode == "packed":
            # One row group: its chunks are spread over the stream workers.
            def run(chunks: list[Any]) -> tuple[list[Any], int]:
                n_jobs = min(self.streams_now, len(chunks))
                jobs = [chunks[j::n_jobs] for j in range(n_jobs)]
                done = self._parallel(
                    [
                        lambda part=part: self.passes.packed(plan, kv, valid, part)  # type: ignore[misc]
                        for part in jobs
                    ]
                )
                return [o for d in done for o in d], max(len(part) for part in jobs)

            pruned = self._pruned(plan, mode, pruning)
            if pruned and pruning is not None:
                streams = self.streams_now if self.device == "cpu" else 1
                return pruned_pass(
                    plan,
                    pruned,
                    len(valid),
                    run,
                    pack_budget=self.pack_budget,
                    streams=streams,
                    pruning=pruning,
                    first_done=first_done,
                    stem_cached=stem_kv is not None,
                )
            if first_done is not None:
                return packed_result(plan, first_done, len(valid)), 0
            outs, n = run(plan.chunks)
            return packed_result(plan, outs, len(valid)), n
        with self.kernels():
            if mode == "batched":
                return self.passes.batched(plan, kv, valid, self.pack_budget)
            return self.passes.sequential(plan, kv, valid)

    def _waves(self, plan: Plan, kv: LayerKV, *args: Any, **kwargs: Any) -> int:
        """Later waves on the rows' KV (`passes.waves.run_waves`); returns the passes run."""
        return run_waves(
            self.wave_plan, self._fields_pass, self.context_window, plan, kv, *args, **kwargs
        )

    def wave_plan(self, plan: Plan, qs: Sequence[Question]) -> Plan:
        """The cached plan of a later wave's questions after `plan`'s prompt."""
        key = ("wave", plan.schema.fingerprint(), len(plan.head_ids), len(plan.tail_ids), tuple(qs))
        with self.lock:
            hit = self._plans.get(key)
            if hit is not None:
                self._plans.move_to_end(key)
                return hit
        sub = question_plan(
            self.tokenizer,
            plan,
            qs,
            pack_budget=self.pack_budget,
            streams=self.n_streams if self.device == "cpu" else 1,
        )
        with self.lock:
            self._plans[key] = sub
            while len(self._plans) > _PLANS_KEPT:
                self._plans.popitem(last=False)
        return sub

    def _score_groups(
        self,
        plan: Plan,
        rows: list[list[int]],
        valid: list[int],
        prefix: LayerKV,
        groups: list[list[int]],
        lengths: list[int],
        t0: float,
        passes: int,
        hit: bool,
    ) -> ScoredBatch:
        """Several row groups: each job prefills its rows and runs their fields passes;
        the stream workers take jobs as they free up."""
        t1 = time.perf_counter()
        done = self._parallel(
            [
                lambda g=g: self.passes.group_job(  # type: ignore[misc]
                    plan, [rows[i] for i in g], [valid[i] for i in g], prefix
                )
                for g in groups
            ]
        )
        pre_s = sum(d[1] for d in done)
        all_s = pre_s + sum(d[2] for d in done)
        edge: list[list[np.ndarray]] = [[] for _ in rows]
        for g, (fields, _, _) in zip(groups, done):
            for r, f in zip(g, fields):
                edge[r] = f
        t2 = time.perf_counter()
        self._record_fit(plan, rows, hit, t2 - t0)
        # prefill and fields passes overlap: split the wall time by compute time
        share = pre_s / all_s if all_s > 0 else 0.5
        return ScoredBatch(
            edge_logp=edge,
            prompt_tokens=lengths,
            prefill_ms=(t1 - t0) * 1e3 + (t2 - t1) * 1e3 * share,
            suffix_eval_ms=(t2 - t1) * 1e3 * (1 - share),
            sequential_forward_passes=passes
            + math.ceil(len(groups) / self.streams_now) * (1 + len(plan.chunks)),
            prefix_cache_hit=hit,
        )
