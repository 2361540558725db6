"""Triton kernels against their plain-PyTorch twins on fresh random inputs (forward and backward).

On a GPU they run as compiled kernels; without one, under Triton's interpreter (conftest sets
TRITON_INTERPRET=1). With HVD_NGP_REQUIRE_GPU=1 a missing GPU or Triton is a failure, not a skip.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hvd_ngp.cluster import dist
from hvd_ngp.model.encoding.hashgrid import HashGridSpec, HashGridTorch
from hvd_ngp.render import StepSchedule, accumulate, march, transmittance_weights
from hvd_ngp.render.occupancy import OccupancyGrid
from hvd_ngp.triton_support import inference_math, triton_available

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")

if not triton_available(DEV.type):
    if os.environ.get("HVD_NGP_REQUIRE_GPU") == "1":
        pytest.fail("HVD_NGP_REQUIRE_GPU=1 but the Triton kernels cannot run here", pytrace=False)
    pytest.skip("Triton is not installed (or no GPU and no interpreter)", allow_module_level=True)

from hvd_ngp.data import load_scene  # noqa: E402
from hvd_ngp.data.draw_triton import draw_rays, search_steps  # noqa: E402
from hvd_ngp.data.pixels import StackedPixels  # noqa: E402
from hvd_ngp.data.sampler import RaySampler  # noqa: E402
from hvd_ngp.model.encoding.hashgrid import BACKWARD_LAUNCH, FORWARD_LAUNCH, GridLaunch  # noqa: E402
from hvd_ngp.model.encoding.hashgrid_triton import (  # noqa: E402
    CANDIDATE_LAUNCHES as CANDIDATE_GRID_LAUNCHES,  # noqa: E402
    HashGridTriton,
    vector_atomics_here,
)
from hvd_ngp.model.encoding.sh import SphericalHarmonics  # noqa: E402
from hvd_ngp.model.encoding.sh_triton import SphericalHarmonicsTriton  # noqa: E402
from hvd_ngp.render.compact_triton import compact_gather  # noqa: E402
from hvd_ngp.render.composite_triton import composite, composite_into, count_until_opaque  # noqa: E402
from hvd_ngp.render.fast import compact_gather_torch  # noqa: E402
from hvd_ngp.render.march_triton import CANDIDATE_LAUNCHES, LAUNCH, MarchLaunch, march_packed  # noqa: E402

SMALL = DEV.type == "cpu"  # the interpreter is slow: smaller problems, same coverage
#: under the interpreter, which steps through every program in Python, the hash grid and the march launch few
#: programs; every launch computes the same values (test_every_hash_grid_launch_computes_the_same_values and
#: test_every_march_launch_writes_the_same_samples check the defaults against others), and a GPU runs the defaults
# the interpreter walks the backward's segmented scans lane by lane, padding included: one block of 256 points
SMALL_GRID_LAUNCH = dict(forward_launch=GridLaunch(256, 4), backward_launch=GridLaunch(256, 4)) if SMALL else {}
SMALL_MARCH_LAUNCH = MarchLaunch(128, 256, 1)


@pytest.fixture(autouse=True)
def few_march_programs(monkeypatch):
    """On the interpreter, renderers and marches that take the default launch take ``SMALL_MARCH_LAUNCH``."""
    if SMALL:
        from hvd_ngp.render import march_triton

        monkeypatch.setattr(march_triton, "LAUNCH", SMALL_MARCH_LAUNCH)


@pytest.mark.parametrize("vector_atomics", [False, True])
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "spec", [HashGridSpec(6, 2, 12, 4, 2.0), HashGridSpec(5, 4, 10, 8, 1.6), HashGridSpec(16, 2, 19, 16, 1.38)]
)
def test_hashgrid_matches_reference(spec, table_dtype, vector_atomics):
    if vector_atomics and not vector_atomics_here(DEV):
        pytest.skip("vector atomics need a CUDA GPU of sm_90 or newer (compiled for it below)")
    if SMALL and spec.log2_hashmap_size > 12:
        spec = HashGridSpec(8, 2, 14, 16, 1.5)
    torch.manual_seed(0)
    ref = HashGridTorch(spec).to(DEV)
    fast = HashGridTriton(spec, table_dtype, vector_atomics=vector_atomics, **SMALL_GRID_LAUNCH).to(DEV)
    with torch.no_grad():
        ref.params.normal_()
        fast.params.copy_(ref.params)
    n = 256 if SMALL else 1 << 16
    x = torch.rand(n, 3, device=DEV)
    x[:5] = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1 / 6, 0.5, 5 / 6], [0.25, 0.75, 0.125], [0.5, 0.5, 0.5]])
    a, b = ref(x), fast(x)
    tol = 1e-4 if table_dtype == torch.float32 else 4e-3  # summation order; fp16 rounding of N(0, 1) values
    assert_mostly_close(b, a, tol)
    g = torch.randn_like(a)
    (a * g).sum().backward()
    (b * g).sum().backward()
    assert_mostly_close(fast.params.grad, ref.params.grad, 1e-4)


def test_hashgrid_output_layouts_agree():
    """Feature-major output (the default: the transpose of a contiguous ``[L * F, N]``) and row-major output give the
    same features and table gradients, whatever the layout of the incoming gradient."""
    spec = HashGridSpec(6, 2, 12, 4, 2.0)
    torch.manual_seed(2)
    merge = {"merge_runs_below": 0} if SMALL else {}  # the layouts, not the merging (tested below), on the interpreter
    cols, rows = (
        HashGridTriton(spec, **SMALL_GRID_LAUNCH, **merge).to(DEV),
        HashGridTriton(spec, feature_major=False, **SMALL_GRID_LAUNCH, **merge).to(DEV),
    )
    assert cols.feature_major and not rows.feature_major
    with torch.no_grad():
        cols.params.normal_()
        rows.params.copy_(cols.params)
    n = 300 if SMALL else 1 << 15
    x = rays_of_points(n, 30, 1 / 128, 5).to(DEV)
    a, b = cols(x), rows(x)
    assert a.stride() == (1, n) and b.stride() == (spec.n_output_dims, 1)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    g = torch.randn(spec.n_output_dims, n, device=DEV).t()  # column-major, as the fused MLP hands it back
    for grad in (g, g.contiguous()):
        cols.params.grad = rows.params.grad = None
        a.backward(grad, retain_graph=True)
        b.backward(grad, retain_graph=True)
        torch.testing.assert_close(cols.params.grad, rows.params.grad, rtol=1e-4, atol=1e-5)  # atomics: any order


def test_every_hash_grid_launch_computes_the_same_values():
    """Points per program and warps change only how the work is split: the same encoding bit for bit and the
    same table gradient to atomic order (run merging spans a block: smaller blocks merge shorter runs). On a
    GPU, ``bench throughput --grid_launches`` checks ``CANDIDATE_LAUNCHES`` on a trained batch the same way."""
    spec = HashGridSpec(6, 2, 12, 4, 2.0)
    torch.manual_seed(3)
    enc = HashGridTriton(spec).to(DEV)
    assert (enc.forward_launch, enc.backward_launch) == (FORWARD_LAUNCH, BACKWARD_LAUNCH)
    with torch.no_grad():
        enc.params.normal_()
    n = 150 if SMALL else 1 << 15
    x = rays_of_points(n, 30, 1 / 128, 7).to(DEV)
    g = torch.randn(n, spec.n_output_dims, device=DEV)
    launches = [GridLaunch(32, 1), GridLaunch(256, 8)] if SMALL else list(CANDIDATE_GRID_LAUNCHES)
    results = []
    for launch in [FORWARD_LAUNCH, *launches]:
        enc.forward_launch = enc.backward_launch = launch
        enc.params.grad = None
        out = enc(x)
        out.backward(g)
        results.append((launch, out.detach(), enc.params.grad.clone()))
    for launch, out, grad in results[1:]:
        assert torch.equal(out, results[0][1]), launch
        torch.testing.assert_close(grad, results[0][2], rtol=1e-4, atol=1e-5, msg=str(launch))


@pytest.mark.parametrize("degree", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sh_concat_kernel_matches_its_torch_twin(degree, dtype):
    """The colour network's input in one kernel: the same basis values (fp32 math, one rounding to the features'
    dtype) and the features copied whatever their strides; the gradient reaches the features only."""
    torch.manual_seed(degree)
    n = 200 if SMALL else 100_003
    d = torch.nn.functional.normalize(torch.randn(n, 3, device=DEV), dim=-1)
    geo_t = torch.randn(16, n, device=DEV, dtype=dtype).t().requires_grad_()  # feature-major, as the fused MLP's
    geo_r = geo_t.detach().contiguous().requires_grad_()
    fast, ref = SphericalHarmonicsTriton(degree), SphericalHarmonics(degree)
    out, want = fast.concat(d, geo_t), ref.concat(d, geo_r)
    assert out.shape == (n, degree**2 + 16) and out.dtype == dtype
    torch.testing.assert_close(out, want, rtol=1e-6 if dtype == torch.float32 else 8e-3, atol=1e-6)
    g = torch.randn_like(want)
    out.backward(g)
    want.backward(g)
    torch.testing.assert_close(geo_t.grad, geo_r.grad, rtol=0, atol=0)
    odd = torch.randn(n, 15, device=DEV)  # a width that is not a power of two: the torch twin
    torch.testing.assert_close(fast.concat(d, odd), ref.concat(d, odd), rtol=0, atol=0)


@pytest.mark.parametrize("capacity", [0, 50, 1000, 5000])
def test_compaction_kernel_matches_its_torch_twin(capacity):
    """The network's rows gathered by one kernel (binary search of each row's ray) equal the torch twin's bit
    for bit: rays that keep nothing, rays past the capacity (not fitting), rows past the kept samples at
    the last ray's origin with t = dt = 0."""
    g = torch.Generator().manual_seed(capacity)
    R, C = 300, 9000
    count = torch.randint(0, 30, (R,), generator=g).int()
    count[::7] = 0
    start = (torch.cumsum(count, 0) - count).int()
    keep = torch.minimum(count, torch.randint(0, 30, (R,), generator=g).int())
    t, dt, x = torch.rand(C, generator=g), torch.rand(C, generator=g), torch.randn(C, 3, generator=g)
    o, d = torch.randn(R, 3, generator=g), torch.randn(R, 3, generator=g)
    args = [a.to(DEV) for a in (keep, start, t, dt, x, o, d)]
    fast, ref = compact_gather(*args, capacity), compact_gather_torch(*args, capacity)
    if capacity == 1000:
        assert 0 < int(ref[6].sum()) < R  # some rays fit, the rest do not
    assert len(fast) == len(ref) == 8 and int(ref[7]) == int(ref[5].sum())  # total: the rows used
    for a, b, name in zip(fast, ref, ("t", "dt", "x", "d", "start", "count", "fits", "total")):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name


