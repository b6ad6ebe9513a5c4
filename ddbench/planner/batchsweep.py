"""`simulate --batch` over several batches: each design's tokens/s and step time against batch, and where
the designs cross over.

    batches = parse_batches("1:64")            # (1, 2, 4, 8, 16, 32, 64)
    sweep = summarize(points, batches, max_batch)   # points: {design: [timeline summary per batch]}
    print(render(sweep)); plot(sweep, path)

The grammar of `--batch` is a comma list of items, each one of
- N: one batch;
- LO:HI: LO doubling up to HI (LO, 2 LO, 4 LO, ... below HI), HI included: 1:64 is 1,2,4,...,64;
- LO:HI:STEP: LO stepping by STEP up to HI, HI included: 1:64:8 is 1,9,17,...,57,64.
The batches are sorted and each is run once; at most MAX_BATCHES of them.

A batch beyond a design's memory (GPU, and host memory where it is bounded) is "does not fit", with no
throughput. The ranking at a batch orders the designs that fit there by tokens/s; a crossover is a pair
of designs whose order flips between two neighbouring batches of the sweep where both fit (reported at
the later one, with the earlier beside it); the best design at each batch is the first of its ranking,
so it also changes where the leader stops fitting.
"""

from __future__ import annotations

import argparse

from ddbench.core import defaults as D
from ddbench.core.units import GB

MAX_BATCHES = 256        # batches one sweep may run (per design)


def _int(text: str, whole: str) -> int:
    from ddbench.core import flags
    try:
        return flags.integer(lo=1, hi=D.MAX_COUNT)(text)
    except argparse.ArgumentTypeError as exc:
        if text.strip() == whole.strip():
            raise
        raise argparse.ArgumentTypeError(f"{whole!r}: {exc}") from None


