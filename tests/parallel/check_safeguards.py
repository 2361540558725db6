"""Run under ``horovodrun -np 2``: start-up safeguards, each refused on every rank before training.

    python tests/parallel/check_safeguards.py SCENE_CACHE WORK_DIR LOCKED_OUT_DIR

One launch tries several bad starts in turn (each ``run`` must raise the same kind of error on every rank,
naming what is wrong) and one intended change; each rank prints ``CHECK <name> OK`` per check passed.
``LOCKED_OUT_DIR`` is an output folder whose lock the calling test holds.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import tiny_cpu_args  # noqa: E402

from hvd_ngp.cluster import dist  # noqa: E402
from hvd_ngp.config import parse_args  # noqa: E402
from hvd_ngp.errors import HvdNgpError  # noqa: E402
from hvd_ngp.training.trainer import run  # noqa: E402

#: TINY_ARGS's marching block with half the steps per diagonal (the grid keeps its shape)
MARCHING_32 = '{"grid_resolution": 16, "steps_per_diagonal": 32, "warmup_steps": 4}'
FAST = ("--n_steps", "2", "--log_every", "2", "--n_eval_views", "1", "--save_renders", "0", "--balance", "off")


def refused(name: str, argv: list[str], *expected: str) -> None:
    """``run`` with ``argv`` must raise an ``HvdNgpError`` holding every ``expected`` text."""
    rank = dist.runtime().rank if dist.communicating() else 0
    try:
        run(parse_args(argv))
    except HvdNgpError as exc:
        missing = [e for e in expected if e not in str(exc)]
        assert not missing, f"{name}: {missing} not in: {exc}"
        print(f"[rank {rank}] CHECK {name} OK: {str(exc)[:400]}", flush=True)
        return
    raise AssertionError(f"{name}: the run was not refused")


def camera_scene(root: Path, **camera) -> Path:
    """A one-frame transforms.json scene (a grey 8x6 PNG) with the given camera fields."""
    import cv2
    import numpy as np

    (root / "images").mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(root / "images" / "a.png"), np.full((6, 8, 3), 128, np.uint8))
    eye = [[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 2.0], [0, 0, 0, 1.0]]
    frame = {"file_path": "images/a.png", "transform_matrix": eye, **camera.pop("frame", {})}
    (root / "transforms.json").write_text(json.dumps({**camera, "frames": [frame]}))
    return root


def main() -> None:
    scene_cache, work, locked = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    dist.init("cpu")
    rank = dist.runtime().rank

    def args(out: str, *more: str) -> list[str]:
        return tiny_cpu_args(scene_cache, work / out, *FAST, *more)

    # 1. a setting that differs between the ranks' environments: refused before training, naming it and the ranks
    os.environ["HVD_NGP_N_STEPS"] = str(20 + rank)
    refused(
        "settings_differ",
        tiny_cpu_args(scene_cache, work / "differ", "--log_every", "2"),
        "the ranks disagree on 1 settings",
        "--n_steps: 20 on rank(s) 0, 21 on rank(s) 1",
    )
    del os.environ["HVD_NGP_N_STEPS"]

    # 4. an output folder held by another run: refused naming its host, pid and start time
    refused(
        "output_folder_locked",
        args("unused", "--out_dir", str(locked)),
        "this output folder is in use by another run",
        "host otherhost, pid 4242, started 2026-12-06 10:00:00 UTC",
    )

    # 7. an output file name the filesystem cannot hold: refused before training, with the true cause
    refused(
        "output_name_too_long",
        args("long", "--save_snapshot", str(work / ("x" * 300 + ".pt"))),
        "x" * 300 + ".pt: cannot write the file of --save_snapshot: File name too long",
    )

    # 6. impossible camera intrinsics, with the file and the key
    bad_fov = camera_scene(work / "fov", camera_angle_x=0)
    refused(
        "camera_angle_zero",
        args("fov_out", "--scene", str(bad_fov)),
        f"{bad_fov / 'transforms.json'}: 'camera_angle_x' must be a field of view in radians inside (0, pi), got 0",
    )
    bad_cx = camera_scene(work / "cx", camera_angle_x=0.7, frame={"cx": 50.0})
    refused(
        "principal_point_outside",
        args("cx_out", "--scene", str(bad_cx)),
        f"{bad_cx / 'transforms.json'}: frames[0].'cx' = 50 puts the principal point outside the image",
    )

    # 8. a plan that does not fit host memory (the smaller of MemAvailable and the cgroup's limit), on the CPU
    refused(
        "host_memory",
        args("mem", "--target_samples", str(1 << 40)),
        "of host memory per rank",
        "lower --target_samples",
    )

    # 5. a checkpoint trained on another scene (--downscale 2) and other marching settings: refused naming each
    # difference; with --allow_resume_changes an intended change resumes
    trained = args("resume", "--ckpt_every", "2")
    run(parse_args(trained))
    refused(
        "resume_mismatch",
        [*trained, "--resume", "auto", "--n_steps", "4", "--downscale", "2", "--marching", MARCHING_32],
        "was trained on something else than this run",
        "scene: digest",
        "marching.steps_per_diagonal: 64 in the checkpoint, 32 now",
        "--allow_resume_changes",
    )
    result = run(
        parse_args(
            [*trained, "--resume", "auto", "--n_steps", "4", "--marching", MARCHING_32, "--allow_resume_changes"]
        )
    )
    assert result.step == 4, result.step
    print(f"[rank {rank}] CHECK resume_override OK", flush=True)


if __name__ == "__main__":
    main()
