"""Rays against axis-aligned boxes: where a ray enters and leaves the scene's aabb (marching) or a model-parallel
region's box (``regions``). The Triton marcher (``march_triton``) computes the same slab test in its kernel."""

from __future__ import annotations

import torch
from torch import Tensor


def intersect_aabb(origins: Tensor, directions: Tensor, aabb: Tensor) -> tuple[Tensor, Tensor]:
    """Slab test. origins/directions ``[N, 3]``, aabb ``[2, 3]`` -> t_near, t_far ``[N]`` (t_far < t_near: miss)."""
    inv = 1.0 / torch.where(directions.abs() < 1e-9, torch.full_like(directions, 1e-9), directions)
    t0 = (aabb[0] - origins) * inv
    t1 = (aabb[1] - origins) * inv
    t_near = torch.minimum(t0, t1).amax(dim=-1).clamp(min=0.0)
    t_far = torch.maximum(t0, t1).amin(dim=-1)
    return t_near, t_far
