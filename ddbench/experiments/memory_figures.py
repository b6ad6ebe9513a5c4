"""The paper's memory experiments, replayed from the memory model:
Figure 2 (max batch), Figures 4/5 (auxiliary residency), Figure 14 (memory at a
fixed batch) and Figure 15 (memory against context).

The paper does not state the context, budget or GPU model behind Figures 2, 4, 5
and 14; we use 128K tokens, ShadowKV's defaults (budget 2048, chunk 8, rank 160)
and an H100 80GB, and say so in every setup line.

Figure 2 also marks the host-memory bound on the paper's testbed (1.6 TB for 8 GPUs, 200 GB per GPU
when all serve; core.memory.host_kv_bytes): the paper's batches are GPU-bound only.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from ddbench.core.catalog import get_gpu, get_model, host_memory
from ddbench.core.designs import DUALDECODER, FULL_KV, IDEAL, SHADOWKV, SPECACHE, get_design
from ddbench.experiments import Comparison, FigureResult, register
from ddbench.core.memory import CATEGORIES, Workload, host_kv_bytes, max_batch, max_batch_host, memory_breakdown
from ddbench.experiments import engine_points as E
from ddbench.plotting import (CATEGORY_COLORS, SYSTEM_COLORS, engine_handle, engine_mark, integer_axis, paper_handle,
                              paper_mark, style_handle)
from ddbench.core.distribution import Distribution
from ddbench.core.units import GB, fmt_tokens

GPU = "h100-80gb"
CONTEXT = 128 * 1024
MODELS = {"8B": "llama-3-8b", "14B": "qwen2.5-14b", "32B": "qwen2.5-32b"}
SPARSE = (SHADOWKV, SPECACHE, DUALDECODER)
W = Workload(context=CONTEXT)  # the defaults every figure uses


def setup_line(extra: str = "") -> str:
    w = Workload(context=CONTEXT)
    return (f"{GPU}, context {fmt_tokens(CONTEXT)}, budget {w.budget}, chunk {w.chunk}, rank {w.rank}"
            + (f", {extra}" if extra else ""))


def _caption(designs) -> str:
    """The matched rate set the serving runs price the designs at (ddbench.planner.ratelines.caption)."""
    from ddbench.experiments.scene import scene
    from ddbench.planner.ratelines import caption
    return caption([scene(F4_MODEL, d, gpu=GPU) for d in designs], (CONTEXT,))


def _bd(system: str, size: str, batch: int, context: int = CONTEXT):
    return memory_breakdown(get_design(system), get_model(MODELS[size]), get_gpu(GPU),
                            Workload(context=context, batch=batch))


def _max(system: str, size: str, context: int = CONTEXT) -> int:
    return max_batch(get_design(system), get_model(MODELS[size]), get_gpu(GPU), Workload(context=context))


TESTBED = "paper-testbed"   # the host whose memory Figure 2 marks


def _host_max(system: str, size: str, context: int = CONTEXT) -> int | None:
    """Requests whose pinned host KV fits in the paper testbed's host memory per GPU (None: none kept)."""
    return max_batch_host(get_design(system), get_model(MODELS[size]), Workload(context=context),
                          host_memory(TESTBED, None).bytes_per_gpu)


# ---------------------------------------------------------------- Figure 2
def paper_value(pid: str) -> float:
    from ddbench.core.paper_numbers import reported
    return reported()[pid].value


