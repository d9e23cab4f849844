"""How each GGUF architecture maps onto an mlx-lm model class.

One `Family` per `general.architecture` that pcd-tools loads: the mlx-lm module, the
per-layer tensor names, the converter's transforms to undo, and the metadata that
becomes the model's `ModelArgs`. The facts come from llama.cpp's `convert_hf_to_gguf.py`
(what the converter writes) and its `llama-model.cpp` (what llama.cpp assumes when the
file is silent), so a file means here what it means in llama.cpp:

- `llama` (Llama, SmolLM, and Mistral / Mixtral-free Mistral models, which the converter
  writes as `llama`): Q/K rows permuted for interleaved RoPE, undone at load.
- `qwen2`, `qwen3`: no permutation; qwen3 adds per-head q/k RMS norms.
- `gemma3`: four norms per layer, stored as `1 + w` (mlx-lm adds the 1 itself), embedding
  scale sqrt(hidden) and sliding-window layers (5 of every 6, window from the file, local
  RoPE base 10000, as llama.cpp hard-codes them).
- `phi3`: fused `qkv` and `gate_up` matrices, partial RoPE, LongRoPE factors as tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pcd_tools.errors import ModelLoadError

__all__ = [
    "FAMILIES",
    "SUPPORTED_ARCHITECTURES",
    "Family",
    "family_for",
    "finish_weights",
    "rope_factors",
]

# GGUF per-layer names shared by every family, and the mlx-lm module paths they load into.
_COMMON = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}

Meta = Callable[[str, Any], Any]  # get(key without the "<arch>." prefix, default)


@dataclass(frozen=True)
class Family:
    """How one GGUF architecture loads into an mlx-lm model class.

    Args:
        arch: The GGUF `general.architecture`.
        module: The `mlx_lm.models` module whose `Model` / `ModelArgs` it loads into.
        layer_names: GGUF per-layer tensor name (`blk.N.<name>`) -> mlx-lm module path.
        permute_qk: The converter permuted Q/K rows for llama.cpp's interleaved RoPE.
        norm_shift: What the converter added to every `*norm.weight` (Gemma's `1 + w`).
        args: Extra `ModelArgs` from the metadata: `(get, base_args, tensor_names)`,
            where `get(key, default)` reads `<arch>.<key>`.
    """

    arch: str
    module: str
    layer_names: dict[str, str] = field(default_factory=lambda: dict(_COMMON))
    permute_qk: bool = False
    norm_shift: float = 0.0
    args: Callable[[Meta, dict[str, Any], set[str]], dict[str, Any]] | None = None

    def model_args(self, get: Meta, base: dict[str, Any], names: set[str]) -> dict[str, Any]:
        """`base` (the metadata every family shares) completed for this family.

        Raises:
            ModelLoadError: The file asks for something this family's mlx-lm class
                cannot compute (e.g. partial RoPE outside phi3, logit soft-capping).
        """
        out = dict(base, model_type=self.arch)
        rope_dims = get("rope.dimension_count", None)
        if self.arch != "phi3" and rope_dims not in (None, base["head_dim"]):
            raise ModelLoadError(
                f"this {self.arch} file rotates {rope_dims} of {base['head_dim']} head dims "
                f"(partial RoPE), which mlx-lm's {self.module} model does not compute"
            )
        if self.args is not None:
            out |= self.args(get, out, names)
        return out


def _gemma3_args(get: Meta, base: dict[str, Any], names: set[str]) -> dict[str, Any]:
    if cap := get("final_logit_softcapping", None):
        raise ModelLoadError(
            f"this gemma3 file soft-caps its logits at {cap}, which mlx-lm's gemma3_text "
            "model does not compute"
        )
    window = int(get("attention.sliding_window", 0) or 0)
    heads, hidden = base["num_attention_heads"], base["hidden_size"]
    return {
        # llama.cpp: every 6th layer global, the others local with RoPE base 10000 and no
        # scaling; no window in the file means every layer is global.
        "sliding_window": window or base["max_position_embeddings"],
        "sliding_window_pattern": 6 if window else 1,
        "rope_local_base_freq": 10000.0,
        # llama.cpp (after gemma_pytorch): 1/sqrt(hidden/heads) for the 62-layer 27B,
        # 1/sqrt(head_dim) for the others.
        "query_pre_attn_scalar": hidden // heads
        if base["num_hidden_layers"] == 62
        else base["head_dim"],
    }


def _phi3_args(get: Meta, base: dict[str, Any], names: set[str]) -> dict[str, Any]:
    head_dim = base["hidden_size"] // base["num_attention_heads"]
    if base["head_dim"] != head_dim:
        raise ModelLoadError(
            f"this phi3 file has {base['head_dim']}-wide heads, but mlx-lm's phi3 model "
            f"takes hidden / heads = {head_dim}"
        )
    rope_dims = int(get("rope.dimension_count", head_dim))
    factor = rope_dims / head_dim
    if int(head_dim * factor) != rope_dims:
        raise ModelLoadError(f"phi3 RoPE over {rope_dims} of {head_dim} dims cannot be expressed")
    out: dict[str, Any] = {
        "partial_rotary_factor": factor,
        "original_max_position_embeddings": get(
            "rope.scaling.original_context_length", base["max_position_embeddings"]
        ),
        "rope_scaling": None,  # LongRoPE factors are tensors: see `rope_factors`
    }
    return out


FAMILIES: dict[str, Family] = {
    f.arch: f
    for f in (
        Family("llama", "llama", permute_qk=True),
        Family("qwen2", "qwen2"),
        Family("qwen3", "qwen3", layer_names=_COMMON | _QK_NORMS),
        Family(
            "gemma3",
            "gemma3_text",
            layer_names=_COMMON
            | _QK_NORMS
            | {
                "post_attention_norm": "post_attention_layernorm",
                "ffn_norm": "pre_feedforward_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm",
            },
            norm_shift=1.0,
            args=_gemma3_args,
        ),
        Family(
            "phi3",
            "phi3",
            layer_names=_COMMON | {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
            args=_phi3_args,
        ),
    )
}
SUPPORTED_ARCHITECTURES = tuple(sorted(FAMILIES))


def family_for(arch: str) -> Family | None:
    """The `Family` of a GGUF `general.architecture`, or None if it is not supported."""
    return FAMILIES.get(arch)


def finish_weights(family: Family, weights: dict[str, Any]) -> dict[str, Any]:
    """Undo the converter's value transforms on mlx-lm-named weights (in place)."""
    if family.norm_shift:
        for key in [k for k in weights if k.endswith("norm.weight")]:
            weights[key] = weights[key] - family.norm_shift
    return weights


def rope_factors(weights: dict[str, Any], arg_dict: dict[str, Any]) -> None:
    """Move phi3's `rope_factors_long/short` tensors into its LongRoPE `rope_scaling`.

    llama.cpp uses the long factors whenever its context exceeds the original one (its
    default), as mlx-lm's `SuScaledRoPE` always does.
    """
    long_f = weights.pop("rope_factors_long.weight", None)
    short_f = weights.pop("rope_factors_short.weight", None)
    if long_f is None:
        return
    short = long_f if short_f is None else short_f
    arg_dict["rope_scaling"] = {
        "type": "longrope",
        "long_factor": [float(x) for x in long_f.tolist()],
        "short_factor": [float(x) for x in short.tolist()],
    }
