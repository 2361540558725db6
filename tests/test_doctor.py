"""The environment doctor's logic in one process: comparison, table, overrides, topology planning.
Real ranks (horovodrun, mpirun MPMD with an injected mismatch): test_observability.py."""

from __future__ import annotations

import configparser
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from hvd_ngp.errors import ConfigError
from hvd_ngp.observe.doctor import (
    FIELDS,
    OVERRIDE_VAR,
    apply_test_override,
    compare,
    groups,
    plan_topology_dump,
    rank_ranges,
    render_table,
)

LAUNCHER_VARS = (
    "HOROVOD_RANK",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMIX_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "NCCL_TOPO_DUMP_FILE",
    "NCCL_TOPO_DUMP_FILE_RANK",
    "HOROVOD_HIERARCHICAL_ALLREDUCE",
)


def record(rank: int, host: str = "node1", **kw) -> dict:
    rec = {key: f"{key}-v1" for key, _, _ in FIELDS}
    rec.update(
        rank=rank,
        host=host,
        device=f"cuda:{rank % 2}",
        env={"NCCL_IB_DISABLE": "0", "HOROVOD_RANK": str(rank)},
        overridden=[],
    )
    rec.update(kw)
    return rec


def test_rank_ranges_and_groups():
    assert rank_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert groups(["a", "b", "b", "a", "c"]) == [("a", [0, 3]), ("b", [1, 2]), ("c", [4])]  # tie: rank 0's side


def test_a_package_mismatch_is_an_error_naming_the_rank_and_the_package():
    records = [record(0), record(1), record(2, host="node2", torch="2.0.0")]
    (finding,) = compare(records)
    assert (finding.severity, finding.what, finding.rank, finding.host) == ("error", "torch", 2, "node2")
    assert finding.message == "torch: rank 2 (node2) has '2.0.0', but rank(s) 0-1 have 'torch-v1'"


def test_hardware_and_variable_differences_are_warnings_unless_strict():
    records = [record(0), record(1, gpu="NVIDIA A100"), record(2)]
    records[2]["env"]["NCCL_IB_DISABLE"] = "1"
    found = compare(records)
    assert sorted((f.severity, f.what, f.rank) for f in found) == [
        ("warning", "GPU", 1),
        ("warning", "NCCL_IB_DISABLE", 2),
    ]
    assert {f.severity for f in compare(records, strict=True)} == {"error"}
    # per-rank variables (HOROVOD_RANK differs everywhere) are neither compared nor shown
    assert "HOROVOD_RANK" not in render_table(records, found)


def test_a_value_that_could_not_be_determined_is_an_error():
    (finding,) = compare([record(0), record(1, mpi="error: TimeoutExpired: mpirun")])
    assert finding.rank == 1 and "could not be determined on rank 1" in finding.message


def test_table_marks_the_odd_ones_out():
    records = [record(0), record(1), record(2, horovod="0.27.0")]
    text = render_table(records, compare(records))
    (marked,) = [line for line in text.splitlines() if line.startswith("!!")]
    assert "0.27.0" in marked and marked.rstrip().endswith("2  <- MISMATCH")
    assert any(line.split()[:3] == ["horovod", "horovod-v1", "0-1"] for line in text.splitlines()), text
    assert any(line.split()[:3] == ["host", "node1", "all"] for line in text.splitlines()), text


def test_test_override_replaces_values_and_rejects_unknown_keys():
    rec = apply_test_override(record(0), "horovod=0.27.0, torch=2.0")
    assert (rec["horovod"], rec["torch"], rec["overridden"]) == ("0.27.0", "2.0", ["horovod", "torch"])
    with pytest.raises(ConfigError, match=OVERRIDE_VAR):
        apply_test_override(record(0), "hvd=1")


@pytest.fixture
def launcher_env(monkeypatch):
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)

    def set_env(**values):
        for k, v in values.items():
            monkeypatch.setenv(k, str(v))

    return set_env


def test_topology_on_cpu_or_one_rank_explains_that_there_is_nothing_to_dump(launcher_env, tmp_path):
    plan = plan_topology_dump(str(tmp_path / "t.xml"), use_cuda=False)
    assert plan.path == "" and "no GPU" in plan.reason and "NCCL_TOPO_DUMP_FILE" not in os.environ
    plan = plan_topology_dump(str(tmp_path / "t.xml"), use_cuda=True)
    assert plan.path == "" and "2 or more ranks" in plan.reason