def _draw_fig2(res: FigureResult, fig) -> None:
    df = res.data
    fig.set_size_inches(7.6, 3.4)
    ax = fig.add_subplot()
    systems = list(dict.fromkeys(df["system"]))
    sizes = list(dict.fromkeys(df["model_size"]))
    width = 0.8 / len(systems)
    top = 1.0
    for i, design in enumerate(systems):
        sub = df[df["system"] == design].set_index("model_size").loc[sizes]
        xs = [j + (i - (len(systems) - 1) / 2) * width for j in range(len(sizes))]
        ax.bar(xs, sub["max_batch"], width, label=design, color=SYSTEM_COLORS.get(design))
        for x, v, p in zip(xs, sub["max_batch"], sub["paper_max_batch"]):
            if pd.notna(p):
                ax.plot([x], [p], **paper_mark(SYSTEM_COLORS.get(design)))
        for x, v, e in zip(xs, sub["max_batch"], sub["engine_max_batch"]):
            if pd.notna(e) and (e or v):       # both 0: the OOM cross says it for both
                ax.plot([x + 0.25 * width], [max(e, 0.9)], **engine_mark(SYSTEM_COLORS.get(design)))
        for x, v, h in zip(xs, sub["max_batch"], sub["max_batch_host_testbed"]):
            if pd.notna(h) and 0 < h < v:   # host memory binds before GPU memory does
                ax.plot([x], [h], marker="_", color="black", markersize=9, mew=1.6, ls="none",
                        label="host-memory bound on the paper's\ntestbed (1.6 TB / 8 GPUs)")
            if v == 0:
                ax.plot([x], [1.0], marker="x", color=SYSTEM_COLORS.get(design), markersize=7, mew=2, ls="none")
                ax.text(x, 1.25, "OOM", ha="center", va="bottom", fontsize=6, rotation=90)
                continue
            star = pd.notna(p) and p >= v
            ax.annotate(str(int(v)), (x, p if star else v), xytext=(0, 8 if star else 1), textcoords="offset points",
                        ha="center", va="bottom", fontsize=6)   # above the bar, and above its star
            top = max(top, v, p if pd.notna(p) else 0)
    ax.set_yscale("log")
    ax.set_ylim(0.8, top * 2.2)
    integer_axis(ax.yaxis, log=True, ticks=[1, 2, 5, 10, 20, 50, 100, 200, 500])
    ax.set_xticks(range(len(sizes)), sizes)
    ax.set_xlabel("model")
    ax.set_ylabel("max batch (requests, log scale)")
    ax.set_title("Fig. 2: maximum decoding batch per design at 128K (bars and labels: replay)", fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    host = [k for k in uniq if k.startswith("host-memory")]
    uniq = {k: v for k, v in uniq.items() if k not in host} | {k: uniq[k] for k in host}   # the bound last
    fig.legend(list(uniq.values()) + [paper_handle(), engine_handle()],
               list(uniq.keys()) + ["paper (star,\ncoloured by design)", "engine, H200 capped\nat 80 GB (diamond)"],
               fontsize=7, ncol=1, loc="outside right upper")


@register("fig02", "Maximum request batch per design and model (paper Figure 2)", _draw_fig2)
def fig02() -> FigureResult:
    paper = {(FULL_KV, "8B"): paper_value("fig2.full-kv.8b.max_batch"), (SHADOWKV, "8B"): paper_value("fig2.shadowkv.8b.max_batch"),
             (IDEAL, "8B"): paper_value("fig2.ideal.8b.max_batch"), (SHADOWKV, "32B"): paper_value("fig2.shadowkv.32b.max_batch"),
             (IDEAL, "32B"): paper_value("fig2.ideal.32b.max_batch")}
    rows = []
    for size in MODELS:
        for design in (FULL_KV, SHADOWKV, SPECACHE, DUALDECODER, IDEAL):
            rows.append({"model_size": size, "model": MODELS[size], "system": design,
                         "max_batch": _max(design, size), "paper_max_batch": paper.get((design, size)),
                         "host_kv_gb_per_request": host_kv_bytes(get_design(design), get_model(MODELS[size]),
                                                                 W) / GB,
                         "max_batch_host_testbed": _host_max(design, size),
                         "engine_max_batch": _engine_max(design, size)})
    df = pd.DataFrame(rows)
    get = lambda s, z: int(df[(df.system == s) & (df.model_size == z)].max_batch.iloc[0])  # noqa: E731

    full = _bd(FULL_KV, "8B", 4)
    kv4 = full.resident_kv
    rest = full.capacity - full.weights - kv4
    cmp = [
        Comparison("fig2.full-kv.8b.max_batch", get(FULL_KV, "8B"),
                   f"4 requests need {kv4 / GB:.2f} GB of KV + {full.weights / GB:.2f} GB of weights, leaving "
                   f"{rest / GB:.2f} GB of {full.capacity / GB:.2f} GB for activations ({full.activations / GB:.2f} GB: "
                   f"{fmt_tokens(W.prefill_chunk)}-token chunked prefill + logits) and the CUDA context ({full.runtime_overhead / GB:.2f} GB); "
                   f"4 fit only if both take under {rest / GB:.2f} GB; with exactly 80 GiB: "
                   f"{_max_at_80gib(FULL_KV, '8B')}"),
        Comparison("fig2.shadowkv.8b.max_batch", get(SHADOWKV, "8B"),
                   f"ShadowKV's per-request state at 128K: {_per_req(SHADOWKV, '8B') / GB:.2f} GB "
                   f"(U, landmarks, outliers, per-layer K/V buffers of {_shadowkv_buffer_tokens()} tokens); "
                   "with exactly 80 GiB: "
                   f"{_max_at_80gib(SHADOWKV, '8B')}"),
        Comparison("fig2.ideal.8b.max_batch", get(IDEAL, "8B"),
                   "our 'ideal' keeps weights, activations and a 2048-token sparse KV buffer for all layers "
                   f"({_per_req(IDEAL, '8B') / GB:.3f} GB/request); the paper's 120 implies "
                   f"{(full.capacity - full.weights) / 120 / GB:.2f} GB/request, an accounting it does not state"),
        Comparison("fig2.shadowkv.32b.max_batch", get(SHADOWKV, "32B"),
                   f"Qwen2.5-32B weights take {get_model(MODELS['32B']).weight_bytes / GB:.1f} GB; "
                   f"ShadowKV's state is {_per_req(SHADOWKV, '32B') / GB:.2f} GB per request; with exactly 80 GiB: "
                   f"{_max_at_80gib(SHADOWKV, '32B')}"),
        Comparison("fig2.ideal.32b.max_batch", get(IDEAL, "32B"),
                   f"our 'ideal' at 32B ({_per_req(IDEAL, '32B') / GB:.3f} GB/request beside "
                   f"{get_model(MODELS['32B']).weight_bytes / GB:.1f} GB of weights); the paper's implied 60 leaves "
                   f"{(full.capacity - get_model(MODELS['32B']).weight_bytes) / 60 / GB:.2f} GB/request"),
        Comparison("fig2.shadowkv.32b.share_of_ideal", round(get(SHADOWKV, "32B") / get(IDEAL, "32B"), 3),
                   f"{get(SHADOWKV, '32B')} / {get(IDEAL, '32B')} under our 'ideal'"),
    ]
    for i, c in enumerate(cmp):            # the engine's measured largest batch beside the replay's
        parts = c.paper_id.split(".")
        if len(parts) == 4 and parts[3] == "max_batch":
            e = _engine_max(parts[1], parts[2].upper())
            if e is not None:
                cmp[i] = Comparison(c.paper_id, c.ours, c.note + f"; measured on the engine (H200 capped at 80 GB): {e}")
    return FigureResult(df, setup_line("designs at their largest batch that fits in GPU memory; black dash: the batch"
                                   f" whose host KV fits in {TESTBED}'s host memory per GPU"
                                   f" ({host_memory(TESTBED, None).gb_per_gpu:.0f} GB); diamonds: the engine's largest"
                                   f" batch measured on an H200 capped at 80 GB (traces/engine/{E.CAPPED})"), cmp)


def _engine_max(design: str, size: str):
    """The engine's largest batch under the 80 GB cap at CONTEXT (None: not measured, e.g. ideal)."""
    p = E.largest(MODELS[size], CONTEXT, design)
    return None if p is None else p["batch"]


def _shadowkv_buffer_tokens() -> int:
    """ShadowKV's per-layer K/V buffer: budget + generated slots + (outlier + local) chunks."""
    return W.budget + W.gen_tokens + (W.outlier_chunks + W.local_chunks) * W.chunk


def _bytes_per_token(system: str, size: str, *categories: str) -> float:
    """Bytes per context token of the given categories, for one request."""
    a, b = _bd(system, size, 1, CONTEXT), _bd(system, size, 1, 2 * CONTEXT)
    return sum(getattr(b, c) - getattr(a, c) for c in categories) / CONTEXT


def _max_at_80gib(system: str, size: str) -> int:
    """Max batch if the GPU had exactly 80 GiB, a common reading of '80 GB'."""
    gpu = replace(get_gpu(GPU), hbm_bytes=80 * 1024 ** 3)
    return max_batch(get_design(system), get_model(MODELS[size]), gpu, Workload(context=CONTEXT))


def _per_req(system: str, size: str, context: int = CONTEXT) -> float:
    """Bytes one more request adds (difference between batch 2 and batch 1)."""
    return _bd(system, size, 2, context).total - _bd(system, size, 1, context).total


# ---------------------------------------------------------------- Figures 4 and 5
def _breakdown_rows(pairs) -> pd.DataFrame:
    rows = []
    for design, size in pairs:
        b = _max(design, size)
        bd = _bd(design, size, max(b, 1))
        row = {"system": design, "model_size": size, "model": MODELS[size], "batch": b}
        row.update({f"{c}_gb": getattr(bd, c) / GB for c in CATEGORIES})
        row.update({"total_gb": bd.total / GB, "capacity_gb": bd.capacity / GB,
                    "aux_share": bd.aux_residency / bd.capacity,
                    "landmarks_plus_aux_share": (bd.landmarks + bd.aux_residency) / bd.capacity,
                    "landmarks_plus_aux_over_sparse_kv":
                        (bd.landmarks + bd.aux_residency) / bd.sparse_kv_buffers if bd.sparse_kv_buffers else None})
        rows.append(row)
    return pd.DataFrame(rows)


F4_MODEL, F4_N, F4_RATE, F4_OUT = "llama-3-8b", 64, 1.0, 1024
F4_SYSTEMS = (SHADOWKV, SPECACHE, DUALDECODER)
F4_SHOWN = ("weights", "sparse_kv_buffers", "landmarks", "aux_residency", "other")


def _draw_fig4(res: FigureResult, fig) -> None:
    df = res.data
    fig.set_size_inches(7.2, 5.0)
    grid = fig.add_gridspec(2, len(F4_SYSTEMS), height_ratios=(1.4, 1))
    cap = get_gpu(GPU).hbm_bytes / GB
    names = {"weights": "model weights", "sparse_kv_buffers": "sparse KV entries", "landmarks": "K landmarks",
             "aux_residency": "KV-cache-auxiliary residency", "other": "other (resident KV, activations, runtime)"}
    colors = dict(CATEGORY_COLORS, other="#c7c7c7")
    t_end = float(df.time_s.max())
    for j, design in enumerate(F4_SYSTEMS):
        ax = fig.add_subplot(grid[0, j])
        ax.set_xlim(0, t_end)
        sub = df[df.system == design]
        ax.stackplot(sub.time_s, *[sub[f"{c}_gb"] for c in F4_SHOWN], step="post",
                     colors=[colors[c] for c in F4_SHOWN], labels=[names[c] for c in F4_SHOWN])
        ax.axhline(cap, color="black", lw=0.8, ls="--")
        ax.set_ylim(0, cap * 1.08)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("GPU memory (GB)")
        ax.set_title(f"({'abc'[j]}) {design}: up to {int(sub.batch.max())} requests", fontsize=7)
    ax = fig.add_subplot(grid[1, :])
    for design in F4_SYSTEMS:
        sub = df[df.system == design]
        ax.step(sub.time_s, 100 * sub.landmarks_plus_aux_share, where="post", color=SYSTEM_COLORS[design],
                label=design + (" (landmarks only)" if design == DUALDECODER else ""))
    top = 100 * paper_value("fig4.landmarks_plus_aux.max_share")
    ax.axhline(top, color="black", lw=0.8, ls=":")
    ax.text(float(df.time_s.max()), top + 1.5, f"paper: up to {top:.0f}%", ha="right", fontsize=7)
    ax.set_ylim(0, 100)
    ax.set_xlim(0, t_end)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("landmarks + aux\nresidency (% of GPU)")
    ax.legend(fontsize=7, loc="upper left", ncol=3)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles + [style_handle("--", "GPU capacity")], labels + [f"GPU capacity ({cap:.1f} GB)"],
               fontsize=6, ncol=3, loc="outside lower center")
    fig.suptitle(f"Fig. 4: GPU memory over time, {F4_MODEL} at {fmt_tokens(CONTEXT)}, {F4_N} requests arriving"
                 f" and leaving", fontsize=9)


