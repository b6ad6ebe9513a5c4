"""The engine's and the simulator's tables: the first engine's headline (docs/results.md), the validation, the engine's
floor, transfers and mechanism ratios, the paper points, the chunk cache and fp8."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ddbench.core.designs import DUALDECODER, DUALDECODER_CACHE, DUALDECODER_FIFO, FULL_KV, SHADOWKV, SPECACHE
from ddbench.core.errors import DDBenchError
from ddbench.doctables.common import (CALIBRATION_SWEEP, CTX, DESIGNS, ENGINE_MODEL, ROOT, VALIDATION_SWEEP,
                                      read_trace_csv, read_engine_csv, read_trace_json, fmt_context, is_present, own_step_rows, fmt_pct, sweep_provenance, fmt_spread, read_engine_sweep,
                                      md_table)
from ddbench.kernels.engine.tables import MECHANISM     # the sweep summary's mechanism ratios: key prefix, label


def headline(root: Path = ROOT) -> str:
    rates = read_engine_csv(root / "traces" / "engine" / "h200-rates" / "engine.csv")
    one = rates[(rates["batch"] == 1) & (rates["model"] == ENGINE_MODEL.lower())]

    fused = _fused_fill_batch1(root)

    def tpot(d):
        out = []
        for c in (32768, 131072):
            src = fused if d == DUALDECODER_CACHE else one
            g = src[(src["design"] == d) & (src["context"] == c)]
            if not len(g):
                out.append("not run")
                continue
            knobs = {}
            if d == DUALDECODER_CACHE:
                knobs = {"cache_tokens": int(g["cache_tokens"].iloc[0]),
                         "forced_cache": (float(g["churn_rate"].iloc[0]), float(g["miss_rate"].iloc[0]))}
            sim = 1e3 / _sim_tok_s(d, ENGINE_MODEL.lower(), c, 1, **knobs)
            med = float(g["step_ms"].median())
            out.append(f"{fmt_spread(list(g['step_ms']), 2)}; sim {sim:.2f} ({sim / med - 1:+.0%})")
        return out
    cal, cal_meta = read_engine_sweep(root, CALIBRATION_SWEEP)
    val, val_meta = read_engine_sweep(root, VALIDATION_SWEEP)
    floor = cal[(cal["phase"] == "floor") & (cal["context"] == CTX) & (cal["miss_rate"].astype(str) == "none")]
    both = [cal[cal["phase"] == "validation"], val[val["phase"] == "validation"]]
    rows = []
    for d in DESIGNS:
        f = floor[floor["design"] == d]
        maxb = int(f["model_max_batch"].iloc[0]) if len(f) else None
        f16 = own_step_rows(f[f["batch"] == 16])
        ok16 = f16[f16["status"] == "ok"]
        if len(ok16):
            tok16, sof16 = fmt_spread(list(ok16["tok_s"]), 0), fmt_spread(list(ok16["step_over_floor"]), 2)
        elif len(f16):
            tok16, sof16 = f"does not fit ({f16['status'].iloc[0]})", "-"
        else:
            tok16, sof16 = "not run", "-"
        t = []
        for v in both:
            t.append(v[(v["design"] == d) & (v["context"] == CTX) & (v["batch"] == 32) & (v["transfers"] == 1)
                       & (v["miss_rate"].astype(str) == "0.25") & (v["status"] == "ok")])
        tok = [x for part in t for x in part["tok_s"]]
        gbps = [x for part in t for x in part["link_gbps"]]
        rows.append([d, str(maxb) if maxb is not None else "-", tok16, sof16,
                     fmt_spread(tok, 0) if tok else "not run", fmt_spread(gbps, 1) if gbps else "-"] + tpot(d))
    rows.append([DUALDECODER_CACHE, "-", "-", "-", "-", "-"] + tpot(DUALDECODER_CACHE))
    table = md_table(["design", "max batch (memory model)", "compute only, batch 16: tokens/s",
                    "step / HBM floor", "with transfers, batch 32, 25 % misses: tokens/s", "link GB/s",
                    "TPOT at batch 1, 32K: ms", "TPOT at batch 1, 128K: ms"], rows)
    head = (f"Decode-step engine on one NVIDIA H200 (PCIe 5), {ENGINE_MODEL} at {fmt_context(CTX)} tokens of context, "
            f"from {sweep_provenance(CALIBRATION_SWEEP, cal_meta)} and {sweep_provenance(VALIDATION_SWEEP, val_meta)}; the batch-1 TPOT"
            " from `traces/engine/h200-rates` (3 builds, 12 % misses); dualdecoder-cache's from"
            " `traces/engine/h200-cache-int32` (3 builds, the current engine: the fill's int32 keys, pass 1's 16 splits; 4x the budget, the rates it ran at). Compute only: CUDA-graph steps with no host reads; with transfers: misses forced"
            " at 25 % and fetched over PCIe. ShadowKV's compute-only and transfer columns are the engine before"
            " its in-place step; its TPOT and every table below are the in-place one.")
    return "\n\n".join([head, table, validation_line(root)])


def _fused_fill_batch1(root: Path) -> pd.DataFrame:
    """dualdecoder-cache's batch-1 steps with transfers on the current engine (devtools/devcheck_cachefill.py's
    rows, traces/engine/h200-cache-int32/batch1.json)."""
    from ddbench.core.io import read_json_object
    path = root / "traces" / "engine" / "h200-cache-int32" / "batch1.json"
    rows = read_json_object(path, "the fused fill's engine steps").get("rows", [])
    df = pd.DataFrame([r for r in rows if r.get("kind") == "engine" and r.get("fill") == "fused"
                       and r.get("transfers") == 1 and r.get("batch") == 1 and r.get("status") == "ok"])
    if df.empty:
        raise DDBenchError(f"{path}: no fused-fill batch-1 rows with transfers")
    return df


def _validation_rows(root: Path):
    v = read_trace_csv(root / "traces" / "validation" / "h200-engine.csv")
    v = v.assign(err=(v["sim_over_engine"] - 1).abs())
    return v


def _heldout_rows(root: Path):
    path = root / "traces" / "validation" / "h200-engine-heldout.csv"
    if not path.exists():
        return None
    v = read_trace_csv(path)
    return v.assign(err=(v["sim_over_engine"] - 1).abs())


def validation_line(root: Path = ROOT) -> str:
    h = _heldout_rows(root)
    held = "" if h is None else (
        f" Held out (Qwen2.5-14B/32B shapes, never fitted, {len(h)} points):"
        f" median {fmt_pct(float(h['err'].median()))}, worst {fmt_pct(float(h['err'].max()))}.")
    return _validation_line(root) + held


def _validation_line(root: Path) -> str:
    v = _validation_rows(root)
    parts = []
    for regime in ("link-bound", "overlap", "compute-only"):
        g = v[v["regime"] == regime]
        if len(g):
            parts.append(f"{regime} {fmt_pct(float(g['err'].median()))} ({len(g)} points, worst {fmt_pct(float(g['err'].max()))})")
    return ("Simulator against the engine (`traces/validation/`: the separate seed-1 run replayed through the cost"
            f" model every command uses, fitted to the seed-0 run's kernels, {len(v)} points), median |error| by"
            " regime: " + "; ".join(parts) + ".")


def _regime_table(v, label) -> str:
    rows = []
    for regime in ("link-bound", "overlap", "compute-only"):
        g = v[v["regime"] == regime]
        if not len(g):
            continue
        w = g.loc[g["err"].idxmax()]
        who = label(w)
        worst = (f"{fmt_pct(float(w['err']))} ({who}{w['design']} {fmt_context(int(w['context']))} batch {int(w['batch'])}: "
                 f"engine {w['engine_step_ms']:.2f} ms, sim {w['sim_step_ms']:.2f} ms)")
        rows.append([regime, str(len(g)), fmt_pct(float(g["err"].median())), worst,
                     f"{float(g['sim_over_engine'].median()):.3f}"])
    return md_table(["regime", "points", "median \\|error\\|", "worst", "sim / engine, median"], rows)


def validation(root: Path = ROOT) -> str:
    v = _validation_rows(root)
    t = v[v["transfers"] == 1]
    exact = int((t["link_bytes_diff"] == 0).sum())
    out = (_regime_table(v, lambda w: "") +
           f"\n\nLink bytes per step equal to the byte at {exact} of {len(t)} points with transfers.")
    h = _heldout_rows(root)
    if h is not None:
        per = [[d, str(len(g)), fmt_pct(float(g["err"].median())), fmt_pct(float(g["err"].max()))]
               for d, g in h.groupby("design")]
        out += ("\n\nHeld out (`h200-engine-heldout.csv`: the paper-points run, Qwen2.5-14B and 32B shapes under an"
                " 80 GB cap, replayed with the cost model fitted to Llama-3-8B only):\n\n"
                + _regime_table(h, lambda w: f"{w['model']} ") + "\n\n"
                + md_table(["design", "points", "median \\|error\\|", "worst"], per))
    return out


def engine_floor(root: Path = ROOT) -> str:
    cal, meta = read_engine_sweep(root, CALIBRATION_SWEEP)
    f = cal[(cal["phase"] == "floor") & (cal["miss_rate"].astype(str) == "none")]
    batches = sorted(f["batch"].unique())
    rows = []
    for d in DESIGNS[::-1]:
        for tokens in sorted(f[f["design"] == d]["tokens"].unique(), reverse=True):
            label = d + (", one query token" if d == DUALDECODER and tokens == 1 else "")
            for c in sorted(f["context"].unique()):
                cells = []
                for b in batches:
                    r = f[(f["design"] == d) & (f["tokens"] == tokens) & (f["context"] == c) & (f["batch"] == b)]
                    if not len(r):
                        cells.append("not run")
                    elif r["status"].iloc[0] != "ok":
                        cells.append(str(r["status"].iloc[0]))
                    else:
                        r = r.iloc[0]
                        cells.append(f"{r['step_ms']:.2f} / {r['floor_ms']:.2f} ms (**{r['step_over_floor']:.2f}**)")
                rows.append([label, fmt_context(int(c))] + cells)
    return (f"Compute-only steps against their HBM floor, from {sweep_provenance(CALIBRATION_SWEEP, meta)}:\n\n"
            + md_table(["design", "context"] + [f"batch {b}: step / floor" for b in batches], rows))


def engine_transfers(root: Path = ROOT) -> str:
    cal, cal_meta = read_engine_sweep(root, CALIBRATION_SWEEP)
    val, val_meta = read_engine_sweep(root, VALIDATION_SWEEP)
    both = [x[(x["phase"] == "validation") & (x["transfers"] == 1) & (x["status"] == "ok")] for x in (cal, val)]
    designs = [d for d in (DUALDECODER, DUALDECODER_FIFO, SHADOWKV, SPECACHE)
               if any(len(x[x["design"] == d]) for x in both)]
    rows = []
    for c in sorted(both[0]["context"].unique()):
        for b in sorted(both[0]["batch"].unique()):
            cells = []
            for d in designs:
                pick = [x[(x["design"] == d) & (x["context"] == c) & (x["batch"] == b)
                          & (x["miss_rate"].astype(str) == "0.25")] for x in both]
                tok = [v for p in pick for v in p["tok_s"]]
                util = [v for p in pick for v in p["link_util"]]
                cells.append(f"{fmt_spread(tok, 0, runs=False)} tok/s, link {fmt_spread([100 * u for u in util], 0, runs=False)} %"
                             if tok else "not run")
            rows.append([fmt_context(int(c)), str(int(b))] + cells)
    return (f"Whole decode steps with transfers (25 % of the chunks missed and fetched urgently), {ENGINE_MODEL}; "
            f"median (min-max) over the two runs {sweep_provenance(CALIBRATION_SWEEP, cal_meta)} and "
            f"{sweep_provenance(VALIDATION_SWEEP, val_meta)}:\n\n"
            + md_table(["context", "batch"] + designs, rows))


def _point(key: str, prefix: str) -> tuple[tuple, str]:
    rest = key[len(prefix):].strip("_")
    m = re.fullmatch(r"b(\d+)(?:_m([0-9.]+))?", rest or "b16")
    if not m:
        return (0, 0.0), rest
    b, miss = int(m.group(1)), m.group(2)
    return (b, float(miss or 0)), f"batch {b}" + (f", {100 * float(miss):.1f} % misses" if miss else "")


def engine_mechanism(root: Path = ROOT) -> str:
    s = read_trace_json(root / "traces" / CALIBRATION_SWEEP / "summary.json")
    mech = s["ratios"]["mechanism"]
    rows = []
    for prefix, label in MECHANISM:
        keys = [k for k in mech if k == prefix or (k.startswith(prefix + "_b") and not prefix.endswith("_b16"))]
        for key in sorted(keys, key=lambda k: _point(k, prefix)[0]):
            v = mech[key]
            if not v:
                continue
            point = _point(key, prefix)[1]
            clear = "yes" if v.get("clear") else "no"
            if prefix == "exposed_share":
                clear = "-"
            rows.append([label, point, f"{v['median']:.3f} ({v['min']:.3f}-{v['max']:.3f})", str(v["n"]), clear])
    meta = read_trace_json(root / "traces" / CALIBRATION_SWEEP / "meta.json")
    return (f"{ENGINE_MODEL} at {fmt_context(CTX)}, from {sweep_provenance(CALIBRATION_SWEEP, meta)}; median (min-max) over the "
            "repetitions; larger than spread: |median - 1| > max - min:\n\n"
            + md_table(["ratio", "point", "median (min-max)", "n", "larger than spread?"], rows))




def _sim_tok_s(design: str, model: str, context: int, batch: int, **knobs) -> float:
    """`ddbench simulate`'s cost model on the H200 at one point (the engine's batch, 12 % misses)."""
    from ddbench.experiments.sim_figures import step_plan
    from ddbench.sim.run import run
    hit = None if design == FULL_KV else 0.88
    return batch / run(step_plan(design, model, context, batch, hit=hit, gpu="h200", **knobs), "timeline", steps=6,
                       warmup=2).steady_step_s


def paper_points(root: Path = ROOT) -> str:
    """Figure 12's points measured on the engine under an 80 GB cap (3 independently built engines at
    each design's largest batch), the simulator at the same points, and its replay of Figure 12."""
    s = read_trace_json(root / "traces" / "engine" / "h200-paper" / "summary.json")
    sim = read_trace_csv(root / "figures" / "fig12.csv")
    held = _heldout_rows(root)
    got = {(p["context"], p["design"]): p for p in s["paper"] if p["model"] == "qwen2.5-32b"}
    from ddbench.experiments.engine_points import inplace_shadowkv
    got.update({(c, d): p for (m, c, d), p in inplace_shadowkv(root / "traces").items()
                if m == "qwen2.5-32b"})                  # ShadowKV as the engine runs it now (issue 31)

    def measured(c, d):
        p = got.get((c, d))
        b = (p or {}).get("builds_tok_s")
        if not b:
            return None, "does not fit" if p and not p.get("largest_batch") else "-"
        return b, f"{b['median']:.1f} ({b['min']:.1f}-{b['max']:.1f}), batch {p['largest_batch']}"

    def at_point(c, d):
        p = got.get((c, d))
        if p and p.get("inplace"):
            return _sim_tok_s(d, "qwen2.5-32b", c, p["largest_batch"])
        if held is None or not p or not p.get("largest_batch"):
            return None
        r = held[(held["model"] == "qwen2.5-32b") & (held["context"] == c) & (held["design"] == d)
                 & (held["batch"] == p["largest_batch"]) & (held["rep"] == 0)]
        return float(p["largest_batch"] / r["sim_step_ms"].iloc[0] * 1e3) if len(r) else None

    def simulated(c, d):
        r = sim[(sim["context"] == c) & (sim["system"] == d)]
        if not len(r) or bool(r["oom"].iloc[0]):
            return None
        return float(r.iloc[0]["tokens_per_s"])

    rows = []
    for c in sorted({c for c, _ in got}):
        (dd, dd_t), (sk, sk_t) = measured(c, DUALDECODER), measured(c, SHADOWKV)
        ratio = (f"{dd['median'] / sk['median']:.2f} ({dd['min'] / sk['max']:.2f}-{dd['max'] / sk['min']:.2f})"
                 if dd and sk else "-")
        pdd, psk = at_point(c, DUALDECODER), at_point(c, SHADOWKV)
        pt = f"{pdd:.1f} / {psk:.1f} = {pdd / psk:.2f}" if pdd and psk else "-"
        sdd, ssk = simulated(c, DUALDECODER), simulated(c, SHADOWKV)
        rt = f"{sdd:.1f} / {ssk:.1f} = {sdd / ssk:.2f}" if sdd and ssk else "-"
        rows.append([fmt_context(c), dd_t, sk_t, ratio, pt, rt])
    n = max((p.get("builds_tok_s") or {}).get("n", 0) for p in got.values())
    return ("Qwen2.5-32B under an 80 GB cap on the H200 engine (`traces/engine/h200-paper`; ShadowKV as the engine"
            " runs it in place: `traces/engine/h200-shadowkv-fast/paper-80gb` at 64K and 128K,"
            f" `traces/engine/h200-rates` at 256K): each design at its largest batch, 12 % forced misses; tokens/s"
            f" median (min-max) over {n} builds in one process (the same weights; host KV and forced draws reseeded); the ratio's range pairs the extremes), the"
            " simulator at the same points (`ddbench simulate`'s cost model on the H200 at the engine's batch and"
            " miss rate; DualDecoder's from `traces/validation/h200-engine-heldout.csv`), and its replay of Figure 12"
            " (`figures/fig12.csv`: an 80 GB H100, each design's largest batch by the memory model, the profile's"
            " hit and reuse rates). The paper reports DualDecoder 2.62x ShadowKV at 128K.\n\n"
            + md_table(["context", "engine: dualdecoder", "engine: shadowkv", "engine: dd / shadowkv",
                      "simulated at the engine's points: dd / shadowkv", "Fig. 12 replay: dd / shadowkv"], rows))


