"""instant-ngp / NeRF-synthetic ``transforms*.json`` scenes.

A scene is a folder holding ``transforms.json`` (instant-ngp: every frame trains, ``--holdout_every``
holds out test views) or ``transforms_{train,val,test}.json`` (Blender splits), or one such file.
Errors name the file and the problem.
"""

from __future__ import annotations

import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch

from ..errors import SceneError
from .cameras import nerf_to_ngp
from .scene import Frames, Scene

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".PNG", ".JPG", ".JPEG", ".exr", ".bmp", ".tif", ".tiff")
DISTORTION_KEYS = ("k1", "k2", "k3", "k4", "p1", "p2")


@dataclass
class _Frame:
    image_path: Path
    c2w: np.ndarray         # [3, 4] ngp
    intrinsics: np.ndarray  # [4] (fx, fy, cx, cy) at the file's resolution, or NaN to derive from the image
    distortion: np.ndarray  # [6]
    angle: tuple[float | None, float | None]


def read_json(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SceneError(f"{path}: no such file") from None
    except OSError as exc:
        raise SceneError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise SceneError(f"{path}: cannot read: not a UTF-8 text file (byte {exc.start}); expected transforms JSON") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SceneError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise SceneError(f"{path}: expected a JSON object at the top level, found {type(data).__name__}")
    return data


def _number(data: dict, key: str, path: Path, where: str = "") -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SceneError(f"{path}: {where}'{key}' must be a finite number, got {value!r}")
    return float(value)


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
        pos = re.compile(r"[\s,]*").match(text, pos).end()
        if i == index:
            return text.count("\n", 0, pos) + 1
        try:
            pos = decoder.raw_decode(text, pos)[1]
        except ValueError:
            return None
    return None


def parse_transforms(path: Path, sharpness_threshold: float = 0.0) -> tuple[dict, list[_Frame], int, int]:
    """Parse one transforms file -> (global fields, frames with an image on disk, #missing, #blurry).

    An error about one frame names the line it starts on (``transforms.json:57: frames[3]...``).
    """
    try:
        return _parse_transforms(path, sharpness_threshold)
    except SceneError as exc:
        about_frame = re.match(re.escape(f"{path}: frames[") + r"(\d+)\]", str(exc))
        line = frame_line(path, int(about_frame.group(1))) if about_frame else None
        if line is None:
            raise
        raise SceneError(f"{path}:{line}: {str(exc)[len(str(path)) + 2:]}") from None


def _parse_transforms(path: Path, sharpness_threshold: float) -> tuple[dict, list[_Frame], int, int]:
    data = read_json(path)
    frames_json = data.get("frames")
    if not isinstance(frames_json, list):
        raise SceneError(f"{path}: missing 'frames' list")
    scale = _number(data, "scale", path)
    scale = 0.33 if scale is None else scale
    offset = data.get("offset", [0.5, 0.5, 0.5])
    if not (isinstance(offset, list) and len(offset) == 3 and all(isinstance(v, (int, float)) for v in offset)):
        raise SceneError(f"{path}: 'offset' must be a list of 3 numbers, got {offset!r}")
    frames: list[_Frame] = []
    missing = blurry = 0
    for i, f in enumerate(frames_json):
        where = f"frames[{i}]."
        if not isinstance(f, dict):
            raise SceneError(f"{path}: frames[{i}] must be an object")
        fp = f.get("file_path")
        if not isinstance(fp, str) or not fp:
            raise SceneError(f"{path}: {where}file_path is missing or not a string")
        m = f.get("transform_matrix")
        if m is None:
            raise SceneError(f"{path}: {where}transform_matrix is missing")
        try:
            arr = np.asarray(m, dtype=np.float64)
        except (TypeError, ValueError):
            raise SceneError(f"{path}: {where}transform_matrix is not a numeric matrix") from None
        if arr.shape not in ((4, 4), (3, 4)):
            raise SceneError(f"{path}: {where}transform_matrix must be 4x4 (or 3x4), got shape {list(arr.shape)}")
        if not np.isfinite(arr).all():
            raise SceneError(f"{path}: {where}transform_matrix contains NaN or Inf")
        sharp = _number(f, "sharpness", path, where)
        if sharpness_threshold > 0 and sharp is not None and sharp < sharpness_threshold:
            blurry += 1
            continue
        image = _resolve_image(path.parent, fp)
        if image is None:
            missing += 1
            continue
        intr = []
        for key in ("fl_x", "fl_y", "cx", "cy"):
            v = _number(f, key, path, where)
            intr.append(_number(data, key, path) if v is None else v)
        dist = [(_number(f, k, path, where) if k in f else _number(data, k, path)) or 0.0 for k in DISTORTION_KEYS]
        ax = _number(f, "camera_angle_x", path, where)
        ay = _number(f, "camera_angle_y", path, where)
        angle = (ax if ax is not None else _number(data, "camera_angle_x", path),
                 ay if ay is not None else _number(data, "camera_angle_y", path))
        frames.append(_Frame(image, nerf_to_ngp(arr, scale, np.asarray(offset)).astype(np.float32),
                             np.array([np.nan if v is None else v for v in intr], dtype=np.float64),
                             np.asarray(dist, dtype=np.float32), angle))
    return data, frames, missing, blurry


def read_image(path: Path, downscale: int = 1) -> np.ndarray:
    """Decode an image to ``[H, W, 4]`` uint8 RGBA (OpenCV; 16-bit and float images are converted)."""
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if img is None:
        raise SceneError(f"{path}: cannot decode image (corrupt or unsupported format)")
    if img.dtype == np.uint16:
        img = (img.astype(np.float32) / 257.0 + 0.5).astype(np.uint8)
    elif img.dtype in (np.float32, np.float64):  # linear EXR/HDR -> sRGB 8-bit
        lin = np.clip(img, 0.0, 1.0)
        srgb = np.where(lin <= 0.0031308, 12.92 * lin, 1.055 * np.power(lin, 1 / 2.4) - 0.055)
        img = (srgb * 255.0 + 0.5).astype(np.uint8)
    if img.ndim == 2:
        img = cv2.cvtColor(img, cv2.COLOR_GRAY2RGBA)
    elif img.shape[2] == 3:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGBA)
    else:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2RGBA)
    if downscale > 1:
        h, w = img.shape[:2]
        img = cv2.resize(img, (w // downscale, h // downscale), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(img)


def build_frames(path: Path, data: dict, frames: list[_Frame], downscale: int, threads: int = 8) -> tuple[Frames, bool]:
    """Decode images in parallel threads and assemble ``Frames`` (one resolution per split)."""
    if not frames:
        return _empty_frames(), False
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(frames)))) as pool:
        images = list(pool.map(lambda f: read_image(f.image_path, downscale), frames))
    sizes = {im.shape[:2] for im in images}
    if len(sizes) > 1:
        odd = next(i for i, im in enumerate(images) if im.shape[:2] != images[0].shape[:2])
        (h0, w0), (h1, w1) = images[0].shape[:2], images[odd].shape[:2]
        raise SceneError(f"{path}: images of different sizes ({len(sizes)} sizes): {frames[0].image_path.name} is "
                         f"{w0}x{h0} but {frames[odd].image_path.name} is {w1}x{h1}; one resolution per split is "
                         f"supported (per-frame intrinsics for mixed sizes are not): resize the images or split the scene")
    h, w = images[0].shape[:2]
    intrinsics = []
    for f, im in zip(frames, images):
        fx, fy, cx, cy = (float(v) for v in f.intrinsics)
        # The file's resolution: 'w'/'h' if given, else the decoded image's (before downscale).
        file_w = _number(data, "w", path) or w * downscale
        file_h = _number(data, "h", path) or h * downscale
        ax, ay = f.angle
        if math.isnan(fx):
            if ax is not None:
                fx = 0.5 * file_w / math.tan(0.5 * ax)
            elif not math.isnan(fy):
                fx = fy
            else:
                raise SceneError(f"{path}: no focal length: give 'fl_x' or 'camera_angle_x' (globally or per frame)")
        if math.isnan(fy):
            fy = 0.5 * file_h / math.tan(0.5 * ay) if ay is not None else fx
        cx = file_w / 2 if math.isnan(cx) else cx
        cy = file_h / 2 if math.isnan(cy) else cy
        sx, sy = w / file_w, h / file_h
        intrinsics.append([fx * sx, fy * sy, cx * sx, cy * sy])
    has_alpha = any(im[..., 3].min() < 255 for im in images)
    out = Frames(torch.from_numpy(np.stack(images)),
                 torch.from_numpy(np.stack([f.c2w for f in frames])),
                 torch.tensor(intrinsics, dtype=torch.float32),
                 torch.from_numpy(np.stack([f.distortion for f in frames])),
                 [str(f.image_path) for f in frames])
    return out, has_alpha


