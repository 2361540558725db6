"""Camera conventions and ray generation.

Poses are stored in instant-ngp's convention ("ngp space"): a camera-to-world matrix ``[3, 4]``
whose columns are the camera's right, down and forward axes and its centre, with the scene mapped
by ``scale`` and ``offset`` so that the region of interest lies in the unit cube. Files in the
NeRF/Blender convention (right, up, backward; z up) are converted by ``nerf_to_ngp``, exactly as
instant-ngp's loader does, so a scene that trains there trains here.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def nerf_to_ngp(m: np.ndarray, scale: float, offset: np.ndarray) -> np.ndarray:
    """NeRF/Blender camera-to-world ``[3|4, 4]`` -> ngp camera-to-world ``[3, 4]``.

    World axes cycle (x, y, z) -> (y, z, x); the camera's up and backward axes flip to down and
    forward; the centre is scaled and offset.
    """
    m = np.asarray(m, dtype=np.float64)
    out = np.empty((3, 4), dtype=np.float64)
    perm = [1, 2, 0]
    out[:, 0] = m[perm, 0]
    out[:, 1] = -m[perm, 1]
    out[:, 2] = -m[perm, 2]
    out[:, 3] = m[perm, 3] * scale + np.asarray(offset, dtype=np.float64)
    return out


def pixel_rays(c2w: Tensor, intrinsics: Tensor, u: Tensor, v: Tensor, distortion: Tensor | None = None,
               fisheye: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Rays through image-plane points.

    c2w:        ``[N, 3, 4]`` ngp-space camera-to-world per ray
    intrinsics: ``[N, 4]`` fx, fy, cx, cy in pixels
    u, v:       ``[N]`` continuous pixel coordinates (pixel centres at +0.5)
    distortion: ``[N, 6]`` OpenCV k1, k2, k3, k4, p1, p2 (pinhole) or fisheye k1..k4, or None
    fisheye:    ``[N]`` bool: equidistant fisheye (radius = f * angle) instead of pinhole, or None
    returns origins ``[N, 3]`` and unit directions ``[N, 3]``
    """
    fx, fy, cx, cy = intrinsics.unbind(-1)
    x = (u - cx) / fx
    y = (v - cy) / fy
    if fisheye is not None:
        d_cam = torch.where(fisheye[:, None], fisheye_directions(x, y, distortion),
                            pinhole_directions(x, y, distortion))
    else:
        d_cam = pinhole_directions(x, y, distortion)
    d = torch.einsum("nij,nj->ni", c2w[:, :, :3], d_cam)
    d = d / d.norm(dim=-1, keepdim=True)
    return c2w[:, :, 3].clone(), d


def pinhole_directions(x: Tensor, y: Tensor, distortion: Tensor | None) -> Tensor:
    """Normalised image coordinates ``[N]`` -> camera-space directions ``[N, 3]`` (z forward)."""
    if distortion is not None:
        x, y = undistort(x, y, distortion)
    return torch.stack([x, y, torch.ones_like(x)], dim=-1)


def fisheye_directions(x: Tensor, y: Tensor, distortion: Tensor | None) -> Tensor:
    """Equidistant fisheye: the radius is the (distorted) angle from the axis; OpenCV's fisheye
    polynomial theta_d = theta (1 + k1 theta^2 + k2 theta^4 + k3 theta^6 + k4 theta^8) is inverted
    by Newton iterations."""
    theta_d = torch.sqrt(x * x + y * y)
    theta = theta_d.clone()
    if distortion is not None:
        k1, k2, k3, k4 = distortion[:, :4].unbind(-1)
        for _ in range(10):
            t2 = theta * theta
            f = theta * (1 + t2 * (k1 + t2 * (k2 + t2 * (k3 + t2 * k4)))) - theta_d
            df = 1 + t2 * (3 * k1 + t2 * (5 * k2 + t2 * (7 * k3 + t2 * 9 * k4)))
            theta = theta - f / df.clamp(min=1e-6)
    scale = torch.where(theta_d > 1e-9, torch.sin(theta) / theta_d.clamp(min=1e-9), torch.ones_like(theta))
    return torch.stack([x * scale, y * scale, torch.cos(theta)], dim=-1)


def distort(x: Tensor, y: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """OpenCV radial-tangential model: undistorted normalised coords -> distorted ones. k ``[N, 6]``."""
    k1, k2, k3, k4, p1, p2 = k.unbind(-1)
    r2 = x * x + y * y
    radial = 1 + r2 * (k1 + r2 * (k2 + r2 * (k3 + r2 * k4)))
    xd = x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x)
    yd = y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y
    return xd, yd


def undistort(xd: Tensor, yd: Tensor, k: Tensor, iterations: int = 10) -> tuple[Tensor, Tensor]:
    """Invert ``distort`` by Newton iterations (as instant-ngp does for its rays)."""
    if not bool((k != 0).any()):
        return xd, yd
    x, y = xd.clone(), yd.clone()
    eps = 1e-6
    for _ in range(iterations):
        fx_, fy_ = distort(x, y, k)
        rx, ry = fx_ - xd, fy_ - yd
        ax, ay = distort(x + eps, y, k)
        bx, by = distort(x, y + eps, k)
        j11, j21 = (ax - fx_) / eps, (ay - fy_) / eps
        j12, j22 = (bx - fx_) / eps, (by - fy_) / eps
        det = j11 * j22 - j12 * j21
        det = torch.where(det.abs() < 1e-12, torch.full_like(det, 1e-12), det)
        x = x - (j22 * rx - j12 * ry) / det
        y = y - (-j21 * rx + j11 * ry) / det
    return x, y


def intersect_aabb(origins: Tensor, directions: Tensor, aabb: Tensor) -> tuple[Tensor, Tensor]:
    """Slab test. origins/directions ``[N, 3]``, aabb ``[2, 3]`` -> t_near, t_far ``[N]`` (t_far < t_near: miss)."""
    inv = 1.0 / torch.where(directions.abs() < 1e-9, torch.full_like(directions, 1e-9), directions)
    t0 = (aabb[0] - origins) * inv
    t1 = (aabb[1] - origins) * inv
    t_near = torch.minimum(t0, t1).amax(dim=-1).clamp(min=0.0)
    t_far = torch.maximum(t0, t1).amin(dim=-1)
    return t_near, t_far
