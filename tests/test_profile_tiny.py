"""End-to-end `ddbench profile --layer-accuracy` on tiny random Llama, Qwen2 and Mistral models built here.

`tiny_model(tmp, arch)` saves a random 2-layer model (safetensors) with a byte-level BPE tokenizer
trained on the task text, so nothing is downloaded.
"""

from __future__ import annotations

import csv
import json
import os

import pytest

from tests.cli import ddbench

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tqdm")


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from ddbench.profile import tasks
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    corpus = [tasks.HEADER, tasks.NOISE, " ".join(tasks.WORDS), "0123456789 VAR = . ? :",
              "What is the special magic number for mentioned in the provided text? The special magic numbers are"]
    tk.train_from_iterator(corpus * 4, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>")


def tiny_model(folder, arch: str = "llama", max_pos: int = 2048, **over):
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)
    tok = _tokenizer()
    kw = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=max_pos,
              bos_token_id=0, eos_token_id=1, tie_word_embeddings=False) | over
    cfg, cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                "mistral": (MistralConfig, MistralForCausalLM)}[arch]
    cfg = cfg(**kw)
    torch.manual_seed(0)
    model = cls(cfg)
    with torch.no_grad():                      # larger q/k weights: peakier attention, more varied selections
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.mul_(4.0)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return str(folder)


def profile(*args, env_extra=None, timeout=300):
    """`ddbench profile ARGS` in a subprocess (tests/cli.py), offline."""
    return ddbench("profile", *args, env={"HF_HUB_OFFLINE": "1", **(env_extra or {})}, timeout=timeout)


# llama in `make test` (the one end-to-end model run there); qwen2 and mistral in `make test-slow`
@pytest.mark.parametrize("arch", ["llama", pytest.param("qwen2", marks=pytest.mark.slow),
                                  pytest.param("mistral", marks=pytest.mark.slow)])
def test_end_to_end_tiny(tmp_path, arch):
    folder = tiny_model(tmp_path / arch, arch)
    out = tmp_path / "out"
    r = profile("--layer-accuracy", "--model", folder, "--context", "512", "--tasks", "single,vt", "--steps", "6",
                "--budget", "64,128", "--temperature", "0,1.0", "--init", "both", "--device", "cpu", "--quiet",
                "--out", str(out))
    assert r.returncode == 0, r.stderr
    name = os.path.basename(folder)
    rows = list(csv.DictReader(open(out / f"{name}.csv")))
    # 2 layers x 1 context x 2 tasks x 2 inits x 2 temperatures x 2 budgets
    assert len(rows) == 2 * 2 * 2 * 2 * 2
    for r_ in rows:
        for c in ("hit_rate", "reuse_hit_rate", "union_hit_rate", "new_pred_share", "token_acc"):
            assert 0.0 <= float(r_[c]) <= 1.0 + 1e-9
        assert float(r_["union_hit_rate"]) + 1e-6 >= max(float(r_["hit_rate"]), float(r_["reuse_hit_rate"]))
        assert int(r_["n"]) == 6 * 2                       # steps x kv heads
        assert r_["model"] == name and len(r_["model_sha256"]) == 16 and r_["command"].startswith("ddbench profile")
        if r_["init"] == "t2" and float(r_["temperature"]) == 0.0:
            assert float(r_["hit_rate"]) == 1.0 and float(r_["token_acc"]) == 1.0
    # the random start must differ from T2 somewhere (a random first token is almost never the real T2)
    rnd = [float(x["token_acc"]) for x in rows if x["init"] == "random"]
    assert min(rnd) < 1.0
    steps = list(csv.DictReader(open(out / f"{name}.steps.csv")))
    assert len(steps) == 2 * 2 * 2 * 2 * 6
    summary = json.load(open(out / f"{name}.summary.json"))
    assert summary["schema"] == 1 and len(summary["per_layer"]["rows"]) == 2
    assert {(a["init"], a["temperature"]) for a in summary["by_init_temperature"]} == \
        {("t2", 0.0), ("t2", 1.0), ("random", 0.0), ("random", 1.0)}
    methods = {(a["method"], a["budget_tokens"]) for a in summary["task_accuracy"]}
    assert methods == {("dense", None), ("sparse", 64), ("sparse", 128), ("lowrank", 64), ("lowrank", 128)}
    assert summary["lowrank_layers"]["threshold"] == 0.8
    assert all(layer in (0, 1) for layer in summary["lowrank_layers"]["layers"])