def _empty_frames() -> Frames:
    return Frames(torch.zeros(0, 1, 1, 4, dtype=torch.uint8), torch.zeros(0, 3, 4), torch.zeros(0, 4),
                  torch.zeros(0, 6), [])


def scene_aabb(data: dict, path: Path) -> tuple[torch.Tensor, int]:
    """The render bounds in ngp space: ``aabb`` if given, else the cube of side ``aabb_scale`` around 0.5."""
    aabb_scale = data.get("aabb_scale", 1)
    if not isinstance(aabb_scale, (int, float)) or aabb_scale < 1 or (int(aabb_scale) & (int(aabb_scale) - 1)):
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


def load_transforms_scene(scene: str | os.PathLike, train_split: str = "train", test_split: str = "test",
                          holdout_every: int = 0, downscale: int = 1, sharpness_threshold: float = 0.0) -> Scene:
    """Load a ``transforms*.json`` scene (folder or file)."""
    root = Path(scene).expanduser()
    if not root.exists():
        raise SceneError(f"{root}: no such scene (expected a folder with transforms.json, or a transforms*.json file)")
    if root.is_file():
        single, folder = root, root.parent
    elif (root / f"transforms_{train_split}.json").is_file():
        single, folder = None, root
    elif (root / "transforms.json").is_file():
        single, folder = root / "transforms.json", root
    else:
        raise SceneError(f"{root}: no transforms.json or transforms_{train_split}.json in this folder")

    if single is not None:
        data, frames, missing, blurry = parse_transforms(single, sharpness_threshold)
        if holdout_every > 0:
            test_idx = [i for i in range(len(frames)) if i % holdout_every == 0]
            train_idx = [i for i in range(len(frames)) if i % holdout_every != 0]
        else:
            train_idx, test_idx = list(range(len(frames))), []
        train_frames, test_frames = [frames[i] for i in train_idx], [frames[i] for i in test_idx]
        train_path = test_path = single
        test_data = data
    else:
        train_path = folder / f"transforms_{train_split}.json"
        test_path = folder / f"transforms_{test_split}.json"
        data, train_frames, missing, blurry = parse_transforms(train_path, sharpness_threshold)
        if test_path.is_file():
            test_data, test_frames, m2, b2 = parse_transforms(test_path)
        else:
            test_data, test_frames, m2, b2 = data, [], 0, 0
        missing += m2
    if not train_frames:
        raise SceneError(f"{train_path}: no usable frames ({missing} listed images are missing, {blurry} below the "
                         f"sharpness threshold)")
    aabb, aabb_scale = scene_aabb(data, train_path)
    train, alpha_train = build_frames(train_path, data, train_frames, downscale)
    test, alpha_test = build_frames(test_path, test_data, test_frames, downscale)
    return Scene(train, test, aabb, aabb_scale, alpha_train or alpha_test, str(root), missing, blurry)
