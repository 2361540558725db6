"""The single-pass inference renderer (render/infer.py) against the reference renderer and the two-pass one.

Its Triton kernels run under Triton's CPU interpreter without a GPU (tiny ray counts)."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_kernels import DEV, ball_scene, random_rays

from hvd_ngp.render import StepSchedule, render_rays
from hvd_ngp.render.fast import RenderWorkspace, render_rays_fast, window_groups
from hvd_ngp.render.infer import InferenceStats, InferenceWindows, render_rays_single_pass
from hvd_ngp.render.plan import RenderPlan, split_by_capacity

pytestmark = pytest.mark.interpreter

TIGHT = {"rtol": 1e-4, "atol": 1e-5}


def small_ball(**kw):
    """``test_kernels.ball_scene`` with at most 64 steps per ray (48 cross the box): two march segments per ray
    instead of 128, which the interpreter walks program by program."""
    aabb, grid, _, ball, rgb_sigma = ball_scene(**kw)
    return aabb, grid, StepSchedule.uniform(3**0.5 / 48, max_steps=64), ball, rgb_sigma


def counting(fn, calls: list):
    """fn, recording the rows of each call: those it was told are in use (``n_rows``), else all of them."""

    def wrapped(x, *rest, **kw):
        calls.append(x.shape[0] if kw.get("n_rows") is None else int(kw["n_rows"]))
        return fn(x, *rest, **kw)

    return wrapped


def test_single_pass_renders_the_reference_image_with_one_network_pass():
    """The same rgb, opacity and depth as the reference (dense lanes, two passes) and the two-pass fast renderer,
    from one network pass per evaluated sample: no density-only calls, and fewer network rows than the two-pass
    path's density and colour passes together; rays turn opaque in later windows (transmittance carried)."""
    aabb, grid, sch, ball, rgb_sigma = small_ball(density=300.0)
    o, d, j = random_rays(20, torch.tensor([0.5] * 3), 2.0, 12)
    ref = render_rays(rgb_sigma, ball, o, d, aabb, grid, sch, 1e-3, j)
    density_calls, full_calls = [], []
    two = render_rays_fast(
        counting(rgb_sigma, full_calls), counting(ball, density_calls), o, d, aabb, grid, sch, 1e-3, jitter=j
    )
    two_pass_rows = sum(density_calls) + sum(full_calls)
    density_calls.clear(), full_calls.clear()
    stats = InferenceStats()
    out = render_rays_single_pass(
        counting(rgb_sigma, full_calls),
        counting(ball, density_calls),
        o,
        d,
        aabb,
        grid,
        sch,
        1e-3,
        jitter=j,
        windows=InferenceWindows(2, 8),
        stats=stats,
    )
    for name, a, b, c in zip(("rgb", "opacity", "depth"), out, (ref.rgb, ref.opacity, ref.depth), two):
        torch.testing.assert_close(a, b, **TIGHT, msg=f"{name} against the reference")
        torch.testing.assert_close(a, c, **TIGHT, msg=f"{name} against the two-pass renderer")
    rows = int(stats.network_rows)
    assert density_calls == [] and sum(full_calls) == rows
    assert int(stats.composited) == ref.n_samples  # the same samples, none twice
    assert ref.n_samples <= rows < two_pass_rows and rows < ref.n_candidates
    assert stats.iterations >= 3 and int((out[1] > 0.99).sum()) >= 8


def test_single_pass_updates_the_rays_in_one_kernel_as_the_torch_sequence_did(monkeypatch):
    """``infer.FUSED_UPDATE`` (``composite_into``) against the count, ``composite`` and torch updates it replaced:
    the same rgb, opacity, depth and composited samples, with rays stopping across windows."""
    import hvd_ngp.render.infer as infer

    aabb, grid, sch, ball, rgb_sigma = small_ball(density=300.0)
    o, d, j = random_rays(20, torch.tensor([0.5] * 3), 2.0, 12)
    outs = []
    for fused in (True, False):
        monkeypatch.setattr(infer, "FUSED_UPDATE", fused)
        stats = InferenceStats()
        out = render_rays_single_pass(
            rgb_sigma, ball, o, d, aabb, grid, sch, 1e-3, jitter=j, windows=InferenceWindows(2, 8), stats=stats
        )
        outs.append((out, int(stats.composited), stats.iterations))
    (fused_out, fused_n, fused_it), (torch_out, torch_n, torch_it) = outs
    for a, b in zip(fused_out, torch_out):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert fused_n == torch_n > 0 and fused_it == torch_it >= 3


