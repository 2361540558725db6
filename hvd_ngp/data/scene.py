"""In-memory scene: posed images per split, plus the bounds the renderer uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from .images import read_masked


@dataclass
class ImageFiles:
    """Where a split's images come from when they are decoded on demand (``Frames.images`` is None):
    one file per frame and the integer downscale applied when decoding."""

    paths: list[Path]
    downscale: int = 1
    masks: list[Path | None] | None = None  # per frame: alpha is zeroed where the mask is zero

    def read(self, index: int) -> np.ndarray:
        """Decode frame ``index`` -> ``[H, W, 4]`` uint8 RGBA (raises ``SceneError`` naming the file)."""
        return read_masked(self.paths[index], self.downscale, self.masks[index] if self.masks else None)

    def subset(self, index: list[int]) -> "ImageFiles":
        return ImageFiles(
            [self.paths[i] for i in index], self.downscale, [self.masks[i] for i in index] if self.masks else None
        )


class FrameFiles(Protocol):
    """Where a split's frames are decoded from on demand: ``ImageFiles`` (one image file per frame) or
    ``packed.PackedFiles`` (memory-mapped shards)."""

    paths: list[Path]  # the source image of each frame (messages, cache keys)
    downscale: int

    def read(self, index: int) -> np.ndarray:
        """Frame ``index`` -> ``[H, W, 4]`` uint8 RGBA."""
        ...

    def subset(self, index: list[int]) -> FrameFiles: ...


@dataclass(init=False)
class Frames:
    """One split's images and cameras.

    images:     ``[N, H, W, 4]`` uint8 RGBA (alpha 255 where the file has none); when images differ in
                size they are padded to the largest, and ``sizes`` tells each one's own. None when the
                images are decoded on demand from ``files`` (training images of large scenes)
    c2w:        ``[N, 3, 4]`` float32, ngp convention (see ``cameras``)
    intrinsics: ``[N, 4]`` float32 fx, fy, cx, cy in pixels
    distortion: ``[N, 6]`` float32 k1, k2, k3, k4, p1, p2 (zeros: none; k1..k4 are the fisheye
                polynomial for fisheye frames)
    sizes:      ``[N, 2]`` int64 width, height of each image (given None: every image's is ``images``' size)
    fisheye:    ``[N]`` bool, equidistant fisheye projection instead of pinhole (given None: all False)
    keep:       ``[N, H, W]`` bool, True where a pixel counts (``--mask_mode exclude``: masked-out pixels are
                never drawn for training nor scored); None: every pixel counts
    """

    images: Tensor | None
    c2w: Tensor
    intrinsics: Tensor
    distortion: Tensor
    sizes: Tensor
    fisheye: Tensor
    names: list[str]
    files: FrameFiles | None
    keep: Tensor | None

    def __init__(
        self,
        images: Tensor | None,
        c2w: Tensor,
        intrinsics: Tensor,
        distortion: Tensor,
        sizes: Tensor | None = None,
        fisheye: Tensor | None = None,
        names: list[str] | None = None,
        files: FrameFiles | None = None,
        keep: Tensor | None = None,
    ) -> None:
        if images is None and (files is None or sizes is None):
            raise ValueError("Frames without decoded images need their files and sizes")
        n = int(c2w.shape[0])
        if sizes is None:
            assert images is not None  # checked above: frames without images come with their sizes
            sizes = torch.tensor([[images.shape[2], images.shape[1]]] * n, dtype=torch.int64).view(n, 2)
        self.images, self.c2w, self.intrinsics, self.distortion = images, c2w, intrinsics, distortion
        self.sizes = sizes
        self.fisheye = torch.zeros(n, dtype=torch.bool) if fisheye is None else fisheye
        self.names = [] if names is None else names
        self.files, self.keep = files, keep
        counts = (self.sizes[:, 0] * self.sizes[:, 1]).cpu()
        self._offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
        self.uniform_size = bool((self.sizes.cpu() == torch.tensor([self.width, self.height])).all())

    def __len__(self) -> int:
        return int(self.c2w.shape[0])

    @property
    def height(self) -> int:
        """Height of the (padded) image tensor; ``sizes`` has each image's own."""
        if self.images is not None:
            return int(self.images.shape[1])
        return int(self.sizes[:, 1].max()) if len(self) else 0

    @property
    def width(self) -> int:
        if self.images is not None:
            return int(self.images.shape[2])
        return int(self.sizes[:, 0].max()) if len(self) else 0

    @property
    def n_pixels(self) -> int:
        return int(self._offsets[-1])

    def image_size(self, index: int) -> tuple[int, int]:
        w, h = self.sizes[index].tolist()
        return int(w), int(h)

    def locate(self, pixel: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Global pixel ids ``[R]`` (image-major, row-major inside each image) -> image, y, x ``[R]``."""
        if self.uniform_size:
            hw = self.height * self.width
            img, rem = pixel // hw, pixel % hw
            return img, rem // self.width, rem % self.width
        offsets = self._offsets.to(pixel.device)
        img = torch.searchsorted(offsets, pixel, right=True) - 1
        rem = pixel - offsets[img]
        w = self.sizes.to(pixel.device)[img, 0]
        return img, rem // w, rem % w

    def subset(self, index: list[int]) -> "Frames":
        idx = torch.as_tensor(index, dtype=torch.long)
        return Frames(
            None if self.images is None else self.images[idx],
            self.c2w[idx],
            self.intrinsics[idx],
            self.distortion[idx],
            self.sizes[idx],
            self.fisheye[idx],
            [self.names[i] for i in index],
            None if self.files is None else self.files.subset(index),
            None if self.keep is None else self.keep[idx],
        )

    def to(self, device: torch.device) -> "Frames":
        return Frames(
            None if self.images is None else self.images.to(device),
            self.c2w.to(device),
            self.intrinsics.to(device),
            self.distortion.to(device),
            self.sizes.to(device),
            self.fisheye.to(device),
            self.names,
            self.files,
            self.keep,
        )


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
    up: list[float] = field(default_factory=lambda: [0.0, 1.0, 0.0])  # ngp space
    scale: float = 0.33  # the scene file's world -> ngp space: p_ngp = cycle(p) * scale + offset (cameras.nerf_to_ngp)
    offset: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])

    def digest(self) -> str:
        """SHA-256 (16 hex digits) of what training sees of the scene: both splits' poses, intrinsics,
        distortion, image sizes and file names, the aabb and aabb_scale. Not the pixels (too slow to
        hash at start) and not the folder, which may be mounted at another path on another node."""
        import hashlib

        h = hashlib.sha256(f"{self.aabb_scale}".encode())
        for frames in (self.train, self.test):
            h.update(f"<{len(frames)}>".encode())
            for t in (frames.c2w, frames.intrinsics, frames.distortion, frames.sizes, frames.fisheye):
                if t is not None:
                    h.update(t.detach().cpu().contiguous().numpy().tobytes())
            h.update("|".join(Path(n).name for n in frames.names).encode())
        h.update(self.aabb.detach().cpu().double().numpy().tobytes())
        return h.hexdigest()[:16]

    def summary(self) -> dict:
        """JSON-friendly description (``python -m hvd_ngp.data info``)."""
        return {
            "source": self.source,
            "train_frames": len(self.train),
            "test_frames": len(self.test),
            "skipped_missing_images": self.skipped_frames,
            "skipped_sharpness": self.skipped_sharpness,
            "resolutions": [list(r) for r in sorted({tuple(r) for r in self.train.sizes.tolist()})],
            "has_alpha": self.has_alpha,
            "aabb_scale": self.aabb_scale,
            "aabb": [[round(float(v), 6) for v in row] for row in self.aabb.tolist()],
        }
