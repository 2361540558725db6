"""Rank-aware ray sampling: this rank's shard of tiles, a sampling distribution over them, rays on the device.

The shard (``shards.shard_tiles``) is a pure function of (seed, rank, world size, epoch). Within it a
tile is drawn from a CDF (``torch.searchsorted``: no host synchronisation), then a pixel uniformly
inside the tile, then a sub-pixel position (jitter). The CDF mixes per-tile scores (complexity or
error map) with a uniform floor,

    p(tile) = (1 - floor) * n_t s_t / sum(n s) + floor * n_t / sum(n)       (n_t: the tile's pixels)

so no pixel's probability falls below ``floor`` times its uniform one, and each ray carries the
importance weight ``(n_t / sum n) / p(tile)`` (at most ``1 / floor``) that makes a weighted mean over
the batch an unbiased estimate of the mean over the shard's pixels. Uniform sampling has no weights.

With ``frames.keep`` (``--mask_mode exclude``) a tile's pixel count is its kept pixels and the pixel is
drawn uniformly from the tile's list of kept pixels (``shards.KeptPixels``): masked-out pixels are never
drawn, and the CDF, the weights and the shard sizes are over kept pixels.

With ``resolution`` F > 1 (``--dynamic_resolution``) a ray goes through a random point of an F x F
pixel block and its colour is the block's mean: training sees the images at 1/F resolution.

Each rank draws with its own generator seeded by the GLOBAL rank (by the replica index under
``--model_parallel``: the K ranks of a replica draw the same rays, each rendering its region). Pixel colours come from a pixel
store (``pixels``): on the device, everything happens there; in host memory, batches are drawn
and gathered on the CPU one step ahead in a background thread and copied asynchronously.

``fused`` (``--fused_draw``): with images on a CUDA device, pinhole cameras without distortion and
full resolution, everything after the random numbers is one Triton kernel (``draw_triton``) instead
of about forty small ones; the random numbers, and so the pixels and colours, are the same.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import Tensor

from ..errors import SceneError
from ..triton_support import triton_available
from .cameras import DirectionMaps, camera_rays, pixel_rays
from .pixels import StackedPixels, StreamedPixels
from .scene import Frames
from .shards import KeptPixels, TileGrid, auto_tile_size, shard_tiles, shard_units

#: the fused draw: auto (one Triton kernel per batch on a CUDA GPU where it applies; ``--fused_draw auto``),
#: on (also under the Triton interpreter on a CPU; an error where it does not apply; tests only), off (the torch path)
FUSED_MODES = ("auto", "on", "off")


@dataclass
class RayBatch:
    """origins/directions ``[R, 3]``; rgba ``[R, 4]`` in [0, 1]; pixel ``[R]`` global pixel ids;
    weight ``[R]`` importance weights (None: all 1); tile ``[R]`` tile ids (None when not drawn by tile)."""

    origins: Tensor
    directions: Tensor
    rgba: Tensor
    pixel: Tensor
    weight: Tensor | None = None
    tile: Tensor | None = None

    def __len__(self) -> int:
        return int(self.origins.shape[0])


@dataclass
class PixelDraw:
    """Pixels chosen for one batch, before their rays: image ``[R]``, continuous pixel coordinates u, v
    ``[R]`` (pixel centres at +0.5), pixel and tile ids ``[R]``, weights ``[R]`` or None, rgba ``[R, 4]``."""

    img: Tensor
    u: Tensor
    v: Tensor
    pixel: Tensor
    tile: Tensor
    weight: Tensor | None
    rgba: Tensor

    def _map(self, fn: Callable[[Tensor], Tensor]) -> "PixelDraw":
        w = None if self.weight is None else fn(self.weight)
        return PixelDraw(fn(self.img), fn(self.u), fn(self.v), fn(self.pixel), fn(self.tile), w, fn(self.rgba))

    def slice(self, n: int) -> "PixelDraw":
        return self._map(lambda t: t[:n])

    def to(self, device: torch.device) -> "PixelDraw":
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin(self) -> "PixelDraw":
        return self._map(lambda t: t.pin_memory())


#: A NeRF step draws a few thousand rays, so a full pass over a chunk of photos (millions of pixels)
#: would pin training to one chunk for minutes: measured on fox (2 H200s, 30 s, chunks of 10 images),
#: passes=1.0 never rotated and the model saw 10 of 43 images (test PSNR 14.97 dB against 20.95 with
#: every image resident). 0.02 rotates every few seconds there; decoding runs behind it.
STREAM_PASSES = 0.02


class RaySampler:
    """Draws training rays from this rank's shard of ``frames``; rays and colours end on ``device``.

    ``store``: where the pixels live (default: all images on ``device``). ``tile_size`` 0: automatic.
    ``shard_by``: 'tile' or 'image' (streamed scenes shard whole images). ``floor``: the uniform share.
    ``stream_passes``: rays drawn per resident pixel before a streamed store swaps in its next chunk.
    ``fused``: one of ``FUSED_MODES`` (see the module docstring); ``fused_why_not`` says why it is not used.
    """

    def __init__(
        self,
        frames: Frames,
        rank: int,
        world_size: int,
        seed: int,
        device: torch.device,
        jitter: bool = True,
        *,
        store: StackedPixels | StreamedPixels | None = None,
        tile_size: int = 0,
        shard_by: str = "tile",
        epoch: int = 0,
        floor: float = 0.25,
        prefetch: bool = True,
        stream_passes: float = STREAM_PASSES,
        fused: str = "off",
    ) -> None:
        if not 0.0 < floor <= 1.0:
            raise ValueError(f"the uniform floor must be in (0, 1], got {floor}")
        self.frames = frames
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.device = device
        self.jitter = jitter
        self.floor = floor
        self.shard_by = shard_by
        self.stream_passes = stream_passes
        self.store = store if store is not None else StackedPixels(frames, device, on_device=True)
        self.index_device = self.store.gather_device
        self.c2w, self.intrinsics = frames.c2w.to(device), frames.intrinsics.to(device)
        self.distortion, self.fisheye = frames.distortion.to(device), frames.fisheye.to(device)
        self.has_distortion = bool((frames.distortion != 0).any())
        self.has_fisheye = bool(frames.fisheye.any())
        self.n_pixels = frames.n_pixels
        self.direction_maps = (
            DirectionMaps(frames.intrinsics, frames.distortion, frames.fisheye, frames.sizes, device)
            if DirectionMaps.worthwhile(frames.distortion, frames.fisheye, frames.intrinsics, frames.sizes)
            else None
        )
        self.tile_size = auto_tile_size(frames.sizes, tile_size)
        self.grid = TileGrid.build(frames.sizes, self.tile_size)
        # masked-out pixels (``frames.keep``): each tile counts and lists only its kept pixels, so the tile CDF,
        # the importance weights and the shard sizes are over kept pixels, and a pixel is drawn from the list
        self.kept = None if frames.keep is None else KeptPixels.build(self.grid, frames.keep.cpu())
        if self.kept is not None:
            self.grid = replace(self.grid, count=self.kept.count)
            self._kept = self.kept.to(self.index_device)
        self._grid = self.grid.to(self.index_device)
        self.generator = torch.Generator(device=self.index_device)
        self.generator.manual_seed(seed + rank)
        self.scores: Tensor | None = None
        self.resolution = 1
        self._version = 0
        self._pending: tuple[int, int, Future] | None = None
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="hvd_ngp-sampler")
            if prefetch and not self.store.on_device
            else None
        )
        self._drawn_since_rotation = 0
        self.epoch = -1
        self.set_epoch(epoch)
        if fused not in FUSED_MODES:
            raise ValueError(f"fused must be one of {FUSED_MODES}, got {fused!r}")
        self.fused = fused
        self.fused_why_not = "off" if fused == "off" else self._fused_reason(fused)
        if fused == "on" and self.fused_why_not:
            raise ValueError(f"the fused ray draw does not apply here: {self.fused_why_not}")
        if self.fused_why_not is None:  # the kernel's tables, once: int64 tile fields, float32 cameras
            G = self._grid
            self._tiles = {k: getattr(G, k).to(torch.int64).contiguous() for k in ("image", "x0", "y0", "w", "h")}
            self._pixel_offset = G.pixel_offset.to(torch.int64).contiguous()
            self._width = G.width.to(torch.int64).contiguous()
            self._c2w32, self._intr32 = self.c2w.float().contiguous(), self.intrinsics.float().contiguous()

    def _fused_reason(self, mode: str) -> str | None:
        """None when batches can be drawn by the Triton kernel, else why not."""
        reasons = [
            (mode == "auto" and self.device.type != "cuda", "the device is not a CUDA GPU"),
            (not triton_available(self.device.type), "Triton cannot run on this device"),
            (not (isinstance(self.store, StackedPixels) and self.store.on_device), "the images are not on the device"),
            (self.has_distortion or self.has_fisheye, "the cameras have lens distortion or are fisheye"),
            (self.kept is not None, "masks exclude pixels (--mask_mode exclude)"),
        ]
        found = [why for bad, why in reasons if bad]
        return "; ".join(found) if found else None

    @property
    def version(self) -> int:
        """Changes whenever what the next draw returns can change (shard, scores, resolution, resident images)."""
        return self._version

    @property
    def draws_on_device(self) -> bool:
        """Draws are device work only (images resident on the device; no background thread, no streaming),
        so a batch can be drawn ahead and un-drawn by restoring ``generator``'s state."""
        return self.store.on_device

    # -------------------------------------------------------------------------------- state changes

    def set_epoch(self, epoch: int) -> None:
        """Take this rank's shard for ``epoch`` (a streamed store starts decoding it)."""
        self._drain()
        self.epoch = int(epoch)
        self.shard = shard_tiles(self.grid, self.shard_by, self.seed, self.rank, self.world_size, self.epoch)
        if isinstance(self.store, StreamedPixels):
            order = shard_units(self.grid.n_images, self.seed, self.rank, self.world_size, self.epoch)
            self.store.set_order(order.tolist())
        self.shard_size = int(self.grid.count[self.shard].sum())
        self._rebuild()

    def set_scores(self, scores: Tensor | None) -> None:
        """Per-tile sampling scores ``[T]`` (>= 0; complexity or error map), or None for uniform sampling."""
        self._drain()
        self.scores = None if scores is None else scores.detach().double().cpu().clamp(min=0)
        self._rebuild()

    def set_resolution(self, factor: int) -> None:
        """Train at 1/``factor`` resolution (a power of two dividing the tile size; 1: full resolution)."""
        if factor < 1 or factor & (factor - 1) or self.tile_size % factor:
            raise ValueError(
                f"resolution factor {factor} must be a power of two dividing the tile size {self.tile_size}"
            )
        self._drain()
        self.resolution = int(factor)
        self._version += 1

    def _rebuild(self) -> None:
        """The CDF over the tiles that can be drawn now: the shard, limited to the resident images."""
        tiles = self.shard
        resident = self.store.resident()
        if resident is not None:
            tiles = tiles[torch.isin(self.grid.image[tiles], resident)]
        if self.kept is not None:
            tiles = tiles[self.grid.count[tiles] > 0]
            if not len(tiles):
                raise SceneError(
                    f"rank {self.rank}: every pixel of its share of the training images is masked out "
                    "(--mask_mode exclude); check the masks (0 = ignore) or use fewer ranks"
                )
        n = self.grid.count[tiles].double()
        uniform = n / n.sum()
        weight = None
        p = uniform
        if self.scores is not None:
            mass = n * self.scores[tiles]
            total = float(mass.sum())
            if total > 0:
                p = (1.0 - self.floor) * mass / total + self.floor * uniform
                weight = (uniform / p).float()
        cdf = torch.cumsum(p, 0)
        cdf /= cdf[-1].clone()
        self._active = tiles.to(self.index_device)
        self._cdf = cdf.to(self.index_device)
        self._weight = None if weight is None else weight.to(self.index_device)
        self.probability = p  # [A] per active tile, for tests and diagnostics
        self.active_pixels = int(n.sum())
        self._version += 1

    def _drain(self) -> None:
        """Wait for and discard a batch being prepared in the background (state is about to change)."""
        if self._pending is not None:
            self._pending[2].result()
            self._pending = None

    # -------------------------------------------------------------------------------- drawing

    def shard_pixels(self) -> Tensor:
        """Every global pixel id this rank owns this epoch ``[shard_size]``, sorted (tests and diagnostics)."""
        return self.grid.pixels_of(self.shard).sort().values.to(self.device)

    def _offsets(self, n: int, jitter: bool) -> Tensor:
        """Sub-pixel positions ``[n, 2]`` in [0, 1) on the index device: random with ``jitter``, else centres."""
        if jitter:
            return torch.rand((n, 2), generator=self.generator, device=self.index_device)
        return torch.full((n, 2), 0.5, device=self.index_device)

    def _draw(self, n: int) -> PixelDraw:
        """Choose ``n`` pixels on the index device (tile from the CDF, pixel in the tile, sub-pixel offset)."""
        g, dev, G, F = self.generator, self.index_device, self._grid, self.resolution
        k = torch.searchsorted(self._cdf, torch.rand(n, generator=g, device=dev, dtype=torch.float64), right=True)
        k = k.clamp_(max=self._active.numel() - 1)
        tile = self._active[k]
        img, x0, y0, tw, th = G.image[tile], G.x0[tile], G.y0[tile], G.w[tile], G.h[tile]
        pick = torch.rand((n, 2), generator=g, device=dev)
        if self.kept is None:
            px = x0 + torch.minimum((pick[:, 0] * tw).long(), tw - 1)
            py = y0 + torch.minimum((pick[:, 1] * th).long(), th - 1)
        else:  # one of the tile's kept pixels, uniformly
            kept = G.count[tile]
            at = self._kept.start[tile] + torch.minimum((pick[:, 0] * kept).long(), kept - 1)
            local = self._kept.offset[at].long()
            px, py = x0 + local % tw, y0 + local // tw
        off = self._offsets(n, self.jitter)
        if F == 1:
            u, v = px.float() + off[:, 0], py.float() + off[:, 1]
            rgba = self.store.gather(img, py, px)
        else:  # the F x F block holding the pixel (clipped at the tile's edge), its mean colour
            bx, by = x0 + (px - x0) // F * F, y0 + (py - y0) // F * F
            bw, bh = (
                torch.minimum(x0 + tw - bx, torch.full_like(bx, F)),
                torch.minimum(y0 + th - by, torch.full_like(by, F)),
            )
            u, v = bx.float() + off[:, 0] * bw.float(), by.float() + off[:, 1] * bh.float()
            px = torch.minimum(u.long(), bx + bw - 1)
            py = torch.minimum(v.long(), by + bh - 1)
            rgba = torch.zeros((n, 4), device=dev)
            for dy in range(F):
                for dx in range(F):
                    inside = ((dx < bw) & (dy < bh)).float()[:, None]
                    rgba += inside * self.store.gather(
                        img, torch.minimum(by + dy, by + bh - 1), torch.minimum(bx + dx, bx + bw - 1)
                    )
            rgba /= (bw * bh).float()[:, None]
        pixel = G.pixel_offset[img] + py * G.width[img] + px
        weight = None if self._weight is None else self._weight[k]
        return PixelDraw(img, u, v, pixel, tile, weight, rgba)

    def _draw_host(self, n: int) -> PixelDraw:
        d = self._draw(n)
        return d.pin() if self.device.type == "cuda" else d

    def _take(self, n: int) -> PixelDraw:
        """A host-drawn batch: the one prepared in the background when still valid, then prepare the next."""
        batch = None
        if self._pending is not None:
            version, size, future = self._pending
            self._pending = None
            ready = future.result()
            if version == self._version and size >= n:
                batch = ready.slice(n)
        if batch is None:
            batch = self._draw_host(n)
        if self._pool is not None:
            size = -(-int(n * 1.125) // 64) * 64
            self._pending = (self._version, size, self._pool.submit(self._draw_host, size))
        return batch

    def _maybe_rotate(self, n: int) -> None:
        """Streamed stores: after ``stream_passes`` rays per resident pixel, swap in the next chunk."""
        if not isinstance(self.store, StreamedPixels):
            return
        self._drawn_since_rotation += n
        if self._drawn_since_rotation >= self.stream_passes * self.active_pixels:
            self._drain()
            if self.store.rotate():
                self._rebuild()
            self._drawn_since_rotation = 0

    def sample(self, n_rays: int) -> RayBatch:
        """``n_rays`` training rays from this rank's shard (no host synchronisation on the device path)."""
        self._maybe_rotate(n_rays)
        if self.fused_why_not is None and self.resolution == 1:
            return self._draw_fused(n_rays)
        d = self._draw(n_rays) if self.store.on_device else self._take(n_rays).to(self.device)
        o, dirs = self._rays(d.img, d.u, d.v)
        return RayBatch(o, dirs, d.rgba, d.pixel, d.weight, d.tile)

    def _draw_fused(self, n: int) -> RayBatch:
        """``_draw`` + ``_rays`` in one kernel, from the same random numbers drawn in the same order."""
        from .draw_triton import draw_rays

        assert isinstance(self.store, StackedPixels)  # _fused_reason: the fused draw reads the stacked images

        g, dev = self.generator, self.index_device
        u = torch.rand(n, generator=g, device=dev, dtype=torch.float64)
        pick = torch.rand((n, 2), generator=g, device=dev)
        off = torch.rand((n, 2), generator=g, device=dev) if self.jitter else None
        out = draw_rays(
            u,
            pick,
            off,
            self._cdf,
            self._active,
            self._tiles,
            self._weight,
            self.store.images,
            self._pixel_offset,
            self._width,
            self._c2w32,
            self._intr32,
        )
        return RayBatch(out["origins"], out["directions"], out["rgba"], out["pixel"], out["weight"], out["tile"])

    def rays_for_pixels(self, pixel: Tensor, jitter: bool | None = None) -> RayBatch:
        """Rays through global pixel ids ``[R]`` (sub-pixel jitter when training), full resolution, no weights."""
        img, y, x = self.frames.locate(pixel.to(self.index_device))
        off = self._offsets(pixel.shape[0], self.jitter if jitter is None else jitter)
        rgba = self.store.gather(img, y, x).to(self.device)
        img, u, v = (
            img.to(self.device),
            (x.float() + off[:, 0]).to(self.device),
            (y.float() + off[:, 1]).to(self.device),
        )
        o, d = self._rays(img, u, v)
        return RayBatch(
            o, d, rgba, pixel.to(self.device), None, self.grid.tile_of(img, x.to(self.device), y.to(self.device))
        )

    def _rays(self, img: Tensor, u: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        c2w = self.c2w[img]
        if self.direction_maps is not None:
            d = torch.einsum("nij,nj->ni", c2w[:, :, :3], self.direction_maps.directions(img, u, v))
            return c2w[:, :, 3], d / d.norm(dim=-1, keepdim=True)
        return pixel_rays(
            c2w,
            self.intrinsics[img],
            u,
            v,
            self.distortion[img] if self.has_distortion else None,
            self.fisheye[img] if self.has_fisheye else None,
        )

    def stop_prefetch(self) -> None:
        """Stop drawing batches ahead (idempotent); the store stays open for another sampler."""
        self._drain()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def close(self) -> None:
        """Stop the background threads and close the store (idempotent)."""
        self.stop_prefetch()
        self.store.close()


def image_rays(frames: Frames, index: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """All pixel-centre rays of one image (its own size): origins, directions ``[H*W, 3]`` (``camera_rays``)."""
    w, h = frames.image_size(index)
    y, x = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    return camera_rays(
        frames.c2w[index].to(device),
        frames.intrinsics[index].to(device),
        x.reshape(-1).float() + 0.5,
        y.reshape(-1).float() + 0.5,
        frames.distortion[index].to(device),
        bool(frames.fisheye[index]),
    )


def image_pixels(frames: Frames, index: int) -> Tensor:
    """One image's RGBA pixels ``[H*W, 4]`` uint8 (without padding)."""
    w, h = frames.image_size(index)
    assert frames.images is not None, "image_pixels reads a decoded split (the test split always is)"
    return frames.images[index, :h, :w].reshape(-1, 4)
