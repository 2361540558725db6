"""Ray marching through the occupancy grid in Triton: a count pass and a write pass.

Twin of ``hvd_ngp.render.volume.march`` (the dense-lane reference): the same sample positions
``T(F(t_near) + k + jitter)``, the same cascade choice and the same occupancy test, evaluated
step by step in registers instead of in a [rays, steps] tensor. A step that lands in an empty cell
jumps over the cell's remaining lattice steps at the same cascade (their samples are the same: none),
as instant-ngp skips empty space, but onto the same lattice, so the output stays equal to the twin's.
Each ray's steps are split into segments of ``MarchLaunch.segment`` steps marched by different programs, so a few
long rays (large scenes) still fill the GPU; per-segment counts give every segment its place in the
output. The samples come out packed ray-major into buffers of a fixed ``capacity``; a ray whose
samples do not all fit gets ``count = 0`` and ``fits = False`` (it renders as empty and the trainer
drops it).
No host synchronisation: the total is returned as a device tensor.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from .occupancy import OccupancyGrid
from .schedule import MarchLaunch, StepSchedule


@triton.jit
def _coord(t, dt_min, dt_max, t1, t2, s1, s2, lc, CONE: tl.constexpr):
    """F(t) of StepSchedule."""
    if CONE:
        lin = t / dt_min
        geo = s1 + tl.log(tl.maximum(t, t1) / t1) / lc
        far = s2 + (t - t2) / dt_max
        return tl.where(t < t1, lin, tl.where(t < t2, geo, far))
    else:
        return t / dt_min


@triton.jit
def _time(s, dt_min, dt_max, t1, t2, s1, s2, lc, CONE: tl.constexpr):
    """T(s) = F^-1(s) of StepSchedule."""
    if CONE:
        lin = s * dt_min
        geo = t1 * tl.exp((tl.minimum(tl.maximum(s, s1), s2) - s1) * lc)
        far = t2 + (s - s2) * dt_max
        return tl.where(s < s1, lin, tl.where(s < s2, geo, far))
    else:
        return s * dt_min


@triton.jit
def _box_span(lo_x, lo_y, lo_z, hi_x, hi_y, hi_z, ox, oy, oz, ix, iy, iz):
    """Entry and exit ``t`` of rays (origins ``o``, inverse directions ``i``) through a box: the slab test,
    exactly as ``geometry.intersect_aabb`` (unclamped)."""
    ax, bx = (lo_x - ox) * ix, (hi_x - ox) * ix
    ay, by = (lo_y - oy) * iy, (hi_y - oy) * iy
    az, bz = (lo_z - oz) * iz, (hi_z - oz) * iz
    t_in = tl.maximum(tl.maximum(tl.minimum(ax, bx), tl.minimum(ay, by)), tl.minimum(az, bz))
    t_out = tl.minimum(tl.minimum(tl.maximum(ax, bx), tl.maximum(ay, by)), tl.maximum(az, bz))
    return t_in, t_out


@triton.jit
def _dt_cascade(dt, cell0):
    """The cascade a step of length ``dt`` asks for, before clamping: ceil(log2(dt / finest cell))."""
    return tl.ceil(tl.log2(tl.maximum(dt / cell0, 1e-12)))


# the ray count, capacity and window width change from call to call in inference: not specialised on (each
# new value's divisibility would compile another variant of this large kernel in the middle of a render)
@triton.jit(do_not_specialize=("R", "capacity", "width"))
def _march(
    o_ptr,
    d_ptr,
    jitter_ptr,
    bits_ptr,
    count_ptr,
    start_ptr,
    fits_ptr,
    t_ptr,
    dt_ptr,
    ray_ptr,
    x_ptr,
    skip_ptr,
    resume_ptr,
    R,
    lo_x,
    lo_y,
    lo_z,
    hi_x,
    hi_y,
    hi_z,
    c_x,
    c_y,
    c_z,
    h_x,
    h_y,
    h_z,
    cell0,
    dt_min,
    dt_max,
    t1,
    t2,
    s1,
    s2,
    lc,
    near,
    max_steps,
    capacity,
    width,
    RES: tl.constexpr,
    K: tl.constexpr,
    CONE: tl.constexpr,
    WRITE: tl.constexpr,
    BLOCK: tl.constexpr,
    SEGMENT: tl.constexpr,
    NSEG: tl.constexpr,
    WRITE_X: tl.constexpr,
    WINDOW: tl.constexpr,
    RESUME: tl.constexpr,
    FREE: tl.constexpr,
):
    # WRITE: write the candidates (count_ptr: how many of each segment's, start_ptr: the first slot); else
    # count them into count_ptr. WINDOW (with WRITE): each segment first passes over skip_ptr's count of its
    # candidates, then writes count_ptr's and stops. RESUME (with WINDOW): the segment's skipped candidates lie
    # before lattice step resume_ptr[r, seg], where it starts (not at the segment's first step), and it stores
    # the step it stopped at there for the next window. FREE (with WINDOW and RESUME, one segment per ray): no
    # count pass came first; ray r writes its next ``width`` candidates at most into slots r * width on, and how
    # many it wrote into count_ptr[r] (fewer than ``width``: it has no candidates left).
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    seg = tl.program_id(1)
    m = r < R
    ox = tl.load(o_ptr + r * 3 + 0, mask=m, other=0.0)
    oy = tl.load(o_ptr + r * 3 + 1, mask=m, other=0.0)
    oz = tl.load(o_ptr + r * 3 + 2, mask=m, other=0.0)
    dx = tl.load(d_ptr + r * 3 + 0, mask=m, other=1.0)
    dy = tl.load(d_ptr + r * 3 + 1, mask=m, other=1.0)
    dz = tl.load(d_ptr + r * 3 + 2, mask=m, other=1.0)
    j = tl.load(jitter_ptr + r, mask=m, other=0.5)
    ix = 1.0 / tl.where(tl.abs(dx) < 1e-9, 1e-9, dx)
    iy = 1.0 / tl.where(tl.abs(dy) < 1e-9, 1e-9, dy)
    iz = 1.0 / tl.where(tl.abs(dz) < 1e-9, 1e-9, dz)
    t_near, t_far = _box_span(lo_x, lo_y, lo_z, hi_x, hi_y, hi_z, ox, oy, oz, ix, iy, iz)
    t_near = tl.maximum(tl.maximum(t_near, 0.0), near)
    s0 = _coord(t_near, dt_min, dt_max, t1, t2, s1, s2, lc, CONE) + j
    active = m & (t_far > t_near)
    skip = tl.zeros((BLOCK,), dtype=tl.int32)
    stop = tl.zeros((BLOCK,), dtype=tl.int32)
    if WRITE and FREE:
        base = r * width
        stop = stop + width
    elif WRITE:
        base = tl.load(start_ptr + r * NSEG + seg, mask=m, other=0)
        active = active & (tl.load(fits_ptr + r, mask=m, other=0) != 0)
        if WINDOW:
            skip = tl.load(skip_ptr + r * NSEG + seg, mask=m, other=0)
            stop = skip + tl.load(count_ptr + r * NSEG + seg, mask=m, other=0)
            active = active & (stop > skip)
    n = tl.zeros((BLOCK,), dtype=tl.int32)
    k = tl.zeros((BLOCK,), dtype=tl.int32) + seg * SEGMENT  # each lane's next step on the lattice
    if RESUME:
        k = tl.load(resume_ptr + r * NSEG + seg, mask=m, other=0)
        n = skip
    k_end = tl.minimum(seg * SEGMENT + SEGMENT, max_steps)
    active = active & (k < k_end)
    while tl.sum(active.to(tl.int32), axis=0) > 0:
        s = s0 + k.to(tl.float32)
        t = _time(s, dt_min, dt_max, t1, t2, s1, s2, lc, CONE)
        active = active & (t < t_far)
        dt = _time(s + 1.0, dt_min, dt_max, t1, t2, s1, s2, lc, CONE) - t
        px, py, pz = ox + dx * t, oy + dy * t, oz + dz * t
        if K > 1:
            rad = tl.maximum(tl.maximum(tl.abs(px - c_x) / h_x, tl.abs(py - c_y) / h_y), tl.abs(pz - c_z) / h_z)
            by_dt_here = _dt_cascade(dt, cell0)
            lvl = tl.maximum(tl.ceil(tl.log2(tl.maximum(rad, 1e-12))), by_dt_here)
            lvl = tl.minimum(tl.maximum(lvl, 0.0), K - 1.0)
            ext = tl.exp2(lvl)
        else:
            lvl = tl.zeros_like(t)
            ext = tl.full(t.shape, 1.0, tl.float32)
        ux = (px - c_x) / (2.0 * h_x * ext) + 0.5
        uy = (py - c_y) / (2.0 * h_y * ext) + 0.5
        uz = (pz - c_z) / (2.0 * h_z * ext) + 0.5
        inside = (ux >= 0) & (ux <= 1) & (uy >= 0) & (uy <= 1) & (uz >= 0) & (uz <= 1)
        cx = tl.minimum(tl.maximum((ux * RES).to(tl.int32), 0), RES - 1)
        cy = tl.minimum(tl.maximum((uy * RES).to(tl.int32), 0), RES - 1)
        cz = tl.minimum(tl.maximum((uz * RES).to(tl.int32), 0), RES - 1)
        cell = lvl.to(tl.int32) * (RES * RES * RES) + (cx * RES + cy) * RES + cz
        occ = tl.load(bits_ptr + cell, mask=active & inside, other=0) != 0
        emit = active & inside & occ
        if WRITE:
            slot = base + n - skip
            ok = emit & (n >= skip) & (slot < capacity)
            tl.store(t_ptr + slot, t, mask=ok)
            tl.store(dt_ptr + slot, dt, mask=ok)
            if not FREE:  # a window's slots say their ray: r * width on
                tl.store(ray_ptr + slot, r, mask=ok)
            if WRITE_X:  # the sample's position o + t d, as the density pass would compute it
                tl.store(x_ptr + slot * 3 + 0, px, mask=ok)
                tl.store(x_ptr + slot * 3 + 1, py, mask=ok)
                tl.store(x_ptr + slot * 3 + 2, pz, mask=ok)
        n += emit.to(tl.int32)
        # An empty cell: jump to the last lattice step before the cell's exit; the steps in between are in
        # the same cell, at the same cascade (checked below), so they would sample nothing either.
        gx = c_x + ((cx + (dx >= 0).to(tl.int32)).to(tl.float32) / RES - 0.5) * (2.0 * h_x * ext)
        gy = c_y + ((cy + (dy >= 0).to(tl.int32)).to(tl.float32) / RES - 0.5) * (2.0 * h_y * ext)
        gz = c_z + ((cz + (dz >= 0).to(tl.int32)).to(tl.float32) / RES - 0.5) * (2.0 * h_z * ext)
        t_exit = tl.minimum(tl.minimum((gx - ox) * ix, (gy - oy) * iy), (gz - oz) * iz)
        jump = active & inside & ~occ
        if K > 1:
            # a step's cascade is max(by position, by dt). The dt one never falls along the ray; while it is
            # below this cascade, the position one falls where the ray enters the next finer cascade's box
            # (half the extent): stop there.
            finer_by_dt = by_dt_here < lvl
            fx, fy, fz = 0.5 * h_x * ext, 0.5 * h_y * ext, 0.5 * h_z * ext  # the finer box's half extent
            t_in, t_out = _box_span(c_x - fx, c_y - fy, c_z - fz, c_x + fx, c_y + fy, c_z + fz, ox, oy, oz, ix, iy, iz)
            enters = (lvl > 0) & finer_by_dt & (t_in <= t_out) & (t_out > t)
            t_exit = tl.where(enters, tl.minimum(t_exit, tl.maximum(t_in, t)), t_exit)
        k_exit = tl.ceil(_coord(t_exit, dt_min, dt_max, t1, t2, s1, s2, lc, CONE) - s0).to(tl.int32) - 1
        if K > 1:  # and the dt cascade at the landing step is still this one (it only grows on the way)
            s_exit = s0 + k_exit.to(tl.float32)
            dt_exit = _time(s_exit + 1.0, dt_min, dt_max, t1, t2, s1, s2, lc, CONE) - _time(
                s_exit, dt_min, dt_max, t1, t2, s1, s2, lc, CONE
            )
            by_dt = tl.minimum(tl.maximum(_dt_cascade(dt_exit, cell0), 0.0), K - 1.0)
            jump = jump & (by_dt <= lvl)
        k_next = tl.where(jump, tl.maximum(k + 1, k_exit), k + 1)
        if RESUME:  # a lane that stopped keeps its step (the next window starts there)
            k = tl.where(active, k_next, k)
        else:
            k = k_next
        active = active & (k < k_end)
        if WINDOW:
            active = active & (n < stop)
    if not WRITE or FREE:
        tl.store(count_ptr + r * NSEG + seg, n, mask=m)
    if RESUME:
        tl.store(resume_ptr + r * NSEG + seg, k, mask=m)


@dataclass
class PackedSamples:
    """Samples packed ray-major into ``capacity`` slots.

    t, dt ``[C]`` float32; ray ``[C]`` int32 (``R`` in unused slots); start, count ``[R]`` int32 (count 0
    for rays that did not fit); fits ``[R]`` bool: the ray's samples are all here; total: device
    scalar, the samples written; x ``[C, 3]`` float32: the samples' positions (``positions=True``; unused
    slots unwritten), else None.
    """

    t: Tensor
    dt: Tensor
    ray: Tensor
    start: Tensor
    count: Tensor
    fits: Tensor
    total: Tensor
    x: Tensor | None = None


def schedule_constants(schedule: StepSchedule) -> tuple[float, ...]:
    """dt_min, dt_max, t1, t2, s1, s2, log1p(cone) as the kernels take them."""
    c = schedule.cone_angle
    if c == 0:
        return schedule.dt_min, schedule.dt_max, 0.0, 0.0, 0.0, 0.0, 1.0
    t1, t2, s1, s2 = schedule._knots()
    return schedule.dt_min, schedule.dt_max, t1, t2, s1, s2, math.log1p(c)


#: the launch the renderers use unless the marching block's ``kernel_launch`` says otherwise
LAUNCH = MarchLaunch()
#: launches ``bench throughput`` times against ``LAUNCH`` on a late-training batch
CANDIDATE_LAUNCHES = (
    MarchLaunch(64, 64, 4),
    MarchLaunch(64, 64, 2),
    MarchLaunch(32, 64, 1),
    MarchLaunch(32, 32, 1),
    MarchLaunch(32, 128, 1),
    MarchLaunch(64, 32, 2),
    MarchLaunch(128, 64, 4),
    MarchLaunch(128, 32, 4),
)


def host_values(t: Tensor) -> list:
    """``t.tolist()``, read from the device once and cached on ``t`` until ``t`` changes in place: the
    scene box and grid geometry are constants, and a per-call read would synchronise the host with
    the device in every step (and cannot happen inside a CUDA-graph capture)."""
    cached = getattr(t, "_hvd_ngp_host", None)
    if cached is None or cached[0] != t._version:
        cached = (t._version, t.tolist())
        setattr(t, "_hvd_ngp_host", cached)  # a cache on the tensor object, read back with getattr above
    return cached[1]


def _launch_args(
    origins: Tensor,
    directions: Tensor,
    aabb: Tensor,
    grid: OccupancyGrid,
    schedule: StepSchedule,
    jitter: Tensor | None,
    launch: MarchLaunch,
) -> tuple:
    """The tensors and constants both passes of ``_march`` take."""
    R = origins.shape[0]
    o, d = origins.float().contiguous(), directions.float().contiguous()
    j = (jitter if jitter is not None else torch.full((R,), 0.5, device=origins.device)).float().contiguous()
    bits = grid.occupied.view(-1).to(torch.uint8)
    lo, hi = host_values(aabb)
    center, half0 = host_values(grid.center), host_values(grid.half0)
    cell0 = 2 * max(half0) / grid.resolution
    nseg = segments(schedule, launch)
    common = dict(
        RES=grid.resolution,
        K=grid.n_cascades,
        CONE=schedule.cone_angle > 0,
        BLOCK=launch.block,
        SEGMENT=launch.segment,
        NSEG=nseg,
        num_warps=launch.warps,
    )
    consts = (*lo, *hi, *center, *half0, cell0, *schedule_constants(schedule), schedule.near, schedule.max_steps)
    return o, d, j, bits, (triton.cdiv(max(R, 1), launch.block), nseg), consts, common


def _run_march(
    args: tuple,
    R: int,
    count: Tensor,
    *,
    start: Tensor | None = None,
    fits: Tensor | None = None,
    t: Tensor | None = None,
    dt: Tensor | None = None,
    ray: Tensor | None = None,
    x: Tensor | None = None,
    skip: Tensor | None = None,
    resume: Tensor | None = None,
    capacity: int = 0,
    width: int = 0,
    free: bool = False,
) -> None:
    """One ``_march`` launch over R rays with ``args`` (``_launch_args``'s). The buffers given decide the pass: a
    count pass into ``count`` without ``t``; else a write pass (positions with ``x``, a window with ``skip`` or
    ``free``, resumed with ``resume``). An absent buffer is passed as ``count``, never read."""
    o, d, j, bits, grid_fn, consts, common = args
    _march[grid_fn](
        *(o, d, j, bits, count),
        *(count if b is None else b for b in (start, fits, t, dt, ray, x, skip, resume)),
        R,
        *consts,
        capacity,
        width,
        WRITE=t is not None,
        WRITE_X=x is not None,
        WINDOW=skip is not None or free,
        RESUME=resume is not None,
        FREE=free,
        **common,
    )


def segments(schedule: StepSchedule, launch: MarchLaunch | None = None) -> int:
    """Segments of ``launch.segment`` steps per ray (default ``LAUNCH``): the columns of ``march_counts``."""
    return triton.cdiv(schedule.max_steps, (launch or LAUNCH).segment)


def march_counts(
    origins: Tensor,
    directions: Tensor,
    aabb: Tensor,
    grid: OccupancyGrid,
    schedule: StepSchedule,
    jitter: Tensor | None,
    launch: MarchLaunch | None = None,
) -> Tensor:
    """The count pass: candidates per ray and segment ``[R, segments(schedule, launch)]`` int32 (``launch``:
    default ``LAUNCH``; the write pass takes the same)."""
    R = origins.shape[0]
    args = _launch_args(origins, directions, aabb, grid, schedule, jitter, launch or LAUNCH)
    seg_count = torch.zeros(R, args[-1]["NSEG"], device=origins.device, dtype=torch.int32)
    if R:
        _run_march(args, R, seg_count)
    return seg_count


def march_write(
    origins: Tensor,
    directions: Tensor,
    aabb: Tensor,
    grid: OccupancyGrid,
    schedule: StepSchedule,
    jitter: Tensor | None,
    seg_count: Tensor,
    capacity: int,
    out: tuple[Tensor, Tensor, Tensor] | None = None,
    positions: bool = False,
    launch: MarchLaunch | None = None,
    skip: Tensor | None = None,
    resume: Tensor | None = None,
) -> PackedSamples:
    """The write pass: the candidates ``seg_count`` (from ``march_counts``) counted, packed into ``capacity``
    slots; ``out``: (t, dt, ray) workspace buffers of at least ``capacity`` slots to write into (reused
    across calls), else new ones. ``positions``: also write each sample's position (``PackedSamples.x``),
    saving the density pass the gathers that would compute it over every slot. ``launch``: as the count pass's.
    ``skip`` ``[R, segments]`` int32: a window of each ray's candidates; each segment passes over its first
    ``skip`` candidates and writes the next ``seg_count`` (which then counts the window, not the segment).
    ``resume`` ``[R, segments]`` int32 (contiguous; with ``skip``): each segment's lattice step after its ``skip``
    candidates (``window_start`` for the first window), where it starts instead of walking its skipped steps
    again; updated in place to where it stopped, for the next window."""
    R = origins.shape[0]
    dev = origins.device
    args = _launch_args(origins, directions, aabb, grid, schedule, jitter, launch or LAUNCH)
    seg_ends = torch.cumsum(seg_count.view(-1), 0, dtype=torch.int64).view(R, args[-1]["NSEG"])
    seg_start = (seg_ends - seg_count).to(torch.int32)
    count = seg_count.sum(1, dtype=torch.int32)
    ends = seg_ends[:, -1] if R else torch.zeros(0, dtype=torch.int64, device=dev)
    if out is None:
        t = torch.empty(capacity, device=dev, dtype=torch.float32)
        dt = torch.empty(capacity, device=dev, dtype=torch.float32)
        ray = torch.empty(capacity, device=dev, dtype=torch.int32)
    else:
        t, dt, ray = (buf[:capacity] for buf in out)
    ray.fill_(R)
    x = torch.empty(capacity, 3, device=dev, dtype=torch.float32) if positions else None
    start = (ends - count).to(torch.int32)
    fits = ends <= capacity
    count = torch.where(fits, count, torch.zeros_like(count))
    if R and capacity:
        _run_march(
            args,
            R,
            seg_count,
            start=seg_start,
            fits=fits.to(torch.int8),
            t=t,
            dt=dt,
            ray=ray,
            x=x,
            skip=None if skip is None else skip.to(torch.int32).contiguous(),
            resume=resume,
            capacity=capacity,
        )
    total = (count.to(torch.int64)).sum()
    return PackedSamples(t, dt, ray, start, count, fits, total, x)


@dataclass
class Window:
    """One count-free window of A rays (``march_window``): ray i's candidates in slots ``i * width`` to
    ``i * width + count[i] - 1`` of t, dt ``[A * width]`` float32 and x ``[A * width, 3]`` (the other slots
    unwritten); count ``[A]`` int32, below ``width`` for a ray with no candidates left."""

    t: Tensor
    dt: Tensor
    x: Tensor
    count: Tensor
    width: int


def march_window(
    origins: Tensor,
    directions: Tensor,
    aabb: Tensor,
    grid: OccupancyGrid,
    schedule: StepSchedule,
    jitter: Tensor | None,
    resume: Tensor,
    width: int,
    launch: MarchLaunch | None = None,
    out: tuple[Tensor, Tensor] | None = None,
) -> Window:
    """The next ``width`` candidates (at most) of each of A rays, without a count pass: one program walks a
    ray's whole lattice (``launch``'s block and warps; its segment is not used), starting at ``resume`` ``[A]``
    int32 (0 before the first window), which moves on in place to where the ray stopped. ``out``: t and dt
    buffers to write into (a render's workspace) where they hold A * width slots, else new ones. The samples are the
    ones ``march_packed`` writes, window by window (``tests/test_infer.py``)."""
    launch = launch or LAUNCH
    whole = dataclasses.replace(launch, segment=1 << max(schedule.max_steps - 1, 1).bit_length())
    A, dev = origins.shape[0], origins.device
    args = _launch_args(origins, directions, aabb, grid, schedule, jitter, whole)
    assert args[-1]["NSEG"] == 1 and resume.shape == (A,) and resume.dtype == torch.int32 and resume.is_contiguous()
    if out is None or min(out[0].numel(), out[1].numel()) < A * width:
        t, dt = torch.empty(A * width, device=dev), torch.empty(A * width, device=dev)
    else:
        t, dt = out[0][: A * width], out[1][: A * width]
    x = torch.empty(A * width, 3, device=dev)
    count = torch.zeros(A, device=dev, dtype=torch.int32)
    if A and width:
        _run_march(args, A, count, t=t, dt=dt, x=x, resume=resume, capacity=A * width, width=width, free=True)
    return Window(t, dt, x, count, width)


def window_start(n_rays: int, schedule: StepSchedule, launch: MarchLaunch | None, device: torch.device) -> Tensor:
    """``[n_rays, segments]`` int32: each segment's first lattice step, ``march_write``'s ``resume`` before any
    window has been written."""
    launch = launch or LAUNCH
    first = torch.arange(segments(schedule, launch), device=device, dtype=torch.int32) * launch.segment
    return first.expand(n_rays, -1).contiguous()


def march_packed(
    origins: Tensor,
    directions: Tensor,
    aabb: Tensor,
    grid: OccupancyGrid,
    schedule: StepSchedule,
    jitter: Tensor | None,
    capacity: int | None,
    positions: bool = False,
    launch: MarchLaunch | None = None,
) -> PackedSamples:
    """March R rays (``[R, 3]`` each) into at most ``capacity`` packed samples (see the module docstring).
    ``capacity=None`` sizes the buffers exactly, at the cost of one host synchronisation. ``positions``: see
    ``march_write``; ``launch``: how the kernel is launched (default ``LAUNCH``)."""
    seg_count = march_counts(origins, directions, aabb, grid, schedule, jitter, launch)
    if capacity is None:
        capacity = int(seg_count.sum())
    return march_write(
        origins, directions, aabb, grid, schedule, jitter, seg_count, capacity, positions=positions, launch=launch
    )
