"""Volume rendering against closed forms, and ray marching through the occupancy grid."""

from __future__ import annotations

import math

import pytest
import torch

from hvd_ngp.cluster import dist
from hvd_ngp.render import StepSchedule, march, render_image, render_rays, transmittance_weights
from hvd_ngp.render.occupancy import OccupancyGrid
from hvd_ngp.render.volume import render_in_chunks

AABB = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])


def axis_rays(n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Rays along +x through the cube at a few (y, z): they cross it over t in [1, 2]."""
    yz = torch.linspace(0.2, 0.8, n)
    o = torch.stack([torch.full((n,), -1.0), yz, yz.flip(0)], dim=-1)
    d = torch.tensor([[1.0, 0.0, 0.0]]).expand(n, 3)
    return o, d


def const_field(sigma_of_x, color=(0.2, 0.4, 0.6)):
    c = torch.tensor(color)

    def rgb_sigma(x, d):
        return c.expand(x.shape[0], 3), sigma_of_x(x)

    return rgb_sigma, sigma_of_x


def test_constant_density_slab_matches_closed_form():
    sigma, dt, n_steps = 3.0, 1.0 / 256, 300
    rgb_sigma, sig = const_field(lambda x: torch.full((x.shape[0],), sigma))
    o, d = axis_rays()
    out = render_rays(rgb_sigma, sig, o, d, AABB, None, StepSchedule.uniform(dt, n_steps), early_termination=0.0)
    n_inside = 256  # samples at t = 1 + (k + 0.5) dt, k < 256
    alpha = 1.0 - math.exp(-sigma * dt)
    opacity = 1.0 - math.exp(-sigma * dt * n_inside)
    depth = sum((1.0 + (k + 0.5) * dt) * math.exp(-sigma * dt * k) * alpha for k in range(n_inside))
    torch.testing.assert_close(out.opacity, torch.full((4,), opacity), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.depth, torch.full((4,), depth), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.rgb, opacity * torch.tensor([[0.2, 0.4, 0.6]]).expand(4, 3), rtol=1e-5, atol=1e-5)


def test_four_half_opaque_steps_match_weights_worked_by_hand():
    """sigma * dt = ln 2 over four steps of 0.25 in t in [1, 2]: alpha 1/2 each, weights 1/2, 1/4, 1/8, 1/16."""
    rgb_sigma, sig = const_field(lambda x: torch.full((x.shape[0],), 4 * math.log(2)))
    o, d = axis_rays()
    out = render_rays(rgb_sigma, sig, o, d, AABB, None, StepSchedule.uniform(0.25), early_termination=0.0)
    assert out.n_samples == 4 * 4
    # opacity 1/2 + 1/4 + 1/8 + 1/16 = 15/16; depth (1.125 * 8 + 1.375 * 4 + 1.625 * 2 + 1.875) / 16
    torch.testing.assert_close(out.opacity, torch.full((4,), 0.9375))
    torch.testing.assert_close(out.depth, torch.full((4,), 1.2265625))
    torch.testing.assert_close(out.rgb, torch.tensor([[0.1875, 0.375, 0.5625]]).expand(4, 3))


def test_empty_space_renders_nothing():
    rgb_sigma, sig = const_field(lambda x: torch.zeros(x.shape[0]))
    o, d = axis_rays()
    out = render_rays(rgb_sigma, sig, o, d, AABB, None, StepSchedule.uniform(1 / 128))
    assert torch.all(out.opacity == 0) and torch.all(out.rgb == 0) and torch.all(out.depth == 0)


def test_opaque_wall_stops_rays_at_its_surface():
    wall = 0.5
    rgb_sigma, sig = const_field(lambda x: torch.where(x[:, 0] > wall, 1e4, 0.0))
    o, d = axis_rays()
    out = render_rays(rgb_sigma, sig, o, d, AABB, None, StepSchedule.uniform(1 / 256))
    torch.testing.assert_close(out.opacity, torch.ones(4), rtol=0, atol=1e-6)
    assert torch.all((out.depth - (1.0 + wall)).abs() < 2 / 256)
    # early termination: the 128 free samples before the wall and the first one inside it went through
    # the network; the 127 behind it (transmittance ~0) did not
    assert out.n_candidates == 4 * 256 and out.n_samples == 4 * 129


def test_weights_sum_to_opacity_and_transmittance_is_exclusive():
    """Per ray, the weights sum to 1 - exp(-sum sigma dt) (no early termination here), and the transmittance
    before a sample excludes that sample's own optical depth."""
    o, d = axis_rays(2)
    samples = march(o, d, AABB, None, StepSchedule.uniform(0.1))
    sigma = torch.rand(len(samples), generator=torch.Generator().manual_seed(0)) * 2  # optical depth ~1 per ray
    w, t_before = transmittance_weights(sigma, samples)
    for r in range(2):
        on = samples.ray == r
        tau = (sigma[on] * samples.dt[on]).double().tolist()
        assert len(tau) == 10 and float(w[on].sum()) == pytest.approx(1 - math.exp(-sum(tau)), rel=1e-5)
        expected_t = [math.exp(-sum(tau[:i])) for i in range(len(tau))]  # 1 at the ray's first sample
        torch.testing.assert_close(
            t_before[on].double(), torch.tensor(expected_t, dtype=torch.float64), rtol=1e-5, atol=1e-6
        )
    assert bool((w >= 0).all())


def test_march_skips_free_cells_and_grid_update_is_max_decay():
    dist.init("cpu")
    grid = OccupancyGrid(AABB, resolution=8, threshold=0.01, decay=0.5)
    # density only in the half x > 0.5
    grid.update(lambda x: torch.where(x[:, 0] > 0.5, 10.0, 0.0), step_size=0.01, step=0, warmup_steps=10, seed=0)
    occ = grid.occupied.view(8, 8, 8)
    assert occ[4:].all() and not occ[:4].any()
    o, d = axis_rays()
    s = march(o, d, AABB, grid, StepSchedule.uniform(1 / 64))
    x = o[s.ray] + d[s.ray] * s.t[:, None]
    assert len(s) > 0 and torch.all(x[:, 0] >= 0.5 - 1e-6)
    # decayed max: with no density anywhere, values halve
    before = grid.density.clone()
    grid.update(lambda x: torch.zeros(x.shape[0]), step_size=0.01, step=1, warmup_steps=10, seed=0)
    torch.testing.assert_close(grid.density, before * 0.5)


def test_grid_update_in_shares_merged_by_the_reduce_callback_equals_the_whole_update():
    """The grid runs no collective: two processes' shares of the chosen cells, evaluated apart and merged through
    ``reduce_max`` (here the other share's values, as the ranks' Max allreduce brings them), give the grid of one
    process that refreshes every cell, at warm-up (every cell) and after it (drawn cells)."""

    def density(x):
        return (torch.sin(9 * x).sum(-1) * 40).clamp(min=0)

    whole, mine, theirs = (OccupancyGrid(AABB, resolution=8, n_cascades=2, decay=0.5) for _ in range(3))
    for step in (0, 12, 16):
        whole.update(density, 0.01, step, warmup_steps=10, seed=5)
        fresh0 = mine.evaluate(*mine.draw_cells(step, 10, 5), density, 0.01, share=(0, 2))
        seen = []
        theirs.update(
            density,
            0.01,
            step,
            warmup_steps=10,
            seed=5,
            share=(1, 2),
            reduce_max=lambda f: seen.append(f.clone()) or torch.maximum(f, fresh0),
        )
        mine.merge(fresh0, lambda f: torch.maximum(f, seen[0]))
        assert len(seen) == 1 and (fresh0 > 0).any() and (seen[0] > 0).any() and not torch.equal(fresh0, seen[0])
        if step == 0:  # warm-up: every cell once, split between the shares
            assert not ((fresh0 > 0) & (seen[0] > 0)).any()
        for grid in (mine, theirs):
            assert torch.equal(grid.density, whole.density) and torch.equal(grid.occupied, whole.occupied)
    assert 0 < whole.occupancy_fraction() < 1


def test_chunked_renders_call_between_chunks_before_each_chunk_and_stop_when_it_raises():
    """``between_chunks`` (the evaluation's stop check) runs before every chunk; when it raises, no further
    chunk renders and the exception reaches the caller, through ``render_image`` too."""
    rgb_sigma, sig = const_field(lambda x: torch.full((x.shape[0],), 2.0))
    o, d = axis_rays(8)
    rendered, before = [], []

    def render(o, d, j):
        rendered.append(o.shape[0])
        out = render_rays(rgb_sigma, sig, o, d, AABB, None, StepSchedule.uniform(1 / 64), 0.0, j)
        return out.rgb, out.opacity, out.depth

    rgb, _ = render_in_chunks(render, o, d, torch.ones(3), 3, between_chunks=lambda: before.append(sum(rendered)))
    assert before == [0, 3, 6] and rendered == [3, 3, 2] and rgb.shape == (8, 3)

    class Stop(Exception):
        pass

    def stop_at_the_second():
        if rendered:
            raise Stop

    rendered.clear()
    with pytest.raises(Stop):
        render_in_chunks(render, o, d, torch.ones(3), 3, between_chunks=stop_at_the_second)
    assert rendered == [3]
    with pytest.raises(Stop):
        render_image(
            rgb_sigma,
            sig,
            o,
            d,
            AABB,
            None,
            StepSchedule.uniform(1 / 64),
            torch.ones(3),
            between_chunks=stop_at_the_second,
        )


def test_occupied_cells_are_visible_and_above_the_threshold_or_the_mean_of_cascade_0():
    grid = OccupancyGrid(AABB, resolution=4, n_cascades=2, threshold=0.5)
    g = torch.Generator().manual_seed(3)
    grid.visible.copy_(torch.rand(grid.visible.shape, generator=g) > 0.3)
    # all below the threshold, unseen cells 0 (as update stores them); the outer cascade nearly empty
    grid.density.copy_(torch.rand(grid.density.shape, generator=g) * 0.2 * grid.visible)
    grid.density[1].mul_(0.01)
    grid.refresh_occupied()
    mean = grid.density[0].mean()  # instant-ngp: over every cell of cascade 0, the outer ones left out
    assert 0 < mean < 0.5 and mean > grid.density.mean()
    assert torch.equal(grid.occupied, grid.visible & (grid.density > mean))
    assert grid.occupied[0].any() and not grid.occupied[1].any()
    grid.density.mul_(10.0)  # now the threshold is below the mean
    grid.refresh_occupied()
    assert torch.equal(grid.occupied, grid.visible & (grid.density > 0.5))
    grid.visible.zero_()  # nothing visible: nothing occupied
    grid.refresh_occupied()
    assert not grid.occupied.any()


def test_grid_update_stores_the_finest_step_optical_thickness_in_every_cascade():
    """instant-ngp stores sigma * dt_min in each cascade; scaling by 2^k (the step rays take there) marked
    thin outer density occupied too readily (fox: a third of the grid)."""
    dist.init("cpu")
    grid = OccupancyGrid(torch.tensor([[-1.5] * 3, [2.5] * 3]), resolution=4, n_cascades=3, threshold=0.01)
    grid.update(lambda x: torch.full((x.shape[0],), 3.0), step_size=0.002, step=0, warmup_steps=10, seed=0)
    torch.testing.assert_close(grid.density, torch.full_like(grid.density, 3.0 * 0.002))


def test_cascades_cover_nested_boxes():
    grid = OccupancyGrid(torch.tensor([[-1.5, -1.5, -1.5], [2.5, 2.5, 2.5]]), resolution=4, n_cascades=3)
    pts = torch.tensor([[0.5, 0.5, 0.5], [0.95, 0.5, 0.5], [1.4, 0.5, 0.5], [2.4, 0.5, 0.5]])
    assert grid.cascade_of(pts).tolist() == [0, 0, 1, 2]
    idx, inside = grid.cell_index(pts)
    assert inside.all()
    back = grid.cell_positions(idx, torch.full((4, 3), 0.5))
    # the centre of the containing cell is within half a cell of the point
    cell = 1.0 * torch.tensor([1, 1, 2, 4])[:, None] / 4
    assert torch.all((back - pts).abs() <= cell / 2 + 1e-6)


def test_step_schedule_is_invertible_and_spaces_samples_like_instant_ngp():
    sch = StepSchedule(dt_min=0.01, dt_max=0.2, cone_angle=1 / 16)
    t = torch.linspace(0, 20, 2001, dtype=torch.float64)
    torch.testing.assert_close(sch.time(sch.coord(t)), t, rtol=1e-9, atol=1e-9)
    s = torch.arange(0, float(sch.coord(torch.tensor(20.0))), dtype=torch.float64)
    ts = sch.time(s)
    dt = ts[1:] - ts[:-1]
    assert torch.all(dt > 0)
    near, mid, far = ts[:-1] < 0.16, (ts[:-1] > 0.17) & (ts[:-1] < 3.1), ts[:-1] > 3.3
    torch.testing.assert_close(dt[near], torch.full_like(dt[near], 0.01))  # dt_min near the camera
    torch.testing.assert_close(dt[mid], ts[:-1][mid] / 16)  # cone_angle * t further out
    torch.testing.assert_close(dt[far], torch.full_like(dt[far], 0.2))  # capped at dt_max
    uni = StepSchedule.uniform(0.05)
    torch.testing.assert_close(uni.time(torch.tensor([3.0])), torch.tensor([0.15]))


def test_march_with_cascades_and_cone_stepping():
    dist.init("cpu")
    aabb = torch.tensor([[-1.5] * 3, [2.5] * 3])  # aabb_scale 4: 3 cascades
    grid = OccupancyGrid(aabb, resolution=16, n_cascades=3)
    sch = StepSchedule(dt_min=3**0.5 / 128, dt_max=3**0.5 / 128 * 4 * 8, cone_angle=1 / 64)
    o = torch.tensor([[-1.4, 0.5, 0.5]])
    d = torch.tensor([[1.0, 0.0, 0.0]])
    all_on = march(o, d, aabb, grid, sch, torch.zeros(1))
    # samples from the entry point to the far face, spaced by the schedule
    assert float(all_on.t[0]) == 0.0 and float(all_on.t[-1] + all_on.dt[-1]) >= 3.9 - 1e-6
    torch.testing.assert_close(all_on.t[1:], all_on.t[:-1] + all_on.dt[:-1])
    # free space outside the unit cube: only samples inside the occupied inner cascade remain
    grid.density.zero_()
    grid.density[0] = 1.0
    grid.refresh_occupied()
    inner = march(o, d, aabb, grid, sch, torch.zeros(1))
    x = o[0, 0] + inner.t
    assert len(inner) > 0 and torch.all((x >= -1e-6) & (x <= 1 + 1e-6))


def test_cells_drawn_among_the_occupied_are_occupied_and_cover_them_evenly():
    grid = OccupancyGrid(AABB, resolution=4, n_cascades=2)
    g = torch.Generator().manual_seed(5)
    grid.occupied.copy_(torch.rand(grid.occupied.shape, generator=g) > 0.8)
    drawn = grid.draw_occupied(torch.rand(20000, generator=g, dtype=torch.float64))
    flat = grid.occupied.view(-1)
    assert flat[drawn].all()
    counts = torch.bincount(drawn, minlength=flat.numel())[flat].float()
    assert counts.min() > 0 and (counts.max() - counts.min()) / counts.mean() < 0.6  # about 20000 / 26 each
    grid.occupied.zero_()
    assert (
        grid.draw_occupied(torch.rand(8, generator=g, dtype=torch.float64)).tolist() == [grid.n_cells - 1] * 8
    )  # nothing occupied: a harmless refresh


def test_inference_renders_run_the_fused_mlps_in_the_inference_math():
    """``render_in_chunks`` and ``render_outputs`` (every inference render: evaluation, the render tool, the
    viewer) run their fields inside ``inference_math(INFERENCE_MATH)``, or inside the math an outer
    ``inference_math`` chose (the render tool's ``--inference_math``); the code around them does not."""
    from hvd_ngp.model.mlp_triton import autocast_dot
    from hvd_ngp.render.outputs import render_outputs
    from hvd_ngp.render.volume import INFERENCE_MATH
    from hvd_ngp.triton_support import inference_math

    seen: list[str] = []
    rgb_sigma, sig = const_field(lambda x: torch.full((x.shape[0],), 2.0))

    def watched(fn):
        def call(x, *rest):
            seen.append(autocast_dot("cuda"))
            return fn(x, *rest)

        return call

    o, d = axis_rays(4)

    def render(o, d, j):
        out = render_rays(watched(rgb_sigma), watched(sig), o, d, AABB, None, StepSchedule.uniform(1 / 64), 0.0, j)
        return out.rgb, out.opacity, out.depth

    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = INFERENCE_MATH != "tf32"  # the flag says the other math
        render_in_chunks(render, o, d, torch.ones(3), 2)
        n = len(seen)
        render_outputs(
            watched(rgb_sigma), watched(sig), o, d, AABB, None, StepSchedule.uniform(1 / 64), 0.0, torch.ones(3), 2
        )
        assert n > 0 and len(seen) > n and set(seen) == {INFERENCE_MATH}
        assert autocast_dot("cuda") != INFERENCE_MATH  # outside the renders, torch's flag again
        seen.clear()
        other = "ieee" if INFERENCE_MATH != "ieee" else "tf32"
        with inference_math(other):  # an outer choice wins over the default
            render_in_chunks(render, o, d, torch.ones(3), 2)
        assert seen and set(seen) == {other}
        assert autocast_dot("cuda") != INFERENCE_MATH
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def test_fp16_inference_math_gathers_a_half_table_once_and_stays_near_fp32():
    """Inside ``inference_math("fp16")`` a Triton field's passes without gradients run half MLP products and
    gather from a half copy of the hash table, made once per parameter version: rgb and sigma stay within fp16
    rounding of the fp32 field's. Passes with gradients (training) keep gathering from the fp32 table."""
    from conftest import TINY_ARGS

    from hvd_ngp.config import CPU_CONFIG, parse_args
    from hvd_ngp.model.encoding import hashgrid_triton
    from hvd_ngp.model.field import NGPField
    from hvd_ngp.triton_support import inference_math

    model = parse_args(["--config", str(CPU_CONFIG), *TINY_ARGS], default_config=CPU_CONFIG).model
    torch.manual_seed(0)
    field = NGPField(model, torch.tensor([[0.0] * 3, [1.0] * 3]), "triton")
    enc = field.encoding
    with torch.no_grad():
        enc.params.normal_(0.0, 0.5)  # a trained table's spread, not the initial +-1e-4
    x, d = torch.rand(300, 3), torch.nn.functional.normalize(torch.randn(300, 3), dim=-1)
    with torch.no_grad():
        rgb32, sigma32 = field(x, d)
        with inference_math("fp16"):
            half = enc.inference_table()
            assert half.dtype == torch.float16 and enc.inference_table() is half  # one copy per version
            rgb16, sigma16 = field(x, d)
            # the half features the MLP reads are the fp32 interpolation of the half table, rounded once
            features = enc(x)
            assert features.dtype == torch.float16
            assert torch.equal(features, hashgrid_triton.encode(x, half, enc, None).half())
            # and the density MLP reads them as they are: the same network output as from fp32 features
            assert torch.equal(field.density_mlp(features), field.density_mlp(features.float()))
        enc.params.mul_(0.5)  # an optimizer step or a load: the copy is made again
        with inference_math("fp16"):
            again = enc.inference_table()
    assert rgb16.dtype == sigma16.dtype == torch.float32
    assert not torch.equal(rgb16, rgb32)  # the half math ran
    torch.testing.assert_close(rgb16, rgb32, atol=1e-2, rtol=0)
    torch.testing.assert_close(sigma16, sigma32, atol=1e-3, rtol=2e-2)
    assert again is not half and torch.equal(again, enc.params.detach().half())
    trained = enc(x)  # with gradients: the fp32 table, inside the context too
    with inference_math("fp16"):
        inside = enc(x)
    assert inside.requires_grad and torch.equal(inside, trained)
