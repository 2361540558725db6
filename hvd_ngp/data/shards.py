"""Which training pixels each rank owns: tiles of pixels, dealt out by a seeded permutation per epoch.

The training images are cut into square tiles (``TileGrid``; edge tiles are smaller). A shard is a
set of units — tiles, or whole images for scenes streamed from disk — chosen by
``shard_units(n_units, seed, rank, world_size, epoch)``: one permutation of all units, seeded by
(seed, epoch) and identical on every rank, dealt round-robin to the ranks. So the shards are
disjoint, together cover the scene, hold within one unit of the same count, change with the epoch,
and are rebuilt for a new world size by calling the same pure function again (Horovod elastic).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import ConfigError

#: the auto tile size grows (doubling from ``DEFAULT_TILE``) until the scene has at most this many tiles
MAX_TILES = 1 << 22
DEFAULT_TILE = 32


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit generator seed from (seed, epoch); independent of the rank, so every rank draws the same permutation."""
    digest = hashlib.sha256(f"hvd_ngp.shards:{int(seed)}:{int(epoch)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def shard_units(n_units: int, seed: int, rank: int, world_size: int, epoch: int) -> Tensor:
    """The units (tile or image ids) that ``rank`` of ``world_size`` owns in ``epoch``: ``[~n_units / world_size]``
    int64, in the permutation's order (random, not sorted). A pure function of its arguments."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of size {world_size}")
    if n_units < world_size:
        raise ConfigError(
            f"the scene has {n_units} shard unit(s) for {world_size} ranks: every rank needs at least one "
            "(use a smaller --tile_size, or --shard_by tile)"
        )
    gen = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(n_units, generator=gen)[rank::world_size]


def auto_tile_size(sizes: Tensor, requested: int = 0) -> int:
    """``requested`` if positive, else ``DEFAULT_TILE`` doubled until the scene has at most ``MAX_TILES`` tiles."""
    if requested > 0:
        return int(requested)
    tile = DEFAULT_TILE
    while tile < 4096 and count_tiles(sizes, tile) > MAX_TILES:
        tile *= 2
    return tile


def count_tiles(sizes: Tensor, tile: int) -> int:
    s = sizes.cpu().long()
    return int(((s[:, 0] + tile - 1) // tile * ((s[:, 1] + tile - 1) // tile)).sum()) if len(s) else 0


@dataclass
class TileGrid:
    """Every training image cut into ``tile`` x ``tile`` pixel tiles (edge tiles smaller), image-major,
    then row, then column. Per tile ``[T]`` int64: ``image``, ``x0``, ``y0``, ``w``, ``h``, ``count``
    (pixels); ``first`` ``[N+1]``: image i owns tiles ``first[i]:first[i+1]``; ``pixel_offset``
    ``[N+1]``: global pixel ids as in ``Frames.locate``; ``width`` ``[N]``."""

    tile: int
    image: Tensor
    x0: Tensor
    y0: Tensor
    w: Tensor
    h: Tensor
    count: Tensor
    first: Tensor
    pixel_offset: Tensor
    width: Tensor

    @staticmethod
    def build(sizes: Tensor, tile: int) -> "TileGrid":
        """sizes ``[N, 2]`` (width, height) -> the tile grid."""
        if tile <= 0:
            raise ConfigError(f"--tile_size must be positive, got {tile}")
        sizes = sizes.cpu().long()
        images, x0s, y0s, ws, hs, per_image = [], [], [], [], [], []
        for i, (w, h) in enumerate(sizes.tolist()):
            ty, tx = torch.meshgrid(torch.arange(0, h, tile), torch.arange(0, w, tile), indexing="ij")
            x0, y0 = tx.reshape(-1), ty.reshape(-1)
            images.append(torch.full_like(x0, i))
            x0s.append(x0)
            y0s.append(y0)
            ws.append((w - x0).clamp(max=tile))
            hs.append((h - y0).clamp(max=tile))
            per_image.append(x0.numel())
        cat = (lambda parts: torch.cat(parts)) if images else (lambda parts: torch.zeros(0, dtype=torch.long))
        w, h = cat(ws), cat(hs)
        first = torch.zeros(len(sizes) + 1, dtype=torch.long)
        first[1:] = torch.cumsum(torch.tensor(per_image, dtype=torch.long), 0) if per_image else 0
        pix = torch.zeros(len(sizes) + 1, dtype=torch.long)
        if len(sizes):
            pix[1:] = torch.cumsum(sizes[:, 0] * sizes[:, 1], 0)
        return TileGrid(int(tile), cat(images), cat(x0s), cat(y0s), w, h, w * h, first, pix, sizes[:, 0].clone())

    @property
    def n_tiles(self) -> int:
        return int(self.image.numel())

    @property
    def n_images(self) -> int:
        return int(self.width.numel())

    def tiles_of_images(self, images: Tensor) -> Tensor:
        """All tile ids of the given images ``[k]`` -> ``[sum of their tiles]`` (in image order given)."""
        parts = [torch.arange(int(self.first[i]), int(self.first[i + 1])) for i in images.tolist()]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)

    def tile_of(self, image: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Tile id of pixels (image, x, y) ``[R]``."""
        first, width = self.first.to(image.device), self.width.to(image.device)
        per_row = (width[image] + self.tile - 1) // self.tile
        return first[image] + (y // self.tile) * per_row + x // self.tile

    def pixels_of(self, tiles: Tensor) -> Tensor:
        """Every global pixel id inside ``tiles`` ``[k]`` -> ``[their pixels]`` (for tests and diagnostics)."""
        out = []
        for t in tiles.tolist():
            img, x0, y0, w, h = (int(a[t]) for a in (self.image, self.x0, self.y0, self.w, self.h))
            ys, xs = torch.meshgrid(torch.arange(y0, y0 + h), torch.arange(x0, x0 + w), indexing="ij")
            out.append(int(self.pixel_offset[img]) + ys.reshape(-1) * int(self.width[img]) + xs.reshape(-1))
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)

    def to(self, device: torch.device) -> "TileGrid":
        return TileGrid(
            self.tile,
            *(
                getattr(self, k).to(device)
                for k in ("image", "x0", "y0", "w", "h", "count", "first", "pixel_offset", "width")
            ),
        )


@dataclass
class KeptPixels:
    """The pixels that count (``Frames.keep``, ``--mask_mode exclude``), listed tile by tile: ``count`` ``[T]``
    int64 kept pixels per tile, ``start`` ``[T]`` int64 where each tile's list begins in ``offset`` ``[V]`` int32,
    a kept pixel's place in its tile (row-major: ``(y - y0) * w + (x - x0)``)."""

    count: Tensor
    start: Tensor
    offset: Tensor

    @staticmethod
    def build(grid: TileGrid, keep: Tensor) -> "KeptPixels":
        """``keep`` ``[N, H, W]`` bool (padding False) -> the kept pixels of ``grid``'s tiles."""
        tiles, offsets = [], []
        for i in range(grid.n_images):  # one image at a time: the index tensors stay image-sized
            ys, xs = keep[i].nonzero(as_tuple=True)
            tile = grid.tile_of(torch.full_like(xs, i), xs, ys)
            order = torch.sort(tile, stable=True).indices
            tile = tile[order]
            tiles.append(tile)
            offsets.append(((ys[order] - grid.y0[tile]) * grid.w[tile] + xs[order] - grid.x0[tile]).to(torch.int32))
        tile = torch.cat(tiles) if tiles else torch.zeros(0, dtype=torch.long)
        count = torch.bincount(tile, minlength=grid.n_tiles)
        start = torch.cumsum(count, 0) - count
        return KeptPixels(count, start, torch.cat(offsets) if offsets else torch.zeros(0, dtype=torch.int32))

    def to(self, device: torch.device) -> "KeptPixels":
        return KeptPixels(self.count.to(device), self.start.to(device), self.offset.to(device))


def shard_tiles(grid: TileGrid, by: str, seed: int, rank: int, world_size: int, epoch: int) -> Tensor:
    """This rank's tile ids ``[k]`` (sorted) when sharding by ``'tile'`` or by ``'image'``."""
    if by == "tile":
        return shard_units(grid.n_tiles, seed, rank, world_size, epoch).sort().values
    if by == "image":
        return grid.tiles_of_images(shard_units(grid.n_images, seed, rank, world_size, epoch).sort().values)
    raise ConfigError(f"--shard_by must be 'tile' or 'image', got {by!r}")


def image_bytes(sizes: Tensor, bytes_per_pixel: int) -> int:
    """Bytes of the padded image stack ``[N, H_max, W_max, 4]`` (what ``Frames.images`` holds)."""
    if not len(sizes):
        return 0
    return int(len(sizes) * int(sizes[:, 0].max()) * int(sizes[:, 1].max()) * bytes_per_pixel)