def _timeline(system: str):
    """Memory by category over one serving run (ddbench.sim.serving records it whenever it changes)."""
    from ddbench.experiments.scene import scene, workload
    from ddbench.sim.serving import draw_requests, run_serving
    r = scene(F4_MODEL, system, gpu=GPU)
    reqs = draw_requests(F4_N, F4_RATE, Distribution.parse(CONTEXT, "context"), Distribution.parse(F4_OUT, "output"),
                         0)
    res = run_serving(r.design, r.model, r.gpu, r.cm, workload(r, CONTEXT), reqs, *r.hits_at(CONTEXT),
                      prefill_here=False)
    per = memory_breakdown(r.design, r.model, r.gpu, workload(r, CONTEXT))
    per_req = sum(getattr(per, c) for c in ("resident_kv", "landmarks", "aux_residency", "sparse_kv_buffers"))
    rows = []
    for m in res.memory:
        row = {"system": system, "time_s": m["time_s"]}
        row.update({f"{c}_gb": m[c] / GB for c in CATEGORIES})
        row["other_gb"] = (m["resident_kv"] + m["activations"] + m["runtime_overhead"]) / GB
        row["total_gb"] = m["total"] / GB
        row["batch"] = round((m["resident_kv"] + m["landmarks"] + m["aux_residency"] + m["sparse_kv_buffers"]) / per_req)
        row["landmarks_plus_aux_share"] = (m["landmarks"] + m["aux_residency"]) / res.capacity
        row["landmarks_plus_aux_over_sparse_kv"] = ((m["landmarks"] + m["aux_residency"]) / m["sparse_kv_buffers"]
                                                    if m["sparse_kv_buffers"] else None)
        if rows and rows[-1]["time_s"] == row["time_s"]:
            rows[-1] = row      # several changes at one instant (a completion and an admission): keep the last
        else:
            rows.append(row)
    return rows, res


