"""Encodings behind one interface: ``make_position_encoding(block, backend)`` -> ``nn.Module``.

Every backend maps positions ``[N, 3]`` in [0, 1] to features ``[N, n_output_dims]`` and exposes
``n_output_dims``. ``torch`` is the reference implementation used by the parity tests and on CPU;
``cpp`` a C++ CPU kernel; ``triton`` our GPU kernels; ``tcnn`` tiny-cuda-nn (``hvd_ngp.model.encoding.tcnn``,
which also supplies the MLPs), with the Triton kernels for marching and compositing. Directions
use the spherical harmonics of ``sh`` on every backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...errors import ConfigError
from .hashgrid import (
    BACKWARD_LAUNCH,
    FEATURE_MAJOR,
    FORWARD_LAUNCH,
    KERNEL_OPTIONS,
    MERGE_RUNS_BELOW,
    GridLaunch,
    HashGridSpec,
    HashGridTorch,
    scaled_to_extent,
)
from .sh import SphericalHarmonics

if TYPE_CHECKING:
    from .tcnn import TcnnEncoding

BACKENDS = ("auto", "torch", "cpp", "triton", "tcnn")
FAST_RENDERER_BACKENDS = ("triton", "tcnn")  # backends that render with the Triton kernels (render.fast)
TABLE_DTYPES = {"float32": torch.float32, "float16": torch.float16}


def resolve_backend(backend: str, device: torch.device) -> str:
    """The concrete backend ``auto`` stands for on ``device``: on a GPU the Triton kernels when Triton
    imports, on a CPU the C++ kernel when it builds; else the torch reference. An explicit choice that
    cannot run is a clear error.

    ``auto`` never picks tiny-cuda-nn, even when installed: by time to quality it lost to the Triton
    kernels on one H200 (lego, default config, 200 test views on white: 32.47 dB at 60 s against
    33.27 dB for triton; issue 14)."""
    from ...triton_support import require_triton, triton_available
    from .tcnn import import_tcnn

    if backend not in BACKENDS:
        raise ConfigError(f"unknown encoding backend {backend!r} (choose from {', '.join(BACKENDS)})")
    if backend != "auto":
        if backend == "cpp" and device.type != "cpu":
            raise ConfigError("--backend cpp runs on the CPU only")
        if backend in FAST_RENDERER_BACKENDS:
            require_triton(device.type)
        if backend == "tcnn":
            if device.type != "cuda":
                raise ConfigError("--backend tcnn runs on CUDA GPUs only")
            import_tcnn()
        return backend
    if device.type == "cpu":
        from . import hashgrid_cpp

        return "cpp" if hashgrid_cpp.available() else "torch"
    if not triton_available(device.type):
        return "torch"
    return "triton"


def make_position_encoding(block: dict, backend: str = "torch", source: str = "config") -> HashGridTorch | TcnnEncoding:
    """A hash grid from an instant-ngp ``encoding`` block on a concrete backend (see ``resolve_backend``).

    ``table_dtype`` ("float32" | "float16") is the precision the Triton backend gathers from;
    ``vector_atomics`` (true | false, default false) lets its backward add both features of a corner with
    one atomic on sm_90+; ``merge_runs_below`` (resolution, default ``MERGE_RUNS_BELOW``; 0: off) sums runs of
    consecutive points on one table row before their atomic at the levels that coarse (``hashgrid_triton``);
    ``feature_major`` (true | false, default ``FEATURE_MAJOR``) lays its output out as ``[L * F, N]`` in memory;
    ``forward_launch``, ``backward_launch`` (``{"block": points per program, "warps": n}``, powers of two; default
    ``FORWARD_LAUNCH``, ``BACKWARD_LAUNCH``) say how its two kernels run.
    The other backends ignore them (same values and gradients); a float16 table needs the triton backend."""
    table_dtype, vector_atomics, merge, feature_major, launches = kernel_options(block, source)
    if table_dtype != "float32" and backend != "triton":
        raise ConfigError(f"{source}: encoding.table_dtype {table_dtype!r} needs the triton backend (got {backend})")
    spec = HashGridSpec.from_config(block, source)
    if backend == "triton":
        from .hashgrid_triton import HashGridTriton

        return HashGridTriton(
            spec,
            TABLE_DTYPES[table_dtype],
            vector_atomics=vector_atomics,
            merge_runs_below=merge,
            feature_major=feature_major,
            forward_launch=launches[0],
            backward_launch=launches[1],
        )
    if backend == "tcnn":
        from .tcnn import TcnnEncoding

        return TcnnEncoding(spec)
    if backend == "cpp":
        from .hashgrid_cpp import HashGridCpp

        return HashGridCpp(spec)
    if backend != "torch":
        raise ConfigError(f"encoding backend {backend!r} is not concrete; call resolve_backend first")
    return HashGridTorch(spec)


def kernel_options(block: dict, source: str = "config") -> tuple[str, bool, int, bool, tuple[GridLaunch, GridLaunch]]:
    """The Triton kernels' options of an ``encoding`` block (``KERNEL_OPTIONS``), validated and defaulted:
    (table_dtype, vector_atomics, merge_runs_below, feature_major, (forward launch, backward launch))."""
    table_dtype = block.get("table_dtype", "float32")
    if table_dtype not in TABLE_DTYPES:
        raise ConfigError(f"{source}: encoding.table_dtype must be one of {sorted(TABLE_DTYPES)}, got {table_dtype!r}")
    vector_atomics = block.get("vector_atomics", False)
    if not isinstance(vector_atomics, bool):
        raise ConfigError(f"{source}: encoding.vector_atomics must be true or false, got {vector_atomics!r}")
    merge = block.get("merge_runs_below", MERGE_RUNS_BELOW)
    if isinstance(merge, bool) or not isinstance(merge, int) or merge < 0:
        raise ConfigError(f"{source}: encoding.merge_runs_below must be a resolution >= 0 (0: off), got {merge!r}")
    feature_major = block.get("feature_major", FEATURE_MAJOR)
    if not isinstance(feature_major, bool):
        raise ConfigError(f"{source}: encoding.feature_major must be true or false, got {feature_major!r}")
    launches = []
    for key, default in (("forward_launch", FORWARD_LAUNCH), ("backward_launch", BACKWARD_LAUNCH)):
        value = block.get(key)
        if value is None:
            launches.append(default)
            continue
        if not isinstance(value, dict) or not set(value) <= {"block", "warps"}:
            raise ConfigError(
                f"{source}: encoding.{key} must be an object with keys among ['block', 'warps'], got {value!r}"
            )
        try:
            launches.append(GridLaunch(**{"block": default.block, "warps": default.warps, **value}))
        except ValueError as e:
            raise ConfigError(f"{source}: encoding.{key}: {e}") from None
    return table_dtype, vector_atomics, merge, feature_major, (launches[0], launches[1])


def model_for_backend(model: dict, backend: str) -> dict:
    """``model`` (the merged network blocks, ``ModelSettings.blocks``) for a build on ``backend`` that a tool
    picks itself rather than the user (the benchmarks' torch references and parameter counts beside the backend
    under test): on a concrete backend other than triton, the encoding block less the Triton kernels' options
    (``KERNEL_OPTIONS``, validated first), which do not change the grid; else ``model`` itself. The trainer does
    not call it: there ``--backend torch`` with a float16 table stays make_position_encoding's error."""
    block = model["encoding"]
    kernel_options(block, model.get("_source", "config"))
    if backend in ("triton", "auto") or not any(key in block for key in KERNEL_OPTIONS):
        return model
    return {**model, "encoding": {k: v for k, v in block.items() if k not in KERNEL_OPTIONS}}


