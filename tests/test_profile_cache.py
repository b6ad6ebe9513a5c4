"""The chunk-cache replay (ddbench/profile/cache.py) against a plain-Python twin, its flags, and the
committed SmolLM2 cache traces (traces/accuracy/<model>.cache.csv, .cache.summary.json)."""

import json
import os

import pytest

from tests.cli import ROOT, assert_one_line_error, ddbench

torch = pytest.importorskip("torch")

from ddbench.profile import cache  # noqa: E402
from ddbench.profile.metrics import overlaps  # noqa: E402

ACC = os.path.join(ROOT, "traces", "accuracy")
MODEL = "SmolLM2-135M-Instruct.Q4_1"
COLUMNS = ["layer", "context_tokens", "task", "budget_tokens", "chunk_tokens", "policy", "capacity", "coverage",
           "prefetched_per_budget", "urgent_per_budget", "moved_per_budget", "urgent_share", "n", "model", "git_sha",
           "date", "command"]


def twin(T, P, keys, slots, policy):
    """One row, brute force: a dict chunk -> stamp. T[0..S], P[1..S] lists of ids; keys[t] = (prefetch, urgent)
    score lists. -> [(prefetched, urgent, lost)] for steps 1..S."""
    c, out = {}, []

    def fill(want, stamp, key):
        miss = [x for x in want if x not in c]
        for x in want:
            if x in c:
                c[x] = stamp
        evicted = set()
        for x in miss:
            if len(c) >= slots:
                old = [y for y in c if c[y] < stamp]
                v = min(old, key=lambda y: ((key[y] if policy == "score" else 0), c[y], y))
                del c[v]
                evicted.add(v)
            c[x] = stamp
        return miss, evicted

    fill(T[0], 1, None)
    for t in range(1, len(T)):
        had = set(c)
        pre, ev = fill(P[t], 2 * t, keys[t][0])
        urg, _ = fill(T[t], 2 * t + 1, keys[t][1])
        out.append((len(pre), len(urg), len((set(T[t]) & had & ev) - set(P[t]))))
    return out


