"""CUDA-graph capture that leaves torch usable when the captured work raises, and the checks that say
whether a failed point left the process's GPU state usable (used by engine.Engine.capture, sweep.py and
paper.py).

Why not `with torch.cuda.graph(g)`: its __exit__ calls CUDAGraph.capture_end() and only then leaves the
capture stream, and capture_end() calls cudaStreamEndCapture before it takes the caching allocator out
of the capture's pool (endAllocateToPool). An exception inside the captured region (an allocation that
runs out of memory) while work is forked onto side streams (the engine's prefetch and urgent streams,
transfer.Sched) reaches capture_end with those forks unjoined: cudaStreamEndCapture fails ("capturing
stream has unjoined work"), which hides the out-of-memory error, and then for the rest of the process

  - the allocator stays in the capture's pool mode: torch.cuda.empty_cache() releases nothing of the
    default pools (c10 release_cached_blocks skips them while a capture is underway) and an allocation
    that fails does not retry after releasing the cache;
  - the current stream stays the capture stream, so the blocks cached for the default stream (every
    engine built before) are neither reused nor released.

The first H200 paper run (traces/engine/h200-paper-run1, in git history) showed both: SpeCache on qwen2.5-14b at 128K, batch
11, ran out in its capture; the next point (full-kv, batch 1, planned 51.6 of 79 GiB) was then reported
out of memory, and the next model's weights could not be allocated with 78.8 GiB reserved and 0.1 GiB
in use.

`capture(graph, body, join)` joins the side streams and ends the capture before an exception inside
`body` propagates, so the capture ends cleanly (the graph is discarded) and the original exception is
what the caller sees. Where ending the capture fails anyway, it restores the stream, takes the
allocator out of the pool (torch._C._cuda_endAllocateToPool with the pool id it chose) and raises
CaptureFailed (`sticky` unless that recovery worked). `gpu_health()` is the check after any failed
point: synchronize, no capture underway, the default stream current, empty_cache() really releasing.

The capture stream is chosen apart from the engine's side streams: torch.cuda.graph's one capture
stream comes from the same round-robin pool (32 streams per priority) as the engine's prefetch stream,
so every 32nd engine of a process had its prefetches captured in order on the compute stream (the H200
paper run's 33rd engine, qwen2.5-14b DualDecoder batch 2: 29.2 ms where 18-20 ms was due).
"""

from __future__ import annotations

import gc

OOM_WORDS = ("out of memory", "outofmemory", "cudaerrormemoryallocation")
# CUDA errors after which the context (or torch's view of it) cannot be trusted for later points
STICKY_WORDS = ("illegal memory access", "unspecified launch failure", "device-side assert", "misaligned address",
                "illegal instruction", "unjoined", "capture invalidated", "previous error during capture",
                "operation not permitted when stream is capturing", "captures_underway", "context is destroyed",
                "an illegal", "launch timed out", "ecc error", "uncorrectable")


class CaptureFailed(RuntimeError):
    """Ending a capture failed. `cause`: the exception raised inside the captured work (None: the end
    itself failed); `end`: the end's error; `recovered`: the stream restored and the allocator taken out
    of the capture's pool; `sticky`: not recovered (torch's allocator state is suspect for the process)."""

    def __init__(self, msg, *, cause=None, end=None, recovered=False):
        super().__init__(msg)
        self.cause, self.end, self.recovered = cause, end, recovered
        self.sticky = not recovered


def _first_line(exc) -> str:
    s = str(exc)
    return s.splitlines()[0][:200] if s else ""


def describe(exc) -> str:
    return f"{type(exc).__name__}: {_first_line(exc)}"