def cache(root: Path = ROOT) -> str:
    """dualdecoder-cache against ShadowKV and DualDecoder (figures/cache.csv): each at its largest batch,
    simulated at one matched rate set, beside the current engine's matched-rate run (traces/engine/h200-rate-grid)
    at its grid points around those rates, where it ran the design."""
    d = read_trace_csv(root / "figures" / "cache.csv")
    e, s = d[d["source"] == "engine"], d[d["source"] == "simulated"]
    rows, gains = [], []
    for c in sorted(e["context"].unique()):
        at_s = s[s["context"] == c]
        for name in (SHADOWKV, DUALDECODER, DUALDECODER_CACHE):
            sim = at_s[(at_s["design"] == name) & ((at_s["capacity"] == 4) if name == DUALDECODER_CACHE else True)]
            sim = sim.iloc[0]
            eng = e[(e["context"] == c) & (e["design"] == name)]
            ends = [f"{r['tok_s']:,.0f} ({r['tok_s_min']:,.0f}-{r['tok_s_max']:,.0f}, {int(r['builds'])}) at"
                    f" {r['grid_point']}" for _, r in eng.iterrows()]
            label = "dualdecoder-cache 4x" if name == DUALDECODER_CACHE else name
            rows.append([fmt_context(c), label, f"{int(sim['batch'])}", f"{sim['tok_s']:,.0f}", f"{sim['link_mib_per_token']:.1f}",
                         f"{int(eng['batch'].iloc[0])}" if len(eng) else "-", " / ".join(dict.fromkeys(ends)) or "-"])
        cc = at_s[(at_s["design"] == DUALDECODER_CACHE) & (at_s["capacity"] == 4)].iloc[0]
        gains.append(f"{fmt_context(c)} {cc['tok_s'] / at_s[at_s['design'] == SHADOWKV].iloc[0]['tok_s']:.2f}x")
    g = "; ".join(gains)
    t = d[d["source"] == "simulated-tight"]
    tight = []
    for c in sorted(t["context"].unique()):
        at = t[t["context"] == c]
        cc = at[at["design"] == DUALDECODER_CACHE]
        b = cc.loc[cc["tok_s"].idxmax()]
        parts = [f"dualdecoder-cache {b['capacity']:g}x {b['tok_s']:.0f} (batch {int(b['batch'])})"]
        parts += [f"{n} {r['tok_s']:.0f} ({int(r['batch'])})" for n in (SHADOWKV, DUALDECODER)
                  for r in [at[at["design"] == n].iloc[0]]]
        tight.append(f"{fmt_context(c)}: " + ", ".join(parts))
    tight_line = ("\n\nMemory-tight, simulated (Qwen2.5-32B on an 80 GB H100, each at the memory model's largest"
                  " batch), tokens/s: " + "; ".join(tight) + "." if tight else "")
    return ("Llama-3-8B on one H200, each design at its largest batch by the memory model, SIMULATED by `ddbench"
            " simulate` at one matched rate set (the cache at 4x the budget; every capacity in `figures/cache.csv`),"
            " beside the current engine's matched-rate run (`traces/engine/h200-rate-grid`, builds in separate"
            " processes): tokens/s median (min-max, builds) at its grid points just below and above the matched"
            " rates, where it ran the design (ShadowKV and DualDecoder at 128K only). Cache / ShadowKV, simulated:"
            f" {g}.\n\n"
            + md_table(["context", "design", "batch", "simulated tokens/s", "link MiB / token (simulated)",
                      "engine batch", "engine tokens/s, below / above the rates"], rows) + tight_line + _margin(root))


