"""The scenario's flags, shared by `simulate` and `plan`, and the scenarios they stand for.

    add_scenario_args(p, design="all", context_required=True, requests=D.PLAN_REQUESTS, serving=g)
    scenarios = scenarios_from_args(args, host=args.host, prefill=args.prefill)   # one per design

Every value is checked where argparse parses it (ddbench/core/flags.py and the parsers below): an
empty string, an empty list, a number out of range are one-line errors. Flags that are not given
stay None on the namespace (`given(args)` tells which), and `scenarios_from_args` fills in the
defaults of ddbench/core/defaults.py.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from ddbench.core import defaults as D
from ddbench.core import flags
from ddbench.core.designs import design_names
from ddbench.core.errors import DDBenchError
from ddbench.core.tp import AUTO, DEFAULT_HOSTS, MAX_TP, parse_tp, valid
from ddbench.core.distribution import Distribution
from ddbench.core.units import parse_tokens
from ddbench.core.workload import add_workload_args
from ddbench.planner.scenario import KNOBS, Scenario

# flags this module registers with a None default (so a command can tell whether they were given)
OPTIONAL = ("output", "link", "hit_rate", "calibration", "max_batch", "requests")
RATE_FLAGS = ("rates", "rate")   # read by the memory answer too (its rate lines), unlike OPTIONAL


def _type_error(fn):
    """`fn(text)` raising DDBenchError, as an argparse type (one-line error, exit 2)."""
    def parse(text: str):
        try:
            return fn(text)
        except DDBenchError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def dist(what: str):
    """128k, uniform:LO:HI or exp:MEAN -> a ddbench.core.distribution.Distribution: parsed here, once."""
    return flags.checked(lambda text: Distribution.parse(text, what))


designs = _type_error(design_names)   # 'all', 'every' or a comma list -> a tuple of names


class RateFlag(argparse.Action):
    """--rate DESIGN.METRIC=VALUE: a what-if rate (repeatable, into `rate_what_if`); where the command also takes
    an arrival rate (simulate), --rate REQ/S (no '=') is that, as before."""

    def __init__(self, *a, arrivals=None, **kw):
        self.arrivals = arrivals
        super().__init__(*a, **kw)

    def check(self, text: str):
        """A config file's value, checked as on the command line (argparse.ArgumentTypeError, DDBenchError)."""
        if "=" in text:
            from ddbench.core.ratefile import parse_override
            return parse_override(text)
        if self.arrivals is None:
            raise argparse.ArgumentTypeError(f"expected DESIGN.METRIC=VALUE, got {text!r}")
        return self.arrivals(text)

    def __call__(self, parser, ns, values, option_string=None):
        if "=" in values:
            ns.rate_what_if = list(getattr(ns, "rate_what_if", None) or []) + [values]
        elif self.arrivals is not None:
            try:
                setattr(ns, self.dest, self.arrivals(values))
            except argparse.ArgumentTypeError as exc:
                parser.error(f"argument --rate: {exc}")
        else:
            parser.error(f"argument --rate: expected DESIGN.METRIC=VALUE (e.g. shadowkv.miss=0.3), got {values!r}")


def add_rate_args(p, arrivals=None, default=None) -> None:
    """--rates FILE and --rate DESIGN.METRIC=VALUE (with `arrivals`, --rate REQ/S too, default `default`)."""
    p.add_argument("--rates", type=flags.text(), metavar="FILE",
                   help="every design's rates from a `ddbench profile` output folder or a YAML/JSON of per-design"
                        " rates (ddbench/core/ratefile.py; default: the matched profile in traces/accuracy/)")
    what = "what-if: one rate, e.g. dualdecoder-cache.churn=0.2 or shadowkv.miss=0.3 (repeatable)"
    p.add_argument("--rate", action=RateFlag, arrivals=arrivals, default=default, dest="rate",
                   metavar="REQ/S|DESIGN.METRIC=VALUE" if arrivals else "DESIGN.METRIC=VALUE",
                   help=(f"Poisson arrival rate, requests/s (default {default}); or a " if arrivals else "") + what)
    p.set_defaults(rate_what_if=None)


