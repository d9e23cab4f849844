"""`pcd bench`'s scenarios and its memory figure.

The scenarios live in the repository's `benchmarks/scenarios` package (`load_scenarios`).
The memory figure is the peak RSS of one cold request per method, each in a fresh process
(`python -m pcd_tools.bench.scenarios '{"method": ..., "scenario": ...}'`), so that no
method's allocations are counted against another's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["default_scenarios_dir", "load_scenarios", "peak_rss", "probe"]

_PKG_NAME = "pcd_bench_scenarios"


def default_scenarios_dir() -> Path:
    """`benchmarks/scenarios` next to the package (editable install), else under the cwd."""
    beside = Path(__file__).resolve().parent.parent / "benchmarks" / "scenarios"
    here = Path.cwd() / "benchmarks" / "scenarios"
    return beside if (beside / "__init__.py").is_file() or not here.is_dir() else here


def load_scenarios(directory: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Imports the scenarios package and returns its `SCENARIOS` registry.

    Args:
        directory: The `scenarios` package directory; default `default_scenarios_dir()`.

    Raises:
        InvalidArgumentError: if the directory has no `__init__.py` with `SCENARIOS`.
    """
    d = Path(directory) if directory is not None else default_scenarios_dir()
    init = d / "__init__.py"
    if not init.is_file():
        raise InvalidArgumentError(
            f"no benchmark scenarios at {d} (expected a package with __init__.py). "
            "`pcd bench` reads them from the repository's benchmarks/scenarios: run it from an "
            "editable install (`pip install -e .`) or pass --scenarios-dir PATH."
        )
    name = f"{_PKG_NAME}_{abs(hash(str(d.resolve())))}"
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(d)]
        )
        if spec is None or spec.loader is None:  # pragma: no cover - importlib contract
            raise InvalidArgumentError(f"cannot import the scenarios package at {d}.")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
    scenarios = getattr(mod, "SCENARIOS", None)
    if not isinstance(scenarios, dict) or not scenarios:
        raise InvalidArgumentError(f"{init} defines no SCENARIOS registry (a non-empty dict).")
    return scenarios


def _select(scenarios: dict[str, Any], names: list[str] | None) -> list[Any]:
    if not names:
        return list(scenarios.values())
    unknown = [n for n in names if n not in scenarios]
    if unknown:
        raise InvalidArgumentError(f"unknown scenario(s) {unknown}; accepted: {sorted(scenarios)}.")
    return [scenarios[n] for n in names]


def _rss_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def probe(
    method: str, scenario: str, scenarios_dir: str | None = None, model: str | None = None
) -> dict[str, float]:
    """Loads, resets the RSS high-water mark, runs one method once; the child of `peak_rss`.

    Args:
        method: One of `METHODS`.
        scenario: The scenario's name.
        scenarios_dir: The scenarios package directory; default `default_scenarios_dir()`.
        model: The model source for `Decider.load`; default the embedded model.

    Returns:
        `peak_rss_mb` (during the request) and `rss_after_load_mb`.
    """
    import resource

    from ..baselines.generation import constrained_json, greedy_json
    from ..decide.decider import Decider

    sc = _select(load_scenarios(scenarios_dir), [scenario])[0]
    decider = Decider.load(model)
    after_load = _rss_kb("VmRSS") or 0
    reset = False
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
        reset = True
    except OSError:
        pass
    if method == "pcd":
        decider.decide(sc.schema, sc.context)
    elif method == "greedy":
        greedy_json(decider, sc.schema, sc.context)
    else:
        constrained_json(decider, sc.schema, sc.context)
    peak = _rss_kb("VmHWM") if reset else None
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_rss_mb": peak / 1024, "rss_after_load_mb": after_load / 1024}


def peak_rss(
    method: str, scenario: str, scenarios_dir: str | None, model: str | None
) -> dict[str, float]:
    """Peak RSS (MB) of one cold request of `method` in a fresh process, and RSS after load."""
    request = {
        "method": method,
        "scenario": scenario,
        "scenarios_dir": scenarios_dir,
        "model": model,
    }
    cmd = [sys.executable, "-m", "pcd_tools.bench.scenarios", json.dumps(request)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe {method}/{scenario} failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":  # `python -m pcd_tools.bench.scenarios '{"method": ...}'`
    print(json.dumps(probe(**json.loads(sys.argv[1]))))
