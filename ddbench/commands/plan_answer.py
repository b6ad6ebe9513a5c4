"""`ddbench plan`'s default text: the answer first, one short line per design, then where it comes from.

The first line answers the question (the design, its TP and batch, requests/s per GPU, GPUs and hosts for
--target-rate, P99 TPOT and TTFT, what binds); one line per design follows; then short lines on the fleet,
tensor parallelism, the host's sharing and the deployable flags, and the sources. No line is longer than
WIDTH: longer text is wrapped. Everything else (the tables by category, the probes, the break-even) is in
--verbose and --json. The ranking's content (which design is first, its rate) is the planner's; this module
only lays it out. Every term is explained in docs/planning.md.
"""

from __future__ import annotations

import math

from ddbench.commands import cache_note, kv_note, table, wrap
from ddbench.core.memory import CATEGORIES
from ddbench.core.units import GB, fmt_tokens, plural

def _rate(r: float) -> str:
    return "0" if r <= 0 else (f"{r:.3g}" if r >= 0.01 else f"{r:.2e}")


def _sec(v) -> str:
    from ddbench.planner.slo import fmt_seconds
    return "-" if v is None else fmt_seconds(v)


def per_gpu(d: dict) -> float:
    """Requests/s per GPU of the whole fleet: decode and (prefill elsewhere) prefill GPUs."""
    f = d.get("fleet") or {}
    return f["fleet_req_per_s_per_gpu"] if f else d.get("rate_per_gpu", d["max_rate_req_per_s"])


def fleet_count(out: dict, d: dict) -> dict | None:
    """GPUs (decode, prefill) and hosts for --target-rate; None without one."""
    from ddbench.core.catalog import get_host
    if "target_rate_req_per_s" not in out or d["status"] != "met":
        return None
    f = d.get("fleet") or {}
    decode = f.get("decode_gpus", d.get("gpus")) or 0
    prefill = f.get("prefill_gpus", 0)
    host = out.get("host_name")
    per = get_host(host).gpus if host else None
    hosts = (math.ceil(decode / per) + (math.ceil(prefill / per) if prefill else 0)) if per else None
    return {"gpus": decode + prefill, "decode": decode, "prefill": prefill, "hosts": hosts, "host": host,
            "per_host": per}


def answer_line(out: dict, d: dict) -> str:
    """The first line: the answer."""
    if d["status"] != "met":
        return out.get("verdict") or f"no design meets the SLO: {d.get('limited_by')}"
    n = fleet_count(out, d)
    batch = f"batch {d['mean_batch']:.0f}" if d.get("mean_batch") else f"max batch {d['max_batch']}"
    fleet = ""
    if n:
        fleet = f"; {plural(n['gpus'], 'GPU')}" + (f", {plural(n['hosts'], 'host')}" if n["hosts"] else "")
    ttft = (d.get("fleet") or {}).get("fleet_ttft_p99_s") or d.get("ttft_p99_s")
    return (f"{d['system']} TP{d.get('tp', 1)} {batch}: {_rate(per_gpu(d))} req/s/GPU{fleet};"
            f" p99 TPOT {_short(d.get('tpot_p99_s'))} TTFT {_short(ttft)}; binds {d.get('binding') or '-'}")


def _short(v) -> str:
    """Seconds in the fewest characters: 39.9ms, 25.9s."""
    if v is None:
        return "-"
    return f"{v * 1e3:.3g}ms" if v < 1 else f"{v:.3g}s" if v < 1000 else f"{v:.0f}s"


def ranking_lines(out: dict) -> list[str]:
    """One short line per design, in the planner's order: "=" where its rank is undecided against another's at
    these rates, and the interval of its rate over its rates' 95 % interval."""
    rows = []
    if not out["designs"]:
        return []
    for d in out["designs"]:
        if d["status"] == "met":
            n = fleet_count(out, d)
            iv = d.get("rate_interval")
            rate = _rate(per_gpu(d)) + (f" [{_rate(iv[0])}, {_rate(iv[1])}]" if iv and iv[0] < iv[1] else "")
            rows.append([f"{'=' if d.get('undecided_with') else ''}{d['rank']}. {d['system']}", rate,
                         f"TP {d.get('tp', 1)}",
                         f"batch {d['mean_batch']:.0f}" if d.get("mean_batch") else "-",
                         f"TPOT {_sec(d.get('tpot_p99_s'))}", f"TTFT {_sec((d.get('fleet') or {}).get('fleet_ttft_p99_s') or d.get('ttft_p99_s'))}",
                         plural(n["gpus"], "GPU") if n else "", d.get("binding") or "-"])
        else:
            why = "does not fit one request" if d["status"] == "no fit" else (d.get("limited_by") or d["status"])
            rows.append([f"-  {d['system']}", "none", f"TP {d.get('tp', 1)}", why[:60], "", "", "", ""])
    return ["  " + r for r in table(rows)]


def rates_summary(out: dict) -> list[str]:
    """The planner's verdict on the ranking at the rates' intervals (winner, undecided, break-even) and where the
    rates come from (ddbench.planner.ratelines: its content, laid out here), without its per-design repeats."""
    from ddbench.planner.ratelines import ranking_lines as verdict, rates_lines
    head = [x for x in verdict(out) if not x.lstrip(" =").split(" ", 1)[0].isdigit()]
    return head + (rates_lines(out["rates"]) if out.get("rates") else [])


