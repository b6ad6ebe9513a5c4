"""Beyond the paper: fp8 (e4m3) host KV for dualdecoder-cache and ShadowKV on the H200, Llama-3-8B at
32K / 64K / 128K, each at its largest batch, beside the same designs in bf16 from the same engine run.

Measured: traces/engine/h200-compare (its README; the current engine's code, run 2026-12-04, ShadowKV in
place): tokens/s over 3 builds in one process (min / median / max) and the link bytes per token;
dualdecoder-cache at 4x the budget at the SmolLM2 trend's rates, ShadowKV at a forced 12 % miss: NOT one matched
rate set, so the bars compare fp8 with bf16 within each design; the designs are compared by the simulator at one
matched rate set (circles). Simulated: `ddbench simulate`'s cost model (cache_figure.simulated) at the engine's
batch, at each row's own rates and at the matched rates; ShadowKV's fp8 values (1 KiB pieces) have no measured rate in the calibration bundle, so they are
not simulated (NaN, said in the setup). Not a paper figure: no paper number.
"""

from __future__ import annotations

import pandas as pd

from ddbench.core.designs import SHADOWKV
from ddbench.core.errors import DDBenchError
from ddbench.core.units import fmt_tokens
from ddbench.experiments import FigureResult, register
from ddbench.experiments.cache_figure import (CACHE, CACHE_COLOR, CONTEXTS, GPU, MODEL, engine_largest, forced_miss,
                                              forced_rates, simulated)
from ddbench.plotting import SYSTEM_COLORS

RUN = "h200-compare"
CACHE_LABEL = f"{CACHE}@8192"
BARS = ((f"{CACHE_LABEL}+fp8", "dualdecoder-cache fp8"), (CACHE_LABEL, "dualdecoder-cache bf16"),
        (SHADOWKV, "ShadowKV bf16"), ("shadowkv+fp8", "ShadowKV fp8 values"))


def _sim(r, matched: bool = False) -> float:
    """The simulator at the engine row's batch: at the rates the row ran at, or (matched) at the one matched
    rate set that prices every design alike."""
    rates = {} if matched else {"forced": forced_rates(r), "miss": forced_miss(r)}
    try:
        return simulated(r.design, int(r.context), int(r.batch), None if pd.isna(r.cache_tokens) else int(r.cache_tokens),
                         kv_bits=int(r.kv_bits), **rates)["tok_s"]
    except DDBenchError:        # a piece size the bundle never measured: not priced
        return float("nan")


def bars(df: pd.DataFrame) -> pd.DataFrame:
    """Per context and bar: the engine row drawn (the cache at 4x the budget; its fp8 cache slots are not drawn)."""
    out = []
    for ctx in CONTEXTS:
        for label, name in BARS:
            c = df[(df.context == ctx) & (df.label == label)]
            if len(c):
                out.append({**c.iloc[0].to_dict(), "bar": name})
    return pd.DataFrame(out)


def _draw(res: FigureResult, fig) -> None:
    b = res.data[res.data.drawn]
    fig.set_size_inches(9.0, 3.6)
    axes = fig.subplots(1, 2)
    colors = (CACHE_COLOR, "#c5b0d5", SYSTEM_COLORS[SHADOWKV], "#ffbb78")
    width = 0.2
    for i, ((_, name), color) in enumerate(zip(BARS, colors)):
        s = b[b.bar == name].set_index("context").reindex(CONTEXTS)
        x = [j + (i - 1.5) * width for j in range(len(CONTEXTS))]
        axes[0].bar(x, s.tok_s, width, color=color, label=name,
                    yerr=[s.tok_s - s.tok_s_min, s.tok_s_max - s.tok_s], error_kw=dict(lw=0.7))
        axes[0].plot(x, s.sim_tok_s, ls="none", marker="x", color="black", ms=4)
        axes[0].plot(x, s.sim_tok_s_matched, ls="none", marker="o", mfc="none", color="black", ms=4)
        axes[1].bar(x, s.link_mib_per_token, width, color=color)
    for ax, y, t in zip(axes, ("decode throughput (tokens/s)", "link bytes per token (MiB)"),
                        ("(a) engine: median, min-max of 3 builds; x: simulated at its rates;\no: SIMULATED at one"
                         " matched rate set (compare designs by these)",
                         "(b) what crosses PCIe, per output token")):
        ax.set_xticks(range(len(CONTEXTS)), [fmt_tokens(c) for c in CONTEXTS])
        ax.set_xlabel("context")
        ax.set_ylabel(y)
        ax.set_title(t, fontsize=8)
    axes[0].legend(fontsize=6)
    fig.suptitle("fp8 host KV against bf16, each design on one H200 (PCIe 5), Llama-3-8B, at its largest batch;"
                 " engine of 2026-12-04", fontsize=9)


@register("fp8", "fp8 host KV: dualdecoder-cache and ShadowKV in fp8 and bf16 (H200, Llama-3-8B)", draw=_draw)
def compute() -> FigureResult:
    eng = engine_largest(RUN)   # both designs from one run of one engine (ShadowKV in place)
    eng["sim_tok_s"] = [_sim(r) for r in eng.itertuples()]
    eng["sim_over_engine"] = eng.sim_tok_s / eng.tok_s
    eng["sim_tok_s_matched"] = [_sim(r, matched=True) for r in eng.itertuples()]
    drawn = bars(eng)
    which = dict(zip(zip(drawn.context, drawn.label), drawn.bar))
    eng["bar"] = [which.get((c, lab), "") for c, lab in zip(eng.context, eng.label)]
    eng["drawn"] = eng.bar != ""
    gain = []
    for fp8, bf16 in ((BARS[0][1], BARS[1][1]), (BARS[3][1], BARS[2][1])):
        per = []
        for ctx in CONTEXTS:
            d = drawn[drawn.context == ctx].set_index("bar").tok_s
            per.append(f"{fmt_tokens(ctx)} {d.get(fp8, float('nan')) / d.get(bf16, float('nan')):.2f}x")
        gain.append(f"{fp8} / bf16: {', '.join(per)}")
    eng["model"], eng["gpu"] = MODEL, GPU
    from ddbench.experiments.scene import scene
    from ddbench.planner.ratelines import caption
    matched = caption([scene(MODEL, d, gpu=GPU, **({"cache_tokens": 8192} if d == CACHE else {}))
                       for d in (CACHE, SHADOWKV)], tuple(CONTEXTS))
    return FigureResult(eng, f"{MODEL} on one H200 over PCIe 5, ONE engine run, {RUN} (2026-12-04, the current engine's"
                             " code, ShadowKV in place; 3 builds in one process per design, each at its largest batch;"
                             " the cache at 4x the budget at the SmolLM2 trend's rates, ShadowKV at a forced 12 % miss:"
                             f" the bars compare fp8 with bf16 within a design); {'; '.join(gain)}; across designs:"
                             f" SIMULATED at the engine's batches at {matched} (circles, sim_tok_s_matched);"
                             " ShadowKV's fp8 values not simulated (no measured rate for 1 KiB pieces)")
