"""Camera paths for videos: an orbit (or a gently bobbing spiral) around what the training cameras look at."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


def look_at_point(c2w: Tensor) -> np.ndarray:
    """The point closest (least squares) to every camera's optical axis. c2w ``[N, 3, 4]`` (ngp: column 2 forward)."""
    o = c2w[:, :, 3].double().numpy()
    d = c2w[:, :, 2].double().numpy()
    d = d / np.linalg.norm(d, axis=1, keepdims=True)
    a = np.zeros((3, 3))
    b = np.zeros(3)
    for oi, di in zip(o, d):
        p = np.eye(3) - np.outer(di, di)
        a += p
        b += p @ oi
    return np.linalg.lstsq(a, b, rcond=None)[0]


def orbit(c2w: Tensor, up: list[float], n_frames: int, spiral: bool = False) -> Tensor:
    """Camera-to-world matrices ``[n_frames, 3, 4]`` (ngp convention: right, down, forward, centre)
    circling the look-at point at the training cameras' median distance and elevation."""
    target = look_at_point(c2w)
    up_v = np.asarray(up, dtype=np.float64)
    up_v /= np.linalg.norm(up_v)
    offsets = c2w[:, :, 3].double().numpy() - target
    radius = float(np.median(np.linalg.norm(offsets, axis=1)))
    elev = float(np.median(np.arcsin(np.clip(offsets @ up_v / np.linalg.norm(offsets, axis=1), -1, 1))))
    e1 = np.cross(up_v, [1.0, 0.0, 0.0] if abs(up_v[0]) < 0.9 else [0.0, 0.0, 1.0])
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(up_v, e1)
    out = []
    for i in range(n_frames):
        az = 2 * math.pi * i / n_frames
        el = elev + (math.radians(15) * math.sin(2 * az) if spiral else 0.0)
        pos = target + radius * (math.cos(el) * (math.cos(az) * e1 + math.sin(az) * e2) + math.sin(el) * up_v)
        fwd = target - pos
        fwd /= np.linalg.norm(fwd)
        right = np.cross(fwd, up_v)  # camera x; the image's y axis points down: -up projected
        right /= np.linalg.norm(right)
        down = np.cross(fwd, right)
        out.append(np.stack([right, down, fwd, pos], axis=1))
    return torch.tensor(np.stack(out), dtype=torch.float32)
