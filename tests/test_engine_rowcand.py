"""Per-row candidate selection (kernels/engine/rowcand.py) against the engine's seg top-k and the torch
twin: the same ids, bit for bit, on fresh random inputs (poisoned outputs), one and two query tokens,
GQA groups of 1..8, N not a multiple of the block or split, k close to N, several splits, buffers small
enough to be cut many times, tie-heavy inputs (small integers: exact ties in every row; the module's
caveat, distinct raw scores that exp2 rounds to one probability, is not exercised); the fused miss
plan equal to the seg merge's."""

import pytest
import torch

from kernels.engine import fastselect, rowcand
from kernels.engine.transfer import plan_buffers, plan_misses


def _inputs(B, H, nq, G, N, d, seed, ties=False):
    g = torch.Generator().manual_seed(seed)
    if ties:            # small integers: every dot is exact in fp32 in any order, many are equal
        return (torch.randint(-2, 3, (B, nq, H * G, d), generator=g).float(),
                torch.randint(-1, 2, (B, H, N, d), generator=g).float())
    return torch.randn(B, nq, H * G, d, generator=g), torch.randn(B, H, N, d, generator=g)


@pytest.mark.parametrize("B,H,nq,G,N,k,splits,cap,ties", [
    (1, 2, 2, 4, 300, 20, None, None, False),
    (2, 2, 1, 4, 500, 37, 3, None, False),
    (2, 1, 2, 2, 1000, 64, 2, 128, False),        # many cuts of a small buffer
    (1, 2, 2, 8, 257, 250, 1, None, False),        # k close to N
    (1, 1, 1, 1, 200, 16, 4, None, False),         # one head per group
    (1, 2, 2, 4, 700, 50, 2, None, True),          # ties at every threshold
    (2, 1, 1, 4, 900, 60, 3, 128, True),
    (3, 2, 2, 4, 640, 32, 5, 128, False),
])
def test_rowcand_equals_seg_and_twin(B, H, nq, G, N, k, splits, cap, ties):
    """With select.py's 16 padded rows the raw scores are the seg path's bit for bit (the CPU
    interpreter's matmul sums in another order for another shape): the same ids. With the default
    rows, the same probabilities up to the last bits (ties of the tie-heavy case may turn)."""
    q, lm = _inputs(B, H, nq, G, N, 32, seed=B * 1000 + N + k, ties=ties)
    want = fastselect.select_topk(q, lm, k, method="seg", splits=splits)
    out = torch.full((B, nq, H, k), -7, dtype=torch.int32)
    got = rowcand.select_topk_rowcand(q, lm, k, out=out, splits=splits, cap=cap, block_m=16)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(got, want), (got != want).sum()
    sc, pml, _ = fastselect._landmark_pass1(q, lm, splits=splits)
    assert torch.equal(got, fastselect.topk_from_scratch_ref(sc, pml, B, H, nq, G, N, k))
    dflt = rowcand.select_topk_rowcand(q, lm, k, splits=splits, cap=cap)
    p = fastselect.probs_from_scratch_ref(sc, pml, B, H, nq, G, N).view(B, H, nq, N).transpose(1, 2)
    assert (dflt.diff(dim=-1) > 0).all()
    have, best = p.gather(-1, dflt.long()).sort(-1).values, p.gather(-1, want.long()).sort(-1).values
    torch.testing.assert_close(have, best, rtol=1e-6, atol=0)


