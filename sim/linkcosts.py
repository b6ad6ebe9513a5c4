"""The link half of the cost model (sim/costmodel.py's CostModel inherits it): the rates of the link for
the sparse KV's pieces, from the calibration bundle's link and interference tables (or the catalog
without a bundle), the gather's per-chunk round trip, ShadowKV's fetch as the engine ran it before
the in-place step, and the in-place slot gather. Time is in seconds. No torch here.

The mixin reads what CostModel sets: bundle, link, hbm, fitted, reuse_fits, _cache and _note.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace

from ddbench.core.catalog.links import get_link
from ddbench.core.errors import DDBenchError


def interp_clamped(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation, clamped at both ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    j = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def fit_affine(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares y = a + b x with a >= 0 and b > 0 (x bytes, y seconds)."""
    n = len(points)
    if n == 1:
        x, y = points[0]
        return 0.0, y / x
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    b = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0
    a = my - b * mx
    if b <= 0 or a < 0:  # fall back to a proportional fit through the origin
        a = 0.0
        b = sum(p[1] for p in points) / sum(p[0] for p in points)
    return a, b


@dataclass(frozen=True)
class LinkRates:
    """What the link model needs, per direction (work is measured in seconds at full rate)."""
    h2d_gbps: float          # large-transfer rate of the method used for sparse KV (GB/s)
    h2d_t0_s: float          # fixed cost per transfer (launch + ramp)
    d2h_gbps: float          # copy engine, device to host
    d2h_t0_s: float
    bidir_factor: float      # per-direction share of the rate when both directions are busy
    urgent_slowdown: float   # urgent transfer time with a background transfer beside it / alone
    compute_slowdown: float  # decode GEMM time with a background gather beside it / with a copy-engine one
    cpu_gather_gbps: float   # host CPU index_select stage of the CPU-gather ablation (0 = unused)
    chunk_bytes: int         # contiguous run of one transfer
    method: str              # uva_gather | cpu_gather | copy_engine
    # (family, ((size, slowdown), ...)) of each kind of decode kernel beside the engine's prefetch gather
    # (the bundle's compute_interference section: gemm, selection, attention, elementwise, each at its
    # measured sizes); () where not measured: then every kind is slowed by compute_slowdown
    compute_slowdowns: tuple = ()

    def slowdown_of(self, family: str, size: float) -> float:
        """A kind of decode kernel's slowdown beside a GPU gather at `size` (its unit: the bundle's rows),
        interpolated in log2(size) between the measured sizes and held at the ends; compute_slowdown
        where the family was not measured."""
        pts = dict(self.compute_slowdowns).get(family)
        if not pts:
            return self.compute_slowdown
        if len(pts) == 1 or size <= pts[0][0]:
            return pts[0][1]
        if size >= pts[-1][0]:
            return pts[-1][1]
        return interp_clamped([math.log2(x) for x, _ in pts], [y for _, y in pts], math.log2(size))


