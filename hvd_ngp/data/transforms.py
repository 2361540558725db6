"""instant-ngp / NeRF-synthetic ``transforms*.json`` scenes.

A scene is a folder holding ``transforms.json`` (instant-ngp: every frame trains, ``holdout_every``
holds out test views) or ``transforms_{train,val,test}.json`` (Blender splits), or one such file.

Fields (global, and per frame where instant-ngp allows it): ``camera_angle_x/_y``, ``fl_x/fl_y``,
``cx/cy``, ``w/h``, OpenCV distortion ``k1 k2 k3 k4 p1 p2``, ``is_fisheye``, ``aabb_scale``,
``aabb``, ``scale`` (0.33), ``offset`` ([0.5, 0.5, 0.5]), ``up``, per-frame ``sharpness``
(frames below ``sharpness_threshold`` are discarded), ``file_path`` with or without extension
(frames whose image is missing are skipped and counted). Errors name the file and the problem.

nerfstudio's variants: ``camera_model`` (global or per frame) PINHOLE / SIMPLE_PINHOLE (no
distortion allowed), OPENCV (radial-tangential) or OPENCV_FISHEYE (equidistant with k1..k4, no
p1/p2); any other model is refused. ``applied_transform`` records how the poses were made from
COLMAP's world: it is checked and the poses are used as given. ``ply_file_path`` is ignored (the
trainer starts from an empty field), with a note. Per-frame ``mask_path``: a grey image, zero where
pixels are masked out. ``mask_mode`` "alpha" (the default): masked pixels get alpha 0, so training
composites them over its random background and the model learns them as empty (right for masks that cut
an object out of its surroundings; a mask over a transient occluder also empties the space in front of
what it hides). "exclude": the pixels keep their colour and alpha, and ``Frames.keep`` marks them, so they
are never drawn for training nor counted in test PSNR (right for transient occluders, people, the
operator's shadow).
"""

from __future__ import annotations

import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError, SceneError, read_json_object
from .cameras import nerf_to_ngp
from .images import IMAGE_EXTENSIONS, decode_images, image_size, stack_images, stack_masks
from .scene import Frames, ImageFiles, Scene

DISTORTION_KEYS = ("k1", "k2", "k3", "k4", "p1", "p2")
#: nerfstudio ``camera_model`` values -> (fisheye, distortion keys that may be non-zero)
CAMERA_MODELS = {
    "PINHOLE": (False, ()),
    "SIMPLE_PINHOLE": (False, ()),
    "OPENCV": (False, DISTORTION_KEYS),
    "OPENCV_FISHEYE": (True, ("k1", "k2", "k3", "k4")),
}
INTRINSIC_KEYS = ("fl_x", "fl_y", "cx", "cy", "w", "h", "camera_angle_x", "camera_angle_y")


@dataclass
class FrameMeta:
    """One frame as listed in the file, before its image is decoded."""

    image_path: Path
    c2w: np.ndarray  # [3, 4] ngp space
    camera: dict  # intrinsics fields: the frame's own, falling back to the file's
    own_intrinsics: bool  # the frame sets its own focal length / size
    index: int = 0  # its place in the file's frames list
    own_keys: tuple = ()  # the camera fields the frame sets itself (messages name them as frames[i].'key')
    mask_path: Path | None = None  # grey image, zero where pixels are masked out


@dataclass
class TransformsFile:
    """A parsed transforms file: its global fields and the frames whose image exists."""

    path: Path
    data: dict
    frames: list[FrameMeta]
    missing: int
    blurry: int
    notes: list[str] = field(default_factory=list)  # fields read but not used, for ``info``


def _number(data: dict, key: str, path: Path, where: str = "") -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SceneError(f"{path}: {where}'{key}' must be a finite number, got {value!r}")
    return float(value)


def check_camera_fields(camera: dict, path: Path, where: str = "", keys=INTRINSIC_KEYS) -> None:
    """Focal lengths and sizes positive, fields of view inside (0, pi) radians: else ``SceneError`` naming the key."""
    for key in keys:
        value = camera.get(key)
        if value is None:
            continue
        if key.startswith("camera_angle_") and not 0.0 < value < math.pi:
            raise SceneError(f"{path}: {where}'{key}' must be a field of view in radians inside (0, pi), got {value!r}")
        if key in ("fl_x", "fl_y", "w", "h") and value <= 0:
            raise SceneError(f"{path}: {where}'{key}' must be positive, got {value!r}")


