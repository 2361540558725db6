"""Fully fused MLPs in Triton: forward and backward of a bias-free ReLU MLP, one kernel each.

Twin of ``make_mlp``'s ``nn.Sequential`` of bias-free ``nn.Linear`` layers (``hvd_ngp.model.field``), like
tiny-cuda-nn's FullyFusedMLP: ``n_input -> width (x n_hidden_layers) -> n_output``, width a power of two
in 16..128, 1..3 hidden layers. The weights are the ``nn.Linear`` parameters themselves (``[out, in]``
fp32), so state dicts and snapshots are those of the twin.

Kernels (grid: ``min(row blocks, programs)``; each program loads every weight matrix once, cast to the
math's dtype, and then walks row blocks ``pid, pid + programs, ...``, so the weights stay on chip):

- forward: a block of ``FWD_BLOCK`` rows goes through every layer in registers (``tl.dot``);
- backward: a block of ``BWD_BLOCK`` rows (fewer where the device's shared memory cannot hold that many,
  chosen before the first launch from the compiled kernel's need and the device's limit: see
  ``launch_fitting``) *recomputes* the forward (nothing but the input is saved: no ``[N, width]``
  activations written or read back), then back-propagates layer by layer. Each program
  sums its weight gradients over its row blocks in fp32 registers and adds them once into fp32
  gradient buffers with ``tl.atomic_add`` (so the summation order, and the last bits, vary run to run).

Math (``dot``): "fp16" / "bf16" cast inputs, weights, activations and incoming gradients to half and
accumulate in fp32 on the tensor cores; the output is half, like ``nn.Linear`` under autocast. "ieee"
is fp32 throughout; "tf32" is fp32 with tf32 tensor-core products. ``FusedMLP`` picks fp16/bf16 from
the autocast state (``--precision``), otherwise the math a ``triton_support.inference_math`` context names
(the inference renderers' ``render.volume.INFERENCE_MATH``), otherwise tf32 when
``torch.backends.cuda.matmul.allow_tf32`` is set (what torch's own fp32 matmuls would do), else ieee.

Without gradients, ``FusedMLP.forward_sh`` feeds the colour network from directions and features: the forward
kernel computes the directions' SH basis itself (``_sh_input``), so the ``[N, 32]`` input is never in memory.

The input may have any 2-D strides: the hash grid's feature-major output (``[L * F, N]`` in memory) is read
as it lies, and its gradient is written in the same layout.

``n_rows`` (optional int32/int64 device scalar): only rows ``< n_rows`` are computed; the grid is
sized for all rows (static sizes for CUDA-graph replay) and programs past the count do nothing. Output
rows ``>= n_rows`` (and their input gradients) are zeros.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor, nn

from ..triton_support import inference_math_now
from .encoding.hashgrid_triton import _rows  # the row count a launch computes: N, or min(N, *count)
from .encoding.sh_triton import sh_basis

WIDTHS = (16, 32, 64, 128)
MAX_HIDDEN_LAYERS = 3
FWD_BLOCK, FWD_WARPS = 128, 4
BWD_BLOCK, BWD_WARPS = 64, 4
PROGRAMS_PER_SM = 2
INTERPRETER_PROGRAMS = 3  # under the CPU interpreter: few programs, several row blocks each
DOTS = ("ieee", "tf32", "fp16", "bf16")


@triton.jit
def _cast(x, DOT: tl.constexpr):
    """x in the dtype ``tl.dot`` takes for this math."""
    if DOT == "fp16":
        y = x.to(tl.float16)
    elif DOT == "bf16":
        y = x.to(tl.bfloat16)
    else:
        y = x.to(tl.float32)
    return y


@triton.jit
def _mm(a, b, DOT: tl.constexpr):
    """a ``[M, K]`` @ b ``[K, N]`` (both already ``_cast``) -> fp32 ``[M, N]``."""
    if DOT == "tf32":
        c = tl.dot(a, b, input_precision="tf32")
    elif DOT == "ieee":
        c = tl.dot(a, b, input_precision="ieee")
    else:
        c = tl.dot(a, b)
    return c


@triton.jit
def _act(z, RELU: tl.constexpr):
    if RELU:
        z = tl.maximum(z, 0.0)
    return z


@triton.jit
def _load_w(
    w_ptr,
    J: tl.constexpr,
    K: tl.constexpr,
    J_P: tl.constexpr,
    K_P: tl.constexpr,
    TRANS: tl.constexpr,
    DOT: tl.constexpr,
):
    """A weight ``[J, K]`` (row-major fp32) as a ``[J_P, K_P]`` tile, or ``[K_P, J_P]`` when TRANS, zero-padded."""
    if TRANS:
        k = tl.arange(0, K_P)[:, None]
        j = tl.arange(0, J_P)[None, :]
    else:
        j = tl.arange(0, J_P)[:, None]
        k = tl.arange(0, K_P)[None, :]
    w = tl.load(w_ptr + j * K + k, mask=(j < J) & (k < K), other=0.0)
    return _cast(w, DOT)


@triton.jit
def _sh_input(d_ptr, x_ptr, x_row, x_col, r, rm, k, SH: tl.constexpr, IN: tl.constexpr):
    """The colour network's input rows ``r`` as a ``[BLOCK, IN_P]`` fp32 tile: the real SH basis (degree ``SH``,
    ``SH**2`` columns; ``sh_triton.sh_basis``) of the unit directions d ``[N, 3]``, then the features x
    ``[N, IN - SH**2]``; zeros in the padding and on masked rows."""
    D2: tl.constexpr = SH * SH
    c = k[None, :]
    feat = tl.load(
        x_ptr + r[:, None] * x_row + tl.maximum(c - D2, 0) * x_col, mask=rm[:, None] & (c >= D2) & (c < IN), other=0.0
    ).to(tl.float32)
    x = tl.load(d_ptr + r * 3, mask=rm, other=0.0)[:, None]
    y = tl.load(d_ptr + r * 3 + 1, mask=rm, other=0.0)[:, None]
    z = tl.load(d_ptr + r * 3 + 2, mask=rm, other=0.0)[:, None]
    t = feat
    for b in tl.static_range(D2):
        t = tl.where(c == b, sh_basis(x, y, z, b), t)
    return tl.where(rm[:, None], t, 0.0)


@triton.jit(do_not_specialize=("N",))
def _mlp_fwd(
    x_ptr,
    x_row,
    x_col,
    w_in_ptr,
    w_h1_ptr,
    w_h2_ptr,
    w_out_ptr,
    out_ptr,
    count_ptr,
    d_ptr,
    N,
    IN: tl.constexpr,
    IN_P: tl.constexpr,
    H: tl.constexpr,
    OUT: tl.constexpr,
    OUT_P: tl.constexpr,
    DEPTH: tl.constexpr,
    RELU: tl.constexpr,
    DOT: tl.constexpr,
    HAS_COUNT: tl.constexpr,
    SH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out ``[N, OUT]`` = MLP(x ``[N, IN]``, element ``(r, k)`` at ``x_ptr + r * x_row + k * x_col``); weights
    ``[H, IN]``, ``[H, H]`` x (DEPTH - 1), ``[OUT, H]``. With ``SH`` > 0 the input is the SH basis of directions
    d ``[N, 3]`` (``d_ptr``) beside x ``[N, IN - SH**2]`` (``_sh_input``: the colour network's, never in memory)."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    N = _rows(count_ptr, N, HAS_COUNT)
    w0t = _load_w(w_in_ptr, H, IN, H, IN_P, True, DOT)  # [IN_P, H]
    if DEPTH >= 2:
        w1t = _load_w(w_h1_ptr, H, H, H, H, True, DOT)  # [H, H]
    if DEPTH >= 3:
        w2t = _load_w(w_h2_ptr, H, H, H, H, True, DOT)
    wot = _load_w(w_out_ptr, OUT, H, OUT_P, H, True, DOT)  # [H, OUT_P]
    k = tl.arange(0, IN_P)
    o = tl.arange(0, OUT_P)
    for blk in range(pid, tl.cdiv(N, BLOCK), n_prog):
        r = (blk * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
        rm = r < N
        if SH > 0:
            x = _sh_input(d_ptr, x_ptr, x_row, x_col, r, rm, k, SH, IN)
        else:
            x = tl.load(
                x_ptr + r[:, None] * x_row + k[None, :] * x_col, mask=rm[:, None] & (k < IN)[None, :], other=0.0
            )
        h = _cast(_act(_mm(_cast(x, DOT), w0t, DOT), RELU), DOT)
        if DEPTH >= 2:
            h = _cast(_act(_mm(h, w1t, DOT), RELU), DOT)
        if DEPTH >= 3:
            h = _cast(_act(_mm(h, w2t, DOT), RELU), DOT)
        y = _mm(h, wot, DOT)
        tl.store(out_ptr + r[:, None] * OUT + o[None, :], y, mask=rm[:, None] & (o < OUT)[None, :])


@triton.jit
def _back(g, z, a_prev, w, dw, RELU: tl.constexpr, DOT: tl.constexpr, NEED_INPUT: tl.constexpr):
    """One layer back: g ``[B, J]`` (gradient of the layer's activation), z ``[B, J]`` its pre-activation,
    a_prev ``[B, K]`` its input, w ``[J, K]``; dw ``[J, K]`` += (g * relu'(z))^T a_prev. -> (gradient of
    the layer's input ``[B, K]`` fp32 (zeros when not NEED_INPUT), dw)."""
    if RELU:
        g = tl.where(z > 0, g, 0.0)
    gc = _cast(g, DOT)
    dw += _mm(tl.trans(gc), a_prev, DOT)
    if NEED_INPUT:
        g_in = _mm(gc, w, DOT)
    else:
        g_in = tl.zeros((g.shape[0], w.shape[1]), tl.float32)
    return g_in, dw


@triton.jit
def _add_grad(dw_ptr, dw, J: tl.constexpr, K: tl.constexpr, J_P: tl.constexpr, K_P: tl.constexpr):
    j = tl.arange(0, J_P)[:, None]
    k = tl.arange(0, K_P)[None, :]
    tl.atomic_add(dw_ptr + j * K + k, dw, mask=(j < J) & (k < K), sem="relaxed")


@triton.jit
def _mlp_bwd(
    x_ptr,
    x_row,
    x_col,
    w_in_ptr,
    w_h1_ptr,
    w_h2_ptr,
    w_out_ptr,
    g_out_ptr,
    g_x_ptr,
    g_x_row,
    g_x_col,
    g_in_ptr,
    g_h1_ptr,
    g_h2_ptr,
    g_out_w_ptr,
    count_ptr,
    N,
    IN: tl.constexpr,
    IN_P: tl.constexpr,
    H: tl.constexpr,
    OUT: tl.constexpr,
    OUT_P: tl.constexpr,
    DEPTH: tl.constexpr,
    RELU: tl.constexpr,
    DOT: tl.constexpr,
    HAS_COUNT: tl.constexpr,
    NEED_GX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Gradients of ``_mlp_fwd``: g_x ``[N, IN]`` (strides ``g_x_row``, ``g_x_col``; when NEED_GX) and each
    weight's (fp32, added into ``g_*_ptr``), from g_out ``[N, OUT]``; the forward is recomputed block by block."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    N = _rows(count_ptr, N, HAS_COUNT)
    n_blocks = tl.cdiv(N, BLOCK)
    w0t = _load_w(w_in_ptr, H, IN, H, IN_P, True, DOT)
    w0 = _load_w(w_in_ptr, H, IN, H, IN_P, False, DOT)  # [H, IN_P]
    dw0 = tl.zeros((H, IN_P), tl.float32)
    if DEPTH >= 2:
        w1t = _load_w(w_h1_ptr, H, H, H, H, True, DOT)
        w1 = _load_w(w_h1_ptr, H, H, H, H, False, DOT)
        dw1 = tl.zeros((H, H), tl.float32)
    if DEPTH >= 3:
        w2t = _load_w(w_h2_ptr, H, H, H, H, True, DOT)
        w2 = _load_w(w_h2_ptr, H, H, H, H, False, DOT)
        dw2 = tl.zeros((H, H), tl.float32)
    wo = _load_w(w_out_ptr, OUT, H, OUT_P, H, False, DOT)  # [OUT_P, H]
    dwo = tl.zeros((OUT_P, H), tl.float32)
    k = tl.arange(0, IN_P)
    o = tl.arange(0, OUT_P)
    for blk in range(pid, n_blocks, n_prog):
        r = (blk * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
        rm = r < N
        xm = rm[:, None] & (k < IN)[None, :]
        a0 = _cast(tl.load(x_ptr + r[:, None] * x_row + k[None, :] * x_col, mask=xm, other=0.0), DOT)
        z1 = _mm(a0, w0t, DOT)
        a = _cast(_act(z1, RELU), DOT)
        a1 = a
        if DEPTH >= 2:
            z2 = _mm(a1, w1t, DOT)
            a = _cast(_act(z2, RELU), DOT)
            a2 = a
        if DEPTH >= 3:
            z3 = _mm(a2, w2t, DOT)
            a = _cast(_act(z3, RELU), DOT)
        g = tl.load(g_out_ptr + r[:, None] * OUT + o[None, :], mask=rm[:, None] & (o < OUT)[None, :], other=0.0)
        g, dwo = _back(g, g, a, wo, dwo, False, DOT, True)  # output layer: no activation
        if DEPTH >= 3:
            g, dw2 = _back(g, z3, a2, w2, dw2, RELU, DOT, True)
        if DEPTH >= 2:
            g, dw1 = _back(g, z2, a1, w1, dw1, RELU, DOT, True)
        g, dw0 = _back(g, z1, a0, w0, dw0, RELU, DOT, NEED_GX)
        if NEED_GX:
            tl.store(g_x_ptr + r[:, None] * g_x_row + k[None, :] * g_x_col, g, mask=xm)
    if pid < n_blocks:
        _add_grad(g_in_ptr, dw0, H, IN, H, IN_P)
        if DEPTH >= 2:
            _add_grad(g_h1_ptr, dw1, H, H, H, H)
        if DEPTH >= 3:
            _add_grad(g_h2_ptr, dw2, H, H, H, H)
        _add_grad(g_out_w_ptr, dwo, OUT, H, OUT_P, H)


def _pad(n: int) -> int:
    """The tile size of a dimension: a power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, triton.next_power_of_2(n))


_SM_COUNT: dict[int, int] = {}
_SHARED_LIMIT: dict[int, int | None] = {}
#: the row block that fitted the device's shared memory, per (kernel, constexprs, device)
_FITTED_BLOCK: dict[tuple, int] = {}
MIN_BLOCK = 16  # tl.dot's smallest tile


def max_shared_memory(device: torch.device) -> int | None:
    """Bytes of shared memory one program may use on ``device``: the limit Triton holds a compiled kernel to
    (its driver's ``max_shared_mem``; torch's ``shared_memory_per_block_optin`` if that is not there), e.g.
    232448 on an H100 or H200. None off CUDA (the CPU interpreter has no such limit)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SHARED_LIMIT:
        limit: int | None
        try:
            limit = int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])
        except (AttributeError, KeyError, RuntimeError, TypeError):
            limit = int(getattr(torch.cuda.get_device_properties(index), "shared_memory_per_block_optin", 0)) or None
        _SHARED_LIMIT[index] = limit
    return _SHARED_LIMIT[index]


def fitting_block(block: int, shared_bytes: Callable[[int], int], limit: int | None) -> int:
    """The largest row block ``block``, ``block / 2``, ... (at least ``MIN_BLOCK``) whose ``shared_bytes(block)``
    is within ``limit`` bytes; ``block`` itself without a limit. Raises Triton's ``OutOfResources`` (the
    smallest block's need against the limit) when none fits."""
    if limit is None:
        return block
    while True:
        need = shared_bytes(block)
        if need <= limit:
            return block
        if block // 2 < MIN_BLOCK:
            raise triton.runtime.errors.OutOfResources(need, limit, "shared memory")
        block //= 2


def _compiled_shared_bytes(
    kernel, n: int, device: torch.device, args: tuple, constexprs: dict, num_warps: int
) -> Callable[[int], int]:
    """``block -> shared memory bytes`` of ``kernel`` compiled (not launched) at that block: Triton's own number,
    the one its launch checks; the compiled kernel stays in Triton's cache for the launch."""

    def shared(block: int) -> int:
        compiled = kernel.warmup(
            *args, **constexprs, BLOCK=block, num_warps=num_warps, grid=(programs(n, block, device),)
        )
        return int(compiled.metadata.shared)

    return shared


def launch_fitting(
    kernel, n: int, block: int, device: torch.device, args: tuple, constexprs: dict, num_warps: int
) -> int:
    """Launch ``kernel`` over ``n`` rows with the largest row block <= ``block`` whose shared memory the device
    holds. The first launch of a (kernel, constexprs, device) chooses the block up front: each candidate is
    compiled, and its shared memory compared with ``max_shared_memory(device)`` (``fitting_block``; e.g. the
    128-wide fp32 backward at 64 rows needs 256 KiB where an H100 has 227 KiB). Should a launch still be
    refused (Triton's ``OutOfResources``: a Triton without ``warmup``, another resource), the block is halved,
    down to ``MIN_BLOCK``. The block that fitted is remembered. Returns the block launched."""
    key = (kernel.fn.__name__, tuple(sorted(constexprs.items())), str(device))
    if key not in _FITTED_BLOCK and hasattr(kernel, "warmup"):
        limit = max_shared_memory(device)
        if limit is not None:
            try:
                block = fitting_block(
                    block, _compiled_shared_bytes(kernel, n, device, args, constexprs, num_warps), limit
                )
            except (AttributeError, TypeError):  # a Triton whose warmup or metadata differ: the launch decides
                pass
    block = _FITTED_BLOCK.get(key, block)
    while True:
        try:
            kernel[(programs(n, block, device),)](*args, **constexprs, BLOCK=block, num_warps=num_warps)
        except triton.runtime.errors.OutOfResources:
            if block // 2 < MIN_BLOCK:
                raise
            block //= 2
            continue
        _FITTED_BLOCK[key] = block
        return block


def programs(n: int, block: int, device: torch.device) -> int:
    """Programs of a launch over ``n`` rows: one per row block, at most ``PROGRAMS_PER_SM`` per SM."""
    blocks = triton.cdiv(n, block)
    if device.type != "cuda":
        return min(blocks, INTERPRETER_PROGRAMS)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return min(blocks, _SM_COUNT[index] * PROGRAMS_PER_SM)


def _constexprs(weights: tuple[Tensor, ...], relu: bool, dot: str, has_count: bool) -> dict:
    n_in, width, n_out = weights[0].shape[1], weights[0].shape[0], weights[-1].shape[0]
    return dict(
        IN=n_in,
        IN_P=_pad(n_in),
        H=width,
        OUT=n_out,
        OUT_P=_pad(n_out),
        DEPTH=len(weights) - 1,
        RELU=relu,
        DOT=dot,
        HAS_COUNT=has_count,
    )


def _weight_args(weights: Sequence[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(w_in, w_h1, w_h2, w_out): the unused hidden slots repeat the output weight (never read)."""
    hidden = list(weights[1:-1]) + [weights[-1]] * (MAX_HIDDEN_LAYERS - len(weights) + 1)
    return weights[0], hidden[0], hidden[1], weights[-1]


def mlp_forward(
    x: Tensor,
    weights: Sequence[Tensor],
    relu: bool,
    dot: str,
    n_rows: Tensor | None = None,
    directions: Tensor | None = None,
    sh_degree: int = 0,
) -> Tensor:
    """The forward kernel, no gradients: x ``[N, IN]`` -> ``[N, n_out]`` (half for dot "fp16"/"bf16", else fp32;
    zeros past ``n_rows``). With ``sh_degree`` > 0 the input is the SH basis of ``directions`` ``[N, 3]`` (fp32,
    contiguous) beside x ``[N, IN - sh_degree**2]``, computed in the kernel (the colour network's input)."""
    n = x.shape[0]
    out_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(dot, torch.float32)
    alloc = torch.empty if n_rows is None else torch.zeros
    out = alloc(n, weights[-1].shape[0], device=x.device, dtype=out_dtype)
    if n:
        launch_fitting(
            _mlp_fwd,
            n,
            FWD_BLOCK,
            x.device,
            (
                x,
                *x.stride(),
                *_weight_args(weights),
                out,
                x if n_rows is None else n_rows,
                x if directions is None else directions,  # a placeholder pointer without SH (never read)
                n,
            ),
            {**_constexprs(tuple(weights), relu, dot, n_rows is not None), "SH": sh_degree},
            FWD_WARPS,
        )
    return out


class _FusedMLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, n_rows: Tensor | None, relu: bool, dot: str, *weights: Tensor) -> Tensor:
        ctx.save_for_backward(x, *weights)
        ctx.n_rows, ctx.relu, ctx.dot = n_rows, relu, dot
        return mlp_forward(x, weights, relu, dot, n_rows)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, *weights = ctx.saved_tensors
        n, n_rows = x.shape[0], ctx.n_rows
        need_gx = ctx.needs_input_grad[0]
        flat = torch.zeros(sum(w.numel() for w in weights), device=x.device, dtype=torch.float32)
        grads = [g.view(w.shape) for g, w in zip(flat.split([w.numel() for w in weights]), weights)]
        # empty_like/zeros_like keep x's strides: the hash grid's feature-major output gets its gradient in that layout
        g_x = (torch.empty_like(x) if n_rows is None else torch.zeros_like(x)) if need_gx else None
        g_x_args = (x, 0, 0) if g_x is None else (g_x, *g_x.stride())  # a placeholder without NEED_GX (never written)
        if n:
            launch_fitting(
                _mlp_bwd,
                n,
                BWD_BLOCK,
                x.device,
                (
                    x,
                    *x.stride(),
                    *_weight_args(weights),
                    grad.contiguous(),
                    *g_x_args,
                    *_weight_args(grads),
                    x if n_rows is None else n_rows,
                    n,
                ),
                {**_constexprs(weights, ctx.relu, ctx.dot, n_rows is not None), "NEED_GX": need_gx},
                BWD_WARPS,
            )
        elif g_x is not None:  # need_gx
            g_x.zero_()
        return (g_x, None, None, None, *(g.to(w.dtype) for g, w in zip(grads, weights)))


def fused_mlp(
    x: Tensor,
    weights: list[Tensor] | tuple[Tensor, ...],
    relu: bool = True,
    dot: str = "ieee",
    n_rows: Tensor | None = None,
) -> Tensor:
    """x ``[N, n_in]`` through bias-free linear layers ``weights`` (``[out, in]`` each: ``[width, n_in]``,
    ``[width, width]`` x (layers - 1), ``[n_out, width]``), ReLU between them -> ``[N, n_out]`` (half for
    dot "fp16"/"bf16", else fp32); differentiable in x and the weights. ``n_rows``: see the module docstring."""
    if dot not in DOTS:
        raise ValueError(f"dot must be one of {DOTS}, got {dot!r}")
    if not FusedMLP.supports(weights[0].shape[0], len(weights) - 1):
        raise ValueError(f"the fused MLP takes widths {WIDTHS} and 1..{MAX_HIDDEN_LAYERS} hidden layers")
    return _FusedMLPFunction.apply(x, n_rows, relu, dot, *weights)


def autocast_dot(device_type: str) -> str:
    """The math of the current context: the autocast dtype when autocast is on; else fp16 inside
    ``triton_support.inference_math("fp16")``; else fp32 (on CUDA: tf32 inside ``inference_math("tf32")`` or
    when torch allows tf32 matmuls)."""
    if torch.is_autocast_enabled(device_type):
        return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(torch.get_autocast_dtype(device_type), "ieee")
    scoped = inference_math_now()  # the renderers' choice (render.volume.INFERENCE_MATH), else torch's flag
    if scoped == "fp16":
        return scoped
    if device_type != "cuda":
        return "ieee"
    if scoped is not None:
        return scoped
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


class FusedMLP(nn.Sequential):
    """``make_mlp``'s ``nn.Sequential`` (the same modules, parameters and state-dict keys) computed by the
    fused Triton kernels. ``forward(x [N, n_in], n_rows=None) -> [N, n_out]``; ``reference(x)`` is the
    torch twin on the same weights.

    ``train_fused=False``: passes that record gradients run the torch twin (cuBLAS: on an H200 its fp32
    backward beat the fused one 8-13x), passes without gradients (the density pass, occupancy updates,
    evaluation) the fused forward kernel, which also skips rows past ``n_rows``."""

    skips_rows = True  # forward takes n_rows (the field passes the count through)
    casts_input = True  # without gradients the kernel reads a half or fp32 input and casts it to its math itself

    def __init__(self, *layers: nn.Module, train_fused: bool = True) -> None:
        super().__init__(*layers)
        self.train_fused = train_fused
        linears = [m for m in self if isinstance(m, nn.Linear)]
        if any(m.bias is not None for m in linears) or not self.supports(linears[0].out_features, len(linears) - 1):
            raise ValueError(
                "FusedMLP takes bias-free linear layers of one width in "
                f"{WIDTHS} with 1..{MAX_HIDDEN_LAYERS} hidden layers"
            )
        self.relu = any(isinstance(m, nn.ReLU) for m in self)
        self._linears = tuple(linears)

    @staticmethod
    def supports(width: int, n_hidden_layers: int) -> bool:
        return width in WIDTHS and 1 <= n_hidden_layers <= MAX_HIDDEN_LAYERS

    def forward(self, x: Tensor, n_rows: Tensor | None = None) -> Tensor:
        if not self.train_fused and torch.is_grad_enabled():
            return super().forward(x)  # the torch twin; rows past n_rows are computed too, and unused
        w = tuple(m.weight for m in self._linears)
        return _FusedMLPFunction.apply(x, n_rows, self.relu, autocast_dot(x.device.type), *w)

    def forward_sh(self, directions: Tensor, geo: Tensor, degree: int, n_rows: Tensor | None = None) -> Tensor:
        """Without gradients: the MLP of ``[sh_encode(directions, degree), geo]`` (``encoding.sh``'s
        ``concat``), the basis computed in the kernel instead of a ``[N, degree**2 + G]`` input in memory:
        directions ``[N, 3]``, geo ``[N, G]`` -> ``[N, n_out]``."""
        if torch.is_grad_enabled() and (geo.requires_grad or any(m.weight.requires_grad for m in self._linears)):
            raise RuntimeError("FusedMLP.forward_sh has no backward: call it without gradients")
        if self._linears[0].in_features != degree * degree + geo.shape[1]:
            raise ValueError(
                f"an SH input of degree {degree} and {geo.shape[1]} features does not feed a layer of "
                f"{self._linears[0].in_features} inputs"
            )
        w = tuple(m.weight for m in self._linears)
        d = directions.float().contiguous()
        return mlp_forward(geo, w, self.relu, autocast_dot(geo.device.type), n_rows, d, degree)

    def reference(self, x: Tensor) -> Tensor:
        return super().forward(x)
