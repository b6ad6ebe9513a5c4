"""Shared matplotlib style for every figure: Agg backend, TrueType fonts in PDFs,
one colour per design."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

plt.rcParams.update({
    "pdf.fonttype": 42, "ps.fonttype": 42, "font.size": 9, "axes.titlesize": 10,
    "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": 150,
})

SYSTEM_COLORS = {
    "full-kv": "#7f7f7f", "shadowkv": "#1f77b4", "specache": "#ff7f0e", "dualdecoder": "#2ca02c",
    "ideal": "#d62728",
}
CATEGORY_COLORS = {
    "weights": "#4c4c4c", "resident_kv": "#9467bd", "landmarks": "#17becf", "aux_residency": "#d62728",
    "sparse_kv_buffers": "#2ca02c", "activations": "#bcbd22", "runtime_overhead": "#c7c7c7",
}
PAPER_MARK = dict(marker="*", color="black", markersize=9, linestyle="none", label="paper")


def new_figure(width: float = 6.4, height: float = 3.2):
    return plt.figure(figsize=(width, height), layout="constrained")

