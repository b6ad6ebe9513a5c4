"""The paper's throughput figures, replayed through the calibrated simulator (sim/):
Figure 3 (throughput against batch, capped by memory) and Figure 12 (decoding throughput of
Qwen2.5-32B by context); the latency figures (13, 18, 20) are latency_figures.py, on the helpers here.

The paper's testbed is one 80 GB Hopper GPU per instance on PCIe 5. We replay on the catalog's
h100-80gb with its PCIe 5 link through the shared scenario (scene.py); no bundle was measured on an
H100, so the cost model scales the H200 bundle op by op (every setup line says so). Rates: every design's from
the one matched rate set (ddbench.core.rates) at each context, and each setup line says which. Nothing here is
tuned to the paper's numbers: the settings the paper does not state are fixed below, once.
"""

from __future__ import annotations

import math
from functools import lru_cache, partial

import pandas as pd

from ddbench.core.catalog import get_gpu, get_model
from ddbench.core.designs import DUALDECODER, FULL_KV, IDEAL, SHADOWKV, SPECACHE, get_design
from ddbench.core.memory import Workload, max_batch, memory_breakdown
from ddbench.core.units import fmt_tokens
from ddbench.experiments import Comparison, FigureResult, register
from ddbench.experiments.scene import GPU, LINK, scene, workload
from ddbench.experiments import engine_points as E
from ddbench.plotting import (SYSTEM_COLORS, engine_handle, engine_mark, integer_axis, paper_handle, paper_mark,
                              plain_log_axis, style_handle)

K = 1024
SEED = 0
LABEL = {d: get_design(d).label for d in (FULL_KV, SHADOWKV, SPECACHE, DUALDECODER)}   # the registry's display names


# ---------------------------------------------------------------- shared helpers (the scenario: scene.py)
def _cm(model: str):
    return scene(model).cm


def _hit(model: str):
    r = scene(model)
    return tuple(r.hit), tuple(r.reuse), r.hit_note


def paper_value(pid: str) -> float:
    from ddbench.core.paper_numbers import reported
    return reported()[pid].value


def cost_model_note(model: str) -> str:
    notes = _cm(model).notes
    return "cost model: H200 bundle SCALED to h100-80gb" if any(n.startswith("SCALED") for n in notes) else \
        "cost model: " + notes[0]


def step_plan(design: str, model: str, ctx: int, batch: int, hit=None, gpu: str = GPU, **knobs):
    """The step plan of `batch` requests (`knobs`: Workload fields, e.g. cache_tokens; `gpu`: a catalog GPU)."""
    from ddbench.sim.run import Point, run
    r = scene(model, design, gpu=gpu, **knobs)
    h, reuse = r.hits_at(ctx) if hit is None else ([hit] * r.model.num_layers,) * 2
    return run(Point(r.design, r.model, r.cm, workload(r, ctx), batch, ctx, list(h), list(reuse),
                     cache=r.cache_rates_at(ctx)), "plan")


@lru_cache(maxsize=None)
def steady_step_time(system: str, model: str, ctx: int, batch: int, gpu: str = GPU, **knobs) -> float:
    """Steady-state decode step time from the per-layer timeline."""
    from ddbench.sim.run import run
    return run(step_plan(system, model, ctx, batch, gpu=gpu, **knobs), "timeline", steps=6, warmup=2).steady_step_s


def design_max_batch(design: str, model: str, ctx: int, gpu: str = GPU, **knobs) -> int:
    r = scene(model, design, gpu=gpu, **knobs)
    return max_batch(r.design, r.model, r.gpu, workload(r, ctx))


def _link_ceiling(system: str, model: str, ctx: int, batch: int) -> float:
    """tokens/s the link allows: the method's measured rate / H2D bytes per output token."""
    plan = step_plan(system, model, ctx, batch)
    if plan.rates is None or not plan.h2d_bytes:
        return math.inf
    return plan.rates.h2d_gbps * 1e9 / (plan.h2d_bytes / batch)


def rates_caption(model: str, designs, contexts, **knobs) -> str:
    """Which matched rate set prices the designs compared (ddbench.planner.ratelines.caption)."""
    from ddbench.planner.ratelines import caption
    return caption([scene(model, d, **knobs) for d in designs], contexts)


def setup_line(model: str, ctx: str, extra: str, label: str | None = None, designs=(SHADOWKV, DUALDECODER),
           contexts=()) -> str:
    w = Workload(context=K)
    return (f"{label or model} on {GPU} + {LINK} ({cost_model_note(model)}), context {ctx}, budget {w.budget}, "
            f"chunk {w.chunk}; {rates_caption(model, designs, contexts)}; {extra}")