def _resolve_image(base: Path, file_path: str) -> Path | None:
    """The image file a frame names, trying common extensions when the name has none."""
    p = base / file_path
    if p.is_file():
        return p
    if not p.suffix or p.suffix not in IMAGE_EXTENSIONS:
        for ext in IMAGE_EXTENSIONS:
            q = p.with_name(p.name + ext)
            if q.is_file():
                return q
    return None


def _matrix(value, path: Path, where: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise SceneError(f"{path}: {where}transform_matrix is not a numeric matrix") from None
    if arr.shape not in ((4, 4), (3, 4)):
        raise SceneError(f"{path}: {where}transform_matrix must be 4x4 (or 3x4), got shape {list(arr.shape)}")
    if not np.isfinite(arr).all():
        raise SceneError(f"{path}: {where}transform_matrix contains NaN or Inf")
    return arr


def _camera_model(camera: dict, model, path: Path, where: str) -> None:
    """Check nerfstudio's ``camera_model`` against the distortion fields and set ``is_fisheye`` from it."""
    if model is None:
        return
    if model not in CAMERA_MODELS:
        raise SceneError(
            f"{path}: {where}'camera_model' {model!r} is not supported (supported: {', '.join(CAMERA_MODELS)})"
        )
    fisheye, allowed = CAMERA_MODELS[model]
    for k in DISTORTION_KEYS:
        if camera.get(k) and k not in allowed:
            raise SceneError(f"{path}: {where}'{k}' is non-zero but camera_model {model} has no such parameter")
    camera["is_fisheye"] = fisheye


def _applied_transform(data: dict, path: Path) -> str | None:
    value = data.get("applied_transform")
    if value is None:
        return None
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.shape not in ((3, 4), (4, 4)) or not np.isfinite(arr).all():
        raise SceneError(f"{path}: 'applied_transform' must be a 3x4 (or 4x4) matrix of finite numbers")
    return "applied_transform: recorded only (the frames' poses already include it)"


def frame_line(path: Path, index: int) -> int | None:
    """1-based line on which ``frames[index]`` starts in the JSON file ``path`` (None when it cannot be told)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    found = re.search(r'"frames"\s*:\s*\[', text)
    if found is None:
        return None
    decoder, pos = json.JSONDecoder(), found.end()
    for i in range(index + 1):
        gap = re.compile(r"[\s,]*").match(text, pos)
        assert gap is not None  # the pattern matches the empty string, so anywhere
        pos = gap.end()
        if i == index:
            return text.count("\n", 0, pos) + 1
        try:
            pos = decoder.raw_decode(text, pos)[1]
        except ValueError:
            return None
    return None


def parse_transforms(path: Path, sharpness_threshold: float = 0.0, poses_only: bool = False) -> TransformsFile:
    """Parse one transforms file (no image decoding). ``poses_only``: frames whose image is missing are
    kept (their ``image_path`` the name as listed), for a camera path.

    An error about one frame names the line it starts on (``transforms.json:57: frames[3]...``).
    """
    try:
        return _parse_transforms(path, sharpness_threshold, poses_only)
    except SceneError as exc:
        about_frame = re.match(re.escape(f"{path}: frames[") + r"(\d+)\]", str(exc))
        line = frame_line(path, int(about_frame.group(1))) if about_frame else None
        if line is None:
            raise
        raise SceneError(f"{path}:{line}: {str(exc)[len(str(path)) + 2 :]}") from None


def world_to_ngp(data: dict, path: Path) -> tuple[float, np.ndarray]:
    """The ``scale`` (default 0.33) and ``offset`` ``[3]`` (default 0.5 each) that map a transforms file's world
    into ngp space (``cameras.nerf_to_ngp``)."""
    scale = _number(data, "scale", path)
    scale = 0.33 if scale is None else scale
    offset = data.get("offset", [0.5, 0.5, 0.5])
    if not (isinstance(offset, list) and len(offset) == 3 and all(isinstance(v, (int, float)) for v in offset)):
        raise SceneError(f"{path}: 'offset' must be a list of 3 numbers, got {offset!r}")
    return scale, np.asarray(offset, dtype=np.float64)


def _parse_transforms(path: Path, sharpness_threshold: float, poses_only: bool = False) -> TransformsFile:
    data = read_json_object(path, SceneError, "transforms JSON")
    frames_json = data.get("frames")
    if not isinstance(frames_json, list):
        raise SceneError(f"{path}: missing 'frames' list")
    scale, offset = world_to_ngp(data, path)
    global_camera = {k: _number(data, k, path) for k in (*INTRINSIC_KEYS, *DISTORTION_KEYS)}
    check_camera_fields(global_camera, path)
    global_camera["is_fisheye"] = bool(data.get("is_fisheye", False))
    if "is_fisheye" in data and "camera_model" in data:
        raise SceneError(f"{path}: give 'camera_model' or 'is_fisheye', not both")
    _camera_model(global_camera, data.get("camera_model"), path, "")
    notes = [n for n in [_applied_transform(data, path)] if n]
    if "ply_file_path" in data:
        notes.append(f"ply_file_path: ignored ({data['ply_file_path']!r}; the field starts empty)")
    frames: list[FrameMeta] = []
    missing = blurry = 0
    for i, f in enumerate(frames_json):
        where = f"frames[{i}]."
        if not isinstance(f, dict):
            raise SceneError(f"{path}: frames[{i}] must be an object")
        fp = f.get("file_path")
        if not isinstance(fp, str) or not fp:
            raise SceneError(f"{path}: {where}file_path is missing or not a string")
        if "transform_matrix" not in f:
            raise SceneError(f"{path}: {where}transform_matrix is missing")
        arr = _matrix(f["transform_matrix"], path, where)
        sharp = _number(f, "sharpness", path, where)
        if sharpness_threshold > 0 and sharp is not None and sharp < sharpness_threshold:
            blurry += 1
            continue
        image = _resolve_image(path.parent, fp)
        if image is None:
            missing += 1
            if not poses_only:
                continue
            image = path.parent / fp
        camera = dict(global_camera)
        own = {k: _number(f, k, path, where) for k in (*INTRINSIC_KEYS, *DISTORTION_KEYS) if k in f}
        check_camera_fields(own, path, where)
        camera.update(own)
        if "is_fisheye" in f:
            camera["is_fisheye"] = bool(f["is_fisheye"])
        _camera_model(
            camera, f.get("camera_model", data.get("camera_model")), path, where if "camera_model" in f or own else ""
        )
        mask = _mask(f, path, where)
        frames.append(
            FrameMeta(
                image,
                nerf_to_ngp(arr, scale, offset).astype(np.float32),
                camera,
                any(k in own for k in ("fl_x", "fl_y", "camera_angle_x", "w", "h")),
                i,
                tuple(own),
                mask,
            )
        )
    return TransformsFile(path, data, frames, missing, blurry, notes)


def _mask(frame: dict, path: Path, where: str) -> Path | None:
    value = frame.get("mask_path")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise SceneError(f"{path}: {where}mask_path must be a file name, got {value!r}")
    mask = _resolve_image(path.parent, value)
    if mask is None:
        raise SceneError(f"{path}: {where}mask_path {value!r}: no such image")
    return mask


def camera_intrinsics(
    cam: dict, image_w: int, image_h: int, downscale: int, path: Path, frame: FrameMeta | None = None
) -> list[float]:
    """fx, fy, cx, cy at the decoded image's resolution from a frame's camera fields; the principal point must
    lie inside the image (``SceneError`` naming the key, and ``frame``'s place when the frame sets it)."""
    file_w = cam.get("w") or image_w * downscale
    file_h = cam.get("h") or image_h * downscale
    fx, fy = cam.get("fl_x"), cam.get("fl_y")
    ax, ay = cam.get("camera_angle_x"), cam.get("camera_angle_y")
    if fx is None and ax is not None:
        fx = 0.5 * file_w / math.tan(0.5 * ax)
    if fy is None and ay is not None:
        fy = 0.5 * file_h / math.tan(0.5 * ay)
    if fx is None and fy is None:
        raise SceneError(f"{path}: no focal length: give 'fl_x' or 'camera_angle_x' (globally or per frame)")
    fx = fy if fx is None else fx
    fy = fx if fy is None else fy
    assert fx is not None and fy is not None  # one was given (checked above) and the other copies it
    cx = file_w / 2 if cam.get("cx") is None else cam["cx"]
    cy = file_h / 2 if cam.get("cy") is None else cam["cy"]
    for key, value, size, axis in (("cx", cx, file_w, "width"), ("cy", cy, file_h, "height")):
        if not 0.0 <= value <= size:
            where = f"frames[{frame.index}]." if frame is not None and key in frame.own_keys else ""
            raise SceneError(
                f"{path}: {where}'{key}' = {value:g} puts the principal point outside the image "
                f"(its {axis} is {size:g} pixels)"
            )
    sx, sy = image_w / file_w, image_h / file_h
    return [fx * sx, fy * sy, cx * sx, cy * sy]


MASK_MODES = ("alpha", "exclude")


def build_frames(
    tf: TransformsFile,
    frames: list[FrameMeta],
    downscale: int,
    threads: int = 8,
    decode: bool = True,
    mask_mode: str = "alpha",
) -> tuple[Frames, bool]:
    """Decode the images and assemble ``Frames``; images of several sizes need per-frame intrinsics.
    ``decode=False``: read only the image sizes; the pixels are decoded later from ``Frames.files``.
    ``mask_mode``: what a frame's ``mask_path`` does (``MASK_MODES``, see the module docstring)."""
    if mask_mode not in MASK_MODES:
        raise ConfigError(f"--mask_mode must be one of {', '.join(MASK_MODES)}, got {mask_mode!r}")
    if not frames:
        return empty_frames(), False
    paths = [f.image_path for f in frames]
    masks = [f.mask_path for f in frames] if any(f.mask_path for f in frames) else None
    keep_masks, masks = (masks, None) if mask_mode == "exclude" else (None, masks)
    if decode:
        images = decode_images(paths, downscale, threads, masks)
        sizes = [(im.shape[1], im.shape[0]) for im in images]
    else:
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(paths)))) as pool:
            sizes = list(pool.map(lambda p: image_size(p, downscale), paths))
    if len(set(sizes)) > 1 and not all(f.own_intrinsics for f in frames):
        shown = ", ".join(f"{w}x{h}" for w, h in sorted(set(sizes)))
        raise SceneError(
            f"{tf.path}: images have different sizes ({shown}) but not every frame gives its own "
            "intrinsics (a frame that sets any of 'fl_x', 'fl_y', 'camera_angle_x', 'w', 'h' gives its own; "
            "give them in every frame)"
        )
    intrinsics = [camera_intrinsics(f.camera, w, h, downscale, tf.path, f) for f, (w, h) in zip(frames, sizes)]
    stack, has_alpha = stack_images(images) if decode else (None, False)
    distortion = [[f.camera.get(k) or 0.0 for k in DISTORTION_KEYS] for f in frames]
    out = Frames(
        stack,
        torch.from_numpy(np.stack([f.c2w for f in frames])),
        torch.tensor(intrinsics, dtype=torch.float32),
        torch.tensor(distortion, dtype=torch.float32),
        torch.tensor(sizes, dtype=torch.int64),
        torch.tensor([f.camera["is_fisheye"] for f in frames]),
        [str(p) for p in paths],
        ImageFiles(paths, downscale, masks),
        None if keep_masks is None else stack_masks(keep_masks, sizes, threads),
    )
    return out, has_alpha


