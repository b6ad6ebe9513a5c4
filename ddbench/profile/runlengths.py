"""Run lengths of the profiler's real selections: how many of a step's selected chunks sit next to each
other in the host layout (chunk ids c, c+1, ...), so that one gather piece could move them together.

A selection (one step, layer and KV head) is k ascending chunk ids; a run is a maximal stretch of
consecutive ids. Per (layer, context, task, budget): for every run length r, the runs of that length
and the share of the selected chunks they hold. With K and V of a chunk-head contiguous on the host
(fp8: 2 KiB), a run of r chunks is one r x 2 KiB piece where the layout also keeps a head's chunks
adjacent.
"""

from __future__ import annotations

COLUMNS = ["layer", "context_tokens", "task", "budget_tokens", "chunk_tokens", "run_chunks", "runs",
           "chunk_share", "selections"]


def run_lengths(sel):
    """sel [..., k] ascending ids (torch) -> {run length: runs} over every row."""
    import torch
    rows = sel.reshape(-1, sel.shape[-1]).long()
    starts = torch.ones_like(rows, dtype=torch.bool)
    starts[:, 1:] = rows[:, 1:] != rows[:, :-1] + 1
    out: dict[int, int] = {}
    for r in range(rows.shape[0]):
        idx = torch.nonzero(starts[r]).flatten().tolist() + [rows.shape[1]]
        for a, b in zip(idx[:-1], idx[1:]):
            out[b - a] = out.get(b - a, 0) + 1
    return out


class Collector:
    def __init__(self):
        self.groups: dict = {}

    def add(self, sel, context: int, task: str, budget: int) -> None:
        """sel [steps, L, H, k]: every layer's selections of one run."""
        for l in range(sel.shape[1]):
            g = self.groups.setdefault((l, context, task, budget), {"runs": {}, "selections": 0, "k": sel.shape[-1]})
            for r, n in run_lengths(sel[:, l]).items():
                g["runs"][r] = g["runs"].get(r, 0) + n
            g["selections"] += sel[:, l].reshape(-1, sel.shape[-1]).shape[0]

    def rows(self, chunk: int) -> list:
        out = []
        for (l, c, task, b), g in sorted(self.groups.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3], kv[0][0])):
            total = g["selections"] * g["k"]
            for r in sorted(g["runs"]):
                out.append({"layer": l, "context_tokens": c, "task": task, "budget_tokens": b, "chunk_tokens": chunk,
                            "run_chunks": r, "runs": g["runs"][r], "chunk_share": round(g["runs"][r] * r / total, 6),
                            "selections": g["selections"]})
        return out