def test_topology_dump_is_requested_from_each_nodes_local_rank_zero(launcher_env, tmp_path):
    import socket

    host = socket.gethostname()
    stale = tmp_path / f"topo.{host}.xml"
    stale.write_text("old")
    # second node of a 2 x 4 job, its local rank 0 (global rank 4): the host name goes into the file name
    launcher_env(
        OMPI_COMM_WORLD_RANK=4, OMPI_COMM_WORLD_LOCAL_RANK=0, OMPI_COMM_WORLD_SIZE=8, OMPI_COMM_WORLD_LOCAL_SIZE=4
    )
    plan = plan_topology_dump(str(tmp_path / "topo.xml"), use_cuda=True)
    assert plan.writer and plan.path == str(stale) and not stale.exists()  # a stale file cannot pass for new
    assert os.environ["NCCL_TOPO_DUMP_FILE"] == str(stale) and os.environ["NCCL_TOPO_DUMP_FILE_RANK"] == "4"
    # with hierarchical allreduce NCCL's first communicator is the node-local one, where this process is rank 0
    launcher_env(HOROVOD_HIERARCHICAL_ALLREDUCE=1)
    plan_topology_dump(str(tmp_path / "{host}-topo.xml"), use_cuda=True)
    assert os.environ["NCCL_TOPO_DUMP_FILE"] == str(tmp_path / f"{host}-topo.xml")
    assert os.environ["NCCL_TOPO_DUMP_FILE_RANK"] == "0"


def test_topology_dump_other_local_ranks_take_part_but_do_not_write(launcher_env, tmp_path):
    launcher_env(HOROVOD_RANK=1, HOROVOD_LOCAL_RANK=1, HOROVOD_SIZE=2, HOROVOD_LOCAL_SIZE=2)
    plan = plan_topology_dump(str(tmp_path / "topo.xml"), use_cuda=True)
    assert not plan.writer and plan.path == str(tmp_path / "topo.xml")  # one node: the name is kept
    # NCCL exchanges topology within the node on every rank that has the file variable: all must have it
    assert os.environ["NCCL_TOPO_DUMP_FILE"] == plan.path and os.environ["NCCL_TOPO_DUMP_FILE_RANK"] == "-1"


def test_topology_dump_into_a_missing_folder_is_reported_by_the_writer_without_touching_nccl(launcher_env, tmp_path):
    for local_rank in (1, 0):
        launcher_env(HOROVOD_RANK=local_rank, HOROVOD_LOCAL_RANK=local_rank, HOROVOD_SIZE=2, HOROVOD_LOCAL_SIZE=2)
        plan = plan_topology_dump(str(tmp_path / "missing" / "topo.xml"), use_cuda=True)
        assert "does not exist" in plan.error and plan.writer == (local_rank == 0)
        assert "NCCL_TOPO_DUMP_FILE" not in os.environ  # the same on every rank of the node: NCCL stays consistent


def test_doctor_without_a_launcher_is_a_size_one_check(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    proc = subprocess.run(
        [sys.executable, "-m", "hvd_ngp.observe.doctor", "--json", str(tmp_path / "d.json")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hvd_ngp doctor: 1 rank(s)" in proc.stdout and "hvd_ngp doctor: OK" in proc.stdout
    report = json.loads((tmp_path / "d.json").read_text())
    (rec,) = report["records"]
    assert report["ok"] and rec["python"] == ".".join(map(str, sys.version_info[:3]))
    assert report["checks"][0]["sum_ok"] and report["checks"][0]["max_ok"]


def test_console_script_is_declared_and_resolves():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    scripts = dict(line.split(" = ") for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines())
    module, func = scripts["hvd-ngp-doctor"].split(":")
    assert callable(getattr(importlib.import_module(module), func))
    exe = Path(sys.executable).with_name("hvd-ngp-doctor")
    if exe.exists():  # installed by scripts/setup.sh
        assert subprocess.run([str(exe), "--help"], capture_output=True, timeout=120).returncode == 0
