"""Model shapes, from the public Hugging Face config.json of each model.

`get_model` also accepts a path to any config.json (or to a folder holding one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ddbench.core.errors import DDBenchError, unknown


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False
    qkv_bias: bool = False
    rope_theta: float = 500000.0
    max_position: int = 131072
    dtype_bytes: int = 2  # bf16 weights, activations and KV
    source: str = ""

    @property
    def kv_bytes_per_token_layer(self) -> int:
        """K and V of one token in one layer: 2 * H_kv * d * dtype_bytes."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers: 2 * L * H_kv * d * dtype_bytes."""
        return self.num_layers * self.kv_bytes_per_token_layer

    @property
    def params_per_layer(self) -> int:
        """q, k, v, o projections (+ qkv bias), gated MLP (3 * h * I), two RMSNorms."""
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden
        if self.qkv_bias:
            attn += q + 2 * kv
        return attn + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def params(self) -> int:
        """All parameters: embedding, layers, final norm and (untied) LM head."""
        embed = self.vocab * self.hidden
        head = 0 if self.tie_embeddings else self.vocab * self.hidden
        return embed + self.num_layers * self.params_per_layer + self.hidden + head

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes


def _llama3_8b(name: str, **kw) -> ModelSpec:
    base = dict(num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, hidden=4096,
                intermediate=14336, vocab=128256)
    base.update(kw)
    return ModelSpec(name=name, **base)


def _qwen25(size: str, layers: int, heads: int, kv_heads: int, hidden: int, inter: int) -> ModelSpec:
    return ModelSpec(name=f"qwen2.5-{size.lower()}", num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
                     head_dim=hidden // heads, hidden=hidden, intermediate=inter, vocab=152064,
                     qkv_bias=True, rope_theta=1000000.0, max_position=131072,
                     source=f"Qwen/Qwen2.5-{size}-Instruct config.json")


MODELS: dict[str, ModelSpec] = {m.name: m for m in [
    _llama3_8b("llama-3-8b", max_position=8192, source="meta-llama/Meta-Llama-3-8B config.json"),
    _llama3_8b("llama-3.1-8b", source="meta-llama/Llama-3.1-8B config.json"),
    _llama3_8b("llama-3-8b-instruct-gradient-1048k", rope_theta=3580165449.0, max_position=1048576,
               source="gradientai/Llama-3-8B-Instruct-Gradient-1048k config.json"),
    _qwen25("7B", 28, 28, 4, 3584, 18944),
    _qwen25("14B", 48, 40, 8, 5120, 13824),
    _qwen25("32B", 64, 40, 8, 5120, 27648),
    ModelSpec(name="llama-3-70b", num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128,
              hidden=8192, intermediate=28672, vocab=128256, max_position=8192,
              source="meta-llama/Meta-Llama-3-70B config.json"),
]}

_ALIASES = {"llama3-8b": "llama-3-8b", "llama-3.1-8b-instruct": "llama-3.1-8b",
            "gradient-1048k": "llama-3-8b-instruct-gradient-1048k",
            "qwen2.5-7b-instruct": "qwen2.5-7b", "qwen2.5-14b-instruct": "qwen2.5-14b",
            "qwen2.5-32b-instruct": "qwen2.5-32b", "llama-3-70b-instruct": "llama-3-70b"}


def model_from_hf_config(path: str) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json (a file, or a folder holding one), checked by
    ddbench.core.schemas.HFConfig: every bad field named in one line."""
    from ddbench.core.io import read_json_object
    from ddbench.core.schemas import HFConfig, validate_all
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise DDBenchError(f"cannot read config.json {file}: no such file")
    cfg = validate_all(HFConfig, read_json_object(file, "config.json"), f"malformed config.json {file}")
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    bias = cfg["attention_bias"]
    name = os.path.basename(os.path.dirname(os.path.abspath(file))) or "custom"
    return ModelSpec(
        name=name, num_layers=cfg["num_hidden_layers"], num_heads=heads,
        num_kv_heads=cfg["num_key_value_heads"] or heads, head_dim=cfg["head_dim"] or hidden // heads,
        hidden=hidden, intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
        tie_embeddings=cfg["tie_word_embeddings"],
        qkv_bias=cfg["model_type"].startswith("qwen2") if bias is None else bias,
        rope_theta=float(cfg["rope_theta"]), max_position=cfg["max_position_embeddings"], source=file,
    )


def get_model(name: str) -> ModelSpec:
    """A catalog model by name (case-insensitive), or a path to a config.json."""
    key = name.lower()
    key = _ALIASES.get(key, key)
    if key in MODELS:
        return MODELS[key]
    if os.sep in name or name.endswith(".json") or os.path.exists(name):
        return model_from_hf_config(name)
    raise unknown("model", name, list(MODELS) + ["<path to config.json>"])
