"""Names a package loads from its modules on first use (PEP 562), so importing it is light.

`pcd_tools`, `pcd_tools.agents` and `pcd_tools.eval` each map a public name to the module
that defines it and take their `__getattr__` / `__dir__` from `lazy_names`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_names"]


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
