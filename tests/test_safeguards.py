"""Nothing lost, nothing left running: settings agreed by every rank, one run per output folder, resumes
that check what they resume, cameras and I/O errors named, host memory within the job's cgroup, stops
honoured during evaluation, and ranks that stop when their launcher dies (issue 46).

The real-rank checks share launches: ``tests/parallel/check_safeguards.py`` tries every start-up refusal
in one ``horovodrun -np 2`` (Gloo and MPI). Timing is bounded only by generous timeouts.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from conftest import run_ranks
from test_reliability import Job, assert_all_ranks_gone, kill_job, launch_cmd, rank_pids, trainer

from hvd_ngp.cluster import preempt
from hvd_ngp.cluster.consistency import differences
from hvd_ngp.data.images import read_image
from hvd_ngp.errors import ConfigError, OutputError, SceneError
from hvd_ngp.observe.memory import MemoryBudgetError, cgroup_memory_limit, check_host_fit, host_memory
from hvd_ngp.state.checkpoint import read_snapshot
from hvd_ngp.state.outputs import LOCK_NAME, OutputLock, check_output_files
from hvd_ngp.training.evaluate import write_png

GIB = 1 << 30
OWNER = {"host": "otherhost", "pid": 4242, "started": "2026-12-06 10:00:00 UTC"}
COMMON = ("--log_every", "10", "--save_renders", "0", "--balance", "off")


def hold_lock(folder: Path):
    """The lock of ``folder`` held by this process as a running run would hold it (keep the returned file)."""
    folder.mkdir(parents=True, exist_ok=True)
    f = open(folder / LOCK_NAME, "a+b")
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    f.write(json.dumps(OWNER).encode())
    f.flush()
    return f


# ------------------------------------------------------------------------------------ real ranks


@pytest.mark.parallel
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_bad_starts_are_refused_on_every_rank_before_training(controller, scene_cache, tmp_path):
    """Settings that differ between ranks, a locked output folder, an output name too long, impossible camera
    intrinsics, a plan beyond host memory, a resume of another scene/model: each refused on both ranks."""
    held = hold_lock(tmp_path / "locked")
    try:
        proc = run_ranks(
            ["tests/parallel/check_safeguards.py", str(scene_cache), str(tmp_path / "work"), str(tmp_path / "locked")],
            controller=controller,
            timeout=240,
        )
    finally:
        held.close()
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    for check in (
        "settings_differ",
        "output_folder_locked",
        "output_name_too_long",
        "camera_angle_zero",
        "principal_point_outside",
        "host_memory",
        "resume_mismatch",
        "resume_override",
    ):
        for rank in (0, 1):
            assert f"[rank {rank}] CHECK {check} OK" in text, (check, rank, text[-4000:])
    assert "resumed despite --allow_resume_changes: marching.steps_per_diagonal: 64 in the checkpoint, 32 now" in text
    assert "Traceback" not in text and "Missing ranks" not in text, text[-4000:]
    assert not (tmp_path / "work" / "differ").exists()  # refused before anything was written


@pytest.mark.parallel
def test_a_stop_during_an_evaluation_checkpoints_before_the_launcher_kills(scene_cache, tmp_path):
    """SIGTERM to horovodrun (Gloo) while rank 0 renders a slow evaluation (1 s per chunk, the slow_render fault):
    horovodrun SIGKILLs the ranks 5 s after its SIGTERM, so the evaluation must give way between two chunks:
    every rank stops with a checkpoint of the evaluation's step and exits 75."""
    out = tmp_path / "out"
    job = Job(
        launch_cmd(
            "horovodrun-gloo",
            trainer(scene_cache, out, *COMMON, "--n_steps", "100000", "--eval_every", "20", "--n_eval_views", "0"),
        ),
        env={"HVD_NGP_FAULTS": "slow_render@0:1-1000"},
    )
    try:
        assert job.wait_for("fault: slow render chunk", 240), job.output[-3000:]
        os.kill(job.proc.pid, signal.SIGTERM)
        job.wait(120)
        deadline = time.monotonic() + 60
        while rank_pids(str(out)) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        kill_job(job, str(out))
    text = job.output
    assert "[step 20] stop requested (SIGTERM on rank 0, SIGTERM on rank 1) during an evaluation" in text, text[-3000:]
    marker = json.loads((out / "preempted.json").read_text())
    assert marker["step"] == 20 and read_snapshot(marker["checkpoint"])["step"] == 20, marker
    # horovodrun, signalled itself, may report 137 or 143 for a rank's shell, or no status at all (as in
    # test_preempt): the rank's own stop line says it exited 75
    codes = {int(c) for c in re.findall(r"Process \d exit with status code (\d+)", text)}
    assert codes <= {preempt.EXIT_PREEMPTED, 137, 143}, (codes, text[-3000:])
    assert f"exit status {preempt.EXIT_PREEMPTED}" in text, text[-3000:]
    assert_all_ranks_gone(str(out))


