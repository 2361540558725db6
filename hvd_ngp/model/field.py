"""The NGP radiance field: hash encoding -> density MLP; SH(direction) + geometry features -> colour MLP.

It knows nothing of rays: ``query_density(x)`` and ``forward(x, d)`` take world positions in the
scene's ``aabb`` and unit directions.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from .encoding import make_direction_encoding, make_position_encoding, scaled_to_extent

MLP_TYPES = ("FullyFusedMLP", "CutlassMLP", "MLP")


class TruncExp(torch.autograd.Function):
    """exp with its gradient clamped at exp(15): instant-ngp's density activation, safe in fp32."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return torch.exp(x)

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return g * torch.exp(x.clamp(max=15.0))


def trunc_exp(x: Tensor) -> Tensor:
    return TruncExp.apply(x)


#: ``initialization`` of a network block: torch's ``nn.Linear`` default (uniform in +-1/sqrt(fan_in)), or
#: Xavier-uniform as tiny-cuda-nn's MLPs start (the tcnn backend always starts so)
INITIALIZATIONS = ("torch", "xavier")


def make_mlp(
    block: dict,
    n_input: int,
    n_output: int,
    name: str,
    source: str = "config",
    backend: str = "torch",
    fused_training: bool = False,
) -> nn.Module:
    """An instant-ngp style MLP (no biases, like tiny-cuda-nn's fused MLPs) from a network block: an
    ``nn.Sequential`` of ``nn.Linear`` layers (the reference, and the CPU path), tiny-cuda-nn's network
    with ``backend="tcnn"``, or with ``backend="triton"`` the same ``nn.Sequential`` computed by the fused
    Triton kernels (``mlp_triton.FusedMLP``: same parameters and state-dict keys) when the block's width
    and depth suit them (widths 16/32/64/128, 1..3 hidden layers): passes without gradients always (the
    density pass over the filled slots only), training passes too with ``"fused": true``, or when the
    block does not say and ``fused_training`` (the trainer sets it under bf16/fp16 autocast: on one H200
    the fp32 backward kernel was 8-13x slower than cuBLAS, the bf16 one 1.2-1.6x faster).
    ``"initialization"``: one of ``INITIALIZATIONS``."""
    otype = block.get("otype", "FullyFusedMLP")
    if otype not in MLP_TYPES:
        raise ConfigError(f"{source}: {name}.otype {otype!r} is unknown (expected one of {', '.join(MLP_TYPES)})")
    width, depth = block.get("n_neurons", 64), block.get("n_hidden_layers", 1)
    if not isinstance(width, int) or width <= 0:
        raise ConfigError(f"{source}: {name}.n_neurons must be a positive integer, got {width!r}")
    if not isinstance(depth, int) or depth < 0:
        raise ConfigError(f"{source}: {name}.n_hidden_layers must be a non-negative integer, got {depth!r}")
    act = block.get("activation", "ReLU")
    if act not in ("ReLU", "None"):
        raise ConfigError(f"{source}: {name}.activation {act!r} is not supported (ReLU, None)")
    fused = block.get("fused", fused_training)  # faster only under bf16/fp16 autocast (docs/BENCHMARKS.md)
    if not isinstance(fused, bool):
        raise ConfigError(f"{source}: {name}.fused must be true or false, got {fused!r}")
    init = block.get("initialization", "torch")
    if init not in INITIALIZATIONS:
        raise ConfigError(f"{source}: {name}.initialization {init!r} is unknown ({', '.join(INITIALIZATIONS)})")
    if backend == "tcnn":
        from .encoding.tcnn import TcnnMLP, network_config

        return TcnnMLP(network_config(block, name, source), n_input, n_output)
    layers: list[nn.Module] = []
    dims = [n_input] + [width] * depth
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b, bias=False), nn.ReLU() if act == "ReLU" else nn.Identity()]
    layers.append(nn.Linear(dims[-1], n_output, bias=False))
    if init == "xavier":  # tiny-cuda-nn's: uniform in +-sqrt(6 / (fan_in + fan_out)) per weight matrix
        for layer in layers:
            if isinstance(layer, nn.Linear):
                nn.init.xavier_uniform_(layer.weight)
    if backend == "triton":
        from .mlp_triton import FusedMLP

        if FusedMLP.supports(width, depth):  # without "fused": true only the passes without gradients are fused
            return FusedMLP(*layers, train_fused=fused)
    return nn.Sequential(*layers)


def _call(module: nn.Module, x: Tensor, n_rows: Tensor | None) -> Tensor:
    """``module(x)``, passing ``n_rows`` on to the modules that can skip rows (``skips_rows``)."""
    if n_rows is not None and getattr(module, "skips_rows", False):
        return module(x, n_rows)
    return module(x)


class RadianceField(Protocol):
    """What renders and evaluations use of a trained field: ``NGPField``, or the render tool's
    ``render.regions.PiecewiseField`` (a model-parallel snapshot's regions joined into one field).

    ``field(x [M, 3], d [M, 3], n_rows=None)`` -> rgb ``[M, 3]``, sigma ``[M]``; ``density(x, n_rows=None)`` -> sigma
    ``[M]``; ``aabb`` ``[2, 3]``; ``training``, ``eval()``, ``train(mode)``: ``nn.Module``'s."""

    aabb: Tensor
    training: bool

    def __call__(self, x: Tensor, d: Tensor, n_rows: Tensor | None = None) -> tuple[Tensor, Tensor]: ...

    def density(self, x: Tensor, n_rows: Tensor | None = None) -> Tensor: ...

    def eval(self) -> RadianceField: ...

    def train(self, mode: bool = True) -> RadianceField: ...


