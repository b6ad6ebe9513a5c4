"""The tables of traces other than the engine's: the calibration bundle, the kernels, the accuracy
profiles and their trend against context, Figure 12's replay and the sensitivity grid."""

from __future__ import annotations

from pathlib import Path

from ddbench.doctables.common import ROOT, DocTablesError, read_trace_csv, read_trace_json, fmt_context, is_present, md_table


def accuracy(root: Path = ROOT) -> str:
    import numpy as np
    from ddbench.core.traces import is_profile_layer_csv
    out = []
    for path in sorted((root / "traces" / "accuracy").glob("*.csv")):
        if not is_profile_layer_csv(path.name):
            continue
        d = read_trace_csv(path)
        d = d[d["temperature"] > 0]                       # greedy with the T2 start is 1.0 by construction
        cols = [(i, t) for i in ("t2", "random") for t in sorted(d["temperature"].unique())]
        rows = []
        for (c, b), g in d.groupby(["context_tokens", "budget_tokens"]):
            cells = []
            for i, t in cols:
                x = g[(g["init"] == i) & (g["temperature"] == t)]
                if not len(x):
                    cells.append("-")
                    continue
                hit = np.average(x["hit_rate"], weights=x["n"])
                reuse = np.average(x["reuse_hit_rate"], weights=x["n"])
                cells.append(f"{hit:.3f} / {reuse:.3f}")
            rows.append([fmt_context(int(c)), f"{int(b)} (1/{int(c) // int(b)})"] + cells)
        acc = []
        for i, t in cols:
            x = d[(d["init"] == i) & (d["temperature"] == t)]
            per_ctx = [f"{np.average(g['token_acc'], weights=g['n']):.3f}" for _, g in x.groupby("context_tokens")]
            acc.append(" / ".join(per_ctx))
        rows.append(["token_acc", " / ".join(fmt_context(int(c)) for c in sorted(d["context_tokens"].unique()))] + acc)
        head = (f"`traces/accuracy/{path.name}` ({d['model'].iloc[0]}, {int(d['layers'].iloc[0])} layers, "
                f"git {d['git_sha'].iloc[0]}): hit / reuse rate, every layer, task and step, weighted by n:")
        out.append(head + "\n\n" + md_table(["context", "budget (share)"] + [f"{'T2' if i == 't2' else 'random'}, "
                                                                         f"temperature {t:g}" for i, t in cols], rows))
    if not out:
        raise DocTablesError(f"{root / 'traces' / 'accuracy'}: no accuracy profile")
    return "\n\n".join(out)


def sensitivity(root: Path = ROOT) -> str:
    d = read_trace_csv(root / "figures" / "sensitivity.csv")
    g = d[d["kind"] == "grid"]
    hits, reuses = sorted(g["hit_rate"].unique()), sorted(g["reuse_rate"].unique())
    rows = []
    for h in hits:
        r = g[g["hit_rate"] == h].set_index("reuse_rate")["ratio"]
        rows.append([f"{h:.1f}"] + [f"{r[u]:.2f}" if u in r.index else "-" for u in reuses])
    marked = d[d["kind"] != "grid"]
    notes = "; ".join(f"{k['kind']}: hit {k['hit_rate']:.3f}, reuse {k['reuse_rate']:.3f}: **{k['ratio']:.2f}** "
                      f"({k['dualdecoder_tokens_per_s']:.1f} against {k['shadowkv_tokens_per_s']:.1f} tokens/s)"
                      for _, k in marked.iterrows())
    return ("DualDecoder / ShadowKV tokens/s, from `figures/sensitivity.csv` (hit rate in rows, reuse rate in columns; "
            f"DualDecoder at batch {int(g['dd_batch'].iloc[0])}, ShadowKV at {int(g['sk_batch'].iloc[0])}):\n\n"
            + md_table(["hit \\ reuse"] + [f"{u:.1f}" for u in reuses], rows)
            + (f"\n\nMarked points (per-layer timeline): {notes}." if notes else ""))


METHODS = {"copy_engine": "copy engine (pinned host memory)", "uva_gather": "GPU (UVA) gather kernel",
           "cpu_gather": "CPU gather (index_select into pinned staging) + one copy",
           "memcpy_per_chunk": "one copy per chunk"}


