"""Real ranks: horovodrun -np 2 on localhost with the Gloo and the MPI controller, and plain mpirun."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY_ARGS, run_ranks

pytestmark = pytest.mark.parallel


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_two_ranks_agree_with_one(controller, scene_cache, tmp_path):
    proc = run_ranks(
        ["tests/parallel/check_training.py", str(scene_cache), str(tmp_path / "out")], controller=controller
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for check in ("step_equivalence", "disjoint_shards", "identical_parameters", "identical_grids"):
        assert f"CHECK {check} OK" in out, out[-4000:]


def test_only_rank_zero_writes_files(scene_cache, tmp_path):
    """mpirun MPMD: each rank gets its own --out_dir/--save_snapshot; rank 1's must stay empty."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not installed")
    common = [
        sys.executable,
        "-m",
        "hvd_ngp.train",
        *TINY_ARGS,
        "--scene_cache",
        str(scene_cache),
        "--n_steps",
        "12",
        "--log_every",
        "6",
        "--device",
        "cpu",
    ]

    def rank_cmd(name):
        d = tmp_path / name
        return [
            "-np",
            "1",
            *common,
            "--out_dir",
            str(d / "out"),
            "--metrics_json",
            str(d / "m.json"),
            "--save_snapshot",
            str(d / "snap.pt"),
        ]

    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", *rank_cmd("r0"), ":", *rank_cmd("r1")]
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    metrics = json.loads((tmp_path / "r0" / "m.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 12
    assert (tmp_path / "r0" / "snap.pt").is_file() and list((tmp_path / "r0" / "out" / "renders").glob("*.png"))
    assert not (tmp_path / "r1").exists(), sorted(str(p) for p in (tmp_path / "r1").rglob("*"))
    # only rank 0 printed the training log
    assert (proc.stdout + proc.stderr).count("[step 12]") == 1


def write_scene(root: Path, frames: list[dict], images: dict[str, tuple[int, int]] | None = None) -> Path:
    """A transforms.json scene; ``images`` maps file names to (height, width) of grey PNGs to create."""
    import cv2
    import numpy as np

    (root / "images").mkdir(parents=True, exist_ok=True)
    for name, (h, w) in (images or {}).items():
        cv2.imwrite(str(root / "images" / name), np.full((h, w, 3), 128, np.uint8))
    (root / "transforms.json").write_text(json.dumps({"camera_angle_x": 0.7, "frames": frames}, indent=1))
    return root


EYE = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 2.0], [0.0, 0.0, 0.0, 1.0]]
FRAME = {"file_path": "images/a.png", "transform_matrix": EYE}