# ---------------------------------------------------------------- Figure 3
F3_MODEL, F3_CTX = "llama-3-8b", 64 * K
F3_SYSTEMS = (FULL_KV, SHADOWKV, DUALDECODER)


def _draw_fig3(res: FigureResult, fig) -> None:
    df = res.data
    ax = fig.add_subplot()
    for design in F3_SYSTEMS:
        s = df[(df.system == design) & (df.kind == "capped")]
        ax.plot(s.batch, s.tokens_per_s, marker="o", ms=3, color=SYSTEM_COLORS[design], label=LABEL[design])
        u = df[(df.system == design) & (df.kind == "uncapped")]
        ax.plot(u.batch, u.tokens_per_s, ls=":", color=SYSTEM_COLORS[design])
        i = df[(df.system == design) & (df.kind == IDEAL)]
        if len(i):
            ax.plot(i.batch, i.tokens_per_s, ls="--", lw=0.8, color=SYSTEM_COLORS[design])
        e = df[(df.system == design) & (df.kind == "engine")]
        ax.plot(e.batch, e.tokens_per_s, lw=0.6, **engine_mark(SYSTEM_COLORS[design], linestyle="-"))
    for design in (FULL_KV, SHADOWKV):
        b, v = paper_value(f"fig3.{design}.max_batch"), paper_value(f"fig3.{design}.tokens_per_s")
        ax.plot([b], [v], **paper_mark(SYSTEM_COLORS[design]))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    top = int(df.batch.max())
    integer_axis(ax.xaxis, log=True, ticks=[2 ** k for k in range(top.bit_length() + 1)])
    plain_log_axis(ax.yaxis)
    ax.set_xlabel("batch (requests, log scale)")
    ax.set_ylabel("decode throughput (tokens/s)")
    ax.set_title(f"Fig. 3: {F3_MODEL} at {fmt_tokens(F3_CTX)}, throughput against batch", fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    extra = [style_handle("-", "within memory"), style_handle(":", "memory cap lifted (simulated)"),
             style_handle("--", "proportional scaling from the cap"), paper_handle("paper (coloured by design)"),
             engine_handle("engine: H200 capped at 80 GB,\nup to its largest batch")]
    ax.legend(list(uniq.values()) + extra, list(uniq.keys()) + [h.get_label() for h in extra], fontsize=6, ncol=2)


@register("fig03", "Decoding throughput of an 8B model against batch, capped by memory (paper Figure 3)", _draw_fig3)
def fig03() -> FigureResult:
    ideal_b = design_max_batch(IDEAL, F3_MODEL, F3_CTX)
    rows, cap = [], {}
    for design in F3_SYSTEMS:
        mb = design_max_batch(design, F3_MODEL, F3_CTX)
        cap[design] = mb
        grid = sorted({b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= mb} | {mb})
        for b in grid:
            rows.append({"system": design, "kind": "capped", "batch": b,
                         "tokens_per_s": b / steady_step_time(design, F3_MODEL, F3_CTX, b)})
        for b in sorted({b for b in (2 * mb, 4 * mb, 128) if mb < b < ideal_b} | {mb, ideal_b}):
            rows.append({"system": design, "kind": "uncapped", "batch": b,
                         "tokens_per_s": b / steady_step_time(design, F3_MODEL, F3_CTX, b)})
        t_max = mb / steady_step_time(design, F3_MODEL, F3_CTX, mb)
        for b in (mb, ideal_b):
            rows.append({"system": design, "kind": IDEAL, "batch": b, "tokens_per_s": t_max * b / mb})
        for b, tok in E.series(F3_MODEL, F3_CTX, design):    # measured: the engine's search under the cap
            rows.append({"system": design, "kind": "engine", "batch": b, "tokens_per_s": tok})
    df = pd.DataFrame(rows)
    df["max_batch"] = df.system.map(cap)
    df["ideal_batch"] = ideal_b

    def thr(design, b):
        return b / steady_step_time(design, F3_MODEL, F3_CTX, b)
    cmp = []
    for design, pid in ((FULL_KV, FULL_KV), (SHADOWKV, SHADOWKV)):
        mb = cap[design]
        step = steady_step_time(design, F3_MODEL, F3_CTX, mb)
        t, pot = thr(design, mb), thr(design, ideal_b)
        if design == FULL_KV:
            m = get_model(F3_MODEL)
            hbm = (m.weight_bytes + mb * F3_CTX * m.kv_bytes_per_token) / (get_gpu(GPU).hbm_gbps * 1e9)
            why = (f"HBM-bound: {step * 1e3:.1f} ms per step at batch {mb}, of which reading the weights and the whole"
                   f" {fmt_tokens(F3_CTX)}-token KV of every request takes {hbm * 1e3:.1f} ms at the datasheet"
                   f" {get_gpu(GPU).hbm_gbps:.0f} GB/s; the paper's {paper_value('fig3.full-kv.tokens_per_s'):.0f}"
                   f" tokens/s at batch {paper_value('fig3.full-kv.max_batch'):.0f} is "
                   f"{paper_value('fig3.full-kv.max_batch') / paper_value('fig3.full-kv.tokens_per_s') * 1e3:.0f} ms per step")
        else:
            ceil = _link_ceiling(design, F3_MODEL, F3_CTX, mb)
            why = (f"{step * 1e3:.1f} ms per step; the link alone would allow {ceil:.0f} tokens/s (measured gather "
                   f"rate / values of the reuse misses per token)")
        eng = E.largest(F3_MODEL, F3_CTX, design) or {}
        measured = (f"; measured on the engine (H200 capped at 80 GB, 12 % forced misses): batch {eng['batch']},"
                    f" {eng['tok_s']:.0f} tokens/s" if eng.get("tok_s") else
                    f"; measured on the engine (H200 capped at 80 GB): batch {eng['batch']}" if eng.get("batch") else "")
        cmp += [
            Comparison(f"fig3.{pid}.max_batch", mb,
                       f"memory model on {GPU} at {fmt_tokens(F3_CTX)}{measured}; the paper's limits here are "
                       f"{paper_value(f'fig3.{pid}.max_batch') / paper_value(f'fig2.{pid}.8b.max_batch'):.0f}x its Figure 2"
                       f" limit at 128K, so we take half that context"),
            Comparison(f"fig3.{pid}.tokens_per_s", round(t, 1), f"decode only, steady state at batch {mb}; {why}"),
            Comparison(f"fig3.{pid}.lost_share", round(1 - t / pot, 3),
                       f"1 - throughput at batch {mb} / the same design simulated at the ideal batch {ideal_b} with"
                       f" the memory cap lifted ({pot:.0f} tokens/s); proportional scaling instead would lose"
                       f" {1 - mb / ideal_b:.0%}. The paper does not state the endpoint of its ideal line"),
        ]
    dd = cap[DUALDECODER]
    cmp[-1] = Comparison(cmp[-1].paper_id, cmp[-1].ours,
                         cmp[-1].note + f". DualDecoder fits {dd} requests and reaches "
                                        f"{thr(DUALDECODER, dd):.0f} tokens/s: it moves the whole budget's K+V per"
                                        f" token, and the link caps it at "
                                        f"{_link_ceiling(DUALDECODER, F3_MODEL, F3_CTX, dd):.0f} tokens/s")
    setup = setup_line(F3_MODEL, fmt_tokens(F3_CTX),
                   f"decode-only steady state from the per-layer timeline; ideal batch {ideal_b} from the memory"
                   " model (weights, activations and a sparse buffer only); diamonds: ONE engine run on an H200 capped"
                   f" at 80 GB (traces/engine/{E.CAPPED}, 2026-12-01), each batch its search measured; ShadowKV has"
                   " none: that run's ShadowKV step (copy-then-regather) is not the engine's now", contexts=(F3_CTX,))
    return FigureResult(df, setup, cmp)


# ---------------------------------------------------------------- Figure 12
F12_MODEL = "qwen2.5-32b"
F12_CTX = (64 * K, 128 * K, 256 * K, 512 * K)
F12_SYSTEMS = (FULL_KV, SPECACHE, SHADOWKV, DUALDECODER)


def _draw_fig12(res: FigureResult, fig) -> None:
    df = res.data
    ax = fig.add_subplot()
    ctxs = list(dict.fromkeys(df.context))
    width = 0.8 / len(F12_SYSTEMS)
    top = float(max(df.tokens_per_s.max(), df.engine_tokens_per_s_max.max()))
    for i, design in enumerate(F12_SYSTEMS):
        sub = df[df.system == design].set_index("context").loc[ctxs]
        xs = [j + (i - (len(F12_SYSTEMS) - 1) / 2) * width for j in range(len(ctxs))]
        vals = sub.tokens_per_s.fillna(0).tolist()
        ax.bar(xs, vals, width, label=LABEL[design], color=SYSTEM_COLORS[design])
        for x, v, oom in zip(xs, vals, sub.oom):
            ax.text(x, v + 0.01 * top, "OOM" if oom else f"{v:.0f}", ha="center", va="bottom", fontsize=6)
        for x, v, lo, hi in zip(xs, sub.engine_tokens_per_s, sub.engine_tokens_per_s_min, sub.engine_tokens_per_s_max):
            if pd.notna(v):
                ax.errorbar([x], [v], yerr=[[v - lo], [hi - v]], ecolor="black", elinewidth=0.8,
                            **engine_mark(SYSTEM_COLORS[design]))
    ax.plot([(len(F12_SYSTEMS) - 1) / 2 * width], [paper_value("fig12.64k.dualdecoder.tokens_per_s")],
            **paper_mark(SYSTEM_COLORS[DUALDECODER]))  # DualDecoder at 64K
    ax.set_xticks(range(len(ctxs)), [fmt_tokens(c) for c in ctxs])
    ax.set_xlabel("context (tokens per request)")
    ax.set_ylabel("decode throughput (tokens/s)")
    ax.set_ylim(0, 1.35 * top)
    ax.set_title("Fig. 12: Qwen2.5-32B decoding throughput at each design's largest batch", fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(list(uniq.values()) + [paper_handle(), engine_handle()],
              list(uniq.keys()) + ["paper (DualDecoder, 64K)", "engine: H200 capped at 80 GB"], fontsize=6,
              ncol=3, loc="upper center")


@register("fig12", "Decoding throughput of Qwen2.5-32B at 64K to 512K per design (paper Figure 12)", _draw_fig12)
def fig12() -> FigureResult:
    df = _fig12_rows()
    t = {(r.context, r.system): r for r in df.itertuples()}
    setup = setup_line(F12_MODEL, "/".join(fmt_tokens(c) for c in F12_CTX),
                   "each design at its largest batch that fits (memory model), decode-only steady state from the"
                   " per-layer timeline (prefill not counted); diamonds: ONE engine run, on an H200 capped at 80 GB at"
                   f" each design's largest batch, median and range over 3 builds in one process (traces/engine/{E.CAPPED},"
                   " 2026-12-01, at a forced 12 % miss); ShadowKV has none: that run's ShadowKV step (copy-then-regather)"
                   " is not the engine's now",
                   designs=(SHADOWKV, SPECACHE, DUALDECODER), contexts=tuple(F12_CTX))
    return FigureResult(df, setup, _fig12_comparisons(t))


def _fig12_rows() -> pd.DataFrame:
    """Each design at each context: its largest batch, steady step, tokens/s and link ceiling, beside the
    engine's largest measured batch (capped at 80 GB)."""
    rows = []
    for ctx in F12_CTX:
        for design in F12_SYSTEMS:
            mb = design_max_batch(design, F12_MODEL, ctx)
            step = steady_step_time(design, F12_MODEL, ctx, mb) if mb else math.nan
            eng = E.largest(F12_MODEL, ctx, design) or {}
            rows.append({"context": ctx, "system": design, "max_batch": mb, "oom": mb == 0, "step_ms": step * 1e3,
                         "tokens_per_s": mb / step if mb else math.nan,
                         "link_ceiling_tokens_per_s": _link_ceiling(design, F12_MODEL, ctx, mb) if mb else math.nan,
                         "engine_batch": eng.get("batch", math.nan), "engine_tokens_per_s": eng.get("tok_s", math.nan),
                         "engine_tokens_per_s_min": eng.get("tok_s_min", math.nan),
                         "engine_tokens_per_s_max": eng.get("tok_s_max", math.nan)})
    return pd.DataFrame(rows)


def _f12_ratio(t, ctx, other) -> float:
    a, b = t[(ctx, DUALDECODER)], t[(ctx, other)]
    return a.tokens_per_s / b.tokens_per_s if not b.oom and not a.oom else math.nan


def _f12_desc(t, ctx, design) -> str:
    r = t[(ctx, design)]
    if r.oom:
        return f"{LABEL[design]} OOM"
    return f"{LABEL[design]} batch {r.max_batch}, {r.step_ms:.0f} ms/step, {r.tokens_per_s:.1f} tokens/s"


def _f12_measured(t, ctx, other) -> str:
    a, b = t[(ctx, DUALDECODER)], t[(ctx, other)]
    if not (a.engine_tokens_per_s > 0 and b.engine_tokens_per_s > 0):
        return ""
    return (f"; measured on the engine (H200 capped at 80 GB, 12 % forced misses, 3 builds): DualDecoder batch"
            f" {a.engine_batch:.0f} {a.engine_tokens_per_s:.1f} tokens/s, {LABEL[other]} batch {b.engine_batch:.0f}"
            f" {b.engine_tokens_per_s:.1f}: {a.engine_tokens_per_s / b.engine_tokens_per_s:.2f}x"
            f" ({a.engine_tokens_per_s_min / b.engine_tokens_per_s_max:.2f}-"
            f"{a.engine_tokens_per_s_max / b.engine_tokens_per_s_min:.2f})")


def _f12_note(t, ctx, other) -> str:
    a, b = t[(ctx, DUALDECODER)], t[(ctx, other)]
    base = f"{_f12_desc(t, ctx, DUALDECODER)} against {_f12_desc(t, ctx, other)}" + _f12_measured(t, ctx, other)
    if b.oom:
        m = get_model(F12_MODEL)
        return (base + f": weights {m.weight_bytes / 1e9:.1f} GB + one request's state exceed {GPU}'s "
                       f"{get_gpu(GPU).hbm_bytes / 1e9:.1f} GB in our memory model, so no ratio")
    return base + (f"; DualDecoder's link ceiling {a.link_ceiling_tokens_per_s:.0f} tokens/s"
                   if math.isfinite(a.link_ceiling_tokens_per_s) else "")


def _f12_oom(t, ctx, design) -> Comparison:
    r = t[(ctx, design)]
    sc = scene(F12_MODEL, design)
    bd = memory_breakdown(sc.design, sc.model, sc.gpu, workload(sc, ctx))
    return Comparison(f"fig12.{fmt_tokens(ctx).lower()}.{design}.max_batch", r.max_batch,
                      f"memory model: one request at {fmt_tokens(ctx)} needs {bd.total / 1e9:.1f} GB with the weights, "
                      f"{GPU} has {bd.capacity / 1e9:.1f} GB" + ("" if r.oom else
                                                                f"; {r.max_batch} fit, {r.tokens_per_s:.1f} tokens/s"))


def _fig12_comparisons(t) -> list:
    """Figure 12's numbers against the paper's: DualDecoder at 64K, its ratios over the others, the memory
    limits, and the longest context."""
    ratio, note = partial(_f12_ratio, t), partial(_f12_note, t)
    c64 = 64 * K
    dd64 = t[(c64, DUALDECODER)]
    cmp = [
        Comparison("fig12.64k.dualdecoder.tokens_per_s", round(dd64.tokens_per_s, 1),
                   f"batch {dd64.max_batch} (memory), {dd64.step_ms:.0f} ms per step: the link-bound ceiling is "
                   f"{dd64.link_ceiling_tokens_per_s:.0f} tokens/s (measured gather rate / "
                   f"{step_plan(DUALDECODER, F12_MODEL, c64, 1).h2d_bytes / 1e6:.0f} MB of K+V per token incl. misses)"),
        Comparison("fig12.64k.over_shadowkv", round(ratio(c64, SHADOWKV), 2), note(c64, SHADOWKV)),
        Comparison("fig12.64k.over_specache", round(ratio(c64, SPECACHE), 2), note(c64, SPECACHE)),
        Comparison("fig12.64k.over_vllm", round(ratio(c64, FULL_KV), 2), note(c64, FULL_KV)),
        Comparison("fig12.128k.over_shadowkv", round(ratio(128 * K, SHADOWKV), 2), note(128 * K, SHADOWKV)),
        Comparison("fig12.128k.over_specache", round(ratio(128 * K, SPECACHE), 2), note(128 * K, SPECACHE)),
        Comparison("fig12.256k.over_shadowkv", round(ratio(256 * K, SHADOWKV), 2),
                   note(256 * K, SHADOWKV) + ("; SpeCache fits " + str(t[(256 * K, SPECACHE)].max_batch)
                                                 + " request(s) here, the paper reports OOM"
                                                 if not t[(256 * K, SPECACHE)].oom else "; SpeCache OOM as in the paper")),
    ]
    top = F12_CTX[-1]
    cmp += [_f12_oom(t, 128 * K, FULL_KV), _f12_oom(t, 256 * K, FULL_KV), _f12_oom(t, 256 * K, SPECACHE)]
    cmp.append(Comparison("fig12.context.max_tokens", top,
                          f"the paper prints no number at {fmt_tokens(top)}; here " + "; ".join(
                              _f12_desc(t, top, s) for s in F12_SYSTEMS)
                          + (f"; DualDecoder/ShadowKV {ratio(top, SHADOWKV):.2f}" if math.isfinite(ratio(top, SHADOWKV))
                             else "")))
    return cmp
