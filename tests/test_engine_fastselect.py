"""The engine's fused selection (kernels/engine/fastselect.py) against the torch twins: the chosen
chunks carry the same probabilities as torch.topk's (ties may pick other equal chunks), are distinct
and ascending, and every output slot is written (poisoned output). The top-k kernels (streaming and
the whole-row bit search) against their exact twin `topk_from_scratch_ref` (same fp32 probabilities,
order (probability desc, id asc)): bit-for-bit equal ids, ties included, N not a power of two, k == N,
group sizes 1..8, one or two query tokens, blocks small enough to force several cuts of the buffer.
The two-stage "seg" kernel (per-segment exact top-k, then one merge per row; radix, binary and 5-ary
searches) likewise: segments shorter than k (kept whole), k close to N, N not a multiple of the
segment, one segment, tie-heavy rows."""

import pytest
import torch
import triton

from ddbench.kernels.engine import fastselect
from ddbench.kernels.engine.fastselect import TopkMethod, TopkShape
from ddbench.kernels.select import score_chunks_ref
from ddbench.kernels.specache import quantize_keys_2bit, specache_chunk_scores_ref


def _same_selection(got, probs, k):
    assert got.dtype == torch.int32 and got.shape[-1] == k
    assert (got.diff(dim=-1) > 0).all()                       # distinct, ascending
    assert int(got.min()) >= 0 and int(got.max()) < probs.shape[-1]
    want = probs.topk(k, dim=-1).values.sort(-1).values
    have = probs.gather(-1, got.long()).sort(-1).values
    torch.testing.assert_close(have, want, rtol=0, atol=0)


def _poisoned(shape, dev):
    return torch.full(shape, -7, dtype=torch.int32, device=dev)


def _scratch(B, H, nq, G, N, n_split, g, dev="cpu", ties=False, scale=3.0):
    """Fresh random pass-1 state: raw scores (log2 domain) of the group rows and per-split stats."""
    GP = triton.next_power_of_2(G)
    BLOCK_M = max(16, triton.next_power_of_2(nq * GP))
    sc = torch.randn(B * H, BLOCK_M, N, generator=g) * scale
    if ties:                                                   # a handful of distinct values only
        sc = (sc / scale * 1.5).round() / 2
    pm = torch.randn(B * H, n_split, BLOCK_M, generator=g) + sc.amax(-1)[:, None, :]
    pl = torch.rand(B * H, n_split, BLOCK_M, generator=g) * 50 + 1
    pml = torch.stack([pm, pl], -1)
    return sc.reshape(-1).contiguous().to(dev), pml.reshape(-1).contiguous().to(dev)


def _check_topk(B, H, nq, G, N, k, n_split, seed, dev="cpu", ties=False, seg=64, **kw):
    g = torch.Generator().manual_seed(seed)
    sc, pml = _scratch(B, H, nq, G, N, n_split, g, dev, ties)
    want = fastselect.topk_from_scratch_ref(sc, pml, B, H, nq, G, N, k)
    for method, search in (("stream", "binary"), ("stream", "5ary"), ("bits", "binary"), ("seg", None)):
        out = _poisoned((B, nq, H, k), dev)
        extra = dict(seg=seg) if method == "seg" else kw
        got = fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, nq, G, N, k), out,
                                           how=TopkMethod(method=method, search=search, **extra))
        assert got.data_ptr() == out.data_ptr()
        assert torch.equal(got, want), (method, search, (got != want).sum())
    return want


def _check_seg(B, H, nq, G, N, k, seg, seed, ties=False, searches=("bisect",), n_split=3, slots=None, cuts=None):
    g = torch.Generator().manual_seed(seed)
    sc, pml = _scratch(B, H, nq, G, N, n_split, g, "cpu", ties)
    want = fastselect.topk_from_scratch_ref(sc, pml, B, H, nq, G, N, k)
    for search in searches:
        out = _poisoned((B, nq, H, k), "cpu")
        got = fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, nq, G, N, k), out,
                                           how=TopkMethod(method="seg", search=search, seg=seg, slots=slots, cuts=cuts))
        assert got.data_ptr() == out.data_ptr()
        assert torch.equal(got, want), (search, (got != want).sum())
    return want


