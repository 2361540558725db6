"""Camera paths for videos: an orbit (or a gently bobbing spiral) around what the training cameras look at,
keyframes interpolated into frames, and the ``CameraPath`` they make (camera-path files are read by
``tools.camera_files``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


def nearest_point_to_lines(origins: np.ndarray, directions: np.ndarray) -> tuple[np.ndarray, float]:
    """The point closest (least squares) to every line ``origins[i] + t directions[i]`` (both ``[N, 3]``), and
    the condition number of its normal equations (large: the lines are nearly parallel)."""
    d = directions / np.linalg.norm(directions, axis=1, keepdims=True)
    projectors = np.eye(3)[None] - d[:, :, None] * d[:, None, :]  # [N, 3, 3]: onto each line's normal plane
    a, b = projectors.sum(0), np.einsum("nij,nj->i", projectors, origins)
    return np.linalg.lstsq(a, b, rcond=None)[0], float(np.linalg.cond(a))


def look_at_point(c2w: Tensor) -> np.ndarray:
    """The point closest (least squares) to every camera's optical axis. c2w ``[N, 3, 4]`` (ngp: column 2 forward)."""
    return nearest_point_to_lines(c2w[:, :, 3].double().numpy(), c2w[:, :, 2].double().numpy())[0]


def azimuth_range(azimuths: np.ndarray) -> tuple[float, float]:
    """(start, span) of the arc the cameras cover: the full circle when they surround the target,
    else the circle minus its largest empty gap (a capture from one side, like a wall-mounted fox)."""
    a = np.sort(np.mod(azimuths, 2 * math.pi))
    gaps = np.diff(np.concatenate([a, a[:1] + 2 * math.pi]))
    i = int(np.argmax(gaps))
    if gaps[i] <= math.pi / 2:
        return 0.0, 2 * math.pi
    return float(a[(i + 1) % len(a)]), float(2 * math.pi - gaps[i])


def orbit(c2w: Tensor, up: list[float], n_frames: int, spiral: bool = False) -> Tensor:
    """Camera-to-world matrices ``[n_frames, 3, 4]`` (ngp convention: right, down, forward, centre)
    circling the look-at point at the training cameras' median distance and elevation; when the
    cameras cover only part of the circle, the path sweeps that arc and back."""
    target = look_at_point(c2w)
    up_v = np.asarray(up, dtype=np.float64)
    up_v /= np.linalg.norm(up_v)
    offsets = c2w[:, :, 3].double().numpy() - target
    radius = float(np.median(np.linalg.norm(offsets, axis=1)))
    elev = float(np.median(np.arcsin(np.clip(offsets @ up_v / np.linalg.norm(offsets, axis=1), -1, 1))))
    e1 = np.cross(up_v, [1.0, 0.0, 0.0] if abs(up_v[0]) < 0.9 else [0.0, 0.0, 1.0])
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(up_v, e1)
    start, span = azimuth_range(np.arctan2(offsets @ e2, offsets @ e1))
    out = []
    for i in range(n_frames):
        phase = i / n_frames
        az = start + (span * phase if span >= 2 * math.pi else span * (0.5 - 0.5 * math.cos(2 * math.pi * phase)))
        el = elev + (math.radians(15) * math.sin(2 * az) if spiral else 0.0)
        pos = target + radius * (math.cos(el) * (math.cos(az) * e1 + math.sin(az) * e2) + math.sin(el) * up_v)
        fwd = target - pos
        fwd /= np.linalg.norm(fwd)
        right = np.cross(fwd, up_v)  # camera x; the image's y axis points down: -up projected
        right /= np.linalg.norm(right)
        down = np.cross(fwd, right)
        out.append(np.stack([right, down, fwd, pos], axis=1))
    return torch.tensor(np.stack(out), dtype=torch.float32)


# ------------------------------------------------------------------------------------ keyframe paths


