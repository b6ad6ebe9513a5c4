"""Chrome / Perfetto trace JSON (open in chrome://tracing or ui.perfetto.dev). Times in microseconds."""

from __future__ import annotations

TRACKS = {"gpu": 1, "h2d": 2, "d2h": 3, "host_cpu": 4}


def timeline_events(events, offset_s: float = 0.0, pid: int = 1) -> list[dict]:
    out = []
    for track, name, start, end in events:
        out.append({"name": name, "ph": "X", "pid": pid, "tid": TRACKS.get(track, 9),
                    "ts": (offset_s + start) * 1e6, "dur": max(0.0, end - start) * 1e6, "cat": track})
    for track, tid in TRACKS.items():
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": track}})
    return out


def counter_events(rows, key_time: str, keys: list[str], name: str, pid: int = 2, scale: float = 1.0) -> list[dict]:
    return [{"name": name, "ph": "C", "pid": pid, "ts": r[key_time] * 1e6,
             "args": {k: r[k] * scale for k in keys}} for r in rows]


def trace_json(events: list[dict], notes: list[str]) -> dict:
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"cost_model": notes}}
