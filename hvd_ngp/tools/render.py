"""``hvd-ngp-render --load_snapshot SNAP``: test views with PSNR/SSIM, and a video along an orbit or a camera-path
file (--camera_path), with depth, normal and opacity beside the colour (--outputs).

Rank-parallel under horovodrun/mpirun: each rank renders its share of the views and frames and
writes them itself (a shared filesystem is assumed for the output folder); rank 0 writes the
videos (H.264 mp4, browser-playable) once every frame exists.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..cluster import dist
from ..config import json_object
from ..data import Frames
from ..errors import ConfigError, run_cli
from ..observe.progress import progress
from ..options import options_from
from ..render.camera_path import CameraPath, orbit
from ..render.outputs import OUTPUTS, colorize_depth, colorize_normal, colorize_opacity, depth_range, parse_outputs
from ..render.volume import DEFAULT_INFERENCE, INFERENCE_MATH, INFERENCE_PATHS
from ..training.evaluate import BACKGROUNDS, evaluate, to_uint8, write_png
from ..triton_support import INFERENCE_MATHS, inference_math
from .camera_files import load_camera_path
from .trained import RENDER_MARCHING_KEYS, Trained, load_trained
from .video import write_mp4

#: the longer side of an orbit's (or a keyframe path's) frames when --video_size is not given
DEFAULT_VIDEO_SIZE = 960


@dataclass(frozen=True)
class RenderOptions:
    """The command line of ``hvd-ngp-render`` (``main``'s parser holds each option's help)."""

    load_snapshot: str
    scene: str | None
    out_dir: str
    split_views: int  # -1: all test views, 0: none
    video: str  # orbit | spiral | none
    camera_path: str | None
    outputs: str  # comma-separated, checked by ``parse_outputs``
    n_frames: int
    fps: float | None
    video_size: int | None
    downscale: int | None
    background: str | None
    device: str
    marching: dict | None  # merge-patch over the snapshot's marching block
    gpu_memory_gb: float
    inference: str
    inference_math: str


def path_frames(path: CameraPath) -> Frames:
    """Frames (no images) for the cameras of ``path``."""
    n = path.c2w.shape[0]
    return Frames(
        torch.zeros(n, 1, 1, 4, dtype=torch.uint8),
        path.c2w,
        path.intrinsics,
        torch.zeros(n, 6),
        torch.tensor([list(path.size)] * n),
        torch.zeros(n, dtype=torch.bool),
    )


def training_camera(train: Frames) -> tuple[torch.Tensor, tuple[int, int]]:
    """The first training camera's intrinsics ``[4]`` and size (w, h)."""
    return train.intrinsics[0], train.image_size(0)


def video_path(opts: RenderOptions, trained: Trained) -> tuple[str, CameraPath]:
    """The video's name and cameras: the --camera_path file's, else an orbit or spiral."""
    scene = trained.scene
    intr, size = training_camera(scene.train)
    if opts.camera_path:
        cams = load_camera_path(opts.camera_path, size, scene.scale, scene.offset, opts.n_frames)
        max_side = opts.video_size or (None if cams.own_size else DEFAULT_VIDEO_SIZE)
        return Path(opts.camera_path).stem, cams.scaled(max_side)
    c2w = orbit(scene.train.c2w, scene.up, opts.n_frames, opts.video == "spiral")
    cams = CameraPath(c2w, intr[None].expand(opts.n_frames, 4).clone(), size)
    return opts.video, cams.scaled(opts.video_size or DEFAULT_VIDEO_SIZE)