@register("fig04", "GPU memory over time of an 8B serving run, by category (paper Figure 4)", _draw_fig4)
def fig04() -> FigureResult:
    rows, runs = [], {}
    for design in F4_SYSTEMS:
        r, runs[design] = _timeline(design)
        rows += r
    df = pd.DataFrame(rows)
    base = df[df.system.isin([SHADOWKV, SPECACHE])]
    top = base.loc[base.landmarks_plus_aux_share.idxmax()]
    sk = df[df.system == SHADOWKV]
    sk_top = sk.loc[sk.landmarks_plus_aux_share.idxmax()]
    dd = df[df.system == DUALDECODER]
    cmp = [
        Comparison("fig4.landmarks_plus_aux.max_share", round(float(top.landmarks_plus_aux_share), 3),
                   f"peak over the serving run of ShadowKV and SpeCache: {top.system} at t = {top.time_s:.0f} s with "
                   f"{int(top.batch)} requests in memory ({_max(top.system, '8B')} fit at most); DualDecoder's landmarks "
                   f"peak at {dd.landmarks_plus_aux_share.max():.0%} with {int(dd.batch.max())} requests"),
        Comparison("fig4.landmarks_plus_aux.over_sparse_kv", round(float(sk_top.landmarks_plus_aux_over_sparse_kv), 2),
                   "ShadowKV at its peak: (landmarks + U + SV + outliers) / its 2048-token per-layer K/V buffers;"
                   " both are per request, so the ratio holds at any batch"),
    ]
    setup = (f"{F4_MODEL} on {GPU} + pcie5, serving simulator (sim/serving.py): {F4_N} requests of "
             f"{fmt_tokens(CONTEXT)} tokens, Poisson at {F4_RATE} req/s (seed 0), output {F4_OUT} tokens, prefill on "
             f"other GPUs, FIFO admission while memory allows; memory by category each time it changes; "
             + setup_line().split(", ", 2)[2] + "; " + _caption(SPARSE))
    return FigureResult(df, setup, cmp)