def add_scenario_args(p, *, design: str, context_required: bool, requests: int, serving=None) -> None:
    """The scenario's flags on `p`; `serving` (an argument group, default `p`) holds those that only a
    serving run reads: output, link, hit rate, calibration, batch cap, requests."""
    g = serving if serving is not None else p
    p.add_argument("--model", required=True, type=flags.text(), help="catalog name or path to a config.json")
    p.add_argument("--gpu", required=True, type=flags.text(),
                   help="catalog GPU name, e.g. h100-80gb, h200, or a YAML/JSON file of your own GPU (the catalog's"
                        " fields: ddbench/core/catalog/files.py)")
    p.add_argument("--design", "--system", dest="design", default=design, type=designs, metavar="DESIGN",
                   help=f"design, comma list, 'all' (the paper's four and dualdecoder-cache) or 'every' (the"
                        f" ablations and lru-cache too; default {design}; --system is the older name of this flag)")
    if context_required:
        p.add_argument("--context", required=True, type=dist("context"),
                       help="prompt tokens per request: 131072, 128k or 1m; serving runs also uniform:LO:HI")
    else:
        p.add_argument("--context", default=D.CONTEXT, type=dist("context"),
                       help=f"prompt tokens: 128k, uniform:64k:128k or exp:MEAN (default {D.CONTEXT})")
    g.add_argument("--output", type=dist("output"),
                   help=f"output tokens per request: 256, uniform:LO:HI or exp:MEAN (default {D.OUTPUT})")
    g.add_argument("--link", type=flags.text(),
                   help="host link: a catalog name (pcie4, pcie5, ...) or a YAML/JSON file of your own (default: the"
                        " GPU's usual link, or the host's)")
    g.add_argument("--hit-rate", type=flags.fraction_or_path(), metavar="RATE|CSV",
                   help="prediction hit rate: a number in [0, 1], or an accuracy CSV (default: the model's"
                        f" traces/accuracy/<model>.csv, else {D.HIT_RATE})")
    g.add_argument("--calibration", type=flags.text(), metavar="DIR",
                   help="bundle root (default: the data root's calibration/)")
    g.add_argument("--roofline", action="store_true", help="ignore calibration bundles; pure roofline")
    g.add_argument("--max-batch", type=flags.integer(lo=1, hi=D.MAX_COUNT),
                   help="cap on concurrent requests (default: memory only)")
    g.add_argument("--requests", type=flags.integer(lo=1, hi=D.MAX_REQUESTS),
                   help=f"requests per simulator run (default {requests})")
    p.add_argument("--tp", type=_type_error(parse_tp), metavar="N|auto",
                   help="tensor parallelism: GPUs per replica, weights and KV heads sharded as vLLM/SGLang do"
                        " (default 1; auto: the smallest that fits, or with --slo the one needing fewest GPUs)")


def add_workload(p, words: dict | None = None, title: str = "workload (the memory model's knobs)") -> None:
    """The Workload knobs (--budget, --chunk, ...), defaults from the dataclass."""
    add_workload_args(p, exclude=("context", "batch"), group_title=title, words=words)


# ---------------------------------------------------------------- accuracy profile rows (simulate)
PROFILE_ROWS = ("init", "temperature", "budget", "context", "task")


def _row_arg(key: str):
    def parse(text: str):
        from ddbench.sim.hitrates import SMALLEST
        v = text.strip()
        if not v:
            raise argparse.ArgumentTypeError(f"--profile-{key} is empty; give a value or 'all'")
        if v == "all":
            return None
        if key == "temperature":
            try:
                t = float(v)
            except ValueError:
                raise argparse.ArgumentTypeError(f"--profile-temperature must be a number or 'all', got {v!r}") from None
            if not (t >= 0 and t < float("inf")):
                raise argparse.ArgumentTypeError(f"--profile-temperature must be finite and at least 0, got {v!r}")
            return t
        if key == "budget" and v == "smallest":
            return SMALLEST
        if key in ("budget", "context"):
            return _type_error(lambda x: parse_tokens(x, f"--profile-{key}"))(v)
        return v
    return parse


