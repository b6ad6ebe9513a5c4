"""The simulator's sensitivity to the accuracy profile's rates:

  sensitivity  DualDecoder/ShadowKV throughput at Figure 12's setting (Qwen2.5-32B, h100-80gb + PCIe 5,
               128K, budget 2048, each at its largest batch) against DualDecoder's hit rate and ShadowKV's
               reuse rate, with the measured rates (read as accuracy_figures.py reads them) and the paper's
               0.88 marked
"""

from __future__ import annotations

import math

import pandas as pd

from ddbench.core.designs import DUALDECODER, SHADOWKV
from ddbench.core.units import fmt_tokens
from ddbench.experiments import FigureResult, register
from ddbench.experiments.accuracy_figures import profiled_contexts, profiled_models, profile_path, profile_rates
from ddbench.plotting import PAPER_MARK

# Figure 12's setting (ddbench/experiments/sim_figures.py)
SENS_MODEL, SENS_GPU, SENS_LINK, SENS_CTX = "qwen2.5-32b", "h100-80gb", "pcie5", 128 * 1024
SENS_GRID = tuple(round(0.1 * i, 1) for i in range(11))      # 0.0 .. 1.0 for both axes


def _sens_scene(design: str):
    """Figure 12's scenario for `design` (the hit rates are the map's own, so a constant stands in)."""
    from ddbench.core import defaults as D
    from ddbench.experiments.scene import scene
    return scene(SENS_MODEL, design, gpu=SENS_GPU, link=SENS_LINK, hit_rate=D.HIT_RATE)


def _sens_batch(design: str) -> int:
    from ddbench.core.memory import max_batch
    from ddbench.experiments.scene import workload
    r = _sens_scene(design)
    return max_batch(r.design, r.model, r.gpu, workload(r, SENS_CTX))


def sens_tokens_per_s(design: str, hit, reuse, mode: str = "aggregate") -> float:
    """Decode tokens/s of `design` at Figure 12's 128K setting and its largest batch, with per-layer (or
    constant) hit and reuse rates; `mode`: the closed-form aggregate step, or the per-layer timeline."""
    from ddbench.experiments.scene import workload
    from ddbench.sim.run import Point, run
    r = _sens_scene(design)
    L = r.model.num_layers
    h = [float(hit)] * L if isinstance(hit, (int, float)) else list(hit)
    reu = [float(reuse)] * L if isinstance(reuse, (int, float)) else list(reuse)
    b = _sens_batch(design)
    plan = run(Point(r.design, r.model, r.cm, workload(r, SENS_CTX), b, SENS_CTX, h, reu), "plan")
    if mode == "timeline":
        return b / run(plan, "timeline", steps=6, warmup=2).steady_step_s
    return b / run(plan, "aggregate").step_s


def _draw_sens(res: FigureResult, fig) -> None:
    import numpy as np
    df = res.data
    grid = df[df.kind == "grid"]
    hs, rs = sorted(grid.hit_rate.unique()), sorted(grid.reuse_rate.unique())
    z = grid.pivot(index="hit_rate", columns="reuse_rate", values="ratio").loc[hs, rs].to_numpy()
    fig.set_size_inches(6.6, 4.6)
    ax = fig.add_subplot()
    lim = max(abs(math.log2(float(np.nanmin(z)))), abs(math.log2(float(np.nanmax(z)))))
    from matplotlib.colors import TwoSlopeNorm
    mesh = ax.pcolormesh(rs, hs, np.log2(z), shading="nearest", cmap="RdBu", norm=TwoSlopeNorm(0, -lim, lim))
    cb = fig.colorbar(mesh, ax=ax)
    ticks = [t for t in (-2, -1, 0, 1, 2, 3) if -lim <= t <= lim]
    cb.set_ticks(ticks, labels=[f"{2 ** t:g}x" for t in ticks])
    cb.set_label("DualDecoder / ShadowKV tokens/s", fontsize=7)
    cs = ax.contour(rs, hs, z, levels=[1.0], colors="black", linewidths=1.5)
    ax.clabel(cs, fmt={1.0: "1.0: verdict flips"}, fontsize=6)
    more = ax.contour(rs, hs, z, levels=[0.5, 1.5, 2.0, 3.0], colors="grey", linewidths=0.5)
    ax.clabel(more, fmt="%.1fx", fontsize=5)
    pp = df[df.kind == "paper"].iloc[0]
    ax.plot([pp.reuse_rate], [pp.hit_rate], **{**PAPER_MARK, "label": f"paper's assumed 0.88: {pp.ratio:.2f}x"})
    for r in df[df.kind == "measured"].itertuples():
        ax.plot([r.reuse_rate], [r.hit_rate], marker="o", mfc="yellow", mec="black", ls="none", ms=7,
                label=f"{r.source}: hit {r.hit_rate:.2f}, reuse {r.reuse_rate:.2f}: {r.ratio:.2f}x")
    ax.set_xlabel("ShadowKV reuse rate (share of step t+1's selection held from step t)", fontsize=7)
    ax.set_ylabel("DualDecoder hit rate (share of step t+1's selection predicted at step t)", fontsize=7)
    cb.ax.set_xlabel("(ratio)", fontsize=6)
    ax.set_title("Sensitivity at Fig. 12's setting: Qwen2.5-32B, h100-80gb + PCIe 5, 128K, budget 2048,"
                 f" batch {int(pp.dd_batch)} vs {int(pp.sk_batch)}", fontsize=7)
    fig.legend(fontsize=6, loc="outside lower center", ncol=1, frameon=False)


