"""The README's one results table: each design at its largest batch on one engine, Llama-3-8B at 128K on the
H200, at the engine grid points that bracket the design's matched rates, the simulator beside each.

    results(root) -> markdown      the block `<!-- generated: results -->`

Inputs, all committed: the engine's rate grid (`traces/engine/h200-rate-grid`, 3 builds in separate processes),
its replay through the simulator's cost model (`traces/validation/h200-engine-rategrid.csv`), the simulator at
the matched rates (`figures/rates.csv`, which `ddbench figures` writes) and the batch-1 rows of
`traces/engine/h200-compare` (the same engine code, 3 separate processes).
"""

from __future__ import annotations

from pathlib import Path
from statistics import median

from ddbench.core.designs import DUALDECODER, DUALDECODER_CACHE, SHADOWKV
from ddbench.doctables.common import ROOT, DocTablesError, read_trace_csv, fmt_num, read_trace_json, md_table

GRID = "engine/h200-rate-grid"
REPLAY = "validation/h200-engine-rategrid.csv"
BATCH1 = "engine/h200-compare"
CTX = 131072
# per design: the engine grid's columns for its rates, and the same rates' columns in figures/rates.csv
AXES = {
    DUALDECODER_CACHE: (("urgent", "forced_urgent_or_miss", "urgent_per_budget"),
                          ("churn", "forced_churn", "churn_per_budget")),
    SHADOWKV: (("miss", "forced_urgent_or_miss", "miss_rate"),),
    DUALDECODER: (("miss", "forced_urgent_or_miss", "miss_rate"),),
}


def bracket(grid: list[float], low: float, high: float) -> tuple[float, float]:
    """The grid points around [low, high]: the largest at or below `low` and the smallest at or above `high`;
    where the grid does not reach that far, its end (then the interval is not bracketed on that side)."""
    g = sorted(set(grid))
    below = [x for x in g if x <= low + 1e-9]
    above = [x for x in g if x >= high - 1e-9]
    return (below[-1] if below else g[0]), (above[0] if above else g[-1])


def _rates(sim, design: str) -> dict:
    """{end: {metric: rate}} of the matched set at factor 1, from figures/rates.csv."""
    out = {}
    for end in ("centre", "low", "high"):
        g = sim[(sim["design"] == design) & (sim["factor"] == 1.0) & (sim["rate_end"] == end)]
        if not len(g):
            raise DocTablesError(f"figures/rates.csv: no simulated {design} at factor 1 ({end})")
        out[end] = {m: float(g[col].iloc[0]) for m, _, col in AXES[design]} | {
            "tok_s": float(g["tok_s"].iloc[0]), "batch": int(g["batch"].iloc[0])}
    return out


def _point(eng, rep, design: str, at: dict, short: set = frozenset()) -> str:
    """The engine's tokens/s at one grid point, median (min-max) over its builds, and the replay beside it."""
    e = eng[(eng["design"] == design) & (eng["context"] == CTX)]
    r = rep[(rep["design"] == design) & (rep["context"] == CTX)]
    for m, col, _ in AXES[design]:
        e = e[(e[col] - at[m]).abs() < 1e-9]
        rcol = "miss_rate" if col == "forced_urgent_or_miss" else "churn_rate"
        r = r[(r[rcol] - at[m]).abs() < 1e-9]
    if not len(e) or not len(r):
        raise DocTablesError(f"traces/{GRID}: no {design} row at {at} (or no replay of it)")
    tok = sorted(float(x) for x in e["tok_s"])
    batch = int(e["batch"].iloc[0])
    sim = batch * 1000.0 / median(float(x) for x in r["sim_step_ms"])
    where = ", ".join(f"{m} {v:.2f}" + (" (the grid's lowest)" if m in short else "") for m, v in at.items())
    return (f"{fmt_num(median(tok), 0)} ({fmt_num(tok[0], 0)}-{fmt_num(tok[-1], 0)}); sim {fmt_num(sim, 0)}"
            f" ({round(100 * (sim / median(tok) - 1)) + 0:+d} %) at {where}")


def _median(eng, design: str, at: dict) -> float:
    e = eng[(eng["design"] == design) & (eng["context"] == CTX)]
    for m, col, _ in AXES[design]:
        e = e[(e[col] - at[m]).abs() < 1e-9]
    return median(float(x) for x in e["tok_s"])


def _grid_ends(eng, design: str, rates: dict) -> tuple[dict, dict]:
    """The grid points at the rates' best (low) and worst (high) ends, and the rates whose low end is below the grid."""
    best, worst, short = {}, {}, set()
    e = eng[(eng["design"] == design) & (eng["context"] == CTX)]
    for m, col, _ in AXES[design]:
        lo, hi = bracket([float(x) for x in e[col].dropna()], rates["low"][m], rates["high"][m])
        best[m], worst[m] = lo, hi
        if lo > rates["low"][m] + 1e-9:
            short.add(m)
        if hi < rates["high"][m] - 1e-9:
            raise DocTablesError(f"traces/{GRID}: {design}'s grid ends below its {m} interval's upper end")
    return best, worst, short


