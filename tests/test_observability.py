"""Observability with real ranks: metric reduction, metrics.jsonl of a training run, Horovod's
timeline/autotune/stall check, and the environment doctor (passing, and failing on an injected mismatch)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, TINY_ARGS, run_ranks

from hvd_ngp.observe.monitor import JSONL_FIELDS

pytestmark = pytest.mark.parallel


def mpirun_mpmd(first: list[str], second: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """``mpirun -np 1 FIRST : -np 1 SECOND`` (rank 0 runs FIRST, rank 1 runs SECOND)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not installed")
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "1", *first, ":", "-np", "1", *second]
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_metrics_reduce_across_two_ranks(controller, tmp_path):
    proc = run_ranks(["tests/parallel/check_monitor.py", str(tmp_path)], controller=controller)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "CHECK reduction OK (one collective, min GPU util 80% on rank 1)" in out, out[-4000:]
    assert "CHECK monitor OK: [step 6]" in out and "GPU util 85% (min 80% rank 1)" in out, out[-4000:]
    assert "CHECK comm_share OK" in out, out[-4000:]


def test_training_writes_jsonl_timeline_autotune_log_and_tensorboard(scene_cache, tmp_path):
    out = tmp_path / "out"
    proc = run_ranks(
        [
            "-m",
            "hvd_ngp.train",
            *TINY_ARGS,
            "--scene_cache",
            str(scene_cache),
            "--out_dir",
            str(out),
            "--device",
            "cpu",
            "--n_steps",
            "24",
            "--log_every",
            "8",
            "--timeline_file",
            str(tmp_path / "timeline.json"),
            "--autotune_log",
            str(tmp_path / "autotune.csv"),
            "--tensorboard",
            str(tmp_path / "tb"),
            "--stall_check_s",
            "30",
        ],
        controller="gloo",
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [8, 16, 24]
    for r in records:
        assert list(r) == list(JSONL_FIELDS), sorted(set(r) ^ set(JSONL_FIELDS))
        # the process's first step is set-up (its time and samples are left out of the first interval)
        assert r["world_size"] == 2 and r["interval_steps"] == (7 if r["step"] == 8 else 8) and r["samples_per_s"] > 0
        assert 0 <= r["comm_fraction_min"] <= r["comm_fraction"] <= r["comm_fraction_max"] <= 1
        assert r["comm_fraction_max_rank"] in (0, 1) and r["rank_samples_per_s_min_rank"] in (0, 1)
        assert r["gpu_util"] is None and r["power_w"] is None and r["gpus_measured"] == 0  # CPU run
    assert log.count("| GPU util n/a | GPU mem n/a | comm ") == 3, log[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert [h["seconds"] for h in metrics["history"]] == [round(r["train_s"], 3) for r in records]
    assert 0 < records[0]["train_s"] < records[-1]["train_s"] <= metrics["train_seconds"]
    # Horovod's timeline (rank 0): a Chrome trace with our gradient and metric allreduces in it
    trace = json.loads((tmp_path / "timeline.json").read_text())
    names = {e.get("args", {}).get("name") for e in trace if e.get("ph") == "M"}
    assert "allreduce.encoding.params" in names and "allreduce.monitor.interval" in names, sorted(filter(None, names))
    assert any(e.get("name") == "NEGOTIATE_ALLREDUCE" for e in trace)
    # the autotuner's log: its header is written at start-up (samples follow after its warm-up)
    header = (tmp_path / "autotune.csv").read_text().splitlines()[0]
    assert header.startswith("hierarchical_allreduce,") and header.endswith(",score")
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_stall_check_setting_reaches_horovod(tmp_path):
    """The last rank sleeps before an allreduce; with --stall_check_s 1 Horovod names it as missing.

    MPI controller: Horovod 0.28.1's stall inspector reported nothing under Gloo in the same test,
    with our option or horovodrun's own --stall-check-warning-time-seconds.
    """
    proc = run_ranks(["tests/parallel/check_stall.py", "--stall_check_s", "1"], controller="mpi", timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "were submitted to be reduced, gathered or broadcasted by subset of ranks" in out, out[-4000:]
    assert "waiting for remainder of ranks for more than 1 seconds" in out, out[-4000:]
    assert "Missing ranks:" in out and "1: [allreduce.check.stall]" in out, out[-4000:]


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_doctor_passes_on_two_ranks(controller, tmp_path):
    proc = run_ranks(
        [
            "-m",
            "hvd_ngp.observe.doctor",
            "--bandwidth-mib",
            "2",
            "--iterations",
            "3",
            "--dump-topology",
            str(tmp_path / "topo.xml"),
        ],
        controller=controller,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "hvd_ngp doctor: 2 rank(s) on 1 host(s)" in out and "hvd_ngp doctor: OK" in out, out[-4000:]
    assert f"across 2 rank(s) ({controller}): exact on every rank" in out, out[-4000:]
    assert "bandwidth: 2.0 MiB fp32 in" in out and "busbw" in out, out[-4000:]
    assert "topology: nothing to dump: NCCL only carries GPU tensors" in out, out[-4000:]
    assert "!!" not in out and not (tmp_path / "topo.xml").exists()


def test_doctor_fails_on_a_version_mismatch_naming_the_rank_and_the_package():
    doctor = [sys.executable, "-m", "hvd_ngp.observe.doctor", "--bandwidth-mib", "1", "--iterations", "1"]
    proc = mpirun_mpmd(doctor, ["env", "HVD_NGP_DOCTOR_TEST_OVERRIDE=horovod=0.27.0", *doctor])
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert "hvd_ngp doctor: FAILED (1 problem(s)):" in out, out[-4000:]
    assert "horovod: rank 1 (" in out and "has '0.27.0', but rank(s) 0 have '0.28.1'" in out, out[-4000:]
    assert "<- MISMATCH" in out and "Traceback" not in out


def test_doctor_bad_override_on_one_rank_stops_every_rank():
    doctor = [sys.executable, "-m", "hvd_ngp.observe.doctor", "--bandwidth-mib", "1"]
    proc = mpirun_mpmd(doctor, ["env", "HVD_NGP_DOCTOR_TEST_OVERRIDE=nonsense", *doctor], timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    errors = out.split("hvd_ngp doctor: error:")[1:]
    assert len(errors) == 2 and all("describing the environment failed on rank 1" in e for e in errors), out[-3000:]
    assert "Traceback" not in out
