"""The README's verdict at 128K: the cache over ShadowKV at one matched rate set (the rates' source and interval;
the tokens/s themselves are in the results block, ddbench/doctables/results_table.py), and the cache's break-even (from figures/rates.csv, which `ddbench figures` simulates from the traces).

    verdict(root) -> markdown      the block `<!-- generated: verdict -->`
"""

from __future__ import annotations

from pathlib import Path

from ddbench.core.designs import DUALDECODER, DUALDECODER_CACHE, SHADOWKV
from ddbench.doctables.common import ROOT, DocTablesError

CACHE = DUALDECODER_CACHE


def _read_figure_csv(path: Path):
    import pandas as pd
    if not path.exists():
        raise DocTablesError(f"{path}: missing (run `python -m ddbench figures`)")
    return pd.read_csv(path)


def _at(s, design: str, end: str) -> float:
    g = s[(s["design"] == design) & (s["factor"] == 1.0) & (s["rate_end"] == end)]
    if not len(g):
        raise DocTablesError(f"figures/rates.csv: no simulated {design} at factor 1 ({end})")
    return float(g["tok_s"].iloc[0])


def _break_even(c, other: float) -> float | None:
    """The factor on the cache's rates where its simulated tokens/s falls to `other` (linear between factors)."""
    pts = sorted(zip(c["factor"], c["tok_s"]))
    for (f0, t0), (f1, t1) in zip(pts, pts[1:]):
        if t0 >= other > t1:
            return f0 + (f1 - f0) * (t0 - other) / (t0 - t1)
    return None


def verdict(root: Path = ROOT) -> str:
    from ddbench.experiments.rates_figure import CAPACITY, CTX, MODEL
    from ddbench.experiments.scene import scene
    from ddbench.core import defaults as D
    from ddbench.planner.ratelines import caption
    d = _read_figure_csv(root / "figures" / "rates.csv")
    s = d[d["source"] == "simulated"]
    tok = {x: {e: _at(s, x, e) for e in ("centre", "high", "low")} for x in (CACHE, SHADOWKV, DUALDECODER)}
    knobs = {"cache_tokens": CAPACITY * D.BUDGET}
    rs = [scene(MODEL, x, gpu="h200", **knobs) for x in (CACHE, SHADOWKV, DUALDECODER)]
    c = s[(s["design"] == CACHE) & (s["rate_end"] == "centre")]
    be = _break_even(c, tok[SHADOWKV]["centre"])
    r = rs[0].design_rates
    upper = ", ".join(f"{x.metric} x{x.mean('high') / x.mean():.1f}" for x in r.rates if x.mean() > 0)
    ratio = [tok[CACHE][e] / tok[SHADOWKV][f] for e, f in (("high", "low"), ("centre", "centre"), ("low", "high"))]
    decided = ratio[0] > 1 or ratio[2] < 1
    lead = CACHE if ratio[1] >= 1 else SHADOWKV
    say = (f"**{lead} leads at every rate in the intervals**" if decided else
           "**undecided at these rates**: the order flips inside the rates' 95 % intervals")
    if not caption(rs, (CTX,)).startswith("every design at one matched rate set"):
        raise DocTablesError(f"the verdict's designs are not at one matched rate set: {caption(rs, (CTX,))}")
    return (f"{CACHE} over ShadowKV, simulated at the same matched rates: {ratio[1]:.2f}x"
            f" [{ratio[0]:.2f}, {ratio[2]:.2f}] (the cache at its rates' worst end against ShadowKV at its best, and"
            f" the reverse); {say}. Break-even: the lead is gone at"
            f" {'more than 4' if be is None else f'{be:.1f}'}x both of the cache's rates (ShadowKV's kept); their"
            f" interval's upper end is {upper} (figures/rates.png; `plan --slo` prints both for any question).")