@register("sensitivity", "DualDecoder/ShadowKV throughput against hit and reuse rate at Figure 12's setting",
          _draw_sens)
def sensitivity() -> FigureResult:
    from ddbench.core.catalog import get_model
    from ddbench.sim.hitrates import load_hitrates
    model = profiled_models("sensitivity")[0]
    prof = profile_rates(model)
    # separable: DualDecoder's step depends on its hit rate only, ShadowKV's (no prefetch, reuse) on
    # its reuse rate only, so the grid costs len(SENS_GRID) evaluations of each
    dd = {h: sens_tokens_per_s(DUALDECODER, h, h) for h in SENS_GRID}
    sk = {r: sens_tokens_per_s(SHADOWKV, r, r) for r in SENS_GRID}
    bdd, bsk = _sens_batch(DUALDECODER), _sens_batch(SHADOWKV)
    rows = [{"kind": "grid", "source": "aggregate step", "hit_rate": h, "reuse_rate": r,
             "dualdecoder_tokens_per_s": dd[h], "shadowkv_tokens_per_s": sk[r], "ratio": dd[h] / sk[r],
             "dd_batch": bdd, "sk_batch": bsk} for h in SENS_GRID for r in SENS_GRID]

    def point(kind, source, h, r, hl=None, rl=None):
        out = {}
        for mode in ("aggregate", "timeline"):
            a = sens_tokens_per_s(DUALDECODER, hl or h, hl or h, mode)
            b = sens_tokens_per_s(SHADOWKV, rl or r, rl or r, mode)
            out[mode] = (a, b)
        a, b = out["timeline"]
        return {"kind": kind, "source": source, "hit_rate": h, "reuse_rate": r, "dualdecoder_tokens_per_s": a,
                "shadowkv_tokens_per_s": b, "ratio": a / b, "ratio_aggregate": out["aggregate"][0] / out["aggregate"][1],
                "dd_batch": bdd, "sk_batch": bsk}
    paper = point("paper", "paper's assumed rate (§4.1)", 0.88, 0.88)
    label = f"{model} ({prof.layers} layers) at {profiled_contexts(model)}: that model's rates, not Qwen2.5-32B's"
    meas = point("measured", f"measured on {label}: layer means", prof.hit_mean, prof.reuse_mean)
    L = get_model(SENS_MODEL).num_layers
    h_map, r_map, map_note = load_hitrates(profile_path(model, "csv"), L, target=SENS_MODEL)
    mapped = point("measured", f"measured on {label}: per layer, mapped by depth", prof.hit_mean, prof.reuse_mean,
                   h_map, r_map)
    mapped["kind"] = "measured-per-layer"
    df = pd.DataFrame(rows + [paper, meas, mapped])
    # where the verdict flips at the measured reuse rate: the hit rate below which DualDecoder loses
    sk_meas = meas["shadowkv_tokens_per_s"]
    flip = [h for h in SENS_GRID if dd[h] / sk_meas >= 1.0]
    setup = (f"{SENS_MODEL} on {SENS_GPU} + {SENS_LINK}, context {fmt_tokens(SENS_CTX)}, budget 2048, DualDecoder batch"
             f" {bdd}, ShadowKV batch {bsk} (each its largest that fits); grid {len(SENS_GRID)}x{len(SENS_GRID)} from"
             f" the aggregate step, marked points from the per-layer timeline (as Figure 12); paper point 0.88/0.88:"
             f" {paper['ratio']:.2f}x; measured {meas['source']} (hit {prof.hit_mean:.3f}, reuse {prof.reuse_mean:.3f},"
             f" {prof.selection}): {meas['ratio']:.2f}x; per layer ({map_note.split(': ', 1)[1].split(';')[0]}):"
             f" {mapped['ratio']:.2f}x; at the measured reuse rate DualDecoder wins for hit >= (grid step 0.1, aggregate) "
             f"{min(flip) if flip else 'none on the grid'}")
    return FigureResult(df, setup, [])
