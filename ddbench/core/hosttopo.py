"""A host's GPU topology, read where the machine allows: which NUMA node and CPUs sit next to each GPU
(/sys), and how the GPUs connect (`nvidia-smi topo -m`). Torch-free, so that the parsing is tested
anywhere; kernels/hostbench.py records it beside its measurements.

    gpus = gpu_pci_ids()                 # ['00000000:19:00.0', ...] in nvidia-smi's index order
    node, cpus = numa_of(pci_id)         # (0, [0, 1, ...]) or (None, []) where /sys does not say
    matrix = parse_topo(text)            # {'GPU0': {'GPU1': 'NV18', 'NUMA Affinity': '0', ...}, ...}
"""

from __future__ import annotations

import os
import re

from ddbench.core.provenance import command_output

SYS_PCI = "/sys/bus/pci/devices"


def gpu_pci_ids() -> list[str]:
    """nvidia-smi's PCI bus id of every GPU, by index; [] where nvidia-smi is missing."""
    out = command_output(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"], 30)
    ids = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            ids[int(parts[0])] = parts[1]
    return [ids[i] for i in sorted(ids)]


def sysfs_name(pci_id: str) -> str:
    """nvidia-smi's '00000000:19:00.0' as /sys names it: '0000:19:00.0' (lower case, 4-digit domain)."""
    dom, _, rest = pci_id.strip().lower().partition(":")
    return f"{dom[-4:]:0>4}:{rest}"


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def numa_of(pci_id: str, root: str = SYS_PCI) -> tuple[int | None, list[int]]:
    """(NUMA node, its local CPUs) of a PCI device; (None, []) where /sys gives no node (-1) or no file."""
    base = os.path.join(root, sysfs_name(pci_id))
    try:
        with open(os.path.join(base, "numa_node"), encoding="ascii") as fh:
            node = int(fh.read().strip())
        with open(os.path.join(base, "local_cpulist"), encoding="ascii") as fh:
            cpus = parse_cpulist(fh.read())
    except (OSError, ValueError):
        return None, []
    return (node if node >= 0 else None), cpus


def parse_topo(text: str) -> dict:
    """`nvidia-smi topo -m`'s matrix: {row device: {column: entry}}; the legend and blank lines are left out."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)              # nvidia-smi underlines its header on a terminal
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    head = next((ln for ln in lines if ln.lstrip().startswith("GPU0")), None)
    if head is None:
        return {}
    cols = [c.strip() for c in head.split("\t") if c.strip()]
    out = {}
    for ln in lines[lines.index(head) + 1:]:
        cells = [c.strip() for c in ln.split("\t")]
        cells = [c for c in cells if c] if len(cells) < len(cols) + 1 else cells
        if not cells or not (cells[0].startswith("GPU") or cells[0].startswith("NIC")):
            break
        out[cells[0]] = dict(zip(cols, cells[1:1 + len(cols)]))
    return out


def topology() -> dict:
    """What this host says about its GPUs: per GPU its PCI id, NUMA node and local CPUs, and the raw and
    parsed `nvidia-smi topo -m`."""
    raw = command_output(["nvidia-smi", "topo", "-m"], 30)
    gpus = []
    for i, pci in enumerate(gpu_pci_ids()):
        node, cpus = numa_of(pci)
        gpus.append({"index": i, "pci_bus_id": pci, "numa_node": node, "local_cpus": len(cpus)})
    return {"gpus": gpus, "topo_matrix": parse_topo(raw), "topo_text": raw, "cpus": os.cpu_count()}
