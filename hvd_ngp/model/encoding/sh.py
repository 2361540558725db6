"""Real spherical-harmonics direction encoding (tiny-cuda-nn's ``SphericalHarmonics`` basis)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...errors import ConfigError


def sh_encode(d: Tensor, degree: int) -> Tensor:
    """Unit directions ``[N, 3]`` -> real SH basis values ``[N, degree**2]`` (degree 1..4)."""
    x, y, z = d.unbind(-1)
    out = [torch.full_like(x, 0.28209479177387814)]
    if degree > 1:
        out += [-0.48860251190291987 * y, 0.48860251190291987 * z, -0.48860251190291987 * x]
    if degree > 2:
        xy, xz, yz, x2, y2, z2 = x * y, x * z, y * z, x * x, y * y, z * z
        out += [
            1.0925484305920792 * xy,
            -1.0925484305920792 * yz,
            0.94617469575755997 * z2 - 0.31539156525251999,
            -1.0925484305920792 * xz,
            0.54627421529603959 * x2 - 0.54627421529603959 * y2,
        ]
    if degree > 3:
        out += [
            0.59004358992664352 * y * (-3.0 * x2 + y2),
            2.8906114426405538 * xy * z,
            0.45704579946446572 * y * (1.0 - 5.0 * z2),
            0.3731763325901154 * z * (5.0 * z2 - 3.0),
            0.45704579946446572 * x * (1.0 - 5.0 * z2),
            1.4453057213202769 * z * (x2 - y2),
            0.59004358992664352 * x * (-x2 + 3.0 * y2),
        ]
    return torch.stack(out, dim=-1)


class SphericalHarmonics(nn.Module):
    """``forward(d)``: unit directions ``[N, 3]`` -> ``[N, degree**2]``. ``concat(d, geo)``: the colour
    network's input, ``[N, degree**2 + G]`` in ``geo``'s dtype (the basis values, then ``geo`` ``[N, G]``)."""

    def __init__(self, degree: int = 4) -> None:
        super().__init__()
        if degree not in (1, 2, 3, 4):
            raise ConfigError(f"dir_encoding.degree must be 1..4, got {degree!r}")
        self.degree = degree

    @property
    def n_output_dims(self) -> int:
        return self.degree**2

    def forward(self, d: Tensor) -> Tensor:
        return sh_encode(d, self.degree)

    def concat(self, d: Tensor, geo: Tensor) -> Tensor:
        return torch.cat([self(d).to(geo.dtype), geo], dim=-1)