def _batch1(root: Path, design: str) -> str:
    d = read_trace_csv(root / "traces" / BATCH1 / "engine.csv")
    lab = d["design_label"].fillna(d["design"])
    want = f"{design}@8192" if design == DUALDECODER_CACHE else design
    g = d[(lab == want) & (d["batch"] == 1) & (d["context"] == CTX)]
    if not len(g):
        return "not run on this engine"
    row = g.iloc[0]
    rate = (f"urgent {row['miss_rate']:.3f}, churn {row['churn_rate']:.3f}" if design == DUALDECODER_CACHE
            else f"miss {row['miss_rate']:.2f}")
    return (f"{float(row['step_ms']):.2f} ms ({float(row['step_ms_min']):.2f}-{float(row['step_ms_max']):.2f}),"
            f" {rate}")


def source_line() -> str:
    """The rates' source, as the planner prints it for these designs at 128K on the H200."""
    from ddbench.experiments.rates_figure import CAPACITY, MODEL
    from ddbench.experiments.scene import scene
    from ddbench.core import defaults as D
    from ddbench.planner.ratelines import caption
    rs = [scene(MODEL, x, gpu="h200", cache_tokens=CAPACITY * D.BUDGET) for x in AXES]
    return caption(rs, (CTX,))


def results(root: Path = ROOT) -> str:
    eng = read_trace_csv(root / "traces" / GRID / "engine.csv")
    rep = read_trace_csv(root / "traces" / REPLAY)
    rep = rep[rep["source"] == f"traces/{GRID}"]
    figs = read_trace_csv(root / "figures" / "rates.csv")
    sim = figs[figs["source"] == "simulated"]
    meta = read_trace_json(root / "traces" / GRID / "meta.json")
    b1 = read_trace_json(root / "traces" / BATCH1 / "meta.json")
    if "separate processes" not in str(meta.get("builds", "")):
        raise DocTablesError(f"traces/{GRID}/meta.json: the builds are not recorded as separate processes")
    builds = len(meta.get("seeds", ()))
    rows, ends = [], {}
    for design in AXES:
        r = _rates(sim, design)
        best, worst, short = _grid_ends(eng, design, r)
        batch = int(eng[(eng["design"] == design) & (eng["context"] == CTX)]["batch"].iloc[0])
        interval = "; ".join(f"{m} {r['centre'][m]:.3f} [{r['low'][m]:.3f}, {r['high'][m]:.3f}]"
                             for m, _, _ in AXES[design])
        s = f"{fmt_num(r['centre']['tok_s'], 0)} [{fmt_num(r['high']['tok_s'], 0)}, {fmt_num(r['low']['tok_s'], 0)}]"
        if r["centre"]["batch"] != batch:
            s += f" at batch {r['centre']['batch']}"
        ends[design] = (_median(eng, design, best), _median(eng, design, worst))
        rows.append([f"{design}, batch {batch}", interval, _point(eng, rep, design, best, short),
                     _point(eng, rep, design, worst), s, _batch1(root, design)])
    prov = meta.get("provenance", {})
    return (f"The engine (`traces/{GRID}`) on one {prov.get('gpu')} (PCIe 5), Llama-3-8B at 128K, each design at"
            f" its largest batch"
            f" (the cache at 8192 tokens per layer and KV head, 4x the budget); tokens/s as median (min-max) over"
            f" {builds} builds in **separate processes** (own weights, host KV and draws), {str(prov.get('date_utc'))[:10]},"
            f" at the grid points around the matched rates' 95 % interval ({source_line()}); \"sim\" is the simulator's replay of that engine row, NOT fitted to these rows."
            f" The last but one column is simulated at the matched rates themselves: centre [worst end, best end]."
            f" Batch 1: the step time of the same engine code in an earlier run (`traces/{BATCH1}`,"
            f" {str(b1['provenance']['date_utc'])[:10]}; one build, median (min-max) over its replays, at the rates"
            f" it ran at).\n\n"
            + md_table(["design", "matched rates", "engine, best end of the interval", "engine, worst end",
                      "simulated at the matched rates", "TPOT at batch 1"], rows)
            + f"\n\nEngine rows alone: the cache at its worse grid point ({fmt_num(ends[DUALDECODER_CACHE][1], 0)})"
            f" {'is above' if ends[DUALDECODER_CACHE][1] > ends[SHADOWKV][0] else 'is NOT above'} ShadowKV at its"
            f" better one ({fmt_num(ends[SHADOWKV][0], 0)}).")
