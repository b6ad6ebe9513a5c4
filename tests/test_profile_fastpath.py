"""The profiler's fast path is exact: keys written once (KVCache) give DynamicCache's logits; a local layer that
attends over its window only gives the full masked attention's output; a question prefilled after its shared
haystack gives the logits of its whole prompt prefilled at once. On tiny random models built here."""

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_profile_tiny import _tokenizer, tiny_model  # noqa: E402

from ddbench.profile import decode  # noqa: E402
from ddbench.profile.hfattention import install, window_slice  # noqa: E402
from ddbench.profile.kvcache import KVCache  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from ddbench.profile.loadmodel import load
    loaded = load(tiny_model(tmp_path_factory.mktemp("m") / "tiny-llama", "llama"), "cpu")
    return loaded, install(loaded.model)


def _ids(n, vocab, seed=3):
    return torch.randint(2, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_kvcache_matches_dynamic_cache_through_dual_steps_and_crops(llama):
    from transformers import DynamicCache
    loaded, probe = llama
    m, ids = loaded.model, _ids(300, loaded.model.config.vocab_size)
    outs = []
    for cache in (DynamicCache(), KVCache()):
        first = decode.prefill(m, ids, cache, chunk=128)
        r = decode.dual_run(m, probe, cache, len(ids), first, decode.DualSampling(6, "t2", 1.0, 1.0, 5),
                            vocab=m.config.vocab_size)
        assert cache.get_seq_length() == len(ids)
        outs.append((first, r, [layer.keys.clone() for layer in cache.layers]))
    (f0, r0, k0), (f1, r1, k1) = outs
    torch.testing.assert_close(f0, f1, rtol=0, atol=0)
    assert r0.out_tokens == r1.out_tokens and r0.spec_tokens == r1.spec_tokens
    torch.testing.assert_close(r0.q_out, r1.q_out, rtol=0, atol=0)
    for a, b in zip(k0, k1):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_kvcache_grows_past_its_capacity_and_crop_reuses_the_buffer():
    from ddbench.profile.kvcache import GrowLayer
    layer = GrowLayer()
    x = torch.arange(2 * 300 * 4, dtype=torch.float32).view(1, 2, 300, 4)
    for a in range(0, 300, 100):
        k, _ = layer.update(x[:, :, a:a + 100], x[:, :, a:a + 100])
    assert torch.equal(k, x) and layer.get_seq_length() == 300
    buf = layer._kbuf
    layer.crop(-50)
    k, _ = layer.update(-x[:, :, :10], x[:, :, :10])
    assert layer._kbuf is buf and k.shape[2] == 260
    assert torch.equal(k[:, :, :250], x[:, :, :250]) and torch.equal(k[:, :, 250:], -x[:, :, :10])


def test_window_slice_is_exact_and_cuts_only_masked_columns():
    from transformers.integrations.sdpa_attention import repeat_kv
    g = torch.Generator().manual_seed(0)
    T, q, w, d = 200, 7, 32, 16
    key, value = torch.randn(1, 2, T, d, generator=g), torch.randn(1, 2, T, d, generator=g)
    query = torch.randn(1, 4, q, d, generator=g)
    qpos = torch.arange(T - q, T).view(-1, 1)
    kpos = torch.arange(T).view(1, -1)
    mask = ((kpos <= qpos) & (kpos > qpos - w)).view(1, 1, q, T)
    k2, v2, m2 = window_slice(key, value, mask, q, w)
    assert k2.shape[2] == q + w - 1 and m2.shape[-1] == q + w - 1
    full = torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(key, 2), repeat_kv(value, 2), attn_mask=mask)
    cut = torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(k2, 2), repeat_kv(v2, 2), attn_mask=m2)
    torch.testing.assert_close(full, cut, rtol=1e-6, atol=1e-6)
    wider = mask.clone()
    wider[..., T - q - w] = True                      # a mask that is not the window: nothing is cut
    assert window_slice(key, value, wider, q, w)[0].shape[2] == T
    assert window_slice(key, value, None, q, w)[0].shape[2] == T