@pytest.mark.parametrize("B,H,nq,G,N,k,seg,ties", [
    pytest.param(2, 2, 2, 4, 1000, 50, 128, False, marks=pytest.mark.slow),     # N not a multiple of the segment (last one 104 long)
    (1, 2, 1, 4, 1000, 50, 128, True),      # nq = 1, tie-heavy
    (1, 2, 2, 4, 1000, 200, 128, True),     # k > segment: every segment kept whole, merge over N
    (1, 1, 2, 4, 700, 100, 128, False),     # k < segment < 2k; last segment (60) shorter than k
    (1, 2, 2, 1, 517, 510, 64, False),      # k close to N, G = 1
    (1, 1, 2, 8, 600, 600, 256, True),      # k == N, G = 8, ties
    (1, 1, 1, 8, 301, 37, 512, True),       # one segment longer than N (N = 300 with this seed: the twin's
                                            # torch.exp2 and the interpreter's differ by one ulp at the cut)
    (2, 1, 2, 3, 333, 1, 32, False),        # k = 1, G not a power of two, many segments
    (1, 1, 1, 4, 256, 255, 16, True),       # 16 segments of 16, k = N - 1
])
def test_seg_topk_matches_twin(B, H, nq, G, N, k, seg, ties):
    _check_seg(B, H, nq, G, N, k, seg, seed=N + 7 * k + seg, ties=ties)


@pytest.mark.parametrize("search", ["radix", "binary", "5ary"])
def test_seg_topk_other_searches(search):
    """The same two stages with an exact top-k per segment (radix select, binary or 5-ary search) in
    place of the coarse cut and the bisection."""
    _check_seg(1, 2, 2, 4, 700, 90, 128, seed=3, ties=True, searches=(search,))
    _check_seg(1, 1, 2, 4, 300, 40, 64, seed=4, searches=(search,))


@pytest.mark.parametrize("cuts", [1, 2, 3, 4])
@pytest.mark.parametrize("scale,ties", [(3.0, False), (1e-6, False), (3.0, True)])
def test_seg_topk_cuts(cuts, scale, ties):
    """The search with 1-4 cuts per reduction, on spread-out probabilities, on nearly equal ones (a
    few bits apart: the cuts collide at the top of the interval) and on exact ties. Against the bit
    search kernel (the same fp32 arithmetic; the twin's torch.exp2 differs from the interpreter's in
    the last bits, which reorders such near-ties), and the chosen probabilities against the twin's."""
    g = torch.Generator().manual_seed(cuts)
    B, H, nq, G, N, k = 1, 2, 2, 4, 700, 60
    sc, pml = _scratch(B, H, nq, G, N, 3, g, ties=ties, scale=scale)
    want = fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, nq, G, N, k), _poisoned((B, nq, H, k), "cpu"),
                                        how=TopkMethod(method="bits"))
    out = _poisoned((B, nq, H, k), "cpu")
    got = fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, nq, G, N, k), out,
                                       how=TopkMethod(method="seg", seg=128, cuts=cuts))
    assert torch.equal(got, want)
    p = fastselect.probs_from_scratch_ref(sc, pml, B, H, nq, G, N)
    have = p.gather(-1, got.transpose(1, 2).reshape(B * H, nq, k).long()).sort(-1).values
    torch.testing.assert_close(have, p.topk(k, dim=-1).values.sort(-1).values, rtol=1e-6, atol=0)


@pytest.mark.parametrize("slots", [pytest.param(40, marks=pytest.mark.slow), pytest.param(41, marks=pytest.mark.slow),
                                   97, 600])
