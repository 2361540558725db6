"""Packed scenes (``hvd-ngp-data pack``): decoded, downscaled uint8 RGBA images in shard files that every
rank memory-maps, so start-up copies pages instead of decoding JPEGs.

A packed scene is a folder with ``packed.json`` (cameras, splits, bounds, and where each frame's
pixels lie) and shard files ``{split}_{k:03d}.u8``: the frames of one contiguous block of the split,
each ``[h, w, 4]`` uint8 row-major, back to back. The split (``holdout_every``) and the downscale
are fixed when packing. Training frames are read on demand from the shards (``PackedFiles``):
a rank that streams only its own images touches only their pages; the test frames are loaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import SceneError, read_json_object
from .images import stack_images
from .scene import Frames, Scene

PACKED_FILE = "packed.json"
FORMAT = "hvd_ngp.packed/1"


@dataclass
class PackedFiles:
    """A split's frames in memory-mapped shards; the same interface as ``ImageFiles`` (``read``, ``subset``)."""

    root: Path
    shards: list[str]
    frames: list[tuple[int, int]]  # per frame: shard index, byte offset
    sizes: list[tuple[int, int]]  # per frame: width, height
    paths: list[Path]  # the source image of each frame (messages, complexity cache keys)
    downscale: int = 1
    _maps: dict[int, np.memmap] = field(default_factory=dict, repr=False)

    def _map(self, shard: int) -> np.memmap:
        if shard not in self._maps:
            path = self.root / self.shards[shard]
            try:
                self._maps[shard] = np.memmap(path, dtype=np.uint8, mode="r")
            except (OSError, ValueError) as exc:
                raise SceneError(f"{path}: cannot map the packed shard ({exc})") from None
        return self._maps[shard]

    def read(self, index: int) -> np.ndarray:
        """Frame ``index`` -> ``[H, W, 4]`` uint8 RGBA (a copy out of the mapped shard)."""
        shard, offset = self.frames[index]
        w, h = self.sizes[index]
        data = self._map(shard)
        if offset + w * h * 4 > data.size:
            raise SceneError(f"{self.root / self.shards[shard]}: truncated (frame {index} ends past the file)")
        return np.array(data[offset : offset + w * h * 4]).reshape(h, w, 4)

    def subset(self, index: list[int]) -> "PackedFiles":
        return PackedFiles(
            self.root,
            self.shards,
            [self.frames[i] for i in index],
            [self.sizes[i] for i in index],
            [self.paths[i] for i in index],
            self.downscale,
            self._maps,
        )


def is_packed(path: str | os.PathLike) -> bool:
    p = Path(path).expanduser()
    return p.is_dir() and (p / PACKED_FILE).is_file()


