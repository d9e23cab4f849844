"""Running PCD over many texts in batches, with per-item latency and a progress bar.

`run_pcd` is what both the evaluation (`pcd_tools.eval.evaluate`) and the calibration fit
(`pcd_tools.eval.calibration`) run the model with.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..answers.result import Decision
    from ..decide.checks import LabelFree, Scoring
    from ..decide.decider import Decider

__all__ = ["progress_bar", "run_pcd"]


@contextlib.contextmanager
def progress_bar(total: int, label: str, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr; yields `advance(k)` (a no-op when not `enabled`).

    Args:
        total: Steps to completion.
        label: The bar's label.
        enabled: Whether to show it.
    """
    if not enabled:
        yield lambda k: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda k: bar.advance(task, k)


def run_pcd(
    decider: Decider,
    schema: Any,
    texts: Sequence[str],
    *,
    batch_size: int = 8,
    temperature: float = 1.0,
    progress: bool = False,
    label: str = "PCD",
    examples: Sequence[Any] | None = None,
    calibration: LabelFree | None = None,
    scoring: Scoring = "full",
    pruning: str = "off",
) -> tuple[list[Decision[Any]], list[float]]:
    """Decides every text in batches.

    Args:
        decider: The decider (its calibration, if any, applies).
        schema: The decision schema.
        texts: The texts to decide.
        batch_size: Contexts per pass.
        temperature: Softmax temperature.
        progress: Show a progress bar on stderr.
        label: The progress bar's label.
        examples: Few-shot examples for every call (`decide_many(..., examples=)`), or
            None for the schema's own.
        calibration: The label-free calibration of every call (`"contextual"`,
            `"none"`), or None for the decider's.
        scoring: `"full"`, `"constrained"` or `"pmi"`.
        pruning: `"off"` (the default here: calibration and the raw-confidence metrics
            need every candidate's score), `"auto"` or `"on"` (`Decider.decide`).

    Returns:
        The decisions, and per item the wall time of its batch divided by the batch size
        (with `batch_size=1`, the item's own latency).
    """
    out: list[Decision[Any]] = []
    ms: list[float] = []
    with progress_bar(len(texts), label, progress) as advance:
        for start in range(0, len(texts), batch_size):
            chunk = list(texts[start : start + batch_size])
            t0 = time.perf_counter()
            out.extend(
                decider.decide_many(
                    schema,
                    chunk,
                    temperature=temperature,
                    batch_size=batch_size,
                    examples=examples,
                    calibration=calibration,
                    scoring=scoring,
                    pruning=pruning,  # type: ignore[arg-type]
                )
            )
            each = (time.perf_counter() - t0) * 1e3 / len(chunk)
            ms.extend([each] * len(chunk))
            advance(len(chunk))
    return out, ms
