"""The memory model against hand-computed values (Llama-3-8B and Qwen2.5-14B)."""

from dataclasses import replace

import pytest

from ddbench.core.catalog import get_gpu, get_model
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import CATEGORIES, Workload, max_batch, memory_breakdown
from ddbench.core.designs import DESIGNS, get_design

K128 = 131072


def per_token(system, model, category):
    """Bytes of `category` per context token for one request (from two contexts)."""
    m, g = get_model(model), get_gpu("h100-80gb")
    a = memory_breakdown(get_design(system), m, g, Workload(context=K128))
    b = memory_breakdown(get_design(system), m, g, Workload(context=2 * K128))
    return (getattr(b, category) - getattr(a, category)) / K128


@pytest.mark.parametrize("model, layers", [("llama-3-8b", 32), ("qwen2.5-14b", 48)])
def test_shadowkv_per_token_state(model, layers):
    # U: L * rank * 2 B; landmarks: L * H_kv * d * 2 B / chunk 8; both models have H_kv=8, d=128
    u = layers * 160 * 2
    landmarks = layers * 8 * 128 * 2 / 8
    assert per_token("shadowkv", model, "aux_residency") == pytest.approx(u)
    assert per_token("shadowkv", model, "landmarks") == pytest.approx(landmarks)
    if model == "llama-3-8b":   # ANCHORS.md: U 10,240 B + landmarks 8,192 B + indices = about 18.7 KB; the
        assert u == 10240 and landmarks == 8192       # engine keeps no int64 index (ShadowKV's 256 B a token)
        assert u + landmarks + 256 == pytest.approx(18.7e3, rel=0.01)


def test_specache_two_bit_copy_per_token():
    # per layer and KV head: packed K+V 2*128*2/8 = 64 B, K scale+zero per 64 tokens 128*4/64 = 8 B,
    # V scale+zero per 64 channels 2*4 = 8 B -> 80 B; x 8 heads x 32 layers
    assert per_token("specache", "llama-3-8b", "aux_residency") == pytest.approx(80 * 8 * 32)


def test_dualdecoder_keeps_only_landmarks():
    assert per_token("dualdecoder", "llama-3-8b", "aux_residency") == 0
    assert per_token("dualdecoder", "llama-3-8b", "sparse_kv_buffers") == 0
    assert per_token("dualdecoder", "llama-3-8b", "landmarks") == pytest.approx(8192)


def test_sparse_buffers_by_hand():
    """A buffer holds the 2048 selected tokens plus the resident rows (outliers 384 for ShadowKV, window 32,
    generated 128, new 2) rounded up to chunks of 8: 2216 tokens (2600 for ShadowKV); beside it two int32
    selections [L, b, H_kv, 256] (this step's and the prediction, or ShadowKV's held one)."""
    m, g = get_model("llama-3-8b"), get_gpu("h100-80gb")
    w = Workload(context=K128, batch=3)
    layer_kv = lambda S: S * 2 * 8 * 128 * 2     # noqa: E731  one layer's S tokens of K and V
    ids = 2 * 32 * 3 * 8 * 256 * 4
    assert memory_breakdown(get_design("dualdecoder"), m, g, w).sparse_kv_buffers == 3 * 2 * layer_kv(2216) + ids
    assert memory_breakdown(get_design("dualdecoder-per-layer"), m, g, w).sparse_kv_buffers == \
        3 * 32 * layer_kv(2216) + ids
    assert memory_breakdown(get_design("shadowkv"), m, g, w).sparse_kv_buffers == 3 * 32 * layer_kv(2600) + ids
    assert memory_breakdown(get_design("ideal"), m, g, w).sparse_kv_buffers == 3 * 32 * layer_kv(2048)
    # ShadowKV's outliers: 48 chunks of 8 tokens, exact, all layers
    sk = memory_breakdown(get_design("shadowkv"), m, g, w)
    u_sv = 3 * 32 * (K128 * 160 + 8 * 128 * 160) * 2
    assert sk.aux_residency == u_sv + 3 * 48 * 8 * 131072


def test_full_kv_8b_128k_on_80gb():
    """The paper reports 4 requests. Ours is 3: 4 x 16 GiB of KV plus 16.06 GB of weights leave
    0.67 GB of the 81,559 MiB that nvidia-smi reports, less than the CUDA context plus one
    chunked prefill and the logits need."""
    m, g = get_model("llama-3-8b"), get_gpu("h100-80gb")
    design = get_design("full-kv")
    assert max_batch(design, m, g, Workload(context=K128)) == 3
    four = memory_breakdown(design, m, g, Workload(context=K128, batch=4))
    assert four.resident_kv == 4 * (K128 + 128 + 2) * 131072   # 16 GiB per request + 128 generated + 2 new
    assert four.weights == 8_030_261_248 * 2
    slack = four.capacity - four.weights - four.resident_kv
    assert 0 < slack < four.runtime_overhead + four.activations
    assert not four.fits   # 4 would fit without the CUDA context and activations: accounting, not KV