def bad_input(problem: str, tmp: Path) -> tuple[list[str], str]:
    """Build one bad input of the catalogue -> (trainer flags, the message every rank must print)."""
    if problem == "missing_scene":
        return ["--scene", str(tmp / "no_such_scene")], "no_such_scene: no such scene"
    if problem == "unreadable_scene":  # an image given where the transforms file belongs
        write_scene(tmp / "s", [FRAME], {"a.png": (6, 8)})
        return [
            "--scene",
            str(tmp / "s" / "images" / "a.png"),
        ], "a.png: cannot read transforms JSON: not a UTF-8 text file (byte 0)"
    if problem == "invalid_json":
        (tmp / "s").mkdir()
        (tmp / "s" / "transforms.json").write_text('{"camera_angle_x": 0.7, "frames": [{"file_path": "a.png", ')
        return ["--scene", str(tmp / "s")], "transforms.json: invalid JSON at line 1"
    if problem == "missing_transform_matrix":
        write_scene(tmp / "s", [FRAME, {"file_path": "images/a.png"}], {"a.png": (6, 8)})
        return ["--scene", str(tmp / "s")], "transforms.json:33: frames[1].transform_matrix is missing"
    if problem == "transform_matrix_wrong_shape":
        write_scene(tmp / "s", [{**FRAME, "transform_matrix": [[1, 0, 0], [0, 1, 0]]}], {"a.png": (6, 8)})
        return [
            "--scene",
            str(tmp / "s"),
        ], "transforms.json:4: frames[0].transform_matrix must be 4x4 (or 3x4), got shape [2, 3]"
    if problem == "transform_matrix_nan":
        write_scene(tmp / "s", [{**FRAME, "transform_matrix": [[float("nan")] * 4] * 4}], {"a.png": (6, 8)})
        return ["--scene", str(tmp / "s")], "transforms.json:4: frames[0].transform_matrix contains NaN or Inf"
    if problem == "no_usable_frames":
        write_scene(tmp / "s", [{**FRAME, "file_path": "images/gone.png"}])
        return ["--scene", str(tmp / "s")], "transforms.json: no usable frames (1 listed images are missing"
    if problem == "mixed_sizes_without_per_frame_intrinsics":
        write_scene(tmp / "s", [FRAME, {**FRAME, "file_path": "images/b.png"}], {"a.png": (6, 8), "b.png": (5, 8)})
        return ["--scene", str(tmp / "s")], (
            "transforms.json: images have different sizes (8x5, 8x6) but not every frame gives its own intrinsics"
        )
    if problem == "unreadable_image":
        write_scene(tmp / "s", [FRAME])
        (tmp / "s" / "images" / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
        return ["--scene", str(tmp / "s")], "a.png: cannot decode image (corrupt or unsupported format)"
    if problem == "invalid_config_json":
        (tmp / "bad.json").write_text('{"n_steps": 10,\n "encoding": {"n_levels": 4,}}')
        return ["--config", str(tmp / "bad.json")], "bad.json: invalid JSON at line 2 column 29"
    if problem == "unknown_otype":
        return ["--density_network", '{"otype": "Bogus"}'], "cpu.json: network.otype 'Bogus' is unknown"
    if problem == "negative_size":
        return [
            "--rgb_network",
            '{"n_neurons": -4}',
        ], "cpu.json: rgb_network.n_neurons must be a positive integer, got -4"
    if problem == "unwritable_output_folder":
        (tmp / "file").write_text("a file, not a folder")
        return [
            "--out_dir",
            str(tmp / "file" / "out"),
        ], "cannot write to the output folder (--out_dir): Not a directory"
    raise AssertionError(problem)


CATALOGUE = [
    "missing_scene",
    "unreadable_scene",
    "invalid_json",
    "missing_transform_matrix",
    "transform_matrix_wrong_shape",
    "transform_matrix_nan",
    "no_usable_frames",
    "mixed_sizes_without_per_frame_intrinsics",
    "unreadable_image",
    "invalid_config_json",
    "unknown_otype",
    "negative_size",
    "unwritable_output_folder",
]


@pytest.mark.parametrize("problem", CATALOGUE)
def test_bad_input_fails_fast_on_every_rank(problem, scene_cache, tmp_path):
    """Each bad input: one clear line naming the file on every rank, non-zero exit, no traceback, and
    the files of an earlier run in the output folder untouched. (A full disk while writing a
    checkpoint is in test_reliability.py.)"""
    flags, expect = bad_input(problem, tmp_path)
    out = tmp_path / "previous_run"
    out.mkdir()
    (out / "metrics.json").write_text('{"steps": 7}')
    if "--out_dir" not in flags:
        flags += ["--out_dir", str(out)]
    start = time.monotonic()
    proc = run_ranks(
        [
            "-m",
            "hvd_ngp.train",
            "--config",
            str(ROOT / "hvd_ngp/configs/nerf/cpu.json"),
            *TINY_ARGS,
            "--scene_cache",
            str(scene_cache),
            "--device",
            "cpu",
            *flags,
        ],
        timeout=180,
    )
    elapsed = time.monotonic() - start
    out_text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert elapsed < 60, f"took {elapsed:.0f} s"
    # one error from each rank (mpirun may glue the two ranks' lines together)
    errors = out_text.split("hvd_ngp: error:")[1:]
    assert len(errors) == 2 and "[rank 0] hvd_ngp: error:" in out_text and "[rank 1] hvd_ngp: error:" in out_text, (
        out_text[-3000:]
    )
    assert all(expect in e for e in errors), errors
    assert "Traceback" not in out_text
    assert (
        sorted(p.name for p in out.iterdir()) == ["metrics.json"]
        and (out / "metrics.json").read_text() == '{"steps": 7}'
    )


def test_a_single_process_that_asks_for_another_device_gets_it():
    """dist.init keeps its runtime while the device asked for matches it; a single process (no Horovod)
    that asks for another one is set up again instead of silently keeping the old device."""
    import torch

    from hvd_ngp.cluster import dist
    from hvd_ngp.errors import BackendError

    dist.shutdown()
    try:
        first = dist.init("cpu")
        assert dist.init("cpu") is first and dist.init("auto") is first
        if torch.cuda.is_available():
            assert dist.init("cuda").device.type == "cuda"
        else:
            with pytest.raises(BackendError, match="no CUDA GPU"):
                dist.init("cuda")
    finally:
        dist.shutdown()
