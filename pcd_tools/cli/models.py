"""`pcd models`: list the model sources; `--doctor` checks the platform."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import PcdToolsError
from ._common import make_console

HELP = "list model sources; --doctor checks the platform"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `pcd models` options (the dispatcher adds the common ones).

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument(
        "--doctor",
        action="store_true",
        help="device, BLAS and its GFLOP/s, native kernels, decode path, fallbacks, cache dir",
    )


def run(args: argparse.Namespace) -> int:
    """Prints the embedded model, the accepted sources and, with `--doctor`, the platform.

    Args:
        args: The parsed arguments.

    Returns:
        The exit code.
    """
    from ..engine.doctor import doctor

    console = make_console(args)
    info: dict[str, Any] = {}
    try:
        from ..engine.load.sources import EMBEDDED_MODEL_ID, embedded_model_path

        path = embedded_model_path()
        info["embedded"] = {
            "id": EMBEDDED_MODEL_ID,
            "path": str(path),
            "size_mb": round(path.stat().st_size / 2**20, 1),
        }
    except PcdToolsError as e:
        info["embedded"] = {"error": str(e)}
    info["sources"] = [
        "embedded default: Decider.load()",
        "GGUF file (llama, qwen2, qwen3, gemma3, phi3; any quant type): Decider.load('model.gguf')",
        "MLX directory or Hugging Face id via mlx_lm.load: Decider.load('mlx-community/...')",
    ]
    if args.doctor:
        info["doctor"] = doctor()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    from rich.text import Text

    # Paths must stay copyable: no wrapping inside them (soft_wrap leaves long lines to the
    # terminal) and no markup, so a `[` in a path is printed as is.
    emb = info["embedded"]
    console.print(
        Text.assemble(
            ("Embedded model", "bold"),
            f": {emb.get('id', '-')}  {emb.get('path', emb.get('error'))}",
        ),
        soft_wrap=True,
    )
    for s in info["sources"]:
        console.print(f"  - {s}", soft_wrap=True, markup=False)
    if args.doctor:
        for k, v in info["doctor"].items():
            console.print(f"{k:>22}: {v}", soft_wrap=True, markup=False)
    return 0