#: what each launcher's death looks like to the ranks (whichever comes first, on the rank that noticed first; the
#: marker names every rank that had noticed by the vote): horovodrun --mpi is /bin/sh running
#: mpirun (the ranks' watch sees that shell go; mpirun lives on); a dead mpirun closes the ranks' output pipes;
#: horovodrun's Gloo driver read them too, and leaves a middleman per rank that SIGTERMs the rank when horovodrun
#: dies (and SIGKILLs it 5 s later)
PIPE_CLOSED = r"the launcher's end of this rank's output pipe closed on rank \d"
LAUNCHER_DEATH = {
    "horovodrun-mpi": r"the launcher sh -c mpirun \(pid \d+\) is gone on rank \d",
    "horovodrun-gloo": rf"SIGTERM on rank \d|the launcher horovodrun \(pid \d+\) is gone on rank \d|"
    rf"{PIPE_CLOSED}",
    "mpirun": rf"the launcher mpirun \(pid \d+\) is gone on rank \d|{PIPE_CLOSED}",
}


@pytest.mark.parallel
@pytest.mark.parametrize("launcher", sorted(LAUNCHER_DEATH))
def test_ranks_stop_with_a_checkpoint_when_the_launcher_is_killed(launcher, scene_cache, tmp_path):
    """kill -9 of the launcher the user started: every rank notices (its launcher watch, its output pipe, or
    horovodrun's middleman), stops with a checkpoint within 30 s and exits instead of training on unwatched."""
    out = tmp_path / "out"
    job = Job(launch_cmd(launcher, trainer(scene_cache, out, *COMMON, "--n_steps", "100000")))
    try:
        assert job.wait_for("[step 20]", 240), job.output[-3000:]
        assert set(rank_pids(str(out))) == {0, 1}
        os.kill(job.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        while rank_pids(str(out)) and time.monotonic() < killed + 90:  # hang guard
            time.sleep(0.2)
        gone_s = time.monotonic() - killed
    finally:
        kill_job(job, str(out))
    print(f"{launcher} killed: every rank gone {gone_s:.1f} s later")
    assert gone_s < 30, (gone_s, job.output[-3000:])
    marker = json.loads((out / "preempted.json").read_text())  # written after the checkpoint
    assert re.search(LAUNCHER_DEATH[launcher], marker["signal"]), marker
    assert read_snapshot(marker["checkpoint"])["step"] == marker["step"] >= 20, marker
    assert_all_ranks_gone(str(out))


# ------------------------------------------------------------------------------------ in one process


def test_horovodruns_shell_is_watched_as_a_launcher():
    """horovodrun --mpi execs /bin/sh -c "mpirun ...": that shell (the pid the user holds) is a launcher of
    the processes below it. Here a shell of the same form runs sleep (``; true``: the shell cannot exec it)."""
    shell = subprocess.Popen(["/bin/sh", "-c", "mpirun --version >/dev/null 2>&1; sleep 30; true"])
    try:
        children, deadline = [], time.monotonic() + 30
        while not children and time.monotonic() < deadline:
            time.sleep(0.05)
            children = Path(f"/proc/{shell.pid}/task/{shell.pid}/children").read_text().split()
            children = [int(c) for c in children if Path(f"/proc/{c}/cmdline").read_bytes().startswith(b"sleep")]
        assert children, "the shell did not start sleep"
        assert (shell.pid, "sh -c mpirun") in [a[:2] for a in preempt.launcher_ancestors(children[0])]
        assert preempt._launcher_name(os.getpid()) is None
    finally:
        shell.kill()
        shell.wait()


def test_a_lost_output_pipe_asks_for_a_stop_instead_of_failing():
    """The launcher that read a rank's output died: the next write neither raises nor is lost silently, the rank
    asks for a stop with a checkpoint."""
    r, w = os.pipe()
    stream = os.fdopen(w, "w", buffering=1)
    signals = preempt.StopSignals(("TERM",), rank=0)  # handlers not installed: only the flag
    watch = preempt.LauncherWatch(0, signals, [])
    guarded = preempt._SurvivingStream(stream, watch.output_gone)
    guarded.write("training\n")
    assert os.read(r, 100) == b"training\n" and not preempt.output_lost(w) and not signals.pending()
    os.close(r)  # the launcher is gone
    assert preempt.output_lost(w)
    guarded.write("[step 20] ...\n")
    guarded.flush()
    assert signals.received == "the launcher's end of this rank's output pipe closed"
    stream.close = lambda: None  # its buffer cannot be flushed anywhere; do not raise at garbage collection


def test_settings_differences_name_each_setting_and_the_ranks():
    same = {"--n_steps": "20", "--seed": "1"}
    assert differences([same, dict(same)]) == []
    found = differences([same, {"--n_steps": "21", "--seed": "1"}, same, {"--seed": "1"}])
    assert found == ["--n_steps: 20 on rank(s) 0,2, 21 on rank(s) 1, <unset> on rank(s) 3"]


def test_output_lock_refuses_a_second_run_and_takes_over_a_stale_one(tmp_path):
    out = tmp_path / "out"
    held = hold_lock(out)
    with pytest.raises(ConfigError, match=r"in use by another run \(host otherhost, pid 4242, started 2026-12-06"):
        OutputLock.acquire(out)
    assert json.loads((out / LOCK_NAME).read_text()) == OWNER  # the refused run left the owner's record alone
    held.close()  # the owner dies without cleaning up (kill -9): its record stays, its lock is gone
    lock = OutputLock.acquire(out)
    assert lock.took_over == OWNER
    mine = json.loads((out / LOCK_NAME).read_text())
    assert mine["pid"] == os.getpid() and mine["host"] and mine["started"]
    lock.release()
    assert not (out / LOCK_NAME).exists()
    fresh = OutputLock.acquire(out)  # a clean end leaves nothing to take over
    assert fresh.took_over is None
    fresh.release()


def test_output_files_are_checked_with_their_names(tmp_path):
    check_output_files([("metrics file", tmp_path / "metrics.json")])
    assert not (tmp_path / "metrics.json").exists()  # created and removed again
    with pytest.raises(ConfigError, match=r"cannot write the checkpoint: File name too long"):
        check_output_files([("checkpoint", tmp_path / ("c" * 300))])
    with pytest.raises(ConfigError, match=r"nope/m.json: cannot write the metrics file: No such file or directory"):
        check_output_files([("metrics file", tmp_path / "nope" / "m.json")])
    with pytest.raises(OutputError, match=r"test.png: cannot write the render: Is a directory"):
        (tmp_path / "test.png").mkdir()
        write_png(tmp_path / "test.png", np.zeros((2, 2, 3), np.uint8))


def test_image_errors_name_the_true_cause(tmp_path):
    img = tmp_path / "a.png"
    with pytest.raises(SceneError, match=r"a.png: cannot read image: No such file or directory \(deleted or moved\?\)"):
        read_image(img)
    img.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with pytest.raises(SceneError, match=r"a.png: cannot decode image \(corrupt or unsupported format\)"):
        read_image(img)
    # root reads any file, so a permission error is raised for it
    with mock.patch.object(Path, "read_bytes", side_effect=PermissionError(errno.EACCES, os.strerror(errno.EACCES))):
        with pytest.raises(SceneError, match=r"a.png: cannot read image: Permission denied$"):
            read_image(img)


def fake_cgroups(tmp_path: Path, v2: bool, limit: str, usage: int) -> tuple[Path, Path]:
    """A /proc/self/cgroup and a /sys/fs/cgroup tree of a SLURM-like job (limit on the job, a step below it)."""
    root = tmp_path / "sys"
    base = root if v2 else root / "memory"
    job, step = base / "slurm" / "job_7", base / "slurm" / "job_7" / "step_0"
    step.mkdir(parents=True)
    names = ("memory.max", "memory.current") if v2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
    (base / names[0]).write_text("max\n" if v2 else f"{9223372036854771712}\n")
    (job / names[0]).write_text(limit + "\n")
    (job / names[1]).write_text(f"{usage}\n")
    (step / names[0]).write_text("max\n" if v2 else f"{9223372036854771712}\n")
    (step / names[1]).write_text(f"{usage}\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/slurm/job_7/step_0\n" if v2 else "12:cpu,cpuacct:/\n4:memory:/slurm/job_7/step_0\n0::/\n")
    return proc, root


@pytest.mark.parametrize("v2", [True, False], ids=["v2", "v1"])
def test_host_memory_honours_the_cgroup_limit(v2, tmp_path):
    proc, root = fake_cgroups(tmp_path, v2, str(4 * GIB), GIB)
    limit, usage, where = cgroup_memory_limit(proc, root)
    assert (limit, usage) == (4 * GIB, GIB) and where.parent.name == "job_7"
    host = host_memory(proc, root)
    assert host.available == 3 * GIB and "cgroup limit 4.00 GiB" in host.source
    check_host_fit(GIB, host, 2, "training images 1 GiB")  # 1.5 GiB per rank: fits
    with pytest.raises(
        MemoryBudgetError,
        match=r"needs about 2.00 GiB of host memory per rank .* each rank may take "
        r"1.50 GiB \(cgroup limit 4.00 GiB .* / 2 ranks on this host\)",
    ):
        check_host_fit(2 * GIB, host, 2, "training images 2 GiB")
    unlimited_proc, unlimited_root = fake_cgroups(tmp_path / "u", v2, "max" if v2 else "9223372036854771712", GIB)
    assert cgroup_memory_limit(unlimited_proc, unlimited_root) is None
    assert "MemAvailable" in host_memory(unlimited_proc, unlimited_root).source


def test_a_container_sees_its_limit_at_the_mount(tmp_path):
    """Inside a container the kernel names the host's cgroup path, which does not exist under the container's
    mount: the mount's own files hold the container's limit."""
    root = tmp_path / "sys"
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "memory.limit_in_bytes").write_text(f"{2 * GIB}\n")
    (root / "memory" / "memory.usage_in_bytes").write_text(f"{GIB // 2}\n")
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/process_api/ef0e1247\n")
    assert cgroup_memory_limit(proc, root)[:2] == (2 * GIB, GIB // 2)
