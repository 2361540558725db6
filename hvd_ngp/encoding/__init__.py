"""Encodings behind one interface: ``make_position_encoding(block, backend)`` -> ``nn.Module``.

Every backend maps positions ``[N, 3]`` in [0, 1] to features ``[N, n_output_dims]`` and exposes
``n_output_dims``. ``torch`` is the reference implementation used by the parity tests and on CPU.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from .hashgrid import HashGridSpec, HashGridTorch
from .sh import SphericalHarmonics

BACKENDS = ("auto", "torch", "cpp")


def resolve_backend(backend: str, device: torch.device) -> str:
    """The concrete backend ``auto`` stands for on ``device``: the C++ kernel on CPU when it builds."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown encoding backend {backend!r} (choose from {', '.join(BACKENDS)})")
    if backend != "auto":
        if backend == "cpp" and device.type != "cpu":
            raise ConfigError("--backend cpp runs on the CPU only")
        return backend
    if device.type == "cpu":
        from . import hashgrid_cpp

        return "cpp" if hashgrid_cpp.available() else "torch"
    return "torch"


def make_position_encoding(block: dict, backend: str = "torch", source: str = "config") -> nn.Module:
    """A hash grid from an instant-ngp ``encoding`` block on a concrete backend (see ``resolve_backend``)."""
    spec = HashGridSpec.from_config(block, source)
    if backend == "cpp":
        from .hashgrid_cpp import HashGridCpp

        return HashGridCpp(spec)
    if backend != "torch":
        raise ConfigError(f"encoding backend {backend!r} is not concrete; call resolve_backend first")
    return HashGridTorch(spec)


def make_direction_encoding(block: dict, source: str = "config") -> nn.Module:
    block = dict(block)
    otype = block.get("otype", "SphericalHarmonics")
    if otype == "Composite":  # instant-ngp's [SH(dir), Identity(rest)]: we encode directions only
        nested = [b for b in block.get("nested", []) if b.get("otype") == "SphericalHarmonics"]
        if not nested:
            raise ConfigError(f"{source}: dir_encoding Composite needs a SphericalHarmonics member")
        block, otype = nested[0], "SphericalHarmonics"
    if otype != "SphericalHarmonics":
        raise ConfigError(f"{source}: dir_encoding.otype {otype!r} is not supported (expected 'SphericalHarmonics')")
    return SphericalHarmonics(int(block.get("degree", 4)))


__all__ = ["BACKENDS", "HashGridSpec", "HashGridTorch", "SphericalHarmonics", "make_direction_encoding",
           "make_position_encoding", "resolve_backend"]
