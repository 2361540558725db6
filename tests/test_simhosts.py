"""Two simulated hosts (network namespaces + ssh shim): launches across them see cross_size() == 2.

Skipped, with the reason, where the machine cannot create network namespaces (not root, no
iproute2/pyroute2, an unprivileged container).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, TINY_ARGS

from hvd_ngp.testing import simhosts

REASON = simhosts.unavailable()
pytestmark = [pytest.mark.parallel, pytest.mark.skipif(bool(REASON), reason=f"simulated hosts: {REASON}")]


def have_pyroute2() -> bool:
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return False
    return True


def launch(cluster: simhosts.SimCluster, launcher_args: list[str], program_args: list[str]) -> str:
    """hvd-ngp-launch on the cluster's login node with its hostfile; returns the output."""
    command = cluster.command_on_login(
        [
            sys.executable,
            "-m",
            "hvd_ngp.tools.launch",
            "--hostfile",
            cluster.hostfile,
            "--iface",
            simhosts.IFACE,
            "--fabric",
            "eth",
            *launcher_args,
            "--",
            *program_args,
        ]
    )
    proc = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "HOROVOD_START_TIMEOUT": "180"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def assert_two_hosts(out: str, controller: str) -> None:
    # token by token (no ".*"): mpirun may glue one rank's line to the next
    probes = re.findall(
        r"PROBE rank (\d)/2 local 0/1 cross_size (\d) host (\S+) controller (\w+) device \S+ "
        r"NCCL_HOSTID=(\S+) CUDA_VISIBLE_DEVICES=\S* allreduce ok",
        out,
    )
    assert len(probes) == 2, out[-3000:]
    assert {p[0] for p in probes} == {"0", "1"} and all(p[1] == "2" for p in probes), probes
    assert {p[2] for p in probes} == {"simhost0", "simhost1"} and all(p[3] == controller for p in probes), probes
    assert all(p[2] == p[4] for p in probes), probes  # each host has its own NCCL host id


@pytest.mark.parametrize(
    "backend,launcher,controller",
    [("ip", "horovodrun", "gloo"), ("ip", "horovodrun", "mpi"), ("pyroute2", "mpirun", "mpi")],
)
def test_ranks_on_two_simulated_hosts(backend, launcher, controller):
    if backend == "pyroute2" and not have_pyroute2():
        pytest.skip("pyroute2 not installed")
    if backend == "ip" and not shutil.which("ip"):
        pytest.skip("iproute2 not installed")
    with simhosts.simulated(2, slots=1, choice=backend) as cluster:
        out = launch(
            cluster,
            ["--launcher", launcher, "--controller", controller, "--module", "hvd_ngp.testing.simhosts"],
            ["probe"],
        )
    assert_two_hosts(out, controller)


def test_training_across_two_simulated_hosts(scene_cache, tmp_path):
    """The trainer itself, hierarchical allreduce decided by the launcher (on: two nodes, MPI, --fabric eth)."""
    with simhosts.simulated(2, slots=1) as cluster:
        out = launch(
            cluster,
            ["--launcher", "mpirun"],
            [
                *TINY_ARGS,
                "--scene_cache",
                str(scene_cache),
                "--out_dir",
                str(tmp_path / "out"),
                "--n_steps",
                "12",
                "--log_every",
                "6",
                "--device",
                "cpu",
            ],
        )
    assert "# hierarchical allreduce: on (auto: 2 nodes, NCCL and MPI both use TCP)" in out
    assert "HOROVOD_HIERARCHICAL_ALLREDUCE=1" in out
    assert "hvd_ngp: 2 rank(s) [mpi]" in out and "host simhost0" in out
    assert "communication: 2 node(s)" in out, out[-3000:]
    assert re.search(r"done: 12 steps in .* test PSNR", out), out[-3000:]
    assert (tmp_path / "out" / "metrics.json").is_file()