def _draw_fig5(res: FigureResult, fig) -> None:
    df = res.data
    ax = fig.add_subplot()
    for design, sub in df.groupby("system", sort=False):
        ax.plot(sub["model_size"], 100 * sub["aux_share"], marker="o", label=f"{design}: aux residency",
                color=SYSTEM_COLORS.get(design))
        ax.plot(sub["model_size"], 100 * sub["landmarks_plus_aux_share"], marker="s", ls="--",
                label=f"{design}: + landmarks", color=SYSTEM_COLORS.get(design), alpha=0.6)
    floor = 100 * paper_value("fig5.aux.min_share")
    ax.axhline(floor, color="black", lw=0.8, ls=":")
    ax.text(0, floor + 1, f"paper: aux residency >= {floor:.0f}% in every setting", fontsize=7)
    ax.set_ylim(0, 100)
    ax.set_xlabel("model")
    ax.set_ylabel("share of GPU memory (%)")
    ax.set_title("Fig. 5: auxiliary residency across model sizes (each design at its max batch)")
    ax.legend(fontsize=6)


@register("fig05", "Share of GPU memory held by KV-cache-auxiliary residency (paper Figure 5)", _draw_fig5)
def fig05() -> FigureResult:
    df = _breakdown_rows([(s, z) for s in (SHADOWKV, SPECACHE) for z in MODELS])
    low = df.loc[df.aux_share.idxmin()]
    weights = get_model(MODELS[low.model_size]).weight_bytes / get_gpu(GPU).hbm_bytes
    cmp = [Comparison("fig5.aux.min_share", round(float(low.aux_share), 3),
                      f"lowest over ShadowKV and SpeCache at 8B/14B/32B: {low.system} {low.model_size} "
                      f"b={low.batch}, where the weights alone take {weights:.0%} of the GPU; at 8B the "
                      f"lowest is {df[df.model_size == '8B'].aux_share.min():.0%}")]
    return FigureResult(df, setup_line("each design at its max batch"), cmp)


