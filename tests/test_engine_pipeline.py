"""Decode-step engine on the CPU (torch reference path, tiny model): miss correction equals the
true selection, the event schedule guards both buffer hazards, and the transfer helpers."""

import pytest
import torch

from ddbench.core.catalog.models import ModelSpec
from ddbench.core.designs import DESIGNS as SYSTEMS
from ddbench.kernels.attention import dual_sparse_attention_ref
from ddbench.kernels.engine.engine import Engine, EngineConfig
from ddbench.kernels.engine.model import Weights
from ddbench.kernels.engine.transfer import gather_slots, gather_slots_ref, perturb, plan_misses
from ddbench.kernels.gather import gather_ref
from ddbench.kernels.layout import alloc_host_kv
from ddbench.kernels.rebuild import rebuild_keys_ref

TINY = ModelSpec("tiny", 3, 4, 2, 32, 64, 96, 101)   # 3 layers: the ping-pong parity wraps across steps
SPARSE = [n for n, s in SYSTEMS.items() if not s.kv_on_gpu and s.gather == "gpu" and n != "ideal"]


def _engine(name, miss_rate=0.33, lowrank=(1,), seed=0):
    g = torch.Generator().manual_seed(seed)
    host = alloc_host_kv(3, 2, 2, 32, 8, 32, dtype=torch.float32)
    host.copy_(torch.randn(host.shape, generator=g))
    w = Weights.random(TINY, "cpu", seed, dtype=torch.float32)
    cfg = EngineConfig.of(context=256, batch=2, budget=64, local_chunks=1, gen_tokens=8, rank=16, outliers_per_1k=32,
                          miss_rate=miss_rate, lowrank_layers=lowrank, seed=seed)
    return Engine(TINY, SYSTEMS[name], cfg, w, "cpu", host_kv=host, ref=True, debug=True, log=True), host


def reference_output(e, rec, host):
    """Attention over the true selection, built independently: sorted true chunks gathered by the
    twin into NaN-poisoned buffers, resident window and new tokens appended."""
    B, H, d, C = e.B, e.H, e.d, e.C
    true = rec["true"].sort(-1).values
    kC = true.shape[-1] * C
    S = kC + e.R0 + int(rec["g"]) + rec["nq"]
    kb = torch.full((B, H, S, d), float("nan"), dtype=e.dt)
    vb = torch.full_like(kb, float("nan"))
    layer = rec["layer"]
    gather_ref(host, layer % host.shape[0], true, None if rec["lowrank"] else kb, vb)
    if rec["lowrank"]:
        rebuild_keys_ref(e.U[layer], e.SV[layer], true, kb, chunk=C, rope_theta=TINY.rope_theta)
    R = e.R0 + int(rec["g"])          # the device's count of generated tokens (graphs: no host mirror)
    kb[:, :, kC:kC + R], vb[:, :, kC:kC + R] = rec["recent_k"][:, :, :R], rec["recent_v"][:, :, :R]
    kb[:, :, kC + R:], vb[:, :, kC + R:] = rec["k"].transpose(1, 2), rec["v"].transpose(1, 2)
    return dual_sparse_attention_ref(rec["q"], kb, vb, torch.full((B,), kC + R, dtype=torch.int32))


@pytest.mark.parametrize("name", SPARSE)
@pytest.mark.parametrize("miss_rate", [0.33, None])
def test_attention_equals_true_selection(name, miss_rate):
    e, host = _engine(name, miss_rate)
    for _ in range(4):
        e.step()
    assert len(e.debug) == 4 * TINY.num_layers
    misses = 0
    for rec in e.debug:
        ref = reference_output(e, rec, host)
        assert not ref.isnan().any()
        torch.testing.assert_close(rec["out"], ref, rtol=1e-4, atol=1e-5)
        assert torch.equal(rec["assembled"].sort(-1).values, rec["true"].sort(-1).values)
    pf, ur = e.step_bytes()
    misses = ur
    if SYSTEMS[name].prefetch != "none" or SYSTEMS[name].reuse:
        assert misses > 0   # the correction path really ran


def test_prediction_designs_agree_token_for_token():
    outs = {}
    for name in ("dualdecoder", "dualdecoder-fifo", "dualdecoder-per-layer", "dualdecoder-two-pass"):
        e, _ = _engine(name, miss_rate=None)
        outs[name] = [e.step()[:, 0].tolist() for _ in range(5)]   # output tokens T_{i+1}
    base = outs["dualdecoder"]
    assert base[0] == base[1]   # the pre-decoded T_2 is produced again by the first dual step
    for name in ("dualdecoder-fifo", "dualdecoder-per-layer", "dualdecoder-two-pass"):
        assert outs[name] == base