def test_gemma3_local_layers_over_their_window_equal_full_attention(monkeypatch):
    """A tiny Gemma 3 (sliding window 16, one global layer of three): the profiler's attention, whose local
    layers see their window only, gives the logits of transformers' own SDPA over the whole cache."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    cfg = Gemma3TextConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=16,
                           layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                           max_position_embeddings=1024, attn_implementation="sdpa")
    torch.manual_seed(0)
    ref = Gemma3ForCausalLM(cfg).eval()
    ours = Gemma3ForCausalLM(copy.deepcopy(cfg)).eval()     # its own config: install() switches it alone
    ours.load_state_dict(ref.state_dict())
    probe = install(ours)
    from ddbench.profile import hfattention
    cuts = []

    def counted(key, *a):
        out = window_slice(key, *a)
        cuts.append(key.shape[2] - out[0].shape[2])
        return out
    monkeypatch.setattr(hfattention, "window_slice", counted)
    ids = _ids(260, 300)
    lr = decode.prefill(ref, ids, KVCache(), chunk=64)
    cache = KVCache()
    lo = decode.prefill(ours, ids, cache, chunk=64)
    torch.testing.assert_close(lr, lo, rtol=1e-5, atol=1e-5)
    assert probe.capture is None
    assert len(cuts) == 2 * 5 and max(cuts) == 260 - 4 - 16 + 1    # 2 local layers x 5 chunks; the last one


def test_a_question_after_its_shared_haystack_equals_its_whole_prompt(llama):
    from ddbench.profile.tasks import make_prompts
    loaded, _ = llama
    m, tok = loaded.model, _tokenizer()
    prompts = make_prompts(tok, "single", 400, 0, questions=3)
    P = prompts[0].prefix
    cache = KVCache()
    decode.prefill(m, prompts[0].ids[:P], cache, chunk=128)
    for p in prompts:
        shared = decode.prefill(m, p.ids[P:], cache, start=P)
        decode.truncate(cache, P)
        whole = decode.prefill(m, p.ids, KVCache(), chunk=128)
        torch.testing.assert_close(shared, whole, rtol=1e-5, atol=1e-5)


def test_questions_share_a_prefill_and_a_haystack_is_the_unit_of_the_intervals(tmp_path):
    """--questions 2 on a tiny model: each question's runs are measured (its own sample index in the step rows),
    the task accuracy counts both, and the context aggregation counts one prompt of two questions."""
    import pandas as pd

    from ddbench.profile import contexts
    from ddbench.profile.layersweep import ProfileConfig, run
    model = tiny_model(tmp_path / "tiny-llama", "llama")
    root = tmp_path / "root"
    for seed in (0, 1):
        cfg = ProfileConfig(model=model, contexts=(512,), tasks=("single",), steps=2, budgets=(64,), device="cpu",
                            inits=("t2",), temperatures=(0.6,), seed=seed, questions=2, prompts=1,
                            cache_capacities=(0, 2), cache_policies=("lru",), out=str(root / "512" / f"single-s{seed}"),
                            progress=False)
        res = run(cfg)
        assert [(t["total"]) for t in res["summary"]["task_accuracy"] if t["method"] == "dense"] == [2]
    steps = pd.read_csv(root / "512" / "single-s0" / "tiny-llama.steps.csv", comment="#")
    assert sorted(steps["sample"].unique()) == [0, 1]
    out = tmp_path / "out"
    assert contexts.main([str(root), "--out", str(out)]) == 0
    rows = pd.read_csv(out / "tiny-llama.contexts.csv")
    assert set(rows["prompts"]) == {2} and set(rows["questions"]) == {4}
    import json
    doc = json.loads((out / "tiny-llama.cache-trend.json").read_text())
    assert doc["prompts_per_context"] == {"512": 2} and doc["questions_per_context"] == {"512": 4}