def pack_scene(scene: Scene, out: str | os.PathLike, shards: int, holdout_every: int, downscale: int) -> dict:
    """Write ``scene`` (its images decoded) as a packed scene in ``out``; ``shards`` files per split (at most
    one per frame). Returns the written ``packed.json`` object."""
    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {  # packed.json
        "format": FORMAT,
        "source": scene.source,
        "holdout_every": holdout_every,
        "downscale": downscale,
        "aabb": scene.aabb.tolist(),
        "aabb_scale": scene.aabb_scale,
        "has_alpha": scene.has_alpha,
        "up": scene.up,
        "skipped_frames": scene.skipped_frames,
        "skipped_sharpness": scene.skipped_sharpness,
        "splits": {},
    }
    for split, frames in (("train", scene.train), ("test", scene.test)):
        n = len(frames)
        k = max(1, min(shards, n))
        names, where = [], []
        for s in range(k):
            name = f"{split}_{s:03d}.u8"
            names.append(name)
            offset = 0
            with open(out / name, "wb") as f:
                for i in range(s * n // k, (s + 1) * n // k):
                    if frames.images is not None:
                        im = frames.images[i]
                    else:
                        assert frames.files is not None  # Frames' invariant: without decoded images, its files
                        im = torch.from_numpy(frames.files.read(i))
                    w, h = frames.image_size(i)
                    f.write(np.ascontiguousarray(im[:h, :w].numpy()).tobytes())
                    where.append([s, offset])
                    offset += w * h * 4
        meta["splits"][split] = {
            "shards": names if n else [],
            "frames": where,
            "sizes": frames.sizes.tolist(),
            "names": frames.names,
            "c2w": frames.c2w.tolist(),
            "intrinsics": frames.intrinsics.tolist(),
            "distortion": frames.distortion.tolist(),
            "fisheye": frames.fisheye.tolist(),
        }
    tmp = out / (PACKED_FILE + ".tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, out / PACKED_FILE)
    return meta


def _split_frames(root: Path, split: dict, downscale: int, load: bool, path: Path) -> Frames:
    try:
        sizes = [(int(w), int(h)) for w, h in split["sizes"]]
        files = PackedFiles(
            root,
            list(split["shards"]),
            [(int(shard), int(offset)) for shard, offset in split["frames"]],
            sizes,
            [Path(n) for n in split["names"]],
            downscale,
        )
        c2w = torch.tensor(split["c2w"], dtype=torch.float32).view(-1, 3, 4)
        intrinsics = torch.tensor(split["intrinsics"], dtype=torch.float32).view(-1, 4)
        distortion = torch.tensor(split["distortion"], dtype=torch.float32).view(-1, 6)
        fisheye = torch.tensor(split["fisheye"], dtype=torch.bool).view(-1)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise SceneError(f"{path}: malformed split ({type(exc).__name__}: {exc})") from None
    n = len(sizes)
    if not (len(files.frames) == len(files.paths) == n == len(c2w) == len(intrinsics) == len(distortion)):
        raise SceneError(f"{path}: a split's per-frame lists differ in length")
    size_t = torch.tensor(sizes, dtype=torch.int64).view(n, 2)
    if n == 0:
        return Frames(torch.zeros(0, 1, 1, 4, dtype=torch.uint8), c2w, intrinsics, distortion)
    images = stack_images([files.read(i) for i in range(n)])[0] if load else None
    return Frames(images, c2w, intrinsics, distortion, size_t, fisheye, [str(p) for p in files.paths], files)


def load_packed_scene(
    scene: str | os.PathLike, holdout_every: int = 0, downscale: int = 1, lazy_train: bool = False
) -> Scene:
    """Load a packed scene; ``holdout_every`` must be the packed one (0 accepts it) and ``downscale`` 1 or the
    packed one. ``lazy_train``: the training frames stay in their shards (``Frames.files`` reads them)."""
    root = Path(scene).expanduser()
    path = root / PACKED_FILE
    meta = read_json_object(path, SceneError, "packed scene")
    if meta.get("format") != FORMAT:
        raise SceneError(f"{path}: 'format' is {meta.get('format')!r}, expected {FORMAT!r} (pack the scene again)")
    packed_holdout, packed_down = int(meta.get("holdout_every", 0)), int(meta.get("downscale", 1))
    if holdout_every not in (0, packed_holdout):
        raise SceneError(
            f"{path}: packed with --holdout_every {packed_holdout}, asked for {holdout_every} "
            "(pack again to change the split)"
        )
    if downscale not in (1, packed_down):
        raise SceneError(f"{path}: packed at --downscale {packed_down}, asked for {downscale} (pack again)")
    splits = meta.get("splits")
    if not isinstance(splits, dict) or "train" not in splits or "test" not in splits:
        raise SceneError(f"{path}: missing 'splits' with 'train' and 'test'")
    train = _split_frames(root, splits["train"], packed_down, not lazy_train, path)
    test = _split_frames(root, splits["test"], packed_down, True, path)
    return Scene(
        train,
        test,
        torch.tensor(meta["aabb"], dtype=torch.float32),
        int(meta["aabb_scale"]),
        bool(meta["has_alpha"]),
        str(root),
        int(meta.get("skipped_frames", 0)),
        int(meta.get("skipped_sharpness", 0)),
        list(meta.get("up", [0.0, 1.0, 0.0])),
    )
