"""The sweep spec (`ddbench sweep SPEC.yaml`), validated with pydantic, and its points.

    name: fig13-load              # optional, a plain name (letters, digits, ._-); the default output
                                  # folder is sweep-out/<name>
    requests: 2000                # requests per serving run
    max_batch: null               # optional cap on concurrent requests
    rates: my-rates.yaml          # optional: every design's rates from this file or `ddbench profile` folder,
                                  # resolved beside the spec (ddbench/core/ratefile.py); default: the matched
                                  # profile of traces/accuracy (ddbench/core/rates.py)
    rate: [shadowkv.miss=0.3]     # optional what-ifs, design.metric=VALUE
    grid:                         # every field a value or a list; the sweep is their product
      model: [qwen2.5-32b]
      gpu: [h100-80gb]
      link: [pcie5]               # null: the GPU's usual link
      host: [null]                # a multi-GPU host (catalog) whose GPUs fetch at once; null: alone
      fetching: [null]            # GPUs of the host fetching at once; null: all
      host_mem_gb: [null]         # host memory for one GPU's requests, GB; null: the host's / its GPUs,
                                  # or (no host) not a bound; a point where one request's host KV does not
                                  # fit is a row with status does-not-fit
      tp: [null]                  # tensor parallelism, GPUs per replica (null: 1); rates are per replica
      system: [shadowkv, dualdecoder]   # or design: (the same list; not both)
      context: [128k]             # or uniform:64k:128k
      output: ["256"]             # or exp:256, uniform:LO:HI
      budget: [2048]
      chunk: [8]
      lowrank_layers: [0]
      buffers: [design]           # sparse-KV buffer layout: design | pingpong | per-layer
      cache_tokens: [null]        # dualdecoder-cache's GPU cache per layer and KV head; null: the default
      kv_bits: [null]             # 16 (bf16) or 8 (fp8 host KV and link); null: 16
      cache_bits: [null]          # a chunk cache's slots: 16 (bf16) or 8 (fp8, needs kv_bits 8); null: 16
      index: [null]               # the landmark designs' selection index: flat, fp8, int4, two-level:G[,M[,..]]; null: flat
      hit_rate: [null]            # null: the model's profile, else 0.88
      prefill: [here]             # here | elsewhere
      rate: [0.1, 1, 10]          # Poisson arrivals, requests/s
      seed: [0]

Defaults come from ddbench/core/defaults.py. Unknown fields are rejected; empty strings, NaN and
infinite numbers, numbers out of range, empty lists and YAML's true/false where a value is wanted are
errors, each naming its field (`grid.rate[2]: ...`), every bad field in the one line. A value repeated in
a list is taken once (the same points would run twice).
Catalog names, distributions and knob combinations are checked for every point before anything
runs. The column and key of the design stay `system` (published in results.csv and in the keys
of points.jsonl). The buffer layout was once the field `cache`: a spec that still says `cache:` is a
one-line error naming `buffers`; a point's key hashes `buffers` under its old name, so that a
points.jsonl written before the rename is resumed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Annotated, Literal, Optional, Union

from ddbench.core.errors import DDBenchError

GRID_FIELDS = ("model", "gpu", "link", "host", "fetching", "host_mem_gb", "tp", "system", "context", "output", "budget",
               "chunk", "lowrank_layers", "buffers", "cache_tokens", "kv_bits", "cache_bits", "hit_rate", "prefill",
               "rate", "seed", "index")
# fields renamed since points.jsonl stores were written: their key hashes them under the old name
KEY_NAMES = {"buffers": "cache"}
REQUIRED = ("model", "gpu", "system", "context", "rate")   # grid fields with no default


def _models():
    from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

    from ddbench.core import defaults as D
    from ddbench.core.flags import PLAIN_NAME

    Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
    Tokens = Union[Annotated[int, Field(ge=1, le=D.MAX_TOKENS)], Text]
    from pydantic import BeforeValidator

    from ddbench.core.schemas import strict_number, strict_whole
    # numbers as numbers: a quoted "1" is refused, not converted (a token count may be text: 32k)
    Whole, Num = BeforeValidator(strict_whole), BeforeValidator(strict_number)
    Count = Annotated[int, Whole, Field(ge=1, le=D.MAX_COUNT)]
    Fraction = Annotated[float, Num, Field(ge=0, le=1, allow_inf_nan=False)]
    Rate = Annotated[float, Num, Field(ge=D.MIN_RATE, le=D.MAX_RATE, allow_inf_nan=False)]
    HostGB = Annotated[float, Num, Field(gt=0, le=D.MAX_HOST_MEM_GB, allow_inf_nan=False)]

    class Grid(BaseModel):
        model_config = ConfigDict(extra="forbid")
        model: list[Text] = Field(min_length=1)
        gpu: list[Text] = Field(min_length=1)
        link: list[Optional[Text]] = [None]
        host: list[Optional[Text]] = [None]
        fetching: list[Optional[Count]] = [None]
        host_mem_gb: list[Optional[HostGB]] = [None]
        tp: list[Optional[Annotated[int, Field(ge=1, le=64)]]] = [None]
        system: list[Text] = Field(min_length=1, validation_alias=AliasChoices("system", "design"))
        context: list[Tokens] = Field(min_length=1)
        output: list[Tokens] = [D.OUTPUT]
        budget: list[Tokens] = [D.BUDGET]
        chunk: list[Count] = [D.CHUNK]
        lowrank_layers: list[Annotated[int, Whole, Field(ge=0, le=D.MAX_COUNT)]] = [D.LOWRANK_LAYERS]
        buffers: list[Literal["design", "pingpong", "per-layer"]] = [D.BUFFERS]
        cache_tokens: list[Optional[Tokens]] = [None]
        kv_bits: list[Optional[Literal[8, 16]]] = [None]
        cache_bits: list[Optional[Literal[8, 16]]] = [None]
        hit_rate: list[Optional[Union[Fraction, Text]]] = [None]
        prefill: list[Literal["here", "elsewhere"]] = [D.PREFILL]
        rate: list[Rate] = Field(min_length=1)
        seed: list[Annotated[int, Whole, Field(ge=0, le=2 ** 63 - 1)]] = [D.SEED]
        index: list[Optional[Text]] = [None]

        @model_validator(mode="before")
        @classmethod
        def _one_design_key(cls, v):
            if isinstance(v, dict) and "system" in v and "design" in v:
                raise ValueError("give the designs as design: or as system:, not both")
            return v

        @field_validator("*", mode="before")
        @classmethod
        def _listify(cls, v, info):
            v = v if isinstance(v, list) else [v]
            if not v and info.field_name not in REQUIRED:    # those: pydantic's min_length says it
                raise ValueError("List should have at least 1 item (null for the default), not 0")
            _no_bool(v)
            return v

    class Spec(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: Optional[str] = None
        requests: Annotated[int, Whole] = Field(D.SWEEP_REQUESTS, ge=1, le=D.MAX_REQUESTS)
        max_batch: Optional[Count] = None
        rates: Optional[Text] = None      # a rates file or `ddbench profile` folder, beside the spec
        rate: list[Text] = []             # what-ifs: design.metric=VALUE
        grid: Grid

        @field_validator("requests", "max_batch", mode="before")
        @classmethod
        def _number(cls, v):
            _no_bool([v])
            return v

        @field_validator("name")
        @classmethod
        def _plain_name(cls, v):
            if v is not None and not PLAIN_NAME.fullmatch(v):
                raise ValueError(f"{v!r} is not a plain name: letters, digits and ._-, not starting with '.'"
                                 " (it names the folder sweep-out/<name>)")
            return v

    return Spec


def _no_bool(values) -> None:
    """YAML's true/false are not numbers (pydantic would take true as 1)."""
    if any(isinstance(x, bool) for x in values):
        raise ValueError("true/false is not a value here: give a number or a name")