def test_seg_topk_candidate_slots(slots):
    """Stage 1's coarse cut with as many slots as k (it must cut exactly), one more, many (whole
    segments kept below 600): the merge is exact either way."""
    _check_seg(1, 2, 2, 4, 1100, 40, 256, seed=slots, slots=slots)
    _check_seg(1, 1, 2, 4, 1100, 40, 256, seed=slots + 1, ties=True, slots=slots)


def test_seg_topk_all_equal_and_zeros():
    """Rows whose probabilities are all equal (every chunk ties at the threshold: lowest ids win) and
    rows that underflow to exactly 0 for most chunks."""
    B, H, nq, G, N, k, seg = 1, 2, 2, 4, 300, 70, 64
    GP, BLOCK_M = 4, 16
    g = torch.Generator().manual_seed(9)
    sc = torch.full((B * H, BLOCK_M, N), 1.25)
    sc[1] = torch.randn(BLOCK_M, N, generator=g) * 80           # head 1: most probabilities underflow to 0
    pm = sc.amax(-1)[:, None, :].expand(B * H, 2, BLOCK_M).clone()
    pl = torch.rand(B * H, 2, BLOCK_M, generator=g) * 50 + 1
    pml = torch.stack([pm, pl], -1).reshape(-1).contiguous()
    sc = sc.reshape(-1).contiguous()
    want = fastselect.topk_from_scratch_ref(sc, pml, B, H, nq, G, N, k)
    assert torch.equal(want[:, :, 0], torch.arange(k, dtype=torch.int32).expand(B, nq, k))   # all tied: ids 0..k-1
    for search in ("bisect", "radix"):
        out = _poisoned((B, nq, H, k), "cpu")
        assert torch.equal(fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, nq, G, N, k), out,
                                                        how=TopkMethod(method="seg", search=search, seg=seg)), want)


def test_seg_geometry():
    """Default segments: long (fewer candidates to merge), short when there are few rows (batch 1);
    the merge's candidates fit its register budget at the engine's shapes."""
    dev = torch.device("cpu")                 # 4 'SMs' off the GPU
    seg, S, KK, CP = fastselect._seg_geometry(1, 1, 1, 16384, 256, None, dev)
    assert seg == fastselect.SEG_MIN and KK == 512 and CP == triton.next_power_of_2(S * KK) <= fastselect.MAX_MERGE
    assert fastselect._seg_geometry(64, 8, 2, 16384, 256, None, dev)[:3] == (fastselect.SEG_MAX, 4, 512)
    assert fastselect._seg_geometry(1, 8, 2, 4096, 256, None, dev)[:2] == (2048, 2)     # batch 1, 32K
    assert fastselect._seg_warps(2048, 32) == 8 and fastselect._seg_warps(2048, 4096) == 4
    assert fastselect._seg_warps(4096, 4096) == 8 and fastselect._seg_warps(64, 1) == 1
    assert fastselect._seg_geometry(1, 1, 1, 100, 256, None, dev)[:3] == (128, 1, 128)   # k > N's segment
    assert fastselect._seg_geometry(64, 8, 2, 16384, 256, 1024, dev)[:3] == (1024, 16, 512)
    assert fastselect._seg_geometry(64, 8, 2, 16384, 256, 1024, dev, slots=300)[:3] == (1024, 16, 300)


@pytest.mark.parametrize("B,H,nq,G,N,k,blk", [
    (2, 2, 2, 4, 300, 40, 64),       # N not a power of two, several cuts of the buffer
    (1, 3, 1, 1, 257, 17, 32),       # G = 1, odd sizes
    (1, 2, 2, 3, 500, 100, 64),      # G not a power of two
    (1, 1, 2, 8, 200, 33, 16),       # G = 8, many small blocks
    (2, 1, 1, 4, 96, 96, 32),        # k == N
    (1, 2, 2, 2, 130, 130, None),    # k == N, default geometry
    (1, 1, 1, 4, 1000, 1, 128),      # k = 1
])
def test_topk_kernels_match_twin(B, H, nq, G, N, k, blk):
    _check_topk(B, H, nq, G, N, k, n_split=3, seed=B * 1000 + N + k, blk=blk)


