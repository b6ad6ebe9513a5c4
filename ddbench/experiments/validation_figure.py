"""The simulator against the decode-step engine measured on the H200 (sim/validate.py): every
engine point replayed in the per-layer timeline mode, simulated against measured step time."""

from __future__ import annotations

from ddbench.experiments import FigureResult, register

REGIME_COLORS = {"link-bound": "tab:blue", "overlap": "tab:orange", "compute-only": "tab:green"}


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
    from ddbench.sim.fit import validation as v
    from ddbench.sim.fit.summary import summarize
    t, skipped, meta, _ = v.validate()
    s = summarize(t, skipped, meta)
    errs = "; ".join(f"{k}: median |error| {x['median_abs_error']:.1%} ({x['points']} points)"
                     for k, x in s["regimes"].items() if x["points"])
    sw = s.get("sweeps", {})
    val, cal = sw.get("validated", {}), sw.get("calibration", {})
    runs = (f"the engine sweep of {val.get('folder', v.ENGINE_REL)} (seed {val.get('seed')}, git {val.get('git_sha')})"
            f" against a simulator calibrated on {cal.get('folder')}"
            + (" (the same run)" if sw.get("same_run") else " (a separate run)"))
    setup = (f"{v.MODEL} on {v.GPU} + {v.LINK}, {runs} ({s['points']} points replayed,"
             f" none used for calibration; {len(skipped)} skipped), {s['rule']}; {errs};"
             f" link bytes equal at {s['link_bytes']['exact']} of {s['link_bytes']['points_with_transfers']} points")
    return FigureResult(t, setup, [])


# ---------------------------------------------------------------- one step, measured beside simulated
LANES = ("compute", "prefetch (link)", "urgent misses (link)")
LANE_COLORS = {"compute": "#4c72b0", "stall": "#dddddd", "prefetch (link)": "#55a868", "urgent misses (link)": "#c44e52"}


def _measured_lanes(tl: dict) -> list[tuple[str, float, float, str]]:
    """(lane, start ms, end ms, kernel) of the first step of the profiled replay (a replay holds two)."""
    ev = []
    for kernels in tl["streams"].values():
        for name, ts, dur in kernels:
            lane = ("prefetch (link)" if name.startswith("_gather_kernel") else
                    "urgent misses (link)" if name.startswith("_slot_gather_kernel") else "compute")
            ev.append((lane, ts / 1e3, (ts + dur) / 1e3, name))
    ev.sort(key=lambda e: e[1])
    step = float(tl["row"]["step_ms"])
    return [e for e in ev if e[1] < step]


def _draw_timeline(res: FigureResult, fig) -> None:
    df = res.data
    axes = fig.subplots(2, 1, sharex=True)
    for ax, (src, title) in zip(axes, (("measured", "measured: kernels of one CUDA-graph step (torch.profiler)"),
                                       ("simulated", "simulated: timeline mode, engine-calibrated compute"))):
        s = df[df.source == src]
        for y, lane in enumerate(LANES):
            part = s[s.lane == lane]
            ax.broken_barh(list(zip(part.start_ms, part.end_ms - part.start_ms)), (y - 0.4, 0.8),
                           color=LANE_COLORS[lane], lw=0)
        st = s[s.lane == "stall"]
        if len(st):
            ax.broken_barh(list(zip(st.start_ms, st.end_ms - st.start_ms)), (-0.4, 0.8), color=LANE_COLORS["stall"],
                           lw=0, label="compute waits on the link")
            ax.legend(fontsize=6, loc="upper right")
        ax.set_yticks(range(len(LANES)), LANES, fontsize=7)
        ax.set_title(title, fontsize=8)
        ax.set_ylabel("stream / link class (lane)", fontsize=7)
        ax.set_xlabel("time from the step's first kernel (ms)", fontsize=7)


@register("timeline", "One decode step, measured on the H200 engine beside the simulator's timeline of the same point"
          " (no paper figure)", _draw_timeline)
def timeline() -> FigureResult:
    import json
    import os

    import pandas as pd

    from ddbench.core import defaults as D
    from ddbench.core.paths import traces_dir
    from ddbench.experiments.scene import scene
    from ddbench.sim.fit import validation as v
    from ddbench.sim.run import run
    path = str(traces_dir("engine", v.GPU, "timeline.json"))
    with open(path, encoding="utf-8") as fh:
        tl = json.load(fh)
    p = tl["point"]
    rows = [dict(source="measured", lane=lane, start_ms=a, end_ms=b, what=name)
            for lane, a, b, name in _measured_lanes(tl)]
    cm = scene(v.MODEL, gpu=v.GPU, link=v.LINK, hit_rate=D.HIT_RATE).cm   # the point's miss rate is its own
    miss = v.effective_miss(float(p["miss_rate"]), 2048, 8)
    plan = v.replay_plan(p["design"], p["context"], p["batch"], miss, True, cm)
    res = run(plan, "timeline", steps=4, warmup=2, record=True)
    t0 = sum(res.step_s[:res.warmup])
    t1 = t0 + res.step_s[res.warmup]
    for track, name, a, b in res.events:
        if not (t0 <= a < t1):
            continue
        lane = {"h2d": "urgent misses (link)" if "urgent" in name else "prefetch (link)"}.get(track)
        if track == "gpu":
            lane = "stall" if name.endswith("stall") else "compute"
        if lane is None:
            continue
        rows.append(dict(source="simulated", lane=lane, start_ms=(a - t0) * 1e3, end_ms=(min(b, t1) - t0) * 1e3,
                         what=name))
    df = pd.DataFrame(rows)
    meas = float(tl["row"]["step_ms"])
    setup = (f"{p['design']} {p['context'] // 1024}K, batch {p['batch']}, forced {p['miss_rate']:.0%} misses; measured"
             f" step {meas:.2f} ms (median of the replays of {os.path.basename(path)}, graph of 2 steps; the first"
             f" step's kernels drawn), simulated {res.step_s[res.warmup] * 1e3:.2f} ms. Measured lanes by kernel:"
             " _gather_kernel = prefetch, _slot_gather_kernel = urgent misses, all else compute (inside a graph the"
             " profiler reports the graph's internal streams, not the capture streams)")
    return FigureResult(df, setup, [])
