"""Rank-aware ray sampling.

Global pixel ``i`` (image-major, then row, then column) belongs to rank ``i % world_size``: the
shards are disjoint, together cover every training pixel, and interleave spatially so every rank
sees every image. Each rank draws from its shard with its own generator seeded by the GLOBAL rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .cameras import pixel_rays
from .scene import Frames


@dataclass
class RayBatch:
    """origins/directions ``[R, 3]``; rgba ``[R, 4]`` in [0, 1]; pixel ``[R]`` global pixel ids."""

    origins: Tensor
    directions: Tensor
    rgba: Tensor
    pixel: Tensor

    def __len__(self) -> int:
        return int(self.origins.shape[0])


class RaySampler:
    """Draws random training rays from this rank's shard of ``frames`` (kept on ``device``)."""

    def __init__(self, frames: Frames, rank: int, world_size: int, seed: int, device: torch.device,
                 jitter: bool = True) -> None:
        self.frames = frames.to(device)
        self.rank, self.world_size = rank, world_size
        self.device = device
        self.jitter = jitter
        self.has_distortion = bool((frames.distortion != 0).any())
        self.n_pixels = frames.n_pixels
        self.has_fisheye = bool(frames.fisheye.any())
        self.shard_size = (self.n_pixels - rank + world_size - 1) // world_size
        if self.shard_size <= 0:
            raise ValueError(f"rank {rank} owns no pixels: {self.n_pixels} pixels for {world_size} ranks")
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed + rank)

    def shard_pixels(self) -> Tensor:
        """Every global pixel id this rank owns ``[shard_size]`` (for tests and diagnostics)."""
        return torch.arange(self.rank, self.n_pixels, self.world_size, device=self.device)

    def sample(self, n_rays: int) -> RayBatch:
        k = torch.randint(0, self.shard_size, (n_rays,), generator=self.generator, device=self.device)
        pixel = k * self.world_size + self.rank
        return self.rays_for_pixels(pixel)

    def rays_for_pixels(self, pixel: Tensor, jitter: bool | None = None) -> RayBatch:
        """Rays through global pixel ids ``[R]`` (sub-pixel jitter when training)."""
        f = self.frames
        img, y, x = f.locate(pixel)
        if self.jitter if jitter is None else jitter:
            off = torch.rand((pixel.shape[0], 2), generator=self.generator, device=self.device)
        else:
            off = torch.full((pixel.shape[0], 2), 0.5, device=self.device)
        o, d = pixel_rays(f.c2w[img], f.intrinsics[img], x.float() + off[:, 0], y.float() + off[:, 1],
                          f.distortion[img] if self.has_distortion else None,
                          f.fisheye[img] if self.has_fisheye else None)
        rgba = f.images[img, y, x].float() / 255.0
        return RayBatch(o, d, rgba, pixel)


def image_rays(frames: Frames, index: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """All pixel-centre rays of one image (its own size): origins, directions ``[H*W, 3]``."""
    w, h = frames.image_size(index)
    y, x = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    n = h * w
    c2w = frames.c2w[index].to(device).expand(n, 3, 4)
    intr = frames.intrinsics[index].to(device).expand(n, 4)
    dist = frames.distortion[index].to(device).expand(n, 6)
    fish = frames.fisheye[index].to(device).expand(n)
    return pixel_rays(c2w, intr, x.reshape(-1).float() + 0.5, y.reshape(-1).float() + 0.5, dist, fish)


def image_pixels(frames: Frames, index: int) -> Tensor:
    """One image's RGBA pixels ``[H*W, 4]`` uint8 (without padding)."""
    w, h = frames.image_size(index)
    return frames.images[index, :h, :w].reshape(-1, 4)