SLOW = pytest.mark.slow      # the larger CPU-interpreter cases: `make test-slow` (and on the GPU, its own tests)


@pytest.mark.parametrize("G,N,k,blk", [pytest.param(4, 300, 40, 64, marks=SLOW), pytest.param(4, 512, 200, 128, marks=SLOW), (4, 97, 97, 32),
                                       pytest.param(8, 777, 100, None, marks=SLOW),
                                       pytest.param(3, 600, 90, 64, marks=SLOW)])
def test_topk_many_ties_at_threshold(G, N, k, blk):
    """Scores on a coarse grid: hundreds of chunks share the threshold's probability; the chunks
    equal to it are taken in id order until k, exactly as the twin does."""
    want = _check_topk(2, 2, 2, G, N, k, n_split=3, seed=N + k, ties=True, blk=blk)
    assert want.shape[-1] == k


def test_topk_underflow_zeros():
    """Probabilities that underflow to exactly 0 (bits 0), more zeros than needed at the threshold."""
    g = torch.Generator().manual_seed(11)
    B, H, nq, G, N, k = 1, 2, 2, 4, 200, 150
    sc, pml = _scratch(B, H, nq, G, N, 2, g, scale=80.0)
    want = fastselect.topk_from_scratch_ref(sc, pml, B, H, nq, G, N, k)
    for method in ("stream", "bits"):
        out = _poisoned((B, nq, H, k), "cpu")
        assert torch.equal(fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, nq, G, N, k), out,
                                                        how=TopkMethod(method=method, blk=32)),
                           want)


