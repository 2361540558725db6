"""Volume compositing of packed samples in Triton: forward, backward, and the early-termination count.

Twin of ``hvd_ngp.render.volume.transmittance_weights`` + ``accumulate`` (the dense-lane reference);
``composite_into`` is inference's count, compositing and ray-state update in one launch. Each
ray's samples are contiguous: ``start[r] .. start[r] + count[r]``. One lane per ray walks its
samples front to back keeping the transmittance in a register. The backward recomputes the
forward from the saved totals (instant-ngp's scheme), so nothing per sample is stored:

    dC/dc_j = w_j,    dC/dsigma_j = dt_j * (T_{j+1} c_j - sum_{i>j} w_i c_i)

for C in (rgb, opacity with c = 1, depth with c = t).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _lanes(start_ptr, count_ptr, R, BLOCK: tl.constexpr):
    """This program's lanes r (one ray each), which are real (r < R), and their rays' packed samples: first
    (int64) and how many."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = r < R
    return r, m, tl.load(start_ptr + r, mask=m, other=0).to(tl.int64), tl.load(count_ptr + r, mask=m, other=0)


@triton.jit
def _sample(sigma_ptr, rgb_ptr, dt_ptr, t_ptr, i, live):
    """Packed samples ``i`` of the live lanes: distance t, step dt, colour (r, g, b) in fp32, the
    decay exp(-sigma dt) across the sample (1 on lanes past their ray's end: weight 0) and sigma dt."""
    sigma = tl.load(sigma_ptr + i, mask=live, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + i, mask=live, other=0.0)
    t = tl.load(t_ptr + i, mask=live, other=0.0)
    r = tl.load(rgb_ptr + i * 3 + 0, mask=live, other=0.0).to(tl.float32)
    g = tl.load(rgb_ptr + i * 3 + 1, mask=live, other=0.0).to(tl.float32)
    b = tl.load(rgb_ptr + i * 3 + 2, mask=live, other=0.0).to(tl.float32)
    return t, dt, r, g, b, tl.exp(-sigma * dt), sigma * dt


@triton.jit
def _front_to_back(
    sigma_ptr, rgb_ptr, dt_ptr, t_ptr, start, count, log_T, log_eps, BLOCK: tl.constexpr, STOP: tl.constexpr
):
    """Each lane's samples ``start .. start + count`` front to back: its composited (r, g, b), opacity and depth.
    STOP: only while -sum(sigma dt), carried from ``log_T``, stays above ``log_eps`` (``_count_until_opaque``'s
    rule); also returns that count and the carried sum (without STOP: zeros and ``log_T``)."""
    T = tl.full((BLOCK,), 1.0, tl.float32)
    cr = tl.zeros((BLOCK,), tl.float32)
    cg = tl.zeros((BLOCK,), tl.float32)
    cb = tl.zeros((BLOCK,), tl.float32)
    op = tl.zeros((BLOCK,), tl.float32)
    dep = tl.zeros((BLOCK,), tl.float32)
    keep = tl.zeros((BLOCK,), tl.int32)
    n_max = tl.max(count, axis=0)
    j = 0
    while j < n_max:
        live = j < count
        if STOP:
            live = live & (log_T > log_eps)
        i = start + j
        t, _, sr, sg, sb, decay, sigma_dt = _sample(sigma_ptr, rgb_ptr, dt_ptr, t_ptr, i, live)
        w = T * (1.0 - decay)
        cr += w * sr
        cg += w * sg
        cb += w * sb
        op += w
        dep += w * t
        T = tl.where(live, T * decay, T)
        if STOP:
            keep += live.to(tl.int32)
            log_T = log_T - sigma_dt
        j += 1
    return cr, cg, cb, op, dep, keep, log_T