def _margin(root: Path) -> str:
    """The 128K verdict's margin from figures/rates.csv: the factor on the cache's rates at which its
    simulated tokens/s equals ShadowKV's at ShadowKV's own rates (linear between the figure's factors)."""
    path = root / "figures" / "rates.csv"
    if not path.exists():
        return ""
    d = read_trace_csv(path)
    s = d[(d["source"] == "simulated") & (d["rate_end"] == "centre" if "rate_end" in d else True)]
    c = s[s["design"] == DUALDECODER_CACHE].sort_values("factor")
    one = c[c["factor"] == 1.0].iloc[0]
    sk = float(s[(s["design"] == SHADOWKV) & (s["factor"] == 1.0)]["tok_s"].iloc[0])
    pts = list(zip(c["factor"], c["tok_s"], c["urgent_per_budget"], c["churn_per_budget"]))
    flip = next(((f0 + (f1 - f0) * (t0 - sk) / (t0 - t1), u0 + (u1 - u0) * (t0 - sk) / (t0 - t1),
                  m0 + (m1 - m0) * (t0 - sk) / (t0 - t1))
                 for (f0, t0, u0, m0), (f1, t1, u1, m1) in zip(pts, pts[1:]) if t0 >= sk > t1), None)
    head = (f"\n\nMargin at 128K (simulated, `figures/rates.csv`: the cache at {one['batch']:.0f} requests, its"
            f" rates scaled, ShadowKV at its own rates, {sk:,.0f} tokens/s): ")
    lo, hi = pts[0][0], pts[-1][0]
    if flip is None:
        ahead = one["tok_s"] > sk
        return head + (f"the cache stays ahead at every factor drawn ({lo:g}-{hi:g}x)." if ahead else
                       f"ShadowKV stays ahead at every factor drawn ({lo:g}-{hi:g}x).")
    f, u, m = flip
    if one["tok_s"] >= sk:
        return head + (f"the cache's lead holds until its prefetched and urgent chunks grow {f:.1f}x, from urgent"
                       f" {one['urgent_per_budget']:.3f} and churn {one['churn_per_budget']:.3f} of the budget per"
                       f" step to {u:.3f} and {m:.3f} (`plan --slo` prints the break-even of its own ranking).")
    return head + (f"ShadowKV is ahead; the cache would catch up only with {f:.2f}x its rates, urgent {u:.3f} and"
                   f" churn {m:.3f} of the budget per step instead of {one['urgent_per_budget']:.3f} and"
                   f" {one['churn_per_budget']:.3f}.")