def test_max_batch_is_the_boundary():
    m, g = get_model("qwen2.5-14b"), get_gpu("h100-80gb")
    for design in DESIGNS.values():
        w = Workload(context=K128)
        b = max_batch(design, m, g, w)
        if b:
            assert memory_breakdown(design, m, g, replace(w, batch=b)).fits
        assert not memory_breakdown(design, m, g, replace(w, batch=b + 1)).fits


def test_max_batch_falls_with_context_and_rises_with_memory():
    m = get_model("llama-3-8b")
    for name in ("full-kv", "shadowkv", "specache", "dualdecoder"):
        design = get_design(name)
        by_ctx = [max_batch(design, m, get_gpu("h100-80gb"), Workload(context=c)) for c in (32768, K128, 4 * K128)]
        assert by_ctx == sorted(by_ctx, reverse=True) and by_ctx[0] > by_ctx[-1]
        assert max_batch(design, m, get_gpu("h200"), Workload(context=K128)) > by_ctx[1]


def test_design_ordering_at_128k():
    """DualDecoder fits the most requests of the real designs; full-kv the fewest."""
    m, g = get_model("llama-3-8b"), get_gpu("h100-80gb")
    b = {n: max_batch(get_design(n), m, g, Workload(context=K128)) for n in DESIGNS}
    assert b["full-kv"] < b["specache"] < b["shadowkv"] < b["dualdecoder-per-layer"] < b["dualdecoder"] < b["ideal"]


def test_model_larger_than_gpu_fits_nothing():
    assert max_batch(get_design("dualdecoder"), get_model("llama-3-70b"), get_gpu("h100-80gb"),
                     Workload(context=K128)) == 0


def test_breakdown_sums_categories():
    bd = memory_breakdown(get_design("shadowkv"), get_model("llama-3-8b"), get_gpu("h200"),
                          Workload(context=K128, batch=5))
    assert bd.total == sum(getattr(bd, c) for c in CATEGORIES)
    assert all(getattr(bd, c) > 0 for c in CATEGORIES)


@pytest.mark.parametrize("kw, message", [
    (dict(context=1024), "larger than the context"),
    (dict(context=K128, budget=1004), "not a multiple of the chunk size"),
    (dict(context=K128, chunk=0), "chunk must be an integer >= 1"),
    (dict(context=K128, lowrank_layers=99), "exceeds the model's 32 layers"),
    (dict(context=K128, rank=5000), "rank 5000 exceeds"),
])
def test_bad_workloads(kw, message):
    with pytest.raises(DDBenchError, match=message):
        memory_breakdown(get_design("shadowkv"), get_model("llama-3-8b"), get_gpu("h100"), Workload(**kw))


def test_specache_holds_two_budget_sets_per_layer():
    """SpeCache keeps the current and the speculative top-k at once: two budget-sized sets per layer."""
    m, g = get_model("llama-3-8b"), get_gpu("h200")
    layer_kv = 2216 * 2 * 8 * 128 * 2            # 2048 selected + 168 resident rows (test_sparse_buffers_by_hand)
    sc = memory_breakdown(get_design("specache"), m, g, Workload(context=K128, batch=3))
    assert sc.sparse_kv_buffers == 3 * 32 * 2 * layer_kv + 2 * 32 * 3 * 8 * 256 * 4
    assert get_design("specache").buffer_sets == 2


@pytest.mark.parametrize("system, tokens, landmarks", [("dualdecoder", 2, True), ("dualdecoder-two-pass", 1, True),
                                                      ("full-kv", 1, False)])
def test_activation_bytes_by_hand(system, tokens, landmarks):
    """Llama-3-8B: one token's live set inside a layer is 2 B x (hidden 4096 + MLP 3 x 14336) = 94,208 B;
    logits bf16 + fp32 = 128,256 x 6 B; landmark scores 32 heads x 16,384 chunks x 2 x 2 B per query token.
    Each extra request adds its decode share; the chunked prefill (8192 tokens) is paid once."""
    m, g = get_model("llama-3-8b"), get_gpu("h200")
    live, logits, scores = 2 * (4096 + 3 * 14336), 128256 * 6, 32 * (K128 // 8) * 2 * 2
    per_request = tokens * (live + logits + (scores if landmarks else 0))
    prefill = 8192 * live + logits
    for b in (1, 5):
        bd = memory_breakdown(get_design(system), m, g, Workload(context=K128, batch=b))
        assert bd.activations == b * per_request + prefill
