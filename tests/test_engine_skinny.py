"""The skinny split-K GEMM (kernels/engine/skinny.py) against its torch twin: fresh random inputs,
poisoned outputs, both weight layouts, split 1 and > 1 (K tails, empty splits, ragged N), two calls in a
row on one workspace (the arrival counters reset), bad inputs, and the candidate-config generator.
CPU through the Triton interpreter (its bf16 dot is wrong, so the kernel upcasts the tiles to fp32
there: exact); GPU (`-m gpu`) at Llama-3-8B's shapes in bf16."""

import pytest
import torch

from kernels.engine import skinny
from kernels.engine.skinny import SkinnyConfig, skinny_matmul, skinny_matmul_ref


def _inputs(M, K, N, layout, seed, device="cpu"):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, generator=g, device=device)
    w = torch.randn(K, N, generator=g, device=device) * K ** -0.5      # outputs ~ N(0, 1), as the engine's
    w = w if layout == "kn" else w.t().contiguous()
    return x.bfloat16(), w.bfloat16()


def _close(y, ref):
    # fp32 sums in another order, one bf16 rounding each: within a bf16 ulp or two
    torch.testing.assert_close(y.float(), ref.float(), rtol=1.6e-2, atol=1e-2)


# (M, K, N, config): split 1; split 2 with a K tail (200 = 128 + 72); split 3 of K=256 at block_k 64
# (the third split is empty); N = 160 ragged against block_n 64; several M tiles (33 rows, block_m 16)
CASES = [
    (1, 256, 192, SkinnyConfig(16, 64, 64, 1, 4, 2)),
    (5, 200, 192, SkinnyConfig(16, 64, 64, 2, 4, 2)),
    (16, 256, 192, SkinnyConfig(16, 64, 64, 3, 4, 3)),
    (33, 256, 160, SkinnyConfig(16, 64, 128, 2, 4, 2)),
    (5, 256, 160, SkinnyConfig(32, 32, 64, 4, 4, 2)),
]


@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("M,K,N,cfg", CASES, ids=[c[3].label + f"-M{c[0]}K{c[1]}N{c[2]}" for c in CASES])
def test_matches_twin_twice(layout, M, K, N, cfg):
    x, w = _inputs(M, K, N, layout, seed=M * 7 + K + N)
    ref = skinny_matmul_ref(x, w, layout)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    y = skinny_matmul(x, w, layout=layout, config=cfg, out=out)
    assert y is out
    _close(y, ref)
    first = y.clone()
    out.fill_(1e4)                                          # poisoned again: the second call must write it all
    skinny_matmul(x, w, layout=layout, config=cfg, out=out)
    assert torch.equal(out, first)                         # counters reset, fixed reduction order
    if cfg.split_k > 1:
        _, counts = skinny._WORKSPACES[("cpu", M, K, N, layout, cfg)]
        assert not counts.any()


@pytest.mark.parametrize("M", [1, 5, 16, 33])
def test_default_config(M, K=256, N=192):
    x, w = _inputs(M, K, N, "kn", seed=M)
    _close(skinny_matmul(x, w), skinny_matmul_ref(x, w, "kn"))


def test_bad_inputs_raise():
    x, w = _inputs(4, 64, 32, "kn", seed=0)
    bad = [
        dict(x=x.float(), w=w), dict(x=x, w=w.half()), dict(x=x[:, ::2], w=w[::2]),
        dict(x=x, w=w.t()), dict(x=x, w=w[:32]), dict(x=x[0], w=w), dict(x=x, w=w, layout="tn"),
        dict(x=x, w=w, layout="nk"), dict(x=x, w=w, out=torch.empty(4, 16, dtype=torch.bfloat16)),
        dict(x=x, w=w, out=torch.empty(4, 32)), dict(x=x, w=w, config=SkinnyConfig(8, 32, 64)),
        dict(x=x, w=w, config=SkinnyConfig(16, 48, 64)), dict(x=x, w=w, config=SkinnyConfig(16, 32, 64, 0)),
    ]
    for kw in bad:
        with pytest.raises(ValueError, match=r"^skinny: "):
            skinny_matmul(kw.pop("x"), kw.pop("w"), **kw)


