"""The model and the PCD passes, as rooms by role (imports point down this list):

- `host/`: CPUs, threads, cgroups, the BLAS binding, building native code;
- `kernels/`: the C sources and the modules that call them;
- `load/`: model sources, the GGUF reader and families, quantized linears, the tokenizer;
- `passes/`: packing, tries, forward passes, pruning, waves, prefix cache, KV parts;
- `decode/`: generated fields: native decode steps, grammar and vocabulary;
- and this facade: `Engine` (`scorer`: prefill once, score every field in one pass),
  `hybrid` (schemas with generated fields: their segments on each context's cache),
  `LoadedModel` and `load_model` (`load.sources`), and the one `doctor`.

`import pcd_tools.engine` is light: MLX loads with the first model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .load.sources import LoadedModel, load_model
    from .scorer import Engine

__all__ = ["Engine", "LoadedModel", "load_model"]

_LAZY = {
    "Engine": "scorer",
    "LoadedModel": "load.sources",
    "load_model": "load.sources",
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, globals())
