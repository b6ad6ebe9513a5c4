"""Catalog shapes against hand-computed values from the public config.json files."""

import json

import pytest

from ddbench.core.catalog import GPUS, LINKS, MODELS, get_gpu, get_link, get_model, model_from_hf_config
from ddbench.core.errors import DDBenchError


@pytest.mark.parametrize("name, kv_bytes", [
    # 2 (K,V) * L * H_kv * d * 2 bytes
    ("llama-3-8b", 2 * 32 * 8 * 128 * 2),          # 131,072
    ("llama-3.1-8b", 131072),
    ("llama-3-8b-instruct-gradient-1048k", 131072),
    ("qwen2.5-7b", 2 * 28 * 4 * 128 * 2),          # 57,344
    ("qwen2.5-14b", 2 * 48 * 8 * 128 * 2),         # 196,608
    ("qwen2.5-32b", 2 * 64 * 8 * 128 * 2),         # 262,144
    ("llama-3-70b", 2 * 80 * 8 * 128 * 2),         # 327,680
])
def test_kv_bytes_per_token(name, kv_bytes):
    assert get_model(name).kv_bytes_per_token == kv_bytes


@pytest.mark.parametrize("name, params", [
    ("llama-3-8b", 8_030_261_248),     # the published parameter count of Meta-Llama-3-8B
    ("llama-3-70b", 70_553_706_496),   # and of Meta-Llama-3-70B
    ("qwen2.5-7b", 7_615_616_512),     # Qwen2.5-7B (qkv bias, untied head)
])
def test_parameter_counts(name, params):
    assert get_model(name).params == params


def test_llama_layer_params_by_hand():
    m = get_model("llama-3-8b")
    attn = 4096 * (4096 + 2 * 1024) + 4096 * 4096
    mlp = 3 * 4096 * 14336
    assert m.params_per_layer == attn + mlp + 2 * 4096


def test_catalog_agrees_with_the_measurements():
    """The catalog's measured figures are the ones in the committed traces, not free-standing literals."""
    import re

    from ddbench.core.calibration import load_bundle
    from ddbench.core.paths import traces_dir
    from ddbench.core.traces import kernel_bench
    bundle = load_bundle(str(traces_dir("calibration", "h200")))
    assert get_gpu("h200").hbm_bytes == bundle.provenance["device_total_bytes"]
    k = kernel_bench()
    copy = k[(k.kernel == "ceiling") & (k.variant == "h2d_pinned_copy_1GiB")].iloc[0]
    assert get_link("pcie5").measured
    assert get_link("pcie5").achievable_gbps == pytest.approx(copy.bytes / copy.latency_ms / 1e6, rel=0.005)
    for g in GPUS.values():  # capacity is what nvidia-smi reported, where the source quotes it
        mib = re.search(r"nvidia-smi (\d+) MiB", g.source)
        if mib:
            assert g.hbm_bytes == int(mib.group(1)) << 20, g.name
        assert g.default_link in LINKS, g.name


def test_unmeasured_links_scale_the_measured_efficiency():
    """Links we did not measure get PCIe 5's measured efficiency, say so, and are ordered by nominal rate."""
    ref = get_link("pcie5")
    eff = ref.achievable_gbps / ref.nominal_gbps
    links = sorted(LINKS.values(), key=lambda l: l.nominal_gbps)
    assert [l.achievable_gbps for l in links] == sorted(l.achievable_gbps for l in links)
    for link in LINKS.values():
        if link is ref:
            continue
        assert not link.measured and "not measured" in link.source
        assert link.achievable_gbps / link.nominal_gbps == pytest.approx(eff, abs=0.002)
        assert link.bidir_total_gbps / link.achievable_gbps == pytest.approx(ref.bidir_total_gbps / ref.achievable_gbps,
                                                                             rel=0.01)


def test_aliases_and_case():
    assert get_model("Llama-3-8B") is MODELS["llama-3-8b"]
    assert get_gpu("H100") is GPUS["h100-80gb"]
    assert get_link("PCIe-5") is LINKS["pcie5"]


@pytest.mark.parametrize("getter, name, kind", [(get_model, "gpt-9", "model"), (get_gpu, "tpu", "GPU"),
                                                 (get_link, "usb", "link")])
def test_unknown_names_list_known_ones(getter, name, kind):
    with pytest.raises(DDBenchError, match=f"unknown {kind} '{name}'; known: .*"):
        getter(name)


def _llama_config(**over):
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256, "rope_theta": 500000.0,
           "max_position_embeddings": 8192, "tie_word_embeddings": False}
    cfg.update(over)
    return cfg


def test_hf_config_matches_catalog(tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_llama_config()))
    m = get_model(str(folder))
    ref = get_model("llama-3-8b")
    assert m.name == "Meta-Llama-3-8B"
    assert (m.params, m.kv_bytes_per_token, m.head_dim) == (ref.params, ref.kv_bytes_per_token, ref.head_dim)


@pytest.mark.parametrize("text, message", [
    ("{not json", "line 1: Expecting property name"),
    (json.dumps([1, 2]), "the top level is not a JSON object"),
    (json.dumps(_llama_config(num_hidden_layers=None)), "num_hidden_layers: must be a whole number"),
    (json.dumps(_llama_config(num_key_value_heads=5)), "not divisible"),
    (json.dumps(_llama_config(rope_theta="big")), "rope_theta: must be a number, not the text 'big'"),
])
def test_malformed_hf_config(tmp_path, text, message):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(DDBenchError, match=message):
        model_from_hf_config(str(path))