def test_candidates_are_valid_and_spread():
    shapes = {"qkv": (4096, 6144, "kn"), "o": (4096, 4096, "kn"), "gate_up": (4096, 28672, "nk"),
              "down": (14336, 4096, "kn")}
    for K, N, layout in shapes.values():
        for M in (1, 2, 16, 32, 64, 128):
            cands = skinny.candidate_configs(M, K, N, layout, limit=12)
            assert 8 <= len(cands) <= 12 and len(set(cands)) == len(cands)
            assert cands[0] == skinny.default_config(M, K, N, layout)
            for c in cands:
                c.check()
                assert c.block_m == skinny.block_m_for(M) and c.block_m >= min(M, 128)
                assert c.smem_bytes() <= skinny.SMEM_PER_PROGRAM
                assert skinny.model_us(c, M, K, N, layout) is not None
                assert (c.split_k - 1) * skinny.k_per_split(K, c) < K          # no empty split
            assert len({c.split_k for c in cands}) >= 2 and len({c.block_n for c in cands}) >= 2
            assert {c.block_k for c in cands} == {128, 256} and {c.num_warps for c in cands} == {4, 8}
    # qkv at one row: some candidate fills every SM at least once
    assert any(6144 // c.block_n * c.split_k >= 132 for c in skinny.candidate_configs(1, 4096, 6144, "kn"))
    with pytest.raises(ValueError, match="layout"):
        skinny.candidate_configs(1, 64, 64, "tn")


def test_devcheck_refuses_without_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    from kernels.engine import devcheck_skinny
    assert devcheck_skinny.main(["--quick"]) == 2
    assert capsys.readouterr().err.strip() == "devcheck_skinny: needs a CUDA GPU"


def test_devcheck_plan_is_pure():
    from kernels.engine import devcheck_skinny
    plan = devcheck_skinny.plan(quick=True)
    assert {(p[0], p[1]) for p in plan} == {(s, M) for s in devcheck_skinny.SHAPES for M in (2, 32, 128)}
    keys = devcheck_skinny.compile_plan(plan)
    assert 0 < len(keys) <= sum(len(p[2]) for p in plan)
    assert len({devcheck_skinny.compile_key(*k) for k in keys}) == len(keys)
    rec = devcheck_skinny.precompile_all(keys, jobs=0, timeout_s=10)      # no workers: nothing compiled
    assert rec["compiled"] == 0 and rec["unfinished"] == len(keys)


LLAMA = {"qkv": (4096, 6144, "kn"), "o": (4096, 4096, "kn"), "gate_up": (4096, 28672, "nk"),
         "down": (14336, 4096, "kn")}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(LLAMA))
def test_llama_shapes_gpu(name):
    K, N, layout = LLAMA[name]
    for M in (1, 16, 128):
        x, w = _inputs(M, K, N, layout, seed=M, device="cuda")
        ref = skinny_matmul_ref(x, w, layout)
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        skinny_matmul(x, w, layout=layout, out=out)
        _close(out, ref)
        first = out.clone()
        g = torch.cuda.CUDAGraph()                         # replays reuse the workspace: counters reset
        with torch.cuda.graph(g):
            skinny_matmul(x, w, layout=layout, out=out)
        for _ in range(2):
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, first)


def test_devcheck_point_bookkeeping(monkeypatch):
    """run_point on the CPU with fake timings: a config that fails is recorded and skipped, the two
    fastest are re-timed, the best is the faster of them, and a spent budget skips the rest."""
    import types

    import kernels.timing as timing
    from kernels.engine import devcheck_skinny as dc
    K, N = 256, 192
    monkeypatch.setitem(dc.SHAPES, "tiny", (K, N, "nk"))
    fake_ms = {"cublas": 0.010}
    good = [SkinnyConfig(16, 64, 64, 2, 4, 2), SkinnyConfig(16, 64, 128, 1, 4, 2), SkinnyConfig(16, 32, 64, 3, 4, 2)]
    for c, t in zip(good, (0.009, 0.008, 0.012), strict=True):
        fake_ms[c.label] = t

    def graph_ms(fn):                       # runs the GEMMs once (real outputs), fakes the timing
        fn()
        label = fn.__defaults__[0].label if fn.__defaults__ else "cublas"
        return fake_ms[label], types.SimpleNamespace(replay=label)

    monkeypatch.setattr(dc, "_graph_ms", graph_ms)
    monkeypatch.setattr(timing, "event_times", lambda fn, reps, warmup=0: [fake_ms[fn] * dc.COPIES] * reps)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    _, w = _inputs(1, K, N, "nk", seed=3)
    rows = []
    cfgs = [good[0], SkinnyConfig(16, 48, 64), good[1], good[2]]
    p = dc.run_point("tiny", 3, cfgs, [w, w.clone()], 0.005, float("inf"), 2, rows)
    assert [r["status"] for r in rows] == ["ok", "ok", "error", "ok", "ok"]
    assert "block_n=48" in rows[2]["error"]
    assert p["best"]["config"] == good[1].label and p["runner_up"]["config"] == good[0].label
    assert p["best"]["ms"] == pytest.approx(0.008) and p["best"]["speedup_vs_cublas"] == pytest.approx(1.25)
    assert p["cublas_ms_reps"] == pytest.approx([0.010, 0.010]) and p["failed"] == 1 and p["tried"] == 4
    rows = []
    p = dc.run_point("tiny", 3, cfgs, [w], 0.005, 0.0, 1, rows)       # budget spent: cuBLAS only
    assert [r["status"] for r in rows] == ["ok"] + ["skipped (budget)"] * 4
    assert "best" not in p and p["skipped_budget"] == 4