def make_direction_encoding(block: dict, source: str = "config", backend: str = "torch") -> SphericalHarmonics:
    """Spherical harmonics of unit directions from an instant-ngp ``dir_encoding`` block (every backend; on the
    triton backend the colour network's input in one kernel, ``sh_triton``)."""
    block = dict(block)
    otype = block.get("otype", "SphericalHarmonics")
    if otype == "Composite":  # instant-ngp's [SH(dir), Identity(rest)]: we encode directions only
        nested = [b for b in block.get("nested", []) if b.get("otype") == "SphericalHarmonics"]
        if not nested:
            raise ConfigError(f"{source}: dir_encoding Composite needs a SphericalHarmonics member")
        block, otype = nested[0], "SphericalHarmonics"
    if otype != "SphericalHarmonics":
        raise ConfigError(f"{source}: dir_encoding.otype {otype!r} is not supported (expected 'SphericalHarmonics')")
    if backend == "triton":
        from .sh_triton import SphericalHarmonicsTriton

        return SphericalHarmonicsTriton(int(block.get("degree", 4)))
    return SphericalHarmonics(int(block.get("degree", 4)))


__all__ = [
    "BACKENDS",
    "FAST_RENDERER_BACKENDS",
    "KERNEL_OPTIONS",
    "GridLaunch",
    "HashGridSpec",
    "HashGridTorch",
    "SphericalHarmonics",
    "kernel_options",
    "make_direction_encoding",
    "make_position_encoding",
    "model_for_backend",
    "resolve_backend",
    "scaled_to_extent",
]
