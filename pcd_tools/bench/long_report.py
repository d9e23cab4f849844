"""The long-input sweep's report (`pcd_tools.bench.long_inputs`): each length's summary of
its raw rounds (`summarize`), the growth from length to length (`growth`), and the whole
sweep's JSON as Markdown tables (`table`: the times, ratios, growth and answers per length,
then the rates, tokens per second, G op/s and their share of the int8 peak, and each
method's peak RSS).
"""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["METHODS", "growth", "summarize", "table"]

# The sweep's methods, in the report's order (`long_inputs.Sweep` runs them).
METHODS = ("pcd_warm", "pcd_cold", "pcd_floor", "llama_eval", "llama_decision")


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def summarize(
    tokens: int, rounds: list[dict[str, Any]], sweep_info: dict[str, Any]
) -> dict[str, Any]:
    """One length's summary from its raw rounds (`rounds[i]["methods"][m]` rows)."""
    from .flops import Arithmetic

    ar, peak = sweep_info.get("arithmetic"), sweep_info.get("int8_peak_gops")
    cached, tail = sweep_info["schema_tokens"], sweep_info["tail_tokens"]
    out: dict[str, Any] = {"tokens": tokens, "rounds": rounds, "methods": {}, "ratios": {}}
    out["actual_tokens"] = sorted({r["actual_tokens"] for r in rounds})
    n = statistics.median(r["actual_tokens"] for r in rounds)
    # the floor's and llama.cpp eval's work: context and answer start after the schema part
    ops = Arithmetic(**ar).prefill(int(n) + tail, cached, head_positions=1) if ar else None
    out["prefill_gop"] = ops / 1e9 if ops else None
    names = [m for m in METHODS if all(m in r["methods"] for r in rounds)]
    for m in names:
        rows = [r["methods"][m] for r in rounds]
        ms = [x["ms"] for x in rows]
        st: dict[str, Any] = {"ms": ms, **{f"ms_{k}": v for k, v in _stats(ms).items()}}
        st["tokens_per_s"] = n / (st["ms_median"] / 1e3)
        if ops and m in ("pcd_floor", "llama_eval"):
            st["gops"] = ops / 1e9 / (st["ms_median"] / 1e3)
            if peak:
                st["peak_share"] = st["gops"] / peak
        st["peak_rss_mb"] = max(x["peak_rss_mb"] for x in rows)
        att = [x["attention_ms"] for x in rows if "attention_ms" in x]
        if att:
            st["attention_ms"] = statistics.median(att)
        out["methods"][m] = st
    if "pcd_warm" in names:
        warm = [r["methods"]["pcd_warm"] for r in rounds]
        out["answers"] = [w["answer"] for w in warm]
        out["warm_hits"] = all(w["hit"] for w in warm)
        for m in ("llama_eval", "llama_decision"):
            if m in names:
                ratios = [r["methods"][m]["ms"] / r["methods"]["pcd_warm"]["ms"] for r in rounds]
                out["ratios"][f"{m}/pcd_warm"] = _stats(ratios)
        if "llama_decision" in names:
            same, total = 0, 0
            for r in rounds:
                a, b = r["methods"]["pcd_warm"]["answer"], r["methods"]["llama_decision"]["answer"]
                same += sum(b is not None and b.get(k) == v for k, v in a.items())
                total += len(a)
            out["llama_agreement"] = same / max(1, total)
            out["llama_valid"] = all(r["methods"]["llama_decision"]["valid"] for r in rounds)
    return out


def growth(lengths: list[dict[str, Any]]) -> None:
    """Adds each length's time growth from the previous measured length (PCD warm, the
    floor, llama.cpp's eval and decision), beside the growth of the tokens."""
    prev = None
    for row in lengths:
        if "methods" not in row:
            continue
        if prev is not None:
            row["growth"] = {"tokens": row["tokens"] / prev["tokens"]}
            for m, st in row["methods"].items():
                if m in prev["methods"]:
                    row["growth"][m] = st["ms_median"] / prev["methods"][m]["ms_median"]
        prev = row


# --- the table ---------------------------------------------------------------------------------


def _ms(st: dict[str, Any] | None) -> str:
    if not st:
        return "-"
    return f"{st['ms_median']:,.0f} ({st['ms_min']:,.0f}-{st['ms_max']:,.0f})"


def _ratio(r: dict[str, float] | None) -> str:
    return f"**{r['median']:.2f}x** ({r['min']:.2f}-{r['max']:.2f})" if r else "-"