@triton.jit(do_not_specialize=("R",))  # renders composite groups of every size
def _composite_fwd(
    sigma_ptr,
    rgb_ptr,
    dt_ptr,
    t_ptr,
    start_ptr,
    count_ptr,
    out_rgb_ptr,
    out_op_ptr,
    out_depth_ptr,
    R,
    BLOCK: tl.constexpr,
):
    r, m, start, count = _lanes(start_ptr, count_ptr, R, BLOCK)
    no_stop = tl.zeros((BLOCK,), tl.float32)
    cr, cg, cb, op, dep, _, _ = _front_to_back(
        sigma_ptr, rgb_ptr, dt_ptr, t_ptr, start, count, no_stop, 0.0, BLOCK, False
    )
    tl.store(out_rgb_ptr + r * 3 + 0, cr, mask=m)
    tl.store(out_rgb_ptr + r * 3 + 1, cg, mask=m)
    tl.store(out_rgb_ptr + r * 3 + 2, cb, mask=m)
    tl.store(out_op_ptr + r, op, mask=m)
    tl.store(out_depth_ptr + r, dep, mask=m)


@triton.jit
def _composite_bwd(
    sigma_ptr,
    rgb_ptr,
    dt_ptr,
    t_ptr,
    start_ptr,
    count_ptr,
    out_rgb_ptr,
    out_op_ptr,
    out_depth_ptr,
    g_rgb_ptr,
    g_op_ptr,
    g_depth_ptr,
    g_sigma_ptr,
    g_samples_rgb_ptr,
    R,
    BLOCK: tl.constexpr,
):
    r, m, start, count = _lanes(start_ptr, count_ptr, R, BLOCK)
    gr = tl.load(g_rgb_ptr + r * 3 + 0, mask=m, other=0.0)
    gg = tl.load(g_rgb_ptr + r * 3 + 1, mask=m, other=0.0)
    gb = tl.load(g_rgb_ptr + r * 3 + 2, mask=m, other=0.0)
    go = tl.load(g_op_ptr + r, mask=m, other=0.0)
    gd = tl.load(g_depth_ptr + r, mask=m, other=0.0)
    # g . C_total, then the running suffix g . sum_{i>j} w_i c_i = total - prefix
    total = (
        gr * tl.load(out_rgb_ptr + r * 3 + 0, mask=m, other=0.0)
        + gg * tl.load(out_rgb_ptr + r * 3 + 1, mask=m, other=0.0)
        + gb * tl.load(out_rgb_ptr + r * 3 + 2, mask=m, other=0.0)
        + go * tl.load(out_op_ptr + r, mask=m, other=0.0)
        + gd * tl.load(out_depth_ptr + r, mask=m, other=0.0)
    )
    prefix = tl.zeros((BLOCK,), tl.float32)
    T = tl.full((BLOCK,), 1.0, tl.float32)
    n_max = tl.max(count, axis=0)
    j = 0
    while j < n_max:
        live = j < count
        i = start + j
        t, dt, cr, cg, cb, decay, _ = _sample(sigma_ptr, rgb_ptr, dt_ptr, t_ptr, i, live)
        w = T * (1.0 - decay)
        T_next = T * decay
        gc = gr * cr + gg * cg + gb * cb + go + gd * t
        prefix += w * gc
        g_sigma = dt * (T_next * gc - (total - prefix))
        tl.store(g_sigma_ptr + i, g_sigma, mask=live)
        tl.store(g_samples_rgb_ptr + i * 3 + 0, w * gr, mask=live)
        tl.store(g_samples_rgb_ptr + i * 3 + 1, w * gg, mask=live)
        tl.store(g_samples_rgb_ptr + i * 3 + 2, w * gb, mask=live)
        T = tl.where(live, T_next, T)
        j += 1