class NGPField(nn.Module):
    """Radiance field over ``aabb`` (``[2, 3]``, world units).

    query_density: x ``[N, 3]`` -> (sigma ``[N]``, geo_feat ``[N, G]``); sigma = exp(geo_feat[:, 0] +
    ``network.density_bias``) (gradient clamped: ``trunc_exp``)
    forward:       x ``[N, 3]``, d ``[N, 3]`` -> (rgb ``[N, 3]`` in [0, 1], sigma ``[N]``)

    ``query_density(x, n_rows)``, ``forward(x, d, n_rows)``: only rows ``< n_rows`` (a device scalar) are
    needed. The Triton kernels (hash grid, fused MLP) skip the others, whose values are then those of zero
    features (sigma = 1) and which get no gradient; the other backends compute every row.
    ``fused_training``: the MLPs' default for ``"fused"`` (``make_mlp``).
    """

    aabb: Tensor  # [2, 3] buffer

    def __init__(self, model: dict, aabb: Tensor, backend: str = "torch", fused_training: bool = False) -> None:
        super().__init__()
        source = model.get("_source", "config")
        self.register_buffer("aabb", aabb.float().clone())
        extent = float((self.aabb[1] - self.aabb[0]).max())  # desired_resolution is per world unit
        self.encoding = make_position_encoding(scaled_to_extent(model["encoding"], extent), backend, source)
        net = model["network"]
        n_geo = int(net.get("n_output_dims", 16))
        if n_geo < 1:
            raise ConfigError(f"{source}: network.n_output_dims must be >= 1, got {n_geo}")
        self.density_mlp = make_mlp(net, self.encoding.n_output_dims, n_geo, "network", source, backend, fused_training)
        bias = net.get("density_bias", 0.0)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise ConfigError(f"{source}: network.density_bias must be a finite number, got {bias!r}")
        self.density_bias = float(bias)  # sigma = exp(first output + bias): instant-ngp 0, nerfacc -1
        self.dir_encoding = make_direction_encoding(model["dir_encoding"], source, backend)
        rgb = model["rgb_network"]
        out_act = rgb.get("output_activation", "Sigmoid")
        if out_act not in ("Sigmoid", "None"):  # colours always pass a sigmoid ("None": instant-ngp's spelling,
            # whose NeRF network applies its logistic colour activation apart from the MLP)
            raise ConfigError(
                f"{source}: rgb_network.output_activation {out_act!r} is not supported: colours pass "
                "a sigmoid ('Sigmoid', or 'None' as instant-ngp's configs write it)"
            )
        self.rgb_mlp = make_mlp(
            rgb, self.dir_encoding.n_output_dims + n_geo, 3, "rgb_network", source, backend, fused_training
        )

    def normalize(self, x: Tensor) -> Tensor:
        """World positions -> the encoding's unit cube (the aabb's longest side maps to 1)."""
        lo, hi = self.aabb[0], self.aabb[1]
        return ((x - lo) / (hi - lo).max()).clamp(0.0, 1.0)

    def query_density(self, x: Tensor, n_rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        features = _call(self.encoding, self.normalize(x), n_rows)  # [N, F]: half from a half table (inference)
        if torch.is_grad_enabled() or not getattr(self.density_mlp, "casts_input", False):
            features = features.to(x.dtype)  # else the fused kernel reads the half features: no [N, F] fp32 copy
        h = _call(self.density_mlp, features, n_rows)
        logit = h[:, 0].float()
        return trunc_exp(logit + self.density_bias if self.density_bias else logit), h

    def density(self, x: Tensor, n_rows: Tensor | None = None) -> Tensor:
        """sigma ``[N]`` alone: the renderers' and the occupancy grid's density callback."""
        return self.query_density(x, n_rows)[0]

    def forward(self, x: Tensor, d: Tensor, n_rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        sigma, geo = self.query_density(x, n_rows)
        return self.colour(x, d, geo, n_rows), sigma

    def colour(self, x: Tensor, d: Tensor, geo: Tensor, n_rows: Tensor | None = None) -> Tensor:
        """rgb ``[M, 3]`` (float32, in [0, 1]) along ``d`` ``[M, 3]`` from the density network's features ``geo``
        ``[M, G]`` (``query_density``); ``x`` is not needed here (``render.infer.SplitField`` passes it). Without
        gradients a fused colour MLP (``mlp_triton.FusedMLP``) computes the SH input in its kernel."""
        fused = getattr(self.rgb_mlp, "forward_sh", None)
        if fused is not None and not torch.is_grad_enabled():
            return torch.sigmoid(fused(d, geo, self.dir_encoding.degree, n_rows).float())
        return torch.sigmoid(_call(self.rgb_mlp, self.dir_encoding.concat(d, geo), n_rows).float())

    def mlp_parameters(self) -> list[nn.Parameter]:
        return list(self.density_mlp.parameters()) + list(self.rgb_mlp.parameters())

    def encoding_parameters(self) -> list[nn.Parameter]:
        return list(self.encoding.parameters())
