"""Hash encoding against a brute-force per-point reference, and the C++ kernel against the torch twin."""

from __future__ import annotations

import math

import pytest
import torch

from hvd_ngp.errors import ConfigError
from hvd_ngp.model.encoding import make_direction_encoding, make_position_encoding, model_for_backend
from hvd_ngp.model.encoding.hashgrid import (
    BACKWARD_LAUNCH,
    FORWARD_LAUNCH,
    MERGE_RUNS_BELOW,
    GridLaunch,
    HashGridSpec,
    HashGridTorch,
    scaled_to_extent,
)
from hvd_ngp.model.encoding.sh import sh_encode

# Resolutions 4, 8, 16, 32, 64, 128: up to 16^3 = 2^12 rows the levels are dense (16^3 exactly fills
# the table: the boundary case), finer levels are hashed. Both paths are exercised.
SPEC = HashGridSpec(n_levels=6, n_features_per_level=2, log2_hashmap_size=12, base_resolution=4, per_level_scale=2.0)


def brute_force(x: torch.Tensor, table: torch.Tensor, spec: HashGridSpec) -> torch.Tensor:
    """Straight from the paper/tcnn definitions, one point, one level, one corner at a time."""
    out = []
    for p in x.tolist():
        feats = []
        offset = 0
        for level in range(spec.n_levels):
            scale = spec.base_resolution * spec.per_level_scale**level - 1.0
            res = math.ceil(scale) + 1
            size = min(res**3, 2**spec.log2_hashmap_size)
            size = (size + 7) // 8 * 8
            hashed = res**3 > 2**spec.log2_hashmap_size
            pos = [v * scale + 0.5 for v in p]
            base = [math.floor(v) for v in pos]
            frac = [v - b for v, b in zip(pos, base)]
            acc = torch.zeros(spec.n_features_per_level, dtype=table.dtype)
            for corner in range(8):
                c = [base[d] + ((corner >> d) & 1) for d in range(3)]
                w = 1.0
                for d in range(3):
                    w *= frac[d] if (corner >> d) & 1 else 1.0 - frac[d]
                if hashed:
                    idx = ((c[0] * 1) ^ (c[1] * 2654435761) ^ (c[2] * 805459861)) & 0xFFFFFFFF
                else:
                    idx = c[0] + c[1] * res + c[2] * res * res
                acc = acc + w * table[offset + idx % size]
            feats.append(acc)
            offset += size
        out.append(torch.cat(feats))
    return torch.stack(out)


def points() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 3, generator=g, dtype=torch.float64)
    # exact cell boundaries of the coarsest level (scale 3: pos = x*3 + 0.5 integer), the cube's corners and faces
    boundary = torch.tensor(
        [[1 / 6, 0.5, 5 / 6], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.5, 0.0, 1.0], [1 / 6, 1 / 6, 1 / 6]],
        dtype=torch.float64,
    )
    return torch.cat([x, boundary]).float()


def test_layout_has_dense_and_hashed_levels():
    layout = SPEC.level_layout()
    assert [lv[4] for lv in layout] == [False, False, False, True, True, True]
    assert layout[0][1] == 4 and layout[0][2] == 64  # resolution 4, 4^3 = 64 rows
    assert SPEC.n_params == sum(lv[2] for lv in layout)


def test_forward_and_table_gradient_match_brute_force():
    torch.manual_seed(0)  # fixed draws: the fp32 rounding below is then the same on every run
    enc = HashGridTorch(SPEC)
    with torch.no_grad():
        enc.params.normal_()
    x = points()
    table = enc.params.detach().clone().double().requires_grad_(True)
    ref = brute_force(x.double(), table, SPEC)
    out = enc(x)
    # fp32 against fp64: sums of N(0, 1) table values over 8 corners and all levels round at ~1e-5
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=5e-5)
    weights = torch.randn_like(ref)
    (ref * weights).sum().backward()
    (out * weights.float()).sum().backward()
    torch.testing.assert_close(enc.params.grad.double(), table.grad, rtol=1e-4, atol=1e-5)
    assert (table.grad != 0).any(dim=1).sum() > 100  # the check touched many rows