def render_video(
    opts: RenderOptions, trained: Trained, name: str, cams: CameraPath, outputs: tuple[str, ...], out: Path
) -> dict:
    """Every rank renders frames rank, rank + size, ... of ``cams`` (a progress bar on rank 0) and writes their
    ``outputs`` into ``out/<name>_frames`` (PNG, and .npy for depth, normal and opacity); rank 0 then writes one
    H.264 mp4 per output. Collective (the depth range is agreed: one colour scale for the whole video)."""
    rt = dist.runtime()
    frames = path_frames(cams)
    n = len(frames)
    folder = out / f"{name}_frames"
    folder.mkdir(parents=True, exist_ok=True)
    bg = trained.background(opts.background)
    renderer = trained.renderer(opts.inference)
    mine = range(rt.rank, n, rt.size)
    near, far = float("inf"), float("-inf")
    for i in progress(mine, f"{name} frames" + (f" (rank 0 of {rt.size})" if rt.size > 1 else ""), "frame", rt.is_root):
        if outputs == ("rgb",):
            write_png(folder / f"frame_{i:04d}.png", to_uint8(renderer.view(frames, i, bg)))
            continue
        buf = {k: v.cpu() for k, v in renderer.outputs(frames, i, bg, normals="normal" in outputs).items()}
        if "rgb" in outputs:
            write_png(folder / f"frame_{i:04d}.png", to_uint8(buf["rgb"].clamp(0, 1)))
        opacity = buf["opacity"].numpy()
        np.save(folder / f"opacity_{i:04d}.npy", opacity)
        if "opacity" in outputs:
            write_png(folder / f"opacity_{i:04d}.png", colorize_opacity(opacity))
        if "normal" in outputs:
            np.save(folder / f"normal_{i:04d}.npy", buf["normal"].numpy())
            write_png(folder / f"normal_{i:04d}.png", colorize_normal(buf["normal"].numpy(), opacity, bg.tolist()))
        if "depth" in outputs:
            np.save(folder / f"depth_{i:04d}.npy", buf["depth"].numpy())
            seen = depth_range(buf["depth"], buf["opacity"])
            if seen is not None:  # a frame that hits nothing leaves the range alone
                near, far = min(near, seen[0]), max(far, seen[1])
    result: dict = {}
    if "depth" in outputs:  # one colour scale for every frame of every rank
        near = float(dist.allreduce(torch.tensor([near], dtype=torch.float64), "min", name="render.near")[0])
        far = float(dist.allreduce(torch.tensor([far], dtype=torch.float64), "max", name="render.far")[0])
        if not np.isfinite(near) or not np.isfinite(far):
            near, far = 0.0, 1.0
        for i in mine:
            write_png(
                folder / f"depth_{i:04d}.png",
                colorize_depth(
                    np.load(folder / f"depth_{i:04d}.npy"),
                    np.load(folder / f"opacity_{i:04d}.npy"),
                    near,
                    far,
                    bg.tolist(),
                ),
            )
        result["depth_range"] = [near, far]
    dist.barrier()
    fps = opts.fps or cams.fps or 30
    videos = {}
    if rt.is_root:
        for o in outputs:
            stem = "frame" if o == "rgb" else o
            path = out / (f"{name}.mp4" if o == "rgb" else f"{name}_{o}.mp4")
            write_mp4([folder / f"{stem}_{i:04d}.png" for i in range(n)], path, fps)
            videos[o] = str(path)
        dist.log(f"video: {n} frames at {cams.size[0]}x{cams.size[1]}, {fps:g} fps -> " + ", ".join(videos.values()))
    result.update(video=videos.get("rgb"), videos=videos, frames=n, fps=fps, size=list(cams.size))
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="hvd-ngp-render", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--load_snapshot", required=True, help="snapshot written by the trainer (--save_snapshot)")
    p.add_argument("--scene", default=None, help="scene for the test views and cameras (default: the training scene)")
    p.add_argument("--out_dir", default="renders", help="output folder")
    p.add_argument("--split_views", type=int, default=-1, help="test views to render (-1: all, 0: none)")
    p.add_argument("--video", choices=("orbit", "spiral", "none"), default="orbit", help="camera path for the video")
    p.add_argument(
        "--camera_path",
        default=None,
        metavar="FILE",
        help="render this camera path instead of the orbit: nerfstudio's camera_path.json, instant-ngp's "
        "base_cam.json (keyframes, interpolated into --n_frames frames) or a transforms.json whose "
        "images may be absent (docs/look-at-your-result.md)",
    )
    p.add_argument(
        "--outputs",
        default="rgb",
        metavar="LIST",
        help=f"comma-separated outputs of each video frame, among {', '.join(OUTPUTS)}: a PNG each (depth, "
        "normal and opacity also as .npy) and an mp4 per output",
    )
    p.add_argument("--n_frames", type=int, default=120, help="frames of an orbit or of an instant-ngp keyframe path")
    p.add_argument("--fps", type=float, default=None, help="video frame rate (default: the camera path's, else 30)")
    p.add_argument(
        "--video_size",
        type=int,
        default=None,
        help=f"longer side of video frames, in pixels (default: {DEFAULT_VIDEO_SIZE} for an orbit or "
        "keyframe path; a nerfstudio or transforms.json path keeps its own size)",
    )
    p.add_argument("--downscale", type=int, default=None, help="image downscale (default: as in training)")
    p.add_argument("--background", choices=tuple(BACKGROUNDS), default=None)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument(
        "--marching",
        type=json_object,
        default=None,
        metavar="JSON",
        help="merge-patch over the snapshot's marching block for this render, e.g. "
        "'{\"eval_steps_per_diagonal\": 4096}' for a finer step along rays (keys: "
        f"{', '.join(RENDER_MARCHING_KEYS)}; the occupancy grid stays the trained one)",
    )
    p.add_argument(
        "--gpu_memory_gb",
        type=float,
        default=0.0,
        help="GPU memory this process may use; renders are chunked to fit (0: the free memory)",
    )
    p.add_argument(
        "--inference",
        choices=INFERENCE_PATHS,
        default=DEFAULT_INFERENCE,
        help="the Triton renderer's inference path: single_pass (one network pass per sample, "
        "docs/inference.md), two_pass (density pass, then the whole network on the kept samples) or "
        "density_first (the colour network on the composited samples only)",
    )
    p.add_argument(
        "--inference_math",
        choices=INFERENCE_MATHS,
        default=INFERENCE_MATH,
        help="the Triton kernels' math in this render: tf32 (tensor-core products of fp32 values), fp16 (half "
        "products and a half copy of the hash table) or ieee (fp32 throughout)",
    )
    opts = options_from(RenderOptions, p.parse_args(argv))
    try:
        outputs = parse_outputs(opts.outputs)
    except ValueError as exc:
        raise ConfigError(f"--outputs {opts.outputs}: {exc}") from None
    if (
        opts.n_frames < 1
        or (opts.fps is not None and opts.fps <= 0)
        or (opts.video_size is not None and opts.video_size < 2)
    ):
        raise ConfigError("--n_frames must be >= 1, --fps > 0 and --video_size >= 2")

    with inference_math(opts.inference_math):
        return render_all(opts, outputs)


