"""The colour network's input in one Triton kernel: spherical harmonics of the directions beside the
geometry features.

Twin of ``SphericalHarmonics.concat`` (``torch.cat([sh_encode(d), geo], -1)``: about forty elementwise
kernels for degree 4, one per product and constant in ``sh_encode``, then the concatenation). One program
handles ``BLOCK`` rows: it reads a direction, evaluates the ``degree**2`` basis values and writes them with
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
    tl.store(row, tl.full((BLOCK,), 0.28209479177387814, tl.float32).to(ty), mask=m)
    if DEGREE > 1:
        tl.store(row + 1, (-0.48860251190291987 * y).to(ty), mask=m)
        tl.store(row + 2, (0.48860251190291987 * z).to(ty), mask=m)
        tl.store(row + 3, (-0.48860251190291987 * x).to(ty), mask=m)
    if DEGREE > 2:
        xy, xz, yz, x2, y2, z2 = x * y, x * z, y * z, x * x, y * y, z * z
        tl.store(row + 4, (1.0925484305920792 * xy).to(ty), mask=m)
        tl.store(row + 5, (-1.0925484305920792 * yz).to(ty), mask=m)
        tl.store(row + 6, (0.94617469575755997 * z2 - 0.31539156525251999).to(ty), mask=m)
        tl.store(row + 7, (-1.0925484305920792 * xz).to(ty), mask=m)
        tl.store(row + 8, (0.54627421529603959 * x2 - 0.54627421529603959 * y2).to(ty), mask=m)
        if DEGREE > 3:
            tl.store(row + 9, (0.59004358992664352 * y * (-3.0 * x2 + y2)).to(ty), mask=m)
            tl.store(row + 10, (2.8906114426405538 * xy * z).to(ty), mask=m)
            tl.store(row + 11, (0.45704579946446572 * y * (1.0 - 5.0 * z2)).to(ty), mask=m)
            tl.store(row + 12, (0.3731763325901154 * z * (5.0 * z2 - 3.0)).to(ty), mask=m)
            tl.store(row + 13, (0.45704579946446572 * x * (1.0 - 5.0 * z2)).to(ty), mask=m)
            tl.store(row + 14, (1.4453057213202769 * z * (x2 - y2)).to(ty), mask=m)
            tl.store(row + 15, (0.59004358992664352 * x * (-x2 + 3.0 * y2)).to(ty), mask=m)
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