def test_interpolation_is_continuous_across_a_cell_boundary():
    enc = HashGridTorch(SPEC)
    with torch.no_grad():
        enc.params.normal_()
    b = torch.tensor([[1 / 6, 0.37, 0.61]])
    eps = torch.tensor([[1e-6, 0.0, 0.0]])
    # a moved corner would jump by O(1) (table values are N(0, 1)); 2e-6 of smooth motion moves < 1e-3
    torch.testing.assert_close(enc(b - eps), enc(b + eps), rtol=0, atol=5e-3)


def test_desired_resolution_sets_per_level_scale():
    spec = HashGridSpec.from_config({"n_levels": 16, "base_resolution": 16, "desired_resolution": 2048})
    assert spec.per_level_scale == pytest.approx(math.exp(math.log(2048 / 16) / 15))
    finest = spec.level_layout()[-1][0] + 1
    assert finest == pytest.approx(2048, rel=1e-4)


def test_desired_resolution_is_per_world_unit_as_in_instant_ngp():
    """instant-ngp's finest level is 2048 x aabb_scale across the box: fox (aabb_scale 4, a box of side 4)
    gets 8192, lego (side 1) 2048; a model-parallel region of half the side half of that."""
    from hvd_ngp.config import parse_args
    from hvd_ngp.model.field import NGPField

    block = {"n_levels": 8, "n_features_per_level": 4, "base_resolution": 16, "desired_resolution": 2048}
    for extent, finest in ((1.0, 2048), (4.0, 8192), (0.5, 1024)):
        spec = HashGridSpec.from_config(scaled_to_extent(block, extent))
        assert spec.level_layout()[-1][0] + 1 == pytest.approx(finest, rel=1e-4)
    assert scaled_to_extent(block, 4.0) is not block and block["desired_resolution"] == 2048
    explicit = {**block, "per_level_scale": 1.5}  # an explicit scale wins, as in instant-ngp
    assert scaled_to_extent(explicit, 4.0) is explicit
    assert scaled_to_extent({**block, "desired_resolution": 64}, 0.1)["desired_resolution"] == 16  # not below the base
    model = parse_args([]).model  # base.json: 2048
    fox = NGPField(model, torch.tensor([[-1.5] * 3, [2.5] * 3]), "torch")
    lego = NGPField(model, torch.tensor([[-0.0] * 3, [1.0] * 3]), "torch")
    assert fox.encoding.spec.level_layout()[-1][0] + 1 == pytest.approx(4 * 2048, rel=1e-4)
    assert lego.encoding.spec.level_layout()[-1][0] + 1 == pytest.approx(2048, rel=1e-4)


@pytest.mark.parametrize(
    "block, message",
    [
        ({"otype": "Frequency"}, "not supported"),
        ({"n_levels": -2}, "n_levels must be a positive integer"),
        ({"log2_hashmap_size": 0}, "log2_hashmap_size must be a positive integer"),
        ({"n_levelz": 4}, "unknown encoding key"),
        ({"vector_atomics": "yes"}, "vector_atomics must be true or false"),
        ({"table_dtype": "float16"}, "needs the triton backend"),
        ({"merge_runs_below": -1}, "merge_runs_below must be a resolution >= 0"),
        ({"merge_runs_below": True}, "merge_runs_below must be a resolution >= 0"),
        ({"feature_major": "yes"}, "feature_major must be true or false"),
        ({"forward_launch": [256, 4]}, "forward_launch must be an object with keys among"),
        ({"backward_launch": {"block": 96}}, "backward_launch: GridLaunch.block must be a power of two"),
        ({"backward_launch": {"threads": 96}}, "backward_launch must be an object"),
    ],
)
def test_invalid_encoding_blocks_are_refused(block, message):
    with pytest.raises(ConfigError, match=message):
        make_position_encoding({"otype": "HashGrid", **block}, "torch", "net.json")