def test_single_pass_counts_the_rows_on_the_device_as_the_host_count_did(monkeypatch):
    """``infer.DEVICE_ROW_COUNT`` (network calls over every slot of a window, told the rows in use by a device count)
    against the host's count (rows sized exactly): the same pixels and counts; the device count's calls are
    larger than the rows they compute, in a workspace that splits the rays into groups and the rows into calls."""
    import hvd_ngp.render.infer as infer

    aabb, grid, sch, ball, rgb_sigma = small_ball(density=300.0)
    o, d, j = random_rays(10, torch.tensor([0.5] * 3), 2.0, 12)
    results = []
    for on_device in (True, False):
        monkeypatch.setattr(infer, "DEVICE_ROW_COUNT", on_device)
        told, sizes, stats = [], [], InferenceStats()

        def field(x, dirs, n_rows=None):
            told.append(x.shape[0] if n_rows is None else int(n_rows))
            sizes.append(x.shape[0])
            return rgb_sigma(x, dirs)

        # 8 slots at once (the windows' most): groups of 4 rays at width 2, each group's rows in calls of 6 and 2
        space = RenderWorkspace(RenderPlan(20, 24, 6), DEV)
        out = render_rays_single_pass(
            field, ball, o, d, aabb, grid, sch, 1e-3, space, jitter=j, windows=InferenceWindows(2, 8), stats=stats
        )
        results.append((out, int(stats.network_rows), int(stats.composited), sum(told), sum(sizes), max(sizes)))
    (
        (dev_out, dev_rows, dev_n, dev_told, dev_sizes, dev_most),
        (host_out, host_rows, host_n, host_told, host_sizes, _),
    ) = results
    for a, b in zip(dev_out, host_out):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert dev_rows == host_rows == dev_told == host_told == host_sizes and dev_n == host_n > 0
    assert dev_sizes > dev_told  # the window's empty slots went to the network too, unused
    assert dev_most == 6  # calls of at most plan.rows


def test_single_pass_without_early_termination_composites_every_candidate():
    aabb, grid, sch, ball, rgb_sigma = small_ball(density=300.0)
    o, d, j = random_rays(8, torch.tensor([0.5] * 3), 2.0, 13)
    ref = render_rays(rgb_sigma, ball, o, d, aabb, grid, sch, 0.0, j)
    stats = InferenceStats()
    out = render_rays_single_pass(rgb_sigma, ball, o, d, aabb, grid, sch, 0.0, jitter=j, stats=stats)
    torch.testing.assert_close(out[0], ref.rgb, **TIGHT)
    torch.testing.assert_close(out[2], ref.depth, **TIGHT)
    assert int(stats.composited) == int(stats.network_rows) == ref.n_candidates


