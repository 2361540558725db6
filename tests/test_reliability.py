"""Real ranks failing on purpose: deaths, exceptions, hangs, NaNs, interrupted and failed checkpoint
writes, resume on 2 ranks, and elastic training that loses a rank.

Faults are injected with ``HVD_NGP_FAULTS`` (see ``hvd_ngp.testing.faults``) or by killing a rank's
process from the test. Every job gets a unique output folder on its command line (the marker) so
the test finds exactly its own rank processes, never another job's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY_ARGS, horovodrun, run_ranks

from hvd_ngp.state.checkpoint import read_snapshot

pytestmark = pytest.mark.parallel

#: HVD_NGP_TEST_DEVICE=cuda runs these checks on GPUs (NCCL) instead of CPUs
DEVICE = os.environ.get("HVD_NGP_TEST_DEVICE", "cpu")
LAUNCHERS = ("horovodrun-gloo", "horovodrun-mpi", "mpirun")


def launch_cmd(launcher: str, module_args: list[str], np: int = 2) -> list[str]:
    if launcher == "mpirun":
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            pytest.skip("mpirun not installed")
        return [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(np), sys.executable, *module_args]
    controller = launcher.split("-")[1]
    return [horovodrun(), "-np", str(np), "-H", f"localhost:{np}", f"--{controller}", sys.executable, *module_args]


def trainer(scene_cache: Path, out_dir: Path, *extra: str) -> list[str]:
    return [
        "-m",
        "hvd_ngp.train",
        *TINY_ARGS,
        "--scene_cache",
        str(scene_cache),
        "--device",
        DEVICE,
        "--out_dir",
        str(out_dir),
        *extra,
    ]


class Job:
    """A launcher process; its merged stdout/stderr is collected by a thread so a test can wait for lines."""

    def __init__(self, cmd: list[str], env: dict | None = None, own_group: bool = False) -> None:
        """``own_group``: the launcher leads a new process group, as a terminal's job does (for a Ctrl-C)."""
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            process_group=0 if own_group else None,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output:
                return True
            if self.proc.poll() is not None:
                self._reader.join(5)
                return text in self.output
            time.sleep(0.2)
        return False

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._reader.join(10)
        return rc


def rank_pids(marker: str) -> dict[int, int]:
    """rank -> pid of the Python rank processes whose command line holds ``marker``."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if not any(marker.encode() in part for part in cmd) or b"hvd_ngp.train" not in cmd:
                continue
            env = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        rank = env.get(b"HOROVOD_RANK", env.get(b"OMPI_COMM_WORLD_RANK"))
        if rank is not None and b"python" in Path(f"/proc/{pid}/exe").resolve().name.encode():
            found[int(rank)] = int(pid)
    return found


def kill_job(job: Job, marker: str) -> None:
    """What a scheduler does: SIGKILL every rank and the launcher."""
    for pid in rank_pids(marker).values():
        with contextlib.suppress(ProcessLookupError):  # a rank that ended between the listing and the kill
            os.kill(pid, signal.SIGKILL)
    job.proc.kill()
    job.wait(30)


def assert_all_ranks_gone(marker: str) -> None:
    deadline = time.monotonic() + 10
    while rank_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not rank_pids(marker), f"rank processes still alive: {rank_pids(marker)}"


# ------------------------------------------------------------------------------------ deaths and hangs


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_killing_rank_1_mid_run_ends_every_rank_within_60_s(launcher, scene_cache, tmp_path):
    out = tmp_path / "out"
    job = Job(launch_cmd(launcher, trainer(scene_cache, out, "--n_steps", "100000", "--log_every", "10")))
    try:
        assert job.wait_for("[step 20]", 240), job.output[-3000:]
        pids = rank_pids(str(out))
        assert set(pids) == {0, 1}, pids
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        rc = job.wait(120)
        elapsed = time.monotonic() - killed
    finally:
        kill_job(job, str(out))
    assert rc != 0, job.output[-3000:]
    assert elapsed < 60, f"took {elapsed:.0f} s"
    assert_all_ranks_gone(str(out))
    # the launcher names the rank that died
    assert re.search(r"Process (name: )?1\b|process rank 1 ", job.output), job.output[-3000:]


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_an_exception_on_one_rank_ends_every_rank_and_names_it(controller, scene_cache, tmp_path):
    out = tmp_path / "out"
    start = time.monotonic()
    job = Job(
        launch_cmd(f"horovodrun-{controller}", trainer(scene_cache, out, "--n_steps", "100000", "--log_every", "10")),
        env={"HVD_NGP_FAULTS": "raise@1:15"},
    )
    try:
        rc = job.wait(240)
    finally:
        kill_job(job, str(out))
    assert rc != 0
    assert time.monotonic() - start < 240
    assert (
        "[rank 1] hvd_ngp: fatal: unexpected RuntimeError (a bug, or a failure of the machine): injected failure "
        "on rank 1 at step 15" in job.output
    ), job.output[-3000:]
    assert_all_ranks_gone(str(out))


def test_a_hung_rank_is_ended_by_the_watchdog(scene_cache, tmp_path):
    """Rank 1 stops making progress (alive, in no collective): rank 0's watchdog ends the job."""
    out = tmp_path / "out"
    job = Job(
        launch_cmd(
            "horovodrun-mpi",
            trainer(scene_cache, out, "--n_steps", "100000", "--log_every", "10", "--watchdog_s", "10"),
        ),
        env={"HVD_NGP_FAULTS": "hang@1:15"},
    )
    try:
        assert job.wait_for("fault: hang at step 15", 240), job.output[-3000:]
        hung = time.monotonic()
        rc = job.wait(120)
        elapsed = time.monotonic() - hung
    finally:
        kill_job(job, str(out))
    assert rc != 0 and elapsed < 60, (rc, elapsed, job.output[-3000:])
    assert "[rank 0] hvd_ngp: error: no training step finished for 10 s (last finished: step 14)" in job.output
    assert_all_ranks_gone(str(out))