def calibration(root: Path = ROOT) -> str:
    folder = root / "traces" / "calibration" / "h200"
    b = read_trace_json(folder / "bundle.json")
    link = read_trace_csv(folder / "link.csv")
    rows = []
    for method in METHODS:
        g = link[link["method"] == method]
        keys = ["direction", "blocks"] if method == "copy_engine" else ["direction", "chunk_bytes", "blocks"]
        for _, x in g.groupby(keys, sort=True):
            r = x.loc[x["transfer_bytes"].idxmax()]
            direction, chunk, blocks = r["direction"], int(r["chunk_bytes"]), int(r["blocks"])
            size = f"{int(r['transfer_bytes']) / 2 ** 20:g} MiB"
            piece = "-" if method == "copy_engine" else f"{int(chunk) // 1024} KiB" if chunk >= 1024 else f"{int(chunk)} B"
            rows.append([METHODS[method], direction, size, piece, str(int(blocks)) if blocks else "-",
                         f"{r['gbps']:.1f}"])
    ceil = read_trace_csv(folder / "ceilings.csv")
    lines = [f"- {r['name']}: {r['value']:.0f} {r['unit']}" for _, r in ceil.iterrows()]
    p = b.get("provenance", {})
    gen, _, width = str(p.get("pcie", "")).partition(",")
    return (f"`traces/calibration/h200/` ({p.get('device_name')}, PCIe {gen.strip()} x{width.strip()}, driver {p.get('driver')}, "
            f"torch {p.get('torch')}; {len(p.get('runs', []))} runs listed in bundle.json), each transfer at its "
            "largest measured size:\n\n"
            + md_table(["method", "direction", "per call", "chunk", "thread blocks", "GB/s"], rows)
            + "\n\nCeilings (`ceilings.csv`):\n\n" + "\n".join(lines))


def fig12(root: Path = ROOT) -> str:
    d = read_trace_csv(root / "figures" / "fig12.csv")
    designs = list(dict.fromkeys(d["system"]))
    rows = []
    for c, g in d.groupby("context"):
        cells = []
        for s in designs:
            r = g[g["system"] == s]
            if not len(r) or bool(r["oom"].iloc[0]):
                cells.append("does not fit")
            else:
                r = r.iloc[0]
                cells.append(f"{r['tokens_per_s']:.1f} (batch {int(r['max_batch'])})")
        rows.append([fmt_context(int(c))] + cells)
    return ("Simulated decode tokens/s at each design's largest batch, from `figures/fig12.csv` (Figure 12's "
            "setting: Qwen2.5-32B on an 80 GB H100, PCIe 5, budget 2048):\n\n"
            + md_table(["context"] + designs, rows))



def _kernels(root: Path, kernel: str):
    d = read_trace_csv(root / "traces" / "kernels" / "h200" / "kernels.csv")
    d = d[d["kernel"] == kernel]
    if not len(d):
        raise DocTablesError(f"traces/kernels/h200/kernels.csv: no {kernel} rows")
    return d, d["git_sha"].iloc[0][:7], str(d["date_utc"].iloc[0])[:10]



def _cell(d, variant: str, batch: int):
    r = d[(d["variant"] == variant) & (d["batch"] == batch)]
    return r.iloc[0] if len(r) else None


def kernels_gather(root: Path = ROOT) -> str:
    d, sha, date = _kernels(root, "gather")
    rows = []
    for b in sorted(d["batch"].unique()):
        big, uva = _cell(d, "one_big_copy", b), _cell(d, "uva_persistent_32", b)
        cpu, per = _cell(d, "cpu_index_select_staging", b), _cell(d, "memcpy_per_chunk", b)
        gb = (lambda r: f"{r['gbps']:.1f} GB/s" if r is not None else "not run")
        share = f"{uva['pct_of_floor']:.1f} %" if uva is not None and is_present(uva["pct_of_floor"]) else "-"
        size = f"{int(big['bytes']) // 2 ** 20} MiB" if big is not None else "-"
        rows.append([f"{size} (batch {int(b)})", gb(big), gb(uva), share, gb(cpu), gb(per)])
    return (f"Gathers of 4 KiB chunks from pinned host memory, `traces/kernels/h200/kernels.csv` (git {sha}, {date}):\n\n"
            + md_table(["bytes per call", "one big copy", "UVA gather (32 programs)", "of big copy",
                      "CPU index_select + copy", "one copy per chunk"], rows))


def kernels_attention(root: Path = ROOT) -> str:
    d, sha, date = _kernels(root, "attention")
    rows = []
    for b in sorted(d["batch"].unique()):
        dual, single = _cell(d, "dual_token", b), _cell(d, "single_token", b)
        two, sdpa = _cell(d, "two_pass", b), _cell(d, "torch_sdpa_two_query", b)
        if dual is None or single is None:
            continue
        rows.append([str(int(b)), f"{dual['latency_ms']:.3f} ms ({dual['pct_of_floor']:.0f} % of floor)",
                     f"{single['latency_ms']:.3f} ms", f"{dual['latency_ms'] / single['latency_ms']:.2f}",
                     f"{two['latency_ms'] / dual['latency_ms']:.2f}" if two is not None else "-",
                     f"{sdpa['latency_ms'] / dual['latency_ms']:.2f}" if sdpa is not None else "-"])
    shape = d["shape"].iloc[0]
    return (f"Sparse decode attention ({shape}), `traces/kernels/h200/kernels.csv` (git {sha}, {date}):\n\n"
            + md_table(["batch", "dual-token (Triton)", "single-token", "dual / single", "two passes / dual",
                      "torch SDPA, two queries / dual"], rows))


