"""The colour network's input in one Triton kernel: spherical harmonics of the directions beside the
geometry features.

Twin of ``SphericalHarmonics.concat`` (``torch.cat([sh_encode(d), geo], -1)``: about forty elementwise
kernels for degree 4, one per product and constant in ``sh_encode``, then the concatenation). One program
handles ``BLOCK`` rows: it reads a direction, evaluates the ``degree**2`` basis values (``sh_basis``, which the
fused colour MLP's input also uses) and writes them with
the row's geometry features into ``out`` ``[N, degree**2 + G]`` (the features' dtype). The backward hands
the features' columns of the incoming gradient back (directions take no gradient).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .sh import SphericalHarmonics

BLOCK = 128


@triton.jit
def sh_basis(x, y, z, C: tl.constexpr):
    """Real SH basis function ``C`` (0..15, ``sh.sh_encode``'s order) of unit directions (x, y, z), fp32, in
    their shape."""
    if C == 0:
        v = tl.full(x.shape, 0.28209479177387814, tl.float32)
    elif C == 1:
        v = -0.48860251190291987 * y
    elif C == 2:
        v = 0.48860251190291987 * z
    elif C == 3:
        v = -0.48860251190291987 * x
    elif C == 4:
        v = 1.0925484305920792 * (x * y)
    elif C == 5:
        v = -1.0925484305920792 * (y * z)
    elif C == 6:
        v = 0.94617469575755997 * (z * z) - 0.31539156525251999
    elif C == 7:
        v = -1.0925484305920792 * (x * z)
    elif C == 8:
        v = 0.54627421529603959 * (x * x) - 0.54627421529603959 * (y * y)
    elif C == 9:
        v = 0.59004358992664352 * y * (-3.0 * (x * x) + y * y)
    elif C == 10:
        v = 2.8906114426405538 * (x * y) * z
    elif C == 11:
        v = 0.45704579946446572 * y * (1.0 - 5.0 * (z * z))
    elif C == 12:
        v = 0.3731763325901154 * z * (5.0 * (z * z) - 3.0)
    elif C == 13:
        v = 0.45704579946446572 * x * (1.0 - 5.0 * (z * z))
    elif C == 14:
        v = 1.4453057213202769 * z * (x * x - y * y)
    else:
        v = 0.59004358992664352 * x * (-(x * x) + 3.0 * (y * y))
    return v


@triton.jit(do_not_specialize=("N",))
def _sh_concat(
    d_ptr, geo_ptr, geo_row, geo_col, out_ptr, N, DEGREE: tl.constexpr, G: tl.constexpr, BLOCK: tl.constexpr
):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    x = tl.load(d_ptr + i * 3, mask=m, other=0.0)
    y = tl.load(d_ptr + i * 3 + 1, mask=m, other=0.0)
    z = tl.load(d_ptr + i * 3 + 2, mask=m, other=0.0)
    W: tl.constexpr = DEGREE * DEGREE + G
    row = out_ptr + i.to(tl.int64) * W
    ty = out_ptr.dtype.element_ty
    for c in tl.static_range(DEGREE * DEGREE):
        tl.store(row + c, sh_basis(x, y, z, c).to(ty), mask=m)
    cols = tl.arange(0, G)
    g = tl.load(geo_ptr + i[:, None].to(tl.int64) * geo_row + cols[None, :] * geo_col, mask=m[:, None], other=0.0)
    tl.store(row[:, None] + DEGREE * DEGREE + cols[None, :], g.to(ty), mask=m[:, None])


class _ShConcat(torch.autograd.Function):
    @staticmethod
    def forward(ctx, d: Tensor, geo: Tensor, degree: int) -> Tensor:
        n, g = geo.shape
        out = torch.empty(n, degree * degree + g, device=geo.device, dtype=geo.dtype)
        if n:
            _sh_concat[(triton.cdiv(n, BLOCK),)](d, geo, *geo.stride(), out, n, DEGREE=degree, G=g, BLOCK=BLOCK)
        ctx.width = degree * degree
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        return None, grad[:, ctx.width :], None


class SphericalHarmonicsTriton(SphericalHarmonics):
    """``SphericalHarmonics`` whose ``concat`` is one Triton kernel (CUDA, or Triton's interpreter on CPU)
    where the features' width is a power of two; else the torch twin."""

    def concat(self, d: Tensor, geo: Tensor) -> Tensor:
        g = geo.shape[1]
        if g & (g - 1) or d.dtype != torch.float32:
            return super().concat(d, geo)
        return _ShConcat.apply(d.contiguous(), geo, self.degree)
