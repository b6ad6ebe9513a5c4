"""Shared matplotlib style for every figure: Agg backend, TrueType fonts in PDFs,
one colour per design."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib

from ddbench.core.designs import DESIGNS

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

plt.rcParams.update({
    "pdf.fonttype": 42, "ps.fonttype": 42, "font.size": 9, "axes.titlesize": 10,
    "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": 150,
})



class _DesignColors(Mapping):
    """Each design's colour, read from its registry entry (ddbench.core.designs) at every look-up, so a
    design registered at run time brings its own; designs without one are absent."""

    def __getitem__(self, name):
        spec = DESIGNS.get(name)
        if spec is None or not spec.color:
            raise KeyError(name)
        return spec.color

    def __iter__(self):
        return iter([n for n, s in DESIGNS.items() if s.color])

    def __len__(self):
        return sum(1 for s in DESIGNS.values() if s.color)


SYSTEM_COLORS = _DesignColors()
CATEGORY_COLORS = {
    "weights": "#4c4c4c", "resident_kv": "#9467bd", "landmarks": "#17becf", "aux_residency": "#d62728",
    "sparse_kv_buffers": "#2ca02c", "activations": "#bcbd22", "runtime_overhead": "#c7c7c7",
}
PAPER_MARK = dict(marker="*", color="black", markersize=9, linestyle="none", label="paper")


def paper_mark(color: str | None = None, **kw) -> dict:
    """plot() keywords for a paper number: a star in its series' colour, edged in black."""
    d = dict(marker="*", markersize=11, linestyle="none", markerfacecolor=color or "black",
             markeredgecolor="black", markeredgewidth=0.7, color=color or "black", zorder=5)
    d.update(kw)
    return d


def paper_handle(label: str = "paper (star, in its series' colour)"):
    """One legend entry for every paper star."""
    from matplotlib.lines import Line2D
    return Line2D([], [], marker="*", markersize=10, linestyle="none", markerfacecolor="white",
                  markeredgecolor="black", label=label)


def engine_mark(color: str | None = None, **kw) -> dict:
    """plot() keywords for a point the decode-step engine measured: a white diamond edged in its
    series' colour."""
    d = dict(marker="D", markersize=5, linestyle="none", markerfacecolor="white",
             markeredgecolor=color or "black", markeredgewidth=1.3, color=color or "black", zorder=6)
    d.update(kw)
    return d


def engine_handle(label: str = "engine, measured (diamond)"):
    """One legend entry for every engine diamond."""
    from matplotlib.lines import Line2D
    return Line2D([], [], marker="D", markersize=5, linestyle="none", markerfacecolor="white",
                  markeredgecolor="black", markeredgewidth=1.3, label=label)


def style_handle(style: str, label: str, color: str = "black"):
    """A legend entry that explains a line style."""
    from matplotlib.lines import Line2D
    return Line2D([], [], color=color, linestyle=style, label=label)


def integer_axis(axis, log: bool = False, ticks=None) -> None:
    """Integer tick labels on a count axis (no 1.0, 2.0 and no 10^1)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter
    if ticks is not None:
        axis.set_major_locator(FixedLocator(list(ticks)))
    elif not log:
        axis.set_major_locator(MaxNLocator(integer=True))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v - round(v)) < 1e-9 else ""))
    if log:
        axis.set_minor_formatter(NullFormatter())


def plain_log_axis(axis) -> None:
    """Log axis labelled 20, 50, 100, ... instead of 2x10^1."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def new_figure(width: float = 6.4, height: float = 3.2):
    return plt.figure(figsize=(width, height), layout="constrained")

