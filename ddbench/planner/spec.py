"""The sweep spec (`ddbench sweep SPEC.yaml`), validated with pydantic, and its points.

    name: fig13-load              # optional; the default output folder is sweep-out/<name>
    requests: 2000                # requests per serving run
    max_batch: null               # optional cap on concurrent requests
    grid:                         # every field a value or a list; the sweep is their product
      model: [qwen2.5-32b]
      gpu: [h100-80gb]
      link: [pcie5]               # null: the GPU's usual link
      host: [null]                # a multi-GPU host (catalog) whose GPUs fetch at once; null: alone
      fetching: [null]            # GPUs of the host fetching at once; null: all
      system: [shadowkv, dualdecoder]
      context: [128k]             # or uniform:64k:128k
      output: ["256"]             # or exp:256, uniform:LO:HI
      budget: [2048]
      chunk: [8]
      lowrank_layers: [0]
      cache: [design]             # design | pingpong | per-layer
      hit_rate: [null]            # null: the model's profile, else 0.88
      prefill: [here]             # here | elsewhere
      rate: [0.1, 1, 10]          # Poisson arrivals, requests/s
      seed: [0]

Unknown fields are rejected; every error names its field (`grid.rate[2]: ...`). Catalog names,
distributions and knob combinations are checked for every point before anything runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Literal, Optional, Union

from ddbench.core.errors import DDBenchError

GRID_FIELDS = ("model", "gpu", "link", "host", "fetching", "system", "context", "output", "budget", "chunk",
               "lowrank_layers", "cache", "hit_rate", "prefill", "rate", "seed")


def _models():
    from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, field_validator

    Tokens = Union[int, str]

    class Grid(BaseModel):
        model_config = ConfigDict(extra="forbid")
        model: list[str] = Field(min_length=1)
        gpu: list[str] = Field(min_length=1)
        link: list[Optional[str]] = [None]
        host: list[Optional[str]] = [None]
        fetching: list[Optional[int]] = [None]
        system: list[str] = Field(min_length=1)
        context: list[Tokens] = Field(min_length=1)
        output: list[Tokens] = ["256"]
        budget: list[Tokens] = [2048]
        chunk: list[int] = [8]
        lowrank_layers: list[int] = [0]
        cache: list[Literal["design", "pingpong", "per-layer"]] = ["design"]
        hit_rate: list[Optional[Union[float, str]]] = [None]
        prefill: list[Literal["here", "elsewhere"]] = ["here"]
        rate: list[PositiveFloat] = Field(min_length=1)
        seed: list[int] = [0]

        @field_validator("*", mode="before")
        @classmethod
        def _listify(cls, v):
            return v if isinstance(v, list) else [v]

    class Spec(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: Optional[str] = None
        requests: int = Field(2000, ge=1)
        max_batch: Optional[int] = Field(None, ge=1)
        grid: Grid

    return Spec


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
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except OSError as exc:
        raise DDBenchError(f"cannot read sweep spec {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise DDBenchError(f"sweep spec {path}: not valid YAML{where}") from None
    if not isinstance(raw, dict):
        raise DDBenchError(f"sweep spec {path}: expected a mapping with 'grid', got {type(raw).__name__}")
    try:
        spec = _models().model_validate(raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = _where(e["loc"])
        # pydantic appends the member type tried (e.g. "int", "str") for unions; drop it
        parts = [p for p in e["loc"] if not (isinstance(p, str) and p in ("int", "str", "float"))]
        loc = _where(parts)
        msg = "unknown field (not in the spec schema)" if e["type"] == "extra_forbidden" else e["msg"]
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise DDBenchError(f"sweep spec {path}: {loc}: {msg}{more}") from None
    d = spec.model_dump()
    d["grid"] = {k: [str(x) if k in ("context", "output") else x for x in v] for k, v in d["grid"].items()}
    return d


def count_points(spec: dict) -> int:
    n = 1
    for k in GRID_FIELDS:
        n *= len(spec["grid"][k])
    return n


def points(spec: dict) -> list[dict]:
    g = spec["grid"]
    out = []
    for combo in itertools.product(*(g[k] for k in GRID_FIELDS)):
        p = dict(zip(GRID_FIELDS, combo))
        p["requests"] = spec["requests"]
        p["max_batch"] = spec["max_batch"]
        out.append(p)
    return out


def point_key(p: dict) -> str:
    return hashlib.sha1(json.dumps(p, sort_keys=True).encode()).hexdigest()[:16]


def scenario_of(p: dict):
    from ddbench.core.units import parse_tokens
    from ddbench.planner.scenario import Scenario
    return Scenario(model=p["model"], gpu=p["gpu"], system=p["system"], context=p["context"], output=p["output"],
                    link=p["link"], host=p["host"], fetching=p["fetching"],
                    budget=parse_tokens(p["budget"], "budget"), chunk=p["chunk"],
                    lowrank_layers=p["lowrank_layers"], cache=p["cache"], hit_rate=p["hit_rate"],
                    prefill=p["prefill"], requests=p["requests"], max_batch=p["max_batch"])


def check_points(spec: dict, path: str) -> None:
    """Resolve every distinct scenario (catalog names, knobs, distributions) before any run."""
    from sim.serving import parse_dist
    from ddbench.planner.scenario import resolve
    g = spec["grid"]
    for i, v in enumerate(g["output"]):
        try:
            parse_dist(v, "output")
        except DDBenchError as exc:
            raise DDBenchError(f"sweep spec {path}: grid.output[{i}]: {exc}") from None
    from ddbench.core.catalog import get_gpu, get_host, get_link, get_model
    from ddbench.core.systems import get_system
    from ddbench.core.units import parse_tokens
    checks = {"model": get_model, "gpu": get_gpu, "link": get_link, "host": get_host, "system": get_system,
              "budget": lambda v: parse_tokens(v, "budget")}
    for field, fn in checks.items():
        for i, v in enumerate(g[field]):
            if v is None:
                continue
            try:
                fn(v)
            except DDBenchError as exc:
                raise DDBenchError(f"sweep spec {path}: grid.{field}[{i}]: {exc}") from None
    seen = set()
    for p in points(dict(spec, grid=dict(g, rate=g["rate"][:1], seed=g["seed"][:1]))):
        try:
            sc = scenario_of(p)
            if sc in seen:
                continue
            seen.add(sc)
            resolve(sc)
        except DDBenchError as exc:
            what = ", ".join(f"{k}={p[k]}" for k in GRID_FIELDS if len(g[k]) > 1 and k not in ("rate", "seed"))
            raise DDBenchError(f"sweep spec {path}: point {what or 'of the grid'}: {exc}") from None
