"""The overlap arithmetic of ddbench/profile/metrics.py against hand-made sets, and the geometry."""

import pytest

torch = pytest.importorskip("torch")

from ddbench.core.errors import DDBenchError  # noqa: E402
from ddbench.profile.metrics import overlaps  # noqa: E402
from ddbench.profile.selection import Geometry  # noqa: E402


def test_overlaps_hand_made():
    true = torch.tensor([[0, 1, 2, 3]])
    pred = torch.tensor([[1, 2, 8, 9]])       # hits 1, 2
    prev = torch.tensor([[3, 2, 7, 6]])       # reuses 2, 3 (unsorted on purpose)
    m = overlaps(true, pred, prev, 10)
    assert m["hit_rate"].tolist() == [0.5]
    assert m["reuse_hit_rate"].tolist() == [0.5]
    assert m["union_hit_rate"].tolist() == [0.75]          # {1, 2, 3}
    assert m["new_pred_share"].tolist() == [0.75]          # pred \ prev = {1, 8, 9}


def test_overlaps_batched_extremes():
    true = torch.tensor([[[0, 1], [4, 5]], [[2, 3], [6, 7]]])
    same = true.clone()
    other = torch.tensor([[[8, 9], [0, 1]], [[0, 1], [8, 9]]])
    m = overlaps(true, same, other, 10)
    assert m["hit_rate"].shape == (2, 2)
    assert torch.all(m["hit_rate"] == 1) and torch.all(m["reuse_hit_rate"] == 0)
    assert torch.all(m["union_hit_rate"] == 1) and torch.all(m["new_pred_share"] == 1)
    m = overlaps(true, other, same, 10)
    assert torch.all(m["hit_rate"] == 0) and torch.all(m["new_pred_share"] == 1)


def test_overlaps_agree_with_kernel_indexsets():
    from ddbench.kernels.indexsets import index_overlap
    g = torch.Generator().manual_seed(1)
    a = torch.stack([torch.randperm(64, generator=g)[:16] for _ in range(12)]).view(3, 4, 16)
    b = torch.stack([torch.randperm(64, generator=g)[:16] for _ in range(12)]).view(3, 4, 16)
    m = overlaps(a, b, a, 64)
    assert torch.allclose(m["hit_rate"], index_overlap(a, b))
    assert torch.all(m["reuse_hit_rate"] == 1) and torch.all(m["union_hit_rate"] == 1)


def test_geometry_excludes_local_window():
    g = Geometry(prompt_tokens=4096, budget=1024, chunk=8).validate()
    assert g.selectable == 4096 - 32 and g.n_chunks == 508 and g.k == 128
    g = Geometry(prompt_tokens=1000, budget=256, chunk=8, local=32)
    assert g.selectable == 968          # 1000 - 32 = 968 = 121 chunks
    with pytest.raises(DDBenchError, match="at or above the context"):
        Geometry(2048, 2048).validate()
    with pytest.raises(DDBenchError, match="nothing to select"):
        Geometry(2048, 2040).validate()
    with pytest.raises(DDBenchError, match="multiple of the chunk"):
        Geometry(2048, 1001).validate()


def test_cli_help_imports_no_torch():
    import subprocess
    import sys
    code = ("import sys; from ddbench.cli import build_parser; p = build_parser();"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules and 'triton' not in sys.modules;"
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