def quaternion_to_matrix(q: np.ndarray) -> np.ndarray:
    """Unit quaternion ``[4]`` (x, y, z, w: Eigen's coefficient order, as instant-ngp writes ``R``) -> rotation ``[3, 3]``."""
    x, y, z, w = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def matrix_to_quaternion(m: np.ndarray) -> np.ndarray:
    """Rotation ``[3, 3]`` -> unit quaternion ``[4]`` (x, y, z, w), w >= 0."""
    m = np.asarray(m, dtype=np.float64)
    tr = np.trace(m)
    if tr > 0:
        s = 2 * math.sqrt(tr + 1)
        q = [(m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s, s / 4]
    else:
        i = int(np.argmax(np.diag(m)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2 * math.sqrt(max(1 + m[i, i] - m[j, j] - m[k, k], 1e-30))
        q = [0.0] * 4
        q[i], q[j], q[k], q[3] = s / 4, (m[j, i] + m[i, j]) / s, (m[k, i] + m[i, k]) / s, (m[k, j] - m[j, k]) / s
    quat = np.asarray(q)
    return (quat if quat[3] >= 0 else -quat) / np.linalg.norm(quat)


def slerp(q0: np.ndarray, q1: np.ndarray, t: float) -> np.ndarray:
    """Spherical interpolation of unit quaternions ``[4]`` along the great arc from q0 to q1 (the caller puts
    them in one hemisphere for the shorter rotation: a sign flip here would break the spline's continuity);
    t outside [0, 1] extrapolates."""
    angle = math.acos(max(-1.0, min(1.0, float(np.dot(q0, q1)))))
    if angle < 1e-8:
        q = q0 + t * (q1 - q0)
    else:
        q = (math.sin((1 - t) * angle) * q0 + math.sin(t * angle) * q1) / math.sin(angle)
    return q / np.linalg.norm(q)


def catmull_rom(p: list, u: float, mix) -> np.ndarray:
    """The uniform Catmull-Rom curve through four keys ``p[0..3]`` at ``u`` in [0, 1] between p[1] (u = 0) and
    p[2] (u = 1), built from repeated two-point blends ``mix(a, b, t)`` (Barry and Goldman's pyramid): with a
    straight-line blend it is the cubic Catmull-Rom spline, with ``slerp`` its analogue on rotations. It passes
    through every key and its tangent is continuous across keys."""
    a = [mix(p[0], p[1], u + 1), mix(p[1], p[2], u), mix(p[2], p[3], u - 1)]
    b = [mix(a[0], a[1], (u + 1) / 2), mix(a[1], a[2], u / 2)]
    return mix(b[0], b[1], u)


def lerp(a: np.ndarray, b: np.ndarray, t: float) -> np.ndarray:
    return a + t * (b - a)


def four(keys: list, j: int, mix) -> list:
    """Keys j - 1 .. j + 2 for the segment from key j; past either end, a ghost key continuing the end segment
    (``mix(a, b, 2)``), so evenly spaced keys on a line (or one rotation axis) are passed at an even pace."""
    k = len(keys)
    if k == 1:
        return [keys[0]] * 4

    def key(i: int):
        if i < 0:
            return mix(keys[1], keys[0], 2.0)
        if i >= k:
            return mix(keys[k - 2], keys[k - 1], 2.0)
        return keys[i]

    return [key(j + d) for d in (-1, 0, 1, 2)]


def interpolate_keyframes(c2w: np.ndarray, fov: np.ndarray, n_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """A smooth camera path through K keyframes: c2w ``[K, 3, 4]``, fov ``[K]`` -> ``[n_frames, 3, 4]``,
    ``[n_frames]``. Frame i sits at keyframe parameter ``i (K - 1) / (n_frames - 1)`` (the first and last frames
    are the first and last keys); positions and fields of view follow a Catmull-Rom spline, rotations its
    slerp analogue (``catmull_rom``); ghost keys extend the end segments (``four``)."""
    k = c2w.shape[0]
    quats = [matrix_to_quaternion(m[:, :3]) for m in c2w]
    for i in range(1, k):  # one hemisphere, so each blend takes the short way
        if np.dot(quats[i - 1], quats[i]) < 0:
            quats[i] = -quats[i]
    pos = [m[:, 3] for m in c2w]
    fovs = [np.array([f]) for f in fov]
    out, out_fov = [], []
    for i in range(n_frames):
        s = 0.0 if n_frames == 1 or k == 1 else i * (k - 1) / (n_frames - 1)
        j = min(int(math.floor(s)), max(k - 2, 0))
        u = s - j
        rot = quaternion_to_matrix(catmull_rom(four(quats, j, slerp), u, slerp))
        t = catmull_rom(four(pos, j, lerp), u, lerp)
        out.append(np.concatenate([rot, t[:, None]], axis=1))
        out_fov.append(float(catmull_rom(four(fovs, j, lerp), u, lerp)[0]))
    return np.stack(out), np.array(out_fov)


@dataclass
class CameraPath:
    """The frames of a video: c2w ``[N, 3, 4]`` (ngp), intrinsics ``[N, 4]`` (fx, fy, cx, cy in pixels), one
    image size (w, h), the frame rate the file asks for (None: the tool's), and whether the file gave the size."""

    c2w: Tensor
    intrinsics: Tensor
    size: tuple[int, int]
    fps: float | None = None
    own_size: bool = False

    def scaled(self, max_side: int | None) -> "CameraPath":
        """The same path with the longer image side at most ``max_side`` (None: as it is)."""
        w, h = self.size
        k = 1.0 if max_side is None else min(1.0, max_side / max(w, h))
        if k == 1.0:
            return self
        return CameraPath(
            self.c2w, self.intrinsics * k, (max(1, round(w * k)), max(1, round(h * k))), self.fps, self.own_size
        )


def vertical_fov_intrinsics(fov_deg: np.ndarray, size: tuple[int, int]) -> Tensor:
    """fx, fy, cx, cy ``[N, 4]`` of square-pixel pinhole cameras with vertical fields of view ``fov_deg`` ``[N]``."""
    w, h = size
    f = 0.5 * h / np.tan(np.radians(np.asarray(fov_deg, dtype=np.float64)) / 2)
    return torch.tensor(np.stack([f, f, np.full_like(f, w / 2), np.full_like(f, h / 2)], axis=1), dtype=torch.float32)
