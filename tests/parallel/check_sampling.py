"""Run under ``horovodrun -np 2``: the data pipeline's cross-rank facts, asserted on every rank.

    python tests/parallel/check_sampling.py modes SCENE_CACHE OUT_DIR
        trains with each --sampling strategy and with a streamed store under a memory cap; after each run
        the ranks' parameters and data decisions (placement, epoch, shares, error map) must be identical.
    python tests/parallel/check_sampling.py unbalanced OUT_DIR
        a deliberately unbalanced scene (rank 0's images are close-ups, rank 1's distant views whose rays
        mostly miss the scene's box), trained with --balance off and --balance time; prints
        ``SPREAD {"off": [...], "time": [...]}`` (the per-interval step-time spreads the monitor reports).

Prints ``CHECK <name> OK`` lines on rank 0; any failure raises (non-zero exit).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import TINY_ARGS  # noqa: E402

from hvd_ngp import dist  # noqa: E402
from hvd_ngp.config import CPU_CONFIG, parse_args  # noqa: E402
from hvd_ngp.data import builtin  # noqa: E402
from hvd_ngp.data.shards import shard_units  # noqa: E402
from hvd_ngp.train import RunResult, run  # noqa: E402

SEED = 0


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(argv: list[str]) -> RunResult:
    args = parse_args(["--config", str(CPU_CONFIG), *TINY_ARGS, "--device", "cpu", "--save_renders", "0",
                       "--seed", str(SEED), *argv])
    return run(args)


def assert_ranks_agree(result: RunResult, name: str) -> None:
    """Parameters, occupancy grid and every data decision identical on all ranks."""
    mine = {"parameters": digest(result.field.parameters()), "grid": digest([result.grid.density]),
            "data": json.dumps(result.metrics["data"], sort_keys=True)}
    every = dist.allgather_object(mine, name=f"check.{name}")
    for key in mine:
        assert all(e[key] == every[0][key] for e in every), f"{name}: {key} differs across ranks: {every}"
    assert math.isfinite(result.metrics["test_psnr"]), result.metrics
    if dist.runtime().is_root:
        print(f"CHECK {name} OK ({result.step} steps; data {result.metrics['data']})", flush=True)


def check_modes(cache: str, out: str) -> None:
    common = ["--scene_cache", cache, "--n_steps", "24", "--log_every", "8"]
    for sampling in ("uniform", "complexity", "error_map"):
        result = train([*common, "--sampling", sampling, "--error_map_interval", "6", "--out_dir", f"{out}/{sampling}"])
        data = result.metrics["data"]
        assert data["sampling"] == sampling
        if sampling == "error_map":
            assert data["error_map_updates"] == 4, data
        assert_ranks_agree(result, f"sampling_{sampling}")
    # a memory cap far below the decoded scene (64 x 80 x 80 x 4 bytes = 1.6 MB): images stream from disk
    result = train([*common, "--preload", "auto", "--device_image_budget_gb", "0.0002", "--host_image_budget_gb",
                    "0.0002", "--out_dir", f"{out}/stream"])
    assert result.metrics["data"]["placement"] == "stream" and result.metrics["data"]["shard_by"] == "image"
    assert_ranks_agree(result, "streamed_under_memory_cap")


def make_unbalanced_scene(out: Path, world_size: int, far: float = 14.0) -> Path:
    """The built-in scene with the training views of ranks 1.. moved ``far`` away (object small in the frame,
    most rays miss the scene's box: cheap), rank 0's left as close-ups (every ray marches: expensive)."""
    builtin.generate_builtin(out, SEED)
    meta = json.loads((out / "transforms_train.json").read_text())
    rng = np.random.default_rng(SEED)
    scene = builtin._StillLife(rng)
    w, h = builtin.DEFAULTS["width"], builtin.DEFAULTS["height"]
    focal = 0.5 * w / math.tan(0.5 * builtin.DEFAULTS["camera_angle_x"])
    rank0 = set(shard_units(len(meta["frames"]), SEED, 0, world_size, 0).tolist())
    for i, frame in enumerate(meta["frames"]):
        if i in rank0:
            continue
        eye = np.asarray(frame["transform_matrix"])[:3, 3]
        c2w = builtin._look_at(eye * far / np.linalg.norm(eye))
        rgba = builtin._render(scene, c2w, w, h, focal, 1)
        cv2.imwrite(str(out / (frame["file_path"] + ".png")), cv2.cvtColor(rgba, cv2.COLOR_RGBA2BGRA))
        frame["transform_matrix"] = c2w.round(9).tolist()
    (out / "transforms_train.json").write_text(json.dumps(meta, indent=1))
    return out


def check_unbalanced(out: str) -> None:
    rt = dist.runtime()
    scene = Path(out) / "scene"
    if rt.is_root:
        make_unbalanced_scene(scene, rt.size)
    dist.barrier()
    spreads = {}
    for balance in ("off", "time"):
        result = train(["--scene", str(scene), "--shard_by", "image", "--epoch_passes", "1000", "--balance", balance,
                        "--target_samples", "8192", "--n_rays_init", "512", "--n_steps", "84", "--log_every", "12",
                        "--n_eval_views", "1", "--out_dir", f"{out}/{balance}"])
        spreads[balance] = [h["step_time_spread"] for h in result.metrics["history"]]
        assert_ranks_agree(result, f"unbalanced_balance_{balance}")
    if rt.is_root:
        print("SPREAD " + json.dumps(spreads), flush=True)


def main() -> None:
    mode, *rest = sys.argv[1:]
    dist.init("cpu")
    if mode == "modes":
        check_modes(*rest)
    elif mode == "unbalanced":
        check_unbalanced(*rest)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
