"""The simulator against the decode-step engine measured on the H200 (sim/validate.py): every
engine point replayed in the per-layer timeline mode, simulated against measured step time."""

from __future__ import annotations

from ddbench.experiments import FigureResult, register

REGIME_COLORS = {"link-bound": "tab:blue", "compute-bound": "tab:green", "launch-bound": "tab:red"}


def _draw(res: FigureResult, fig) -> None:
    df = res.data
    ax = fig.subplots(1, 1)
    for regime, color in REGIME_COLORS.items():
        s = df[df.regime == regime]
        if len(s):
            ax.scatter(s.engine_step_ms, s.sim_step_ms, s=14, color=color, label=f"{regime} ({len(s)})")
    lo = min(df.engine_step_ms.min(), df.sim_step_ms.min()) * 0.8
    hi = max(df.engine_step_ms.max(), df.sim_step_ms.max()) * 1.25
    ax.plot([lo, hi], [lo, hi], color="gray", lw=0.8, ls="--", label="y = x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("engine step (ms, measured on H200)")
    ax.set_ylabel("simulated step (ms, timeline mode)")
    ax.legend(fontsize=7)
    ax.set_title("Simulator against the decode-step engine, Llama-3-8B", fontsize=9)


@register("validation", "Simulated against measured decode step time, every H200 engine point (no paper figure)",
          _draw)
def validation() -> FigureResult:
    from sim import validate as v
    t, skipped, meta, _ = v.validate()
    s = v.summarize(t, skipped, meta)
    lb = s["link_bound"]
    setup = (f"{v.MODEL} on {v.GPU} + {v.LINK}, the engine sweep of {v.ENGINE_REL} ({s['points']} points replayed,"
             f" {len(skipped)} skipped), {s['rule']}; link-bound: sim / engine median"
             f" {lb['median_sim_over_engine']:.3f}, worst |error| {lb['worst_abs_error']:.1%};"
             f" link bytes equal at {s['link_bytes']['exact']} of {s['link_bytes']['points_with_transfers']} points")
    return FigureResult(t, setup, [])
