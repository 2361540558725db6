"""Multiresolution hash encoding (Müller et al. 2022), plain-PyTorch reference.

Index and hash conventions follow tiny-cuda-nn's ``GridEncoding`` so parameters are interchangeable
with the tcnn backend: per level ``scale = base_resolution * per_level_scale**l - 1``,
``pos = x * scale + 0.5``, ``resolution = ceil(scale) + 1``; a level whose dense grid fits in the
table is indexed densely (``x + y*res + z*res^2``), otherwise by the coherent prime hash
``x*1 ^ y*2654435761 ^ z*805459861`` (uint32); both modulo the level's table size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import ConfigError

PRIMES = (1, 2654435761, 805459861)
UINT32 = 0xFFFFFFFF


#: encoding keys of the Triton backend, not of the grid
KERNEL_OPTIONS = (
    "table_dtype",
    "vector_atomics",
    "merge_runs_below",
    "feature_major",
    "forward_launch",
    "backward_launch",
)
#: the Triton backward sums runs of consecutive points on one table row at levels of resolution <= this
#: (``merge_runs_below``): 53.9 / 57.1 against 48.2 / 48.4 M samples/s late in lego training on one H100
#: (docs/BENCHMARKS.md)
MERGE_RUNS_BELOW = 300
#: the Triton forward writes its output feature-major (``[L * F, N]`` in memory, seen as ``[N, L * F]``)
FEATURE_MAJOR = True


@dataclass(frozen=True)
class GridLaunch:
    """How a Triton hash-grid kernel runs: ``block`` points per program on ``warps`` warps (powers of two).
    Every launch computes the same encoding (and the same table gradient, to the order of its atomics); only
    the speed differs (``bench throughput --grid_launches`` times them on a trained batch)."""

    block: int = 128
    warps: int = 4

    def __post_init__(self) -> None:
        for name in ("block", "warps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"GridLaunch.{name} must be a power of two >= 1, got {value!r}")


FORWARD_LAUNCH = GridLaunch()
BACKWARD_LAUNCH = GridLaunch()


def scaled_to_extent(block: dict, extent: float) -> dict:
    """The ``encoding`` block for a field whose box's longest side is ``extent`` world units.

    ``desired_resolution`` is the finest level's resolution per world unit (instant-ngp: over the unit
    cube, so a scene of ``aabb_scale`` 4 gets 4 x 2048 cells across its box); the block given to the
    grid, which sees the box as [0, 1]^3, has it multiplied by ``extent``. An explicit
    ``per_level_scale`` wins, as in instant-ngp (``desired_resolution`` is then ignored)."""
    if "desired_resolution" not in block or "per_level_scale" in block:
        return block
    desired = block["desired_resolution"]
    if isinstance(desired, bool) or not isinstance(desired, (int, float)):
        return block  # HashGridSpec.from_config names the bad value
    scaled, base = desired * float(extent), block.get("base_resolution", HashGridSpec.base_resolution)
    if isinstance(base, int) and desired >= base:  # a small box (a model-parallel region): not below the base
        scaled = max(scaled, base)
    return {**block, "desired_resolution": scaled}


@dataclass(frozen=True)
class HashGridSpec:
    """Validated hash-grid hyper-parameters plus the derived per-level layout."""

    n_levels: int = 16
    n_features_per_level: int = 2
    log2_hashmap_size: int = 19
    base_resolution: int = 16
    per_level_scale: float = 2.0

    def __post_init__(self) -> None:
        for name in ("n_levels", "n_features_per_level", "log2_hashmap_size", "base_resolution"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"encoding.{name} must be a positive integer, got {value!r}")
        if self.log2_hashmap_size > 30:
            raise ConfigError(f"encoding.log2_hashmap_size must be <= 30, got {self.log2_hashmap_size}")
        if not self.per_level_scale >= 1.0:
            raise ConfigError(f"encoding.per_level_scale must be >= 1, got {self.per_level_scale}")

    @staticmethod
    def from_config(block: dict, source: str = "config") -> "HashGridSpec":
        """Build from an instant-ngp ``encoding`` block. ``desired_resolution`` derives ``per_level_scale``."""
        block = dict(block)
        otype = block.pop("otype", "HashGrid")
        if otype not in ("HashGrid", "Grid"):
            raise ConfigError(f"{source}: encoding.otype {otype!r} is not supported (expected 'HashGrid')")
        for key in ("type", "interpolation"):
            value = block.pop(key, None)
            if value not in (None, "Hash", "Linear"):
                raise ConfigError(
                    f"{source}: encoding.{key}={value!r} is not supported (Hash grids, Linear interpolation)"
                )
        for key in KERNEL_OPTIONS:  # how the Triton kernels run, not the grid (make_position_encoding reads it)
            block.pop(key, None)
        desired = block.pop("desired_resolution", None)
        known = {"n_levels", "n_features_per_level", "log2_hashmap_size", "base_resolution", "per_level_scale"}
        unknown = set(block) - known
        if unknown:
            raise ConfigError(
                f"{source}: unknown encoding key(s) {sorted(unknown)} (known: {sorted(known | {'desired_resolution'})})"
            )
        try:
            spec = HashGridSpec(**block)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        if desired is not None and "per_level_scale" not in block:
            if not isinstance(desired, (int, float)) or desired < spec.base_resolution:
                raise ConfigError(f"{source}: encoding.desired_resolution must be >= base_resolution, got {desired!r}")
            scale = math.exp(math.log(desired / spec.base_resolution) / max(spec.n_levels - 1, 1))
            spec = HashGridSpec(**{**block, "per_level_scale": scale})
        return spec

    @property
    def n_output_dims(self) -> int:
        return self.n_levels * self.n_features_per_level

    def level_layout(self) -> list[tuple[float, int, int, int, bool]]:
        """Per level: (scale, resolution, table size, table offset, hashed)."""
        max_params = 1 << self.log2_hashmap_size
        layout, offset = [], 0
        for level in range(self.n_levels):
            scale = math.exp2(level * math.log2(self.per_level_scale)) * self.base_resolution - 1.0
            resolution = int(math.ceil(scale)) + 1
            dense = resolution**3
            size = max_params if dense > max_params else dense
            size = (size + 7) // 8 * 8
            hashed = dense > max_params
            layout.append((scale, resolution, size, offset, hashed))
            offset += size
        return layout

    @property
    def n_params(self) -> int:
        scale, res, size, offset, _ = self.level_layout()[-1]
        return offset + size


class HashGridTorch(nn.Module):
    """Hash encoding in plain PyTorch: all levels at once, one fused gather-weighted-sum.

    ``forward(x)``: x ``[N, 3]`` in [0, 1] -> features ``[N, n_levels * n_features_per_level]``.
    Gradients flow to the table (``embedding_bag`` backward scatters into one dense table
    gradient; no per-corner copies). Positions receive no gradient.
    """

    # per-level buffers [L] (registered in __init__)
    scales: Tensor
    resolutions: Tensor
    sizes: Tensor
    offsets: Tensor
    hashed_mask: Tensor
    hashed_levels: Tensor  # [L_hashed]: indices of the hashed levels
    dense_levels: Tensor  # [L_dense]

    def __init__(self, spec: HashGridSpec, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.spec = spec
        layout = spec.level_layout()
        self.params = nn.Parameter(torch.empty(spec.n_params, spec.n_features_per_level, dtype=dtype))
        nn.init.uniform_(self.params, -1e-4, 1e-4)
        self.register_buffer("scales", torch.tensor([lv[0] for lv in layout], dtype=torch.float32), persistent=False)
        self.register_buffer("resolutions", torch.tensor([lv[1] for lv in layout], dtype=torch.int64), persistent=False)
        self.register_buffer("sizes", torch.tensor([lv[2] for lv in layout], dtype=torch.int64), persistent=False)
        self.register_buffer("offsets", torch.tensor([lv[3] for lv in layout], dtype=torch.int64), persistent=False)
        hashed = [i for i, lv in enumerate(layout) if lv[4]]
        dense = [i for i, lv in enumerate(layout) if not lv[4]]
        self.register_buffer("hashed_mask", torch.tensor([lv[4] for lv in layout], dtype=torch.bool), persistent=False)
        self.register_buffer("hashed_levels", torch.tensor(hashed, dtype=torch.int64), persistent=False)
        self.register_buffer("dense_levels", torch.tensor(dense, dtype=torch.int64), persistent=False)

    @property
    def n_output_dims(self) -> int:
        return self.spec.n_output_dims

    def corner_indices_and_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Table rows and trilinear weights of the 8 corners at every level: both ``[N, L, 8]``.

        Corner ``c`` sits at offset bit ``d`` of ``c`` along dim ``d``. Per-dimension terms are
        computed once and combined by broadcasting over the 2x2x2 corners (z, y, x order).
        """
        pos = x.float()[:, None, :] * self.scales[None, :, None] + 0.5  # [N, L, 3]
        cell = torch.floor(pos)
        frac = pos - cell
        c = cell.long()
        lo_hi = torch.arange(2, device=x.device)  # corner offsets 0, 1
        n, L = x.shape[0], self.spec.n_levels
        index = torch.empty(n, L, 2, 2, 2, dtype=torch.int64, device=x.device)
        hashed, dense = self.hashed_levels, self.dense_levels
        if hashed.numel():  # sizes of hashed levels are powers of two: modulo is a mask
            ch = c.index_select(1, hashed)
            h = [((ch[:, :, d, None] + lo_hi) * PRIMES[d]) & UINT32 for d in range(3)]  # [N, Lh, 2] each
            hidx = h[2][:, :, :, None, None] ^ h[1][:, :, None, :, None] ^ h[0][:, :, None, None, :]
            index[:, hashed] = hidx & (self.sizes[hashed] - 1)[None, :, None, None, None]
        if dense.numel():
            res = self.resolutions[dense][None, :, None]
            cd = c.index_select(1, dense)
            px = cd[:, :, 0, None] + lo_hi
            py = (cd[:, :, 1, None] + lo_hi) * res
            pz = (cd[:, :, 2, None] + lo_hi) * res * res
            didx = pz[:, :, :, None, None] + py[:, :, None, :, None] + px[:, :, None, None, :]
            index[:, dense] = didx % self.sizes[dense][None, :, None, None, None]
        index = index.view(n, L, 8) + self.offsets[None, :, None]
        wd = torch.stack([1.0 - frac, frac], dim=-1)  # [N, L, 3, 2]
        w = wd[:, :, 2, :, None, None] * wd[:, :, 1, None, :, None] * wd[:, :, 0, None, None, :]
        return index, w.reshape(n, L, 8)

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[0]
        index, w = self.corner_indices_and_weights(x)
        L = self.spec.n_levels
        feats = F.embedding_bag(
            index.view(n * L, 8), self.params, per_sample_weights=w.view(n * L, 8).to(self.params.dtype), mode="sum"
        )  # [N*L, F]
        return feats.view(n, L * self.spec.n_features_per_level)