def _random(S=24, rows=(2, 3), N=30, k=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = torch.stack([torch.stack([torch.randperm(N, generator=g)[:k] for _ in range(rows[0] * rows[1])])
                     for _ in range(S + 1)]).view(S + 1, *rows, k)
    P = T[1:].clone()                                    # predictions: T_t with about 1 in 3 chunks wrong
    wrong = torch.rand(P.shape, generator=g) < 0.35
    P = torch.where(wrong, torch.randint(N, P.shape, generator=g), P)
    for idx in torch.nonzero(torch.ones(P.shape[:-1])):    # make each prediction k distinct ids
        row = list(dict.fromkeys(P[tuple(idx)].tolist()))
        rest = [x for x in torch.randperm(N, generator=g).tolist() if x not in row]
        P[tuple(idx)] = torch.tensor((row + rest)[:k])
    scores = torch.rand(S + 1, *rows, 2, N, generator=g)
    return T, P, scores


@pytest.mark.parametrize("policy", cache.POLICIES)
@pytest.mark.parametrize("capacity", [1, 1.5, 2, 4])
def test_replay_matches_the_hand_twin(policy, capacity):
    T, P, scores = _random(seed=int(capacity * 10))
    N, k = scores.shape[-1], T.shape[-1]
    got = cache.replay(T, P, N, [capacity], [policy], scores=lambda t: scores[t])[("speculative", policy, capacity)]
    for i in range(T.shape[1]):
        for h in range(T.shape[2]):
            pk = [None] + [cache.score_keys(scores[t - 1, i, h], scores[t, i, h]) for t in range(1, len(T))]
            keys = [None] + [(a.tolist(), b.tolist()) for a, b in pk[1:]]
            want = twin([T[t, i, h].tolist() for t in range(len(T))], [None] + [P[t, i, h].tolist() for t in range(len(P))],
                        keys, cache.slots(capacity, k), policy)
            mine = list(zip(*(got[n][:, i, h].tolist() for n in cache.COUNTS)))
            assert mine == want, (i, h)


def test_capacity_zero_is_plain_dualdecoder_and_its_coverage_is_the_hit_rate():
    T, P, scores = _random(S=40, seed=3)
    N, k = scores.shape[-1], T.shape[-1]
    res = cache.replay(T, P, N, [0.0, 2.0], ["lru", "score"], scores=lambda t: scores[t])
    groups = {}
    for (how, pol, cap), cnt in res.items():
        cache.accumulate(groups, (4096, "single", 8 * k, how, pol, cap), cnt)
    rows = [r for r in cache.rows(groups, 8) if r["capacity"] == "0"]
    hit = overlaps(T[1:], P, T[:-1], N)["hit_rate"]          # [S, L, H], as the profiler scores it
    assert len(rows) == 2 * T.shape[1]
    for r in rows:
        assert r["prefetched_per_budget"] == 1.0
        assert r["coverage"] == pytest.approx(float(hit[:, r["layer"]].double().mean()), abs=1e-6)
        assert r["n"] == hit[:, r["layer"]].numel()
        assert r["urgent_share"] == pytest.approx(r["urgent_per_budget"] / r["moved_per_budget"])


def test_lru_capacity_two_keeps_a_chunk_that_comes_back():
    # k = 2: step 1 reads chunk 0 again, step 2 predicts {4, 5} and reads {0, 4}
    T = torch.tensor([[0, 1], [0, 2], [0, 4]]).view(3, 1, 2)
    P = torch.tensor([[2, 3], [4, 5]]).view(2, 1, 2)
    res = cache.replay(T, P, 10, [0.0, 1.0, 2.0], ["lru"])
    urgent = {cap: res[("speculative", "lru", cap)]["urgent"][:, 0].tolist() for cap in (0.0, 1.0, 2.0)}
    assert urgent[2.0] == [0, 0]          # 0 was touched at step 1, so LRU evicts 1 and 3 for {4, 5}
    assert urgent[1.0] == [1, 1] and urgent[0.0] == [1, 1]
    assert res[("speculative", "lru", 2.0)]["prefetched"][:, 0].tolist() == [2, 2]
    assert res[("speculative", "lru", 1.0)]["lost"][:, 0].tolist() == [1, 1]    # the prefetch evicted the 0 step 1 read


def twin_alone(T, slots, policy, keys):
    """Without prediction, brute force: every chunk of T_t not cached is urgent; LRU (or score) victims."""
    c, out = {}, []
    for t in range(len(T)):
        miss = [x for x in T[t] if x not in c]
        for x in T[t]:
            if x in c:
                c[x] = 2 * t + 1
        for x in miss:
            if len(c) >= slots:
                old = [y for y in c if c[y] < 2 * t + 1]
                del c[min(old, key=lambda y: ((keys[t][y] if policy == "score" else 0), c[y], y))]
            c[x] = 2 * t + 1
        if t:
            out.append((0, len(miss), 0))
    return out


@pytest.mark.parametrize("policy", cache.POLICIES)
@pytest.mark.parametrize("capacity", [0, 1, 2, 4])
def test_replay_without_prediction_matches_its_twin(policy, capacity):
    """lru-cache (prediction none): nothing prefetched, urgent = |T_t minus C_{t-1}|; capacity 0 moves all k."""
    T, P, scores = _random(seed=7 + capacity)
    N, k = scores.shape[-1], T.shape[-1]
    got = cache.replay(T, P, N, [capacity], [policy], scores=lambda t: scores[t],
                       predictions=("none",))[("none", policy, capacity)]
    for i in range(T.shape[1]):
        for h in range(T.shape[2]):
            if capacity == 0:
                want = [(0, k, 0)] * (len(T) - 1)
            else:
                keys = [scores[t, i, h, 0].tolist() for t in range(len(T))]      # the output query alone
                want = twin_alone([T[t, i, h].tolist() for t in range(len(T))], cache.slots(capacity, k), policy, keys)
            assert list(zip(*(got[n][:, i, h].tolist() for n in cache.COUNTS))) == want, (i, h)
    spec = cache.replay(T, P, N, [capacity], [policy], scores=lambda t: scores[t])[("speculative", policy, capacity)]
    if capacity:       # a prediction never makes more chunks urgent than no prediction at the same capacity
        assert int(spec["urgent"].sum()) <= int(got["urgent"].sum())


def test_replay_refuses_an_unknown_prediction():
    T, P, scores = _random(S=3)
    with pytest.raises(ValueError, match="unknown cache prediction"):
        cache.replay(T, P, 30, [1.0], ["lru"], predictions=("oracle",))


@pytest.mark.parametrize("flag,value", [("--cache-capacity", "0.5"), ("--cache-capacity", "-1"),
                                        ("--cache-capacity", "x"), ("--cache-capacity", "1,,2"),
                                        ("--cache-policies", "fifo"), ("--cache-policies", "")])
def test_bad_cache_flags(tmp_path, flag, value):
    r = ddbench("profile", "--layer-accuracy", "--model", "no-such-model.gguf", flag, value, cwd=tmp_path)
    assert_one_line_error(r, contains=flag)
    assert os.listdir(tmp_path) == []


def test_committed_cache_traces():
    pd = pytest.importorskip("pandas")
    d = pd.read_csv(os.path.join(ACC, f"{MODEL}.cache.csv"))
    assert list(d.columns) == COLUMNS
    assert set(d.policy) == {"lru", "score"} and set(d.capacity) == {0, 1, 1.5, 2, 4, 8}
    per = d.groupby(["layer", "context_tokens", "task", "budget_tokens"]).size()
    assert (per == 12).all() and len(d.layer.unique()) == 30
    assert (d[d.capacity == 0].prefetched_per_budget == 1).all()
    assert ((d.coverage + d.urgent_per_budget - 1).abs() < 2e-6).all()
    assert ((d.prefetched_per_budget + d.urgent_per_budget - d.moved_per_budget).abs() < 2e-6).all()
    z = d[d.capacity == 0].pivot_table(index=["layer", "task", "budget_tokens"], columns="policy", values="coverage")
    assert (z.lru == z.score).all()                           # no cache: the policy does not matter
    s = json.load(open(os.path.join(ACC, f"{MODEL}.cache.summary.json")))
    assert s["schema"] == 1 and s["steady_steps_only"] is True and s["model"] == MODEL
    assert len(s["by_capacity"]) == 2 * 6 * len(d.budget_tokens.unique()) * len(d.context_tokens.unique())
    assert set(s["best"]) == {str(b) for b in d.budget_tokens.unique()}
    manifest = json.load(open(os.path.join(ACC, ".ddbench-manifest.json")))["files"]
    from ddbench.core.outputs import sha256
    for name in (f"{MODEL}.cache.csv", f"{MODEL}.cache.summary.json"):
        assert manifest[name]["sha256"] == sha256(os.path.join(ACC, name))
