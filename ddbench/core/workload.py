"""The one `Workload`: what the memory model, the simulator and the engine know about the requests.

Every field carries its CLI help in its metadata (as Vidur's configs do), and its default comes from
ddbench/core/defaults.py, so the commands do not restate flags or defaults:

    from ddbench.core.workload import Workload, add_workload_args, workload_from_args

    add_workload_args(parser)                              # --context, --batch, --budget, --chunk, ...
    add_workload_args(parser, exclude=("context",))        # a command that parses --context itself
    w = workload_from_args(args, model)                    # validated Workload (DDBenchError on bad input)
    w = workload_from_args(args, model, context=131072)    # fields the command parsed itself

Flags are the field names with '-' for '_'. Token-valued fields (context, budget, ...) accept 128k /
1m forms; every value is checked where it is parsed (at least the field's minimum, at most
defaults.MAX_COUNT). A flag left out on the command line takes the field's default. Only the
standard library is used here.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, field, fields

from ddbench.core import defaults as D
from ddbench.core.errors import DDBenchError
from ddbench.core.index import CHOICES as INDEX_CHOICES, check_index, index_name, parse_index
from ddbench.core.units import parse_tokens


def _f(default, help: str, tokens: bool = False, minimum: int = 1, cli: bool = True, text=None):
    """A Workload field with its CLI help, whether it parses 128k forms, and its smallest legal value;
    `text`: a text field instead, with this parser (text -> canonical text, DDBenchError on bad input)."""
    meta = {"help": help, "tokens": tokens, "minimum": minimum, "cli": cli, "text": text}
    if default is MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Workload:
    """What the memory model, the simulator and the engine need to know about the requests served."""
    context: int = _f(MISSING, "prompt tokens per request, S: 131072, 128k or 1m", tokens=True)
    batch: int = _f(D.BATCH, "concurrent decoding requests, b", minimum=0)
    budget: int = _f(D.BUDGET, "sparse budget in tokens, B (ShadowKV's default)", tokens=True)
    chunk: int = _f(D.CHUNK, "tokens per chunk, C (ShadowKV's default)")
    rank: int = _f(D.RANK, "low-rank key rank, r (ShadowKV's default)")
    local_chunks: int = _f(D.LOCAL_CHUNKS, "most recent chunks kept exact on the GPU (ShadowKV's default)", minimum=0)
    gen_tokens: int = _f(D.GEN_TOKENS, "generated-token slots kept on the GPU (ShadowKV's +128)", minimum=0)
    outliers_per_1k: int = _f(D.OUTLIERS_PER_1K, "ShadowKV outlier chunks per 1024 tokens of budget", minimum=0)
    quant_group: int = _f(D.QUANT_GROUP, "SpeCache/KIVI quantization group size")
    quant_residual: int = _f(D.QUANT_RESIDUAL, "SpeCache/KIVI newest tokens kept in 16 bits", minimum=0)
    lowrank_layers: int = _f(D.LOWRANK_LAYERS, "DualDecoder layers with low-rank keys (adaptive key reconstruction)",
                             minimum=0)
    prefill_chunk: int = _f(D.PREFILL_CHUNK, "tokens per chunked-prefill pass running beside decode", tokens=True)
    cache_tokens: int = _f(D.CACHE_TOKENS, "dualdecoder-cache: GPU chunk cache per (layer, KV head) in tokens, at"
                                           " least the budget (2x the default budget by default)", tokens=True,
                           minimum=0)
    kv_bits: int = _f(D.KV_BITS, "bits of the KV on the host and on the link: 16 (bf16) or 8 (fp8 e4m3, one fp32"
                                 " scale per chunk and KV head, dequantised by the gather into the GPU's bf16"
                                 " buffers; designs that fetch K and V from the host: dualdecoder,"
                                 " dualdecoder-cache and the ablations. ShadowKV's fp8 values: the memory"
                                 " model only; the simulator refuses them, their 1 KiB gather pieces having no"
                                 " measured rate in the calibration bundle)", minimum=8)
    cache_bits: int = _f(D.CACHE_BITS, "bits of a chunk-cache design's GPU chunk cache (dualdecoder-cache,"
                                       " lru-cache): 16 (bf16) or 8 (fp8 e4m3 slots, one fp32 scale per chunk and"
                                       " KV head, copied from an fp8 host KV as they are and read by the attention"
                                       " directly; needs kv_bits 8)", minimum=8)
    index: str = _f(D.INDEX, f"the landmark designs' selection index, {INDEX_CHOICES}: flat (bf16 chunk landmarks),"
                             " fp8 (e4m3, one fp32 scale per landmark), int4 (one fp32 scale per 32 dims), or a"
                             " two-level index of super-chunks over G chunks keeping M x the budget of them in pass 1"
                             " (M >= 1, default 1), its levels in COARSE / FINE (ddbench/core/index.py)",
                    text=index_name)

    def validate(self, model) -> None:
        """DDBenchError (one line) for a value no design can serve on `model`."""
        for f in fields(self):
            if f.metadata["text"]:
                continue
            value, minimum = getattr(self, f.name), f.metadata["minimum"]
            if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= D.MAX_COUNT:
                raise DDBenchError(f"{f.name} must be an integer >= {minimum}, got {value!r}")
        if self.budget > self.context:
            raise DDBenchError(f"sparse budget {self.budget} is larger than the context {self.context}")
        if self.budget % self.chunk:
            raise DDBenchError(f"sparse budget {self.budget} is not a multiple of the chunk size {self.chunk}")
        if self.lowrank_layers > model.num_layers:
            raise DDBenchError(f"lowrank_layers {self.lowrank_layers} exceeds the model's {model.num_layers} layers")
        if self.kv_bits not in (8, 16):
            raise DDBenchError(f"kv_bits must be 16 (bf16) or 8 (fp8 e4m3), got {self.kv_bits}")
        if self.cache_bits not in (8, 16):
            raise DDBenchError(f"cache_bits must be 16 (bf16) or 8 (fp8 e4m3), got {self.cache_bits}")
        if self.cache_bits == 8 and self.kv_bits != 8:
            raise DDBenchError("cache_bits 8 (an fp8 GPU chunk cache) needs kv_bits 8: its slots are the host's fp8"
                               " pieces as they are")
        if self.cache_tokens % self.chunk:
            raise DDBenchError(f"cache_tokens {self.cache_tokens} is not a multiple of the chunk size {self.chunk}")
        check_index(parse_index(self.index), model.head_dim)
        if self.rank > model.num_kv_heads * model.head_dim:
            raise DDBenchError(f"rank {self.rank} exceeds H_kv*d = {model.num_kv_heads * model.head_dim}")

    @property
    def outlier_chunks(self) -> int:
        return self.outliers_per_1k * self.budget // 1024


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _int_arg(name: str, tokens: bool, minimum: int, words: tuple = ()):
    """The flag's parser: an integer (128k forms for tokens) from `minimum` to the largest count, or a word."""
    def parse(text: str) -> int | str:
        if text in words:
            return text
        if tokens:
            try:
                return parse_tokens(text, name.replace("_", " "))
            except DDBenchError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        try:
            value = int(text)
        except ValueError:
            alt = "".join(f" or {w!r}" for w in words)
            raise argparse.ArgumentTypeError(f"{flag(name)} must be an integer{alt}, got {text!r}") from None
        if not minimum <= value <= D.MAX_COUNT:
            raise argparse.ArgumentTypeError(f"{name} must be an integer >= {minimum} and at most {D.MAX_COUNT},"
                                             f" got {value}")
        return value
    parse.__name__ = name
    return parse