def fp8(root: Path = ROOT) -> str:
    """fp8 host KV against bf16 on the engine (figures/fp8.csv, from traces/engine/h200-compare): the drawn
    bars (each design at its largest batch, the cache at 4x the budget), each design's fp8 / bf16, and the
    simulator at one matched rate set to compare the designs."""
    d = read_trace_csv(root / "figures" / "fp8.csv")
    d = d[d["drawn"].astype(str) == "True"]
    rows, gains = [], []
    for c in sorted(d["context"].unique()):
        at = d[d["context"] == c].set_index("bar")
        for name, r in at.iterrows():
            cap = f" {r['capacity']:g}x" if r["design"] == DUALDECODER_CACHE else ""
            sim = (f"{r['sim_tok_s']:,.0f} ({r['sim_over_engine'] - 1:+.0%})" if is_present(r["sim_tok_s"])
                   else "not priced")
            matched = f"{r['sim_tok_s_matched']:,.0f}" if is_present(r["sim_tok_s_matched"]) else "not priced"
            rows.append([fmt_context(c), f"{name}{cap}", f"{int(r['batch'])}", f"{r['tok_s']:,.0f} ({r['tok_s_min']:,.0f}-"
                         f"{r['tok_s_max']:,.0f}, {int(r['builds'])})", f"{r['link_mib_per_token']:.1f}", sim, matched])
        for fp8_bar, bf16_bar in (("dualdecoder-cache fp8", "dualdecoder-cache bf16"),
                                  ("ShadowKV fp8 values", "ShadowKV bf16")):
            a, b = at.loc[fp8_bar], at.loc[bf16_bar]
            gains.append(f"{fp8_bar.split()[0]} {fmt_context(c)} {a['tok_s'] / b['tok_s']:.2f}x")
    return ("fp8 (e4m3) host KV on the H200 engine (`traces/engine/h200-compare`, 2026-12-04, the current engine's"
            " code; Llama-3-8B): the host and the link in fp8 with one scale per chunk and KV head, dequantised by the"
            " gathers into the bf16 buffers; each design at its largest batch, tokens/s median (min-max, builds in"
            " one process). The cache runs at the SmolLM2 trend's rates and ShadowKV at a forced 12 % miss (NOT one"
            f" matched rate set): compare fp8 with bf16 within a design; across designs, the last column: the"
            f" simulator at the engine's batch at one matched rate set. fp8 / bf16: {'; '.join(gains)}.\n\n"
            + md_table(["context", "design", "batch", "tokens/s", "link MiB / token", "simulated tokens/s",
                        "simulated, one matched rate set"], rows))


