"""Native 8-bit decode steps for generated fields on CPU engines (`_decode.c`).

A token through MLX float32 costs ~73 ms on SmolLM2-135M (each step reads ~540 MB of
float32 weights; MLX's CPU path is not built for one-row work). Here steps run natively:

- **Weights**, for dense or MLX-quantized models, are packed once: 8 bits per weight with
  a float32 scale and minimum per block of 32 inputs (w = min + scale * q; 169 MB for the
  135M), each block affine (lossless on a 4-bit grid: GGUF Q4_0 / Q4_1) or llama.cpp's
  symmetric Q8_0 (lossless for Q8_0), whichever fits better: on the embedded GGUF the
  logits equal MLX's to ~3e-5. Q/K/V and gate/up are separate matrices, the SwiGLU phase
  taking row j of gate and of up together. Norms, RoPE and attention are float32.
- **A model kept in its GGUF encoding** (`dtype="quantized"`, or `"auto"` above 1 GiB of
  float32): with `weights="file"` the steps read the file's own blocks in place (Q4_0,
  Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K; `_decode.c`, "The file's blocks"), the embedding
  and a tied head included: no copy, and exactly the file's weights (on the 0.5B the
  logits follow MLX float32 to 2.9e-5; the 8-bit copy's rounding of Q6_K moves them by
  0.18). `weights="copy"` packs the 8-bit copy (1,932 MB for the 1.5B).
- **Activations** (`activations=`): float32, or, where the model computes in int8
  (`compute="int8"`), quantized to 8 bits per block as the int8 passes and llama.cpp do
  (per 256 for K-quants, else per 32) and taken in integer dots with the file's blocks
  (`_decode.c`, "8-bit activations"): logits move as far as llama.cpp's (0.56 on the
  0.5B, 24/24 argmax along MLX's greedy text). A 1.5B step took 49 ms against llama.cpp's
  46, the copy's 79 and float32 activations' 89 (2-core AVX-512 EPYC), so `weights="auto"`
  (or `$PCD_DECODE_WEIGHTS`) reads the blocks with 8-bit activations, else takes the copy
  unless it needs over a quarter of the memory free.
- **KV**: the prefix (prompt, key, everything before the value) is read in place from
  the mlx-lm `KVCache` arrays through numpy views; only the tokens stepped here keep
  their K/V in this module's buffers, for the field's lifetime. They never reach the MLX
  cache: the caller runs them through MLX float32 with what it writes next
  (`generate.decode_rows`), so every scored field sees float32 K/V exactly as before.
- **RoPE** tables come from the model's own rope module (probed once, checked against
  it), so every variant mlx-lm builds (default, linear, llama3, `rope_freqs`) is exact.
- **Batches**: one step takes B sequences, each at its own position over its own KV; the
  weights are read once for all of them (`decide_many` decodes its rows in lockstep). A
  row's logits do not depend on the batch around it.
- **Threads**: a persistent pool of `threads.decode_threads()` threads (the thread budget:
  the affinity mask, less a cgroup quota, or a budget set), spinning briefly then sleeping on a futex. Each
  step uses as many of them as have been fastest lately (`ThreadTuner`: where other
  processes hold the cores, one thread beats two); `PCD_DECODE_THREADS` fixes the count.
  **ISA**: AVX-512, AVX2+FMA or portable C, picked at run time;
  `PCD_DECODE_ISA=avx512|avx2|scalar` forces one.

`decode="auto" | "int8" | "mlx"` (engine option, or `PCD_DECODE`) chooses: "auto" uses
this path on CPU engines of llama / qwen2 models when `_decode.c` builds and loads; else
"auto" decodes through MLX after one `NativeFallbackWarning` and "int8" raises.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ...errors import DecodeUnavailableError, InvalidArgumentError, NativeBuildError
from ..host.blas import import_mlx
from ..host.build import fall_back
from ..host.cgroups import available_memory
from ..host.threads import ThreadTuner, decode_threads
from ..kernels.bindings import DecodeLayer, DecodeLin, DecodeModel, DecodeRow
from ..kernels.cpu_ops import rope_tables
from ..kernels.paths import BITS, decode_isa
from .parts import (
    QB,
    WEIGHTS,
    _copy_bytes,
    _dense,
    _embedding,
    _np,
    check_weights,
    env_choice,
    pick_activations,
    unsupported_reason,
)

mx = import_mlx()

__all__ = [
    "DECODE_MODES",
    "WEIGHTS",
    "NativeDecoder",
    "Stepper",
    "check_decode",
    "check_weights",
    "decoder_for",
    "unsupported_reason",
]

DECODE_MODES = ("auto", "int8", "mlx")
_SCHEMES = ("affine", "symmetric", "auto")
_SPIN = 2000  # pause loops (~50-150 us) before a waiting thread sleeps
_ROPE_MIN = 4096


def check_decode(value: Any, source: str = "decode") -> str:
    """The decode mode: `value`, else `$PCD_DECODE`, else `"auto"`.

    Args:
        value: The engine option (None: not given).
        source: Named in the error message.

    Raises:
        InvalidArgumentError: for a value that is not one of `DECODE_MODES`.
    """
    return env_choice(
        value,
        source,
        ("PCD_DECODE", os.environ.get("PCD_DECODE")),
        DECODE_MODES,
        "a decode mode; accepted: 'auto' (native int8 steps on CPU for llama/qwen2 models "
        "when a C compiler is present, else MLX), 'int8' (native int8 steps, an error where "
        "unavailable) or 'mlx' (MLX float32 steps).",
    )


class NativeDecoder:
    """A model's weights packed for `_decode.c`, its thread pool and its RoPE tables.

    Args:
        model: An mlx-lm llama or qwen2 model (float32 or MLX-quantized weights).
        wbits: 8 (8-bit blocks of 32, the production path) or 32 (float32 weights, the
            same kernel math without the rounding; for tests).
        scheme: How 8-bit blocks are formed (each has a float32 scale and minimum):
            `"affine"` (minimum and range / 255; lossless for weights from a 4-bit grid
            such as GGUF Q4_0 / Q4_1), `"symmetric"` (llama.cpp's Q8_0: scale =
            max|w| / 127; lossless for Q8_0 weights) or `"auto"` (per block, whichever
            reconstructs it more closely).
        threads: Threads in the pool, all used by every step (default: the CPUs this
            process may use, `$PCD_DECODE_THREADS` if set; without either, each step uses
            the count of them that has been fastest lately).
        isa: `"avx512"`, `"avx2"`, `"scalar"` or `"auto"` (default: `$PCD_DECODE_ISA`).
        context_window: Positions the RoPE tables may need to reach.
        weights: For a model kept in its GGUF encoding: `"file"` reads its matrices and
            embedding from the file's own blocks (types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
            Q2_K-Q6_K; no copy), `"copy"` packs an 8-bit copy (1.25 bytes a weight),
            `"auto"` (default: `$PCD_DECODE_WEIGHTS`, else auto) the file's blocks with
            8-bit activations, else the copy unless it would take more than a quarter of
            the memory available now. Dense and MLX-quantized models, and other block
            types, always get the copy.
        activations: What file blocks are multiplied by: `"float32"`, `"int8"` (quantized
            per block, integer dots) or `"auto"` (default: int8 where the model's matrices
            compute in int8).

    Attributes:
        build_ms: Wall time of building (or finding) and loading the library.
        quantize_ms: Wall time of packing the weights.
        nbytes: Bytes of the packed weights (the copies this decoder made).
        mapped_bytes: Bytes of file blocks read in place (the model's own, not copied).
        copies: Matrices packed as copies (8-bit or float32) rather than read in place.
        activations: `"int8"` or `"float32"`: what the file's blocks are multiplied by.
        isa: The code path in use: 512, 256 or 1 (portable C).
        threads: Threads in the pool.

    Raises:
        DecodeUnavailableError: for a model this kernel cannot run, or a path not here.
        NativeBuildError: when the library cannot be built.
    """

    def __init__(
        self,
        model: Any,
        *,
        wbits: int = 8,
        scheme: str = "auto",
        threads: int | None = None,
        isa: str | int | None = None,
        context_window: int = 1 << 17,
        weights: str | None = None,
        activations: str | None = None,
    ):
        from ..kernels.bindings import load_decode_kernels

        reason = unsupported_reason(model, "cpu")
        if reason is not None:
            raise DecodeUnavailableError(f"native decoding is unavailable: {reason}", reason=reason)
        if wbits not in (8, 32):
            raise InvalidArgumentError(f"wbits must be 8 or 32; got {wbits!r}")
        if scheme not in _SCHEMES:
            raise InvalidArgumentError(f"scheme must be one of {list(_SCHEMES)}; got {scheme!r}")
        self.scheme = scheme
        t0 = time.perf_counter()
        self.lib = load_decode_kernels()
        self.path = int(self.lib.pcd_decode_path(decode_isa(isa)))
        self.isa = BITS.get(self.path, 0)
        if not self.isa:
            asked = isa if isa is not None else os.environ.get("PCD_DECODE_ISA")
            raise DecodeUnavailableError(
                f"the decode ISA {asked!r} is not available on this CPU", reason="isa"
            )
        self.build_ms = (time.perf_counter() - t0) * 1e3
        t1 = time.perf_counter()
        self.wbits = wbits
        self.context_window = int(context_window)
        self._keep: list[Any] = []  # every buffer the C structs point into
        self._mapped: list[np.ndarray] = []  # file blocks read in place
        self.copies = 0  # matrices packed as copies (not read from file blocks)
        self.weights = check_weights(weights)
        self.activations = pick_activations(activations, model) if wbits == 8 else "float32"
        self.file_blocks = self.weights == "file"
        if self.weights == "auto":  # memory is looked up only when it decides
            self.file_blocks = (
                self.activations == "int8" or _copy_bytes(model) > available_memory() / 4
            )
        self._lock = threading.Lock()
        self._threads = threads or decode_threads()
        self._pack(model)
        if not self._mapped:  # 8-bit activations are for the file's blocks only
            self.activations = "float32"
        self.quantize_ms = (time.perf_counter() - t1) * 1e3
        self.nbytes = sum(a.nbytes for a in self._keep if isinstance(a, np.ndarray))
        if self.embed is not None:
            self.nbytes -= self.embed.nbytes  # the model's own embedding, read in place
        self.mapped_bytes = sum({id(a): a.nbytes for a in self._mapped}.values())
        pool = self.lib.pcd_pool_new(self._threads, _SPIN)
        if not pool:
            raise NativeBuildError("cannot start the native decode thread pool")
        self._pool = pool
        self.threads = int(self.lib.pcd_pool_threads(pool))
        fixed = threads is not None or bool(os.environ.get("PCD_DECODE_THREADS", "").strip())
        self._tuner = ThreadTuner(self.threads, fixed)
        self._finalizer = weakref.finalize(self, self.lib.pcd_pool_free, pool)

    # --- packing ------------------------------------------------------------------------

    def _ptr(self, a: np.ndarray | None) -> int | None:
        if a is None:
            return None
        self._keep.append(a)
        return int(a.ctypes.data)

    def _lin(self, w: np.ndarray, bias: np.ndarray | None) -> DecodeLin:
        rows, cols = w.shape
        self.copies += 1
        if self.wbits == 8:
            return self._lin8(rows, cols, [(0, w)], bias)
        w = np.ascontiguousarray(w, np.float32)
        return DecodeLin(w=self._ptr(w), bias=self._ptr(bias), rows=rows, cols=cols)

    def _lin8(
        self, rows: int, cols: int, parts: Iterable[tuple[int, np.ndarray]], bias: np.ndarray | None
    ) -> DecodeLin:
        """The 8-bit blocks of a (rows, cols) matrix given as float32 row ranges
        `(first row, rows)`, in order (a generator can dequantize each one as it is asked)."""
        q = np.empty((rows, cols), np.uint8)
        s = np.empty((rows, cols // QB), np.float32)
        mn = np.empty((rows, cols // QB), np.float32)
        for r0, w in parts:
            w = np.ascontiguousarray(w, np.float32)
            r1 = r0 + w.shape[0]
            self.lib.pcd_quantize_q8(
                w.ctypes.data,
                r1 - r0,
                cols,
                q[r0:r1].ctypes.data,
                s[r0:r1].ctypes.data,
                mn[r0:r1].ctypes.data,
                _SCHEMES.index(self.scheme),
                self._threads,
            )
        return DecodeLin(
            w=self._ptr(q),
            s=self._ptr(s),
            mn=self._ptr(mn),
            bias=self._ptr(bias),
            rows=rows,
            cols=cols,
        )

    def _file(self, qt: Any) -> bool:
        """Whether the steps read this GGUF-encoded tensor's own blocks (`qweights.QTensor`)."""
        data = getattr(qt, "data", None)
        return (
            self.file_blocks
            and self.wbits == 8
            and isinstance(data, np.ndarray)
            and data.flags.c_contiguous
            and self.lib.pcd_decode_file_block(int(qt.type_id)) > 0
        )

    def _file_lin(self, qt: Any, bias: np.ndarray | None) -> DecodeLin:
        """A matrix read in place from the file's blocks (rows in the tensor's order)."""
        self._mapped.append(qt.data)
        rows, cols = qt.shape
        return DecodeLin(
            w=int(qt.data.ctypes.data),
            bias=self._ptr(bias),
            order=self._ptr(qt.rows),
            row_bytes=int(qt.data.shape[1]),
            rows=rows,
            cols=cols,
            type=int(qt.type_id),
        )

    def _matrix(self, layer: Any) -> DecodeLin:
        """A linear layer: its file blocks where it keeps them and they can be read, else a
        packed copy of its dense weights."""
        if getattr(layer, "gguf_encoded", False) and self._file(layer.weight):
            return self._file_lin(layer.weight, _np(layer["bias"]) if "bias" in layer else None)
        return self._lin(*_dense(layer))

    def _pack(self, model: Any) -> None:
        inner = model.model
        layers = list(inner.layers)
        a0 = layers[0].self_attn
        self.n_heads, self.n_kv_heads = int(a0.n_heads), int(a0.n_kv_heads)
        emb = inner.embed_tokens
        encoded = getattr(emb, "gguf_encoded", False)
        # a GGUF-encoded embedding stays encoded: each step decodes its tokens' rows from
        # the file's blocks (or, where the kernels do not read its type, dequantizes them
        # in `_run`), so no float32 table of vocab x hidden is made (545 MB for a 0.5B)
        embed_file = encoded and self._file(emb.weight)
        self._embed_q = emb.weight if encoded and not embed_file else None
        self.embed: np.ndarray | None = None
        if encoded:
            self.vocab, self.hidden = emb.weight.shape
        else:
            self.embed = _embedding(emb)
            self.vocab, self.hidden = self.embed.shape
        self.head_dim = int(a0.q_proj.weight.shape[0]) // self.n_heads
        self.n_layers = len(layers)
        packed = (DecodeLayer * self.n_layers)()
        for i, layer in enumerate(layers):
            a, m = layer.self_attn, layer.mlp
            gate = self._matrix(m.gate_proj)
            self.inter = int(gate.rows)
            packed[i] = DecodeLayer(
                self._ptr(_np(layer.input_layernorm.weight)),
                self._ptr(_np(layer.post_attention_layernorm.weight)),
                *[self._matrix(p) for p in (a.q_proj, a.k_proj, a.v_proj, a.o_proj)],
                gate,
                self._matrix(m.up_proj),
                self._matrix(m.down_proj),
            )
        embed_q = self._file_lin(emb.weight, None) if embed_file else DecodeLin()
        if hasattr(model, "lm_head"):
            head = self._matrix(model.lm_head)
        elif embed_file:  # tied: the embedding's file blocks are the head
            head = embed_q
        elif self._embed_q is not None and self.wbits == 8:  # tied and encoded: in chunks
            t, (rows, cols) = self._embed_q, self._embed_q.shape
            chunks = (
                (r0, t.dequantize(rows=np.arange(r0, min(rows, r0 + 8192)), threads=self._threads))
                for r0 in range(0, rows, 8192)
            )
            head = self._lin8(rows, cols, chunks, None)
            self.copies += 1
        else:  # tied: the embedding is the head
            head = self._lin(
                _embedding(inner.embed_tokens) if self.embed is None else self.embed, None
            )
        self._keep.append(packed)
        self._rope = a0.rope
        self._layers = packed
        self._model = DecodeModel(
            n_layers=self.n_layers,
            hidden=self.hidden,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            inter=self.inter,
            vocab=self.vocab,
            wbits=self.wbits,
            eps=float(layers[0].input_layernorm.eps),
            attn_scale=float(a0.scale),
            embed=self._ptr(self.embed),  # None when encoded: file blocks, or set per step
            final_norm=self._ptr(_np(inner.norm.weight)),
            layers=ctypes.addressof(packed),
            head=head,
            embed_q=embed_q,
            act8=int(self.activations == "int8" and bool(self._mapped)),
        )
        self._ensure_rope(min(_ROPE_MIN, self.context_window), check=True)

    def _ensure_rope(self, n: int, check: bool = False) -> None:
        """RoPE tables covering positions [0, n): grown by doubling, from 4096 positions (or
        the window, if shorter)."""
        have = int(self._model.rope_len)
        if n <= have:
            return
        size = max(n, 2 * have, min(_ROPE_MIN, self.context_window))
        cos, sin, trad, dims = rope_tables(self._rope, self.head_dim, size, check)
        if cos is None:
            reason = (
                f"its RoPE ({type(self._rope).__name__}) is not a rotation this kernel reproduces"
            )
            raise DecodeUnavailableError(f"native decoding is unavailable: {reason}", reason=reason)
        self._model.rope_cos, self._model.rope_sin = self._ptr(cos), self._ptr(sin)
        self._model.rope_traditional, self._model.rope_dims = int(trad), dims
        self._model.rope_len = size

    # --- use ----------------------------------------------------------------------------

    def stepper(self, caches: Sequence[list[Any]], capacity: int) -> Stepper:
        """Decoding state for one or more sequences, each after its MLX cache.

        Args:
            caches: Per sequence, its mlx-lm `KVCache`s (float32), holding everything
                before the first token to step.
            capacity: The most steps any sequence will take.
        """
        return Stepper(self, caches, capacity)

    def _run(self, rows: Any, n: int, out: np.ndarray) -> None:
        with self._lock:
            if self._embed_q is not None:  # the tokens' embedding rows, row i for rows[i]
                x0 = self._embed_q.dequantize(rows=np.array([rows[i].token for i in range(n)]))
                for i in range(n):
                    rows[i].token = i
                self._model.embed = x0.ctypes.data
            threads = self._tuner.pick(n)
            t0 = time.perf_counter()
            rc = self.lib.pcd_decode_step(
                self._pool,
                ctypes.addressof(self._model),
                rows,
                n,
                out.ctypes.data,
                self.path,
                threads,
            )
            self._tuner.record(n, threads, time.perf_counter() - t0)
        if rc != 0:
            raise RuntimeError(f"the native decode step failed (code {rc})")

    def close(self) -> None:
        """Stops the thread pool (also done when the decoder is garbage-collected)."""
        self._finalizer()


class Stepper:
    """One-token steps for a batch of sequences that each continue their MLX cache.

    The prefix K/V is read in place (numpy views of the cache arrays, kept alive here);
    the K/V of the tokens stepped here live in this object's buffers only. Create it
    with `NativeDecoder.stepper`.
    """

    def __init__(self, dec: NativeDecoder, caches: Sequence[list[Any]], capacity: int):
        self.dec = dec
        self.capacity = max(1, int(capacity))
        mx.eval([x for cache in caches for c in cache for x in (c.keys, c.values) if x is not None])
        n = len(caches)
        self._rows = (DecodeRow * n)()
        self._keep: list[Any] = []
        self._tokens: list[list[int]] = [[] for _ in range(n)]
        shape = (dec.n_layers, dec.n_kv_heads, self.capacity, dec.head_dim)
        for r, cache in enumerate(caches):
            pk, pv = (ctypes.c_void_p * dec.n_layers)(), (ctypes.c_void_p * dec.n_layers)()
            strides = np.empty((dec.n_layers, 4), np.int64)
            offset = int(cache[0].offset)
            for li, c in enumerate(cache):
                if offset == 0:  # nothing before the first token: no prefix to read
                    strides[li] = 0
                    continue
                for j, arr in enumerate((c.keys, c.values)):
                    view = self._view(arr, offset)
                    (pk, pv)[j][li] = view.ctypes.data
                    strides[li, 2 * j : 2 * j + 2] = view.strides[1] // 4, view.strides[2] // 4
                    self._keep.append(view)
            nk, nv = np.empty(shape, np.float32), np.empty(shape, np.float32)
            self._keep += [pk, pv, strides, nk, nv]
            self._rows[r] = DecodeRow(
                0,
                offset,
                0,
                self.capacity,
                ctypes.addressof(pk),
                ctypes.addressof(pv),
                strides.ctypes.data,
                nk.ctypes.data,
                nv.ctypes.data,
            )

    def _view(self, arr: Any, n: int) -> np.ndarray:
        """The cache array's first n positions, (1, KH, >= n, D), as float32 numpy; in
        place when its last axis is contiguous."""
        if arr is None or int(arr.shape[2]) < n:
            raise ValueError("a KV cache holds fewer positions than its offset")
        if arr.dtype == mx.float32:
            view = np.array(arr, copy=False)
            if view.ndim == 4 and view.shape[0] == 1 and view.strides[3] == 4:
                return view
        return np.ascontiguousarray(np.array(arr[:1, :, :n].astype(mx.float32)))

    def __len__(self) -> int:
        return len(self._tokens)

    def position(self, row: int) -> int:
        """The tokens before row `row`'s next one: its cache's, then those stepped here."""
        r = self._rows[row]
        return int(r.n_prefix + r.n_new)

    def decoded(self, row: int) -> list[int]:
        """The tokens stepped for row `row` (their K/V held here, not in its cache)."""
        return list(self._tokens[row])

    def step(self, tokens: Sequence[int], rows: Sequence[int] | None = None) -> np.ndarray:
        """Runs one token per row; returns their float32 logits, (len(tokens), V).

        Args:
            tokens: The token of each row.
            rows: Which rows they continue (default: all, in order).

        Raises:
            ValueError: for a row past its capacity, a token outside the vocabulary, or a
                closed stepper.
        """
        if not self._keep:
            raise ValueError("this stepper is closed: its K/V buffers are released")
        rows = list(range(len(self._tokens))) if rows is None else list(rows)
        if len(rows) != len(tokens) or not rows:
            raise ValueError("step needs one token per row, and at least one row")
        sub = (DecodeRow * len(rows))()
        top = 0
        for i, (r, t) in enumerate(zip(rows, tokens)):
            row = self._rows[r]
            if row.n_new >= row.cap:
                raise ValueError(f"row {r} has taken its {row.cap} steps")
            if not 0 <= int(t) < self.dec.vocab:
                raise ValueError(f"token {t} is outside the vocabulary ({self.dec.vocab})")
            row.token = int(t)
            sub[i] = row
            top = max(top, row.n_prefix + row.n_new + 1)
        self.dec._ensure_rope(top)
        out = np.empty((len(rows), self.dec.vocab), np.float32)
        self.dec._run(sub, len(rows), out)
        for r, t in zip(rows, tokens):
            self._rows[r].n_new += 1
            self._tokens[r].append(int(t))
        return out

    def finish(self, passes: Any, caches: Sequence[list[Any]]) -> int:
        """Runs each row's stepped tokens into its MLX cache through MLX float32 (one call
        per row that has any), so the cache holds exactly what MLX decoding would have
        put there; then releases this stepper's buffers.

        Args:
            passes: The model's `Passes`.
            caches: The same caches, in the same order, as given to the stepper.

        Returns:
            The model calls that ran.
        """
        from .generate import write

        calls = 0
        for cache, toks in zip(caches, self._tokens):
            if toks:
                write(passes, toks, cache)
                calls += 1
        self.close()
        return calls

    def close(self) -> None:
        """Releases the views of the caches and the K/V buffers."""
        self._keep.clear()


# The engines' decoders (or why there is none), built on first use.
_DECODERS: weakref.WeakKeyDictionary[Any, NativeDecoder | str] = weakref.WeakKeyDictionary()
_BUILD_LOCK = threading.Lock()


def decoder_for(engine: Any) -> NativeDecoder | None:
    """The engine's native decoder per its `decode` option, built once; None for the MLX
    path (`decode="mlx"`, or `"auto"` where native decoding is unavailable).

    Raises:
        DecodeUnavailableError: with `decode="int8"` where it cannot run, saying why.
    """
    mode = getattr(engine, "decode", "auto")
    if mode == "mlx":
        return None
    with _BUILD_LOCK:
        hit = _DECODERS.get(engine)
        if hit is None:
            reason = unsupported_reason(engine.model, engine.device)
            try:
                if reason is not None:
                    raise DecodeUnavailableError(reason, reason=reason)
                hit = NativeDecoder(engine.model, context_window=engine.context_window)
            except (DecodeUnavailableError, NativeBuildError) as e:
                hit = getattr(e, "reason", None) or str(e)
                if isinstance(e, NativeBuildError) and mode == "auto":
                    fall_back("_decode.c (native int8 decode)", "generated fields use MLX", e)
            _DECODERS[engine] = hit
    if isinstance(hit, str):
        if mode == "int8":
            raise DecodeUnavailableError(
                f"decode='int8' was asked for, but native int8 decoding cannot run: {hit}. "
                "Accepted here: decode='mlx' or 'auto' (which falls back to MLX).",
                reason=hit,
            )
        return None
    return hit
