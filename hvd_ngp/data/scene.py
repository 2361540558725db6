"""In-memory scene: posed images per split, plus the bounds the renderer uses."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class Frames:
    """One split's images and cameras.

    images:     ``[N, H, W, 4]`` uint8 RGBA (alpha 255 where the file has none)
    c2w:        ``[N, 3, 4]`` float32, ngp convention (see ``cameras``)
    intrinsics: ``[N, 4]`` float32 fx, fy, cx, cy in pixels
    distortion: ``[N, 6]`` float32 k1, k2, k3, k4, p1, p2 (zeros: pinhole)
    """

    images: Tensor
    c2w: Tensor
    intrinsics: Tensor
    distortion: Tensor
    names: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def height(self) -> int:
        return int(self.images.shape[1])

    @property
    def width(self) -> int:
        return int(self.images.shape[2])

    def subset(self, index: list[int]) -> "Frames":
        idx = torch.as_tensor(index, dtype=torch.long)
        return Frames(self.images[idx], self.c2w[idx], self.intrinsics[idx], self.distortion[idx],
                      [self.names[i] for i in index])

    def to(self, device: torch.device) -> "Frames":
        return Frames(self.images.to(device), self.c2w.to(device), self.intrinsics.to(device),
                      self.distortion.to(device), self.names)


@dataclass
class Scene:
    """A loaded scene. ``aabb`` ``[2, 3]`` bounds the radiance field in ngp space."""

    train: Frames
    test: Frames
    aabb: Tensor
    aabb_scale: int
    has_alpha: bool
    source: str
    skipped_frames: int = 0
    skipped_sharpness: int = 0

    def summary(self) -> dict:
        """JSON-friendly description (``python -m hvd_ngp.data info``)."""
        return {
            "source": self.source,
            "train_frames": len(self.train),
            "test_frames": len(self.test),
            "skipped_missing_images": self.skipped_frames,
            "skipped_sharpness": self.skipped_sharpness,
            "resolution": [self.train.width, self.train.height],
            "has_alpha": self.has_alpha,
            "aabb_scale": self.aabb_scale,
            "aabb": [[round(float(v), 6) for v in row] for row in self.aabb.tolist()],
        }
