"""`y = x @ W^T` with W kept in its GGUF block encoding: int8 and bf16 CPU kernels.

A Linear module calls `prepare(raw, ggml_type, shape)` once per weight matrix and then
`matrix.matmul(x)` per pass. The weight bytes are kept as they are in the file (a view,
no copy: memory is the file's size); each call decodes panels of 16 output columns into
a per-thread scratch and reuses each panel for every row, so the decoding is paid once
per matrix per pass, divided over hundreds of prefill rows.

Modes:

- ``int8`` (every CPU): as llama.cpp computes it. Each activation row is quantized per
  block of 32 (scale ``max|x| / 127``, plus the block sum where the weight type has a
  minimum), integer dot products of 4-byte groups are taken per block and accumulated
  in float32 with the product of the two scales. Kernels, picked at run time:
  ``avx512vnni`` (``vpdpbusd`` on 512 bits, two blocks a register), ``avxvnni`` (the
  same on 256 bits), ``avx2`` (``vpmaddubsw`` + ``vpmaddwd``, with the sign trick so the
  16-bit pairs cannot saturate), ``scalar`` (portable C). ``scalar``, ``avx2`` and
  ``avxvnni`` give bit-identical results; ``avx512vnni`` sums its float lanes in another
  order (equal within float32 rounding). For the one-scale 32-block types (Q4_0, Q4_1,
  Q5_0, Q5_1, Q8_0) ``scalar``, ``avx2`` and ``avxvnni`` lay each panel out across
  columns: 8 columns' 4-byte groups side by side, the activation's 4 bytes broadcast,
  a block's 32 products summed in the integers, then one FMA per block for 8 columns;
  a row's output never depends on the other rows of the call.
- ``bf16`` (AVX-512 BF16 CPUs only): activations and the dequantized panel rounded to
  bf16, products summed in float32 by ``vdpbf16ps``.

- ``int8`` on K-quants (Q4_K, Q5_K, Q6_K) with ``act_block=256`` (llama.cpp's Q8_K
  activations; what ``compute="int8"`` runs for them): on an AVX-512 VNNI CPU the
  column-panel kernel ``avx512vnni-cols``. A task decodes 32 output columns into two
  groups of 16 lanes, the 4-byte groups of the 16 columns side by side, so one
  ``vpdpbusd`` takes 64 multiply-adds with the activation's 4 bytes broadcast and one
  weight load serves 6 rows; the sub-block scales multiply the int32 sums once per
  sub-block and the float work is two FMAs per superblock of 256. Its scalar twin
  ``scalar-cols`` gives bit-identical results, and a row's output never depends on the
  other rows of the call. Elsewhere the 8-lane K micro kernels (``avx2``, ``avxvnni``,
  ``scalar``) run, equal within float32 rounding: their tiles take the integer sums and
  one FMA per 8 lanes and superblock, and the minimum's term is a separate float pass per
  panel of 8 columns (one FMA per sub-block, rows and columns across the lanes).

Supported weight types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (rows whose
length is a multiple of the type's block: 32, or 256 for the K-quants).

Which route won, and why (BENCHMARKS.md, "Quantized GEMM kernels"; `python
benchmarks/qgemm.py`). On a 2-core AMD EPYC with AVX-512 VNNI and BF16 (one thread,
512 rows, Qwen2.5-1.5B shapes, quiet), ``vpdpbusd`` on 512 bits reaches 214 G
multiply-adds a second in a register-only loop against 56 for ``vfmadd231ps``: int8 can
be ~4x float32 there. The 8-lane kernels reached only 1.0-1.2x of sgemm, because their
float work per superblock and column (lane fold, two conversions, two FMAs, the minimum's
madd) is as large as their integer work, and each activation load serves two columns.
The column-panel kernel does that float work once per 16 columns and reached 2.0-2.9x
of sgemm (bf16: 1.0-1.4x), so ``compute="auto"`` runs it for K-quant files on such
CPUs (`qweights.auto_compute`). On the earlier session's 2-core AMD EPYC (Zen 3: AVX2 + FMA, no AVX-512,
no VNNI; shared, so compared by CPU time on one thread, 512 rows, Qwen2.5-1.5B and
SmolLM2-135M shapes), dequantize + float32 sgemm (issue 30's per-matrix scratch) won:
0.90-0.95x of sgemm over dense weights, as dequantizing costs 2-5% of one 512-row GEMM.
The int8 kernels ran at 0.61-0.81x of sgemm with activations per 32 and 0.73-0.89x with
``act_block=256`` (K-quants), at the file's memory size. (That session blamed an AVX2
bound of ~1.2x float32, from a register-only loop in C whose identical products the
compiler folded; an asm loop measures 197 G op/s a thread for ``vpmaddubsw + vpmaddwd +
vpaddd`` against 102 for ``vfmadd231ps``: int8 can be 1.9x float32 there,
`benchmarks/prefill.py`.) With the tile's sub-block step in asm (GCC had spilled three
of the 4 x 2 tile's accumulators; a 5 x 2 tile with the scales as memory operands is now
the full tile), panels of 8 columns and the AVX2 activation quantizer, the K kernel ran at
1.16-1.26x of sgemm (102-114 G op/s a thread). The minimum's term then left the tiles for
one fma pass per panel (it had taken a quarter of the AVX2 kernel's time, on the ports the
integer products need): 1.35-1.5x of sgemm (115-135 G op/s a thread), and a cold 1.5B
prefill at 1.18-1.29x of llama.cpp's prompt evaluation on the same ids (BENCHMARKS.md,
"int8 on AVX2, part 3"); `auto` takes int8 there. The 32-block types (Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0) then still ran at 0.73-0.77x of sgemm on 8 lanes per block (one
conversion, product of scales and FMA per block and column); in column panels (8
columns a vector, the activation's 4 bytes broadcast, a block's products summed in the
integers, 16-bit sums for the unsigned quants) they run at 1.15-1.56x of sgemm
(92-115 G op/s a thread), and the 0.5B's cold prefill is 1.37-1.53x faster in int8
than in float32 (BENCHMARKS.md, "int8 on AVX2, part 4"), so `auto` takes int8 for such
files from 256 MiB. int8 is expected to win by more with
AVX-512 VNNI / AVX-VNNI (``vpdpbusd``: 64 multiply-adds in one instruction); those
kernels and the AVX-512 BF16 route are written and compile-checked but could not run
here. oneDNN (pip ``onednn`` 2026.1) is a SYCL build: with its Intel runtimes
(tbb, intel-cmplr-lib-rt, intel-sycl-rt, intel-opencl-rt) its matmul primitives were
created and then crashed in the OpenCL CPU runtime on first execution on this AMD CPU;
it also has no GGUF block formats. ggml has no binary wheel with a binding
(llama-cpp-python builds from source), so it was not measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pcd_tools.errors import InvalidArgumentError, NativeBuildError

from .bindings import qgemm_library
from .gguf_types import GGUF_TYPES, K_QUANTS, block_of
from .paths import PATHS as ALL_PATHS

__all__ = [
    "GGML_TYPES",
    "QuantizedMatrix",
    "available_modes",
    "available_paths",
    "column_path",
    "isa",
    "prepare",
    "quantize_activations",
]

#: GGML type ids (ggml.h, through gguf_types) of the weight encodings these kernels read.
GGML_TYPES: dict[str, int] = {
    n: GGUF_TYPES[n][0] for n in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", *K_QUANTS)
}
_NAMES = {v: k for k, v in GGML_TYPES.items()}
_KQUANTS = tuple(GGML_TYPES[n] for n in K_QUANTS)

#: kernel names and their path ids (`cpu_paths.h`'s PCD_PATH_*, through kernels.paths)
PATHS: dict[str, int] = {
    n: ALL_PATHS[n] for n in ("scalar", "avx2", "avxvnni", "avx512vnni", "avx512bf16")
}
_PATH_NAMES = {v: k for k, v in PATHS.items()}
#: the column-panel K-quant kernels (activations per 256 only) and their C path ids
COLUMN_PATHS: dict[str, int] = {
    "scalar-cols": ALL_PATHS["scalar"],
    "avx512vnni-cols": ALL_PATHS["avx512vnni"],
    "amx-cols": ALL_PATHS["amx"],
}
_QB = 32


def available_paths() -> list[str]:
    """Kernels this CPU runs, fastest int8 one first among the int8 ones.

    Returns:
        Names from ``scalar``, ``avx2``, ``avxvnni``, ``avx512vnni``, ``avx512bf16``.
    """
    lib = qgemm_library()
    return [n for n, i in sorted(PATHS.items(), key=lambda kv: -kv[1]) if lib.pcd_qgemm_has_path(i)]


def isa() -> str:
    """The int8 kernel `matmul` picks on this CPU (for ``pcd models --doctor``).

    Returns:
        ``avx512vnni``, ``avxvnni``, ``avx2`` or ``scalar``.
    """
    return _PATH_NAMES[int(qgemm_library().pcd_qgemm_has_path(0))]


def _columns_by_default(lib: Any) -> bool:
    """Whether `matmul` takes K-quant products per 256 to the column-panel kernels when no
    path is forced: where AVX-512 VNNI runs (the AMX path runs only there too)."""
    return bool(lib.pcd_qgemm_has_path(PATHS["avx512vnni"]))


def column_path() -> str:
    """The column-panel K-quant kernel `matmul` picks for activations per 256 (a prefill's
    products on Q4_K / Q5_K / Q6_K weights): ``amx-cols`` (AMX tiles), ``avx512vnni-cols``
    or ``scalar-cols``; ``none`` where the row-panel kernels take them instead (no
    AVX-512 VNNI)."""
    lib = qgemm_library()
    if not _columns_by_default(lib):
        return "none"
    names = {v: k for k, v in COLUMN_PATHS.items()}
    return names[int(lib.pcd_qgemm_kc_path(0))]


def available_modes() -> list[str]:
    """Compute modes this CPU runs: ``int8`` always (portable C at worst), ``bf16`` with
    AVX-512 BF16.

    Returns:
        A list from ``["int8", "bf16"]``.
    """
    modes = ["int8"]
    if qgemm_library().pcd_qgemm_has_path(PATHS["avx512bf16"]):
        modes.append("bf16")
    return modes


def _type_id(ggml_type: int | str) -> int:
    if isinstance(ggml_type, str):
        tid = GGML_TYPES.get(ggml_type.upper())
    elif isinstance(ggml_type, (int, np.integer)) and not isinstance(ggml_type, bool):
        tid = int(ggml_type) if int(ggml_type) in _NAMES else None
    else:
        tid = getattr(ggml_type, "value", None)  # a gguf.GGMLQuantizationType
        tid = tid if tid in _NAMES else None
    if tid is None:
        raise InvalidArgumentError(
            f"weight type {ggml_type!r} is not supported by the int8 / bf16 kernels; "
            f"supported: {', '.join(GGML_TYPES)} (by name or GGML type id)"
        )
    return tid


@dataclass(frozen=True)
class QuantizedMatrix:
    """A weight matrix ``[n, k]`` in its GGUF block encoding, ready for `matmul`.

    Attributes:
        raw: The file's bytes of the matrix (a uint8 view; not copied).
        ggml_type: GGML type id.
        n: Output features (rows of W).
        k: Input features (columns of W).
    """

    raw: np.ndarray
    ggml_type: int
    n: int
    k: int

    @property
    def type_name(self) -> str:
        """The encoding's name, such as ``Q4_K``."""
        return _NAMES[self.ggml_type]

    @property
    def nbytes(self) -> int:
        """Bytes the matrix holds in memory (the file's bytes)."""
        return int(self.raw.nbytes)

    def _x(self, x: Any) -> tuple[np.ndarray, tuple[int, ...]]:
        arr = np.asarray(x)
        if arr.dtype != np.float32:
            raise InvalidArgumentError(
                f"matmul takes float32 activations; got dtype {arr.dtype} "
                "(convert with .astype(np.float32) first)"
            )
        if arr.ndim == 0 or arr.shape[-1] != self.k:
            raise InvalidArgumentError(
                f"activations of shape {arr.shape} do not match this {self.type_name} "
                f"matrix of shape ({self.n}, {self.k}): the last dimension must be {self.k}"
            )
        lead = arr.shape[:-1]
        return np.ascontiguousarray(arr.reshape(-1, self.k)), lead

    @property
    def kquant(self) -> bool:
        """True for Q4_K, Q5_K and Q6_K (superblocks of 256 with integer sub-scales)."""
        return self.ggml_type in _KQUANTS

    def matmul(
        self,
        x: Any,
        mode: str = "int8",
        path: str | None = None,
        threads: int | None = None,
        act_block: int | None = None,
        out: np.ndarray | None = None,
        activations: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> np.ndarray:
        """Return ``x @ W^T`` in float32.

        Args:
            x: float32 activations ``[..., k]`` (numpy, or anything `np.asarray` reads,
                such as an evaluated ``mx.array``).
            mode: ``int8`` (activations quantized to 8 bits per block) or ``bf16``.
            path: Force one int8 kernel (a name from `available_paths`); None picks the
                fastest this CPU has.
            threads: Threads to use; None: the thread budget (`threads.thread_budget()`).
            act_block: int8 mode: values per activation scale, 32 (the default) or 256
                (K-quants only: their integer sub-block scales then fold into the integer
                sums and the float work is one step per 256 values, as llama.cpp's Q8_K
                does; coarser activations, see the module docstring).
            out: int8 / bf16: a C-contiguous float32 ``[rows, n]`` buffer to write into
                (a reused scratch: no fresh pages per call), else a new array.
            activations: int8: ``x`` already quantized by `quantize_activations` with
                this call's block (two matrices that read the same ``x``, such as an
                MLP's gate and up, quantize it once); the results are those of
                quantizing here.

        Returns:
            float32 ``[..., n]``: a view of `out` when given.

        Raises:
            InvalidArgumentError: Activations of another dtype or width, an unknown mode
                or path, or a mode / path this CPU cannot run.
        """
        lib = qgemm_library()
        x2, lead = self._x(x)
        rows = x2.shape[0]
        nthreads = _threads(threads)
        if out is None:
            y = np.empty((rows, self.n), dtype=np.float32)
        elif (
            not isinstance(out, np.ndarray)
            or out.shape != (rows, self.n)
            or out.dtype != np.float32
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            raise InvalidArgumentError(
                f"out must be a writeable C-contiguous float32 array of shape {(rows, self.n)}; "
                f"got {getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}"
            )
        else:
            y = out
        if activations is not None and mode != "int8":
            raise InvalidArgumentError(f"activations are int8 mode's; this call is {mode!r}")
        if rows == 0:
            return y.reshape(*lead, self.n)
        raw = self.raw.ctypes.data
        if mode == "int8":
            cols = path in COLUMN_PATHS
            pid = 0 if path is None else (COLUMN_PATHS if cols else PATHS).get(path, -1)
            if pid in (-1, PATHS["avx512bf16"]) and not cols:
                raise InvalidArgumentError(
                    f"int8 kernel {path!r} is unknown; one of: scalar, avx2, avxvnni, "
                    f"avx512vnni, {', '.join(COLUMN_PATHS)}"
                )
            if pid and not (lib.pcd_qgemm_kc_path if cols else lib.pcd_qgemm_has_path)(pid):
                raise InvalidArgumentError(
                    f"this CPU cannot run the {path} kernel; it runs {available_paths()}"
                )
            if cols and (not self.kquant or act_block not in (None, 256)):
                raise InvalidArgumentError(
                    f"the {path} kernel takes K-quant weights (Q4_K, Q5_K, Q6_K) with "
                    f"act_block 256; got a {self.type_name} matrix, act_block {act_block!r}"
                )
            block = (256 if cols else 32) if act_block is None else act_block
            cols = cols or (path is None and block == 256 and _columns_by_default(lib))
            if block not in (32, 256) or (block == 256 and not self.kquant):
                raise InvalidArgumentError(
                    f"act_block must be 32{' or 256' if self.kquant else ''} for a "
                    f"{self.type_name} matrix; got {act_block!r}"
                )
            if activations is None:
                xq, dx, xs = quantize_activations(x2, threads=nthreads, block=block)
            else:
                xq, dx, xs = _check_activations(activations, rows, self.k, block)
            fn = (
                lib.pcd_qgemm_int8_kc
                if cols
                else lib.pcd_qgemm_int8_k
                if block == 256
                else lib.pcd_qgemm_int8
            )
            rc = fn(
                self.ggml_type, raw, self.n, self.k, xq.ctypes.data, dx.ctypes.data,
                xs.ctypes.data, rows, y.ctypes.data, self.n, pid, nthreads,
            )  # fmt: skip
        elif mode == "bf16":
            if path not in (None, "avx512bf16"):
                raise InvalidArgumentError(f"bf16 mode has one kernel, avx512bf16; got {path!r}")
            if "bf16" not in available_modes():
                raise InvalidArgumentError(
                    "bf16 mode needs AVX-512 BF16, which this CPU lacks; "
                    f"it runs {available_modes()}"
                )
            rc = lib.pcd_qgemm_bf16(
                self.ggml_type, raw, self.n, self.k, x2.ctypes.data, self.k, rows,
                y.ctypes.data, self.n, nthreads,
            )  # fmt: skip
        else:
            raise InvalidArgumentError(f"mode must be 'int8' or 'bf16'; got {mode!r}")
        if rc == 1:
            raise MemoryError("qgemm: no thread could allocate its panel scratch")
        if rc != 0:  # validated above: a mismatch between this module and the C file
            raise NativeBuildError(f"_qgemm.c returned {rc} for a validated call")
        return y.reshape(*lead, self.n)

    def dequantize(self, out: np.ndarray | None = None) -> np.ndarray:
        """Return W as dense float32 ``[n, k]`` (the reference, and the scratch route).

        Args:
            out: A C-contiguous float32 ``[n, k]`` buffer to write into (a reused
                scratch), else a new array.

        Returns:
            float32 ``[n, k]``: `out` when given.

        Raises:
            InvalidArgumentError: `out` of another shape, dtype or layout.
        """
        if out is None:
            out = np.empty((self.n, self.k), dtype=np.float32)
        elif (
            not isinstance(out, np.ndarray)
            or out.shape != (self.n, self.k)
            or out.dtype != np.float32
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            raise InvalidArgumentError(
                f"out must be a writeable C-contiguous float32 array of shape {(self.n, self.k)}"
            )
        rb = self.raw.nbytes // self.n
        qgemm_library().pcd_qgemm_dequantize(
            self.ggml_type, self.raw.ctypes.data, rb, self.k, 0, self.n, out.ctypes.data
        )
        return out


def _check_activations(
    acts: Any, rows: int, k: int, block: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`acts` if it is `quantize_activations`' output for `rows` x `k` at `block`."""
    want = ((rows, k), (rows, k // block), (rows, k // 16 if block == 256 else k // _QB))
    types = (np.int8, np.float32, np.int16 if block == 256 else np.float32)
    ok = isinstance(acts, tuple) and len(acts) == 3
    if ok:
        for a, shape, dtype in zip(acts, want, types):
            ok = ok and (
                isinstance(a, np.ndarray)
                and a.shape == shape
                and a.dtype == dtype
                and a.flags.c_contiguous
            )
    if not ok:
        got = (
            [(getattr(a, "dtype", None), getattr(a, "shape", None)) for a in acts]
            if isinstance(acts, tuple)
            else type(acts).__name__
        )
        raise InvalidArgumentError(
            f"activations must be quantize_activations(x, block={block}) of a {rows} x {k} x: "
            f"arrays of {[(np.dtype(t).name, s) for t, s in zip(types, want)]}; got {got}"
        )
    return acts


def _threads(threads: int | None) -> int:
    from ..host.threads import kernel_threads

    return kernel_threads(threads)


def prepare(raw: Any, ggml_type: int | str, shape: tuple[int, int]) -> QuantizedMatrix:
    """Wrap a GGUF weight matrix for `QuantizedMatrix.matmul`, without copying it.

    Args:
        raw: The matrix's bytes as stored in the file (bytes, memoryview, or a numpy
            array such as ``gguf.ReaderTensor.data``; a C-contiguous one is not copied).
        ggml_type: GGML type id or name (``"Q4_K"``), or a ``gguf.GGMLQuantizationType``.
        shape: ``(n, k)``: output features, input features (numpy order; GGUF's
            ``ne`` is ``(k, n)``).

    Returns:
        The matrix.

    Raises:
        InvalidArgumentError: An unsupported type, a shape whose rows are not whole
            blocks, or a byte count that does not match the shape.
    """
    tid = _type_id(ggml_type)
    try:
        n, k = (int(v) for v in shape)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"shape must be (n, k); got {shape!r}") from exc
    bb, be = block_of(tid)
    name = _NAMES[tid]
    if n < 1 or k < 1 or k % be:
        raise InvalidArgumentError(
            f"{name} rows hold whole blocks of {be} values: k={k} is not a positive "
            f"multiple of {be} (shape {(n, k)})"
        )
    arr = (
        np.frombuffer(raw, dtype=np.uint8)
        if isinstance(raw, (bytes, bytearray, memoryview))
        else np.asarray(raw)
    )
    arr = arr.reshape(-1).view(np.uint8) if arr.dtype != np.uint8 else arr.reshape(-1)
    want = n * (k // be) * bb
    if arr.nbytes != want:
        raise InvalidArgumentError(
            f"a {name} matrix of shape {(n, k)} takes {want} bytes; got {arr.nbytes}"
        )
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return QuantizedMatrix(arr, tid, n, k)


def quantize_activations(
    x: np.ndarray, threads: int | None = None, block: int = 32
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize float32 rows to int8 per block as the int8 kernels do.

    Args:
        x: float32 ``[rows, k]``, k a multiple of `block`.
        threads: Threads to use; None: the thread budget (`threads.thread_budget()`).
        block: Values per scale: 32 (Q8_0 style) or 256 (Q8_K style, for the K-quants).

    Returns:
        ``xq`` int8 ``[rows, k]``; ``dx`` float32 ``[rows, k / block]`` (``max|x| / 127``
        per block); then for block 32 ``xs`` float32 ``[rows, k / 32]`` (``dx *
        sum(xq)`` per block), for block 256 ``bs16`` int16 ``[rows, k / 16]`` (``sum(xq)``
        per 16 values).

    Raises:
        InvalidArgumentError: Not a 2-D float32 array, a block other than 32 or 256, or
            k not a multiple of the block.
    """
    x = np.ascontiguousarray(x)
    if block not in (32, 256) or x.ndim != 2 or x.dtype != np.float32 or x.shape[1] % block:
        raise InvalidArgumentError(
            f"quantize_activations takes float32 [rows, k] with k a multiple of the block "
            f"(32 or 256); got {x.dtype} {x.shape}, block {block!r}"
        )
    rows, k = x.shape
    xq = np.empty((rows, k), dtype=np.int8)
    dx = np.empty((rows, k // block), dtype=np.float32)
    if block == 256:
        xs = np.empty((rows, k // 16), dtype=np.int16)
        fn = qgemm_library().pcd_qgemm_quantize_k
    else:
        xs = np.empty((rows, k // _QB), dtype=np.float32)
        fn = qgemm_library().pcd_qgemm_quantize
    rc = fn(
        x.ctypes.data, k, rows, k, xq.ctypes.data, dx.ctypes.data, xs.ctypes.data,
        _threads(threads),
    )  # fmt: skip
    if rc:
        raise MemoryError("qgemm: activation quantization could not start its threads")
    return xq, dx, xs
