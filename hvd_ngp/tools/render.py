"""``python -m hvd_ngp.render --load_snapshot SNAP``: test views with PSNR/SSIM and an orbit video.

Rank-parallel under horovodrun/mpirun: each rank renders its share of the views and frames and
writes them itself (a shared filesystem is assumed for the output folder); rank 0 writes the
video once every frame exists.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cluster import dist
from ..state.checkpoint import load_average, read_region, read_snapshot, restore_snapshot, snapshot_config, snapshot_layout
from ..data import Frames, Scene, load_scene
from ..model.encoding import FAST_RENDERER_BACKENDS, resolve_backend
from ..model.encoding.tcnn import uses_tcnn_layout
from ..config import json_object, merge_patch
from ..errors import ConfigError, HvdNgpError, SnapshotError, run_cli
from ..training.evaluate import BACKGROUNDS, ViewRenderer, evaluate, to_uint8
from ..model.field import NGPField
from ..observe.memory import MemoryBudget, ranks_on_device
from ..training.recipe import Marching, make_grid
from ..render.camera_path import orbit
from ..render.regions import Partition, PiecewiseField
from ..training.model_parallel import region_model


#: marching keys a render may change: the step along rays and where rays stop (the grid itself is trained)
RENDER_MARCHING_KEYS = ("eval_steps_per_diagonal", "cone_angle", "early_termination", "near_distance", "max_steps")


def render_marching(trained: dict, patch: dict | None, snapshot: str) -> dict:
    """The marching block to render with: ``trained`` (the snapshot's) with ``patch`` merged in; a key outside
    ``RENDER_MARCHING_KEYS`` is a ``ConfigError`` naming the snapshot."""
    if not patch:
        return trained
    bad = sorted(set(patch) - set(RENDER_MARCHING_KEYS))
    if bad:
        raise ConfigError(f"--marching {', '.join(bad)}: a render of {snapshot} can change only "
                          f"{', '.join(RENDER_MARCHING_KEYS)} (the occupancy grid is the trained one)")
    return merge_patch(trained, patch)


def path_frames(scene_frames: Frames, c2w: torch.Tensor, max_side: int) -> Frames:
    """Frames for a camera path: the first training camera's intrinsics, scaled so the longer image
    side is at most ``max_side``; no images."""
    n = c2w.shape[0]
    w, h = scene_frames.image_size(0)
    k = min(1.0, max_side / max(w, h))
    intr = scene_frames.intrinsics[:1] * k
    size = [max(1, round(w * k)), max(1, round(h * k))]
    return Frames(torch.zeros(n, 1, 1, 4, dtype=torch.uint8), c2w, intr.expand(n, 4).clone(), torch.zeros(n, 6),
                  torch.tensor([size] * n), scene_frames.fisheye[:1].expand(n).clone())


def write_video(frames_dir: Path, n: int, path: Path, fps: int) -> None:
    import cv2

    first = cv2.imread(str(frames_dir / "frame_0000.png"))
    h, w = first.shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    if not writer.isOpened():
        raise HvdNgpError(f"{path}: OpenCV cannot write mp4 video here (the PNG frames are in {frames_dir})")
    for i in range(n):
        writer.write(cv2.imread(str(frames_dir / f"frame_{i:04d}.png")))
    writer.release()


@dataclass
class Trained:
    """A snapshot loaded for rendering: the field (averaged weights), its grid, the scene, how to march."""

    field: torch.nn.Module
    grid: torch.nn.Module
    scene: Scene
    march: Marching
    marching: dict  # the marching block rendered with
    cfg: dict       # the training arguments the snapshot records
    backend: str
    budget: MemoryBudget
    step: int


def load_trained(snapshot: str, scene_path: str | None = None, downscale: int | None = None,
                 marching_patch: dict | None = None, gpu_memory_gb: float = 0.0) -> Trained:
    """Read ``snapshot`` and its scene onto this rank's device (collective: every rank agrees on each step's errors)."""
    rt = dist.runtime()
    budget = dist.agree(lambda: MemoryBudget.for_device(rt.device, gpu_memory_gb, ranks_on_device(
        rt.local_rank, rt.local_size, torch.cuda.device_count() if rt.device.type == "cuda" else 0)),
        "planning GPU memory")
    state = dist.agree(lambda: read_snapshot(snapshot, "cpu"), "reading the snapshot")
    cfg = snapshot_config(state).get("args")
    if not isinstance(cfg, dict) or "model" not in cfg:
        raise SnapshotError(f"{snapshot}: the snapshot does not record its training configuration")
    scene = dist.agree(lambda: load_scene(scene_path or cfg["scene"], scene_cache=cfg["scene_cache"],
                                          builtin_seed=cfg["builtin_seed"], train_split=cfg["train_split"],
                                          test_split=cfg["test_split"], holdout_every=cfg["holdout_every"],
                                          downscale=downscale or cfg["downscale"],
                                          sharpness_threshold=cfg.get("sharpness_threshold", 0.0)), "loading the scene")
    model = cfg["model"]
    # tiny-cuda-nn keeps its own parameter layout: a snapshot trained with it renders with it
    backend = "tcnn" if uses_tcnn_layout(state["model"]) else resolve_backend("auto", rt.device)
    grid = make_grid(model["marching"], scene)
    layout = snapshot_layout(state)
    if layout is None:
        field = NGPField(model, scene.aabb, backend)
        restore_snapshot(state, field, grid, None, snapshot, averaged=True)
    else:  # model parallel: every region's file; each rank renders its views with all regions
        field = dist.agree(lambda: load_regions(snapshot, state, layout, model, backend),
                           "reading the region files of the snapshot")
        try:
            grid.load_state_dict(state["grid"])
        except RuntimeError as exc:
            raise SnapshotError(f"{snapshot}: the occupancy grid does not match the config: "
                                f"{str(exc).splitlines()[0]}") from None
        dist.log(f"model-parallel snapshot: {layout['model_parallel']} regions ({field.partition.describe()})")
    field, grid = field.to(rt.device), grid.to(rt.device)
    marching = render_marching(model["marching"], marching_patch, snapshot)
    march = Marching.from_config(marching, scene.aabb_scale,
                                 "--marching" if marching_patch else f"{snapshot}: the trained config")
    return Trained(field, grid, scene, march, marching, cfg, backend, budget, int(state.get("step", 0)))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m hvd_ngp.render", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load_snapshot", required=True, help="snapshot written by the trainer (--save_snapshot)")
    p.add_argument("--scene", default=None, help="scene for the test views and cameras (default: the training scene)")
    p.add_argument("--out_dir", default="renders", help="output folder")
    p.add_argument("--split_views", type=int, default=-1, help="test views to render (-1: all, 0: none)")
    p.add_argument("--video", choices=("orbit", "spiral", "none"), default="orbit", help="camera path for the video")
    p.add_argument("--n_frames", type=int, default=120)
    p.add_argument("--fps", type=int, default=30)
    p.add_argument("--video_size", type=int, default=960, help="longer side of video frames, in pixels")
    p.add_argument("--downscale", type=int, default=None, help="image downscale (default: as in training)")
    p.add_argument("--background", choices=tuple(BACKGROUNDS), default=None)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--marching", type=json_object, default=None, metavar="JSON",
                   help="merge-patch over the snapshot's marching block for this render, e.g. "
                        "'{\"eval_steps_per_diagonal\": 4096}' for a finer step along rays (keys: "
                        f"{', '.join(RENDER_MARCHING_KEYS)}; the occupancy grid stays the trained one)")
    p.add_argument("--gpu_memory_gb", type=float, default=0.0,
                   help="GPU memory this process may use; renders are chunked to fit (0: the free memory)")
    args = p.parse_args(argv)

    rt = dist.init(args.device)
    t = load_trained(args.load_snapshot, args.scene, args.downscale, args.marching, args.gpu_memory_gb)
    field, grid, scene, march, marching, cfg, backend, budget = (t.field, t.grid, t.scene, t.march, t.marching, t.cfg,
                                                                 t.backend, t.budget)
    background = args.background or cfg.get("eval_background", "white")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    result: dict = {"snapshot": str(args.load_snapshot), "scene": scene.source, "marching": marching}
    n_views = len(scene.test) if args.split_views < 0 else min(args.split_views, len(scene.test))
    if n_views:
        ev = evaluate(field, grid, scene.test, march.render_schedule, march.early_termination, background, n_views,
                      out / "test", n_views, writer="each_rank", fast=backend in FAST_RENDERER_BACKENDS,
                      budget=budget, protocol=cfg.get("eval_protocol", "std"))
        result.update(test_psnr=ev["psnr"], test_ssim=ev["ssim"], test_views=ev["views"])
        dist.log(f"test views: PSNR {ev['psnr']:.2f} dB, SSIM {ev['ssim']:.4f} over {ev['views']} views -> {out / 'test'}")
    if args.video != "none":
        import cv2

        path = path_frames(scene.train, orbit(scene.train.c2w, scene.up, args.n_frames, args.video == "spiral"),
                           args.video_size)
        frames_dir = out / f"{args.video}_frames"
        frames_dir.mkdir(parents=True, exist_ok=True)
        bg = torch.tensor(BACKGROUNDS[background], device=rt.device)
        field.eval()
        renderer = ViewRenderer(field, grid, march.render_schedule, march.early_termination,
                                backend in FAST_RENDERER_BACKENDS, budget)
        for i in range(rt.rank, args.n_frames, rt.size):
            img = renderer.view(path, i, bg)
            cv2.imwrite(str(frames_dir / f"frame_{i:04d}.png"), cv2.cvtColor(to_uint8(img), cv2.COLOR_RGB2BGR))
        dist.barrier()
        if rt.is_root:
            write_video(frames_dir, args.n_frames, out / f"{args.video}.mp4", args.fps)
            result["video"] = str(out / f"{args.video}.mp4")
            dist.log(f"video: {args.n_frames} frames -> {out / f'{args.video}.mp4'}")
    if rt.is_root:
        (out / "render.json").write_text(json.dumps(result, indent=1))
    return result


def load_regions(path: str, state: dict, layout: dict, model: dict, backend: str) -> PiecewiseField:
    """The K region fields of a model-parallel snapshot (averaged weights where it holds them) as one field."""
    partition = Partition.from_json(layout["partition"])
    k = int(layout["model_parallel"])
    fields = []
    for region in range(k):
        part = read_region(path, layout, region)
        f = NGPField(region_model(model, k), partition.boxes[region], backend)
        try:
            f.load_state_dict(part["model"])
        except RuntimeError as exc:
            raise SnapshotError(f"{path}: region {region} does not match its config: {str(exc).splitlines()[0]}") from None
        load_average(f, part.get("ema") or {})
        fields.append(f)
    return PiecewiseField(fields, partition)


def cli(argv: list[str] | None = None) -> None:
    """``python -m hvd_ngp.render``: a user error is one line (with the rank under a launcher) and exit status 2."""
    run_cli(main, argv, prog="python -m hvd_ngp.render")


if __name__ == "__main__":
    cli()
