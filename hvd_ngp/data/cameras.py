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


def nerf_to_ngp_points(p: np.ndarray, scale: float, offset) -> np.ndarray:
    """Points ``[N, 3]`` in the scene file's world -> ngp space (``nerf_to_ngp`` on positions)."""
    return np.asarray(p, dtype=np.float64)[:, [1, 2, 0]] * scale + np.asarray(offset, dtype=np.float64)


def ngp_to_nerf_points(p: np.ndarray, scale: float, offset) -> np.ndarray:
    """Points ``[N, 3]`` in ngp space -> the scene file's world (the inverse of ``nerf_to_ngp`` on positions)."""
    q = (np.asarray(p, dtype=np.float64) - np.asarray(offset, dtype=np.float64)) / scale
    return q[:, [2, 0, 1]]


def pixel_rays(
    c2w: Tensor,
    intrinsics: Tensor,
    u: Tensor,
    v: Tensor,
    distortion: Tensor | None = None,
    fisheye: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
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
        d_cam = torch.where(
            fisheye[:, None], fisheye_directions(x, y, distortion), pinhole_directions(x, y, distortion)
        )
    else:
        d_cam = pinhole_directions(x, y, distortion)
    d = torch.einsum("nij,nj->ni", c2w[:, :, :3], d_cam)
    d = d / d.norm(dim=-1, keepdim=True)
    return c2w[:, :, 3].clone(), d


def camera_rays(
    c2w: Tensor, intrinsics: Tensor, u: Tensor, v: Tensor, distortion: Tensor, fisheye: bool
) -> tuple[Tensor, Tensor]:
    """``pixel_rays`` for the points ``u, v`` ``[N]`` of one camera: c2w ``[3, 4]``, intrinsics ``[4]``,
    distortion ``[6]``, ``fisheye`` its projection. Only that projection's directions are computed, the Newton
    solve runs only for a non-zero distortion and stops at ``MAP_TOL`` (a host sync per iteration), and the
    rotation is one ``[N, 3] x [3, 3]`` product: a whole image's rays in tens of kernels, not hundreds.
    Returns origins ``[N, 3]`` and unit directions ``[N, 3]``."""
    fx, fy, cx, cy = intrinsics.unbind(-1)
    x, y = (u - cx) / fx, (v - cy) / fy
    dist = distortion[None] if bool((distortion != 0).any()) else None
    solve = fisheye_directions if fisheye else pinhole_directions
    d = solve(x, y, dist, tol=MAP_TOL) @ c2w[:, :3].T
    d = d / d.norm(dim=-1, keepdim=True)
    return c2w[:, 3].expand_as(d).contiguous(), d


def pinhole_directions(x: Tensor, y: Tensor, distortion: Tensor | None, tol: float | None = None) -> Tensor:
    """Normalised image coordinates ``[N]`` -> camera-space directions ``[N, 3]`` (z forward). ``distortion``
    ``[N, 6]`` (or ``[1, 6]`` for one camera); ``tol``: see ``undistort``."""
    if distortion is not None:
        x, y = undistort(x, y, distortion, tol=tol)
    return torch.stack([x, y, torch.ones_like(x)], dim=-1)


def converged(step: Tensor, tol: float | None) -> bool:
    """Whether a Newton solve may stop: its largest update ``step`` is below ``tol`` (None: never; a host sync)."""
    if tol is None:
        return False
    return not step.numel() or float(step.abs().max()) < tol


def fisheye_directions(x: Tensor, y: Tensor, distortion: Tensor | None, tol: float | None = None) -> Tensor:
    """Equidistant fisheye: the radius is the (distorted) angle from the axis; OpenCV's fisheye
    polynomial theta_d = theta (1 + k1 theta^2 + k2 theta^4 + k3 theta^6 + k4 theta^8) is inverted
    by Newton iterations (``tol``: see ``undistort``)."""
    theta_d = torch.sqrt(x * x + y * y)
    theta = theta_d.clone()
    if distortion is not None:
        k1, k2, k3, k4 = distortion[:, :4].unbind(-1)
        for _ in range(10):
            t2 = theta * theta
            f = fisheye_distort(theta, k1, k2, k3, k4) - theta_d
            df = 1 + t2 * (3 * k1 + t2 * (5 * k2 + t2 * (7 * k3 + t2 * 9 * k4)))
            step = f / df.clamp(min=1e-6)
            theta = theta - step
            if converged(step, tol):
                break
    scale = torch.where(theta_d > 1e-9, torch.sin(theta) / theta_d.clamp(min=1e-9), torch.ones_like(theta))
    return torch.stack([x * scale, y * scale, torch.cos(theta)], dim=-1)


def fisheye_distort(theta: Tensor, k1: Tensor, k2: Tensor, k3: Tensor, k4: Tensor) -> Tensor:
    """OpenCV's fisheye polynomial: the angle from the axis ``theta`` -> the distorted angle (the image radius in
    normalised coordinates) theta (1 + k1 theta^2 + k2 theta^4 + k3 theta^6 + k4 theta^8); any broadcast shapes."""
    t2 = theta * theta
    return theta * (1 + t2 * (k1 + t2 * (k2 + t2 * (k3 + t2 * k4))))


def distort(x: Tensor, y: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """OpenCV radial-tangential model: undistorted normalised coords -> distorted ones. k ``[N, 6]``."""
    k1, k2, k3, k4, p1, p2 = k.unbind(-1)
    r2 = x * x + y * y
    radial = 1 + r2 * (k1 + r2 * (k2 + r2 * (k3 + r2 * k4)))
    xd = x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x)
    yd = y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y
    return xd, yd


def undistort(
    xd: Tensor, yd: Tensor, k: Tensor, iterations: int = 10, tol: float | None = None
) -> tuple[Tensor, Tensor]:
    """Invert ``distort`` by Newton iterations with the model's analytic Jacobian. ``tol``: stop as soon as no
    coordinate moves by more than this (one host sync per iteration: for precomputed maps, where Newton's
    quadratic convergence ends the solve after 3-4 iterations; None: always ``iterations``, no sync)."""
    k1, k2, k3, k4, p1, p2 = k.unbind(-1)
    x, y = xd.clone(), yd.clone()
    for _ in range(iterations):
        r2 = x * x + y * y
        radial = 1 + r2 * (k1 + r2 * (k2 + r2 * (k3 + r2 * k4)))
        d_radial = k1 + r2 * (2 * k2 + r2 * (3 * k3 + r2 * 4 * k4))  # d radial / d r2
        fx = x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x) - xd
        fy = y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y - yd
        j11 = radial + 2 * x * x * d_radial + 2 * p1 * y + 6 * p2 * x
        j12 = 2 * x * y * d_radial + 2 * p1 * x + 2 * p2 * y
        j22 = radial + 2 * y * y * d_radial + 6 * p1 * y + 2 * p2 * x
        det = j11 * j22 - j12 * j12
        det = torch.where(det.abs() < 1e-12, torch.full_like(det, 1e-12), det)
        step_x, step_y = (j22 * fx - j12 * fy) / det, (-j12 * fx + j11 * fy) / det
        x, y = x - step_x, y - step_y
        if converged(torch.maximum(step_x.abs(), step_y.abs()), tol):
            break
    return x, y


