"""Long inputs: PCD against llama.cpp at each input length (issue 53, item 1).

The sweep lives in the package, `pcd_tools.bench.long_inputs` (what it measures), with this
script's command line in `pcd_tools.cli.long_inputs`; `pcd bench --lengths 256,1024,2048`
runs the same sweep from an installed wheel. The columns and results:
docs/long-inputs-benchmarks.md.

Usage:
    python benchmarks/long_inputs.py --model 1.5b --rounds 3 --texts 2 --json out.json
    python benchmarks/long_inputs.py --lengths 256,1024 --rounds 1 --no-peer   # embedded
    python benchmarks/long_inputs.py --from-json out.json
"""

from __future__ import annotations

from pathlib import Path

from pcd_tools.cli.long_inputs import main

if __name__ == "__main__":
    raise SystemExit(main(benchmarks_dir=Path(__file__).resolve().parent))