# ---------------------------------------------------------------- Figure 14
def _draw_fig14(res: FigureResult, fig) -> None:
    df = res.data
    axes = fig.subplots(1, df.model_size.nunique(), sharey=True)
    for ax, (size, sub) in zip(axes, df.groupby("model_size", sort=False)):
        bottom = [0.0] * len(sub)
        for cat in CATEGORIES:
            vals = list(sub[f"{cat}_gb"])
            ax.bar(range(len(sub)), vals, bottom=bottom, color=CATEGORY_COLORS[cat],
                   label=cat.replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals)]
        for i, (v, design) in enumerate(zip(sub["paper_total_gb"], sub["system"])):
            if pd.notna(v):
                ax.plot([i], [v], **paper_mark(SYSTEM_COLORS.get(design)))
        for i, (v, design) in enumerate(zip(sub["engine_total_gb"], sub["system"])):
            if pd.notna(v):
                ax.plot([i + 0.3], [v], **engine_mark(SYSTEM_COLORS.get(design)))
        ax.axhline(get_gpu(GPU).hbm_bytes / GB, color="black", lw=0.8, ls="--")
        ax.set_xticks(range(len(sub)), sub["system"], rotation=30, fontsize=7)
        ax.set_xlabel("design")
        ax.set_ylabel("GPU memory (GB)")
        ax.set_title(f"{size}, batch {sub.batch.iloc[0]}")
    handles, labels = axes[0].get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    fig.legend(list(uniq.values()) + [paper_handle(), engine_handle(), style_handle("--", "GPU capacity")],
               list(uniq.keys()) + ["paper (star, coloured by design)", "engine peak, H200 (diamond)", "GPU capacity"],
               fontsize=6, loc="outside lower center", ncol=5)
    fig.suptitle("Fig. 14: memory at the same batch per model size", fontsize=9)


