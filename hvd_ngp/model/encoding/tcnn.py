"""The ``tcnn`` backend: the field's hash grid and MLPs as tiny-cuda-nn modules.

tinycudann is optional and not on PyPI (it is compiled against the node's CUDA); it is imported
only when this backend is chosen. It is fed the same instant-ngp JSON blocks as the other backends
(validated here first, so a bad block names the config file), through its documented Python API:
``tinycudann.Encoding(n_input_dims, encoding_config, seed, dtype)`` and
``tinycudann.Network(n_input_dims, n_output_dims, network_config, seed)``. Each module holds one
flat fp32 parameter vector (``.params``) and returns half precision on most GPUs; marching and
compositing stay on the Triton kernels. The hash grid and the MLPs are separate modules (not
``NetworkWithInputEncoding``) so that the optimizer can keep L2 regularisation on the MLP
weights only, as instant-ngp does. Directions keep the torch spherical harmonics (16 polynomials,
no parameters: a parameterless tinycudann module would still carry an empty parameter tensor
through Horovod's broadcasts).
"""

from __future__ import annotations

from types import ModuleType

from torch import Tensor, nn

from ...errors import BackendError, ConfigError
from .hashgrid import HashGridSpec

INSTALL = "pip install git+https://github.com/NVlabs/tiny-cuda-nn/#subdirectory=bindings/torch"
FULLY_FUSED_WIDTHS = (16, 32, 64, 128)  # tiny-cuda-nn's FullyFusedMLP supports these widths only


def import_tcnn() -> ModuleType:
    """The ``tinycudann`` module, or a ``BackendError`` that says how to install it."""
    try:
        import tinycudann
    except Exception as exc:  # ImportError, or EnvironmentError when it finds no CUDA device
        raise BackendError(
            f"--backend tcnn needs tiny-cuda-nn's PyTorch bindings ({type(exc).__name__}: {exc}); "
            f"install them on a CUDA node with: {INSTALL}"
        ) from None
    return tinycudann


def tcnn_available() -> bool:
    try:
        import_tcnn()
    except BackendError:
        return False
    return True


def uses_tcnn_layout(model_state: dict) -> bool:
    """True when a field's ``state_dict`` comes from this backend (flat tinycudann parameter vectors)."""
    return any(".tcnn." in key for key in model_state)


def hashgrid_config(spec: HashGridSpec) -> dict:
    return {
        "otype": "HashGrid",
        "n_levels": spec.n_levels,
        "n_features_per_level": spec.n_features_per_level,
        "log2_hashmap_size": spec.log2_hashmap_size,
        "base_resolution": spec.base_resolution,
        "per_level_scale": spec.per_level_scale,
    }


def network_config(block: dict, name: str, source: str) -> dict:
    """A tiny-cuda-nn network config from an instant-ngp network block (already checked by ``make_mlp``'s
    rules); the output activation is applied by the field, so the network's is always "None"."""
    otype = block.get("otype", "FullyFusedMLP")
    width = block.get("n_neurons", 64)
    if otype == "FullyFusedMLP" and width not in FULLY_FUSED_WIDTHS:
        raise ConfigError(
            f"{source}: {name}.n_neurons {width} is not a FullyFusedMLP width "
            f'({", ".join(map(str, FULLY_FUSED_WIDTHS))}); use "otype": "CutlassMLP" for other widths'
        )
    return {
        "otype": "CutlassMLP" if otype == "MLP" else otype,
        "activation": block.get("activation", "ReLU"),
        "output_activation": "None",
        "n_neurons": width,
        "n_hidden_layers": block.get("n_hidden_layers", 1),
    }


class TcnnEncoding(nn.Module):
    """Hash grid: positions ``[N, 3]`` in [0, 1] -> features ``[N, n_levels * n_features_per_level]``."""

    def __init__(self, spec: HashGridSpec, seed: int = 1337) -> None:
        super().__init__()
        self.spec = spec
        self.tcnn = import_tcnn().Encoding(3, hashgrid_config(spec), seed=seed)
        self.n_output_dims = int(self.tcnn.n_output_dims)

    def forward(self, x: Tensor) -> Tensor:
        return self.tcnn(x)


class TcnnMLP(nn.Module):
    """``[N, n_input]`` -> ``[N, n_output]`` through tiny-cuda-nn's fused MLP (no biases, like ``make_mlp``)."""

    def __init__(self, config: dict, n_input: int, n_output: int, seed: int = 1337) -> None:
        super().__init__()
        self.tcnn = import_tcnn().Network(n_input, n_output, config, seed=seed)

    def forward(self, x: Tensor) -> Tensor:
        return self.tcnn(x)