def _hazards(log):
    """Check the event schedule: every attention waits (directly or through other events) on all
    transfers into its layer use, and every transfer into a buffer waits on that buffer's last
    reader. Ops on the compute stream are ordered by the stream itself."""
    deps = {}

    def reaches(ev, target):
        seen, todo = set(), [ev]
        while todo:
            x = todo.pop()
            if x == target:
                return True
            if x not in seen:
                seen.add(x)
                todo.extend(deps.get(x, ()))
        return False

    last_reader, transfers, layer_compute = {}, {}, set()
    for ent in log:
        deps[ent["event"]] = list(ent["waits"])
        if ent["stream"] == "compute" and ent["op"] in ("select", "plan"):
            layer_compute.add(ent["event"])   # recorded after this layer's index exists
        if ent["op"] in ("urgent", "fetch") and ent["stream"] != "compute":
            # the index it reads was computed on the compute stream during this very layer
            assert any(w in layer_compute for w in ent["waits"]), f"index hazard: {ent} reads an index it may outrun"
        if ent["op"] == "attention":
            layer_compute.clear()
        if ent["op"] in ("prefetch", "urgent", "fetch"):
            b = ent["buf"]
            if ent["stream"] != "compute":
                transfers.setdefault(ent["use"], []).append(ent["event"])
                if b in last_reader:
                    assert reaches(ent["event"], last_reader[b]), f"WAR hazard: {ent} does not wait for {last_reader[b]}"
        elif ent["op"] == "wait":
            missing = [t for t in transfers.pop(ent["use"], []) if not reaches(ent["event"], t)]
            assert not missing, f"RAW hazard at use {ent['use']}: {missing}"
        elif ent["op"] == "attention":
            last_reader[ent["buf"]] = ent["event"]


@pytest.mark.parametrize("name", ["dualdecoder", "dualdecoder-fifo", "dualdecoder-per-layer", "specache"])
def test_schedule_guards_hazards(name):
    e, _ = _engine(name)
    for _ in range(3):
        e.step()
    log = e.sched.log
    _hazards(log)
    s = SYSTEMS[name]
    urg = [x for x in log if x["op"] == "urgent"]
    assert urg and all(x["stream"] == ("urgent" if s.urgent_priority else "prefetch") for x in urg)
    if s.buffer_layers == "pingpong":
        assert {x["buf"] for x in log if "buf" in x} == {0, 1}
    if s.prefetch == "layer-ahead":
        # the prefetch of use u+2 is issued right after the attention of use u (after pre-decoding)
        order = [(x["op"], x.get("use")) for x in log if x["op"] in ("attention", "prefetch")]
        for j, (op, u) in enumerate(order):
            if op == "prefetch" and u >= 2 + TINY.num_layers:
                assert order[j - 1] == ("attention", u - 2)
        # the urgent fetch of a layer waits for that layer's own prefetch (it overwrites its slots)
        pre = {x["use"]: x["event"] for x in log if x["op"] == "prefetch"}
        for x in urg:
            assert pre[x["use"]] in x["waits"]


def test_hazard_check_can_fail():
    e, _ = _engine("dualdecoder")
    e.step(); e.step()
    log = [dict(x) for x in e.sched.log]
    bad = [dict(x) for x in log]
    for x in bad:
        if x["op"] == "prefetch" and x["use"] > 6:
            x["waits"] = []
            break
    with pytest.raises(AssertionError, match="WAR"):
        _hazards(bad)
    bad = [dict(x) for x in log]
    for x in bad:
        if x["op"] == "wait" and x["use"] > 3:
            x["waits"] = x["waits"][:-1]   # drop the urgent fetch
            break
    with pytest.raises(AssertionError, match="RAW"):
        _hazards(bad)
    bad = [dict(x) for x in log]
    for x in bad:
        if x["op"] == "fetch" and x["stream"] != "compute":   # pre-decoding: the on-demand fetch of `true`
            x["waits"] = [w for w in x["waits"] if not w.startswith("select")]
            break
    else:
        raise AssertionError("no side-stream fetch in the log")
    with pytest.raises(AssertionError, match="index hazard"):
        _hazards(bad)