def test_model_for_backend_drops_the_kernel_options_for_other_backends_only():
    """The benchmarks' own torch/cpp/tcnn builds beside a triton run take the grid without the Triton kernels'
    options (make_position_encoding refuses a float16 table there); triton and auto keep them."""
    block = {
        "n_levels": 4,
        "log2_hashmap_size": 10,
        "table_dtype": "float16",
        "vector_atomics": True,
        "merge_runs_below": 300,
        "feature_major": False,
    }
    model = {"encoding": block, "network": {}, "_source": "net.json"}
    for backend in ("torch", "cpp", "tcnn"):
        out = model_for_backend(model, backend)
        assert out["encoding"] == {"n_levels": 4, "log2_hashmap_size": 10} and out["network"] is model["network"]
        make_position_encoding(out["encoding"], "torch")
    assert model["encoding"] is block and len(block) == 6  # the caller's config is left as it was
    assert model_for_backend(model, "triton") is model and model_for_backend(model, "auto") is model
    plain = {"encoding": {"n_levels": 4}}
    assert model_for_backend(plain, "torch") is plain
    with pytest.raises(ConfigError, match="net.json: encoding.merge_runs_below must be a resolution >= 0"):
        model_for_backend({**model, "encoding": {"merge_runs_below": -1}}, "torch")  # dropped only once valid


def test_kernel_options_are_not_grid_keys(monkeypatch):
    """table_dtype, vector_atomics, merge_runs_below and feature_major tell the Triton kernels how to run: the grid
    (and the memory plan built from it) ignores them, the Triton encoding receives them."""
    block = {
        "n_levels": 4,
        "log2_hashmap_size": 10,
        "table_dtype": "float16",
        "vector_atomics": True,
        "merge_runs_below": 300,
        "feature_major": False,
        "backward_launch": {"block": 256},
    }
    assert HashGridSpec.from_config(block) == HashGridSpec.from_config({"n_levels": 4, "log2_hashmap_size": 10})
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    enc = make_position_encoding(block, "triton")
    assert enc.table_dtype == torch.float16 and enc.vector_atomics and enc.merge_runs_below == 300
    assert not enc.feature_major and make_position_encoding({"n_levels": 4}, "triton").feature_major  # default on
    assert enc.backward_launch == GridLaunch(256, BACKWARD_LAUNCH.warps) and enc.forward_launch == FORWARD_LAUNCH
    assert make_position_encoding({"n_levels": 4}, "triton").merge_runs_below == MERGE_RUNS_BELOW == 300  # default
    assert make_position_encoding({"n_levels": 4, "merge_runs_below": 0}, "triton").merge_runs_below == 0
    for backend in ("torch", "cpp"):  # the other backends' gradients are the same sums: they ignore it
        assert make_position_encoding({"n_levels": 4, "merge_runs_below": 256}, backend).spec.n_levels == 4


def test_cpp_kernel_matches_torch_reference():
    from hvd_ngp.model.encoding import hashgrid_cpp

    if not hashgrid_cpp.available():
        pytest.fail("the C++ CPU kernel did not build (scripts/setup.sh builds it; needs g++ and ninja)")
    for spec in (
        SPEC,
        HashGridSpec(n_levels=8, n_features_per_level=4, log2_hashmap_size=10, base_resolution=8, per_level_scale=1.6),
    ):
        ref = HashGridTorch(spec)
        fast = hashgrid_cpp.HashGridCpp(spec)
        with torch.no_grad():
            ref.params.normal_()
            fast.params.copy_(ref.params)
        x = torch.cat([points(), torch.rand(3000, 3)])
        out_ref, out_fast = ref(x), fast(x)
        torch.testing.assert_close(out_fast, out_ref, rtol=1e-5, atol=1e-5)
        g = torch.randn_like(out_ref)
        (out_ref * g).sum().backward()
        (out_fast * g).sum().backward()
        torch.testing.assert_close(fast.params.grad, ref.params.grad, rtol=1e-4, atol=1e-5)


def test_spherical_harmonics_are_orthonormal():
    """Monte-Carlo check of the degree-4 basis: E[Y_i Y_j] * 4 pi = delta_ij."""
    g = torch.Generator().manual_seed(1)
    d = torch.nn.functional.normalize(torch.randn(400_000, 3, generator=g, dtype=torch.float64), dim=-1)
    y = sh_encode(d, 4)
    gram = 4 * math.pi * (y.T @ y) / d.shape[0]
    torch.testing.assert_close(gram, torch.eye(16, dtype=torch.float64), rtol=0, atol=0.03)
    assert make_direction_encoding({"otype": "SphericalHarmonics", "degree": 4}).n_output_dims == 16
