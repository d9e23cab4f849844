"""How far the fast compute modes move a model's next-token distributions from float32,
next to llama.cpp's own 8-bit kernels on the same file, and whether a candidate's score
depends on what else shares its pass (issue 31's measured bound, EVAL.md "Compute modes").

Two measurements per GGUF file:

- **Against float32** (the same file, `compute="float32"`), over the next-token
  distributions of the last `--positions` positions of scenario prompts (`--prompts`, cut
  to `--tokens` tokens): `int8`, `bf16` where the CPU has AVX-512 BF16, and llama.cpp
  (llama-cpp-python, `logits_all`) fed the same token ids. Per mode: KL(float32 || mode),
  |delta log p| over float32's top 10 tokens, and the largest |delta p| over the
  vocabulary.
- **Composition.** Per mode, a field of `--codes` tariff codes decided pruned and
  exhaustive (`scoring="constrained"`): the largest |delta log score| over the candidates
  both passes scored. The two passes hold different tokens around each candidate; PCD's
  score must not move with them. In exact arithmetic it cannot; in float32 a different
  summation order moves it by about 1e-6, and 8-bit (or bf16) activations round such a
  difference up to a whole step, which later layers carry on.

Usage:
    .venv/bin/python benchmarks/compute_noise.py --model qwen2.5-coder-1.5b \\
        --json benchmarks/results/compute_noise_1.5b.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compute_agreement import _model_path


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def distance(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Figures between two [positions, vocab] log-probability arrays."""
    p = np.exp(ref)
    kl = (p * (ref - got)).sum(-1)
    top = np.argsort(-ref, -1)[:, :10]
    dtop = np.abs(np.take_along_axis(ref - got, top, -1))
    dp = np.abs(p - np.exp(got)).max(-1)
    return {
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "top10_dlogp_median": float(np.median(dtop)),
        "top10_dlogp_max": float(dtop.max()),
        "max_dp_median": float(np.median(dp)),
        "max_dp_max": float(dp.max()),
    }


TARIFF_TEXT = "Shipment of natural honey in 25 kg drums."


def _tariff_field(n: int) -> Any:
    """A one-field model over the first `n` of the tariff scenario's HS codes."""
    from typing import Literal

    from pydantic import Field, create_model

    from benchmarks.scenarios.tariff import HS_CODES

    codes = tuple(c for c, _ in HS_CODES[:n])
    return create_model(
        "Tariff",
        hs_code=(Literal[codes], Field(description="The 6-digit HS subheading")),  # type: ignore[call-overload]
    )


def _mlx_logp(dec: Any, ids: list[int], positions: int) -> np.ndarray:
    from pcd_tools.engine.host.blas import import_mlx

    mx = import_mlx()
    out = dec.engine.model(mx.array([ids]))
    mx.eval(out)
    return _log_softmax(np.array(out[0, len(ids) - positions : len(ids)]))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pcd_tools import Decider
    from pcd_tools.bench.scenarios import load_scenarios
    from pcd_tools.engine.kernels.qgemm import available_modes

    path = _model_path(args.model)
    scenarios = load_scenarios()
    modes = ["float32", "int8"] + (["bf16"] if "bf16" in available_modes() else [])
    prompts: list[list[int]] = []
    base: dict[str, np.ndarray] = {}
    composition: dict[str, dict[str, float]] = {}
    model_id = ""
    field = _tariff_field(args.codes)
    for mode in modes:
        dec = Decider.load(path, dtype="quantized", compute=mode)
        model_id = dec.model_id
        if not prompts:
            for name in args.prompts.split(","):
                ids = dec.engine.tokenizer.encode(scenarios[name].context)
                if len(ids) < args.tokens:
                    raise SystemExit(
                        f"scenario {name!r} has {len(ids)} tokens; --tokens is {args.tokens}"
                    )
                prompts.append(ids[: args.tokens])
        t0 = time.perf_counter()
        base[mode] = np.concatenate([_mlx_logp(dec, ids, args.positions) for ids in prompts])
        pruned = dec.decide(field, TARIFF_TEXT, scoring="constrained", pruning="on")
        whole = dec.decide(field, TARIFF_TEXT, scoring="constrained", pruning="off")
        zp = np.array(pruned.fields["hs_code"].log_scores)
        zw = np.array(whole.fields["hs_code"].log_scores)
        seen = np.isfinite(zp)
        composition[mode] = {
            "scored_by_both": int(seen.sum()),
            "max_abs_dlog_score": float(np.abs(zp[seen] - zw[seen]).max()),
            "same_label": pruned.fields["hs_code"].label == whole.fields["hs_code"].label,
        }
        print(f"{mode}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        del dec
    against: dict[str, dict[str, float]] = {}
    ref = base["float32"]
    for mode in modes[1:]:
        against[mode] = distance(ref, base[mode])
    if not args.no_llamacpp:
        try:
            from llama_cpp import Llama
        except ImportError:
            print("llama-cpp-python is not installed: no llama.cpp row", file=sys.stderr)
        else:
            llm = Llama(path, n_ctx=args.tokens + 16, logits_all=True, verbose=False, seed=0)
            rows = []
            for ids in prompts:
                llm.reset()
                llm.eval(ids)
                rows.append(_log_softmax(np.array(llm.scores[: len(ids)])[-args.positions :]))
            against["llama.cpp"] = distance(ref, np.concatenate(rows))
    return {
        "model": model_id,
        "prompts": args.prompts.split(","),
        "tokens": args.tokens,
        "positions": args.positions,
        "codes": args.codes,
        "against_float32": against,
        "composition": composition,
    }


def table(out: dict[str, Any]) -> str:
    """Markdown: one row per mode against float32, then the composition rows."""
    lines = [
        f"{out['model']}: {len(out['prompts'])} prompts x {out['positions']} positions "
        f"(calls of {out['tokens']} tokens)",
        "",
        "| against float32 | KL mean | KL max | top-10 abs dlog p, median | max | max abs dp, "
        "median | max |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, d in out["against_float32"].items():
        lines.append(
            f"| {mode} | {d['kl_mean']:.2e} | {d['kl_max']:.2e} | "
            f"{d['top10_dlogp_median']:.4f} | {d['top10_dlogp_max']:.4f} | "
            f"{d['max_dp_median']:.4f} | {d['max_dp_max']:.4f} |"
        )
    lines += [
        "",
        f"Composition: {out['codes']} tariff codes decided pruned and exhaustive.",
        "",
        "| mode | candidates both scored | max abs dlog score | same label |",
        "|---|---|---|---|",
    ]
    for mode, c in out["composition"].items():
        lines.append(
            f"| {mode} | {c['scored_by_both']} | {c['max_abs_dlog_score']:.2e} | "
            f"{'yes' if c['same_label'] else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="a .gguf or a fetched name")
    parser.add_argument("--prompts", default="fraud,security_audit,triage")
    parser.add_argument("--tokens", type=int, default=192)
    parser.add_argument("--codes", type=int, default=64, help="tariff codes in the field")
    parser.add_argument("--positions", type=int, default=64)
    parser.add_argument("--no-llamacpp", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    out = run(args)
    print(table(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