def add_profile_row_args(p) -> None:
    g = p.add_argument_group("accuracy profile rows", f"only with a profile; default: T2 start, temperature"
                             f" {D.PROFILE_TEMPERATURE},\nthe smallest budget measured, every context and task"
                             " averaged")
    helps = {"init": ("INIT", "first speculative token: t2, random, or all"),
             "temperature": ("T", "output sampling temperature, or all"),
             "budget": ("N", "budget_tokens: smallest, all, or tokens (1024, 2k)"),
             "context": ("N", "context_tokens (4k), or all"), "task": ("TASK", "task name, or all")}
    for k in PROFILE_ROWS:   # left out: not on the namespace (so 'all', which is None, counts as given)
        g.add_argument(f"--profile-{k}", metavar=helps[k][0], type=_row_arg(k), default=argparse.SUPPRESS,
                       help=helps[k][1])


def profile_rows(args) -> tuple:
    """((Select field, value), ...) of the --profile-* flags given, sorted by name."""
    return tuple(sorted((k, getattr(args, f"profile_{k}")) for k in PROFILE_ROWS if hasattr(args, f"profile_{k}")))


# ---------------------------------------------------------------- scenarios
def scenarios_from_args(args, requests: int, **extra) -> list[Scenario]:
    """One scenario per design the flags name; `extra`: scenario fields the command parsed itself."""
    knobs = {k: getattr(args, f"workload_{k}") for k in KNOBS if hasattr(args, f"workload_{k}")}
    lowrank = knobs.get("lowrank_layers") == "profile"
    if lowrank:
        del knobs["lowrank_layers"]
    tp = getattr(args, "tp", None) or 1
    if tp == AUTO:
        tp = extra.pop("tp", None) or smallest_fitting_tp(args, requests, **extra)
    if tp > 1 and extra.get("host") is None:
        extra["host"] = tp_host(args.gpu, tp)
    base = Scenario.make(model=args.model, gpu=args.gpu, context=args.context, tp=tp,
                         output=D.OUTPUT if args.output is None else args.output, link=args.link,
                         hit_rate=args.hit_rate, calibration=args.calibration, roofline=args.roofline,
                         max_batch=args.max_batch, requests=requests if args.requests is None else args.requests,
                         lowrank_from_profile=lowrank, knobs=knobs, **rate_fields(args), **extra)
    scs = [replace(base, design=d) for d in args.design]
    return [fit_fp8(sc) for sc in scs] if len(scs) > 1 else scs


def fit_fp8(sc: Scenario) -> Scenario:
    """In a list of designs, fp8 (--kv-bits 8, --cache-bits 8) applies where the design supports it: a design
    that keeps no KV on the host runs without it, one without a chunk cache without --cache-bits 8."""
    from ddbench.core.designs import get_design
    from ddbench.core.memory import keeps_kv_on_host
    d = get_design(sc.design)
    if sc.knob("kv_bits") != 16 and not keeps_kv_on_host(d):
        return sc.with_knobs(kv_bits=16, cache_bits=16)
    if sc.knob("cache_bits") != 16 and not d.chunk_cache:
        return sc.with_knobs(cache_bits=16)
    return sc