def _near_selection(got, q, lm, k):
    """fp16 stored scores: each score moves by at most half an fp16 ulp of the largest |score| (log2
    domain), so a chosen chunk's probability is within 2 such steps of the true top-k's, rank by rank."""
    assert (got.diff(dim=-1) > 0).all()
    probs = score_chunks_ref(q, lm)
    s = torch.einsum("bthd,bhnd->bthn", q.float(), lm.float().repeat_interleave(q.shape[2] // lm.shape[1], 1))
    top = float((s / q.shape[-1] ** 0.5 * 1.4426950408889634).abs().max())
    half_ulp = 2.0 ** (torch.tensor(top).log2().floor() - 11)
    want = probs.topk(k, dim=-1).values.sort(-1).values
    have = probs.gather(-1, got.long()).sort(-1).values
    assert (have >= want * 2.0 ** (-2 * half_ulp)).all()


@pytest.mark.parametrize("nq,N,k", [(1, 96, 16), (2, 300, 40), (2, 64, 64)])
def test_select_topk_landmarks(nq, N, k, dev="cpu"):
    """fp32 stored scores: the true top-k probabilities exactly; fp16 (the engine's): within their rounding."""
    g = torch.Generator().manual_seed(N + nq)
    B, Hq, H, d = 2, 8, 2, 32
    q = torch.randn(B, nq, Hq, d, generator=g).to(dev)
    lm = torch.randn(B, H, N, d, generator=g).to(dev)
    _same_selection(fastselect.select_topk(q, lm, k, splits=2, how=TopkMethod(blk=64), scores=torch.float32), score_chunks_ref(q, lm), k)
    _near_selection(fastselect.select_topk(q, lm, k, splits=2, how=TopkMethod(blk=64)), q, lm, k)


def test_topk_ties_and_zeros(dev="cpu"):
    """Scores far apart: most probabilities underflow to exactly 0; k larger than the positive ones."""
    g = torch.Generator().manual_seed(5)
    B, nq, Hq, H, d, N, k = 1, 1, 4, 1, 32, 128, 20
    q = torch.randn(B, nq, Hq, d, generator=g) * 30
    lm = torch.randn(B, H, N, d, generator=g) * 30
    _same_selection(fastselect.select_topk(q, lm, k, splits=1, how=TopkMethod(blk=32), scores=torch.float32), score_chunks_ref(q, lm), k)
    _near_selection(fastselect.select_topk(q, lm, k, splits=1, how=TopkMethod(blk=32)), q, lm, k)


@pytest.mark.parametrize("nq", [1, 2])
def test_fp16_scores_are_rounded_fp32(nq):
    """Pass 1 with fp16 stored scores writes the fp32 scores rounded, and the same split statistics
    (computed before the rounding); the top-k kernels agree with the twin on fp16 scratch, ties included."""
    g = torch.Generator().manual_seed(40 + nq)
    B, Hq, H, d, N, k = 2, 8, 2, 32, 300, 40
    q, lm = torch.randn(B, nq, Hq, d, generator=g), torch.randn(B, H, N, d, generator=g)
    s32, p32, G = fastselect.landmark_pass1(q, lm, splits=3, scores=torch.float32)
    s16, p16, _ = fastselect.landmark_pass1(q, lm, splits=3)
    assert s16.dtype == torch.float16 and torch.equal(p16, p32)
    rows = [t * triton.next_power_of_2(G) + g for t in range(nq) for g in range(G)]   # the rows pass 1 writes
    BM = fastselect._block_m(nq, G)
    assert torch.equal(s16.view(B * H, BM, N)[:, rows], s32.view(B * H, BM, N)[:, rows].half())
    want = fastselect.topk_from_scratch_ref(s16, p16, B, H, nq, G, N, k)
    for method in ("seg", "stream", "bits"):
        got = fastselect.topk_from_scratch(s16, p16, TopkShape(B, H, nq, G, N, k),
                                           how=TopkMethod(method=method, seg=64 if method == "seg" else None))
        assert torch.equal(got, want), method


@pytest.mark.parametrize("B,H,N,want", [(1, 1, 64, 1), (2, 2, 2048, 8), (2, 2, 8192, 16), (5, 1, 8192, 16)])
def test_pass1_default_splits(B, H, N, want):
    """At least PASS1_SPLITS splits per (request, KV head) where N / PASS1_MIN_SPLIT allows (a wave's tail of
    programs otherwise, traces/kernels/h200-pass1-waves), more where B x H programs are few (CPU: 4 "SMs"),
    and the statistics of any split count give the same top-k."""
    g = torch.Generator().manual_seed(B * N)
    q, lm = torch.randn(B, 2, 4 * H, 16, generator=g), torch.randn(B, H, N, 16, generator=g)
    sc, pml, G = fastselect.landmark_pass1(q, lm)
    assert pml.numel() // (2 * B * H * fastselect._block_m(2, G)) == want
    if N <= 2048:
        one = fastselect.landmark_pass1(q, lm, splits=1)
        assert torch.equal(fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, 2, G, N, 8)),
                           fastselect.topk_from_scratch(one[0], one[1], TopkShape(B, H, 2, G, N, 8)))


def test_stored_scores_dtype_checked():
    q, lm = torch.randn(1, 1, 4, 32), torch.randn(1, 1, 64, 32)
    with pytest.raises(ValueError, match="stored scores"):
        fastselect.select_topk(q, lm, 8, scores=torch.bfloat16)


@pytest.mark.parametrize("nq", [1, 2])
def test_specache_select_topk(nq, dev="cpu"):
    g = torch.Generator().manual_seed(30 + nq)
    B, Hq, H, d, T, C, k = 2, 8, 2, 32, 512, 8, 12
    qk = quantize_keys_2bit(torch.randn(B, H, T, d, generator=g))
    q = torch.randn(B, nq, Hq, d, generator=g)
    got = fastselect.specache_select_topk(q, qk, C, k)
    assert torch.equal(fastselect.specache_select_topk(q, qk, C, k, rows=16), got)    # the previous layout
    probs = specache_chunk_scores_ref(q, qk, C)
    # the kernel's fp16 dot moves probabilities by ~1e-3 of the largest: compare the chosen
    # probabilities with the true top-k's within that, not bit for bit
    want = probs.topk(k, dim=-1).values.sort(-1).values
    have = probs.gather(-1, got.long()).sort(-1).values
    assert (got.diff(dim=-1) > 0).all()
    assert torch.allclose(have, want, atol=3e-3 * float(probs.max()), rtol=0)