def parse_batches(text: str) -> tuple[int, ...]:
    """The batches of a `--batch` value (the module's grammar), sorted and each once; an argparse type
    (ArgumentTypeError, one line, for anything else)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: is empty")
    out: set[int] = set()
    for item in (p.strip() for p in text.split(",")):
        if not item:
            raise argparse.ArgumentTypeError(f"{text!r}: has an empty item (use N, LO:HI or LO:HI:STEP,"
                                             " comma separated)")
        parts = item.split(":")
        if len(parts) > 3:
            raise argparse.ArgumentTypeError(f"{text!r}: '{item}' is not N, LO:HI or LO:HI:STEP")
        nums = [_int(p, text) for p in parts]
        if len(nums) == 1:
            out.add(nums[0])
            continue
        lo, hi = nums[0], nums[1]
        if lo > hi:
            raise argparse.ArgumentTypeError(f"{text!r}: the range {item} starts above its end")
        step = nums[2] if len(nums) == 3 else None
        b = lo
        while b < hi and len(out) <= MAX_BATCHES:
            out.add(b)
            b = b + step if step is not None else 2 * b
        out.add(hi)
        if len(out) > MAX_BATCHES:
            break
    if len(out) > MAX_BATCHES:
        raise argparse.ArgumentTypeError(f"{text!r}: more than {MAX_BATCHES} batches; take a coarser step")
    return tuple(sorted(out))


# ---------------------------------------------------------------- the sweep's answer
POINT_KEYS = ("batch", "status", "tokens_per_s", "step_ms", "stall_ms_per_step", "link_utilisation",
              "h2d_bytes_per_step", "peak_buffer_bytes", "reason")


def summarize(points: dict[str, list[dict]], batches: tuple[int, ...], max_batch: dict[str, int]) -> dict:
    """{design: [the timeline summary of each batch]} -> the sweep: per design its max batch and points, the
    ranking and best design at each batch, and the crossovers."""
    designs = {name: {"max_batch": max_batch[name],
                      "points": [{k: s.get(k) for k in POINT_KEYS} | {"memory_gb": s["memory_bytes"]["total"] / GB}
                                 for s in pts]}
               for name, pts in points.items()}
    tput = {name: {p["batch"]: p["tokens_per_s"] for p in d["points"] if p["status"] == "ok"}
            for name, d in designs.items()}
    order = list(designs)
    ranking = {b: sorted((n for n in order if b in tput[n]), key=lambda n: (-tput[n][b], order.index(n)))
               for b in batches}
    crossovers = []
    for prev, b in zip(batches, batches[1:]):
        for i, a in enumerate(order):
            for c in order[i + 1:]:
                if not all(x in tput[n] for x in (prev, b) for n in (a, c)):
                    continue
                before, after = tput[a][prev] - tput[c][prev], tput[a][b] - tput[c][b]
                if before * after < 0:
                    win, lose = (a, c) if after > 0 else (c, a)
                    crossovers.append({"batch": b, "previous_batch": prev, "design": win, "overtakes": lose,
                                       "tokens_per_s": {win: tput[win][b], lose: tput[lose][b]},
                                       "tokens_per_s_before": {win: tput[win][prev], lose: tput[lose][prev]}})
    return {"mode": "batch-sweep", "batches": list(batches), "designs": designs,
            "ranking": [{"batch": b, "designs": ranking[b]} for b in batches],
            "best": [{"batch": b, "design": ranking[b][0] if ranking[b] else None} for b in batches],
            "crossovers": crossovers,
            "rule": "ranking: the designs that fit at a batch by tokens/s; crossover: two designs' order flips"
                    " between neighbouring batches where both fit"}


def _spans(best: list[dict]) -> list[tuple[str | None, int, int]]:
    """[(design, first batch, last batch)] of the runs of one best design."""
    out: list[list] = []
    for e in best:
        if out and out[-1][0] == e["design"]:
            out[-1][2] = e["batch"]
        else:
            out.append([e["design"], e["batch"], e["batch"]])
    return [tuple(x) for x in out]


def _batches(lo: int, hi: int) -> str:
    return f"batch {lo}" if lo == hi else f"batches {lo}-{hi}"


def render(sweep: dict, head: str) -> list[str]:
    """The sweep as text: a table of tokens/s (step ms) by batch and design, the best design by batch and
    the crossovers."""
    names = list(sweep["designs"])
    rows = [["batch"] + names]
    rows.append(["max batch"] + [str(sweep["designs"][n]["max_batch"]) for n in names])
    for i, b in enumerate(sweep["batches"]):
        cells = []
        for n in names:
            p = sweep["designs"][n]["points"][i]
            cells.append(f"{p['tokens_per_s']:,.1f} ({p['step_ms']:.2f} ms)" if p["status"] == "ok"
                         else "does not fit")
        rows.append([str(b)] + cells)
    widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
    table = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    lines = [head, "tokens/s (step time) by batch; 'max batch': the largest that fits in memory"] + table
    spans = _spans(sweep["best"])
    lines.append("best by batch: " + "; ".join(
        f"{'nothing fits' if d is None else d} at {_batches(lo, hi)}" for d, lo, hi in spans))
    if sweep["crossovers"]:
        lines.append("crossovers (two designs swap places between neighbouring batches; tokens/s at the later one):")
        groups: dict = {}
        for c in sweep["crossovers"]:
            groups.setdefault((c["previous_batch"], c["batch"], c["design"]), []).append(c)
        for (prev, b, win), cs in groups.items():
            t = cs[0]["tokens_per_s"]
            lines.append(f"  batch {prev} -> {b}: {win} ({t[win]:,.1f}) overtakes "
                         + ", ".join(f"{c['overtakes']} ({c['tokens_per_s'][c['overtakes']]:,.1f})" for c in cs))
    elif len(names) > 1:
        lines.append("crossovers: none (no two designs swap places between neighbouring batches where both fit)")
    return lines


def winner_changes(sweep: dict) -> list[dict]:
    """The crossovers that change the best design: the new best overtakes the previous best."""
    best = {e["batch"]: e["design"] for e in sweep["best"]}
    return [c for c in sweep["crossovers"]
            if best.get(c["batch"]) == c["design"] and best.get(c["previous_batch"]) == c["overtakes"]]


# one (line style, marker) per design, so that lines on top of each other stay visible
STYLES = (("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 2)), "P"))


def draw(sweep: dict, title: str):
    """Tokens/s and step time against batch, one line per design (its batches that fit, each its own style),
    the crossovers that change the best design circled, each design's max batch a dotted line."""
    import textwrap
    from ddbench.plotting import SYSTEM_COLORS, new_figure
    fig = new_figure(8.0, 3.8)
    ax_t, ax_s = fig.subplots(1, 2)
    batches = sweep["batches"]
    spare = [c for c in ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#d62728")
             if c not in SYSTEM_COLORS.values()]
    n = len(sweep["designs"])
    for i, (name, d) in enumerate(sweep["designs"].items()):
        pts = [p for p in d["points"] if p["status"] == "ok"]
        c = SYSTEM_COLORS.get(name) or (spare.pop(0) if spare else None)
        ls, mk = STYLES[i % len(STYLES)]
        for ax, key in ((ax_t, "tokens_per_s"), (ax_s, "step_ms")):
            # earlier designs drawn wider, with larger hollow markers, under the later ones
            line, = ax.plot([p["batch"] for p in pts], [p[key] for p in pts], color=c, ls=ls, marker=mk,
                            lw=0.9 + 0.9 * (n - 1 - i) / max(n - 1, 1), ms=3 + 2.5 * (n - 1 - i) / max(n - 1, 1),
                            mfc="none", zorder=2 + i, label=name)
            if batches[0] <= d["max_batch"] < batches[-1]:
                ax.axvline(d["max_batch"], color=line.get_color(), lw=0.6, ls=":")
    for cr in winner_changes(sweep):
        ax_t.scatter([cr["batch"]], [cr["tokens_per_s"][cr["design"]]], s=90, facecolors="none",
                     edgecolors="black", lw=0.9, zorder=10)
    for ax, label in ((ax_t, "tokens/s"), (ax_s, "step time (ms)")):
        if batches[-1] >= 8 * batches[0]:
            ax.set_xscale("log", base=2)
        if len(batches) <= 12:
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.minorticks_off()
        ax.set_xlabel("batch (concurrent requests)")
        ax.set_ylabel(label)
    ax_t.legend(fontsize=7)
    fig.suptitle(textwrap.fill(title, 110) + "\ncircle: where the best design changes; dotted: a design's max"
                 " batch; a design's line ends where it no longer fits", fontsize=8)
    return fig


def plot(sweep: dict, path: str, title: str, fmt: str = "png") -> None:
    """draw(), into `path` as `fmt`."""
    fig = draw(sweep, title)
    fig.savefig(path, format=fmt)
    import matplotlib.pyplot as plt
    plt.close(fig)
