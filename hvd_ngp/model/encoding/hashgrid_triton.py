"""Hash-grid encoding in Triton: forward and backward, one kernel each.

Twin of ``hvd_ngp.model.encoding.hashgrid.HashGridTorch`` (same table layout and indexing). One program
handles a block of points at one level (grid: point blocks x levels), so the level's constants are
scalars and its slice of the table is the working set. The backward scatters into an fp32 gradient
with relaxed atomic adds (Triton's default acquire-release order is not needed for a sum). With
``vector_atomics=True`` and two features per level on Hopper or newer, one vector atomic per corner
adds both features (``red.global.add.v2.f32``, as tiny-cuda-nn's half2 atomics), halving the atomic
operations; opt-in (no gain beyond the spread between rounds on an H100 or H200; docs/BENCHMARKS.md).
With ``table_dtype=torch.float16`` the forward gathers from a half-precision copy of the (fp32 master)
table, halving its cache footprint (2^19 x 16 x 2 halves = 32 MiB, inside an H100/H200's L2);
gradients and the optimizer stay in fp32. Inside ``triton_support.inference_math("fp16")`` every pass without
gradients (renders, not training) gathers from such a copy, made once per parameter version
(``HashGridTriton.inference_table``).

Along a ray, consecutive samples share a cell at the coarse levels (a 16^3 level's cell spans dozens
of samples), so the backward's atomics pile onto a few addresses. ``merge_runs_below=R`` sums, at the
levels of resolution <= R, each run of consecutive points (within a block) on the same row of a corner
first, with a segmented scan, and adds the run's sum with one atomic (the default, R = 300; 0: off).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ...triton_support import inference_math_now
from .hashgrid import (
    BACKWARD_LAUNCH,
    FEATURE_MAJOR,
    FORWARD_LAUNCH,
    MERGE_RUNS_BELOW,
    GridLaunch,
    HashGridSpec,
    HashGridTorch,
)


@triton.jit
def _corner_row(cx, cy, cz, C: tl.constexpr, res, size, hashed):
    """Row (within the level) of corner C of cells ``c*`` (bit d = offset along dim d)."""
    X = cx + (C & 1)
    Y = cy + ((C >> 1) & 1)
    Z = cz + ((C >> 2) & 1)
    if hashed:
        h = X.to(tl.uint32) ^ (Y.to(tl.uint32) * 2654435761) ^ (Z.to(tl.uint32) * 805459861)
        row = (h & (size - 1).to(tl.uint32)).to(tl.int32)
    else:
        lin = X + Y * res + Z * res * res
        row = lin % size
    return row


@triton.jit
def _corner(cx, cy, cz, fx, fy, fz, C: tl.constexpr, res, size, hashed):
    """Row (within the level) and trilinear weight of corner C (bit d = offset along dim d)."""
    wx = fx if (C & 1) else 1.0 - fx
    wy = fy if ((C >> 1) & 1) else 1.0 - fy
    wz = fz if ((C >> 2) & 1) else 1.0 - fz
    return _corner_row(cx, cy, cz, C, res, size, hashed), wx * wy * wz


@triton.jit
def _rows(count_ptr, N, HAS_COUNT: tl.constexpr):
    """The points to compute: ``N``, or ``min(N, *count_ptr)`` (a device scalar)."""
    if HAS_COUNT:
        N = tl.minimum(N, tl.load(count_ptr).to(tl.int32))
    return N


@triton.jit
def _cells_of(x_ptr, i, m, scale, res):
    """Cell corners ``c*`` (int32, clamped into the grid) and fractions ``f*`` of points ``i`` (where ``m``)."""
    px = tl.load(x_ptr + i * 3 + 0, mask=m, other=0.0) * scale + 0.5
    py = tl.load(x_ptr + i * 3 + 1, mask=m, other=0.0) * scale + 0.5
    pz = tl.load(x_ptr + i * 3 + 2, mask=m, other=0.0) * scale + 0.5
    gx, gy, gz = tl.floor(px), tl.floor(py), tl.floor(pz)
    # Inputs in [0, 1] give cells in [0, res - 1] already; the clamp keeps a NaN input (its int cast is
    # INT_MIN on the CPU) from indexing outside the table: it only gets NaN weights.
    cx = tl.minimum(tl.maximum(gx.to(tl.int32), 0), res - 1)
    cy = tl.minimum(tl.maximum(gy.to(tl.int32), 0), res - 1)
    cz = tl.minimum(tl.maximum(gz.to(tl.int32), 0), res - 1)
    return cx, cy, cz, px - gx, py - gy, pz - gz


@triton.jit
def _point_cells(x_ptr, scale_ptr, res_ptr, size_ptr, offset_ptr, hashed_ptr, N, BLOCK: tl.constexpr):
    """This program's points (indices ``i``, mask ``m``) at its level: the level's constants, the cell
    corner ``c*`` (int32) and the fractions ``f*`` of each point within its cell."""
    pid = tl.program_id(0)
    level = tl.program_id(1)
    i = pid * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    scale = tl.load(scale_ptr + level)
    res = tl.load(res_ptr + level)
    size = tl.load(size_ptr + level)
    offset = tl.load(offset_ptr + level)
    hashed = tl.load(hashed_ptr + level) != 0
    cx, cy, cz, fx, fy, fz = _cells_of(x_ptr, i, m, scale, res)
    return i, m, level, cx, cy, cz, fx, fy, fz, res, size, offset, hashed


@triton.jit(do_not_specialize=("N",))
def _hashgrid_fwd(
    x_ptr,
    table_ptr,
    out_ptr,
    out_row,
    out_col,
    scale_ptr,
    res_ptr,
    size_ptr,
    offset_ptr,
    hashed_ptr,
    count_ptr,
    N,
    L: tl.constexpr,
    F: tl.constexpr,
    HAS_COUNT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out ``[N, L * F]`` (element ``(i, c)`` at ``out_ptr + i * out_row + c * out_col``) = the features of
    points x ``[N, 3]``; with a count, rows past it are written as zeros (``out`` may be uninitialised)."""
    n_all = N
    N = _rows(count_ptr, N, HAS_COUNT)
    f = tl.arange(0, F)
    if tl.program_id(0) * BLOCK >= N:  # past the filled rows: only zeros to write
        if HAS_COUNT:
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            c = (tl.program_id(1) * F + f[None, :]).to(tl.int64)
            out = out_ptr + i[:, None].to(tl.int64) * out_row + c * out_col
            tl.store(out, tl.zeros((BLOCK, F), dtype=out_ptr.dtype.element_ty), mask=(i < n_all)[:, None])
        return
    i, m, level, cx, cy, cz, fx, fy, fz, res, size, offset, hashed = _point_cells(
        x_ptr, scale_ptr, res_ptr, size_ptr, offset_ptr, hashed_ptr, N, BLOCK
    )
    acc = tl.zeros((BLOCK, F), dtype=tl.float32)
    for C in tl.static_range(8):
        row, w = _corner(cx, cy, cz, fx, fy, fz, C, res, size, hashed)
        ptr = table_ptr + (offset + row)[:, None].to(tl.int64) * F + f[None, :]
        v = tl.load(ptr, mask=m[:, None], other=0.0).to(tl.float32)
        acc += w[:, None] * v  # rows past the count (masked loads): zeros
    out = out_ptr + i[:, None].to(tl.int64) * out_row + (level * F + f[None, :]).to(tl.int64) * out_col
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(i < n_all)[:, None])  # fp32 or half (inference)