def test_plan_misses_fills_wrong_slots():
    g = torch.Generator().manual_seed(3)
    B, H, N, k = 3, 4, 64, 16
    pred = torch.rand(B, H, N, generator=g).argsort(-1)[..., :k].sort(-1).values.int()
    true = perturb(pred, 0.25, N, g)
    plan = plan_misses(pred, true)
    assert int(plan.count) == B * H * 4
    buf = pred.clone()
    n = int(plan.count)
    flat = buf.view(B * H, k)
    flat[plan.bh[:n].long(), plan.slot[:n].long()] = plan.chunk[:n]
    assert torch.equal(buf.sort(-1).values, true.sort(-1).values)
    assert torch.equal(plan.assembled, buf)
    same = plan_misses(pred, pred)
    assert int(same.count) == 0 and torch.equal(same.assembled, pred)


def test_perturb_exact_rate():
    g = torch.Generator().manual_seed(5)
    base = torch.rand(2, 3, 100, generator=g).argsort(-1)[..., :20].sort(-1).values.int()
    p = perturb(base, 0.33, 100, g)
    assert p.shape == base.shape and (p.diff(dim=-1) > 0).all() and int(p.max()) < 100
    kept = (p[..., :, None] == base[..., None, :]).any(-1).sum(-1)
    assert (kept == 20 - round(0.33 * 20)).all()


@pytest.mark.parametrize("values_only", [False, True])
def test_gather_slots_kernel_matches_twin(values_only):
    g = torch.Generator().manual_seed(7)
    host = alloc_host_kv(2, 2, 3, 16, 8, 16, dtype=torch.float16)
    host.copy_(torch.randn(host.shape, generator=g).half())
    pred = torch.rand(2, 3, 16, generator=g).argsort(-1)[..., :6].sort(-1).values.int()
    plan = plan_misses(pred, perturb(pred, 0.5, 16, g))
    outs = []
    for fn in (gather_slots, gather_slots_ref):
        kb = torch.full((2, 3, 56, 16), float("nan"), dtype=torch.float16)
        vb = kb.clone()
        fn(host, 1, plan, None if values_only else kb, vb, programs=3)
        outs.append((kb, vb))
    assert torch.equal(outs[0][1].nan_to_num(7), outs[1][1].nan_to_num(7))
    assert torch.equal(outs[0][0].nan_to_num(7), outs[1][0].nan_to_num(7))
    assert (~outs[0][1].isnan()).sum() == int(plan.count) * 8 * 16   # misses only, nothing else


@pytest.mark.parametrize("name", ["dualdecoder", "shadowkv", "specache", "full-kv", "dualdecoder-two-pass"])
@pytest.mark.parametrize("miss_rate", [0.33, None])
def test_compute_only_runs_and_plans(name, miss_rate):
    """Compute only (no host KV): the steps run, the tokens are valid, a prediction design keeps and
    uses its prediction (the miss plan runs), and nothing crosses the link."""
    g = torch.Generator().manual_seed(1)
    w = Weights.random(TINY, "cpu", 0, dtype=torch.float32)
    cfg = EngineConfig.of(context=256, batch=2, budget=64, local_chunks=1, gen_tokens=8, rank=16, outliers_per_1k=32,
                          miss_rate=miss_rate, lowrank_layers=(1,), transfers=False)
    e = Engine(TINY, SYSTEMS[name], cfg, w, "cpu", ref=True)
    for _ in range(3):
        t = e.step()
        assert ((t >= 0) & (t < TINY.vocab)).all()
    assert e.step_bytes() == (0, 0)
    if SYSTEMS[name].prefetch != "none":
        assert e.pred is not None and e.pred.shape[-1] == 64 // 8


def test_invalid_config_one_line():
    from ddbench.core.errors import DDBenchError
    for kw in (dict(batch=0), dict(budget=512), dict(chunk=24), dict(miss_rate=1.5)):
        args = dict(context=256, batch=2, budget=64, miss_rate=0.2)
        args.update(kw)
        with pytest.raises(DDBenchError) as ei:
            Engine(TINY, SYSTEMS["dualdecoder"], EngineConfig.of(**args), Weights.random(TINY, "cpu", 0, dtype=torch.float32),
                   "cpu", ref=True, host_kv=None)
        assert "\n" not in str(ei.value)


@pytest.mark.parametrize("point,extra", [("dualdecoder:1000:16", []), ("dualdecoder:131072:0", []),
                                         ("dualdecoder:4096:4", ["--budget", "8192"]),
                                         ("dualdecoder:4096:4", ["--chunk", "24"]), ("nosuch:4096:4", []),
                                         ("dualdecoder:4096", [])])
def test_sweep_bad_point_exits_2(point, extra, capsys):
    from ddbench.kernels.engine.sweep import main
    assert main(["--point", point] + extra) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err