@pytest.mark.parametrize("method", ["seg", "stream", "bits"])
@pytest.mark.parametrize("nq", [1, 2])
def test_topk_per_token_outputs(method, nq, dev="cpu"):
    """Per-token outputs (the engine's true selection and next-step prediction): each token's ids land
    in its own [B, H, k] tensor, equal to that token's slice of the one-tensor output."""
    B, H, G, N, k = 2, 3, 4, 300, 40
    sc, pml = _scratch(B, H, nq, G, N, 3, torch.Generator().manual_seed(11 + nq), dev)
    whole = fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, nq, G, N, k),
                                         how=TopkMethod(method=method, seg=64 if method == "seg" else None))
    outs = tuple(_poisoned((B, H, k), dev) for _ in range(nq))
    got = fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, nq, G, N, k), outs,
                                       how=TopkMethod(method=method, seg=64 if method == "seg" else None))
    assert got is outs or all(a is b for a, b in zip(got, outs))
    for t in range(nq):
        assert torch.equal(outs[t], whole[:, t])


def test_topk_outputs_checked():
    sc, pml = _scratch(1, 2, 2, 4, 64, 2, torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="per-token"):
        fastselect.topk_from_scratch(sc, pml, TopkShape(1, 2, 2, 4, 64, 8), (torch.empty(1, 2, 8, dtype=torch.int32),))
    with pytest.raises(ValueError, match="contiguous int32"):
        fastselect.topk_from_scratch(sc, pml, TopkShape(1, 2, 2, 4, 64, 8), torch.empty(1, 2, 2, 9, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("nq", [1, 2])
def test_select_topk_gpu(nq):
    g = torch.Generator(device="cuda").manual_seed(7 + nq)
    B, Hq, H, d, N, k = 4, 32, 8, 128, 16384, 256
    q = torch.randn(B, nq, Hq, d, device="cuda", generator=g).bfloat16()
    lm = torch.randn(B, H, N, d, device="cuda", generator=g).bfloat16()
    got = fastselect.select_topk(q, lm, k, scores=torch.float32)
    from ddbench.kernels.select import score_chunks
    probs = score_chunks(q, lm)          # the same pass 1 and normaliser (fp32 stored scores)
    assert (got.diff(dim=-1) > 0).all()
    want = probs.topk(k, dim=-1).values.sort(-1).values
    have = probs.gather(-1, got.long()).sort(-1).values
    torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("B,nq,N,k,ties", [(4, 2, 16384, 256, False), (2, 1, 5000, 700, True), (1, 2, 3000, 3000, False),
                                           (2, 2, 16384, 256, True)])
def test_topk_kernels_gpu(B, nq, N, k, ties):
    """On the GPU: both kernels give the same ids on untied data (bit for bit), poisoned outputs
    (with exact ties, measured on the H200: the two compiled kernels break ties at the threshold
    apart, so there each is checked against the twin only); against the twin, the chosen chunks' probabilities are the top-k probabilities (the
    twin's torch.exp2 may differ from tl.exp2 in the last bits, which reorders exact ties)."""
    g = torch.Generator(device="cuda").manual_seed(N + k)
    Hq, H, d = 32, 8, 128
    G = Hq // H
    if ties:
        sc, pml = _scratch(B, H, nq, G, N, 4, torch.Generator().manual_seed(N), "cuda", ties=True)
    else:
        q = torch.randn(B, nq, Hq, d, device="cuda", generator=g).bfloat16()
        lm = torch.randn(B, H, N, d, device="cuda", generator=g).bfloat16()
        sc, pml, _ = fastselect.landmark_pass1(q, lm)
    outs = []
    for method in ("stream", "bits", "seg", None):
        out = _poisoned((B, nq, H, k), "cuda")
        fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, nq, G, N, k), out, how=TopkMethod(method=method))
        outs.append(out)
    if not ties:   # exact ties at the threshold may break apart on last-bit differences between kernels
        for o in outs[1:]:
            assert torch.equal(outs[0], o)
    p = fastselect.probs_from_scratch_ref(sc, pml, B, H, nq, G, N)          # [B*H, nq, N]
    want = p.topk(k, dim=-1).values.sort(-1).values
    for out in outs:
        assert (out.diff(dim=-1) > 0).all()
        got = out.transpose(1, 2).reshape(B * H, nq, k).long()
        have = p.gather(-1, got).sort(-1).values
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("B,nq,G,N,k,seg,ties", [(2, 2, 4, 16384, 256, None, False), (1, 1, 4, 4096, 256, 512, True),
                                                  (2, 2, 8, 5000, 700, 1024, True), (1, 2, 4, 3000, 2999, 256, False),
                                                  (1, 2, 1, 16384, 4096, 2048, True)])