def fp8_note(args) -> str | None:
    """One line where fp8 was asked of a list of designs and some do not take it: what each runs."""
    knobs = {k: getattr(args, f"workload_{k}", None) for k in ("kv_bits", "cache_bits")}
    if len(args.design) < 2 or all(v in (None, 16) for v in knobs.values()):
        return None
    base = Scenario.make(model=args.model, gpu=args.gpu, **{k: v for k, v in knobs.items() if v is not None})
    got = {d: fit_fp8(replace(base, design=d)) for d in args.design}
    if all(g == replace(base, design=d) for d, g in got.items()):
        return None
    kinds = {"fp8 KV and chunk cache": [d for d, g in got.items() if g.knob("cache_bits") == 8],
             "fp8 KV": [d for d, g in got.items() if g.knob("kv_bits") == 8 and g.knob("cache_bits") != 8],
             "bf16 (keeps no KV on the host)": [d for d, g in got.items() if g.knob("kv_bits") == 16]}
    return "fp8 where it applies: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in kinds.items() if v)


def tp_host(gpu: str, tp: int) -> str | None:
    """The host a TP group of `gpu` sits in where --host is not given: the catalog's HGX-like host of that GPU
    (None where the catalog has none: the ranks' shared links and host memory are then not modelled)."""
    from ddbench.core.catalog import get_gpu
    return DEFAULT_HOSTS.get(get_gpu(gpu).name)


def tp_candidates(args, host: str | None) -> list[int]:
    """The TP sizes that shard the model on the host's GPUs (or one HGX board's), smallest first."""
    from ddbench.core.catalog import get_host, get_model
    m = get_model(args.model)
    return valid(m, get_host(host).gpus if host is not None else MAX_TP)


def smallest_fitting_tp(args, requests: int, **extra) -> int:
    """--tp auto for the memory answer: the smallest TP at which every named design fits one request (else the
    smallest at which any does)."""
    from ddbench.core.memory import max_batch
    from ddbench.planner.scenario import resolve
    fits = {}
    for tp in tp_candidates(args, extra.get("host")):
        ns = argparse.Namespace(**{**vars(args), "tp": tp})
        here = dict(extra, host=extra.get("host") or (tp_host(args.gpu, tp) if tp > 1 else None))
        ok = []
        for sc in scenarios_from_args(ns, requests, **here):
            r = resolve(sc)
            ok.append(max_batch(r.design, r.model, r.gpu, replace(r.workload, context=r.max_context
                                                                   or r.workload.context)) >= 1)
        if all(ok):
            return tp
        fits[tp] = any(ok)
    if any(fits.values()):
        return min(t for t, f in fits.items() if f)
    raise DDBenchError(f"--tp auto: no design fits one request of {args.model} at any TP up to {max(fits)}")


def weights_overflow(args) -> str | None:
    """Without --tp, where the model's weights alone exceed one GPU: --tp auto is taken, and this line says so."""
    from ddbench.core.catalog import get_gpu, get_model
    if getattr(args, "tp", None) is not None:
        return None
    m, g = get_model(args.model), get_gpu(args.gpu)
    if m.weight_bytes < g.hbm_bytes:
        return None
    args.tp = AUTO
    return (f"{m.name}'s {m.weight_bytes / 1e9:.1f} GB of weights exceed one {g.name} ({g.hbm_bytes / 1e9:.1f} GB):"
            " sharded with --tp auto (pass --tp N to choose)")


def rate_fields(args, base: str | None = None) -> dict:
    """The scenario's rates and rate_overrides from --rates and --rate (each checked: one-line errors)."""
    from ddbench.core.ratefile import load_source, parse_override, resolve_path
    out = {}
    if getattr(args, "rates", None):
        out["rates"] = load_source(resolve_path(args.rates, base, "--rates"))
    if getattr(args, "rate_what_if", None):
        out["rate_overrides"] = tuple(parse_override(x) for x in args.rate_what_if)
    return out


def given(args) -> list[str]:
    """The flags of OPTIONAL (and --roofline) given on the command line, as flags."""
    out = [f"--{k.replace('_', '-')}" for k in OPTIONAL if getattr(args, k, None) is not None]
    return out + (["--roofline"] if getattr(args, "roofline", False) else [])