def contexts(root: Path = ROOT) -> str:
    """The cache and prediction rates against context at a fixed budget share (traces/accuracy/**/
    <model>.contexts.csv and .cache-trend.json, `python -m ddbench.profile.contexts`): per model, LRU at
    capacities 0 (DualDecoder), 2x and 4x, mean [95 % interval] over prompts, the power law's factor per
    doubling, its checks and its value at 32K and 128K."""
    import json

    from ddbench.profile.contexts import predict
    out = []
    for path in sorted((root / "traces" / "accuracy").rglob("*.contexts.csv")):
        d = read_trace_csv(path)
        doc = json.loads(path.with_name(path.name[: -len(".contexts.csv")] + ".cache-trend.json").read_text())
        model, rel = d["model"].iloc[0], path.relative_to(root)
        ctxs = sorted(int(c) for c in d["context_tokens"].unique())
        lab = {c: fmt_context(c) if c % 1024 == 0 else str(c) for c in ctxs}
        a = d[(d["band"].astype(str) == "all")]
        if "prediction" in a.columns:      # lru-cache's rows (prediction none) are not this table's
            a = a[a["prediction"].fillna("").astype(str) != "none"]
        fits = {(f["share"], f["capacity"], f["metric"]): f for f in doc["fits"]
                if f["band"] == "all" and f["policy"] == "lru" and f.get("prediction", "speculative") == "speculative"}
        rows = []
        for share in sorted({f[0] for f in fits}, key=lambda x: -int(x.split("/")[1])):
            for cap in (0.0, 2.0, 4.0):
                for metric, label in (("urgent_per_budget", "urgent"), ("moved_per_budget", "moved (churn + urgent)")):
                    cells = []
                    for c in ctxs:
                        x = a[(a["policy"] == "lru") & (a["capacity"].astype(float) == cap) & (a["metric"] == metric)
                              & (a["context_tokens"] == c) & ((a["budget_tokens"] * int(share.split("/")[1]) - c).abs()
                                                              < 8 * int(share.split("/")[1]))]
                        cells.append(f"{x['mean'].iloc[0]:.3f} [{x['low'].iloc[0]:.3f}, {x['high'].iloc[0]:.3f}]"
                                     if len(x) else "-")
                    f = fits.get((share, cap, metric))
                    if f is None:
                        continue
                    h = f["holdout"]
                    check = ("-" if h is None else f"{h['measured']:.3f} in [{h['low']:.3f}, {h['high']:.3f}]"
                             + ("" if h["low"] <= h["measured"] <= h["high"] else " (outside)"))
                    curv = "-" if f["curvature_p"] is None else f"{f['curvature_p']:.2f}"
                    far = [predict(f, t) for t in (32768, 131072)]
                    rows.append([share, f"{cap:g}x" if cap else "0 (DualDecoder)", label] + cells
                                + [f"{f['per_doubling']:.2f}", curv, check]
                                + [f"{v:.3f} [{lo:.3f}, {hi:.3f}]" for v, lo, hi in far])
        pr = a[a["policy"] == "prediction"]
        pred = []
        for share in sorted({f[0] for f in fits}, key=lambda x: -int(x.split("/")[1])):
            n = int(share.split("/")[1])
            for metric in ("hit_rate", "reuse_hit_rate"):
                cells = []
                for c in ctxs:
                    x = pr[(pr["metric"] == metric) & (pr["context_tokens"] == c)
                           & ((pr["budget_tokens"] * n - c).abs() < 8 * n)]
                    cells.append(f"{x['mean'].iloc[0]:.3f} [{x['low'].iloc[0]:.3f}, {x['high'].iloc[0]:.3f}]"
                                 if len(x) else "-")
                pred.append([share, metric.replace("_rate", "").replace("_hit", "")] + cells)
        qs = doc.get("questions_per_context", {})
        prompts = ", ".join(f"{lab.get(int(c), c)}: {n}" + (f" ({qs[c]} questions)" if qs.get(c, n) != n else "")
                            for c, n in sorted(doc["prompts_per_context"].items(), key=lambda kv: int(kv[0])))
        out.append(f"`{rel}` ({model}, {doc['layers']} layers; prompts per context {prompts}; git"
                   f" {d['git_sha'].iloc[0]}): LRU replay, all layers, per step over the budget's k chunks,"
                   " mean [95 % interval over prompts]; the power law fitted over the prompts, its factor per"
                   " doubling of the context, the p-value of a curved term, the longest context held out"
                   " (measured in the interval the law fitted without it predicts), and the law at 32K and"
                   " 128K with its 95 % interval:\n\n"
                   + md_table(["share", "capacity", "rate"] + [lab[c] for c in ctxs]
                            + ["x per doubling", "curvature p", f"{lab[ctxs[-1]]} held out", "32K", "128K"], rows)
                   + "\n\nThe prediction's rates (hit: the speculative token's selection; reuse: the previous"
                   " step's), same prompts:\n\n"
                   + md_table(["share", "rate"] + [lab[c] for c in ctxs], pred))
    return "\n\n".join(out) if out else "No context profile is committed (`python -m ddbench.profile.contexts`)."