@triton.jit(do_not_specialize=("R",))
def _count_until_opaque(
    sigma_ptr, dt_ptr, start_ptr, count_ptr, keep_ptr, log_t_ptr, R, eps, BLOCK: tl.constexpr, CARRY: tl.constexpr
):
    """keep[r]: the samples of ray r whose transmittance before them exceeds eps (a prefix). CARRY: the ray's
    -sum(sigma dt) starts from log_t[r] (its samples before these) and is written back after the kept ones."""
    r, m, start, count = _lanes(start_ptr, count_ptr, R, BLOCK)
    log_T = tl.zeros((BLOCK,), tl.float32)  # -sum(sigma dt) so far, as the reference computes it
    if CARRY:
        log_T = tl.load(log_t_ptr + r, mask=m, other=0.0)
    keep = tl.zeros((BLOCK,), tl.int32)
    log_eps = tl.log(eps)
    n_max = tl.max(count, axis=0)
    j = 0
    while j < n_max:
        live = (j < count) & (log_T > log_eps)
        i = start + j
        sigma = tl.load(sigma_ptr + i, mask=live, other=0.0).to(tl.float32)
        dt = tl.load(dt_ptr + i, mask=live, other=0.0)
        keep += live.to(tl.int32)
        log_T = log_T - sigma * dt
        j += 1
    tl.store(keep_ptr + r, keep, mask=m)
    if CARRY:
        tl.store(log_t_ptr + r, log_T, mask=m)


@triton.jit(do_not_specialize=("R",))
def _composite_into(
    sigma_ptr,
    rgb_ptr,
    dt_ptr,
    t_ptr,
    start_ptr,
    count_ptr,
    ids_ptr,
    log_t_ptr,
    trans_ptr,
    acc_rgb_ptr,
    acc_depth_ptr,
    keep_ptr,
    R,
    eps,
    BLOCK: tl.constexpr,
):
    """``_count_until_opaque`` (CARRY) and ``_composite_fwd`` over the kept prefix, in one walk, for the group's
    lane r = ray ids[r]: its colour and depth go onto acc_*[ray] under its transmittance trans[ray], which then
    takes the window's decay; log_t[ray] carries -sum(sigma dt)."""
    r, m, start, count = _lanes(start_ptr, count_ptr, R, BLOCK)
    ray = tl.load(ids_ptr + r, mask=m, other=0).to(tl.int64)
    log_T = tl.load(log_t_ptr + ray, mask=m, other=0.0)
    cr, cg, cb, op, dep, keep, log_T = _front_to_back(
        sigma_ptr, rgb_ptr, dt_ptr, t_ptr, start, count, log_T, tl.log(eps), BLOCK, True
    )
    before = tl.load(trans_ptr + ray, mask=m, other=0.0)
    tl.store(acc_rgb_ptr + ray * 3 + 0, tl.load(acc_rgb_ptr + ray * 3 + 0, mask=m, other=0.0) + before * cr, mask=m)
    tl.store(acc_rgb_ptr + ray * 3 + 1, tl.load(acc_rgb_ptr + ray * 3 + 1, mask=m, other=0.0) + before * cg, mask=m)
    tl.store(acc_rgb_ptr + ray * 3 + 2, tl.load(acc_rgb_ptr + ray * 3 + 2, mask=m, other=0.0) + before * cb, mask=m)
    tl.store(acc_depth_ptr + ray, tl.load(acc_depth_ptr + ray, mask=m, other=0.0) + before * dep, mask=m)
    tl.store(trans_ptr + ray, before * (1.0 - op), mask=m)
    tl.store(log_t_ptr + ray, log_T, mask=m)
    tl.store(keep_ptr + r, keep, mask=m)


BLOCK = 64


def _grid(R: int) -> tuple[int]:
    return (triton.cdiv(max(R, 1), BLOCK),)