def test_seg_topk_gpu(B, nq, G, N, k, seg, ties):
    """The seg kernel on the GPU against the twin: the chosen chunks' probabilities are the top-k's,
    ids distinct and ascending, every slot written; bit-for-bit equal ids where there are no exact ties."""
    H = 8
    sc, pml = _scratch(B, H, nq, G, N, 5, torch.Generator().manual_seed(N + k), "cuda", ties=ties)
    p = fastselect.probs_from_scratch_ref(sc, pml, B, H, nq, G, N)
    want = p.topk(k, dim=-1).values.sort(-1).values
    for search, cuts in (("bisect", None), ("bisect", 1), ("bisect", 4), ("radix", None), ("binary", None)):
        out = _poisoned((B, nq, H, k), "cuda")
        fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, nq, G, N, k), out,
                                     how=TopkMethod(method="seg", seg=seg, search=search, cuts=cuts))
        assert (out.diff(dim=-1) > 0).all() and int(out.min()) >= 0
        got = out.transpose(1, 2).reshape(B * H, nq, k).long()
        torch.testing.assert_close(p.gather(-1, got).sort(-1).values, want, rtol=1e-5, atol=1e-12)
        if not ties:
            bits = _poisoned((B, nq, H, k), "cuda")
            fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, nq, G, N, k), bits, how=TopkMethod(method="bits"))
            assert torch.equal(out, bits)
    for method in ("seg", "stream", "bits"):    # per-token outputs: each token's slice, in place
        whole = fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, nq, G, N, k),
                                             how=TopkMethod(method=method, seg=seg))
        per = tuple(_poisoned((B, H, k), "cuda") for _ in range(nq))
        fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, nq, G, N, k), per, how=TopkMethod(method=method, seg=seg))
        for t in range(nq):
            assert torch.equal(per[t], whole[:, t]), (method, t)


def test_select_twins_take_per_token_outputs():
    g = torch.Generator().manual_seed(21)
    q, lm = torch.randn(2, 2, 8, 16, generator=g), torch.randn(2, 2, 40, 16, generator=g)
    whole = fastselect.select_topk_ref(q, lm, 6)
    outs = tuple(_poisoned((2, 2, 6), "cpu") for _ in range(2))
    assert fastselect.select_topk_ref(q, lm, 6, out=outs) is outs
    for t in range(2):
        assert torch.equal(outs[t], whole[:, t])


