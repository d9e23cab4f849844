"""The command line of the long-input sweep's script, `benchmarks/long_inputs.py`.

The sweep lives in `pcd_tools.bench.long_inputs` (which see for what it measures);
`pcd bench --lengths` runs it too (`pcd_tools.cli.bench`). This module keeps the script's
own options (argparse lives only in `pcd_tools.cli`) and its naming of `--model`
(`resolve_model`: `0.5b` / `1.5b` name the shared models of `benchmarks/model_size.py`).

Usage:
    python benchmarks/long_inputs.py --model 1.5b --rounds 3 --texts 2 --json out.json
    python benchmarks/long_inputs.py --lengths 256,1024 --rounds 1 --no-peer   # embedded
    python benchmarks/long_inputs.py --from-json out.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..bench import long_inputs
from ..errors import InvalidArgumentError

__all__ = ["main", "resolve_model"]


def resolve_model(
    name: str | None, benchmarks_dir: str | os.PathLike[str] | None = None
) -> str | None:
    """A GGUF path, `embedded` / `0.5b` / `1.5b` (the shared models), or any source
    `Decider.load` takes; None loads the embedded model. The script's naming of `--model`.

    Args:
        name: The model's name.
        benchmarks_dir: The repository's `benchmarks` folder, whose `model_size.model_file`
            finds the shared models; default the folder of `benchmarks/scenarios`
            (`scenarios.default_scenarios_dir`).

    Raises:
        InvalidArgumentError: for `0.5b` / `1.5b` without `benchmarks/model_size.py`, or
            when the model has not been fetched (`model_file` says how, above).
    """
    if not name or name == "embedded":
        return None
    if Path(name).exists():
        return name
    if name in ("0.5b", "1.5b"):
        from ..bench.scenarios import default_scenarios_dir

        folder = Path(benchmarks_dir) if benchmarks_dir else default_scenarios_dir().parent
        path = _model_size(folder, name).model_file(name)
        if path is None:
            raise InvalidArgumentError(f"no model {name!r}: fetch it first (see above)")
        return str(path)
    return name


def _model_size(folder: Path, name: str) -> Any:
    """The repository's `benchmarks/model_size.py`, imported from `folder`."""
    path = folder / "model_size.py"
    spec = importlib.util.spec_from_file_location("pcd_bench_model_size", path)
    if not path.is_file() or spec is None or spec.loader is None:
        raise InvalidArgumentError(
            f"--model {name} names a shared model through the repository's "
            f"benchmarks/model_size.py, not found at {path}; pass the model's GGUF path."
        )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up while it runs
    spec.loader.exec_module(mod)
    return mod


def main(
    argv: list[str] | None = None, *, benchmarks_dir: str | os.PathLike[str] | None = None
) -> int:
    """The script: measures the sweep, prints its tables (and writes `--json`).

    Args:
        argv: The arguments; default `sys.argv[1:]`.
        benchmarks_dir: The repository's `benchmarks` folder (the script passes its own):
            the default `--scenarios-dir` is its `scenarios`, and `resolve_model` reads its
            `model_size.py`; default where `pcd bench` finds `benchmarks/scenarios`.

    Returns:
        0; a bad option exits 2 with `error: ...` (argparse).
    """
    ap = argparse.ArgumentParser(description=(long_inputs.__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", default="embedded", help="GGUF path, embedded, 0.5b or 1.5b")
    ap.add_argument("--compute", default="auto", help="Decider.load's compute (default auto)")
    ap.add_argument(
        "--lengths",
        default=",".join(map(str, long_inputs.DEFAULT_LENGTHS)),
        help="context tokens, comma-separated",
    )
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per text and length")
    ap.add_argument("--texts", type=int, default=1, help="different texts per length")
    ap.add_argument("--schema", choices=long_inputs.SCHEMAS, default="small")
    ap.add_argument(
        "--scenarios-dir",
        default=None,
        help="path of benchmarks/scenarios, where --schema triage is read from (default: "
        "beside this script)",
    )
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds at the first length")
    ap.add_argument("--warmup-each", action="store_true", help="warm up at every length")
    ap.add_argument(
        "--threads", type=int, default=0, help="both sides' threads (default the thread budget)"
    )
    ap.add_argument("--no-peer", action="store_true", help="leave llama.cpp out")
    ap.add_argument("--json", type=Path, help="write the results (after each length)")
    ap.add_argument("--from-json", type=Path, help="print the tables of an earlier --json")
    args = ap.parse_args(argv)
    if args.from_json:
        print(long_inputs.table(json.loads(args.from_json.read_text())))
        return 0
    try:
        lengths = long_inputs.parse_lengths(args.lengths)
    except InvalidArgumentError as e:
        ap.error(str(e))
    if args.rounds < 1 or args.texts < 1 or args.warmup < 0 or args.threads < 0:
        ap.error("--rounds and --texts must be >= 1, --warmup and --threads >= 0")
    scenarios_dir = args.scenarios_dir
    if scenarios_dir is None and benchmarks_dir is not None:
        scenarios_dir = str(Path(benchmarks_dir) / "scenarios")
    try:  # the option errors, before the model loads
        long_inputs.schema_of(args.schema, scenarios_dir)
        source = resolve_model(args.model, benchmarks_dir)
    except InvalidArgumentError as e:
        ap.error(str(e))
    options = long_inputs.SweepOptions(
        lengths=tuple(lengths),
        model=source,
        compute=args.compute,
        schema=args.schema,
        rounds=args.rounds,
        texts=args.texts,
        warmup=args.warmup,
        warmup_each=args.warmup_each,
        threads=args.threads,
        no_peer="--no-peer" if args.no_peer else None,
        json=args.json,
        scenarios_dir=scenarios_dir,
    )
    out = long_inputs.run(options)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    print(long_inputs.table(out))
    return 0
