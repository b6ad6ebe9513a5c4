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
    g = p.add_argument_group("accuracy profile rows (only with a profile; default: T2 start, temperature"
                             f" {D.PROFILE_TEMPERATURE}, the smallest budget measured, every context and task"
                             " averaged)")
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
    base = Scenario.make(model=args.model, gpu=args.gpu, context=args.context,
                         output=D.OUTPUT if args.output is None else args.output, link=args.link,
                         hit_rate=args.hit_rate, calibration=args.calibration, roofline=args.roofline,
                         max_batch=args.max_batch, requests=requests if args.requests is None else args.requests,
                         lowrank_from_profile=lowrank, knobs=knobs, **rate_fields(args), **extra)
    return [replace(base, design=d) for d in args.design]


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
