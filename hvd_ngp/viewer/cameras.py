"""The browser's camera in hvd_ngp's terms and back.

viser's cameras and hvd_ngp's poses share one convention (OpenCV's: the camera's x right, y down, z
forward), so a browser camera (position, quaternion ``wxyz``, vertical field of view) is a ``[3, 4]``
camera-to-world in ngp space without any axis change.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..data import Frames
from ..render.camera_path import matrix_to_quaternion, quaternion_to_matrix


def quaternion_matrix(wxyz) -> np.ndarray:
    """Unit quaternion (w, x, y, z: viser's order) -> rotation ``[3, 3]``."""
    w, x, y, z = np.asarray(wxyz, dtype=np.float64)
    return quaternion_to_matrix(np.array([x, y, z, w]))


def matrix_quaternion(r: np.ndarray) -> np.ndarray:
    """Rotation ``[3, 3]`` -> unit quaternion (w, x, y, z: viser's order) with w >= 0."""
    x, y, z, w = matrix_to_quaternion(r)
    return np.array([w, x, y, z])


def camera_frames(position, wxyz, fov_y: float, width: int, height: int) -> Frames:
    """One pinhole camera (no image) at ``position`` ``[3]`` turned by ``wxyz``, vertical field of view
    ``fov_y`` radians, ``width`` x ``height`` pixels, principal point at the centre."""
    c2w = np.concatenate([quaternion_matrix(wxyz), np.asarray(position, dtype=np.float64).reshape(3, 1)], axis=1)
    f = 0.5 * height / math.tan(0.5 * fov_y)
    return Frames(
        torch.zeros(1, 1, 1, 4, dtype=torch.uint8),
        torch.tensor(c2w, dtype=torch.float32)[None],
        torch.tensor([[f, f, 0.5 * width, 0.5 * height]], dtype=torch.float32),
        torch.zeros(1, 6),
        torch.tensor([[width, height]]),
        torch.zeros(1, dtype=torch.bool),
    )


def vertical_fov(frames: Frames, index: int) -> float:
    """Vertical field of view of a pinhole view of ``frames``, radians."""
    _, h = frames.image_size(index)
    return 2.0 * math.atan(0.5 * h / float(frames.intrinsics[index, 1]))


def look_from(frames: Frames, index: int, target: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(position, look-at point, up) for a browser camera placed as view ``index`` of ``frames``: the look-at
    point lies on the view's axis as far away as ``target`` (the orbit centre)."""
    c2w = frames.c2w[index].double().numpy()
    position, forward = c2w[:, 3], c2w[:, 2]
    distance = max(float(np.dot(np.asarray(target) - position, forward)), 1e-3)
    return position, position + distance * forward, -c2w[:, 1]
