"""Real ranks: horovodrun -np 2 on localhost with the Gloo and the MPI controller, and plain mpirun."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT, TINY_ARGS, run_ranks

pytestmark = pytest.mark.parallel


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_two_ranks_agree_with_one(controller, scene_cache, tmp_path):
    proc = run_ranks(["tests/parallel/check_training.py", str(scene_cache), str(tmp_path / "out")],
                     controller=controller)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for check in ("step_equivalence", "disjoint_shards", "identical_parameters", "identical_grids"):
        assert f"CHECK {check} OK" in out, out[-4000:]


def test_only_rank_zero_writes_files(scene_cache, tmp_path):
    """mpirun MPMD: each rank gets its own --out_dir/--save_snapshot; rank 1's must stay empty."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not installed")
    common = [sys.executable, "-m", "hvd_ngp.train", *TINY_ARGS, "--scene_cache", str(scene_cache),
              "--n_steps", "12", "--log_every", "6", "--device", "cpu"]

    def rank_cmd(name):
        d = tmp_path / name
        return ["-np", "1", *common, "--out_dir", str(d / "out"), "--metrics_json", str(d / "m.json"),
                "--save_snapshot", str(d / "snap.pt")]

    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", *rank_cmd("r0"), ":", *rank_cmd("r1")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    metrics = json.loads((tmp_path / "r0" / "m.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 12
    assert (tmp_path / "r0" / "snap.pt").is_file() and list((tmp_path / "r0" / "out" / "renders").glob("*.png"))
    assert not (tmp_path / "r1").exists(), sorted(str(p) for p in (tmp_path / "r1").rglob("*"))
    # only rank 0 printed the training log
    assert (proc.stdout + proc.stderr).count("[step 12]") == 1


@pytest.mark.parametrize("problem", ["missing_scene", "malformed_transforms"])
def test_bad_scene_fails_fast_on_every_rank(problem, tmp_path):
    if problem == "missing_scene":
        scene = tmp_path / "no_such_scene"
        expect = "no such scene"
    else:
        scene = tmp_path / "broken"
        scene.mkdir()
        (scene / "transforms.json").write_text('{"camera_angle_x": 0.7, "frames": [{"file_path": "a.png", ')
        expect = "invalid JSON at line 1"
    start = time.monotonic()
    proc = run_ranks(["-m", "hvd_ngp.train", *TINY_ARGS, "--scene", str(scene), "--out_dir", str(tmp_path / "o"),
                      "--device", "cpu"], timeout=120)
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert elapsed < 60, f"took {elapsed:.0f} s"
    # one error from each rank (mpirun may glue the two ranks' lines together)
    errors = out.split("hvd_ngp: error:")[1:]
    assert len(errors) == 2 and "[rank 0] hvd_ngp: error:" in out and "[rank 1] hvd_ngp: error:" in out, out[-3000:]
    assert all(expect in e and str(scene.name) in e for e in errors), errors
    assert "Traceback" not in out
