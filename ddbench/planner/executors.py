"""Run many independent simulator tasks: a local process pool (default) or a Ray cluster.

`run_tasks(fn, items, on_result, executor=..., workers=..., address=..., desc=...)` calls
`fn(item)` for every item and `on_result(index, result)` in this process as each one finishes
(in completion order), with a progress bar on stderr where that is a terminal (ddbench.progress). `fn` must be a module-level function
(it is pickled to the workers). With one worker and the local executor it runs in this process.

Ray is an optional extra (`pip install 'ddbench[ray]'`). With --address the cluster must be
reachable first: a TCP connection to the address is tried (3 s) before Ray is touched, so an
unreachable address is one line naming it, not Ray's retries and log lines. Without an address
a local Ray instance of `workers` CPUs is started and stopped; where Ray is already initialised
in this process (a test that started one), that instance is used and left running.
"""

from __future__ import annotations

import os
import socket
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from ddbench.core.errors import DDBenchError

RAY_HINT = ("start one with `ray start --head` (pip install 'ddbench[ray]'), or run without --address; a cluster"
            " with Ray's token authentication also needs its token here (or RAY_AUTH_MODE=disabled on both sides)")


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _bar(total: int, desc: str, quiet: bool):
    from ddbench.progress import bar
    return bar(total=total, desc=desc, unit="pt", quiet=quiet or total == 0, leave=False)


def run_tasks(fn, items: list, on_result, executor: str = "local", workers: int | None = None,
              address: str | None = None, desc: str = "points", quiet: bool = False) -> dict:
    """-> {"startup_s": seconds spent starting or connecting to Ray (0 for the local pool)}."""
    workers = workers or default_workers()
    if workers < 1:
        raise DDBenchError(f"--workers must be at least 1, got {workers}")
    if executor == "ray":
        return _run_ray(fn, items, on_result, workers, address, desc, quiet)
    if executor != "local":
        raise DDBenchError(f"unknown executor '{executor}'; known: local, ray")
    if address is not None:
        raise DDBenchError("--address is for --executor ray")
    bar = _bar(len(items), desc, quiet)
    try:
        if workers == 1 or len(items) <= 1:
            for i, it in enumerate(items):
                on_result(i, fn(it))
                bar.update(1)
            return {"startup_s": 0.0}
        pool = ProcessPoolExecutor(max_workers=min(workers, len(items)))
        try:
            futs = {pool.submit(fn, it): i for i, it in enumerate(items)}
            pending = set(futs)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    on_result(futs[f], f.result())
                    bar.update(1)
        except BaseException:
            # interrupted (Ctrl-C, SIGTERM) or failed: the points in flight are not waited for; their workers
            # are stopped (results come back to this process only, so a worker holds nothing to clean up)
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.kill()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return {"startup_s": 0.0}
    finally:
        bar.close()


def parse_address(address: str) -> tuple[str, int]:
    a = address.strip()
    for prefix in ("ray://", "http://", "https://"):
        if a.startswith(prefix):
            a = a[len(prefix):]
    host, sep, port = a.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise DDBenchError(f"Ray address '{address}' is not HOST:PORT (e.g. 10.0.0.5:6379)")
    return host.strip("[]"), int(port)


def check_ray_address(address: str, timeout: float = 3.0) -> None:
    host, port = parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise DDBenchError(f"cannot reach a Ray cluster at {address} ({reason}); {RAY_HINT}") from None


def import_ray():
    try:
        import ray
    except ImportError:
        raise DDBenchError("--executor ray needs Ray: pip install 'ddbench[ray]'") from None
    return ray


def _run_ray(fn, items, on_result, workers, address, desc, quiet) -> None:
    import logging
    ray = import_ray()
    if address is not None:
        check_ray_address(address)
    import time
    t0 = time.perf_counter()
    started = False
    if not ray.is_initialized():
        kw = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
                  configure_logging=True)
        try:
            if address is not None:
                ray.init(address=address, **kw)
            else:
                ray.init(num_cpus=workers, **kw)
        except ConnectionError as exc:
            raise DDBenchError(f"cannot connect to a Ray cluster at {address}: {exc}; {RAY_HINT}") from None
        started = True
    startup = time.perf_counter() - t0
    bar = _bar(len(items), desc + " (ray)", quiet)
    try:
        remote = ray.remote(num_cpus=1)(fn)
        # a bounded window keeps the object store small for large grids
        window = max(2, 4 * workers)
        nxt, pending = 0, {}
        while nxt < len(items) or pending:
            while nxt < len(items) and len(pending) < window:
                pending[remote.remote(items[nxt])] = nxt
                nxt += 1
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                on_result(pending.pop(ref), ray.get(ref))
                bar.update(1)
        return {"startup_s": startup}
    finally:
        bar.close()
        if started:
            ray.shutdown()
