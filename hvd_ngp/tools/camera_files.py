"""Camera-path files, told apart by their keys: nerfstudio's camera_path.json, instant-ngp's base_cam.json
keyframes, a transforms.json -> ``render.camera_path.CameraPath`` in ngp space. A bad file is a
``CameraPathError`` naming it. Here, above both, because such a file is read with the scene formats' pose
conventions (``data``) and turned into the renderer's frames (``render``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..data.cameras import nerf_to_ngp
from ..data.transforms import load_poses
from ..errors import CameraPathError, SceneError, read_json_object
from ..render.camera_path import CameraPath, interpolate_keyframes, quaternion_to_matrix, vertical_fov_intrinsics


def _field(data: dict, key: str, path: Path, where: str = ""):
    if key not in data:
        raise CameraPathError(f"{path}: {where}'{key}' is missing")
    return data[key]


def _numbers(value, shape: tuple[int, ...], path: Path, what: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise CameraPathError(f"{path}: {what} must be numbers") from None
    if arr.size != int(np.prod(shape)) or not np.isfinite(arr).all():
        raise CameraPathError(f"{path}: {what} must be {int(np.prod(shape))} finite numbers, got {value!r}")
    return arr.reshape(shape)


def _poses(entries: list, key: str, path: Path, pose) -> tuple[list[np.ndarray], list[float]]:
    """Each entry's ``pose(entry, where)`` ``[3, 4]`` (ngp) and ``fov``, entries named ``key[i]`` in errors."""
    c2w, fov = [], []
    for i, e in enumerate(entries):
        where = f"{key}[{i}]."
        if not isinstance(e, dict):
            raise CameraPathError(f"{path}: {key}[{i}] must be an object")
        c2w.append(pose(e, where))
        fov.append(float(_numbers(_field(e, "fov", path, where), (1,), path, f"{where}fov")[0]))
    return c2w, fov


def _instant_ngp_pose(e: dict, path: Path, where: str) -> np.ndarray:
    """An instant-ngp keyframe's camera ``[3, 4]``: rotation from ``R`` (x, y, z, w), centre ``T``."""
    q = _numbers(_field(e, "R", path, where), (4,), path, f"{where}R")
    if np.linalg.norm(q) < 1e-8:
        raise CameraPathError(f"{path}: {where}R is a zero quaternion")
    t = _numbers(_field(e, "T", path, where), (3,), path, f"{where}T")
    return np.concatenate([quaternion_to_matrix(q), t[:, None]], axis=1)


def load_camera_path(
    path: str | Path, scene_size: tuple[int, int], scale: float, offset: list[float], n_frames: int
) -> CameraPath:
    """Read a camera-path file, told apart by its keys:

    - nerfstudio's ``camera_path.json`` (``camera_path``: one entry per frame, ``camera_to_world`` a flattened
      4x4 in the NeRF/OpenGL convention in the scene file's world, ``fov`` vertical in degrees;
      ``render_width``/``render_height``, ``fps``);
    - instant-ngp's ``base_cam.json`` (``path``: keyframes with ``R`` a quaternion (x, y, z, w) and ``T`` in ngp
      space, ``fov`` vertical in degrees): ``n_frames`` frames along the interpolated keyframes
      (``interpolate_keyframes``), at ``scene_size`` (w, h);
    - a transforms.json (``frames`` with ``transform_matrix``; the images may be absent): one frame per camera,
      its intrinsics from the file.

    ``scale``/``offset``: the scene's world -> ngp mapping (``Scene.scale``, ``Scene.offset``). A bad file is a
    ``CameraPathError`` naming it."""
    path = Path(path)
    data = read_json_object(path, CameraPathError, "camera path JSON")
    if "camera_path" in data:
        entries = data["camera_path"]
        if not isinstance(entries, list) or not entries:
            raise CameraPathError(f"{path}: 'camera_path' must be a non-empty list")
        if data.get("camera_type", "perspective") != "perspective":
            raise CameraPathError(f"{path}: camera_type {data['camera_type']!r} is not supported (perspective only)")
        size = (int(_field(data, "render_width", path)), int(_field(data, "render_height", path)))
        if min(size) < 1:
            raise CameraPathError(f"{path}: render_width and render_height must be positive, got {list(size)}")
        c2w, fov = _poses(
            entries,
            "camera_path",
            path,
            lambda e, where: nerf_to_ngp(
                _numbers(_field(e, "camera_to_world", path, where), (4, 4), path, f"{where}camera_to_world"),
                scale,
                np.asarray(offset),
            ),
        )
        fps = data.get("fps")
        return CameraPath(
            torch.tensor(np.stack(c2w), dtype=torch.float32),
            vertical_fov_intrinsics(np.array(fov), size),
            size,
            float(fps) if isinstance(fps, (int, float)) and fps > 0 else None,
            own_size=True,
        )
    if "path" in data:
        keys = data["path"]
        if not isinstance(keys, list) or not keys:
            raise CameraPathError(f"{path}: 'path' must be a non-empty list of keyframes")
        c2w, fov = _poses(keys, "path", path, lambda e, where: _instant_ngp_pose(e, path, where))
        mats, fovs = interpolate_keyframes(np.stack(c2w), np.array(fov), n_frames)
        return CameraPath(
            torch.tensor(mats, dtype=torch.float32), vertical_fov_intrinsics(fovs, scene_size), scene_size
        )
    if "frames" in data:
        try:
            frames = load_poses(path, scene_size)
        except SceneError as exc:
            raise CameraPathError(str(exc)) from None
        return CameraPath(frames.c2w, frames.intrinsics, frames.image_size(0), own_size=True)
    raise CameraPathError(
        f"{path}: not a camera path: expected nerfstudio's 'camera_path', instant-ngp's 'path' "
        "(base_cam.json) or a transforms.json's 'frames'"
    )