def empty_frames() -> Frames:
    return Frames(
        torch.zeros(0, 1, 1, 4, dtype=torch.uint8), torch.zeros(0, 3, 4), torch.zeros(0, 4), torch.zeros(0, 6)
    )


def scene_aabb(data: dict, path: Path) -> tuple[torch.Tensor, int]:
    """The render bounds in ngp space: ``aabb`` if given, else the cube of side ``aabb_scale`` around 0.5."""
    aabb_scale = data.get("aabb_scale", 1)
    if (
        isinstance(aabb_scale, bool)
        or not isinstance(aabb_scale, (int, float))
        or aabb_scale < 1
        or aabb_scale != int(aabb_scale)
        or (int(aabb_scale) & (int(aabb_scale) - 1))
    ):
        raise SceneError(f"{path}: 'aabb_scale' must be a power of two >= 1, got {aabb_scale!r}")
    aabb_scale = int(aabb_scale)
    if "aabb" in data:
        try:
            aabb = torch.tensor(data["aabb"], dtype=torch.float32)
        except (TypeError, ValueError):
            raise SceneError(f"{path}: 'aabb' must be [[xmin, ymin, zmin], [xmax, ymax, zmax]]") from None
        if aabb.shape != (2, 3) or not bool((aabb[1] > aabb[0]).all()):
            raise SceneError(f"{path}: 'aabb' must be [[xmin, ymin, zmin], [xmax, ymax, zmax]] with max > min")
        return aabb, aabb_scale
    half = 0.5 * aabb_scale
    return torch.tensor([[0.5 - half] * 3, [0.5 + half] * 3], dtype=torch.float32), aabb_scale