@triton.jit
def _red_add_pair(ptr, a, b, m):
    """``ptr[0] += a; ptr[1] += b`` where ``m``, as one vector reduction (sm_90+; ``ptr`` 8-byte aligned).

    The address goes in as a 64-bit integer: Triton (3.6) will not broadcast a pointer with floats."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p red.global.add.v2.f32 [$1], {$3, $4}; mov.u32 $0, 0; }",
        "=r,l,r,f,f",
        [ptr.to(tl.int64, bitcast=True), m.to(tl.int32), a, b],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _pair_grads(grad_out_ptr, g_row, g_col, i, m, level):
    """The output gradients of points ``i`` at ``level``, two features: (g0, g1) ``[BLOCK]`` fp32."""
    g = grad_out_ptr + i.to(tl.int64) * g_row + (level * 2).to(tl.int64) * g_col
    return tl.load(g, mask=m, other=0.0).to(tl.float32), tl.load(g + g_col, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _feature_grads(grad_out_ptr, g_row, g_col, i, m, level, F: tl.constexpr):
    """The output gradients of points ``i`` at ``level``: (feature index ``[F]``, ``[BLOCK, F]`` fp32)."""
    f = tl.arange(0, F)
    g = tl.load(
        grad_out_ptr + i[:, None].to(tl.int64) * g_row + (level * F + f[None, :]).to(tl.int64) * g_col,
        mask=m[:, None],
        other=0.0,
    ).to(tl.float32)
    return f, g


@triton.jit
def _restart_sum(fa, a, fb, b):
    """Combine of a segmented inclusive sum: a segment restarts where its flag is set."""
    return fa | fb, tl.where(fb != 0, b, a + b)


@triton.jit
def _restart_sum2(fa, a0, a1, fb, b0, b1):
    """``_restart_sum`` over two values at once (a feature pair)."""
    return fa | fb, tl.where(fb != 0, b0, a0 + b0), tl.where(fb != 0, b1, a1 + b1)


@triton.jit
def _hashgrid_bwd(
    x_ptr,
    grad_out_ptr,
    g_row,
    g_col,
    grad_table_ptr,
    scale_ptr,
    res_ptr,
    size_ptr,
    offset_ptr,
    hashed_ptr,
    count_ptr,
    N,
    merge_res,
    L: tl.constexpr,
    F: tl.constexpr,
    HAS_COUNT: tl.constexpr,
    BLOCK: tl.constexpr,
    PAIRS: tl.constexpr,
    MERGE: tl.constexpr,
):
    """The table's gradient from the output's (``[N, L * F]``, element ``(i, c)`` at ``grad_out_ptr + i * g_row +
    c * g_col``). ``PAIRS`` (F == 2, sm_90+): both features of a corner in one vector atomic, else one per feature.
    ``MERGE``: at levels of resolution <= ``merge_res``, consecutive points whose corner falls on the same
    row add their sum with one atomic (``_hashgrid_bwd_runs``)."""
    N = _rows(count_ptr, N, HAS_COUNT)
    if tl.program_id(0) * BLOCK >= N:
        return
    i, m, level, cx, cy, cz, fx, fy, fz, res, size, offset, hashed = _point_cells(
        x_ptr, scale_ptr, res_ptr, size_ptr, offset_ptr, hashed_ptr, N, BLOCK
    )
    if MERGE:
        if res <= merge_res:
            _hashgrid_bwd_runs(
                x_ptr,
                grad_out_ptr,
                g_row,
                g_col,
                grad_table_ptr,
                i,
                m,
                level,
                cx,
                cy,
                cz,
                fx,
                fy,
                fz,
                res,
                size,
                offset,
                hashed,
                tl.load(scale_ptr + level),
                N,
                L,
                F,
                BLOCK,
                PAIRS,
            )
            return
    if PAIRS:
        g0, g1 = _pair_grads(grad_out_ptr, g_row, g_col, i, m, level)
        for C in tl.static_range(8):
            row, w = _corner(cx, cy, cz, fx, fy, fz, C, res, size, hashed)
            _red_add_pair(grad_table_ptr + (offset + row).to(tl.int64) * 2, w * g0, w * g1, m)
    else:
        f, g = _feature_grads(grad_out_ptr, g_row, g_col, i, m, level, F)
        for C in tl.static_range(8):
            row, w = _corner(cx, cy, cz, fx, fy, fz, C, res, size, hashed)
            ptr = grad_table_ptr + (offset + row)[:, None].to(tl.int64) * F + f[None, :]
            tl.atomic_add(ptr, w[:, None] * g, mask=m[:, None], sem="relaxed")


@triton.jit
def _hashgrid_bwd_runs(
    x_ptr,
    grad_out_ptr,
    g_row,
    g_col,
    grad_table_ptr,
    i,
    m,
    level,
    cx,
    cy,
    cz,
    fx,
    fy,
    fz,
    res,
    size,
    offset,
    hashed,
    scale,
    N,
    L: tl.constexpr,
    F: tl.constexpr,
    BLOCK: tl.constexpr,
    PAIRS: tl.constexpr,
):
    """The backward at a coarse level, where a ray's consecutive samples share cells: per corner, a run of
    consecutive points (within the block) on the same table row is summed in registers (a segmented scan)
    and its last point adds the run's sum with one atomic, instead of one atomic per point."""
    first = tl.program_id(0) * BLOCK
    mp = m & (i > first)  # the previous point is in this block
    mn = (i + 1 < N) & (i + 1 < first + BLOCK)  # the next point is in this block and computed
    pcx, pcy, pcz, _, _, _ = _cells_of(x_ptr, i - 1, mp, scale, res)
    ncx, ncy, ncz, _, _, _ = _cells_of(x_ptr, i + 1, mn, scale, res)
    if PAIRS:
        g0, g1 = _pair_grads(grad_out_ptr, g_row, g_col, i, m, level)
    else:
        f, g = _feature_grads(grad_out_ptr, g_row, g_col, i, m, level, F)
    for C in tl.static_range(8):
        row, w = _corner(cx, cy, cz, fx, fy, fz, C, res, size, hashed)
        start = (~(mp & (_corner_row(pcx, pcy, pcz, C, res, size, hashed) == row))).to(tl.int32)
        last = m & ~(mn & (_corner_row(ncx, ncy, ncz, C, res, size, hashed) == row))
        if PAIRS:
            _, s0, s1 = tl.associative_scan((start, w * g0, w * g1), 0, _restart_sum2)
            _red_add_pair(grad_table_ptr + (offset + row).to(tl.int64) * 2, s0, s1, last)
        else:
            flags = tl.broadcast_to(start[:, None], (BLOCK, F))
            _, run = tl.associative_scan((flags, w[:, None] * g), 0, _restart_sum)
            ptr = grad_table_ptr + (offset + row)[:, None].to(tl.int64) * F + f[None, :]
            tl.atomic_add(ptr, run, mask=last[:, None], sem="relaxed")


