"""Model parallelism (``--model_parallel K``): space split, segment render and merge, exchange, layout, checkpoints.

In-process tests check the decomposition itself (segments merged == the whole render, region fields
== the piecewise field); the ``parallel`` tests launch real ranks (tests/parallel/check_model_parallel.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, TINY_ARGS, run_ranks, tiny_cpu_args

from hvd_ngp.config import CPU_CONFIG, parse_args, validate
from hvd_ngp.data import load_scene
from hvd_ngp.data.sampler import RaySampler
from hvd_ngp.errors import ConfigError
from hvd_ngp.model.field import NGPField
from hvd_ngp.observe.memory import EVAL_RESERVE, MemoryBudget, MemoryBudgetError, check_fit
from hvd_ngp.render import render_rays
from hvd_ngp.render.regions import Partition, PiecewiseField, merge, render_segment, split_space
from hvd_ngp.training.model_parallel import region_model
from hvd_ngp.training.recipe import Marching, make_grid, model_footprint


def tiny(scene_cache, *more):
    return parse_args(
        ["--config", str(CPU_CONFIG), *TINY_ARGS, "--scene_cache", str(scene_cache), "--device", "cpu", *more]
    )


@pytest.fixture(scope="module")
def setting(scene_cache):
    args = tiny(scene_cache)
    scene = load_scene("builtin", scene_cache=str(scene_cache))
    march = Marching.from_config(args.model["marching"], scene.aabb_scale)
    rays = RaySampler(scene.train, 0, 1, 5, torch.device("cpu")).sample(384)
    jitter = torch.rand(384, generator=torch.Generator().manual_seed(1))
    return args, scene, march, rays, jitter


def field_of(args, scene, seed, aabb=None, model=None):
    torch.manual_seed(seed)
    f = NGPField(model or args.model, scene.aabb if aabb is None else aabb, "torch")
    with torch.no_grad():
        for p in f.parameters():
            p.mul_(4.0)  # dense enough that every region carries weight
    return f


def close(a, b, what):
    torch.testing.assert_close(
        a, b, rtol=1e-5, atol=1e-5 * float(b.detach().abs().max().clamp(min=1e-12)), msg=lambda m: f"{what}: {m}"
    )


@pytest.mark.parametrize("k", [2, 3, 4])
def test_segments_merge_to_the_whole_render(setting, k):
    """Colour, opacity, depth and every gradient of the merged segments equal the whole-ray render."""
    args, scene, march, rays, jitter = setting
    field = field_of(args, scene, 0)
    grid = make_grid(args.model["marching"], scene)
    weight = torch.rand(16, 16, 16, generator=torch.Generator().manual_seed(2))
    part = split_space(scene.aabb, k, weight, 16)
    sigma_fn = lambda x: field.query_density(x)[0]  # noqa: E731
    segs = [
        render_segment(field, sigma_fn, rays.origins, rays.directions, part, r, grid, march.schedule, 0.0, jitter)
        for r in range(k)
    ]
    rgb, opacity, depth = merge(torch.stack([s.values for s in segs]), part.entry_order(rays.origins, rays.directions))
    field.zero_grad()
    ((rgb - 0.3) ** 2).mean().backward(retain_graph=True)
    mine = [p.grad.clone() for p in field.parameters()]
    ref = render_rays(field, sigma_fn, rays.origins, rays.directions, field.aabb, grid, march.schedule, 0.0, jitter)
    field.zero_grad()
    ((ref.rgb - 0.3) ** 2).mean().backward()
    assert sum(s.n_samples for s in segs) == ref.n_samples and min(s.n_samples for s in segs) > 0
    close(rgb, ref.rgb, "colour")
    close(opacity, ref.opacity, "opacity")
    close(depth, ref.depth, "depth")
    for (name, p), g in zip(field.named_parameters(), mine):
        close(g, p.grad, f"gradient of {name}")


def test_region_fields_render_as_the_piecewise_field(setting):
    """Distinct region fields: the merged segments equal one render of the piecewise field (the render tool's)."""
    args, scene, march, rays, jitter = setting
    part = split_space(scene.aabb, 2, torch.ones(16, 16, 16), 16)
    model = region_model(args.model, 2)
    fields = [field_of(args, scene, 10 + r, part.boxes[r], model) for r in range(2)]
    grid = make_grid(args.model["marching"], scene)
    segs = torch.stack(
        [
            render_segment(
                f,
                lambda x, f=f: f.query_density(x)[0],
                rays.origins,
                rays.directions,
                part,
                r,
                grid,
                march.schedule,
                0.0,
                jitter,
            ).values
            for r, f in enumerate(fields)
        ]
    )
    rgb, opacity, depth = merge(segs, part.entry_order(rays.origins, rays.directions))
    whole = PiecewiseField(fields, part)
    ref = render_rays(
        whole,
        lambda x: whole.query_density(x)[0],
        rays.origins,
        rays.directions,
        whole.aabb,
        grid,
        march.schedule,
        0.0,
        jitter,
    )
    close(rgb, ref.rgb, "colour")
    close(opacity, ref.opacity, "opacity")
    close(depth, ref.depth, "depth")
    # the density_first inference path's two calls: each point's owner's colour from its own features
    x = rays.origins + 0.3 * rays.directions
    sigma, geo = whole.query_density(x)
    both = whole(x, rays.directions)
    close(whole.colour(x, rays.directions, geo), both[0], "colour after density")
    close(sigma, both[1], "density")


def test_split_follows_the_work_and_tiles_the_box():
    aabb = torch.tensor([[0.0, 0.0, 0.0], [2.0, 1.0, 1.0]])
    work = torch.zeros(8, 8, 8)
    work[6:, :, :] = 1.0  # all the work at the far end of x, the longest side
    part = split_space(aabb, 2, work, 8)
    assert part.boxes[0, 1, 0] == pytest.approx(2.0 * 7 / 8)  # the cut moves into the busy part
    assert torch.equal(part.boxes[0, 0], aabb[0]) and torch.equal(part.boxes[-1, 1], aabb[1])
    x = torch.rand(4096, 3) * (aabb[1] - aabb[0]) + aabb[0]
    owner = part.owner(x)
    inside = [((x >= b[0]) & (x <= b[1])).all(1) for b in part.boxes]
    assert all(bool(inside[k][owner == k].all()) for k in range(2))
    assert Partition.from_json(part.to_json()).boxes.tolist() == part.boxes.tolist()
    with pytest.raises(ConfigError, match="more than the occupancy grid allows"):
        split_space(aabb, 5, torch.ones(2, 2, 2), 2)


def test_region_model_splits_the_hash_table(scene_cache):
    args = tiny(scene_cache)
    assert region_model(args.model, 1) is args.model
    assert region_model(args.model, 2)["encoding"]["log2_hashmap_size"] == 11
    assert region_model(args.model, 3)["encoding"]["log2_hashmap_size"] == 10  # rounded up to a power of 2
    assert args.model["encoding"]["log2_hashmap_size"] == 12  # the config itself is unchanged
    with pytest.raises(ConfigError, match="more regions than encoding.log2_hashmap_size"):
        region_model(args.model, 1 << 12)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model_parallel", "2", "--compression", "fp16"], "--compression fp16"),
        (["--model_parallel", "2", "--reduce_op", "adasum"], "--reduce_op adasum"),
        (["--model_parallel", "0"], "--model_parallel must be >= 1"),
        (["--model_parallel", "2", "--distributed", '{"model_parallel": 4}'], "remove one"),
        (["--distributed", '{"model_parallel": "two"}'], "distributed.model_parallel must be a positive integer"),
    ],
)
def test_bad_combinations_are_errors_at_parse(scene_cache, flags, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        tiny(scene_cache, *flags)


def test_config_block_sets_the_regions(scene_cache):
    assert validate(tiny(scene_cache, "--distributed", '{"model_parallel": 2}')).runtime.comm.model_parallel == 2
    assert validate(tiny(scene_cache)).runtime.comm.model_parallel == 1
    comm = validate(tiny(scene_cache, "--model_parallel", "2")).runtime.comm
    assert comm.model_parallel == 2 and comm.lr_multiplier(4, 4, False) == pytest.approx(2**0.5)


def test_regions_fit_a_budget_one_rank_does_not(scene_cache):
    big = '{"n_levels": 16, "log2_hashmap_size": 21, "base_resolution": 16, "desired_resolution": 2048}'
    args = tiny(scene_cache, "--encoding", big)
    scene = load_scene("builtin", scene_cache=str(scene_cache))
    budget = MemoryBudget(int(0.9 * (1 << 30)), "--gpu_memory_gb 0.9", torch.device("cpu"))
    with pytest.raises(MemoryBudgetError, match="--model_parallel"):
        check_fit(budget, model_footprint(args.model, args.target_samples, scene), EVAL_RESERVE)
    check_fit(budget, model_footprint(region_model(args.model, 2), args.target_samples, scene), EVAL_RESERVE)


# ------------------------------------------------------------------------------------------ real ranks


def checks(proc, *names):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for name in names:
        assert f"CHECK {name} OK" in out, out[-4000:]
    return out


@pytest.mark.parallel
# each size under one controller (both controllers run: 2 ranks under Gloo, 4 under MPI; CI time)
@pytest.mark.parametrize("np_, controller", [(2, "gloo"), (4, "mpi")])
def test_exchange_render_equals_single_rank(np_, controller, scene_cache, tmp_path):
    proc = run_ranks(
        ["tests/parallel/check_model_parallel.py", "exact", str(scene_cache), str(tmp_path), str(np_)],
        np=np_,
        controller=controller,
    )
    checks(proc, "exact_render", "horovod_allgather_backward")


@pytest.mark.parallel
def test_hybrid_replicas_agree(scene_cache, tmp_path):
    proc = run_ranks(
        ["tests/parallel/check_model_parallel.py", "train", str(scene_cache), str(tmp_path), "2"],
        np=4,
        controller="mpi",
    )
    out = checks(proc, "replicas_agree", "identical_grids")
    assert "model parallel: 2 replica(s) x 2 regions" in out and "exchange" in out


@pytest.mark.parallel
def test_checkpoint_resume_and_render_tool(scene_cache, tmp_path):
    proc = run_ranks(
        ["tests/parallel/check_model_parallel.py", "resume", str(scene_cache), str(tmp_path), "2"],
        np=2,
        controller="gloo",
    )
    checks(proc, "exact_resume")
    ckpt = tmp_path / "a" / "checkpoints" / "ckpt-00000024.pt"
    assert (ckpt.parent / "ckpt-00000024.region1.pt").is_file()
    trained = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert trained["model_parallel"]["hash_params_per_rank"][0] == trained["model_parallel"]["hash_params_per_rank"][1]
    tool = subprocess.run(
        [
            sys.executable,
            "-m",
            "hvd_ngp.render",
            "--load_snapshot",
            str(ckpt),
            "--out_dir",
            str(tmp_path / "render"),
            "--video",
            "none",
            "--split_views",
            "2",
            "--device",
            "cpu",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tool.returncode == 0, (tool.stdout + tool.stderr)[-3000:]
    rendered = json.loads((tmp_path / "render" / "render.json").read_text())
    # the tool renders with all regions in one process (the piecewise field), the trainer through the
    # exchange: the same images up to early termination inside segments
    assert rendered["test_psnr"] == pytest.approx(trained["test_psnr"], abs=0.05)
    # a damaged region file is refused, naming it
    region = ckpt.parent / "ckpt-00000024.region1.pt"
    data = bytearray(region.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 8] = b"damaged!"  # inside the hash table's storage
    region.write_bytes(bytes(data))
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "hvd_ngp.render",
            "--load_snapshot",
            str(ckpt),
            "--out_dir",
            str(tmp_path / "render2"),
            "--video",
            "none",
            "--device",
            "cpu",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0 and "ckpt-00000024.region1.pt" in bad.stderr, bad.stderr[-2000:]


@pytest.mark.parallel
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model_parallel", "3"], "--model_parallel 3 must divide the number of ranks, but the job runs 2"),
        (["--model_parallel", "2", "--marching", '{"grid_resolution": 1}'], "more than the occupancy grid allows"),
    ],
)
def test_bad_layouts_fail_on_every_rank(flags, message, scene_cache, tmp_path):
    proc = run_ranks(
        ["-m", "hvd_ngp.train", *tiny_cpu_args(scene_cache, tmp_path / "out", "--n_steps", "4", *flags)],
        np=2,
        controller="gloo",
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert out.count(message) >= 2, out[-3000:]  # each rank says why
