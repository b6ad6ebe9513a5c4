"""The multi-GPU host bench (kernels/hostbench.py) and the topology it records (ddbench/core/hosttopo.py):
parsing on fixtures here, the harness itself on a GPU (one GPU is enough to run it)."""

import csv
import json
import subprocess
import sys

import pytest

from ddbench.core.errors import DDBenchError
from ddbench.core.hosttopo import numa_of, parse_cpulist, parse_topo, sysfs_name
from ddbench.kernels.hostbench import check_counts, summarise

TOPO = ("\t\x1b[4mGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \tNV18\tPXB\t0-47,96-143\t0\t\tN/A\n"
        "GPU1\tNV18\t X \tSYS\t48-95,144-191\t1\t\tN/A\n"
        "NIC0\tPXB\tSYS\t X \t\t\t\t\n\n"
        "Legend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect\n")


def test_topology_parsing(tmp_path):
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert sysfs_name("00000000:19:00.0") == "0000:19:00.0" and sysfs_name("0000:1A:00.0") == "0000:1a:00.0"
    dev = tmp_path / "0000:19:00.0"
    dev.mkdir()
    (dev / "numa_node").write_text("1\n")
    (dev / "local_cpulist").write_text("48-50\n")
    assert numa_of("00000000:19:00.0", str(tmp_path)) == (1, [48, 49, 50])
    (dev / "numa_node").write_text("-1\n")
    assert numa_of("00000000:19:00.0", str(tmp_path))[0] is None
    assert numa_of("00000000:99:00.0", str(tmp_path)) == (None, [])
    m = parse_topo(TOPO)
    assert set(m) == {"GPU0", "GPU1", "NIC0"}
    assert m["GPU0"]["GPU1"] == "NV18" and m["GPU1"]["NUMA Affinity"] == "1" and m["GPU0"]["NIC0"] == "PXB"
    assert parse_topo("no GPUs here") == {}


def test_counts_and_summary():
    assert check_counts("4,1,2,2", 8) == [1, 2, 4]
    for bad, why in (("0", "at least 1"), ("1,x", "comma list"), ("16", "only 8 GPU")):
        with pytest.raises(DDBenchError, match=why):
            check_counts(bad, 8)
    rows = [dict(gpus_fetching=2, gpu_index=g, test="copy", gbps=v, tokens_per_s=None) for g, v in ((0, 50.0), (1, 40.0))]
    s = summarise(rows, 2, "copy")
    assert s == {"gpus": 2, "per_gpu_gbps": 45.0, "total_gbps": 90.0, "min_gpu_gbps": 40.0}
    assert summarise(rows, 4, "copy")["gpus"] == 0


def test_cli_without_gpu_is_one_line(tmp_path):
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    r = subprocess.run([sys.executable, "-m", "ddbench.kernels.hostbench", "--out", str(tmp_path / "h")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and not (tmp_path / "h").exists()


@pytest.mark.gpu
def test_harness_runs_on_one_gpu(tmp_path):
    out = tmp_path / "host"
    r = subprocess.run([sys.executable, "-m", "ddbench.kernels.hostbench", "--gpus", "1", "--seconds", "0.5", "--out",
                        str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(out / "host.csv")))
    assert [x["test"] for x in rows] == ["copy", "gather4k", "gather2k"]
    for x in rows:
        assert 5.0 < float(x["gbps"]) < 80.0 and int(x["calls"]) >= 4      # a PCIe 4/5 link, really moved
    topo = json.load(open(out / "topology.json"))
    assert topo["topology"]["gpus"] and topo["summary"]["1 copy"]["gpus"] == 1