def _once(values: list) -> list:
    """Each value once, in the order given: a repeated value would run the same points twice."""
    out = []
    for x in values:
        if x not in out:
            out.append(x)
    return out


TYPE_ERRORS = ("int_type", "int_parsing", "int_from_float", "string_type", "float_type", "float_parsing")


def _member(part) -> bool:
    """A union member's tag that pydantic puts in an error's location (e.g. "int", "constrained-str")."""
    return isinstance(part, str) and (part in ("int", "str", "float") or part.startswith(("constrained-", "function-")))


def field_errors(errors) -> str:
    """pydantic's errors as one line naming every bad field: 'grid.rate[2]: ...; requests: ...', each field
    once, in the spec's order. A union (int or text) reports one error per member: the one about the value
    is kept, not the one about its type."""
    by_field: dict[str, list] = {}
    for e in errors:
        by_field.setdefault(_where([p for p in e["loc"] if not _member(p)]), []).append(e)
    parts = []
    for loc, same in by_field.items():
        e = next((x for x in same if x["type"] not in TYPE_ERRORS), same[0])
        msg = "unknown field (not in the spec schema)" if e["type"] == "extra_forbidden" else e["msg"]
        parts.append(f"{loc}: {msg.removeprefix('Value error, ')}")
    return "; ".join(parts)


