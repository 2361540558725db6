"""LLFF forward-facing scenes: ``poses_bounds.npy`` plus ``images/`` (and ``images_N/`` downscaled copies).

Each row of ``poses_bounds.npy`` is a 3x5 matrix (camera-to-world 3x4 with rotation columns
down, right, backward; and a column H, W, focal) followed by the near and far depth bounds. As in
the NeRF reference loader, poses are rotated to the right/up/backward convention, scaled so the
nearest bound is 1/0.75, and recentred on their average pose. The scene is then placed in ngp
space so the content between the cameras and the median depth fills the unit cube, and
``aabb_scale`` (a power of two up to 16) is chosen to also hold the far bounds.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch

from ..errors import SceneError
from .cameras import nerf_to_ngp
from .images import IMAGE_EXTENSIONS, decode_images, image_size, stack_images
from .scene import Frames, ImageFiles, Scene
from .transforms import empty_frames

PERM = [1, 2, 0]  # NeRF axes -> ngp axes, as in nerf_to_ngp


def _normalize(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def average_pose(poses: np.ndarray) -> np.ndarray:
    """The mean camera-to-world ``[4, 4]`` of poses ``[N, 3, 4]`` (right, up, backward)."""
    center = poses[:, :, 3].mean(0)
    z = _normalize(poses[:, :, 2].sum(0))
    x = _normalize(np.cross(poses[:, :, 1].sum(0), z))
    y = np.cross(z, x)
    m = np.eye(4)
    m[:3, :4] = np.stack([x, y, z, center], 1)
    return m


def image_folder(root: Path, downscale: int) -> tuple[Path, int]:
    """``images_<downscale>`` when it exists (already downscaled), else ``images`` (downscale at load)."""
    if downscale > 1 and (root / f"images_{downscale}").is_dir():
        return root / f"images_{downscale}", 1
    if not (root / "images").is_dir():
        raise SceneError(f"{root}: an LLFF scene needs an 'images' folder beside poses_bounds.npy")
    return root / "images", downscale


def load_llff_scene(
    scene: str | os.PathLike, holdout_every: int = 8, downscale: int = 1, lazy_train: bool = False
) -> Scene:
    """Load an LLFF scene folder; every ``holdout_every``-th view is a test view (0: none).
    ``lazy_train``: the training images are not decoded (see ``load_transforms_scene``)."""
    root = Path(scene).expanduser()
    path = root / "poses_bounds.npy"
    try:
        arr = np.load(path)
    except (OSError, ValueError) as exc:
        raise SceneError(f"{path}: cannot read ({exc})") from None
    if arr.ndim != 2 or arr.shape[1] != 17 or not np.isfinite(arr).all():
        raise SceneError(f"{path}: expected an [N, 17] array of finite numbers, got shape {list(arr.shape)}")
    poses = arr[:, :15].reshape(-1, 3, 5)
    bounds = arr[:, 15:17].copy()
    if (bounds <= 0).any():
        raise SceneError(f"{path}: near/far bounds must be positive")
    folder, extra_downscale = image_folder(root, downscale)
    files = sorted(p for p in folder.iterdir() if p.suffix in IMAGE_EXTENSIONS)
    if len(files) != len(poses):
        raise SceneError(f"{folder}: {len(files)} images for {len(poses)} poses in {path.name}")
    n = len(files)
    test = [i for i in range(n) if holdout_every > 0 and i % holdout_every == 0]
    train = [i for i in range(n) if i not in set(test)]
    decoded = set(test) if lazy_train else set(range(n))
    images = dict(zip(sorted(decoded), decode_images([files[i] for i in sorted(decoded)], extra_downscale)))
    shapes = {i: (im.shape[1], im.shape[0]) for i, im in images.items()}
    shapes.update({i: image_size(files[i], extra_downscale) for i in range(n) if i not in decoded})
    sizes = set(shapes.values())
    if len(sizes) > 1:
        raise SceneError(f"{folder}: images have different sizes {sorted((h, w) for w, h in sizes)}")
    w_img, h_img = shapes[0]
    h0, w0, focal0 = poses[0, :, 4]
    focal = focal0 * h_img / h0

    c2w = np.concatenate([poses[:, :, 1:2], -poses[:, :, 0:1], poses[:, :, 2:4]], axis=2)  # right, up, back, t
    sc = 1.0 / (bounds.min() * 0.75)
    c2w[:, :, 3] *= sc
    bounds *= sc
    inv = np.linalg.inv(average_pose(c2w))
    c2w = np.einsum("ij,njk->nik", inv, np.concatenate([c2w, np.tile([[[0, 0, 0, 1]]], (len(c2w), 1, 1))], 1))[:, :3]

    centers, forward = c2w[:, :, 3], -c2w[:, :, 2]
    near, far = bounds[:, :1], bounds[:, 1:]
    mid = np.sqrt(near * far)
    content = np.concatenate([centers, centers + forward * near, centers + forward * mid])
    lo, hi = content.min(0), content.max(0)
    scale = 1.0 / float((hi - lo).max())
    offset = 0.5 - ((lo + hi) / 2)[PERM] * scale
    far_pts = (centers + forward * far)[:, PERM] * scale + offset
    reach = float(np.abs(far_pts - 0.5).max()) * 2
    aabb_scale = int(min(16, 2 ** max(0, math.ceil(math.log2(max(reach, 1.0))))))

    ngp = np.stack([nerf_to_ngp(m, scale, offset) for m in c2w]).astype(np.float32)

    def frames(idx: list[int]) -> Frames:
        if not idx:
            return empty_frames()
        lazy = any(i not in images for i in idx)
        return Frames(
            None if lazy else stack_images([images[i] for i in idx])[0],
            torch.from_numpy(ngp[idx]),
            torch.tensor([[focal, focal, w_img / 2, h_img / 2]] * len(idx), dtype=torch.float32),
            torch.zeros(len(idx), 6),
            torch.tensor([[w_img, h_img]] * len(idx), dtype=torch.int64),
            names=[str(files[i]) for i in idx],
            files=ImageFiles([files[i] for i in idx], extra_downscale),
        )

    half = 0.5 * aabb_scale
    aabb = torch.tensor([[0.5 - half] * 3, [0.5 + half] * 3], dtype=torch.float32)
    up = _normalize(average_pose(c2w)[:3, 1][PERM]).tolist()
    return Scene(frames(train), frames(test), aabb, aabb_scale, False, str(root), up=up)