class LinkCosts:
    """The costs of the link; mixed into CostModel."""

    def gather_round_s(self, chunk_bytes: int, blocks: int = 32) -> float | None:
        """Time one block of the bundle's persistent UVA gather spends per chunk (one chunk in flight
        per block), fixed cost removed: (latency - h2d_t0_s) / (chunks / blocks) of the largest
        measured transfer, interpolated in log2(chunk). Where the gather runs below the link rate (2 KiB
        chunks: 35.8 GB/s with 32 blocks on the H200) this is the round-trip latency of one chunk
        read; None without link rows."""
        if self.bundle is None:
            return None
        g = [r for r in self.bundle.rows["link"] if r["method"] == "uva_gather" and r["direction"] == "h2d"
             and r["blocks"] == blocks]
        if not g:
            return None
        t0 = self.link_rates("gpu", chunk_bytes).h2d_t0_s
        xs = sorted({r["chunk_bytes"] for r in g})
        ys = []
        for c in xs:
            r = max((r for r in g if r["chunk_bytes"] == c), key=lambda r: r["transfer_bytes"])
            ys.append((r["latency_ms"] / 1e3 - t0) / (r["transfer_bytes"] / c / blocks))
        return interp_clamped([math.log2(c) for c in xs], ys, math.log2(chunk_bytes))

    def gather_walk_s(self, slots: int, chunk_bytes: int, programs: int = 32, in_flight: int = 2) -> float:
        """A persistent gather of `programs` blocks walking `slots` chunk slots, `in_flight` chunks per
        block per round, latency-bound: ceil(slots / (programs * in_flight)) rounds of one chunk's
        round trip (gather_round_s at `programs` blocks), whether a slot's chunk comes from the host
        or from GPU memory (assumed: the round is a chain of dependent loads either way; an HBM-only
        round was not measured)."""
        t = self.gather_round_s(chunk_bytes, programs)
        if t is None:
            return 0.0
        return math.ceil(slots / (programs * in_flight)) * t

    def reuse_fetch_model(self, chunk_bytes: int, programs: int = 32, in_flight: int = 2) -> str:
        """Which model reuse_fetch_s uses at this gather shape: 'fitted' (the bundle's reuse_fetch
        records, ReuseFetchFit in the fitted parameters) or 'bundle-derived' (none at this shape: older
        bundles; from link.csv and ceilings.csv, see reuse_fetch_s)."""
        return "fitted" if (chunk_bytes, programs, in_flight) in self.reuse_fits else "bundle-derived"

    def reuse_fetch_s(self, slots: int, chunk_bytes: int, programs: int = 32, in_flight: int = 2,
                      miss_share: float | None = None) -> float:
        """The decode-step engine's ShadowKV fetch of one layer as the engine ran it before its in-place ShadowKV step
        (issue 31; the copy-then-regather step, not the user's plan: sim/fit/replay.py legacy_reuse_fetch
        adds it to that engine's rows in the validation), all of it in the compute stream's order: a device copy of the previous selection's rows (`slots` x
        `chunk_bytes`) into a spare buffer, the reuse plan, and one persistent gather over every slot (hits
        from that spare, misses from the host; `miss_share` of them).

        Fitted (reuse_fetch_model 'fitted'): where the bundle has reuse_fetch records of this gather shape,
        their ReuseFetchFit at this slot count and miss share (required then). Bundle-derived (older
        bundles without the records; the documented behaviour for them, and the notes say so): the copy at
        the measured HBM copy rate (ceilings.csv, read + write counted), the gather's fixed cost (h2d_t0_s)
        and its latency-bound walk (gather_walk_s), whatever the miss share; no reuse plan."""
        fit = self.reuse_fits.get((chunk_bytes, programs, in_flight))
        if fit is not None:
            if miss_share is None:
                raise ValueError("the fitted reuse fetch needs the layer's miss share")
            self._note(f"ShadowKV's copy-then-regather fetch of the engine before its in-place ShadowKV step (on the compute stream, the key rebuild after it; priced only in the validation of that engine's rows)"
                       f" FITTED to the bundle's reuse_fetch records at {chunk_bytes} B chunks, {programs} programs"
                       f" x {in_flight}: {fit.describe()}")
            return fit.fetch_s(slots, chunk_bytes, math.ceil(slots / (programs * in_flight)), miss_share)
        have = sorted(self.reuse_fits)
        recs = len(self.bundle.rows.get("reuse_fetch", [])) if self.bundle is not None else 0
        why = ("records at " + str(have) if have else f"the bundle's {recs} records are not fitted: {self.fitted.why}"
               if recs else "no such section: an older bundle")
        self._note(f"ShadowKV's copy-then-regather fetch of the engine before its in-place ShadowKV step (on the compute stream, the key rebuild after it; priced only in the validation of that engine's rows)"
                   f" BUNDLE-DERIVED, not measured: no fitted reuse_fetch records at {chunk_bytes} B chunks,"
                   f" {programs} programs x {in_flight} ({why}); copy at the HBM"
                   " copy rate + the gather's fixed cost + ceil(slots / (programs x in flight)) rounds of the 32-block"
                   " gather's round trip (link.csv)")
        copy_bytes = slots * chunk_bytes
        t0 = self.link_rates("gpu", chunk_bytes).h2d_t0_s if self.bundle is not None else 0.0
        return 2 * copy_bytes / self.hbm + t0 + self.gather_walk_s(slots, chunk_bytes, programs, in_flight)

    def slot_gather_rates(self, chunk_bytes: int) -> LinkRates:
        """The link's rates for the engine's urgent slot gather, as ShadowKV runs it in place: the rate the
        link bench measured for that launch on the bundle's GPU (sim/linkrates.py; the bench ran on PCIe 5,
        another link scales by its catalog rate), else the bundle's own gather rate (the note says which)."""
        key = ("slot", chunk_bytes)
        if key not in self._cache:
            from ddbench.sim.linkrates import slot_gather_gbps
            base = self.link_rates("gpu", chunk_bytes)
            got = slot_gather_gbps(self.bundle.gpu, chunk_bytes) if self.bundle is not None else None
            if got:
                rate = self._bench_gbps(got[0])
                self._note(f"ShadowKV's in-place slot gather at {rate:.1f} GB/s: {got[1]} `bench link` rows at 64"
                           f" programs, {chunk_bytes} B pieces (traces/link/{self.bundle.gpu})")
                base = replace(base, h2d_gbps=rate)
            else:
                self._note(f"ShadowKV's in-place slot gather at the bundle's gather rate for {chunk_bytes} B pieces"
                           " (no `bench link` rows at 64 programs)")
            self._cache[key] = base
        return self._cache[key]

    def _bench_gbps(self, gbps: float) -> float:
        """A `bench link` rate (measured on PCIe 5) on this cost model's link, scaled by its catalog rate."""
        return gbps * self.link.achievable_gbps / get_link("pcie5").achievable_gbps

    def fp8_gather_rates(self, chunk_bytes: int) -> LinkRates | None:
        """The bundle's GPU gather terms with the rate the link bench measured for the engine's fp8 launch
        (sim/linkrates.fp8_gather_gbps; the bench ran on PCIe 5, another link scales by its catalog rate);
        None where the bench has no fp8 rows of that piece size."""
        key = ("fp8", chunk_bytes)
        if key not in self._cache:
            from ddbench.sim.linkrates import ENGINE_FP8_IN_FLIGHT, fp8_gather_gbps
            got = fp8_gather_gbps(self.bundle.gpu, chunk_bytes)
            if got is None:
                self._cache[key] = None
            else:
                rate = self._bench_gbps(got[0])
                self._note(f"fp8 pieces of {chunk_bytes} B gathered at {rate:.1f} GB/s: {got[1]} `bench link` rows at"
                           f" {ENGINE_FP8_IN_FLIGHT} pieces in flight, the engine's fp8 launch (traces/link/{self.bundle.gpu})")
                self._cache[key] = replace(self._measured_rates("gpu", chunk_bytes), h2d_gbps=rate)
        return self._cache[key]

    def link_rates(self, gather: str, chunk_bytes: int, fp8: bool = False) -> LinkRates:
        """The link's rates for pieces of `chunk_bytes`, interpolated between the bundle's measured piece
        sizes. fp8: fp8 pieces, with a DDBenchError for a piece smaller than
        the bundle's smallest measured one (the gather's fixed cost and rate fall with its piece size; below
        the measurements they are not known); the engine's GPU gathers launch them with more pieces in
        flight than the bundle's gather, so their rate is the link bench's at that launch where it has the
        piece size (fp8_gather_rates)."""
        if fp8 and self.bundle is not None:
            self._check_measured(gather, chunk_bytes)
        if fp8 and gather == "gpu" and self.bundle is not None:
            got = self.fp8_gather_rates(chunk_bytes)
            if got is not None:
                return got
        key = ("link", gather, chunk_bytes)
        if key not in self._cache:
            self._cache[key] = (self._catalog_rates(gather, chunk_bytes) if self.bundle is None
                                else self._measured_rates(gather, chunk_bytes))
        return self._cache[key]

    def _check_measured(self, gather: str, chunk_bytes: int) -> None:
        method = "uva_gather" if gather == "gpu" else "cpu_gather"
        sizes = [r["chunk_bytes"] for r in self.bundle.rows["link"] if r["method"] == method
                 and r["direction"] == "h2d" and r["chunk_bytes"]]
        if sizes and chunk_bytes < min(sizes):
            raise DDBenchError(f"no measured {method} rate for {chunk_bytes} B pieces (the bundle's smallest is"
                               f" {min(sizes)} B): measure them (`ddbench calibrate`) before pricing them")

    def _catalog_rates(self, gather: str, chunk_bytes: int) -> LinkRates:
        """No bundle: the catalog's achievable rate, no fixed costs."""
        link = self.link
        if gather != "gpu":
            self._note("ROOFLINE: CPU gather stage assumed as fast as the link (no bundle)")
        return LinkRates(link.achievable_gbps, 0.0, link.achievable_gbps, 0.0,
                         link.bidir_total_gbps / (2 * link.achievable_gbps), 1.0, 1.0,
                         0.0 if gather == "gpu" else link.achievable_gbps, chunk_bytes,
                         "uva_gather" if gather == "gpu" else "cpu_gather")

    def _link_pick(self, method: str, direction: str, **kw) -> list:
        return [r for r in self.bundle.rows["link"] if r["method"] == method and r["direction"] == direction
                and all(r[k] == v for k, v in kw.items())]

    def _interference(self, bg, blocks, ug, col):
        """The median of the bundle's interference rows of one (background, urgent) pair, or None."""
        vals = sorted(r[col] for r in self.bundle.rows["interference"] if r["background"] == bg
                      and r["background_blocks"] == blocks and r["urgent"] == ug
                      and (col.startswith("gemm") or r["urgent_stream"] == "high"))
        return vals[len(vals) // 2] if vals else None

    def _copy_engine_terms(self) -> dict:
        """The copy engine's fixed costs and rates (its three largest transfers per direction), the
        bidirectional share, and the scale of another link over the bundle's big-copy rate."""
        link = self.link
        ce = sorted(self._link_pick("copy_engine", "h2d"), key=lambda r: r["transfer_bytes"])
        big_gbps = ce[-1]["gbps"]
        t0_ce, s_ce = fit_affine([(r["transfer_bytes"], r["latency_ms"] / 1e3) for r in ce[-3:]])
        d2h = sorted(self._link_pick("copy_engine", "d2h"), key=lambda r: r["transfer_bytes"])
        t0_d2h, s_d2h = fit_affine([(r["transfer_bytes"], r["latency_ms"] / 1e3) for r in d2h[-3:]])
        bid = sorted(self._link_pick("copy_engine", "bidir"), key=lambda r: r["transfer_bytes"])
        bidir = bid[-1]["gbps"] / (2 * big_gbps) if bid else link.bidir_total_gbps / (2 * link.achievable_gbps)
        scale = 1.0
        if link.name != "pcie5" or self.bundle.provenance.get("pcie", "5").split(",")[0].strip() != "5":
            scale = link.achievable_gbps / big_gbps
            self._note(f"SCALED link: {link.name} rates = bundle rates x {scale:.3f}"
                       f" (catalog achievable {link.achievable_gbps} GB/s / measured {big_gbps:.1f} GB/s)")
        return {"t0_ce": t0_ce, "s_ce": s_ce, "t0_d2h": t0_d2h, "s_d2h": s_d2h, "bidir": bidir, "scale": scale}

    def _measured_rates(self, gather: str, chunk_bytes: int) -> LinkRates:
        ce = self._copy_engine_terms()
        if gather == "gpu":
            return self._gpu_gather_rates(chunk_bytes, ce)
        return self._cpu_gather_rates(chunk_bytes, ce)

    def _gpu_gather_rates(self, chunk_bytes: int, ce: dict) -> LinkRates:
        """The 32-block UVA gather: its fixed cost from a piece size measured at two transfer sizes, its
        rate interpolated in log2(piece), the urgent and compute slowdowns beside a background gather."""
        g = self._link_pick("uva_gather", "h2d", blocks=32)
        xs = sorted({r["chunk_bytes"] for r in g})
        t0 = 0.0
        for c in xs:
            pts = [(r["transfer_bytes"], r["latency_ms"] / 1e3) for r in g if r["chunk_bytes"] == c]
            if len(pts) >= 2:
                t0 = fit_affine(pts)[0]
        rates = []
        for c in xs:
            r = max((r for r in g if r["chunk_bytes"] == c), key=lambda r: r["transfer_bytes"])
            rates.append(r["transfer_bytes"] / (r["latency_ms"] / 1e3 - t0) / 1e9)
        h2d = interp_clamped([math.log2(c) for c in xs], rates, math.log2(chunk_bytes)) * ce["scale"]
        us = self._interference("uva_gather", 32, "uva_gather", "urgent_slowdown")
        gs_bg = self._interference("uva_gather", 32, "uva_gather", "gemm_ms")
        gs_ce = self._interference("copy_engine", 0, "uva_gather", "gemm_ms")
        comp = max(1.0, gs_bg / gs_ce) if gs_bg and gs_ce else 1.0
        return LinkRates(h2d, t0, 1 / ce["s_d2h"] / 1e9 * ce["scale"], ce["t0_d2h"], ce["bidir"],
                         max(1.0, us or 1.0), comp, 0.0, chunk_bytes, "uva_gather", self._compute_slowdowns(comp))

    def _compute_slowdowns(self, comp: float) -> tuple:
        """(family, ((size, slowdown), ...) by size) beside the engine's 32-program prefetch gather, from the
        bundle's compute_interference rows (each slowdown at least 1: a kernel beside a gather is not
        faster); () with a note where it has none."""
        rows = [r for r in self.bundle.rows.get("compute_interference", []) if r["gather_programs"] == 32]
        out = []
        for f in sorted({r["family"] for r in rows}):
            by = {}
            for r in rows:
                if r["family"] == f:
                    by.setdefault(float(r["size"]), []).append(r["slowdown"])
            out.append((f, tuple((x, max(1.0, sorted(v)[len(v) // 2])) for x, v in sorted(by.items()))))
        if not out:
            self._note(f"compute beside a GPU gather: the bundle has no compute_interference rows; every kind of"
                       f" kernel slowed by the GEMM factor {comp:.3f}")
        return tuple(out)

    def _cpu_gather_rates(self, chunk_bytes: int, ce: dict) -> LinkRates:
        """The CPU-gather ablation: the host's index_select stage (the measured time less the copy's),
        then the copy engine."""
        g = self._link_pick("cpu_gather", "h2d")
        xs = sorted({r["chunk_bytes"] for r in g})
        cpu_rates = []
        for c in xs:
            r = max((r for r in g if r["chunk_bytes"] == c), key=lambda r: r["transfer_bytes"])
            t_cpu = r["latency_ms"] / 1e3 - (ce["t0_ce"] + ce["s_ce"] * r["transfer_bytes"])
            cpu_rates.append(r["transfer_bytes"] / max(t_cpu, 1e-9) / 1e9)
        cpu = interp_clamped([math.log2(c) for c in xs], cpu_rates, math.log2(chunk_bytes))
        us = self._interference("copy_engine", 0, "copy_engine", "urgent_slowdown")
        self._note("host CPU gather rate is this host's measurement (not scaled)")
        return LinkRates(1 / ce["s_ce"] / 1e9 * ce["scale"], ce["t0_ce"], 1 / ce["s_d2h"] / 1e9 * ce["scale"],
                         ce["t0_d2h"], ce["bidir"], max(1.0, us or 1.0), 1.0, cpu, chunk_bytes, "cpu_gather")