#: the launches ``bench throughput --grid_launches`` times on a trained batch (each for forward and backward)
CANDIDATE_LAUNCHES = (
    GridLaunch(128, 4),
    GridLaunch(64, 2),
    GridLaunch(128, 2),
    GridLaunch(256, 4),
    GridLaunch(256, 8),
    GridLaunch(512, 4),
    GridLaunch(512, 8),
    GridLaunch(32, 1),
)


def vector_atomics_here(device: torch.device) -> bool:
    """True where ``_hashgrid_bwd`` can add a feature pair with one vector atomic: CUDA, sm_90 or newer."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def encode(
    x: Tensor, table: Tensor, enc: "HashGridTriton", n_rows: Tensor | None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The forward kernel: x ``[N, 3]`` (fp32, contiguous) gathered from ``table`` (``enc``'s layout, any float
    dtype) -> ``[N, L * F]`` of ``dtype`` (interpolated in fp32, rounded once when stored; feature-major when
    ``enc.feature_major``); rows past ``n_rows`` are zeros."""
    n, L, F = x.shape[0], enc.spec.n_levels, enc.spec.n_features_per_level
    # every row is written (zeros past n_rows): no zero fill first
    if enc.feature_major:  # [L * F, N] in memory: a program's stores (a level's features of its points) coalesce
        out = torch.empty(L * F, n, device=x.device, dtype=dtype).t()
    else:
        out = torch.empty(n, L * F, device=x.device, dtype=dtype)
    if n:
        count = x if n_rows is None else n_rows  # a placeholder pointer without a count (never read)
        block, warps = enc.forward_launch.block, enc.forward_launch.warps
        _hashgrid_fwd[(triton.cdiv(n, block), L)](
            x,
            table,
            out,
            *out.stride(),
            *enc.level_tensors(),
            count,
            n,
            L=L,
            F=F,
            HAS_COUNT=n_rows is not None,
            BLOCK=block,
            num_warps=warps,
        )
    return out


