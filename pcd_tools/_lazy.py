"""Names a package loads from its modules on first use (PEP 562), so importing it is light.

`pcd_tools`, `pcd_tools.agents` and `pcd_tools.eval` each map a public name to the module
that defines it and take their `__getattr__` / `__dir__` from `lazy_names`.

`mlx_lm_module` imports one of mlx-lm's modules without the cost of mlx-lm's package
`__init__` (which imports transformers), run only when something asks for a name it defines.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_names", "mlx_lm_module"]


def lazy_names(
    package: str, table: Mapping[str, str], public: Sequence[str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of a package whose names load lazily.

    Args:
        package: The package's `__name__`.
        table: Public name -> the package's module (relative, without the dot) defining it.
        public: The package's `__all__`.
        namespace: The package's `globals()`; a loaded name is cached there.

    Returns:
        `(__getattr__, __dir__)` for the package's module level.
    """

    def __getattr__(name: str) -> Any:
        mod = table.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{mod}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(public))

    return __getattr__, __dir__


_deferred_lock = threading.RLock()


class _DeferredPackage(types.ModuleType):
    """A package registered before its `__init__` ran: its submodules import as usual, and
    the first lookup of a name it does not hold yet (`mlx_lm.load`, `from mlx_lm import
    generate`, `mlx_lm.__version__`) runs the `__init__` in place, then answers."""

    def __getattr__(self, attr: str) -> Any:
        with _deferred_lock:
            if type(self) is _DeferredPackage:
                object.__setattr__(self, "__class__", types.ModuleType)  # once, whatever happens
                spec = self.__spec__
                assert spec is not None and spec.loader is not None
                spec.loader.exec_module(self)
        return types.ModuleType.__getattribute__(self, attr)


def mlx_lm_module(name: str) -> types.ModuleType:
    """`mlx_lm.<name>` (`"models.qwen2"`, `"models.cache"`), imported without running
    `mlx_lm/__init__.py` first when mlx-lm is not imported yet.

    That file imports mlx-lm's loader and generation, and with them transformers: 1.5-3 s
    of a GGUF model's load on a 2-core CPU, for code a GGUF model never runs. The package
    is registered un-run instead (`_DeferredPackage`) and runs its `__init__` the first
    time anything asks it for a name, so code that uses `mlx_lm` later (`mlx_lm.load`)
    gets the whole package, the same module objects included.
    """
    full = f"mlx_lm.{name}"
    module = sys.modules.get(full)
    if module is not None:
        return module
    with _deferred_lock:
        if "mlx_lm" not in sys.modules:
            spec = importlib.util.find_spec("mlx_lm")
            if spec is not None and spec.loader is not None:
                package = importlib.util.module_from_spec(spec)
                package.__class__ = _DeferredPackage
                sys.modules["mlx_lm"] = package
        return importlib.import_module(full)