def up_vector(data: dict) -> list[float]:
    """The scene's up direction in ngp space (instant-ngp's ``up`` field; NeRF z-up by default)."""
    up = data.get("up", [0.0, 0.0, 1.0])
    if not (isinstance(up, list) and len(up) == 3):
        up = [0.0, 0.0, 1.0]
    v = np.array([up[1], up[2], up[0]], dtype=np.float64)  # the same axis cycle as the poses
    n = np.linalg.norm(v)
    return (v / n).tolist() if n > 0 else [0.0, 1.0, 0.0]


@dataclass
class SceneFiles:
    """Where a scene's splits come from, after resolving the folder layout."""

    root: Path
    train: TransformsFile
    test: TransformsFile | None
    train_frames: list[FrameMeta]
    test_frames: list[FrameMeta]


def locate_transforms(
    scene: str | os.PathLike,
    train_split: str = "train",
    test_split: str = "test",
    holdout_every: int = 0,
    sharpness_threshold: float = 0.0,
) -> SceneFiles:
    """Parse the transforms file(s) of ``scene`` and split their frames (no image decoding)."""
    root = Path(scene).expanduser()
    if not root.exists():
        raise SceneError(f"{root}: no such scene (expected a folder with transforms.json, or a transforms*.json file)")
    if root.is_file():
        single = root
    elif (root / f"transforms_{train_split}.json").is_file():
        single = None
    elif (root / "transforms.json").is_file():
        single = root / "transforms.json"
    else:
        raise SceneError(f"{root}: no transforms.json or transforms_{train_split}.json in this folder")
    if single is not None:
        tf = parse_transforms(single, sharpness_threshold)
        n = len(tf.frames)
        held = [holdout_every > 0 and i % holdout_every == 0 for i in range(n)]
        train = [f for f, h in zip(tf.frames, held) if not h]
        return SceneFiles(root, tf, tf, train, [f for f, h in zip(tf.frames, held) if h])
    tf = parse_transforms(root / f"transforms_{train_split}.json", sharpness_threshold)
    test_path = root / f"transforms_{test_split}.json"
    test = parse_transforms(test_path) if test_path.is_file() else None
    return SceneFiles(root, tf, test, tf.frames, test.frames if test else [])