class _HashGridTritonFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, params: Tensor, enc: "HashGridTriton", n_rows: Tensor | None) -> Tensor:
        table = params if enc.table_dtype == torch.float32 else params.detach().to(enc.table_dtype)
        ctx.save_for_backward(x)
        ctx.enc, ctx.n_rows = enc, n_rows
        return encode(x, table, enc, n_rows)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (x,) = ctx.saved_tensors
        enc = ctx.enc
        n, L, F = x.shape[0], enc.spec.n_levels, enc.spec.n_features_per_level
        grad_table = torch.zeros(enc.params.shape, device=x.device, dtype=torch.float32)
        if n:
            pairs = F == 2 and enc.vector_atomics and vector_atomics_here(x.device)
            block, warps = enc.backward_launch.block, enc.backward_launch.warps
            _hashgrid_bwd[(triton.cdiv(n, block), L)](
                x,
                grad,
                *grad.stride(),
                grad_table,
                *enc.level_tensors(),
                x if ctx.n_rows is None else ctx.n_rows,
                n,
                enc.merge_runs_below,
                L=L,
                F=F,
                HAS_COUNT=ctx.n_rows is not None,
                BLOCK=block,
                PAIRS=pairs,
                MERGE=enc.merge_runs_below > 0,
                num_warps=warps,
            )
        return None, grad_table.to(enc.params.dtype), None, None


