"""Run lengths of the selections (ddbench/profile/runlengths.py): counted by hand on fixed selections."""

import torch

from ddbench.profile.runlengths import Collector, run_lengths
from ddbench.profile.trace import names


def test_run_lengths_by_hand():
    sel = torch.tensor([[1, 2, 3, 7, 9, 10], [0, 2, 4, 6, 8, 10], [4, 5, 6, 7, 8, 9]])
    assert run_lengths(sel) == {3: 1, 1: 7, 2: 1, 6: 1}


def test_collector_shares_sum_to_one():
    g = torch.Generator().manual_seed(0)
    sel = torch.sort(torch.stack([torch.randperm(64, generator=g)[:16] for _ in range(5 * 2 * 3)]), dim=-1).values
    c = Collector()
    c.add(sel.reshape(5, 2, 3, 16), 4096, "single", 128)
    rows = c.rows(8)
    for layer in (0, 1):
        mine = [r for r in rows if r["layer"] == layer]
        assert abs(sum(r["chunk_share"] for r in mine) - 1.0) < 1e-5
        assert sum(r["runs"] * r["run_chunks"] for r in mine) == 5 * 3 * 16
        assert {r["selections"] for r in mine} == {15}
    assert names("m", runs=True)["runs_csv"] == "m.runs.csv"