def render_all(opts: RenderOptions, outputs: tuple[str, ...]) -> dict:
    """The test views and the video ``opts`` ask for, with ``outputs``; rank 0 writes render.json -> its dict."""
    trained = load_trained(
        opts.load_snapshot, opts.device, opts.scene, opts.downscale, opts.marching, opts.gpu_memory_gb
    )
    scene, rt = trained.scene, dist.runtime()
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    result: dict = {"snapshot": str(opts.load_snapshot), "scene": scene.source, "marching": trained.marching}
    n_views = len(scene.test) if opts.split_views < 0 else min(opts.split_views, len(scene.test))
    if n_views:
        ev = evaluate(
            trained.field,
            trained.grid,
            scene.test,
            trained.march.render_schedule,
            trained.march.early_termination,
            opts.background or trained.cfg.get("eval_background", "white"),
            n_views,
            out / "test",
            n_views,
            writer="each_rank",
            fast=trained.fast,
            budget=trained.budget,
            protocol=trained.cfg.get("eval_protocol", "std"),
            inference=opts.inference,
        )
        result.update(
            test_psnr=ev["psnr"],
            test_ssim=ev["ssim"],
            test_views=ev["views"],
            test_seconds_per_view=ev["seconds_per_view"],
            test_seconds_per_view_after_first=ev["seconds_per_view_after_first"],
            inference=opts.inference if trained.fast else None,
            inference_math=opts.inference_math if trained.fast else None,
        )
        dist.log(
            f"test views: PSNR {ev['psnr']:.2f} dB, SSIM {ev['ssim']:.4f} over {ev['views']} views, "
            f"{ev['seconds_per_view']:.3f} s per view -> {out / 'test'}"
        )
    if opts.camera_path or opts.video != "none":
        name, cams = dist.agree(lambda: video_path(opts, trained), "reading the camera path")
        result.update(render_video(opts, trained, name, cams, outputs, out))
    if rt.is_root:
        (out / "render.json").write_text(json.dumps(result, indent=1))
    return result


def cli(argv: list[str] | None = None) -> None:
    """``hvd-ngp-render`` / ``python -m hvd_ngp.render``: a user error is one line (with the rank under a launcher)
    and exit status 2."""
    run_cli(main, argv, prog="hvd-ngp-render")


if __name__ == "__main__":
    cli()