def _text_arg(name: str, parse):
    """The flag's parser of a text field: its canonical text, or the one-line error."""
    def checked(text: str) -> str:
        try:
            return parse(text)
        except DDBenchError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    checked.__name__ = name
    return checked


def add_workload_args(parser: argparse.ArgumentParser, exclude=(), required=("context",),
                      group_title: str | None = "workload", words: dict | None = None) -> None:
    """Add one flag per Workload field (except `exclude`) to `parser`, help and default from the field.

    A required field without a default (context) is a required flag unless listed in `exclude`.
    `words` {field: (word, ...)}: words a command accepts for that field besides an integer (e.g.
    simulate's `--lowrank-layers profile`); the command must turn them into an integer on the
    namespace before `workload_from_args`, which refuses a word that reaches it.
    Defaults are not stored on the namespace (argparse.SUPPRESS): `workload_from_args` fills
    them in from the dataclass, so a default lives in one place."""
    target = parser.add_argument_group(group_title) if group_title else parser
    for f in fields(Workload):
        if f.name in exclude or not f.metadata["cli"]:
            continue
        has_default = f.default is not MISSING
        extra = tuple((words or {}).get(f.name, ()))
        help_ = f.metadata["help"] + (f" (default {f.default})" if has_default else "")
        kind = _text_arg(f.name, f.metadata["text"]) if f.metadata["text"] else \
            _int_arg(f.name, f.metadata["tokens"], f.metadata["minimum"], extra)
        target.add_argument(flag(f.name), dest=f"workload_{f.name}", type=kind,
                            default=argparse.SUPPRESS, required=not has_default and f.name in required,
                            metavar="SPEC" if f.metadata["text"] else "|".join(("N",) + extra), help=help_)


def workload_from_args(args: argparse.Namespace, model=None, **override) -> Workload:
    """The Workload the command line asked for: flags given, else `override`, else the field defaults.
    Validated against `model` where one is given (DDBenchError, one line)."""
    values = {}
    for f in fields(Workload):
        key = f"workload_{f.name}"
        if hasattr(args, key):
            values[f.name] = getattr(args, key)
            if isinstance(values[f.name], str) and not f.metadata["text"]:
                raise DDBenchError(f"{flag(f.name)} {values[f.name]}: this command needs an integer here")
        elif f.name in override:
            values[f.name] = override[f.name]
    unknown = set(override) - {f.name for f in fields(Workload)}
    if unknown:
        raise TypeError(f"not Workload fields: {sorted(unknown)}")
    if "context" not in values:
        raise DDBenchError("a context is required (--context)")
    w = Workload(**values)
    if model is not None:
        w.validate(model)
    return w