@register("fig14", "Memory footprint at batch 12/6/4 for 8B/14B/32B (paper Figure 14)", _draw_fig14)
def fig14() -> FigureResult:
    batches = {"8B": 12, "14B": 6, "32B": 4}
    paper = {(s, "8B"): paper_value(f"fig14.{s}.8b.b12.total_gb") for s in SPARSE}
    rows = []
    for size, b in batches.items():
        for design in SPARSE:
            bd = _bd(design, size, b)
            row = {"model_size": size, "model": MODELS[size], "batch": b, "system": design}
            row.update({f"{c}_gb": getattr(bd, c) / GB for c in CATEGORIES})
            row.update({"total_gb": bd.total / GB, "fits": bd.fits, "paper_total_gb": paper.get((design, size))})
            eng = E.memory_gb(MODELS[size], CONTEXT, design) or {}
            row.update({"engine_total_gb": eng.get("total")} | {f"engine_{c}_gb": eng.get(c) for c in CATEGORIES})
            rows.append(row)
    df = pd.DataFrame(rows)
    tot = df.set_index(["system", "model_size"]).total_gb
    saving = {(base, z): 1 - tot[DUALDECODER, z] / tot[base, z] for base in (SHADOWKV, SPECACHE) for z in batches}
    cmp = [Comparison(f"fig14.{s}.8b.b12.total_gb", round(float(tot[s, "8B"]), 1), _fig14_note(s, df, paper))
           for s in SPARSE]
    for base in (SHADOWKV, SPECACHE):
        best = max(batches, key=lambda z: saving[base, z])
        cmp.append(Comparison(f"fig14.max_saving_vs_{base}", round(float(saving[base, best]), 3),
                              f"largest at {best}: {tot[DUALDECODER, best]:.1f} vs {tot[base, best]:.1f} GB"))
    for design, size in ((SPECACHE, "8B"), (SHADOWKV, "32B"), (SPECACHE, "32B")):
        mb = _max(design, size)
        bd = _bd(design, size, batches[size])
        cmp.append(Comparison(f"fig14.{design}.{size.lower()}.max_batch", mb,
                              f"memory model, 128K: {design} at the paper's batch {batches[size]} needs {bd.total / GB:.1f} GB of "
                              f"{bd.capacity / GB:.1f} GB ({'fits' if bd.fits else 'does not fit'}); its largest batch "
                              f"here is {mb} (Figure 2 replay)"))
    fits14 = ", ".join(f"{s} {'fits' if bool(df[(df.system == s) & (df.model_size == '14B')].fits.iloc[0]) else 'OOM'}"
                       f" (max {_max(s, '14B')})" for s in SPARSE)
    cmp.append(Comparison("fig14.14b.batch", batches["14B"],
                          f"the batch we replay at 14B, from the paper's caption: {fits14}"))
    low = min(saving[SHADOWKV, "32B"], saving[SPECACHE, "32B"])
    cmp.append(Comparison("fig14.32b.b4.min_saving", round(float(low), 3),
                          f"32B b=4: DualDecoder {tot[DUALDECODER, '32B']:.1f} GB vs ShadowKV "
                          f"{tot[SHADOWKV, '32B']:.1f} and SpeCache {tot[SPECACHE, '32B']:.1f} GB "
                          f"(capacity {get_gpu(GPU).hbm_bytes / GB:.1f} GB)"))
    for i, c in enumerate(cmp):            # the engine's measured peak beside the replay's
        if c.paper_id.endswith(".8b.b12.total_gb"):
            r = df[(df.system == c.paper_id.split(".")[1]) & (df.model_size == "8B")].iloc[0]
            cmp[i] = Comparison(c.paper_id, c.ours, c.note + f"; measured on the engine (H200, batch 12, peak):"
                                                           f" {r.engine_total_gb:.1f} GB")
    return FigureResult(df, setup_line("batch 12/6/4 for 8B/14B/32B; diamonds: the engine's GPU memory at its peak at"
                                   f" the same batches on an H200 (traces/engine/{E.FIG14})"), cmp)


def _fig14_note(system: str, df: pd.DataFrame, paper: dict) -> str:
    r = df[(df.system == system) & (df.model_size == "8B")].iloc[0]
    parts = ", ".join(f"{c.replace('_', ' ')} {r[f'{c}_gb']:.1f}" for c in CATEGORIES if r[f"{c}_gb"] >= 0.05)
    fixed = r.weights_gb + r.runtime_overhead_gb
    implied = (paper[system, "8B"] - fixed) / r.batch
    ours = (r.total_gb - fixed) / r.batch
    return (f"ours: {parts} GB; per request beyond weights and runtime overhead: {ours:.2f} GB here, "
            f"{implied:.2f} GB implied by the paper")


