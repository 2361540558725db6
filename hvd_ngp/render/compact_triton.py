"""The kept samples of a training step gathered into the network's rows in one Triton kernel.

Twin of ``fast.compact`` and the gathers after it (``fast.compact_gather_torch``: about twenty-five torch
kernels). After the density pass each ray keeps its first ``keep[r]`` marched samples; they are packed
ray after ray into exactly ``capacity`` rows (rays past the capacity keep none: ``fits`` false). With
``ends`` the running sum of ``keep`` (one ``torch.cumsum``), one program handles ``BLOCK`` rows and
``BLOCK`` rays: a row finds its ray by binary search in ``ends`` and copies the sample's t, dt and
position and the ray's direction; a ray writes its new start, count and whether it fits, and the last ray
that fits writes the number of rows used (a device scalar: the network's ``n_rows``, so that its Triton
kernels skip the rest). Rows past the kept samples get t = dt = 0 at the last ray's origin (finite network
inputs, left out of the compositing).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 256


# sizes, not constants: inference packs groups of every size, and each new value would compile a variant
@triton.jit(do_not_specialize=("R", "S", "STEPS"))
def _compact_gather(
    keep_ptr,
    ends_ptr,
    pstart_ptr,
    pt_ptr,
    pdt_ptr,
    px_ptr,
    o_ptr,
    d_ptr,
    t_out,
    dt_out,
    x_out,
    d_out,
    start_out,
    count_out,
    fits_out,
    total_out,
    R,
    S,
    STEPS,
    BLOCK: tl.constexpr,
):
    lane = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # the rays of this program: their place in the rows
    mr = lane < R
    k = tl.load(keep_ptr + lane, mask=mr, other=0).to(tl.int64)
    e = tl.load(ends_ptr + lane, mask=mr, other=0)
    fits = e <= S
    tl.store(start_out + lane, (e - k).to(tl.int32), mask=mr)
    tl.store(count_out + lane, tl.where(fits, k, 0).to(tl.int32), mask=mr)
    tl.store(fits_out + lane, fits, mask=mr)
    # the rows used: the end of the last ray that fits (ends only grow), or 0 when the first does not;
    # exactly one lane writes it
    next_fits = tl.load(ends_ptr + lane + 1, mask=lane + 1 < R, other=S + 1) <= S
    last = mr & fits & ~next_fits
    none = (lane == 0) & ~fits
    tl.store(total_out + lane * 0, tl.where(fits, e, 0), mask=last | none)
    # the rows of this program: the first ray whose running sum exceeds the row (R for rows past all)
    ms = lane < S
    s = lane.to(tl.int64)
    lo = tl.zeros((BLOCK,), dtype=tl.int32)
    hi = tl.full((BLOCK,), R, dtype=tl.int32)
    for _ in range(STEPS):
        open_ = lo < hi
        mid = (lo + hi) // 2
        below = tl.load(ends_ptr + mid, mask=ms & open_, other=0) <= s
        lo = tl.where(open_ & below, mid + 1, lo)
        hi = tl.where(open_ & ~below, mid, hi)
    ray = tl.minimum(lo, R - 1)
    kr = tl.load(keep_ptr + ray, mask=ms, other=0).to(tl.int64)
    er = tl.load(ends_ptr + ray, mask=ms, other=0)
    j = s - (er - kr)
    used = ms & (lo < R) & (er <= S) & (j < kr)
    src = tl.where(used, tl.load(pstart_ptr + ray, mask=ms, other=0).to(tl.int64) + j, 0)
    t = tl.load(pt_ptr + src, mask=used, other=0.0)
    dt = tl.load(pdt_ptr + src, mask=used, other=0.0)
    tl.store(t_out + s, t, mask=ms)
    tl.store(dt_out + s, dt, mask=ms)
    ray = tl.where(used, ray, R - 1)  # unused rows: the last ray's origin and direction, as the twin's
    for c in tl.static_range(3):
        o = tl.load(o_ptr + ray * 3 + c, mask=ms, other=0.0)
        x = tl.load(px_ptr + src * 3 + c, mask=used, other=0.0)
        tl.store(x_out + s * 3 + c, tl.where(used, x, o), mask=ms)
        tl.store(d_out + s * 3 + c, tl.load(d_ptr + ray * 3 + c, mask=ms, other=0.0), mask=ms)


def compact_gather(
    keep: Tensor, start: Tensor, t: Tensor, dt: Tensor, x: Tensor, origins: Tensor, directions: Tensor, capacity: int
) -> tuple[Tensor, ...]:
    """keep, start ``[R]`` (samples each ray keeps, where its marched samples begin); t, dt ``[C]``, x ``[C, 3]``
    (the marched samples); origins, directions ``[R, 3]`` -> (t, dt ``[S]``, x, d ``[S, 3]``, start, count
    ``[R]`` int32, fits ``[R]`` bool, total ``[]`` int64: the rows used, = count.sum()) with S = ``capacity``:
    the network's rows, as ``fast.compact_gather_torch``."""
    R, dev = keep.shape[0], keep.device
    if R == 0:
        raise ValueError("compact_gather needs at least one ray")
    out = (
        torch.empty(capacity, device=dev),
        torch.empty(capacity, device=dev),
        torch.empty(capacity, 3, device=dev),
        torch.empty(capacity, 3, device=dev),
        torch.empty(R, device=dev, dtype=torch.int32),
        torch.empty(R, device=dev, dtype=torch.int32),
        torch.empty(R, device=dev, dtype=torch.bool),
        torch.empty((), device=dev, dtype=torch.int64),
    )
    ends = torch.cumsum(keep, 0)
    n = max(capacity, R)
    _compact_gather[(triton.cdiv(n, BLOCK),)](
        keep,
        ends,
        start,
        t,
        dt,
        x.contiguous(),
        origins.contiguous(),
        directions.contiguous(),
        *out,
        R,
        capacity,
        STEPS=R.bit_length(),
        BLOCK=BLOCK,
    )
    return out