def test_rowcand_per_token_outputs_and_fused_plan():
    """The engine's call: ids into one buffer per token and token 0's misses planned against a
    prediction (unsorted, with a repeated id), as the seg merge plans them."""
    B, H, G, N, k = 2, 2, 4, 600, 40
    q, lm = _inputs(B, H, 2, G, N, 32, seed=7)
    g = torch.Generator().manual_seed(8)
    pred = torch.stack([torch.randperm(N, generator=g)[:k] for _ in range(B * H)]).view(B, H, k).to(torch.int32)
    pred[0, 0, 3] = pred[0, 0, 5]
    res = {}
    for name, fn in (("seg", lambda **kw: fastselect.select_topk(q, lm, k, method="seg", **kw)),
                     ("rowcand", lambda **kw: rowcand.select_topk_rowcand(q, lm, k, **kw))):
        outs = (torch.full((B, H, k), -7, dtype=torch.int32), torch.full((B, H, k), -7, dtype=torch.int32))
        mp = plan_buffers(B, H, k, "cpu")
        for t in (mp.bh, mp.chunk, mp.slot, mp.assembled):
            t.fill_(-7)
        mp.count.fill_(99)                                 # pass 1 zeroes it
        fn(out=outs, plan=(pred, mp))
        res[name] = (outs, mp)
    (o_s, p_s), (o_r, p_r) = res["seg"], res["rowcand"]
    assert torch.equal(o_s[0], o_r[0]) and torch.equal(o_s[1], o_r[1])
    n = int(p_r.count)
    twin = plan_misses(pred, o_r[0])
    assert n == int(p_s.count) == int(twin.count)
    key = lambda mp: sorted(zip(mp.bh[:n].tolist(), mp.chunk[:n].tolist(), mp.slot[:n].tolist()))  # noqa: E731
    assert key(p_r) == key(p_s) == sorted(zip(twin.bh[:n].tolist(), twin.chunk[:n].tolist(), twin.slot[:n].tolist()))
    assert torch.equal(p_r.assembled, p_s.assembled)


def test_rowcand_rejects_bad_arguments():
    q, lm = _inputs(1, 2, 2, 4, 300, 32, seed=3)
    with pytest.raises(ValueError):
        rowcand.select_topk_rowcand(q, lm, 0)
    with pytest.raises(ValueError):
        rowcand.select_topk_rowcand(q, lm, 20, cap=64)     # below k + block_n
    assert not rowcand.rowcand_fits(1, 2, 2, 4, 300, 301)


@pytest.mark.gpu
@pytest.mark.parametrize("nq", [1, 2])
def test_rowcand_gpu(nq):
    """bf16 on the GPU, Llama-3-8B heads: the chosen chunks carry the seg path's probabilities (equal
    ones may be other chunks), ids distinct and ascending."""
    g = torch.Generator(device="cuda").manual_seed(11 + nq)
    B, H, G, N, k, d = 4, 8, 4, 4096, 256, 128
    q = torch.randn(B, nq, H * G, d, device="cuda", generator=g).bfloat16()
    lm = torch.randn(B, H, N, d, device="cuda", generator=g).bfloat16()
    sc, pml, _ = fastselect._landmark_pass1(q, lm)
    p = fastselect.probs_from_scratch_ref(sc, pml, B, H, nq, G, N).view(B, H, nq, N).transpose(1, 2)
    out = torch.full((B, nq, H, k), -7, device="cuda", dtype=torch.int32)
    got = rowcand.select_topk_rowcand(q, lm, k, out=out)
    want = fastselect.select_topk(q, lm, k)
    assert (got.diff(dim=-1) > 0).all()
    torch.testing.assert_close(p.gather(-1, got.long()).sort(-1).values, p.gather(-1, want.long()).sort(-1).values,
                               rtol=1e-5, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("miss_rate", [None, 0.33])
def test_engine_with_rowcand_matches_true_selection_gpu(miss_rate):
    """The engine with row-candidate selection forced on: every layer equals attention over the true
    selection, eagerly and captured."""
    from kernels.engine.selfcheck import build, reference_output
    e, host = build("dualdecoder", miss_rate)
    e.rowcand = True
    for _ in range(3):
        e.step()
    torch.cuda.synchronize()
    for rec in e.debug:
        ref = reference_output(e, rec, host)
        torch.testing.assert_close(rec["out"].float(), ref.float(), rtol=2e-2, atol=2e-2)
    n0 = len(e.debug)
    e.capture(2)
    e.replay()
    torch.cuda.synchronize()
    for rec in e.debug[n0:]:
        torch.testing.assert_close(rec["out"].float(), reference_output(e, rec, host).float(), rtol=2e-2, atol=2e-2)