@pytest.mark.parametrize("B,H,N,k,rate", [(3, 4, 64, 16, 0.25), (2, 2, 300, 40, 0.33), (1, 3, 40, 20, 0.5)])
def test_fast_plan_and_perturb_match_twins(B, H, N, k, rate):
    """The one-launch miss plan equals plan_misses as sets of (request-head, chunk) and (request-head,
    slot) and in `assembled`; the one-launch perturbation forces exactly round(rate*k) new, distinct
    chunks outside the base, and another seed gives another draw. Outputs poisoned first."""
    from ddbench.kernels.engine.transfer import perturb_fast, perturb_fast_ref, plan_misses_fast
    g = torch.Generator().manual_seed(B * N + k)
    pred = torch.rand(B, H, N, generator=g).argsort(-1)[..., :k].sort(-1).values.int()
    true = perturb(pred, rate, N, g)
    a, b = plan_misses(pred, true), plan_misses_fast(pred, true)
    n = int(a.count)
    assert int(b.count) == n > 0
    for f in ("chunk", "slot"):
        assert set(zip(a.bh[:n].tolist(), getattr(a, f)[:n].tolist())) == set(zip(b.bh[:n].tolist(), getattr(b, f)[:n].tolist()))
    assert torch.equal(a.assembled, b.assembled)
    seed = torch.tensor([5], dtype=torch.int32)
    p = perturb_fast(pred, rate, N, seed, 3, out=torch.full_like(pred, -7))
    assert torch.equal(p, perturb_fast_ref(pred, rate, N, seed, 3))        # exact twin (same uniforms)
    kept = (p[..., :, None] == pred[..., None, :]).any(-1).sum(-1)
    assert (kept == k - round(rate * k)).all()
    assert (p.sort(-1).values.diff(dim=-1) > 0).all() and 0 <= int(p.min()) and int(p.max()) < N
    assert not torch.equal(p, perturb_fast(pred, rate, N, seed + 1, 3))


@pytest.mark.parametrize("name", ["dualdecoder", "dualdecoder-two-pass"])
def test_linear_layers_read_each_weight_once(name):
    """No linear layer runs as a batched GEMM over a per-request copy of its weight (the two-pass
    ablation's token slices are strided views; `slice @ w` on them broadcasts w to [B, h, n])."""
    from torch.profiler import profile
    e, _ = _engine(name, miss_rate=None)
    e.step()                       # pre-decoding step
    w = e.w
    shapes = {tuple(t.shape) for t in (*w.wqkv, *w.wo, *(t.T for t in w.wgu), *w.wdown, w.lm_head.T)}
    with profile(record_shapes=True) as p:
        e.step()                   # a dual-token (or two-pass) step
    batched = [ev.input_shapes for ev in p.events() if ev.name == "aten::bmm"
               and len(ev.input_shapes) > 1 and len(ev.input_shapes[1]) == 3
               and tuple(ev.input_shapes[1][1:]) in shapes]
    assert not batched, f"weights read once per request: {batched[:3]}"
    gemms = [ev for ev in p.events() if ev.name in ("aten::mm", "aten::addmm")]
    assert len(gemms) >= 4 * TINY.num_layers   # the linear layers did run as 2-D GEMMs


@pytest.mark.parametrize("n_chunks", [None, 96])
def test_fast_plan_bitmaps_edge_cases(n_chunks):
    """The bitmap plan against the twin where ids sit on word edges (31, 32, 63, 95), where the
    prediction repeats one chunk (a compute-only step's zero prediction), and with no miss at all."""
    from ddbench.kernels.engine.transfer import plan_misses_fast
    g = torch.Generator().manual_seed(7)
    N, k = 96, 8
    edge = torch.tensor([0, 31, 32, 63, 64, 95, 5, 40], dtype=torch.int32)
    cases = [
        (edge.sort().values.view(1, 1, k), torch.tensor([1, 31, 33, 63, 65, 94, 5, 41], dtype=torch.int32).view(1, 1, k)),
        (torch.zeros(1, 2, k, dtype=torch.int32), torch.rand(1, 2, N, generator=g).argsort(-1)[..., :k].int()),
        (edge.view(1, 1, k), edge.flip(0).view(1, 1, k)),
    ]
    for pred, true in cases:
        a, b = plan_misses(pred, true), plan_misses_fast(pred, true, n_chunks)
        n = int(a.count)
        assert int(b.count) == n
        for f in ("chunk", "slot"):
            assert sorted(zip(a.bh[:n].tolist(), getattr(a, f)[:n].tolist())) == \
                sorted(zip(b.bh[:n].tolist(), getattr(b, f)[:n].tolist()))
        assert torch.equal(a.assembled, b.assembled)


