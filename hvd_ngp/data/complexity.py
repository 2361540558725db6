"""How much detail each tile of each training image holds, from OpenCV: edges and Laplacian variance.

Per tile (``shards.TileGrid``) two features of the image's luminance (colour composited over
mid-grey) and of its alpha channel (so silhouettes count whatever the object's colour):

- edge density: the fraction of the tile's pixels on a Canny edge of either (after a 3x3 Gaussian
  blur that keeps JPEG noise from making edges);
- Laplacian variance: the variance of the 3x3 Laplacian over the tile, the classic sharpness
  measure (luminance plus alpha).

``complexity_scores`` mixes them as ``w_edge * e / mean(e) + w_lap * sqrt(v) / mean(sqrt(v))``
(default weights 0.3 / 0.7, as the seed documents describe). Each feature is divided by its mean
over the scene so the weights are shares of the score, not a comparison of unrelated units, and
the variance enters as its square root (the Laplacian's standard deviation): raw variance is
heavy-tailed (one tile with a sharp high-contrast edge outweighs hundreds of textured tiles; see
README's "Rank-aware data loading" for the measurements on fox and lego). Scores average 1.

Features are cached with the scene: ``<scene_cache>/complexity/<key>.npz``, keyed by the image files
(path, size, modification time), the downscale and the tile size, so a second run reads them.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
import torch
from torch import Tensor

from ..cluster import dist
from .shards import TileGrid

VERSION = 3
CANNY_LOW, CANNY_HIGH = 50, 150


def luminance(rgba: np.ndarray) -> np.ndarray:
    """``[H, W, 4]`` uint8 RGBA -> ``[H, W]`` uint8 grey of the colour composited over mid-grey."""
    rgb = rgba[..., :3].astype(np.float32)
    a = rgba[..., 3:4].astype(np.float32) / 255.0
    grey = (rgb * a + 127.5 * (1.0 - a)) @ np.array([0.299, 0.587, 0.114], np.float32)
    return np.clip(grey + 0.5, 0, 255).astype(np.uint8)


def _tile_sums(values: np.ndarray, tile: int) -> np.ndarray:
    """``[H, W]`` -> per-tile sums ``[ceil(H/tile) * ceil(W/tile)]`` (row-major tiles, edge tiles partial)."""
    h, w = values.shape
    th, tw = -(-h // tile), -(-w // tile)
    padded = np.zeros((th * tile, tw * tile), np.float64)
    padded[:h, :w] = values
    return padded.reshape(th, tile, tw, tile).sum(axis=(1, 3)).reshape(-1)


def tile_features(rgba: np.ndarray, tile: int) -> np.ndarray:
    """One image ``[H, W, 4]`` uint8 -> ``[n_tiles, 2]`` float64: edge density and Laplacian variance per tile."""
    channels = [luminance(rgba)]
    alpha = np.ascontiguousarray(rgba[..., 3])
    if alpha.min() < 255:
        channels.append(alpha)
    count = _tile_sums(np.ones(alpha.shape), tile)
    edges = np.zeros(alpha.shape, bool)
    var = np.zeros_like(count)
    for c in channels:
        edges |= cv2.Canny(cv2.GaussianBlur(c, (3, 3), 0), CANNY_LOW, CANNY_HIGH) > 0
        lap = cv2.Laplacian(c, cv2.CV_64F, ksize=3)
        mean = _tile_sums(lap, tile) / count
        var += np.maximum(_tile_sums(lap * lap, tile) / count - mean * mean, 0.0)
    return np.stack([_tile_sums(edges.astype(np.float64), tile) / count, var], axis=1)


def complexity_scores(features: Tensor, weights: tuple[float, float] = (0.3, 0.7)) -> Tensor:
    """``[T, 2]`` features -> ``[T]`` float64 scores, mean 1 (see the module docstring)."""
    f = features.double()
    edge, spread = f[:, 0], f[:, 1].clamp(min=0).sqrt()
    parts = []
    for value, weight in ((edge, weights[0]), (spread, weights[1])):
        mean = float(value.mean()) if value.numel() else 0.0
        parts.append(weight * (value / mean if mean > 0 else torch.zeros_like(value)))
    score = parts[0] + parts[1]
    total = float(score.mean()) if score.numel() else 0.0
    return score / total if total > 0 else torch.ones_like(score)


# ------------------------------------------------------------------------------------ cache


def cache_key(paths: list[Path], downscale: int, tile: int) -> str:
    """Identifies the features of these image files at this downscale and tile size."""
    entries = []
    for p in paths:
        try:
            st = os.stat(p)
            entries.append([str(Path(p).resolve()), st.st_size, st.st_mtime_ns])
        except OSError:
            entries.append([str(p), -1, -1])
    blob = json.dumps(
        {"v": VERSION, "tile": tile, "downscale": downscale, "canny": [CANNY_LOW, CANNY_HIGH], "files": entries}
    )
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def read_cache(path: Path, n_tiles: int) -> Tensor | None:
    try:
        with np.load(path) as data:
            feats = data["features"]
    except (OSError, KeyError, ValueError):
        return None
    return torch.from_numpy(feats).double() if feats.shape == (n_tiles, 2) else None


def write_cache(path: Path, features: Tensor) -> None:
    """Atomic write (temporary file + rename); a failure to write is not an error (the cache is an optimisation)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".complexity-", suffix=".npz", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, features=features.double().numpy())  # float64: a cached run draws as a computed one
        os.replace(tmp, path)
    except OSError:
        pass


def scene_features(
    grid: TileGrid,
    read_image: Callable[[int], np.ndarray],
    paths: list[Path],
    downscale: int,
    cache_dir: str | os.PathLike | None,
) -> tuple[Tensor, bool]:
    """Features ``[T, 2]`` of every tile, identical on every rank, and whether they came from the cache.

    Collective: each rank computes the images ``i % size == rank`` and one Sum-allreduce joins them;
    the cache is used only when every rank can read it. Rank 0 writes it. In an elastic job (no
    collective before the training loop) every rank computes every image, or reads the cache.
    """
    rt = dist.runtime()
    elastic = dist.elastic()
    path = (
        Path(cache_dir).expanduser() / "complexity" / f"{cache_key(paths, downscale, grid.tile)}.npz"
        if cache_dir
        else None
    )
    cached = read_cache(path, grid.n_tiles) if path is not None and path.is_file() else None
    if elastic and cached is not None:
        return cached, True
    if not elastic:
        everyone = dist.allreduce(torch.tensor([0.0 if cached is None else 1.0]), "min", name="complexity.cached")
        if float(everyone[0]) == 1.0:
            assert cached is not None  # the minimum over the ranks is 1: this rank read the cache too
            return cached, True
    rank, size = (0, 1) if elastic else (rt.rank, rt.size)

    def mine() -> Tensor:
        local = torch.zeros(grid.n_tiles, 2, dtype=torch.float64)
        for i in range(rank, grid.n_images, size):
            a, b = int(grid.first[i]), int(grid.first[i + 1])
            local[a:b] = torch.from_numpy(tile_features(read_image(i), grid.tile))
        return local

    if elastic:
        return mine(), False
    local = dist.agree(mine, "computing complexity scores")
    features = dist.allreduce(local, "sum", name="complexity.features")
    if rt.is_root and path is not None:
        write_cache(path, features)
    return features, False