def chain(exc):
    """exc, then the exceptions it came from (CaptureFailed.cause, __cause__, __context__), each once."""
    seen, todo = [], [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return seen


def is_oom(exc) -> bool:
    """An out-of-memory error anywhere in exc's chain (torch.OutOfMemoryError, or its words)."""
    import torch
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return any(isinstance(e, oom) or any(w in str(e).lower() for w in OOM_WORDS) for e in chain(exc))


def is_sticky(exc) -> bool:
    """exc's chain says torch's or CUDA's state may be poisoned: a CaptureFailed not recovered, or a
    sticky CUDA error (an illegal access, a failed launch, a capture that could not end). The end error
    of a CaptureFailed that recovered (unjoined work, say) is not."""
    es = chain(exc)
    failed = [e for e in es if isinstance(e, CaptureFailed)]
    if any(c.sticky for c in failed):
        return True
    excused = {id(c.end) for c in failed} | {id(c) for c in failed}
    return any(id(e) not in excused and any(w in str(e).lower() for w in STICKY_WORDS) for e in es)


def classify(exc) -> tuple[str, str, bool]:
    """(status, error text, sticky) of an exception a point raised: status 'oom' where its chain holds an
    out-of-memory error (a capture that ran out included: the batch does not fit), else 'error'."""
    parts = [describe(e) for e in chain(exc)]
    return ("oom" if is_oom(exc) else "error"), " <- ".join(parts)[:400], is_sticky(exc)


# ------------------------------------------------------------------ the capture

def _recover(cuda, torch_c, pool) -> bool:
    """Take the allocator out of the capture's pool and give the pool back (what capture_end would have
    done had cudaStreamEndCapture not failed). True where both calls worked."""
    try:
        dev = cuda.current_device()
        torch_c._cuda_endAllocateToPool(dev, pool)
    except Exception:  # noqa: BLE001 - absent binding, or the pool was already ended
        return False
    try:
        torch_c._cuda_releasePool(dev, pool)
    except Exception:  # noqa: BLE001
        return False
    return True


def capture(graph, body, join, *, avoid=(), mode="global", cuda=None, torch_c=None):
    """Capture body() into `graph` (a torch.cuda.CUDAGraph) on a side stream, as torch.cuda.graph does
    (synchronize, empty_cache, a private pool, capture_error_mode `mode`), then join() (the caller's
    side streams back into the capture stream) and end the capture; returns body()'s value.

    An exception inside body: join(), end the capture (the graph is then a fragment: the caller
    discards it), re-raise it. The stream current before is current again whatever happens. Ending the
    capture failing: the allocator is taken out of the capture's pool and CaptureFailed is raised (from
    the original exception, if any).

    The capture stream is none of `avoid` (the caller's side streams): torch hands out streams
    round-robin from a pool of 32 per priority, so a fixed capture stream (torch.cuda.graph's, created
    once per process) is every 32nd engine's prefetch stream, and that engine's prefetches were then
    captured in order on the compute stream."""
    if cuda is None or torch_c is None:
        import torch
        cuda = cuda or torch.cuda
        torch_c = torch_c or torch._C
    pool = cuda.graph_pool_handle()
    prev = cuda.current_stream()
    side = cuda.Stream()
    for _ in range(65):
        if all(side != s for s in avoid if s is not None):
            break
        side = cuda.Stream()
    else:
        raise RuntimeError("no capture stream apart from the side streams")
    cuda.synchronize()
    cuda.empty_cache()
    side.wait_stream(prev)
    cuda.set_stream(side)
    try:
        try:
            graph.capture_begin(pool=pool, capture_error_mode=mode)
        except BaseException as exc:
            raise CaptureFailed(f"capture_begin failed: {describe(exc)}", end=exc,
                                recovered=_recover(cuda, torch_c, pool)) from exc
        try:
            out = body()
            join()
        except BaseException as exc:
            try:
                join()                 # the forks the failed body left behind
            except BaseException:      # noqa: BLE001 - the end below says whether the capture survived
                pass
            try:
                graph.capture_end()
            except BaseException as end:
                raise CaptureFailed(f"{describe(exc)}; then ending the capture failed: {describe(end)}", cause=exc,
                                    end=end, recovered=_recover(cuda, torch_c, pool)) from exc
            raise
        try:
            graph.capture_end()
        except BaseException as end:
            raise CaptureFailed(f"ending the capture failed: {describe(end)}", end=end,
                                recovered=_recover(cuda, torch_c, pool)) from end
    finally:
        cuda.set_stream(prev)
    prev.wait_stream(side)
    return out


# ------------------------------------------------------------------ after a failed point

def release() -> None:
    """Give back what the caching allocator holds for dead tensors: gc (cycles through tracebacks and
    engines), synchronize, empty_cache. Call it outside any `except` block (a live exception keeps its
    frames, and the engine in them, alive)."""
    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def cache_releases(cuda=None):
    """True when torch.cuda.empty_cache() really runs its release of the default pools (the allocator's
    num_sync_all_streams counter moves), False when it silently does nothing (a capture that did not
    end left the allocator in its pool mode); None where the counter is not there (another backend)."""
    if cuda is None:
        import torch
        cuda = torch.cuda
    s0 = cuda.memory_stats().get("num_sync_all_streams")
    cuda.empty_cache()
    s1 = cuda.memory_stats().get("num_sync_all_streams")
    if s0 is None or s1 is None:
        return None
    return s1 > s0


def _small_alloc():
    import torch
    x = torch.ones(1 << 18, device="cuda")
    x.add_(1)
    torch.cuda.synchronize()


def gpu_health(cuda=None, alloc=_small_alloc) -> tuple[bool, str]:
    """(usable, why not) of this process's GPU state between points: synchronize works, no capture is
    underway on the current stream, the current stream is the default one, empty_cache() releases, and a
    small allocation works (`alloc`). (True, '') without CUDA."""
    if cuda is None:
        import torch
        cuda = torch.cuda
    if not cuda.is_available():
        return True, ""
    try:
        cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        return False, f"synchronize failed: {describe(exc)}"
    try:
        if cuda.is_current_stream_capturing():
            return False, "the current stream is still capturing"
        if cuda.current_stream() != cuda.default_stream():
            return False, "a side stream (a failed capture's) is still the current stream"
        if cache_releases(cuda) is False:
            return False, ("torch.cuda.empty_cache() releases nothing: the caching allocator is still in a failed"
                           " capture's pool mode")
        alloc()
    except Exception as exc:  # noqa: BLE001
        return False, describe(exc)
    return True, ""