def test_selfcheck_bad_input_one_line(monkeypatch, capsys):
    from ddbench.kernels.engine import selfcheck
    monkeypatch.setattr("sys.argv", ["selfcheck", "--kernels", "nosuch"])
    assert selfcheck.main() == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nosuch" in err
    if not torch.cuda.is_available():
        monkeypatch.setattr("sys.argv", ["selfcheck", "dualdecoder"])
        assert selfcheck.main() == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


def _repeating_predictions(g, B, H, N, k):
    """[B, H, k] predictions with repeated ids and a true selection that holds some of them: row 0 of
    each request is all zeros (a compute-only step's zero prediction) against a true set holding 0 at
    a random place; the other rows repeat a few of their own ids at random slots (some of the repeated
    ids in true, some not); the last row of the last request is distinct (no repeat)."""
    true = torch.rand(B, H, N, generator=g).argsort(-1)[..., :k].int()
    pred = torch.rand(B, H, N, generator=g).argsort(-1)[..., :k].int()
    for b in range(B):
        for h in range(H):
            if h == 0:
                pred[b, h] = 0
                if not (true[b, h] == 0).any():
                    true[b, h, int(torch.randint(k, (1,), generator=g))] = 0
                continue
            if b == B - 1 and h == H - 1:
                continue
            shared = int(torch.randint(1, k // 2, (1,), generator=g))
            pred[b, h, :shared] = true[b, h, torch.randperm(k, generator=g)[:shared]]   # some hits
            pred[b, h] = pred[b, h, torch.randperm(k, generator=g)]
            reps = int(torch.randint(1, k // 2, (1,), generator=g))
            src, dst = torch.randint(k, (reps,), generator=g), torch.randint(k, (reps,), generator=g)
            pred[b, h, dst] = pred[b, h, src].clone()
    return pred, true


@pytest.mark.parametrize("B,H,N,k,seed", [(2, 3, 96, 8, 0), (3, 4, 300, 40, 1), (1, 2, 64, 64, 2), (2, 2, 1000, 17, 3)])
def test_fast_plan_dedupes_repeated_predictions(B, H, N, k, seed, monkeypatch):
    """A predicted id that repeats holds its true chunk in its first slot only and its other slots are
    free, exactly as in plan_misses: the one-launch plan gives the twin's count, its items in the twin's
    order within each (b, h) group (the groups come in the programs' reservation order) and its
    `assembled`; after the fill the buffer holds the true set. The plan's buffers are poisoned."""
    from ddbench.kernels.engine.transfer import plan_misses_fast
    g = torch.Generator().manual_seed(100 + seed)
    pred, true = _repeating_predictions(g, B, H, N, k)
    assert (pred.sort(-1).values.diff(dim=-1) == 0).any(-1).sum() >= B * H - 1   # repeats in all rows but one
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *s, **kw: empty(*s, **kw).fill_(-7))
    a = plan_misses(pred, true)
    for n_chunks in (None, N):
        b = plan_misses_fast(pred, true, n_chunks)
        n = int(a.count)
        assert int(b.count) == n > 0
        order = torch.sort(b.bh[:n], stable=True).indices                  # the twin's group order
        for f in ("bh", "chunk", "slot"):
            assert getattr(b, f)[:n][order].tolist() == getattr(a, f)[:n].tolist(), f
        assert torch.equal(a.assembled, b.assembled)
        buf = pred.clone().view(B * H, k)
        buf[b.bh[:n].long(), b.slot[:n].long()] = b.chunk[:n]
        assert torch.equal(buf.view(B, H, k).sort(-1).values, true.sort(-1).values)


@pytest.mark.parametrize("name", ["shadowkv", "dualdecoder"])
def test_a_side_stream_fetchs_plan_lives_until_the_attention(name, monkeypatch):
    """The miss plan the urgent stream's gather reads must be alive when the layer's attention runs (the compute
    stream waits for that gather there): freed earlier, its memory could be reused on the compute stream while
    the gather still reads it on the GPU (the illegal address of traces/gpu-tests/gpu-tests-split-7028523.log)."""
    import weakref
    e, _ = _engine(name)
    seen, checked = [], []
    slots = e.slots

    def slots_spy(host, layer, plan, *a, **kw):
        seen.append(weakref.ref(plan))
        return slots(host, layer, plan, *a, **kw)
    e.slots = slots_spy
    attend = e._attend

    def attend_spy(*a, **kw):
        checked.extend(r() is not None for r in seen)
        seen.clear()
        return attend(*a, **kw)
    monkeypatch.setattr(e, "_attend", attend_spy)
    for _ in range(3):
        e.step()
    assert checked and all(checked)