def rays_of_points(n: int, per_ray: int, step: float, seed: int) -> torch.Tensor:
    """``[n, 3]`` points in the unit cube, ``per_ray`` consecutive ones ``step`` apart along random rays
    (neighbours share cells at coarse levels, as a training step's samples)."""
    gen = torch.Generator().manual_seed(seed)
    rays = -(-n // per_ray)
    origins = torch.rand(rays, 1, 3, generator=gen) * 0.6 + 0.2
    dirs = torch.nn.functional.normalize(torch.randn(rays, 1, 3, generator=gen), dim=-1)
    t = torch.arange(per_ray, dtype=torch.float32)[None, :, None] * step
    return (origins + dirs * t).reshape(-1, 3)[:n].clamp(0.0, 1.0)


@pytest.mark.parametrize(
    "spec,merge",
    [
        (HashGridSpec(6, 2, 12, 4, 2.0), 1 << 20),
        (HashGridSpec(6, 2, 12, 4, 2.0), 20),
        (HashGridSpec(6, 2, 12, 4, 2.0), 0),
        (HashGridSpec(5, 4, 10, 8, 1.6), 64),
    ],
)
def test_hashgrid_backward_merging_runs_matches_reference(spec, merge):
    """``merge_runs_below`` (0: off, every point adds its own atomics): the gradients of points along rays (long
    runs on one row at coarse levels), of uniform points (runs of one) and of a device count below the rows
    equal the reference's."""
    torch.manual_seed(1)
    ref = HashGridTorch(spec).to(DEV)
    fast = HashGridTriton(spec, merge_runs_below=merge, **SMALL_GRID_LAUNCH).to(DEV)
    assert fast.merge_runs_below == merge
    with torch.no_grad():
        ref.params.normal_()
        fast.params.copy_(ref.params)
    n = 200 if SMALL else 1 << 16
    for x, count in (
        (rays_of_points(n, 40, 1 / 256, 2).to(DEV), None),
        (torch.rand(n, 3, device=DEV), None),
        (rays_of_points(n, 40, 1 / 256, 3).to(DEV), n - 81),
    ):
        ref.params.grad = fast.params.grad = None
        rows = n if count is None else count
        g = torch.randn(n, spec.n_output_dims, device=DEV)
        (ref(x[:rows]) * g[:rows]).sum().backward()
        out = fast(x) if count is None else fast(x, torch.tensor(count, device=DEV))
        (out * g).sum().backward()
        assert_mostly_close(fast.params.grad, ref.params.grad, 1e-4)
    with pytest.raises(ValueError, match="merge_runs_below must be >= 0"):
        HashGridTriton(spec, merge_runs_below=-1)


def test_hashgrid_keeps_a_nan_point_inside_the_table():
    """A NaN position (an unwritten buffer slot) gets NaN features and NaN gradients in the table rows it
    lands on, but its rows stay inside the table: on the CPU its cast to int32 is INT_MIN, which indexed
    gigabytes away (the interpreter checks of conftest turn such an access into a failure). The other
    points are unaffected."""
    spec = HashGridSpec(4, 2, 10, 4, 2.0)  # dense and hashed levels
    torch.manual_seed(0)
    ref = HashGridTorch(spec).to(DEV)
    fast = HashGridTriton(spec).to(DEV)
    with torch.no_grad():
        ref.params.normal_()
        fast.params.copy_(ref.params)
    x = torch.rand(64, 3, device=DEV)
    x[7] = float("nan")
    out = fast(x)
    finite = torch.arange(64, device=DEV) != 7
    torch.testing.assert_close(out[finite], ref(x[finite]), rtol=1e-4, atol=1e-4)
    assert bool(out[7].isnan().all())
    out.sum().backward()  # NaN reaches only the rows of the NaN point's 8 corners per level
    assert 0 < int((~fast.params.grad.isfinite()).any(dim=1).sum()) <= 8 * spec.n_levels


def assert_mostly_close(a, b, tol, outliers=1e-4, worst=1e-2):
    """Equal within ``tol`` except a fraction ``outliers`` of elements, which stay within ``worst``: on a
    GPU a point within rounding of a cell boundary can land in the neighbouring cell (fused
    multiply-adds), which moves a continuous interpolation by ~1e-4."""
    diff = (a.detach().float() - b.detach().float()).abs()
    bad = diff > tol + tol * b.detach().float().abs()
    assert float(bad.float().mean()) <= outliers, f"{int(bad.sum())} of {diff.numel()} elements differ by > {tol}"
    assert float(diff.max()) <= worst, f"worst difference {float(diff.max())}"


def random_grid(aabb, res, cascades, seed):
    dist.init("cpu" if DEV.type == "cpu" else "cuda")
    grid = OccupancyGrid(aabb, res, cascades).to(DEV)
    g = torch.Generator(device="cpu").manual_seed(seed)
    grid.occupied.copy_((torch.rand(grid.occupied.shape, generator=g) < 0.3).to(DEV))
    return grid


def random_rays(n, center, radius, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    o = center + radius * torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1)
    target = center + 0.3 * torch.randn(n, 3, generator=g)
    d = torch.nn.functional.normalize(target - o, dim=-1)
    return o.to(DEV), d.to(DEV), torch.rand(n, generator=g).to(DEV)


@pytest.mark.parametrize("case", ["unit_uniform", "cascades_cone"])
def test_march_matches_reference(case):
    if case == "unit_uniform":
        aabb = torch.tensor([[0.0] * 3, [1.0] * 3], device=DEV)
        grid = random_grid(aabb, 16 if SMALL else 64, 1, 1)
        sch = StepSchedule(3**0.5 / (64 if SMALL else 512), 3**0.5 / (64 if SMALL else 512))
        o, d, j = random_rays(40 if SMALL else 4096, torch.tensor([0.5] * 3), 2.0, 2)
    else:
        aabb = torch.tensor([[-1.5] * 3, [2.5] * 3], device=DEV)
        grid = random_grid(aabb, 8 if SMALL else 32, 3, 3)
        dt_min = 3**0.5 / (64 if SMALL else 512)
        sch = StepSchedule(dt_min, dt_min * 4 * 8, 1 / 64)
        o, d, j = random_rays(40 if SMALL else 4096, torch.tensor([0.5] * 3), 3.0, 4)
        o[:3] = torch.tensor([[0.5, 0.5, 0.5], [0.2, 0.9, 0.1], [2.4, 0.0, -1.0]], device=DEV)  # some start inside
    ref = march(o, d, aabb, grid, sch, j)
    fast = march_packed(o, d, aabb, grid, sch, j, capacity=len(ref) + 1000)
    n = int(fast.total)
    counts = torch.bincount(ref.ray, minlength=o.shape[0])
    # On a GPU, fused multiply-adds can move a sample across a cell face or the far plane: allow one
    # sample of difference on at most 1% of the rays, and compare every other ray exactly.
    differ = fast.count.long() != counts
    assert float(differ.float().mean()) <= 0.01 and int((fast.count.long() - counts).abs().max()) <= 1
    assert abs(n - len(ref)) <= int(differ.sum())
    same = ~differ[ref.ray]
    same_fast = ~differ[fast.ray[:n].long()]
    assert torch.equal(fast.ray[:n][same_fast].long(), ref.ray[same])
    torch.testing.assert_close(fast.t[:n][same_fast], ref.t[same], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.dt[:n][same_fast], ref.dt[same], rtol=1e-4, atol=1e-5)
    assert torch.all(fast.ray[n:] == o.shape[0])


@pytest.mark.parametrize("cone, cascades", [(0.0, 1), (1 / 256, 1), (1 / 256, 3), (0.0, 2)])
def test_march_skipping_empty_cells_keeps_every_sample(cone, cascades):
    """A sparse grid (a thin shell of cells in every cascade, ~3% occupied, as a trained scene's): the
    kernel jumps over empty cells, and still gives exactly the reference's samples, ray by ray."""
    # with cascades, a resolution not divisible by 4: a finer cascade's box then cuts through coarse cells
    res = (32 if SMALL else 128) - (2 if cascades > 1 else 0)
    aabb = (
        torch.tensor([[0.0] * 3, [1.0] * 3], device=DEV)
        if cascades == 1
        else torch.tensor([[-1.5] * 3, [2.5] * 3], device=DEV)
    )
    grid = random_grid(aabb, res, cascades, 7)
    g = torch.stack(torch.meshgrid(*[torch.arange(res, device=DEV)] * 3, indexing="ij"), -1).float() / res - 0.5
    shell = ((g.norm(dim=-1) - 0.3).abs() < 0.6 / res).view(-1)
    rim = (g.abs().amax(dim=-1) > 0.5 - 1.6 / res).view(-1)  # a finer cascade's outermost cells: where a ray
    occupied = torch.stack([shell | rim if c < cascades - 1 else shell for c in range(cascades)])  # enters it
    grid.occupied.copy_(occupied & (torch.rand(grid.occupied.shape, device=DEV) < 0.7))
    dt = 3**0.5 / ((8 if SMALL else 16) * res)  # the interpreter walks every step of a program's rays
    sch = StepSchedule(dt, dt * (8 if cone else 1) * 2 ** (cascades - 1), cone)
    o, d, j = random_rays(100 if SMALL else 4096, torch.tensor([0.5] * 3), 2.0 if cascades == 1 else 3.0, 9)
    ref = march(o, d, aabb, grid, sch, j)
    fast = march_packed(o, d, aabb, grid, sch, j, capacity=len(ref) + 1000)
    counts = torch.bincount(ref.ray, minlength=o.shape[0])
    assert len(ref) > 0
    differ = fast.count.long() != counts  # on a GPU a fused multiply-add may move a sample across a face
    assert float(differ.float().mean()) <= (0.0 if SMALL else 0.01), int(differ.sum())
    if SMALL:
        n = int(fast.total)
        assert torch.equal(fast.ray[:n].long(), ref.ray.long())
        torch.testing.assert_close(fast.t[:n], ref.t, rtol=1e-5, atol=1e-5)


def test_march_drops_rays_past_the_capacity():
    aabb = torch.tensor([[0.0] * 3, [1.0] * 3], device=DEV)
    grid = random_grid(aabb, 16, 1, 5)
    sch = StepSchedule.uniform(3**0.5 / 64)
    o, d, j = random_rays(30, torch.tensor([0.5] * 3), 2.0, 6)
    full = march_packed(o, d, aabb, grid, sch, j, capacity=100000)
    cap = int(full.total) // 2
    part = march_packed(o, d, aabb, grid, sch, j, capacity=cap)
    ends = torch.cumsum(full.count.long(), 0)
    fits = ends <= cap
    assert torch.equal(part.count.long(), torch.where(fits, full.count.long(), 0))
    n = int(part.total)
    assert n <= cap and torch.equal(part.t[:n], full.t[:n])


def test_march_writes_the_sample_positions_on_request():
    """``positions=True``: each written slot holds o + t d of its ray (what the density pass used to compute);
    the samples themselves are those of the march without it."""
    aabb = torch.tensor([[0.0] * 3, [1.0] * 3], device=DEV)
    grid = random_grid(aabb, 16, 1, 5)
    sch = StepSchedule.uniform(3**0.5 / 64)
    o, d, j = random_rays(30, torch.tensor([0.5] * 3), 2.0, 6)
    plain = march_packed(o, d, aabb, grid, sch, j, capacity=100000)
    packed = march_packed(o, d, aabb, grid, sch, j, capacity=100000, positions=True)
    assert plain.x is None and packed.x.shape == (100000, 3)
    n = int(packed.total)
    assert n > 0 and n == int(plain.total) and torch.equal(packed.t[:n], plain.t[:n])
    ray = packed.ray[:n].long()
    torch.testing.assert_close(packed.x[:n], o[ray] + d[ray] * packed.t[:n, None], rtol=1e-6, atol=1e-6)


def test_every_march_launch_writes_the_same_samples():
    """Rays per program, steps per segment and warps change only how the work is split: the counts, slots,
    times and positions are the same under any launch (cascades and a cone; rays run through several
    segments). On a GPU, ``bench throughput --march_launches`` checks ``CANDIDATE_LAUNCHES`` the same way."""
    aabb = torch.tensor([[-1.5] * 3, [2.5] * 3], device=DEV)
    grid = random_grid(aabb, 16, 2, 5)
    dt = 3**0.5 / (32 if SMALL else 512)
    sch = StepSchedule(dt, dt * 8, 1 / 256, max_steps=128 if SMALL else 2048)  # ~100 / ~1600 steps across the box
    o, d, j = random_rays(10 if SMALL else 24, torch.tensor([0.5] * 3), 3.0, 6)  # the interpreter walks programs
    ref = march_packed(o, d, aabb, grid, sch, j, capacity=100000, positions=True, launch=LAUNCH)
    n = int(ref.total)
    launches = [MarchLaunch(16, 16, 1), MarchLaunch(64, 64, 4)] if SMALL else list(CANDIDATE_LAUNCHES)
    assert n > 0 and int(ref.count.max()) > 2 * min(launch.segment for launch in launches)
    for launch in launches:
        out = march_packed(o, d, aabb, grid, sch, j, capacity=100000, positions=True, launch=launch)
        assert torch.equal(out.count, ref.count) and torch.equal(out.start, ref.start), launch
        assert torch.equal(out.ray[:n], ref.ray[:n]) and torch.equal(out.t[:n], ref.t[:n]), launch
        assert torch.equal(out.x[:n], ref.x[:n]), launch


def test_a_march_launch_takes_powers_of_two_only():
    with pytest.raises(ValueError, match="segment must be a power of two"):
        MarchLaunch(64, 48, 2)
    with pytest.raises(ValueError, match="warps must be a power of two"):
        MarchLaunch(64, 64, 0)


def packed_problem(seed, n_rays=40, max_samples=30):
    g = torch.Generator(device="cpu").manual_seed(seed)
    count = torch.randint(0, max_samples, (n_rays,), generator=g)
    count[0] = 0
    start = torch.cumsum(count, 0) - count
    m = int(count.sum())
    sigma = torch.rand(m, generator=g) * 30
    rgb = torch.rand(m, 3, generator=g)
    dt = torch.rand(m, generator=g) * 0.02 + 0.005
    t = torch.cumsum(dt, 0)
    ray = torch.repeat_interleave(torch.arange(n_rays), count)
    step = torch.cat([torch.arange(int(c)) for c in count])
    mask = torch.zeros(n_rays, max_samples, dtype=torch.bool)
    mask[ray, step] = True
    return sigma, rgb, dt, t, start.int(), count.int(), ray, mask


def test_composite_forward_and_backward_match_reference():
    from hvd_ngp.render import Samples

    sigma, rgb, dt, t, start, count, ray, mask = packed_problem(7)
    samples = Samples(mask, ray, t, dt)
    s_ref = sigma.clone().requires_grad_(True)
    c_ref = rgb.clone().requires_grad_(True)
    w, _ = transmittance_weights(s_ref, samples)
    R = start.shape[0]
    ref = (accumulate(w, c_ref, ray, R), accumulate(w, None, ray, R), accumulate(w, t[:, None], ray, R)[:, 0])
    s_fast = sigma.clone().to(DEV).requires_grad_(True)
    c_fast = rgb.clone().to(DEV).requires_grad_(True)
    out = composite(s_fast, c_fast, dt.to(DEV), t.to(DEV), start.to(DEV), count.to(DEV))
    for a, b in zip(out, ref):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5)
    g = [torch.randn_like(x) for x in ref]
    sum((a * b).sum() for a, b in zip(ref, g)).backward()
    sum((a * b.to(DEV)).sum() for a, b in zip(out, g)).backward()
    torch.testing.assert_close(s_fast.grad.cpu(), s_ref.grad, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(c_fast.grad.cpu(), c_ref.grad, rtol=1e-4, atol=1e-6)


def test_count_until_opaque_matches_reference_transmittance():
    from hvd_ngp.render import Samples

    sigma, rgb, dt, t, start, count, ray, mask = packed_problem(8)
    _, t_before = transmittance_weights(sigma, Samples(mask, ray, t, dt))
    expected = torch.bincount(ray[t_before > 1e-2], minlength=start.shape[0])
    keep = count_until_opaque(sigma.to(DEV), dt.to(DEV), start.to(DEV), count.to(DEV), 1e-2)
    assert torch.equal(keep.cpu().long(), expected)


def test_composite_into_is_the_count_the_composite_and_the_state_update_it_replaces():
    """``composite_into`` (one kernel) against ``count_until_opaque`` with a carried log_t, ``composite`` of the
    kept prefix and the torch updates of the rays' state it replaces in ``render.infer``: a group of 40 rays of
    60 (ids shuffled), some carrying a log_t near or past the stop, in fp32 and fp16; and with no stop (eps 0)."""
    sigma, rgb, dt, t, start, count, _, _ = packed_problem(9)
    g = torch.Generator().manual_seed(3)
    R, G = 60, start.shape[0]
    ids = torch.randperm(R, generator=g)[:G]
    log_t0 = -torch.rand(R, generator=g) * 3
    log_t0[ids[:5]] = math.log(1e-2) + torch.tensor([-0.1, 0.0, 1e-3, 0.05, 0.5])  # past, at, just before the stop
    trans0 = torch.rand(R, generator=g) * 0.9 + 0.1
    rgb0, depth0 = torch.rand(R, 3, generator=g), torch.rand(R, generator=g)
    for dtype, eps in ((torch.float32, 1e-2), (torch.float16, 1e-2), (torch.float32, 0.0)):
        s, c = sigma.to(dtype).to(DEV), rgb.to(dtype).to(DEV)
        dts, ts, st, ct, idd = dt.to(DEV), t.to(DEV), start.to(DEV), count.to(DEV), ids.to(DEV)
        # the sequence render.infer ran before
        log_t, trans, acc, dep = (v.clone().to(DEV) for v in (log_t0, trans0, rgb0, depth0))
        carried = log_t[idd].contiguous()
        keep_ref = count_until_opaque(s, dts, st, ct, eps, carried)
        log_t[idd] = carried
        w_rgb, w_op, w_depth = composite(s, c, dts, ts, st, keep_ref)
        before = trans[idd]
        acc[idd] += before[:, None] * w_rgb
        dep[idd] += before * w_depth
        trans[idd] = before * (1.0 - w_op)
        # the one kernel
        log_t2, trans2, acc2, dep2 = (v.clone().to(DEV) for v in (log_t0, trans0, rgb0, depth0))
        keep = composite_into(s, c, dts, ts, st, ct, idd, eps, log_t2, trans2, acc2, dep2)
        assert torch.equal(keep, keep_ref), (dtype, eps)
        assert int(keep[:5].sum()) < int(ct[:5].sum()) or eps == 0  # the carried stops cut windows short
        for got, want in ((log_t2, log_t), (trans2, trans), (acc2, acc), (dep2, dep)):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        untouched = torch.ones(R, dtype=torch.bool)
        untouched[ids] = False
        assert torch.equal(trans2.cpu()[untouched], trans0[untouched]) and torch.equal(
            acc2.cpu()[untouched], rgb0[untouched]
        )


def ball_scene(density: float = 40.0, occupied: bool = True):
    """A unit box (its occupancy grid all occupied, or random), a fine uniform step and a soft ball of radius
    0.3 at its centre: (aabb, grid, schedule, sigma_fn(x, n_rows=None), rgb_sigma_fn(x, dirs, n_rows=None))."""
    aabb = torch.tensor([[0.0] * 3, [1.0] * 3], device=DEV)
    grid = random_grid(aabb, 8, 1, 9)
    if occupied:
        grid.occupied.fill_(True)
    centre = torch.tensor([0.5, 0.5, 0.5], device=DEV)

    def sigma_fn(x, n_rows=None):  # computes every row
        return density * torch.sigmoid(20 * (0.3 - (x - centre).norm(dim=-1)))

    def rgb_sigma_fn(x, dirs, n_rows=None):
        return torch.stack([x[:, 0], x[:, 1], dirs[:, 2].abs()], dim=-1), sigma_fn(x)

    return aabb, grid, StepSchedule.uniform(3**0.5 / 48), sigma_fn, rgb_sigma_fn


def test_fast_renderer_matches_reference_rendering():
    """The whole fixed-buffer pipeline (march, early termination, compaction, compositing) against
    the reference renderer on the same field, with buffers large enough for every ray."""
    from hvd_ngp.render import render_rays
    from hvd_ngp.render.fast import FastRenderer, render_rays_fast

    aabb, grid, sch, sigma_fn, rgb_sigma_fn = ball_scene()
    o, d, j = random_rays(24, torch.tensor([0.5] * 3), 2.0, 10)

    ref = render_rays(rgb_sigma_fn, sigma_fn, o, d, aabb, grid, sch, 1e-3, j)
    out = FastRenderer(4096, 4096)(rgb_sigma_fn, sigma_fn, o, d, aabb, grid, sch, 1e-3, j)
    assert bool(out.valid.all()) and int(out.n_samples) == ref.n_samples and int(out.n_candidates) == ref.n_candidates
    torch.testing.assert_close(out.rgb, ref.rgb, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.opacity, ref.opacity, rtol=1e-4, atol=1e-5)
    # tight buffers: rays that do not fit are flagged, the others are unchanged
    small = FastRenderer(ref.n_candidates // 2, ref.n_samples // 2)(
        rgb_sigma_fn, sigma_fn, o, d, aabb, grid, sch, 1e-3, j
    )
    v = small.valid
    assert 0 < int(v.sum()) < 24
    torch.testing.assert_close(small.rgb[v], ref.rgb[v], rtol=1e-4, atol=1e-5)
    rgb, opacity, _ = render_rays_fast(rgb_sigma_fn, sigma_fn, o, d, aabb, grid, sch, 1e-3)
    ref_mid = render_rays(rgb_sigma_fn, sigma_fn, o, d, aabb, grid, sch, 1e-3)
    torch.testing.assert_close(rgb, ref_mid.rgb, rtol=1e-4, atol=1e-5)


def test_fast_renderer_with_nothing_marched_keeps_gradients_finite():
    """An empty occupancy grid: no ray marches a sample, so every network slot is unused and reads slot 0
    of an unwritten buffer. With unwritten memory NaN (poisoned), the gradients must still be finite
    zeros: a NaN input of an unused row reaches the weights through 0 * NaN."""
    from interpreter_checks import poisoned_memory

    from hvd_ngp.render.fast import FastRenderer

    aabb = torch.tensor([[0.0] * 3, [1.0] * 3], device=DEV)
    grid = random_grid(aabb, 8, 1, 9)
    grid.occupied.fill_(False)
    sch = StepSchedule.uniform(3**0.5 / 48)
    o, d, j = random_rays(16, torch.tensor([0.5] * 3), 2.0, 10)
    torch.manual_seed(0)
    encoding = HashGridTriton(HashGridSpec(4, 2, 10, 4, 2.0)).to(DEV)
    head = torch.nn.Linear(8, 4).to(DEV)

    def rgb_sigma_fn(x, dirs, n_rows=None):
        h = head(encoding(x.clamp(0.0, 1.0)))
        return torch.sigmoid(h[:, :3]), torch.exp(h[:, 3])

    def sigma_fn(x, n_rows=None):
        with torch.no_grad():
            return rgb_sigma_fn(x, x)[1]

    with poisoned_memory():
        out = FastRenderer(256, 128)(rgb_sigma_fn, sigma_fn, o, d, aabb, grid, sch, 1e-4, j)
        (out.rgb.sum() + out.opacity.sum()).backward()
    assert int(out.n_candidates) == 0 and int(out.n_samples) == 0
    for p in (encoding.params, head.weight, head.bias):
        assert bool(p.grad.isfinite().all()) and not bool(p.grad.any())


def test_inference_render_within_a_small_workspace_equals_the_exact_one():
    """Evaluation renders with a workspace smaller than the chunk's candidates (several groups, the
    network a few rows at a time): the same pixels as one exactly sized pass and the reference."""
    from hvd_ngp.render import render_rays
    from hvd_ngp.render.fast import RenderWorkspace, render_rays_fast
    from hvd_ngp.render.plan import RenderPlan

    aabb, grid, sch, sigma_fn, rgb_sigma_fn = ball_scene(occupied=False)
    o, d, _ = random_rays(40, torch.tensor([0.5] * 3), 2.0, 11)

    exact = render_rays_fast(rgb_sigma_fn, sigma_fn, o, d, aabb, grid, sch, 1e-3)
    ref = render_rays(rgb_sigma_fn, sigma_fn, o, d, aabb, grid, sch, 1e-3)
    small = RenderWorkspace(RenderPlan(rays=40, candidates=48, rows=7), DEV)  # one ray has at most 48 candidates
    for _ in range(2):  # the same workspace serves a second call
        out = render_rays_fast(rgb_sigma_fn, sigma_fn, o, d, aabb, grid, sch, 1e-3, small)
        for a, b in zip(out, exact):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(exact[0], ref.rgb, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("path", ["two_pass", "single_pass"])
def test_inference_march_launch_changes_no_pixel(monkeypatch, path):
    """Both inference paths under another march launch (``fast.INFERENCE_LAUNCH``: training's 32-step segments,
    which the windows cross, and 8 rays per program, against the default's one 1024-step segment that holds every
    ray's samples): the same rgb, opacity and depth as under the default launch."""
    import hvd_ngp.render.fast as fast_mod
    from hvd_ngp.render.schedule import MarchLaunch
    from hvd_ngp.render.volume import inference_path

    aabb, grid, _, ball, rgb_sigma_fn = ball_scene(density=300.0)
    sch = StepSchedule.uniform(3**0.5 / 48, max_steps=64)  # 48 steps cross the box; the interpreter walks them all
    o, d, j = random_rays(24, torch.tensor([0.5] * 3), 2.0, 12)
    render = inference_path(path)
    monkeypatch.setattr(fast_mod, "FIRST_WINDOW", 3)
    default = render(rgb_sigma_fn, ball, o, d, aabb, grid, sch, 1e-3, jitter=j)
    assert fast_mod.INFERENCE_LAUNCH.segment > 32
    monkeypatch.setattr(fast_mod, "INFERENCE_LAUNCH", MarchLaunch(8, 32, 1))
    out = render(rgb_sigma_fn, ball, o, d, aabb, grid, sch, 1e-3, jitter=j)
    for a, b in zip(out, default):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert int((default[1] > 0.99).sum()) >= 10  # rays did turn opaque


def test_inference_windows_evaluate_less_and_render_the_same(monkeypatch):
    """Rays march in windows of their candidates (here 2, 4, 8, ...): the same pixels, opacity and depth as
    the reference renderer, while the density pass skips the candidates behind each ray's opaque point,
    including rays that turn opaque only in a later window (their -sum(sigma dt) carried across)."""
    import hvd_ngp.render.fast as fast_mod
    from hvd_ngp.render import render_rays

    aabb, grid, sch, ball, rgb_sigma_fn = ball_scene(density=300.0)  # rays that hit it turn opaque a few steps in
    o, d, j = random_rays(24, torch.tensor([0.5] * 3), 2.0, 12)
    evaluated = []

    def sigma_fn(x, n_rows=None):
        evaluated.append(x.shape[0])
        return ball(x)

    ref = render_rays(rgb_sigma_fn, sigma_fn, o, d, aabb, grid, sch, 1e-3, j)
    monkeypatch.setattr(fast_mod, "FIRST_WINDOW", 2)
    evaluated.clear()
    rgb, opacity, depth = fast_mod.render_rays_fast(rgb_sigma_fn, sigma_fn, o, d, aabb, grid, sch, 1e-3, jitter=j)
    torch.testing.assert_close(rgb, ref.rgb, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(opacity, ref.opacity, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(depth, ref.depth, rtol=1e-4, atol=1e-5)
    # one density pass over every candidate before (500 here) against 303: those behind each opaque point are
    # left out, but for the rest of their last window
    assert len(evaluated) >= 3 and ref.n_samples <= sum(evaluated) < 0.7 * ref.n_candidates
    assert int((opacity > 0.99).sum()) >= 10  # rays did turn opaque


# --- the GPU compiler, without a GPU ---------------------------------------------------------------------

TRITON_TYPES = {
    torch.float64: "*fp64",
    torch.float32: "*fp32",
    torch.float16: "*fp16",
    torch.bfloat16: "*bf16",
    torch.int64: "*i64",
    torch.int32: "*i32",
    torch.int16: "*i16",
    torch.int8: "*i8",
    torch.uint8: "*u8",
    torch.bool: "*i1",
}


def launch_record(fn, args: tuple, kwargs: dict) -> dict:
    """A Triton launch as ``compile_kernels.py`` reads it: every argument's Triton type, constexpr values."""
    import inspect

    params = inspect.signature(fn).parameters
    bound = dict(zip(params, args), **kwargs)
    signature, constexprs = {}, {}
    for name, p in params.items():
        value = bound[name]
        if "constexpr" in str(p.annotation):
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = TRITON_TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: cannot type argument {name}={value!r}")
    return {"module": fn.__module__, "kernel": fn.__name__, "signature": signature, "constexprs": constexprs}


def exercise_kernels() -> None:
    """Every Triton kernel of the package once per kind of launch training makes (tiny problems)."""
    for dtype in (torch.float32, torch.float16):
        enc = HashGridTriton(HashGridSpec(4, 2, 10, 8, 2.0), dtype)
        enc(torch.rand(64, 3)).sum().backward()
        enc(torch.rand(64, 3), torch.tensor(40)).sum().backward()  # the density pass's device count
    with torch.no_grad(), inference_math("fp16"):  # inference: the half table's copy, half features out
        enc(torch.rand(64, 3), torch.tensor(40))
    for features in (2, 4):  # the backward that merges runs on one row (coarse levels), with and without a count
        enc = HashGridTriton(HashGridSpec(4, features, 10, 8, 2.0), merge_runs_below=16)
        enc(torch.rand(64, 3)).sum().backward()
        enc(torch.rand(64, 3), torch.tensor(40)).sum().backward()
    from hvd_ngp.model.mlp_triton import fused_mlp

    # the fused MLPs of the default config (density 32-64-16, colour 32-64-64-3), a generic one (padded input
    # and output, three hidden layers, no ReLU) and a wide one, the count, no input gradient; in every math but
    # "ieee" (fp32 products without tf32), whose branch the density network's shape alone compiles (the colour
    # network's ieee backward took 10 s of the CPU's compile); bf16 runs wrong under the interpreter (raw bits)
    # but records its launch all the same
    shapes = ((32, 64, 1, 16, True), (32, 64, 2, 3, True), (8, 16, 3, 5, False), (16, 128, 1, 16, True))
    maths = [(shapes[0], "ieee"), *itertools.product(shapes, ("tf32", "fp16", "bf16"))]
    for (n_in, width, depth, n_out, relu), dot in maths:
        w = [torch.randn(b, a, requires_grad=True) for a, b in zip([n_in] + [width] * depth, [width] * depth + [n_out])]
        x = torch.randn(70, n_in, requires_grad=True)
        fused_mlp(x, w, relu, dot).float().sum().backward()
        if (n_in, dot) == (32, "fp16"):
            fused_mlp(x.detach(), w, relu, dot, n_rows=torch.tensor(50)).float().sum().backward()
            fused_mlp(x, w, relu, dot, n_rows=torch.tensor(50, dtype=torch.int32)).float().sum().backward()
    from hvd_ngp.model.mlp_triton import mlp_forward

    # the colour network's SH input computed in the forward kernel (inference), tf32 and fp16, with a count
    w = [torch.randn(64, 32), torch.randn(64, 64), torch.randn(3, 64)]
    d = torch.nn.functional.normalize(torch.randn(70, 3), dim=-1)
    for dot, geo in (("tf32", torch.randn(70, 16)), ("fp16", torch.randn(70, 16).half())):
        mlp_forward(geo, w, True, dot, torch.tensor(50), d, 4)
    for aabb, cascades, sch in (
        (torch.tensor([[0.0] * 3, [1.0] * 3]), 1, StepSchedule.uniform(3**0.5 / 32)),
        (torch.tensor([[-1.5] * 3, [2.5] * 3]), 2, StepSchedule(0.03, 0.24, 1 / 64)),
    ):
        o, d, j = random_rays(8, torch.tensor([0.5] * 3), 3.0, 11)
        march_packed(o, d, aabb, random_grid(aabb, 8, cascades, 12), sch, j, capacity=4096)
    # the inference renderers' window launch: skip a window's first candidates, resume where the last one stopped
    from hvd_ngp.render.march_triton import march_counts, march_window, march_write, window_start

    grid = random_grid(aabb, 8, cascades, 12)
    seg_count = march_counts(o, d, aabb, grid, sch, j)
    resume = window_start(8, sch, None, o.device)
    march_write(o, d, aabb, grid, sch, j, seg_count, 4096, positions=True, skip=seg_count // 2, resume=resume)
    march_window(o, d, aabb, grid, sch, j, torch.zeros(8, dtype=torch.int32), 16)  # single_pass: no count pass
    sigma, rgb, dt, t, start, count, _, _ = packed_problem(13, n_rays=6, max_samples=5)
    for dtype in (torch.float32, torch.float16):
        s, c = sigma.to(dtype).requires_grad_(True), rgb.to(dtype).requires_grad_(True)
        sum(x.sum() for x in composite(s, c, dt, t, start, count)).backward()
        count_until_opaque(s.detach(), dt, start, count, 1e-2)
        state = torch.zeros(8), torch.ones(8), torch.zeros(8, 3), torch.zeros(8)  # log_t, transmittance, rgb, depth
        composite_into(s.detach(), c.detach(), dt, t, start, count, torch.arange(6) + 2, 1e-2, *state)
    # the network's rows packed from the kept samples (training's compaction and single_pass's windows)
    compact_gather(count, start, t, dt, torch.rand(t.shape[0], 3), torch.rand(6, 3), torch.rand(6, 3), 12)
    d = torch.nn.functional.normalize(torch.randn(20, 3), dim=-1)
    SphericalHarmonicsTriton(4).concat(d, torch.randn(16, 20).t())  # the colour input, feature-major features
    tiles = {k: torch.zeros(2, dtype=torch.int64) for k in ("image", "x0", "y0")}
    tiles.update(w=torch.ones(2, dtype=torch.int64), h=torch.ones(2, dtype=torch.int64))
    for offsets, weight, images in (
        (None, None, torch.zeros(1, 1, 1, 4, dtype=torch.uint8)),
        (torch.rand(3, 2), torch.ones(2), torch.zeros(1, 1, 1, 4, dtype=torch.float16)),
    ):
        draw_rays(
            torch.rand(3, dtype=torch.float64),
            torch.rand(3, 2),
            offsets,
            torch.tensor([0.5, 1.0], dtype=torch.float64),
            torch.arange(2),
            tiles,
            weight,
            images,
            torch.zeros(2, dtype=torch.int64),
            torch.ones(1, dtype=torch.int64),
            torch.eye(3, 4)[None],
            torch.ones(1, 4),
        )


@pytest.mark.parametrize(
    "jitter,scored,image_dtype", [(False, False, "uint8"), (True, True, "uint8"), (False, True, "fp16")]
)
def test_fused_ray_draw_matches_the_torch_draw(scene_cache, jitter, scored, image_dtype):
    """The same generator and seed: the same pixels, tiles, colours and weights, bit for bit; the same rays
    to float rounding; the generator left in the same state (batches can be un-drawn either way)."""
    frames = load_scene("builtin", scene_cache=scene_cache).train
    store = StackedPixels(frames, DEV, on_device=True, image_dtype=image_dtype)
    ref, fast = (
        RaySampler(frames, 1, 2, 7, DEV, jitter, store=store, tile_size=16, fused=mode) for mode in ("off", "on")
    )
    assert ref.fused_why_not == "off" and fast.fused_why_not is None
    if scored:  # importance weights, and tiles that are never drawn (score 0: repeated CDF entries)
        scores = torch.rand(ref.grid.n_tiles, generator=torch.Generator().manual_seed(3))
        scores[::3] = 0.0
        ref.set_scores(scores)
        fast.set_scores(scores)
    for n in (1, 37, 300):
        a, b = ref.sample(n), fast.sample(n)
        for name in ("pixel", "tile", "rgba", "weight"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None) == (name == "weight" and not scored), name
            if x is not None:
                assert x.dtype == y.dtype and torch.equal(x, y), name
        assert torch.equal(a.origins, b.origins)
        torch.testing.assert_close(b.directions, a.directions, rtol=0, atol=2e-6)
    assert torch.equal(ref.generator.get_state(), fast.generator.get_state())
    ref.set_resolution(2)  # a coarser resolution is the torch path's alone: the fused sampler falls back to it
    fast.set_resolution(2)
    a, b = ref.sample(64), fast.sample(64)
    assert torch.equal(a.pixel, b.pixel) and torch.equal(a.directions, b.directions)


def test_fused_ray_draw_searches_the_cdf_as_searchsorted_right():
    """Draws landing exactly on CDF entries, on repeated entries and at the ends pick the tile that
    ``torch.searchsorted(cdf, u, right=True)`` (clamped to the last) picks."""
    cdf = torch.tensor([0.25, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64, device=DEV)
    u = torch.tensor([0.0, 0.1, 0.25, 0.3, 0.5, 0.74, 0.75, 0.999, 1.0], dtype=torch.float64, device=DEV)
    active = torch.tensor([4, 0, 3, 1, 2], device=DEV)
    n_tiles = 5
    tiles = {
        "image": torch.zeros(n_tiles, dtype=torch.int64, device=DEV),
        "x0": torch.arange(n_tiles, device=DEV) * 2,
        "y0": torch.zeros(n_tiles, dtype=torch.int64, device=DEV),
        "w": torch.full((n_tiles,), 2, device=DEV),
        "h": torch.full((n_tiles,), 2, device=DEV),
    }
    images = torch.randint(0, 256, (1, 2, 10, 4), dtype=torch.uint8, device=DEV)
    c2w = torch.eye(3, 4, device=DEV)[None]
    out = draw_rays(
        u,
        torch.zeros(9, 2, device=DEV),
        None,
        cdf,
        active,
        tiles,
        None,
        images,
        torch.zeros(2, dtype=torch.int64, device=DEV),
        torch.tensor([10], device=DEV),
        c2w,
        torch.tensor([[1.0, 1.0, 5.0, 1.0]], device=DEV),
    )
    expected = active[torch.searchsorted(cdf, u, right=True).clamp(max=4)]
    assert out["tile"].tolist() == expected.tolist() == [4, 4, 3, 3, 1, 1, 2, 2, 2]
    assert out["pixel"].tolist() == (expected * 2).tolist()  # each tile's first pixel (pick 0, row 0)
    assert torch.equal(out["rgba"], images[0, 0, expected * 2].float() / 255.0)
    assert out["weight"] is None and [search_steps(n) for n in (1, 2, 5, 8)] == [1, 2, 3, 4]


def test_fused_ray_draw_says_where_it_does_not_apply(scene_cache):
    frames = load_scene("builtin", scene_cache=scene_cache).train
    auto = RaySampler(frames, 0, 1, 0, DEV, fused="auto")
    assert (auto.fused_why_not is None) == (DEV.type == "cuda")
    host = StackedPixels(frames, DEV, on_device=False)
    with pytest.raises(ValueError, match="the images are not on the device"):
        RaySampler(frames, 0, 1, 0, DEV, store=host, fused="on", prefetch=False)
    with pytest.raises(ValueError, match="fused must be one of"):
        RaySampler(frames, 0, 1, 0, DEV, fused="yes")


def test_every_kernel_compiles_for_hopper(tmp_path, monkeypatch):
    """The interpreter runs the kernels' Python, not the GPU compiler: record each launch's argument
    types here, then compile every one for sm_90 (H100/H200) with Triton's CUDA backend in a process
    without the interpreter. On a GPU the parity tests above compile them for real."""
    if DEV.type == "cuda":
        pytest.skip("compiled on the GPU by the parity tests")
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError as e:
        pytest.skip(f"Triton's CUDA backend is not installed: {e}")
    launches: dict[str, dict] = {}
    run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        record = launch_record(self.fn, args, kwargs)
        launches[json.dumps(record, sort_keys=True)] = record
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recording_run)
    exercise_kernels()
    names = {r["kernel"] for r in launches.values()}
    assert names == {
        "_hashgrid_fwd",
        "_hashgrid_bwd",
        "_march",
        "_composite_fwd",
        "_composite_bwd",
        "_count_until_opaque",
        "_composite_into",
        "_compact_gather",
        "_sh_concat",
        "_mlp_fwd",
        "_mlp_bwd",
        "_draw_rays",
    }, names
    for record in [r for r in launches.values() if r["kernel"] == "_hashgrid_bwd" and r["constexprs"]["F"] == 2]:
        assert record["constexprs"]["PAIRS"] is False  # the interpreter adds one feature per atomic;
        paired = {**record, "constexprs": {**record["constexprs"], "PAIRS": True}}  # sm_90 pairs them (inline PTX)
        launches[json.dumps(paired, sort_keys=True)] = paired
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(list(launches.values()), indent=1))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("compile_kernels.py")), str(path), "--arch", "90"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.stdout.count("ok ") == len(launches), proc.stdout


def test_segment_starts_is_the_exclusive_running_total_of_each_row():
    """``fast.segment_starts`` (one flat scan) against the per-row exclusive cumsum it replaces: random counts
    with empty rows and segments, one column, and no rows."""
    from hvd_ngp.render.fast import segment_starts

    gen = torch.Generator().manual_seed(5)
    for shape in ((37, 32), (5, 1), (0, 32), (1, 7)):
        counts = torch.randint(0, 40, shape, generator=gen, dtype=torch.int32)
        if shape[0] > 2 and shape[1] > 3:
            counts[2] = 0  # a ray without candidates
            counts[:, 3] = 0  # a segment no ray reaches
        counts = counts.to(DEV)
        expected = torch.cumsum(counts, 1, dtype=torch.int32) - counts
        got = segment_starts(counts)
        assert got.dtype == torch.int32 and got.shape == counts.shape
        assert torch.equal(got, expected)
