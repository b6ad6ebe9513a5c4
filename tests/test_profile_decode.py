"""The dual-token pass is exact for the output token; greedy + T2 start hits 1.0; sparse and
low-rank attention reduce to dense where they must. On a tiny random Llama built locally."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_profile_tiny import tiny_model  # noqa: E402

from ddbench.profile import decode, selection  # noqa: E402
from ddbench.profile.metrics import overlaps  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import DynamicCache

    from ddbench.profile.hfattention import install
    from ddbench.profile.loadmodel import load
    folder = tiny_model(tmp_path_factory.mktemp("m") / "tiny-llama", "llama")
    loaded = load(folder, "cpu")
    probe = install(loaded.model)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, loaded.model.config.vocab_size, (300,), generator=g).tolist()
    cache = DynamicCache(config=loaded.model.config)
    first = decode.prefill(loaded.model, ids, cache, chunk=128)
    return loaded, probe, cache, ids, first


def test_dual_token_output_logits_equal_single_token_decode(setup):
    loaded, probe, cache, ids, first = setup
    P, m = len(ids), loaded.model
    x = int(first.argmax())
    single = decode.step(m, cache, [x], P)[0]
    decode.truncate(cache, P)
    outs = []
    for spec in (5, 77, x):                   # whatever the speculative token, the output row is the same
        logits = decode.step(m, cache, [x, spec], P)
        assert cache.get_seq_length() == P + 2
        decode.truncate(cache, P)
        outs.append(logits)
        torch.testing.assert_close(logits[0], single, rtol=1e-4, atol=1e-4)
    # ... while the speculative row does depend on the speculative token
    assert (outs[0][1] - outs[1][1]).abs().max() > 1e-3
    # and the speculative token's KV does not leak into the next step: after crop, a single-token
    # decode of the next token equals one over a cache that never saw the speculative token
    decode.step(m, cache, [x, 5], P)
    cache.crop(-1)
    a = decode.step(m, cache, [7], P + 1)[0]
    decode.truncate(cache, P)
    decode.step(m, cache, [x], P)
    b = decode.step(m, cache, [7], P + 1)[0]
    decode.truncate(cache, P)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def _rates(loaded, probe, cache, ids, first, init, temperature, budget=64):
    geo = selection.Geometry(len(ids), budget, 8).validate()
    lm = selection.landmarks(cache, geo)
    r = decode.dual_run(loaded.model, probe, cache, len(ids), first, decode.DualSampling(8, init, temperature, 1.0, 1),
                        vocab=loaded.model.config.vocab_size)
    assert cache.get_seq_length() == len(ids)
    sel = torch.stack([torch.stack([selection.select(torch.stack([r.q_out[t, l], r.q_spec[t, l]])[None], lm[l],
                                                     geo.k)[0] for l in range(loaded.layers)]) for t in range(9)])
    return r, overlaps(sel[1:, :, 0], sel[:-1, :, 1], sel[:-1, :, 0], geo.n_chunks)


def test_greedy_t2_hits_everything(setup):
    r, m = _rates(*setup, init="t2", temperature=0.0)
    assert all(r.token_acc)
    assert torch.all(m["hit_rate"] == 1.0)
    assert r.spec_tokens[:-1] == r.out_tokens[1:]      # s_t == x_{t+1} at every step


def test_sampled_and_random_start_are_measured_not_assumed(setup):
    r_t2, m_t2 = _rates(*setup, init="t2", temperature=1.0)
    r_rnd, m_rnd = _rates(*setup, init="random", temperature=1.0)
    assert r_t2.out_tokens == r_rnd.out_tokens          # same output trajectory for both starts
    assert r_rnd.token_acc[0] is False or r_rnd.spec_tokens[0] == r_rnd.out_tokens[1]
    assert r_t2.token_acc[0] is True                    # the T2 start is the real second token
    assert 0.0 <= float(m_t2["hit_rate"].mean()) <= 1.0
    assert float(m_t2["reuse_hit_rate"].mean()) < 1.0   # random weights: selections move between steps


def test_sparse_full_budget_equals_dense_and_full_rank_rebuild_is_exact(setup):
    from ddbench.profile.hfattention import SparsePlan
    from ddbench.profile.lowrank import lowrank_keys
    loaded, probe, cache, ids, first = setup
    P = len(ids)
    geo = selection.Geometry(P, 8, 8)
    lm = selection.landmarks(cache, geo)
    S = geo.selectable
    lk = lowrank_keys(loaded.model, cache, S, rank=10_000)
    for layer, k in zip(cache.layers, lk):
        torch.testing.assert_close(k, layer.keys[:, :, :S].float(), rtol=1e-3, atol=1e-3)
    x = int(first.argmax())
    dense = decode.step(loaded.model, cache, [x], P)[0]
    decode.truncate(cache, P)
    for keys in (None, lk):
        probe.sparse = SparsePlan(landmarks=lm, budget_chunks=geo.n_chunks, chunk=8, resident_from=S, keys=keys)
        full = decode.step(loaded.model, cache, [x], P)[0]
        decode.truncate(cache, P)
        probe.sparse = None
        torch.testing.assert_close(full, dense, rtol=1e-3, atol=1e-3)
    probe.sparse = SparsePlan(landmarks=lm, budget_chunks=2, chunk=8, resident_from=S)
    few = decode.step(loaded.model, cache, [x], P)[0]
    decode.truncate(cache, P)
    probe.sparse = None
    assert (few - dense).abs().max() > 1e-4              # a small budget does change the output
    lk2 = lowrank_keys(loaded.model, cache, S, rank=2)
    assert (lk2[0] - cache.layers[0].keys[:, :, :S]).abs().max() > 1e-3
