"""`bench kernels --peer flashinfer` (kernels/peerbench.py): its inputs give flashinfer and our kernels the same
tokens, and bad use is one line, exit 2, nothing written. The timing itself runs on the GPU only."""

import pytest
import torch

from ddbench.kernels import peerbench as pb
from tests.cli import assert_one_line_error, ddbench


@pytest.mark.parametrize("nq", [1, 2])
def test_paged_view_is_the_gathered_tokens(nq):
    """flashinfer's pages (indices into the pool, page = chunk, the new tokens' page last) hold exactly the
    tokens of our gathered buffer and of our rows, in the same order, for every (request, KV head)."""
    g = torch.Generator().manual_seed(nq)
    case = pb.AttnCase(2, 4096, nq, "cpu", g, sets=2)
    assert case.N == 512 and case.S == 2
    for s in range(case.S):
        (kc, vc), indptr, idx, last = case.pages(s)
        assert indptr.tolist() == [i * (pb.K_CHUNKS + 1) for i in range(2 * pb.H + 1)] and (last == nq).all()
        n = pb.BUDGET + nq
        paged_k = kc[idx.long()].reshape(2 * pb.H, (pb.K_CHUNKS + 1) * pb.CHUNK, pb.D)[:, :n]
        paged_v = vc[idx.long()].reshape(2 * pb.H, (pb.K_CHUNKS + 1) * pb.CHUNK, pb.D)[:, :n]
        assert torch.equal(paged_k, case.gk[s].reshape(2 * pb.H, n, pb.D))
        assert torch.equal(paged_v, case.gv[s].reshape(2 * pb.H, n, pb.D))
        kp, _ = case.pool(s)
        by_rows = torch.stack([kp[b, h, case.rows[s][b, h].long()] for b in range(2) for h in range(pb.H)])
        assert torch.equal(by_rows, paged_k)
        sel = case.sel[s]
        assert (sel[..., 1:] > sel[..., :-1]).all() and int(sel.max()) < case.N     # distinct, ascending


def test_query_layout_round_trips():
    g = torch.Generator().manual_seed(3)
    case = pb.AttnCase(2, 4096, 2, "cpu", g, sets=1)
    fq = case.fi_query(0)
    assert fq.shape == (2 * pb.H * 2, pb.G, pb.D)
    # request (b, h), token t holds query heads h*G .. h*G+G-1 of token t
    assert torch.equal(fq[(1 * pb.H + 3) * 2 + 1], case.q[0][1, 1, 3 * pb.G:4 * pb.G])
    assert torch.equal(case.from_fi(fq), case.q[0])


def test_rotation_sets():
    assert pb._sets(8 << 20) == pb.MAX_SETS and pb._sets(1 << 30) == 1 and pb._sets(100 << 20) == 3


@pytest.mark.parametrize("args", [("bench", "kernels", "--peer", "cutlass"), ("bench", "engine", "--peer", "flashinfer"),
                                  ("bench", "link", "--peer", "flashinfer")])
def test_bad_peer_use_is_one_line(tmp_path, args):
    assert_one_line_error(ddbench(*args, "--out", str(tmp_path / "o"), cwd=tmp_path))
    assert not (tmp_path / "o").exists()
