"""The four scenarios of the seed's reference table, and `intake` (every second-stage
schema kind), as readable, runnable examples.

Each module defines a `@decision` Pydantic schema with real descriptions, a realistic
`CONTEXT`, a few more `CONTEXTS` for throughput runs, a `TITLE` and the seed's
`REFERENCE` numbers (M4 Max, Qwen2.5-1.5B-4bit). `SCENARIOS` maps a short name to a
`Scenario`; `pcd bench` and the pytest-benchmark suites read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import fraud, intake, security_audit, tariff, triage

__all__ = ["SCENARIOS", "Scenario"]


@dataclass(frozen=True)
class Scenario:
    """One benchmark scenario.

    Args:
        name: Short name used on the command line (`--scenario fraud`).
        title: The row title in the seed's table.
        schema: The Pydantic decision model.
        context: The main context that is timed.
        contexts: More contexts of the same kind (throughput runs cycle through them).
        reference: The seed's numbers: `fields`, `autoregressive_ms`, `pcd_ms`, `speedup`.
    """

    name: str
    title: str
    schema: type[Any]
    context: str
    contexts: tuple[str, ...] = ()
    reference: dict[str, Any] = field(default_factory=dict)


def _from(module: Any) -> Scenario:
    return Scenario(
        name=module.NAME,
        title=module.TITLE,
        schema=module.SCHEMA,
        context=module.CONTEXT,
        contexts=tuple(module.CONTEXTS),
        reference=dict(module.REFERENCE),
    )


SCENARIOS: dict[str, Scenario] = {
    m.NAME: _from(m) for m in (fraud, security_audit, tariff, triage, intake)
}