def fleet_lines(out: dict, d: dict) -> list[str]:
    n = fleet_count(out, d)
    if not n:
        return []
    where = f" on {plural(n['hosts'], 'host')} of {n['host']} ({n['per_host']} GPUs each)" if n["hosts"] else ""
    split = f": {n['decode']} decode + {n['prefill']} prefill" if n["prefill"] else ""
    return [f"fleet: {plural(n['gpus'], 'GPU')}{split}{where}"]


def tp_lines(out: dict) -> list[str]:
    """Tensor parallelism, the host's sharing and host memory, as short lines."""
    lines = []
    tp = out.get("tp") or {}
    if tp.get("tp", 1) > 1:
        lines.append(tp["note"])
        lines.append(tp["allreduce"])
    if "host" in out:
        lines.append(f"link per GPU: {out['host']['note']}")
    return lines


def prefill_line(out: dict) -> list[str]:
    p = out.get("prefill_choice")
    return [p["line"]] if p else []


def serving_text(out: dict) -> list[str]:
    """The default text of the serving answer (plan --slo / --target-rate)."""
    from ddbench.commands import cost_model_line
    designs = out["designs"]
    first = next((d for d in designs if d["rank"] == 1), designs[0] if designs else None)
    lines = [answer_line(out, first)] if first else ["no design ran"]
    lines += prefill_line(out) + [x for x in out.get("notes", [])]
    lines += ["ranking (requests/s per GPU of the whole fleet [at the ends of the rates' 95 % intervals]):"]
    lines += ranking_lines(out) + rates_summary(out)
    lines += out.get("warnings", [])
    if first is not None:
        lines += fleet_lines(out, first)
    lines += tp_lines(out) + list(out.get("deploy", []))
    lines.append(f"SLO {', '.join(out['slo']) or 'none'}; context {out['context']}, output {out['output']},"
                 f" prefill {out['prefill']}; {out['model']} on {out['gpu']}{kv_note(out.get('kv_bits', 16))}")
    lines.append(plain(cost_model_line(out["cost_model"], False)))
    lines.append("hit rates: " + out["hit_rates"])
    lines.append("more: --verbose (tables by category, probes, break-even), --json")
    return wrap(lines)


PLAIN = (("decode compute RECONCILED with the engine", "decode compute fitted to the engine's measured steps"),
         ("NOT RECONCILED with the engine", "not fitted to the engine"), ("SCALED", "scaled to this GPU by datasheet"
                                                                          " ratios"), ("ROOFLINE", "roofline estimate"))


def plain(line: str) -> str:
    """The cost model's notes in plain words (the internal labels stay in --verbose and --json)."""
    for a, b in PLAIN:
        line = line.replace(a, b)
    return line


# ------------------------------------------------------------------ the memory answer (no SLO)
def memory_text(result: dict, verbose_table: list[str]) -> list[str]:
    """The default text of the memory answer: the answer, one line per design, TP, the host and the flags (memory
    by category: --verbose)."""
    rows = result["systems"]
    best = max(rows, key=lambda r: (r["fits"], r["max_batch"], -r["bytes"]["total"]))
    cap = result["capacity_bytes"]
    tp = result.get("tp", 1)
    who = f"per replica of {tp} GPUs" if tp > 1 else "per GPU"
    lines = [f"{best['system']}, TP {tp}: up to {best['max_batch']} requests {who}, bound by {best['bound_by']};"
             f" {best['bytes']['total'] / GB:.1f} of {cap / GB:.1f} GB per GPU"]
    lines += result.get("notes", [])
    w = result["workload"]
    lines.append(f"{result['model']} on {result['gpu']} ({cap / GB:.1f} GB), context {fmt_tokens(result['context'])},"
                 f" budget {w['budget']}, chunk {w['chunk']}; GB = 1e9 bytes")
    lines += [n.lstrip(", ") for n in (kv_note(w["kv_bits"]), cache_note([r["system"] for r in rows], w)) if n]
    from ddbench.planner.ratelines import rates_lines          # the rates, under the inputs and their notes
    lines += rates_lines(result["rates"]) if result.get("rates") else []
    t = [["  design", "max batch", "bound by", "GB per GPU", "of GPU", "host GB/request"]]
    for r in rows:
        t.append(["  " + r["system"], str(r["max_batch"]), r["bound_by"], f"{r['bytes']['total'] / GB:.2f}",
                  f"{100 * r['bytes']['total'] / cap:.0f}%" + ("" if r["fits"] else " OOM" if not r["fits_gpu"]
                                                                   else " host OOM"),
                  f"{r['host_bytes_per_request'] / GB:.2f}"])
    lines += table(t)
    lines += list(result.get("tp_lines", [])) + list(result.get("deploy", []))
    lines.append(f"host memory: {result['host_memory_note']}")
    return wrap(lines)


def category_table(rows: list[dict], tp: int, per_chunk: int = 8) -> list[str]:
    """GB per GPU by category (one rank's share under TP), designs as columns, at each one's shown batch."""
    out = [f"GPU memory by category, GB per GPU{' (one rank of TP %d)' % tp if tp > 1 else ''}:"]
    for i in range(0, len(rows), per_chunk):
        part = rows[i:i + per_chunk]
        t = [["  category"] + [r["system"] for r in part], ["  at batch"] + [str(r["breakdown_batch"]) for r in part]]
        for c in list(CATEGORIES) + ["total"]:
            t.append(["  " + c.replace("_", " ")] + [f"{r['bytes'][c] / GB:.2f}" for r in part])
        out += table(t)
    return out