#: Newton's stopping step for the direction maps, in normalised coordinates (1e-3 pixel at f = 1000 px): the
#: convergence is quadratic, so the step after it would be about its square, far below float32's resolution
MAP_TOL = 1e-6


class DirectionMaps:
    """Camera-space ray directions precomputed at every pixel corner of each distinct camera model
    (intrinsics, distortion, projection, size), interpolated bilinearly for sub-pixel positions.

    Undistorting (a Newton solve) for every training ray costs dozens of small kernels per step;
    with the maps, a distorted or fisheye camera costs four gathers. The interpolation error of the
    smooth distortion over one pixel is far below a pixel's angular size.
    maps ``[M, H+1, W+1, 3]``; model ``[N]``: each frame's model.
    """

    MAX_MODELS = 8

    def __init__(
        self, intrinsics: Tensor, distortion: Tensor, fisheye: Tensor, sizes: Tensor, device: torch.device
    ) -> None:
        keys = torch.cat(
            [
                intrinsics.cpu().double(),
                distortion.cpu().double(),
                fisheye.cpu().double()[:, None],
                sizes.cpu().double(),
            ],
            dim=1,
        )
        unique, model = torch.unique(keys, dim=0, return_inverse=True)
        self.model = model.to(device)
        w_max, h_max = int(sizes[:, 0].max()), int(sizes[:, 1].max())
        maps = torch.zeros(len(unique), h_max + 1, w_max + 1, 3, dtype=torch.float32)
        v, u = torch.meshgrid(
            torch.arange(h_max + 1, dtype=torch.float64), torch.arange(w_max + 1, dtype=torch.float64), indexing="ij"
        )
        for m, key in enumerate(unique):
            fx, fy, cx, cy = key[:4]
            dist = key[4:10][None].float()  # one camera: broadcast, not an [H*W, 6] copy
            # solved in float32, the maps' own precision (1e-7 of a normalised coordinate: 1e-4 pixel at f = 1375)
            x, y = ((u - cx) / fx).reshape(-1).float(), ((v - cy) / fy).reshape(-1).float()
            solve = fisheye_directions if key[10] > 0 else pinhole_directions
            d = solve(x, y, dist, tol=MAP_TOL)
            maps[m] = d.view(h_max + 1, w_max + 1, 3).float()
        self.maps = maps.to(device)

    @staticmethod
    def worthwhile(distortion: Tensor, fisheye: Tensor, intrinsics: Tensor, sizes: Tensor) -> bool:
        """Distorted or fisheye cameras, in few enough distinct models to hold their maps."""
        if not (bool((distortion != 0).any()) or bool(fisheye.any())):
            return False
        keys = torch.cat([intrinsics.cpu(), distortion.cpu(), fisheye.cpu().float()[:, None], sizes.cpu().float()], 1)
        return len(torch.unique(keys, dim=0)) <= DirectionMaps.MAX_MODELS

    def directions(self, frame: Tensor, u: Tensor, v: Tensor) -> Tensor:
        """Camera-space directions ``[R, 3]`` at continuous pixel coordinates ``u, v`` ``[R]`` of frames ``[R]``."""
        _, hp, wp, _ = self.maps.shape
        m = self.model[frame]
        i0 = u.floor().clamp(0, wp - 2)
        j0 = v.floor().clamp(0, hp - 2)
        fu, fv = (u - i0)[:, None], (v - j0)[:, None]
        i, j = i0.long(), j0.long()
        top = self.maps[m, j, i] * (1 - fu) + self.maps[m, j, i + 1] * fu
        bottom = self.maps[m, j + 1, i] * (1 - fu) + self.maps[m, j + 1, i + 1] * fu
        return top * (1 - fv) + bottom * fv