def test_single_pass_in_a_small_workspace_equals_the_exact_render(monkeypatch):
    """A workspace smaller than a window's candidates (several groups of rays per window, each within the
    workspace's slots; the network 7 rows at a time): the pixels of one exactly sized render, both times in the
    same workspace."""
    import hvd_ngp.render.infer as infer_mod

    aabb, grid, sch, ball, rgb_sigma = small_ball(occupied=False)
    o, d, _ = random_rays(24, torch.tensor([0.5] * 3), 2.0, 11)
    exact = render_rays_single_pass(rgb_sigma, ball, o, d, aabb, grid, sch, 1e-3)
    ref = render_rays(rgb_sigma, ball, o, d, aabb, grid, sch, 1e-3)
    torch.testing.assert_close(exact[0], ref.rgb, **TIGHT)
    groups: list[tuple[int, int]] = []
    march = infer_mod.march_window

    def recorded(o, d, aabb, grid, schedule, jitter, resume, width, *rest):
        groups.append((width, o.shape[0]))
        return march(o, d, aabb, grid, schedule, jitter, resume, width, *rest)

    monkeypatch.setattr(infer_mod, "march_window", recorded)
    # 48 slots: a window wider than that writes new buffers instead of the workspace's
    small = RenderWorkspace(RenderPlan(rays=24, candidates=48, rows=7), DEV)
    for windows in (InferenceWindows(4, 64), InferenceWindows(30, 64)):  # the same workspace twice
        groups.clear()
        out = render_rays_single_pass(rgb_sigma, ball, o, d, aabb, grid, sch, 1e-3, small, windows=windows)
        for a, b in zip(out, exact):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert all(w * n <= 48 or n == 1 for w, n in groups) and groups[0] == (windows.first, 48 // windows.first)
        covered = list(itertools.accumulate(n for _, n in groups))
        assert 24 in covered and all(w == windows.first for w, _ in groups[: covered.index(24) + 1])  # every ray first


def test_window_groups_cover_every_ray_within_the_capacity():
    """Device-side groups: consecutive, covering all rays once, each within the capacity, with their true counts;
    and windows as wide as the workspace fall back to the host's greedy split."""
    g = torch.Generator().manual_seed(0)
    for width, capacity in ((8, 40), (8, 1000), (30, 40)):
        take = torch.randint(0, width + 1, (200,), generator=g)
        ends = torch.cumsum(take, 0)
        groups = window_groups(ends, capacity, width)
        assert groups[0][0] == 0 and groups[-1][1] == 200
        assert all(g1[1] == g2[0] for g1, g2 in itertools.pairwise(groups))
        for a, b, n in groups:
            assert b > a and n == int(take[a:b].sum()) <= capacity
        if width * 2 > capacity:
            assert [(a, b) for a, b, _ in groups] == split_by_capacity(ends.tolist(), capacity)


def test_inference_windows_parse_and_grow():
    w = InferenceWindows.parse("4:64")
    assert (w.first, w.most) == (4, 64)
    assert w.next_width(1000, 1000) == 4 and w.next_width(1000, 100) == 40 and w.next_width(1000, 3) == 64
    for bad in ("4", "a:b", "8:4", "0:4"):
        with pytest.raises(ValueError, match="inference windows"):
            InferenceWindows.parse(bad)


def test_bench_inference_rows_compare_both_paths_on_a_trained_field(scene_cache, tmp_path):
    """``bench throughput``'s inference rows on the tiny trainer's field (torch hash grid; the fast renderer's
    kernels under the interpreter): both paths render the same pixels, each row has its timing and counts, and
    the single pass's stages are the ones its docstring names."""
    from conftest import _tiny_block, tiny_cpu_args

    from hvd_ngp.bench.inference import bench_inference
    from hvd_ngp.bench.throughput import inference_tables
    from hvd_ngp.config import parse_args
    from hvd_ngp.training.trainer import Trainer

    marching = _tiny_block("--marching", max_steps=64, eval_steps_per_diagonal=32)  # 2 march segments per ray
    args = tiny_cpu_args(scene_cache, tmp_path, "--n_steps", "1", "--marching", marching, "--device", DEV.type)
    tr = Trainer.build(parse_args(args))  # on a GPU machine the kernels compile for it (no interpreter there)
    tr.grid.occupied.fill_(True)  # one step in, the grid may be empty: every ray marches the whole box
    out = bench_inference(tr, 5, 1, [InferenceWindows(2, 8), InferenceWindows(8, 32)])
    assert out["size"] == [5, 5] and out["rays"] == 25  # one march block of 32 rays
    assert [r["path"] for r in out["rows"]] == ["two_pass", "single_pass 2:8", "single_pass 8:32"]
    for row in out["rows"]:
        assert row["ms/view"] > 0 and row["M rays/s"] > 0 and row["network rows/ray"] > 0
        assert row["max abs diff vs two_pass"] < 1e-4 and "PSNR" not in row  # not the test image's own size
    assert out["rows"][1]["iterations"] >= out["rows"][2]["iterations"] >= 1
    assert set(out["stages_ms"]) <= {"march", "network", "composite", "compaction", "host waits"}
    assert {"march", "network", "composite"} <= set(out["stages_ms"])
    text = "\n".join(inference_tables([{"backend": "triton", "inference": out}]))
    assert "Inference: one 5x5 view" in text and "| single_pass 8:32" in text and "Single-pass stages" in text


def test_progress_bar_shows_at_once_on_a_terminal_and_after_5_s_in_a_log(monkeypatch, capsys):
    """The bar of long renders: no delay when stderr is a terminal, ``LOG_DELAY_S`` when it is a file; none on
    ranks that do not show it. A terminal's bar draws the view count."""
    import io
    import sys

    from hvd_ngp.observe import progress as prog

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert prog.progress_delay() == 0.0
    assert list(prog.progress(range(3), "test views", "view")) == [0, 1, 2]
    assert "test views:" in term.getvalue() and "0/3" in term.getvalue()
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    assert prog.progress_delay() == prog.LOG_DELAY_S == 5.0
    assert list(prog.progress(range(3), "test views", "view")) == [0, 1, 2] and log.getvalue() == ""
    hidden = range(4)
    assert prog.progress(hidden, "test views", "view", show=False) is hidden


def test_render_image_takes_either_inference_path_and_names_an_unknown_one():
    """``render_image(fast=True)``, what evaluation and the render tool call: ``single_pass`` (the
    default), ``two_pass`` and ``density_first`` give the same image and depth over a background; another name
    is a one-line ValueError."""
    from hvd_ngp.render import render_image

    aabb, grid, sch, ball, rgb_sigma = small_ball(density=300.0)
    o, d, _ = random_rays(12, torch.tensor([0.5] * 3), 2.0, 14)
    bg = torch.tensor([0.2, 0.4, 0.6], device=DEV)
    single = render_image(
        rgb_sigma, ball, o, d, aabb, grid, sch, bg, 1e-3, fast=True, step_offset=0.25, inference="single_pass"
    )
    two = render_image(
        rgb_sigma, ball, o, d, aabb, grid, sch, bg, 1e-3, fast=True, step_offset=0.25, inference="two_pass"
    )
    first = render_image(
        BallField(ball), ball, o, d, aabb, grid, sch, bg, 1e-3, fast=True, step_offset=0.25, inference="density_first"
    )
    ref = render_image(rgb_sigma, ball, o, d, aabb, grid, sch, bg, 1e-3, step_offset=0.25)
    for a, b, c, e in zip(single, two, ref, first):
        torch.testing.assert_close(a, b, **TIGHT)
        torch.testing.assert_close(a, c, **TIGHT)
        torch.testing.assert_close(a, e, **TIGHT)
    known = "known: single_pass, two_pass, density_first"
    with pytest.raises(ValueError, match=f"unknown inference path 'fastest' \\({known}\\)"):
        render_image(rgb_sigma, ball, o, d, aabb, grid, sch, bg, 1e-3, fast=True, inference="fastest")


class BallField:
    """``small_ball``'s field as a ``SplitField`` (geo: the point itself), counting the rows of each network."""

    def __init__(self, ball):
        self.ball, self.density_rows, self.colour_rows = ball, [], []

    def query_density(self, x, n_rows=None):
        self.density_rows.append(x.shape[0])
        return self.ball(x), x.clone()

    def colour(self, x, d, geo):
        self.colour_rows.append(x.shape[0])
        return torch.stack([geo[:, 0], geo[:, 1], d[:, 2].abs()], dim=-1)

    def __call__(self, x, d, n_rows=None):  # what single_pass calls: the same colours
        return torch.stack([x[:, 0], x[:, 1], d[:, 2].abs()], dim=-1), self.ball(x)


def test_density_first_renders_the_single_pass_image_colouring_only_composited_samples():
    """The density_first path: the same rgb, opacity and depth as single_pass, the density network on every
    evaluated sample and the colour network on exactly the composited ones (in a small workspace too, rows split
    across calls); a field without query_density and colour is refused by name."""
    from hvd_ngp.render.infer import render_rays_density_first
    from hvd_ngp.render.volume import inference_path

    aabb, grid, sch, ball, rgb_sigma = small_ball(density=300.0)
    o, d, j = random_rays(20, torch.tensor([0.5] * 3), 2.0, 12)
    windows = InferenceWindows(2, 8)
    single = render_rays_single_pass(rgb_sigma, ball, o, d, aabb, grid, sch, 1e-3, jitter=j, windows=windows)
    field = BallField(ball)
    stats = InferenceStats()
    out = inference_path("density_first")(
        field, ball, o, d, aabb, grid, sch, 1e-3, jitter=j, windows=windows, stats=stats
    )
    for name, a, b in zip(("rgb", "opacity", "depth"), out, single):
        torch.testing.assert_close(a, b, **TIGHT, msg=f"{name} against single_pass")
    assert sum(field.density_rows) == int(stats.network_rows)
    assert sum(field.colour_rows) == stats.colour_rows == int(stats.composited) < int(stats.network_rows)
    small = RenderWorkspace(RenderPlan(rays=20, candidates=40, rows=7), DEV)
    field.colour_rows.clear()
    again = render_rays_density_first(field, ball, o, d, aabb, grid, sch, 1e-3, small, jitter=j, windows=windows)
    for a, b in zip(again, single):
        torch.testing.assert_close(a, b, **TIGHT)
    assert max(field.colour_rows) <= 7
    with pytest.raises(ValueError, match="density_first inference path needs a field with query_density and colour"):
        render_rays_density_first(rgb_sigma, ball, o, d, aabb, grid, sch, 1e-3, jitter=j)


def test_a_window_resumes_where_the_last_one_stopped():
    """``march_write``'s ``resume``: each window of a ray's candidates starts at the lattice step where the ray's
    last window stopped, and writes exactly what a window that walks its skipped steps again writes (cascades, a
    cone, a 30%-occupied grid with empty cells to jump, several segments per ray, windows across segments)."""
    from test_kernels import random_grid

    from hvd_ngp.render.fast import candidate_windows
    from hvd_ngp.render.march_triton import march_counts, march_write, window_start
    from hvd_ngp.render.schedule import MarchLaunch

    aabb = torch.tensor([[-1.5] * 3, [2.5] * 3], device=DEV)
    grid = random_grid(aabb, 8, 3, 3)
    dt_min = 3**0.5 / 64
    sch = StepSchedule(dt_min, dt_min * 32, 1 / 64, max_steps=96)
    o, d, j = random_rays(10, torch.tensor([0.5] * 3), 3.0, 4)
    launch = MarchLaunch(32, 16, 1)  # six segments of 16 steps
    seg_count = march_counts(o, d, aabb, grid, sch, j, launch)
    total = seg_count.sum(1)
    resume = window_start(10, sch, launch, DEV)
    assert resume.tolist()[0] == [0, 16, 32, 48, 64, 80]
    done, windows = torch.zeros(10, dtype=torch.int32, device=DEV), 0
    while bool((done < total).any()):
        skip, take = candidate_windows(seg_count, done, done + 8)
        n = int(take.sum())
        walked = march_write(o, d, aabb, grid, sch, j, take, n, launch=launch, skip=skip)
        resumed = march_write(o, d, aabb, grid, sch, j, take, n, launch=launch, skip=skip, resume=resume)
        for name in ("t", "dt", "ray", "start", "count"):
            assert torch.equal(getattr(resumed, name)[:n], getattr(walked, name)[:n]), (windows, name)
        done, windows = done + 8, windows + 1
    assert windows >= 3 and int(total.max()) > 16  # several windows; rays with candidates in several segments
    assert bool((resume >= window_start(10, sch, launch, DEV)).all())


def test_count_free_windows_write_the_packed_march_ray_by_ray():
    """``march_window`` (no count pass): a ray's windows, one after the other, hold exactly ``march_packed``'s
    samples of that ray (t, dt and positions), with windows of changing width; a window that comes back short
    means the ray has no candidates left, and the next one is empty (cascades, a cone, a sparse grid)."""
    from test_kernels import random_grid

    from hvd_ngp.render.march_triton import march_packed, march_window

    aabb = torch.tensor([[-1.5] * 3, [2.5] * 3], device=DEV)
    grid = random_grid(aabb, 8, 3, 3)
    dt_min = 3**0.5 / 64
    sch = StepSchedule(dt_min, dt_min * 32, 1 / 64, max_steps=96)
    o, d, j = random_rays(10, torch.tensor([0.5] * 3), 3.0, 4)
    ref = march_packed(o, d, aabb, grid, sch, j, None, positions=True)
    resume = torch.zeros(10, dtype=torch.int32, device=DEV)
    got: list[list[torch.Tensor]] = [[] for _ in range(10)]
    ended = torch.zeros(10, dtype=torch.bool, device=DEV)
    for width in itertools.chain((2, 5), itertools.repeat(16)):
        w = march_window(o, d, aabb, grid, sch, j, resume, width)
        assert not bool(w.count[ended].any())  # an ended ray stays ended
        for i, c in enumerate(w.count.tolist()):
            s = slice(i * width, i * width + c)
            got[i].append(torch.cat([w.t[s, None], w.dt[s, None], w.x[s]], 1))
        ended |= w.count < width
        if bool(ended.all()):
            break
    assert int(ref.count.max()) > 16  # some ray needed several windows
    for i in range(10):
        a, c = int(ref.start[i]), int(ref.count[i])
        want = torch.cat([ref.t[a : a + c, None], ref.dt[a : a + c, None], ref.x[a : a + c]], 1)
        assert torch.equal(torch.cat(got[i]), want), i


def compiled_variants(kernel) -> int:
    """Variants of a Triton kernel compiled in this process, over devices (the first of each device's caches)."""
    return sum(len(caches[0]) for caches in kernel.device_caches.values())


def test_a_render_compiles_each_kernel_once_whatever_its_group_sizes():
    """On a GPU, Triton compiles a kernel again for each new value of a constexpr and for each new class of a
    specialised int (1, a multiple of 16, other): the kernels of an inference render take their sizes
    unspecialised, so renders of other ray counts (other group sizes, window widths and rows) compile nothing
    new. Before, ``compact_gather``'s search depth was a constexpr and the sizes were specialised: an H100
    rendered lego at 0.92 s per view in a fresh process (0.022 once every variant had compiled)."""
    if DEV.type != "cuda":
        pytest.skip("counts the variants compiled for a GPU (the interpreter compiles none)")
    from conftest import TINY_ARGS

    from hvd_ngp.config import CPU_CONFIG, parse_args
    from hvd_ngp.model.encoding import hashgrid_triton
    from hvd_ngp.model.field import NGPField
    from hvd_ngp.model.mlp_triton import _mlp_fwd
    from hvd_ngp.render import compact_triton, composite_triton, march_triton
    from hvd_ngp.triton_support import inference_math

    kernels = {
        "march": march_triton._march,
        "compact_gather": compact_triton._compact_gather,
        "composite_into": composite_triton._composite_into,
        "hashgrid_fwd": hashgrid_triton._hashgrid_fwd,
        "mlp_fwd": _mlp_fwd,
    }
    model = parse_args(["--config", str(CPU_CONFIG), *TINY_ARGS], default_config=CPU_CONFIG).model
    aabb, grid, sch, _, _ = small_ball(density=300.0)
    field = NGPField(model, aabb.cpu(), "triton").to(DEV)
    with torch.no_grad():
        field.encoding.params.normal_(0.0, 0.5)

    def render(n: int, seed: int) -> None:
        o, d, j = random_rays(n, torch.tensor([0.5] * 3), 2.0, seed)
        with torch.no_grad(), inference_math("fp16"):
            render_rays_single_pass(field, None, o, d, aabb, grid, sch, 1e-3, jitter=j, windows=InferenceWindows(2, 8))

    render(1000, 0)
    first = {name: compiled_variants(k) for name, k in kernels.items()}
    assert all(first.values()), first  # each ran
    for n, seed in ((1001, 1), (999, 2), (1024, 3), (17, 4), (1, 5), (3000, 6)):
        render(n, seed)
    assert {name: compiled_variants(k) for name, k in kernels.items()} == first