def _gops(st: dict[str, Any] | None) -> str:
    if not st or "gops" not in st:
        return "-"
    share = f" ({st['peak_share']:.0%})" if "peak_share" in st else ""
    return f"{st['gops']:,.0f}{share}"


def _answer(row: dict[str, Any]) -> str:
    answers = row.get("answers") or []
    if not answers:
        return "-"
    if len(answers[0]) <= 3:
        seen: list[str] = []
        for a in answers:
            s = "/".join(str(v) for v in a.values())
            if s not in seen:
                seen.append(s)
        text = "; ".join(seen)
    else:
        text = f"{len(answers[0])} fields"
    if "llama_agreement" in row:
        text += f" ({row['llama_agreement']:.0%} same in llama.cpp"
        text += ")" if row.get("llama_valid", True) else ", some invalid)"
    return text


def table(out: dict[str, Any]) -> str:
    m = out["machine"]
    flags = ", ".join(k for k, v in m["flags"].items() if v) or "none of the listed"
    peak = f"; int8 peak {out['int8_peak_gops']:,.0f} G op/s" if out.get("int8_peak_gops") else ""
    if peak and out.get("int8_peak_path"):
        peak += f" ({out['int8_peak_path']})"
    commit_s = (out.get("commit") or "?")[:10] + (" (dirty)" if out.get("dirty") else "")
    lines = [
        f"{out['model']} ({out['compute']}), schema {out['schema']} ({out['fields']} fields, "
        f"{out['schema_tokens']} cached tokens), threads PCD {out['threads']['pcd']} / llama.cpp "
        f"{out['threads']['llama_cpp'] or '-'}; {m['model_name'] or m['processor']} ({flags}){peak}; "
        f"{commit_s}, {out['when']}; {out['texts']} text(s) x {out['rounds']} round(s) per length",
    ]
    if out.get("peer"):
        lines.append(f"({out['peer']})")
    lines += [
        "",
        "ms, median (min-max):",
        "",
        "| context tokens | PCD warm | PCD cold | PCD floor | llama.cpp eval | llama.cpp decision "
        "| eval / PCD warm | decision / PCD warm | PCD warm growth (tokens) | answer |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rates = [
        "",
        "rates and memory:",
        "",
        "| context tokens | tokens/s: PCD warm, floor, llama.cpp eval, decision | G op/s (of int8 peak): "
        "PCD floor | llama.cpp eval | PCD warm attention ms | peak RSS MiB: warm, cold, floor, eval, decision |",
        "|---|---|---|---|---|---|",
    ]
    for row in out["lengths"]:
        if "methods" not in row:
            lines.append(f"| {row['tokens']:,} | {row['skipped']} |" + " |" * 8)
            continue
        ms = row["methods"]
        tok = ", ".join(f"{a:,}" for a in row["actual_tokens"])
        g = row.get("growth")
        grow = f"{g['pcd_warm']:.2f}x ({g['tokens']:.2f}x)" if g and "pcd_warm" in g else "-"
        lines.append(
            f"| {tok} | {_ms(ms.get('pcd_warm'))} | {_ms(ms.get('pcd_cold'))} | "
            f"{_ms(ms.get('pcd_floor'))} | {_ms(ms.get('llama_eval'))} | "
            f"{_ms(ms.get('llama_decision'))} | {_ratio(row['ratios'].get('llama_eval/pcd_warm'))} | "
            f"{_ratio(row['ratios'].get('llama_decision/pcd_warm'))} | {grow} | {_answer(row)} |"
        )

        tps = ", ".join(
            f"{ms[m]['tokens_per_s']:,.0f}" if m in ms else "-"
            for m in ("pcd_warm", "pcd_floor", "llama_eval", "llama_decision")
        )
        att = ms.get("pcd_warm", {}).get("attention_ms")
        rss = ", ".join(
            f"{ms[m]['peak_rss_mb']:,.0f}" if m in ms else "-"
            for m in ("pcd_warm", "pcd_cold", "pcd_floor", "llama_eval", "llama_decision")
        )
        rates.append(
            f"| {tok} | {tps} | {_gops(ms.get('pcd_floor'))} | {_gops(ms.get('llama_eval'))} | "
            f"{f'{att:,.0f}' if att is not None else '-'} | {rss} |"
        )
    return "\n".join(lines + rates)
