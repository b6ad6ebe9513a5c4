"""GPU measurements behind `ddbench calibrate` (imported lazily; needs torch, triton and CUDA).

Each measurement is one row of a section of the calibration bundle (ddbench/core/calibration.py),
written as soon as it is taken; a row already in the bundle is not measured again, so an
interrupted run resumes. Timing: CUDA events around the region, warm-up first, the median of
several repeats, random data (never zeros).

Sections:
  ceilings      HBM device-to-device copy, dense bf16 GEMM rate
  link          copy engine (H2D, D2H, both at once) by transfer size; UVA gather/scatter kernel
                (reads/writes the pinned host pointer) by chunk size and thread blocks, each
                direction and both at once; CPU gather (index_select into pinned staging + one
                copy) and its D2H twin; one cudaMemcpyAsync per chunk
  linear        qkv, o, gate_up, down and LM head of every catalog model, m tokens in a sweep
  kernels       torch SDPA decode over a sparse budget (1 and 2 queries), full-context decode
                attention, prefill attention, landmark selection (score + group max + top-k),
                low-rank key rebuild (U[rows] @ SV); and the Triton kernels of kernels/ that the
                landmark designs run: dual/single-token sparse attention, selection, key rebuild;
                and SpeCache's selection over its 2-bit key copy (the engine's pass 1 over the codes
                + fused top-k), Llama-3-8B heads only
  interference  an urgent 2 MiB transfer while a 256 MiB background transfer is in flight, by
                method and stream priority, and a decode GEMM beside the background
  compute_interference  each kind of decode kernel alone and beside the engine's prefetch gather
                (kernels/calibrate_interference.py)

The link and interference sections, the UVA chunk copy and the timing helpers: kernels/calibrate_link.py.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import time

import torch

from ddbench.core.provenance import command_output, git_dirty, git_head, utc_now

from ddbench.core.calibration import SECTIONS, BundleWriter, bundle_dir
from ddbench.core.catalog import MODELS
from ddbench.core.catalog.gpus import catalog_gpu_name
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.kernels.calibrate_interference import InterferenceSections
from ddbench.kernels.timing import provenance as gpu_provenance
from ddbench.kernels.calibrate_link import MiB, LinkSections, rand_bf16, time_ms, uva_copy  # noqa: F401 (uva_copy: its old home)

# SpeCache's scoring row (triton_quant_scan): the engine's head configuration (Llama-3-8B) and quant group
QUANT_SCAN_HEADS = (32, 8, 128)
QUANT_SCAN_GROUP = 64


def quant_scan_bytes(b, hk, ctx, d, group=QUANT_SCAN_GROUP) -> int:
    """Bytes SpeCache's selection must read: the 2-bit codes plus the bf16 scale and zero per group."""
    return b * hk * (ctx // 4) * d + 2 * b * hk * (ctx // group) * d * 2


# ----------------------------------------------------------------------------- provenance

def provenance(gpu: str, command: str) -> dict:
    """The bundle's provenance: the GPU side's (ddbench.kernels.timing.provenance, the core's gpu_provenance) under
    the bundle's names (device_name; git_sha and git_dirty apart, the core's git_head and git_dirty; date
    with its UTC offset), the catalog GPU name, and what a calibration adds (memory, SMs, PCIe, host)."""
    base = gpu_provenance(command)
    props = torch.cuda.get_device_properties(0)
    dirty = git_dirty()
    return {
        "gpu": gpu,
        "device_name": base["gpu"],
        "device_total_bytes": int(props.total_memory),
        "sm_count": int(props.multi_processor_count),
        "driver": base["driver"],
        "pcie": command_output(["nvidia-smi", "--query-gpu=pcie.link.gen.current,pcie.link.width.current",
                                "--format=csv,noheader"]),
        **{k: base[k] for k in ("cuda", "torch", "triton")},
        "python": platform.python_version(),
        "git_sha": git_head(),
        "git_dirty": "unknown" if dirty is None else ("yes" if dirty else "no"),
        "date": utc_now(offset=True),
        "command": command,
        "host": socket.gethostname(),
        "host_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


# ----------------------------------------------------------------------------- sections

class Calibrator(LinkSections, InterferenceSections):
    def __init__(self, writer: BundleWriter, deadline: float, log=print):
        self.w = writer
        self.deadline = deadline
        self.log = log
        self.errors: list[str] = []
        self.measured = 0
        self.skipped = 0

    def out_of_time(self) -> bool:
        return time.time() > self.deadline

    def point(self, section: str, key: dict, measure) -> None:
        """Measure one row unless present; measure() returns the non-key columns."""
        if self.w.have(section, **key):
            self.skipped += 1
            return
        if self.out_of_time():
            return
        try:
            vals = measure()
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            self.errors.append(f"{section} {key}: out of memory")
            return
        except Exception as exc:  # a failed measurement is reported, never invented
            self.errors.append(f"{section} {key}: {type(exc).__name__}: {str(exc)[:160]}")
            return
        if vals is None:
            return
        self.w.add(section, {**key, **vals})
        self.measured += 1

    def finish(self, section: str, note: str = "") -> None:
        if not self.out_of_time():
            self.w.complete(section, note)
        self.log(f"  {section}: {len(self.w.rows[section])} rows")

    # -- ceilings
    def ceilings(self):
        def hbm():
            n = 1 << 30
            a = rand_bf16(n // 2)
            b = torch.empty_like(a)
            ms = time_ms(lambda: b.copy_(a))
            return {"value": 2 * n / ms / 1e6, "unit": "GB/s (read + write)"}
        self.point("ceilings", {"name": "hbm_d2d_copy_gbps"}, hbm)

        def gemm():
            a, b = rand_bf16(8192, 8192), rand_bf16(8192, 8192)
            ms = time_ms(lambda: a @ b)
            return {"value": 2 * 8192 ** 3 / ms / 1e9, "unit": "TFLOP/s (bf16 8192^3, random data)"}
        self.point("ceilings", {"name": "bf16_gemm_tflops"}, gemm)
        torch.cuda.empty_cache()
        self.finish("ceilings")

    def linear(self, m_sweep=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 8192)):
        seen = set()
        for model in MODELS.values():
            q = model.num_heads * model.head_dim
            kv = model.num_kv_heads * model.head_dim
            shapes = {"qkv": (model.hidden, q + 2 * kv), "o": (q, model.hidden),
                      "gate_up": (model.hidden, 2 * model.intermediate), "down": (model.intermediate, model.hidden),
                      "lm_head": (model.hidden, model.vocab)}
            for layer, (k, n) in shapes.items():
                if (k, n) in seen:
                    continue
                seen.add((k, n))
                if all(self.w.have("linear", model=model.name, layer=layer, k=k, n=n, m_tokens=m) for m in m_sweep):
                    self.skipped += len(m_sweep)
                    continue
                if self.out_of_time():
                    break
                wt = rand_bf16(n, k)
                for m in m_sweep:
                    def meas():
                        x = rand_bf16(m, k)
                        ms = time_ms(lambda: torch.nn.functional.linear(x, wt))
                        return {"latency_ms": ms, "tflops": 2 * m * k * n / ms / 1e9}
                    self.point("linear", {"model": model.name, "layer": layer, "k": k, "n": n, "m_tokens": m}, meas)
                del wt
                torch.cuda.empty_cache()
            self.log(f"  linear: {model.name} done ({len(self.w.rows['linear'])} rows)")
        self.finish("linear", "torch.nn.functional.linear (cuBLAS), bf16, random weights and inputs")

    # -- decode kernels
    def kernels(self):
        if not any(r["name"] == "hbm_d2d_copy_gbps" for r in self.w.rows["ceilings"]):
            self.ceilings()
        # HBM floor of a kernel = bytes it must read / the measured copy rate (read + write counted)
        hbm = next((r["value"] for r in self.w.rows["ceilings"] if r["name"] == "hbm_d2d_copy_gbps"), None)
        if hbm is None:
            self.errors.append("kernels: skipped, the HBM ceiling they are compared with was not measured")
            return
        hbm *= 1e9
        configs = {}
        for m in MODELS.values():
            configs.setdefault((m.num_heads, m.num_kv_heads, m.head_dim), m)
        for hq, hk, d in configs:
            self._sparse_decode(hq, hk, d, hbm)
            torch.cuda.empty_cache()
            self._select_landmarks(hq, hk, d, hbm)
            torch.cuda.empty_cache()
            self._lowrank_rebuild(hq, hk, d, hbm)
            self._full_decode_and_prefill(hq, hk, d, hbm)
            torch.cuda.empty_cache()
            self.log(f"  kernels: heads {hq}/{hk}x{d} done ({len(self.w.rows['kernels'])} rows)")
        self.triton_kernels(configs, hbm)
        self.finish("kernels", "sdpa_decode/sdpa_prefill: torch SDPA (enable_gqa, no mask); select_landmarks:"
                               " torch matmul/softmax/topk; lowrank_rebuild: torch gather+matmul (CUDA events"
                               " around eager calls). triton_attention (q_tokens 1 = single, 2 = dual-token),"
                               " triton_select (kernels/select.py score + torch.topk) and triton_rebuild"
                               " (kernels/rebuild.py, + RoPE): the Triton kernels of kernels/, CUDA-graph"
                               " replays (kernels/timing.py), input sets rotated over >= 256 MiB against L2."
                               " triton_quant_scan: SpeCache's selection as the decode-step engine runs it"
                               " (ddbench.kernels.engine.fastselect.specache_select_topk: kernels/specache.py pass 1"
                               " over the 2-bit codes + the fused top-256 of 8-token chunks), random codes,"
                               " param = quant group 64, Llama-3-8B heads; its floor = codes + scales + zeros"
                               " read at the HBM copy rate")

    def _sdpa(self, kernel, b, qt, kvt, hq, hk, d, hbm, target_ms=25.0):
        """torch SDPA of qt query tokens against kvt cached tokens; its floor: K and V read once."""
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def meas():
            k = rand_bf16(b, hk, kvt, d)
            v = rand_bf16(b, hk, kvt, d)
            q = rand_bf16(b, hq, qt, d)
            ms = time_ms(lambda: sdpa(q, k, v, enable_gqa=True), target_ms=target_ms)
            return {"latency_ms": ms, "hbm_floor_ms": 2 * k.numel() * 2 / hbm * 1e3}
        self.point("kernels", {"kernel": kernel, "batch": b, "q_tokens": qt, "kv_tokens": kvt,
                               "num_heads": hq, "num_kv_heads": hk, "head_dim": d, "param": 0}, meas)

    def _sparse_decode(self, hq, hk, d, hbm):
        """Sparse decode attention over the gathered budget (+ local + generated tokens), 1 and 2 queries."""
        for kvt in [1024, 2048, 4096]:
            for b in [1, 8, 32, 64, 128]:
                for qt in [1, 2]:
                    self._sdpa("sdpa_decode", b, qt, kvt, hq, hk, d, hbm)

    def _select_landmarks(self, hq, hk, d, hbm):
        """Landmark selection: scores of the query rows against S/C landmarks, max over the group, top-k."""
        for ctx in [32768, 131072]:
            for b in [1, 8, 32]:
                for qt in [1, 2]:
                    def meas():
                        nch = ctx // 8
                        lm = rand_bf16(b, hk, nch, d)
                        q = rand_bf16(b, hk, (hq // hk) * qt, d)

                        def select():
                            s = torch.matmul(q, lm.transpose(-1, -2)).float().softmax(-1)
                            s = s.view(b, hk, hq // hk, qt, nch).amax(2)
                            return torch.topk(s, 2048 // 8, dim=-1).indices
                        ms = time_ms(select)
                        return {"latency_ms": ms, "hbm_floor_ms": lm.numel() * 2 / hbm * 1e3}
                    self.point("kernels", {"kernel": "select_landmarks", "batch": b, "q_tokens": qt,
                                           "kv_tokens": ctx, "num_heads": hq, "num_kv_heads": hk,
                                           "head_dim": d, "param": 8}, meas)

    def _lowrank_rebuild(self, hq, hk, d, hbm):
        """Low-rank key rebuild: K_sel = U[rows] @ SV (rank 160), budget 2048 rows."""
        for b in [1, 8, 32]:
            def meas():
                ctx, r = 32768, 160
                u = rand_bf16(b, ctx, r)
                sv = rand_bf16(r, hk * d)
                rows = torch.randint(0, ctx, (b, 2048), device="cuda")
                ms = time_ms(lambda: torch.matmul(torch.gather(u, 1, rows[..., None].expand(-1, -1, r)), sv))
                floor = (b * 2048 * r + r * hk * d + b * 2048 * hk * d) * 2 / hbm * 1e3
                return {"latency_ms": ms, "hbm_floor_ms": floor}
            self.point("kernels", {"kernel": "lowrank_rebuild", "batch": b, "q_tokens": 1, "kv_tokens": 2048,
                                   "num_heads": hq, "num_kv_heads": hk, "head_dim": d, "param": 160}, meas)

    def _full_decode_and_prefill(self, hq, hk, d, hbm):
        """Full-context decode attention (full-kv) and a chunked-prefill pass of 8192 tokens against its prefix."""
        for kvt, b in [(16384, 1), (65536, 1), (131072, 1), (131072, 4)]:
            self._sdpa("sdpa_decode", b, 1, kvt, hq, hk, d, hbm)
        for kvt in [8192, 65536]:
            self._sdpa("sdpa_prefill", 1, 8192, kvt, hq, hk, d, hbm, target_ms=50)

    def triton_kernels(self, configs: dict, hbm: float) -> None:
        """The Triton kernels of kernels/ that the landmark designs run: dual/single-token sparse
        attention over the gathered budget, chunk selection, low-rank key rebuild (+ RoPE); and
        SpeCache's selection over its 2-bit keys (triton_quant_scan, the engine's heads only)."""
        from ddbench.kernels.attention import dual_sparse_attention
        from ddbench.kernels.engine.fastselect import specache_select_topk
        from ddbench.kernels.rebuild import rebuild_keys
        from ddbench.kernels.select import select_chunks
        from ddbench.kernels.timing import time_cuda

        def n_sets(nbytes):
            return int(min(8, max(1, -(-256 * MiB // max(1, nbytes)))))

        # the head configurations of the paper's 8B and 32B/14B models first (a short budget measures those)
        order = sorted(configs, key=lambda c: (c not in ((32, 8, 128), (40, 8, 128)), c))
        for hq, hk, d in order:
            for kvt in [1024, 2048, 4096]:
                for b in [1, 8, 32, 64, 128]:
                    for qt in [1, 2]:
                        def meas():
                            kv_bytes = 2 * b * hk * (kvt + qt) * d * 2
                            sets = [(rand_bf16(b, qt, hq, d), rand_bf16(b, hk, kvt + qt, d),
                                     rand_bf16(b, hk, kvt + qt, d)) for _ in range(n_sets(kv_bytes))]
                            lengths = torch.full((b,), kvt, device="cuda", dtype=torch.int32)
                            ms = time_cuda([lambda s=s: dual_sparse_attention(s[0], s[1], s[2], lengths)
                                            for s in sets], inner=3, reps=10)
                            return {"latency_ms": ms, "hbm_floor_ms": kv_bytes / hbm * 1e3}
                        self.point("kernels", {"kernel": "triton_attention", "batch": b, "q_tokens": qt,
                                               "kv_tokens": kvt, "num_heads": hq, "num_kv_heads": hk,
                                               "head_dim": d, "param": 0}, meas)
            torch.cuda.empty_cache()
            for ctx in [32768, 131072]:
                for b in [1, 8, 32]:
                    for qt in [1, 2]:
                        def meas():
                            nch = ctx // 8
                            lm_bytes = b * hk * nch * d * 2
                            sets = [(rand_bf16(b, qt, hq, d), rand_bf16(b, hk, nch, d))
                                    for _ in range(n_sets(lm_bytes))]
                            ms = time_cuda([lambda s=s: select_chunks(s[0], s[1], 2048 // 8) for s in sets],
                                           inner=3, reps=10)
                            return {"latency_ms": ms, "hbm_floor_ms": lm_bytes / hbm * 1e3}
                        self.point("kernels", {"kernel": "triton_select", "batch": b, "q_tokens": qt,
                                               "kv_tokens": ctx, "num_heads": hq, "num_kv_heads": hk,
                                               "head_dim": d, "param": 8}, meas)
            torch.cuda.empty_cache()
            for b in [1, 8, 32]:
                def meas():
                    ctx, r, n, c = 32768, 160, 2048 // 8, 8
                    u = rand_bf16(b, ctx, r) / r ** 0.5
                    sv = rand_bf16(b, hk, r, d)
                    idx = torch.rand(b, hk, ctx // c, device="cuda").argsort(-1)[..., :n].sort(-1).values.int()
                    k_out = torch.empty(b, hk, n * c, d, device="cuda", dtype=torch.bfloat16)
                    ms = time_cuda(lambda: rebuild_keys(u, sv, idx, k_out, chunk=c), inner=3, reps=10)
                    floor = (b * hk * n * c * r + b * hk * r * d + b * hk * n * c * d) * 2 / hbm * 1e3
                    return {"latency_ms": ms, "hbm_floor_ms": floor}
                self.point("kernels", {"kernel": "triton_rebuild", "batch": b, "q_tokens": 1, "kv_tokens": 2048,
                                       "num_heads": hq, "num_kv_heads": hk, "head_dim": d, "param": 160}, meas)
            torch.cuda.empty_cache()
            if (hq, hk, d) == QUANT_SCAN_HEADS:
                self.quant_scan(hq, hk, d, hbm, n_sets, specache_select_topk)
            self.log(f"  kernels (Triton): heads {hq}/{hk}x{d} done ({len(self.w.rows['kernels'])} rows)")

    QUANT_SCAN_POINTS = [(ctx, b, qt) for ctx in (32768, 131072) for b in (1, 8, 32) for qt in (1, 2)]

    def quant_scan(self, hq, hk, d, hbm, n_sets, select) -> None:
        """SpeCache's selection as the decode-step engine runs it (`select` =
        ddbench.kernels.engine.fastselect.specache_select_topk: pass 1 over the 2-bit codes, then the fused
        top-k of 8-token chunks, budget 2048 tokens) on random codes; 12 rows."""
        from ddbench.kernels.specache import random_quant_keys
        from ddbench.kernels.timing import time_cuda
        g = QUANT_SCAN_GROUP
        for ctx, b, qt in self.QUANT_SCAN_POINTS:
            def meas():
                nbytes = quant_scan_bytes(b, hk, ctx, d, g)
                sets = [(rand_bf16(b, qt, hq, d), random_quant_keys(b, hk, ctx, d, g))
                        for _ in range(n_sets(nbytes))]
                ms = time_cuda([lambda s=s: select(s[0], s[1], 8, 2048 // 8) for s in sets], inner=3, reps=10)
                return {"latency_ms": ms, "hbm_floor_ms": nbytes / hbm * 1e3}
            self.point("kernels", {"kernel": "triton_quant_scan", "batch": b, "q_tokens": qt, "kv_tokens": ctx,
                                   "num_heads": hq, "num_kv_heads": hk, "head_dim": d, "param": g}, meas)
        torch.cuda.empty_cache()

    def engine(self):
        """The engine section comes from this GPU's engine sweep (`ddbench bench engine`, its compute-only
        CUDA-graph floor phase), not from a measurement of its own."""
        from ddbench.core.calibration import add_engine_section
        engine_dir = str(traces_dir("engine", self.w.gpu))
        if not os.path.exists(os.path.join(engine_dir, "engine.csv")):
            note = f"no engine sweep for {self.w.gpu} in {engine_dir}: run `ddbench bench engine` first"
            self.w.sections.setdefault("engine", {"file": SECTIONS["engine"]["file"], "complete": False})
            self.w.sections["engine"]["note"] = note
            self.w._write_meta()
            self.log(f"  engine: {note}")
            return
        n = add_engine_section(self.w, engine_dir)
        self.log(f"  engine: {n} rows from {engine_dir}")


ALL_SECTIONS = ("ceilings", "link", "linear", "kernels", "interference", "compute_interference", "engine")


def run_calibration(out_root: str, gpu: str | None, sections: list[str], budget_s: float, fresh: bool,
                    command: str, log=print) -> dict:
    if not torch.cuda.is_available():
        raise DDBenchError("ddbench calibrate needs a CUDA GPU; none is visible to torch")
    props = torch.cuda.get_device_properties(0)
    name = gpu or catalog_gpu_name(torch.cuda.get_device_name(0), props.total_memory)
    path = bundle_dir(name, out_root)
    writer = BundleWriter(path, name, provenance(name, command), fresh=fresh)
    if writer.resumed:
        log(f"resuming {path}: {writer.resumed} rows already measured")
    cal = Calibrator(writer, time.time() + budget_s, log)
    torch.manual_seed(0)
    for s in sections:
        if cal.out_of_time():
            log(f"time budget spent before section {s}; rerun to resume")
            break
        log(f"section {s} ...")
        t0 = time.time()
        getattr(cal, s)()
        log(f"  ({time.time() - t0:.1f} s)")
    if cal.errors:
        writer.provenance["errors"] = writer.provenance.get("errors", []) + cal.errors
        writer._write_meta()
        for e in cal.errors[:30]:
            log(f"  error: {e}")
    return {"path": path, "gpu": name, "measured": cal.measured, "skipped": cal.skipped, "errors": cal.errors,
            "rows": {s: len(r) for s, r in writer.rows.items()}}


if __name__ == "__main__":  # pragma: no cover - convenience
    print(run_calibration(str(traces_dir("calibration")), None, list(ALL_SECTIONS), 600, False, " ".join(sys.argv)))