# ------------------------------------------------------------------------------------ NaN / Inf


def test_a_nan_on_one_rank_is_skipped_on_every_rank(scene_cache, tmp_path):
    proc = run_ranks(
        ["tests/parallel/check_nonfinite.py", str(scene_cache), str(tmp_path / "out"), "5", "--device", DEVICE],
        controller="gloo",
        env={"HVD_NGP_FAULTS": "nan_loss@1:5"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "CHECK nonfinite_skipped OK" in out, out[-4000:]
    assert "[step 5] warning: non-finite loss on at least one rank: step skipped on every rank (1 in a row" in out


def test_repeated_nans_stop_the_run_on_every_rank(scene_cache, tmp_path):
    proc = run_ranks(
        trainer(scene_cache, tmp_path / "out", "--n_steps", "40", "--nonfinite_limit", "3"),
        controller="mpi",
        env={"HVD_NGP_FAULTS": "nan_loss@0:6-40"},
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    for rank in (0, 1):
        assert (
            f"[rank {rank}] hvd_ngp: error: non-finite loss or gradients in 3 consecutive steps (6-8); stopping"
        ) in out, out[-3000:]
    assert "Traceback" not in out


# ------------------------------------------------------------------------------------ checkpoints on 2 ranks


def max_difference(path_a: Path, path_b: Path) -> float:
    a, b = read_snapshot(path_a)["model"], read_snapshot(path_b)["model"]
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.skipif(
    DEVICE == "cpu",
    reason="on CPU ranks test_preempt's stop-and-resume test checks the same, bitwise (and test_checkpoint a "
    "periodic checkpoint's resume on one rank)",
)
def test_resume_on_two_ranks_continues_the_same_trajectory(scene_cache, tmp_path):
    """On GPUs (HVD_NGP_TEST_DEVICE=cuda): 2N steps straight and N steps + resume N steps from the periodic
    checkpoint, including each rank's own streams, end within 10x the spread of two straight runs (atomics make
    two straight runs differ)."""
    common = ["--log_every", "6", "--save_renders", "0", "--n_eval_views", "1", "--ckpt_every", "12"]
    straight = [
        trainer(
            scene_cache,
            tmp_path / f"a{i}",
            *common,
            "--n_steps",
            "24",
            "--save_snapshot",
            str(tmp_path / f"straight{i}.pt"),
        )
        for i in range(2)
    ]
    runs = [
        *straight,
        trainer(scene_cache, tmp_path / "b", *common, "--n_steps", "12"),
        trainer(
            scene_cache,
            tmp_path / "b",
            *common,
            "--n_steps",
            "24",
            "--resume",
            "auto",
            "--save_snapshot",
            str(tmp_path / "resumed.pt"),
        ),
    ]
    for args in runs:
        proc = run_ranks(args, controller="mpi", timeout=240)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "resumed from" in proc.stderr + proc.stdout and "ckpt-00000012.pt at step 12" in proc.stderr + proc.stdout
    assert read_snapshot(tmp_path / "resumed.pt")["rank_streams"].shape[0] == 2
    spread = max_difference(tmp_path / "straight0.pt", tmp_path / "straight1.pt")
    off = max_difference(tmp_path / "straight0.pt", tmp_path / "resumed.pt")
    print(f"GPU resume: max parameter difference {off:.3g}, two straight runs differ by {spread:.3g}")
    assert off <= max(10 * spread, 1e-6), (off, spread)


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one(scene_cache, tmp_path):
    out = tmp_path / "out"
    args = trainer(scene_cache, out, "--n_steps", "20", "--log_every", "5", "--ckpt_every", "5")
    job = Job(launch_cmd("horovodrun-gloo", args), env={"HVD_NGP_FAULTS": "save_pause@0:2"})
    try:
        assert job.wait_for("fault: paused writing", 240), job.output[-3000:]
    finally:
        kill_job(job, str(out))
    ckpts = out / "checkpoints"
    partial = list(ckpts.glob(".ckpt-00000010.pt.*.tmp"))
    assert len(partial) == 1 and partial[0].stat().st_size > 0  # the kill landed mid-write
    assert sorted(p.name for p in ckpts.glob("ckpt-*")) == ["ckpt-00000005.pt"]
    assert read_snapshot(ckpts / "ckpt-00000005.pt")["step"] == 5
    proc = run_ranks([*args, "--resume", "auto"], controller="gloo", timeout=240)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "ckpt-00000005.pt at step 5" in text
    assert not list(ckpts.glob(".*.tmp"))  # the next save swept the partial file away
    assert json.loads((out / "metrics.json").read_text())["steps"] == 20


def test_disk_full_while_writing_a_checkpoint_stops_every_rank_and_keeps_the_previous(scene_cache, tmp_path):
    out = tmp_path / "out"
    proc = run_ranks(
        trainer(scene_cache, out, "--n_steps", "20", "--log_every", "5", "--ckpt_every", "5"),
        controller="mpi",
        env={"HVD_NGP_FAULTS": "save_enospc@0:2"},
        timeout=240,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    for rank in (0, 1):
        assert re.search(
            rf"\[rank {rank}\] hvd_ngp: error: writing a checkpoint failed on rank 0: \S*ckpt-00000010\.pt: "
            r"writing failed \(No space left on device\); any previous file there is unchanged",
            text,
        ), text[-3000:]
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["ckpt-00000005.pt"]
    assert read_snapshot(ckpts / "ckpt-00000005.pt")["step"] == 5
    assert "Traceback" not in text


# ------------------------------------------------------------------------------------ elastic


def test_elastic_training_survives_losing_a_rank(scene_cache, tmp_path):
    """Start on 2 ranks; the discovery script drops to 1 slot mid-run; training finishes on 1 rank. From step 31
    every step sleeps about 10 ms (a ``slow`` fault on both ranks): on a loaded machine the 2-rank steps after
    the drop must outlast Horovod's discovery (about a second), or the run ends before the world changes."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    out = tmp_path / "out"
    cmd = [
        horovodrun(),
        "-np",
        "2",
        "--min-np",
        "1",
        "--max-np",
        "2",
        "--host-discovery-script",
        str(discover),
        "--network-interface",
        "lo",
        sys.executable,
        *trainer(
            scene_cache,
            out,
            "--n_steps",
            "400",
            "--log_every",
            "10",
            "--commit_every",
            "10",
            "--metrics_json",
            str(tmp_path / "m.json"),
        ),
    ]
    job = Job(cmd, env={"HVD_NGP_FAULTS": "slow@0:31-400,slow@1:31-400"})
    try:
        assert job.wait_for("[step 30]", 240), job.output[-3000:]
        hosts.write_text("localhost:1\n")
        rc = job.wait(400)
    finally:
        kill_job(job, str(out))
    text = job.output
    assert rc == 0, text[-12000:]
    assert "elastic: the world changed from 2 to 1 rank(s)" in text, text[-4000:]
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["world_size"] == 1 and metrics["steps"] == 400, metrics
    assert re.search(r"elastic: step \d+ on 1 rank\(s\)", text)