def _where(loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "spec"


def load_spec(path: str) -> dict:
    """Read and validate a spec -> a plain dict (grid values as lists); DDBenchError naming the field."""
    import yaml
    from pydantic import ValidationError

    from ddbench.core.io import MAX_DEPTH, check_depth, load_yaml
    try:
        with open(path, encoding="utf-8") as fh:
            raw = load_yaml(fh.read())
    except OSError as exc:
        raise DDBenchError(f"cannot read sweep spec {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DDBenchError(f"sweep spec {path}: not a text file (UTF-8 YAML)") from None
    except RecursionError:
        raise DDBenchError(f"sweep spec {path}: nested too deeply (at most {MAX_DEPTH} levels)") from None
    except ValueError as exc:   # a YAML value its constructor refuses (e.g. a date 2020-13-45)
        raise DDBenchError(f"sweep spec {path}: not valid YAML ({exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise DDBenchError(f"sweep spec {path}: not valid YAML{where}") from None
    if not isinstance(raw, dict):
        raise DDBenchError(f"sweep spec {path}: expected a mapping with 'grid', got {type(raw).__name__}")
    check_depth(raw, f"sweep spec {path}")
    if isinstance(raw.get("grid"), dict) and "cache" in raw["grid"]:
        raise DDBenchError(f"sweep spec {path}: grid.cache: the sparse-KV buffer layout (design | pingpong |"
                           " per-layer) is now the field buffers; the chunk cache's capacity is cache_tokens")
    try:
        spec = _models().model_validate(raw)
    except ValidationError as exc:
        raise DDBenchError(f"sweep spec {path}: {field_errors(exc.errors())}") from None
    d = spec.model_dump()
    d["grid"] = {k: _once([str(x) if k in ("context", "output") else x for x in v]) for k, v in d["grid"].items()}
    from ddbench.core.designs import design_names     # 'all' and 'every' as on the command line
    d["grid"]["system"] = _once([n for v in d["grid"]["system"] for n in
                                 (design_names(v) if str(v).strip().lower() in ("all", "every") else (v,))])
    return d


def count_points(spec: dict) -> int:
    n = 1
    for k in GRID_FIELDS:
        n *= len(spec["grid"].get(k, [None]))
    return n


def points(spec: dict) -> list[dict]:
    g = spec["grid"]
    out = []
    for combo in itertools.product(*(g.get(k, [None]) if k in LATER_FIELDS else g[k] for k in GRID_FIELDS)):
        p = dict(zip(GRID_FIELDS, combo))
        p["requests"] = spec["requests"]
        p["max_batch"] = spec["max_batch"]
        if spec.get("rates"):
            p["rates"] = spec["rates"]
            p["rates_sha"] = spec.get("rates_sha")
        if spec.get("rate"):
            p["rate_what_if"] = list(spec["rate"])
        out.append(p)
    return out


# fields added after points.jsonl stores were written: left out of the key where they are null, so an
# older store's points keep their keys
LATER_FIELDS = ("host_mem_gb", "cache_tokens", "kv_bits", "cache_bits", "index", "tp")


def point_key(p: dict) -> str:
    q = {KEY_NAMES.get(k, k): v for k, v in p.items() if not (k in LATER_FIELDS and v is None)}
    return hashlib.sha1(json.dumps(q, sort_keys=True).encode()).hexdigest()[:16]


def scenario_of(p: dict):
    """The scenario of one point (its rate and seed aside)."""
    from ddbench.core.index import index_name
    from ddbench.core.units import parse_tokens
    from ddbench.planner.scenario import Scenario
    later = {}
    if p.get("cache_tokens") is not None:
        later["cache_tokens"] = parse_tokens(p["cache_tokens"], "cache_tokens")
    for k in ("kv_bits", "cache_bits"):
        if p.get(k) is not None:
            later[k] = int(p[k])
    if p.get("index") is not None:
        later["index"] = index_name(p["index"])
    from ddbench.core.ratefile import load_source, parse_override
    if p.get("rates"):
        later["rates"] = load_source(p["rates"])
    if p.get("rate_what_if"):
        later["rate_overrides"] = tuple(parse_override(x) for x in p["rate_what_if"])
    tp = int(p.get("tp") or 1)         # GPUs per replica; its TP group sits in the GPU's usual host unless named
    if tp > 1:
        from ddbench.planner.scenario_args import tp_host
        later["tp"] = tp
    host = p["host"] if p["host"] is not None or tp == 1 else tp_host(p["gpu"], tp)
    return Scenario.make(**later, model=p["model"], gpu=p["gpu"], design=p["system"], context=p["context"],
                         output=p["output"], link=p["link"], host=host, fetching=p["fetching"],
                         host_mem_gb=p.get("host_mem_gb"),
                         budget=parse_tokens(p["budget"], "budget"), chunk=p["chunk"],
                         lowrank_layers=p["lowrank_layers"], buffers=p["buffers"], hit_rate=p["hit_rate"],
                         prefill=p["prefill"], requests=p["requests"], max_batch=p["max_batch"])


def check_points(spec: dict, path: str) -> None:
    """Resolve every distinct scenario (catalog names, knobs, distributions) before any run. Every bad value
    of a field is named, in one line; then the first point whose combination fails."""
    from ddbench.planner.scenario import resolve
    from ddbench.core.catalog import get_gpu, get_host, get_link, get_model
    from ddbench.core.designs import get_design
    from ddbench.core.distribution import Distribution
    from ddbench.core.index import index_name
    from ddbench.core.units import parse_tokens
    g = spec["grid"]
    checks = {"model": get_model, "gpu": get_gpu, "link": get_link, "host": get_host, "system": get_design,
              "output": lambda v: Distribution.parse(v, "output"),
              "budget": lambda v: parse_tokens(v, "budget"), "cache_tokens": lambda v: parse_tokens(v, "cache_tokens"),
              "index": index_name}
    bad = []
    for field in (f for f in GRID_FIELDS if f in checks):
        for i, v in enumerate(g[field]):
            if v is None:
                continue
            try:
                checks[field](v)
            except DDBenchError as exc:
                bad.append(f"grid.{field}[{i}]: {exc}")
    if bad:
        raise DDBenchError(f"sweep spec {path}: " + "; ".join(bad))
    seen = set()
    for p in points(dict(spec, grid=dict(g, rate=g["rate"][:1], seed=g["seed"][:1]))):
        try:
            sc = scenario_of(p)
            if sc in seen:
                continue
            seen.add(sc)
            resolve(sc).check()
        except DDBenchError as exc:
            what = ", ".join(f"{k}={p[k]}" for k in GRID_FIELDS if len(g.get(k, [None])) > 1 and k not in ("rate", "seed"))
            raise DDBenchError(f"sweep spec {path}: point {what or 'of the grid'}: {exc}") from None
