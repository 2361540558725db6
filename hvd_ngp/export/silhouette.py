"""A mesh checked the way people look at it: its silhouette, ray-cast with trimesh from a camera, against the
trained field's opacity mask from the same camera."""

from __future__ import annotations

import numpy as np
import torch

from ..data import Frames
from ..data.sampler import image_rays

#: a pixel belongs to the field's mask where its rendered opacity exceeds this
MASK_OPACITY = 0.5


def mesh_silhouette(mesh, frames: Frames, index: int) -> np.ndarray:
    """Whether each pixel's ray hits ``mesh`` (a ``trimesh.Trimesh`` in ngp space) -> bool ``[H, W]`` (Embree when
    the embreex package is installed, else trimesh's own ray tests)."""
    o, d = image_rays(frames, index, torch.device("cpu"))
    w, h = frames.image_size(index)
    hit = mesh.ray.intersects_any(o.double().numpy(), d.double().numpy())
    return np.asarray(hit, dtype=bool).reshape(h, w)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two bool masks (1 when both are empty)."""
    union = int(np.logical_or(a, b).sum())
    return 1.0 if union == 0 else int(np.logical_and(a, b).sum()) / union
