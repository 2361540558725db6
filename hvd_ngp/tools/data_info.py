"""``python -m hvd_ngp.data info SCENE``: what the trainer will see, as JSON, without training.

Prints counts per split, skipped frames, image resolutions, aabb_scale and the bounds used. Only
image headers are needed for the sizes when the file gives w/h; otherwise images are decoded.
"""

from __future__ import annotations

import argparse
import json

from ..errors import run_cli
from ..data import BUILTIN, load_scene, scene_format
from ..data.builtin import ensure_builtin
from ..data.images import decode_images
from ..data.transforms import camera_intrinsics, locate_transforms, scene_aabb


def transforms_info(path, args) -> dict:
    files = locate_transforms(path, args.train_split, args.test_split, args.holdout_every, args.sharpness_threshold)
    tf = files.train
    aabb, aabb_scale = scene_aabb(tf.data, tf.path)
    frames = files.train_frames + files.test_frames
    if all(f.camera.get("w") and f.camera.get("h") for f in frames):
        per_frame = [(int(f.camera["w"]) // args.downscale, int(f.camera["h"]) // args.downscale) for f in frames]
    else:
        per_frame = [(im.shape[1], im.shape[0]) for im in decode_images([f.image_path for f in frames], args.downscale)]
    sizes = set(per_frame)
    missing = tf.missing + (files.test.missing if files.test is not None and files.test is not tf else 0)
    focal = camera_intrinsics(frames[0].camera, *per_frame[0], args.downscale, tf.path)[0] if frames else None
    return {
        "source": str(files.root),
        "format": "instant-ngp" if files.test is tf else "blender",
        "splits": {args.train_split: len(files.train_frames), args.test_split: len(files.test_frames)},
        "skipped_missing_images": missing,
        "skipped_sharpness": tf.blurry,
        "resolutions": [list(s) for s in sorted(sizes)],
        "focal_px": round(focal, 3) if focal else None,
        "aabb_scale": aabb_scale,
        "aabb": [[round(float(v), 6) for v in row] for row in aabb.tolist()],
    }


def info(args) -> dict:
    path = ensure_builtin(args.scene_cache, args.builtin_seed) if args.scene == BUILTIN else args.scene
    if scene_format(path) == "llff":
        scene = load_scene(path, holdout_every=args.holdout_every, downscale=args.downscale)
        return {**scene.summary(), "format": "llff"}
    return transforms_info(path, args)


def main(argv: list[str] | None = None) -> int:
    """``info SCENE [options]``: the scene's summary as JSON on stdout."""
    p = argparse.ArgumentParser(prog="python -m hvd_ngp.data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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
    args = p.parse_args(argv)
    print(json.dumps(info(args), indent=1))
    return 0


def cli(argv: list[str] | None = None) -> None:
    """``python -m hvd_ngp.data``: a bad scene is one line naming the file and exit status 2."""
    run_cli(main, argv, prog="python -m hvd_ngp.data")


if __name__ == "__main__":
    cli()