def _check_fused_plan(B, H, G, N, k, pred, seed, dev):
    """The seg top-k with the miss plan fused into its merge: the ids equal the unfused kernel's, and
    the plan equals plan_misses(pred, true) (twin) as sets of (request-head, chunk) and (request-head,
    slot), in its count and in `assembled`. Outputs poisoned first (the count with a non-zero value:
    stage 1 must zero it)."""
    from ddbench.kernels.engine.transfer import plan_buffers, plan_misses
    sc, pml = _scratch(B, H, 2, G, N, 3, torch.Generator().manual_seed(seed), dev)
    want = fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, 2, G, N, k), how=TopkMethod(method="seg", seg=64))
    mp = plan_buffers(B, H, k, dev)
    for t in (mp.bh, mp.chunk, mp.slot, mp.count, mp.assembled):
        t.fill_(-7)
    outs = tuple(_poisoned((B, H, k), dev) for _ in range(2))
    fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, 2, G, N, k), outs, how=TopkMethod(method="seg", seg=64),
                                 plan=(pred.to(dev), mp))
    assert torch.equal(outs[0], want[:, 0]) and torch.equal(outs[1], want[:, 1])
    a = plan_misses(pred.to(dev), outs[0])
    n = int(a.count)
    assert int(mp.count) == n
    for f in ("chunk", "slot"):
        assert sorted(zip(a.bh[:n].tolist(), getattr(a, f)[:n].tolist())) == \
            sorted(zip(mp.bh[:n].tolist(), getattr(mp, f)[:n].tolist()))
    assert torch.equal(a.assembled, mp.assembled)
    return n


@pytest.mark.parametrize("B,H,G,N,k", [pytest.param(2, 3, 4, 300, 40, marks=SLOW), (1, 2, 8, 97, 32),
                                       pytest.param(3, 1, 1, 130, 5, marks=SLOW)])
def test_fused_miss_plan_matches_twin(B, H, G, N, k, dev="cpu"):
    g = torch.Generator().manual_seed(N + k)
    # the previous step's prediction: ascending (as the top-k writes it) and, in one request, unsorted
    pred = torch.rand(B, H, N, generator=g).argsort(-1)[..., :k].sort(-1).values.int()
    pred[0, 0] = pred[0, 0].flip(0)
    assert _check_fused_plan(B, H, G, N, k, pred, 3, dev) > 0
    # a compute-only step's zero prediction (one chunk repeated) and a prediction equal to the truth
    _check_fused_plan(B, H, G, N, k, torch.zeros(B, H, k, dtype=torch.int32), 3, dev)
    sc, pml = _scratch(B, H, 2, G, N, 3, torch.Generator().manual_seed(3), dev)
    true = fastselect.topk_from_scratch(sc, pml, TopkShape(B, H, 2, G, N, k),
                                        how=TopkMethod(method="seg", seg=64))[:, 0].contiguous()
    assert _check_fused_plan(B, H, G, N, k, true.cpu(), 3, dev) == 0


def test_fused_miss_plan_checked():
    from ddbench.kernels.engine.transfer import plan_buffers
    sc, pml = _scratch(1, 2, 2, 4, 64, 2, torch.Generator().manual_seed(1))
    mp = plan_buffers(1, 2, 8, "cpu")
    with pytest.raises(ValueError, match="seg"):
        fastselect.topk_from_scratch(sc, pml, TopkShape(1, 2, 2, 4, 64, 8), how=TopkMethod(method="bits"),
                                     plan=(torch.zeros(1, 2, 8, dtype=torch.int32), mp))
    with pytest.raises(ValueError, match="pred"):
        fastselect.topk_from_scratch(sc, pml, TopkShape(1, 2, 2, 4, 64, 8), how=TopkMethod(method="seg"),
                                     plan=(torch.zeros(1, 2, 9, dtype=torch.int32), mp))


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,G,N,k", [(4, 8, 4, 16384, 256), (1, 8, 4, 4096, 256), (16, 8, 4, 16384, 256)])
def test_fused_miss_plan_gpu(B, H, G, N, k):
    g = torch.Generator().manual_seed(B + N)
    pred = torch.rand(B, H, N, generator=g).argsort(-1)[..., :k].sort(-1).values.int()
    assert _check_fused_plan(B, H, G, N, k, pred, 5, "cuda") > 0