# ---------------------------------------------------------------- Figure 15
FIG15_CONTEXTS = (64 * 1024, 128 * 1024, 256 * 1024, 512 * 1024)
FIG15_BATCH = 1


def _draw_fig15(res: FigureResult, fig) -> None:
    df = res.data
    ax = fig.add_subplot()
    for design, sub in df.groupby("system", sort=False):
        ok = sub[sub.fits]
        ax.plot([fmt_tokens(c) for c in ok.context], ok.total_gb, marker="o", label=design, color=SYSTEM_COLORS.get(design))
        oom = sub[~sub.fits]
        if len(oom):
            ax.plot([fmt_tokens(c) for c in oom.context], [get_gpu(GPU).hbm_bytes / GB] * len(oom), marker="x",
                    ls="none", color=SYSTEM_COLORS.get(design), markersize=8)
    ax.axhline(get_gpu(GPU).hbm_bytes / GB, color="black", lw=0.8, ls="--", label="GPU capacity")
    ax.set_ylim(0, get_gpu(GPU).hbm_bytes / GB * 1.08)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("GPU memory (GB)")
    ax.set_title(f"Fig. 15: memory against context, 8B, batch {FIG15_BATCH} (x: OOM)")
    ax.legend(fontsize=7, loc="upper left")


@register("fig15", "Memory footprint against context length, 64K to 512K (paper Figure 15)", _draw_fig15)
def fig15() -> FigureResult:
    rows = []
    for design in (FULL_KV,) + SPARSE:
        for ctx in FIG15_CONTEXTS:
            bd = _bd(design, "8B", FIG15_BATCH, ctx)
            rows.append({"system": design, "context": ctx, "batch": FIG15_BATCH, "total_gb": bd.total / GB,
                         "fits": bd.fits} | {f"{c}_gb": getattr(bd, c) / GB for c in CATEGORIES})
    df = pd.DataFrame(rows)
    tot = df.set_index(["system", "context"]).total_gb
    lo, hi = FIG15_CONTEXTS[0], FIG15_CONTEXTS[-1]
    grow = lambda s: float(tot[s, hi] - tot[s, lo])  # noqa: E731
    sk = df[(df.system == SHADOWKV) & (df.context == hi)].iloc[0]
    full_fits = bool(df[(df.system == FULL_KV) & (df.context == hi)].fits.iloc[0])
    cmp = [
        Comparison("fig15.dualdecoder.64k_to_512k.growth_gb", round(grow(DUALDECODER), 2),
                   f"{fmt_tokens(hi - lo)} more tokens of landmarks at "
                   f"{_bytes_per_token(DUALDECODER, '8B', 'landmarks'):,.0f} B/token (chunk-mean keys)"),
        Comparison("fig15.shadowkv.64k_to_512k.growth_gb", round(grow(SHADOWKV), 2),
                   f"U + landmarks grow {_bytes_per_token(SHADOWKV, '8B', 'landmarks', 'aux_residency'):,.0f} "
                   f"B/token, plus the prefill SVD workspace; at {fmt_tokens(hi)} ShadowKV holds "
                   f"{sk.total_gb:.1f} GB; full-kv at 512K {'fits' if full_fits else 'is OOM'}"),
    ]
    cmp += [Comparison("setup.context.min_tokens", lo, "the shortest context replayed here (Figures 3, 12, 15)"),
            Comparison("setup.context.max_tokens", hi,
                       f"the longest context replayed here (Figures 12, 15); at {fmt_tokens(hi)} the GPU holds "
                       f"{tot[DUALDECODER, hi]:.1f} GB (DualDecoder) and {tot[SHADOWKV, hi]:.1f} GB (ShadowKV) "
                       "with one 8B request, weights included")]
    w = Workload(context=lo)
    return FigureResult(df, f"llama-3-8b on {GPU}, batch {FIG15_BATCH} (the paper's +3.7 GB matches one request), "
                        f"contexts {', '.join(fmt_tokens(c) for c in FIG15_CONTEXTS)}, budget {w.budget}, "
                        f"chunk {w.chunk}, rank {w.rank}", cmp)
