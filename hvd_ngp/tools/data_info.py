"""``python -m hvd_ngp.data info SCENE``: what the trainer will see, as JSON, without training (also ``process``
and ``pack``: see ``hvd_ngp.tools.process`` and ``hvd_ngp.data.packed``).

Prints counts per split, skipped frames, image resolutions, aabb_scale and the bounds used. Only
image headers are needed for the sizes when the file gives w/h; otherwise images are decoded.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from ..data import BUILTIN, load_scene, scene_format
from ..data.builtin import ensure_builtin
from ..data.images import decode_images
from ..data.packed import __doc__ as packed_doc, pack_scene
from ..data.transforms import camera_intrinsics, locate_transforms, scene_aabb
from ..errors import SceneError, run_cli
from ..options import command_options
from .process import Options, __doc__ as process_doc, process


@dataclass(frozen=True)
class InfoOptions:
    """``info SCENE``: where the scene is and how the trainer would load it (``main``'s parser holds the help)."""

    command: str
    scene: str  # 'builtin', a scene folder or a transforms*.json file
    train_split: str
    test_split: str
    holdout_every: int
    downscale: int
    sharpness_threshold: float
    scene_cache: str
    builtin_seed: int


@dataclass(frozen=True)
class PackOptions(InfoOptions):
    """``pack SCENE --out DIR``: the scene as ``InfoOptions`` loads it, written as memory-mappable shards."""

    out: Path
    shards: int


@dataclass(frozen=True)
class ProcessOptions:
    """``process --images DIR | --video FILE --out DIR``: COLMAP's knobs (``process.Options``) and the paths."""

    command: str
    images: Path | None
    video: Path | None
    out: Path
    fps: float
    max_size: int
    colmap_size: int
    camera_model: str
    matcher: str
    min_registered: float
    threads: int
    quiet: bool


COMMANDS: dict[str, type] = {"info": InfoOptions, "process": ProcessOptions, "pack": PackOptions}


def transforms_info(path: str | Path, opts: InfoOptions) -> dict:
    files = locate_transforms(path, opts.train_split, opts.test_split, opts.holdout_every, opts.sharpness_threshold)
    tf = files.train
    aabb, aabb_scale = scene_aabb(tf.data, tf.path)
    frames = files.train_frames + files.test_frames
    if all(f.camera.get("w") and f.camera.get("h") for f in frames):
        per_frame = [(int(f.camera["w"]) // opts.downscale, int(f.camera["h"]) // opts.downscale) for f in frames]
    else:
        per_frame = [(im.shape[1], im.shape[0]) for im in decode_images([f.image_path for f in frames], opts.downscale)]
    sizes = set(per_frame)
    missing = tf.missing + (files.test.missing if files.test is not None and files.test is not tf else 0)
    focal = camera_intrinsics(frames[0].camera, *per_frame[0], opts.downscale, tf.path)[0] if frames else None
    return {
        "source": str(files.root),
        "format": "instant-ngp" if files.test is tf else "blender",
        "splits": {opts.train_split: len(files.train_frames), opts.test_split: len(files.test_frames)},
        "skipped_missing_images": missing,
        "skipped_sharpness": tf.blurry,
        "resolutions": [list(s) for s in sorted(sizes)],
        "focal_px": round(focal, 3) if focal else None,
        "aabb_scale": aabb_scale,
        "aabb": [[round(float(v), 6) for v in row] for row in aabb.tolist()],
        "masked_frames": sum(f.mask_path is not None for f in frames),
        "notes": tf.notes,
    }


def info(opts: InfoOptions) -> dict:
    path = ensure_builtin(opts.scene_cache, opts.builtin_seed) if opts.scene == BUILTIN else opts.scene
    if scene_format(path) in ("llff", "packed"):
        scene = load_scene(path, holdout_every=opts.holdout_every, downscale=opts.downscale)
        return {**scene.summary(), "format": scene_format(path)}
    return transforms_info(path, opts)


def add_process_parser(sub) -> None:
    q = sub.add_parser(
        "process",
        help="photos or a video -> a posed transforms.json scene (COLMAP)",
        description=process_doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = q.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", type=Path, help="a folder of photos")
    src.add_argument("--video", type=Path, help="a video file (frames sampled at --fps)")
    q.add_argument("--out", type=Path, required=True, help="the scene folder to write")
    q.add_argument("--fps", type=float, default=2.0, help="frames per second taken from --video")
    q.add_argument("--max_size", type=int, default=0, help="long side of the written images (0: as captured)")
    q.add_argument("--colmap_size", type=int, default=640, help="long side of the images COLMAP sees")
    q.add_argument("--camera_model", default="OPENCV", help="COLMAP camera model (one camera for all frames)")
    q.add_argument("--matcher", choices=("auto", "exhaustive", "sequential"), default="auto")
    q.add_argument(
        "--min_registered",
        type=float,
        default=0.5,
        help="fail unless COLMAP registers at least this fraction of the frames",
    )
    q.add_argument("--threads", type=int, default=-1, help="COLMAP threads (-1: all cores)")
    q.add_argument("--quiet", action="store_true", help="no progress bars")


def run_process(opts: ProcessOptions) -> int:
    opt = Options(
        max_size=opts.max_size,
        colmap_size=opts.colmap_size,
        camera_model=opts.camera_model,
        fps=opts.fps,
        matcher=opts.matcher,
        min_registered=opts.min_registered,
        threads=opts.threads,
        quiet=opts.quiet,
    )
    data = process(opts.out, images=opts.images, video=opts.video, opt=opt)
    print(
        json.dumps(
            {
                "out": str(opts.out),
                "frames": len(data["frames"]),
                **data["colmap"],
                "aabb_scale": data["aabb_scale"],
                "camera_model": data["camera_model"],
            }
        )
    )
    return 0


def run_pack(opts: PackOptions) -> int:
    if opts.shards < 1:
        raise SceneError(f"--shards must be >= 1, got {opts.shards}")
    scene = load_scene(
        opts.scene,
        scene_cache=opts.scene_cache,
        builtin_seed=opts.builtin_seed,
        train_split=opts.train_split,
        test_split=opts.test_split,
        holdout_every=opts.holdout_every,
        downscale=opts.downscale,
        sharpness_threshold=opts.sharpness_threshold,
        lazy_train=True,
    )
    meta = pack_scene(scene, opts.out, opts.shards, opts.holdout_every, opts.downscale)
    size = sum(f.stat().st_size for f in Path(opts.out).glob("*.u8"))
    print(
        json.dumps(
            {
                "out": str(opts.out),
                "train": len(scene.train),
                "test": len(scene.test),
                "shards": {s: len(v["shards"]) for s, v in meta["splits"].items()},
                "bytes": size,
            }
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``info SCENE [options]`` (the scene's summary as JSON on stdout), ``process``, ``pack``."""
    p = argparse.ArgumentParser(
        prog="python -m hvd_ngp.data", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("info", help="summarise a scene as JSON")
    i.add_argument("scene", help="'builtin', a scene folder, or a transforms*.json file")
    i.add_argument("--train_split", default="train")
    i.add_argument("--test_split", default="test")
    i.add_argument("--holdout_every", type=int, default=0)
    i.add_argument("--downscale", type=int, default=1)
    i.add_argument("--sharpness_threshold", type=float, default=0.0)
    i.add_argument("--scene_cache", default="~/.cache/hvd_ngp/scenes")
    i.add_argument("--builtin_seed", type=int, default=0)
    add_process_parser(sub)
    k = sub.add_parser(
        "pack",
        help="a scene -> decoded uint8 shards that every rank memory-maps",
        description=packed_doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    k.add_argument("scene", help="'builtin', a scene folder, or a transforms*.json file")
    k.add_argument("--out", type=Path, required=True, help="the packed scene folder to write")
    k.add_argument("--shards", type=int, default=8, help="shard files per split (e.g. the number of ranks)")
    for name, kind, default in (
        ("train_split", str, "train"),
        ("test_split", str, "test"),
        ("holdout_every", int, 0),
        ("downscale", int, 1),
        ("sharpness_threshold", float, 0.0),
    ):
        k.add_argument(f"--{name}", type=kind, default=default)
    k.add_argument("--scene_cache", default="~/.cache/hvd_ngp/scenes")
    k.add_argument("--builtin_seed", type=int, default=0)
    opts: InfoOptions | ProcessOptions = command_options(p.parse_args(argv), "command", COMMANDS)
    if isinstance(opts, ProcessOptions):
        return run_process(opts)
    if isinstance(opts, PackOptions):
        return run_pack(opts)
    print(json.dumps(info(opts), indent=1))
    return 0


def cli(argv: list[str] | None = None) -> None:
    """``python -m hvd_ngp.data``: a bad scene is one line naming the file and exit status 2."""
    run_cli(main, argv, prog="python -m hvd_ngp.data")


if __name__ == "__main__":
    cli()