class CompositeFunction(torch.autograd.Function):
    """(sigma ``[M]``, rgb ``[M, 3]``, dt, t ``[M]``, start, count ``[R]``) -> rgb ``[R, 3]``, opacity, depth ``[R]``."""

    @staticmethod
    def forward(ctx, sigma: Tensor, rgb: Tensor, dt: Tensor, t: Tensor, start: Tensor, count: Tensor):
        R = start.shape[0]
        dev = sigma.device
        out_rgb = torch.zeros(R, 3, device=dev)
        out_op = torch.zeros(R, device=dev)
        out_depth = torch.zeros(R, device=dev)
        sigma, rgb = sigma.contiguous(), rgb.contiguous()
        if R:
            _composite_fwd[_grid(R)](sigma, rgb, dt, t, start, count, out_rgb, out_op, out_depth, R, BLOCK=BLOCK)
        ctx.save_for_backward(sigma, rgb, dt, t, start, count, out_rgb, out_op, out_depth)
        return out_rgb, out_op, out_depth

    @staticmethod
    def backward(ctx, g_rgb: Tensor, g_op: Tensor, g_depth: Tensor):
        sigma, rgb, dt, t, start, count, out_rgb, out_op, out_depth = ctx.saved_tensors
        R = start.shape[0]
        g_sigma = torch.zeros(sigma.shape, device=sigma.device, dtype=torch.float32)
        g_rgb_samples = torch.zeros(rgb.shape, device=rgb.device, dtype=torch.float32)
        if R:
            _composite_bwd[_grid(R)](
                sigma,
                rgb,
                dt,
                t,
                start,
                count,
                out_rgb,
                out_op,
                out_depth,
                g_rgb.float().contiguous(),
                g_op.float().contiguous(),
                g_depth.float().contiguous(),
                g_sigma,
                g_rgb_samples,
                R,
                BLOCK=BLOCK,
            )
        return g_sigma.to(sigma.dtype), g_rgb_samples.to(rgb.dtype), None, None, None, None


def composite(sigma: Tensor, rgb: Tensor, dt: Tensor, t: Tensor, start: Tensor, count: Tensor):
    """Differentiable compositing of packed samples -> rgb ``[R, 3]``, opacity ``[R]``, depth ``[R]``."""
    return CompositeFunction.apply(sigma, rgb, dt.float().contiguous(), t.float().contiguous(), start, count)


def count_until_opaque(
    sigma: Tensor, dt: Tensor, start: Tensor, count: Tensor, eps: float, log_t: Tensor | None = None
) -> Tensor:
    """Per ray, how many leading samples have transmittance above ``eps`` ``[R]`` int32. ``log_t`` ``[R]`` float32
    (contiguous; updated in place): each ray's -sum(sigma dt) over its samples before these, and after the
    kept ones on return (rays rendered in windows of their samples, ``render.fast.render_rays_fast``)."""
    R = start.shape[0]
    keep = torch.zeros(R, device=sigma.device, dtype=torch.int32)
    if R:
        _count_until_opaque[_grid(R)](
            sigma.contiguous(),
            dt.float().contiguous(),
            start,
            count,
            keep,
            keep if log_t is None else log_t,
            R,
            float(eps),
            BLOCK=BLOCK,
            CARRY=log_t is not None,
        )
    return keep


def composite_into(
    sigma: Tensor,
    rgb: Tensor,
    dt: Tensor,
    t: Tensor,
    start: Tensor,
    count: Tensor,
    ids: Tensor,
    eps: float,
    log_t: Tensor,
    transmittance: Tensor,
    acc_rgb: Tensor,
    acc_depth: Tensor,
) -> Tensor:
    """Inference (no gradients): for lane r of a group of rays (ray ``ids[r]``, ``[G]`` int64, no repeats), its
    packed samples ``start[r] .. start[r] + count[r]`` (sigma ``[M]``, rgb ``[M, 3]``, dt, t ``[M]``) up to
    transmittance ``eps`` (``count_until_opaque`` with ``log_t``) composited (``composite``) and added to the
    ray's state, all ``[R]``/``[R, 3]`` float32 contiguous and updated in place: ``acc_rgb`` and ``acc_depth``
    += transmittance x the window's colour and depth, ``transmittance`` x= 1 - the window's opacity, ``log_t``
    -= sum(sigma dt) over the kept samples. One launch where the torch sequence takes about fifteen. Returns the
    kept count per lane ``[G]`` int32."""
    G = start.shape[0]
    keep = torch.empty(G, device=sigma.device, dtype=torch.int32)
    if G:
        _composite_into[_grid(G)](
            sigma.contiguous(),
            rgb.contiguous(),
            dt.float().contiguous(),
            t.float().contiguous(),
            start,
            count,
            ids,
            log_t,
            transmittance,
            acc_rgb,
            acc_depth,
            keep,
            G,
            float(eps),
            BLOCK=BLOCK,
        )
    return keep
