"""Training rays drawn in one Triton kernel: twin of ``RaySampler._draw`` + ``RaySampler._rays`` (pinhole
cameras without distortion, images on the device, full resolution).

The torch path draws a batch in about forty small kernels (the tile's CDF search, a dozen gathers, the
pixel pick, the colour gather, the camera maths), each a host-side launch; the graphed step is
launch-bound on the host, so those launches cost more than the GPU work. Here the random numbers still
come from the sampler's generator, in the same calls and order as the torch path (so a batch can be
un-drawn by restoring its state, and checkpoints resume the same stream); everything after them is
one launch per batch:

1. the tile: the first CDF entry above the uniform draw (``torch.searchsorted(cdf, u, right=True)``),
   a branch-free binary search in float64;
2. the pixel in the tile and its sub-pixel position, its global id and the tile's importance weight;
3. its colour from the stacked images (uint8 / 255, or float16);
4. the ray through it: origin the camera centre, unit direction ``c2w[:, :3] @ ((u - cx) / fx, (v - cy) / fy, 1)``.
"""

from __future__ import annotations

from typing import TypedDict

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 128


@triton.jit
def _draw_rays(
    u_ptr,
    pick_ptr,
    off_ptr,
    cdf_ptr,
    A,
    active_ptr,
    t_img_ptr,
    t_x0_ptr,
    t_y0_ptr,
    t_w_ptr,
    t_h_ptr,
    weight_ptr,
    images_ptr,
    s_img,
    s_y,
    s_x,
    pix_off_ptr,
    width_ptr,
    c2w_ptr,
    intr_ptr,
    o_ptr,
    d_ptr,
    rgba_ptr,
    pixel_ptr,
    tile_ptr,
    w_out_ptr,
    n,
    STEPS: tl.constexpr,
    JITTER: tl.constexpr,
    WEIGHTED: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = r < n
    # 1. k = #{cdf <= u}, clamped to the last tile: searchsorted(right=True) in STEPS halvings of [0, A)
    u = tl.load(u_ptr + r, mask=m, other=0.0)
    lo = tl.zeros((BLOCK,), tl.int64)
    hi = tl.zeros((BLOCK,), tl.int64) + A
    for _ in tl.static_range(STEPS):
        open_ = lo < hi
        mid = (lo + hi) // 2
        c = tl.load(cdf_ptr + mid, mask=m & open_, other=0.0)
        right = c <= u
        lo = tl.where(open_ & right, mid + 1, lo)
        hi = tl.where(open_ & ~right, mid, hi)
    k = tl.minimum(lo, A - 1)
    tile = tl.load(active_ptr + k, mask=m, other=0)
    # 2. the pixel in the tile, its sub-pixel position, its global id
    img = tl.load(t_img_ptr + tile, mask=m, other=0)
    x0 = tl.load(t_x0_ptr + tile, mask=m, other=0)
    y0 = tl.load(t_y0_ptr + tile, mask=m, other=0)
    tw = tl.load(t_w_ptr + tile, mask=m, other=1)
    th = tl.load(t_h_ptr + tile, mask=m, other=1)
    p0 = tl.load(pick_ptr + r * 2, mask=m, other=0.0)
    p1 = tl.load(pick_ptr + r * 2 + 1, mask=m, other=0.0)
    px = x0 + tl.minimum((p0 * tw.to(tl.float32)).to(tl.int64), tw - 1)
    py = y0 + tl.minimum((p1 * th.to(tl.float32)).to(tl.int64), th - 1)
    if JITTER:
        ou = tl.load(off_ptr + r * 2, mask=m, other=0.5)
        ov = tl.load(off_ptr + r * 2 + 1, mask=m, other=0.5)
    else:
        ou = tl.full((BLOCK,), 0.5, tl.float32)
        ov = tl.full((BLOCK,), 0.5, tl.float32)
    uu = px.to(tl.float32) + ou
    vv = py.to(tl.float32) + ov
    pixel = tl.load(pix_off_ptr + img, mask=m, other=0) + py * tl.load(width_ptr + img, mask=m, other=0) + px
    tl.store(pixel_ptr + r, pixel, mask=m)
    tl.store(tile_ptr + r, tile, mask=m)
    if WEIGHTED:
        tl.store(w_out_ptr + r, tl.load(weight_ptr + k, mask=m, other=0.0), mask=m)
    # 3. the colour
    at = img * s_img + py * s_y + px * s_x
    for c in tl.static_range(4):
        v = tl.load(images_ptr + at + c, mask=m, other=0).to(tl.float32)
        if not HALF:
            v = v / 255.0
        tl.store(rgba_ptr + r * 4 + c, v, mask=m)
    # 4. the ray: camera-space (x, y, 1) rotated by c2w, normalised; the origin is the camera centre
    fx = tl.load(intr_ptr + img * 4 + 0, mask=m, other=1.0)
    fy = tl.load(intr_ptr + img * 4 + 1, mask=m, other=1.0)
    cx = tl.load(intr_ptr + img * 4 + 2, mask=m, other=0.0)
    cy = tl.load(intr_ptr + img * 4 + 3, mask=m, other=0.0)
    x = (uu - cx) / fx
    y = (vv - cy) / fy
    base = img * 12
    d0 = (
        tl.load(c2w_ptr + base + 0, mask=m, other=0.0) * x
        + tl.load(c2w_ptr + base + 1, mask=m, other=0.0) * y
        + tl.load(c2w_ptr + base + 2, mask=m, other=0.0)
    )
    d1 = (
        tl.load(c2w_ptr + base + 4, mask=m, other=0.0) * x
        + tl.load(c2w_ptr + base + 5, mask=m, other=0.0) * y
        + tl.load(c2w_ptr + base + 6, mask=m, other=0.0)
    )
    d2 = (
        tl.load(c2w_ptr + base + 8, mask=m, other=0.0) * x
        + tl.load(c2w_ptr + base + 9, mask=m, other=0.0) * y
        + tl.load(c2w_ptr + base + 10, mask=m, other=1.0)
    )
    norm = tl.sqrt(d0 * d0 + d1 * d1 + d2 * d2)
    tl.store(d_ptr + r * 3 + 0, d0 / norm, mask=m)
    tl.store(d_ptr + r * 3 + 1, d1 / norm, mask=m)
    tl.store(d_ptr + r * 3 + 2, d2 / norm, mask=m)
    for c in tl.static_range(3):
        tl.store(o_ptr + r * 3 + c, tl.load(c2w_ptr + base + c * 4 + 3, mask=m, other=0.0), mask=m)


class DrawnRays(TypedDict):
    """``draw_rays``' outputs: origins, directions ``[n, 3]``, rgba ``[n, 4]``, pixel, tile ``[n]`` int64,
    weight ``[n]`` (None when the draw is unweighted)."""

    origins: Tensor
    directions: Tensor
    rgba: Tensor
    pixel: Tensor
    tile: Tensor
    weight: Tensor | None


def search_steps(n: int) -> int:
    """Halvings that close a binary search's interval over ``n`` entries (at least one)."""
    return max(int(n).bit_length(), 1)


def draw_rays(
    u: Tensor,
    pick: Tensor,
    offsets: Tensor | None,
    cdf: Tensor,
    active: Tensor,
    tiles: dict[str, Tensor],
    weight: Tensor | None,
    images: Tensor,
    pixel_offset: Tensor,
    width: Tensor,
    c2w: Tensor,
    intrinsics: Tensor,
) -> DrawnRays:
    """One batch of ``n`` rays from its random numbers.

    u ``[n]`` float64 (the tile draw), pick ``[n, 2]`` (the pixel in the tile), offsets ``[n, 2]`` (sub-pixel;
    None: pixel centres); cdf ``[A]`` float64 over the drawable tiles ``active`` ``[A]``; tiles: the tile
    grid's ``image``, ``x0``, ``y0``, ``w``, ``h`` ``[T]``; weight ``[A]`` or None; images ``[N, H, W, 4]`` uint8
    or float16; pixel_offset, width ``[N(+1)]``; c2w ``[N, 3, 4]``; intrinsics ``[N, 4]`` (fx, fy, cx, cy).
    Index tensors int64, the rest float32, all contiguous (the sampler prepares them once).
    -> ``DrawnRays``: origins, directions ``[n, 3]``, rgba ``[n, 4]``, pixel, tile ``[n]`` int64, weight ``[n]``.
    """
    n, dev = u.shape[0], u.device
    out: DrawnRays = {
        "origins": torch.empty(n, 3, device=dev),
        "directions": torch.empty(n, 3, device=dev),
        "rgba": torch.empty(n, 4, device=dev),
        "pixel": torch.empty(n, dtype=torch.int64, device=dev),
        "tile": torch.empty(n, dtype=torch.int64, device=dev),
        "weight": None if weight is None else torch.empty(n, device=dev),
    }
    if n == 0:
        return out
    if images.dtype not in (torch.uint8, torch.float16) or images.stride(3) != 1:
        raise TypeError(
            f"images must be [N, H, W, 4] uint8 or float16 with packed channels, got {images.dtype} "
            f"with strides {images.stride()}"
        )
    s_img, s_y, s_x, _ = images.stride()
    _draw_rays[(triton.cdiv(n, BLOCK),)](
        u,
        pick,
        u if offsets is None else offsets,
        cdf,
        cdf.shape[0],
        active,
        tiles["image"],
        tiles["x0"],
        tiles["y0"],
        tiles["w"],
        tiles["h"],
        u if weight is None else weight,
        images,
        s_img,
        s_y,
        s_x,
        pixel_offset,
        width,
        c2w,
        intrinsics,
        out["origins"],
        out["directions"],
        out["rgba"],
        out["pixel"],
        out["tile"],
        out["rgba"] if weight is None else out["weight"],
        n,
        STEPS=search_steps(cdf.shape[0]),
        JITTER=offsets is not None,
        WEIGHTED=weight is not None,
        HALF=images.dtype == torch.float16,
        BLOCK=BLOCK,
    )
    return out


__all__ = ["DrawnRays", "draw_rays", "search_steps"]