class HashGridTriton(HashGridTorch):
    """``HashGridTorch`` with Triton forward/backward (CUDA, or the Triton interpreter on CPU).

    ``forward(x, n_rows=None)``: x ``[N, 3]`` in [0, 1] -> ``[N, L * F]`` float32. ``n_rows`` (int32/int64
    device scalar): only points ``< n_rows`` are encoded (and back-propagated); the grid stays sized for
    all N (static sizes for CUDA-graph replay), programs past the count return at once, and output rows
    ``>= n_rows`` are zeros. ``vector_atomics=True``: the backward adds a feature pair with one atomic
    where it can (``vector_atomics_here``).
    ``merge_runs_below=R`` (default ``MERGE_RUNS_BELOW``; 0: off): at levels of resolution <= R the backward
    sums each run of consecutive points on the same table row first and adds it with one atomic
    (``_hashgrid_bwd_runs``).
    ``feature_major`` (default ``FEATURE_MAJOR``): the output is the transpose of a ``[L * F, N]`` tensor
    (strides ``(1, N)``, as tiny-cuda-nn lays out its encodings), so that one program's stores, a level's
    features of consecutive points, are contiguous; else row-major ``[N, L * F]`` (8 bytes per level in each
    128-byte row). Same values either way; the fused MLP (``mlp_triton``) reads and writes any strides.
    ``forward_launch``, ``backward_launch``: the kernels' ``GridLaunch`` (default ``FORWARD_LAUNCH``,
    ``BACKWARD_LAUNCH``); the same values and gradients (to atomic order) under any.
    """

    skips_rows = True  # forward takes n_rows (the field passes the count through)

    def __init__(
        self,
        spec: HashGridSpec,
        table_dtype: torch.dtype = torch.float32,
        vector_atomics: bool = False,
        merge_runs_below: int = MERGE_RUNS_BELOW,
        feature_major: bool = FEATURE_MAJOR,
        forward_launch: GridLaunch = FORWARD_LAUNCH,
        backward_launch: GridLaunch = BACKWARD_LAUNCH,
    ) -> None:
        super().__init__(spec)
        if spec.n_features_per_level & (spec.n_features_per_level - 1):
            raise ValueError("the Triton hash grid needs a power-of-two n_features_per_level")
        if merge_runs_below < 0:
            raise ValueError(f"merge_runs_below must be >= 0, got {merge_runs_below}")
        self.table_dtype, self.vector_atomics = table_dtype, vector_atomics
        self.merge_runs_below = int(merge_runs_below)
        self.feature_major = bool(feature_major)
        self.forward_launch, self.backward_launch = forward_launch, backward_launch
        self._levels: tuple[Tensor, ...] | None = None
        self._half: tuple[tuple, Tensor] | None = None  # (params' pointer, device, version), its half copy

    def level_tensors(self) -> tuple[Tensor, ...]:
        """scale f32, resolution i32, size i32, offset i32, hashed i32 — each ``[L]``, on the table's device."""
        dev = self.params.device
        if self._levels is None or self._levels[0].device != dev:
            self._levels = (
                self.scales.float().to(dev),
                self.resolutions.int().to(dev),
                self.sizes.int().to(dev),
                self.offsets.int().to(dev),
                self.hashed_mask.int().to(dev),
            )
        return self._levels

    def inference_table(self) -> Tensor:
        """A half copy of the table (``[T, F]``) for passes without gradients inside
        ``triton_support.inference_math("fp16")``: made once, and again only when the parameters change (their
        version counter moves with every optimizer step and load), so a render converts the table once."""
        p = self.params
        key = (p.data_ptr(), p.device, p._version)
        if self._half is None or self._half[0] != key:
            self._half = (key, p.detach().to(torch.float16))
        return self._half[1]

    def forward(self, x: Tensor, n_rows: Tensor | None = None) -> Tensor:
        x = x.float().contiguous()
        if not torch.is_grad_enabled() and inference_math_now() == "fp16":
            # half features: the fp16 MLP rounds its input to half anyway, and [N, L * F] half is half the bytes
            return encode(x, self.inference_table(), self, n_rows, torch.float16)
        return _HashGridTritonFunction.apply(x, self.params, self, n_rows)