def load_transforms_scene(
    scene: str | os.PathLike,
    train_split: str = "train",
    test_split: str = "test",
    holdout_every: int = 0,
    downscale: int = 1,
    sharpness_threshold: float = 0.0,
    lazy_train: bool = False,
    mask_mode: str = "alpha",
) -> Scene:
    """Load a ``transforms*.json`` scene (folder or file). ``lazy_train``: the training images are not
    decoded (``Frames.images`` is None; ``has_alpha`` then describes the test images only). ``mask_mode``:
    see ``build_frames``."""
    files = locate_transforms(scene, train_split, test_split, holdout_every, sharpness_threshold)
    tf = files.train
    missing = tf.missing + (files.test.missing if files.test is not None and files.test is not tf else 0)
    if not files.train_frames:
        raise SceneError(
            f"{tf.path}: no usable frames ({missing} listed images are missing, {tf.blurry} below the "
            f"sharpness threshold)"
        )
    aabb, aabb_scale = scene_aabb(tf.data, tf.path)
    train, alpha_train = build_frames(tf, files.train_frames, downscale, decode=not lazy_train, mask_mode=mask_mode)
    test, alpha_test = build_frames(files.test or tf, files.test_frames, downscale, mask_mode=mask_mode)
    scale, offset = world_to_ngp(tf.data, tf.path)
    return Scene(
        train,
        test,
        aabb,
        aabb_scale,
        alpha_train or alpha_test,
        str(files.root),
        missing,
        tf.blurry,
        up_vector(tf.data),
        scale,
        offset.tolist(),
    )


def load_poses(path: str | os.PathLike, fallback_size: tuple[int, int]) -> Frames:
    """The cameras of a transforms file whose images need not exist (a camera path): ``Frames`` without
    pixels, sizes from the file's ``w``/``h`` (else ``fallback_size`` (w, h)); one size for every frame."""
    path = Path(path)
    tf = parse_transforms(path, poses_only=True)
    if not tf.frames:
        raise SceneError(f"{path}: no frames to render")
    sizes = [
        (int(f.camera.get("w") or fallback_size[0]), int(f.camera.get("h") or fallback_size[1])) for f in tf.frames
    ]
    if len(set(sizes)) > 1:
        raise SceneError(
            f"{path}: frames of several sizes ({', '.join(f'{w}x{h}' for w, h in sorted(set(sizes)))}): "
            "a video needs one"
        )
    n = len(tf.frames)
    intrinsics = [camera_intrinsics(f.camera, w, h, 1, path) for f, (w, h) in zip(tf.frames, sizes)]
    return Frames(
        torch.zeros(n, 1, 1, 4, dtype=torch.uint8),
        torch.from_numpy(np.stack([f.c2w for f in tf.frames])),
        torch.tensor(intrinsics, dtype=torch.float32),
        torch.zeros(n, 6),
        torch.tensor(sizes),
        torch.zeros(n, dtype=torch.bool),
    )
