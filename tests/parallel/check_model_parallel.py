"""Run under ``horovodrun -np N``: cross-rank facts of model parallelism (``--model_parallel K``).

    python tests/parallel/check_model_parallel.py MODE SCENE_CACHE OUT_DIR K

MODE exact:  one field on every rank, split into K regions and rendered through the segment exchange,
             equals the single-rank render of the same field: colour, depth, opacity and every
             parameter gradient (summed over the replica's regions), relative 1e-5; and Horovod's own
             allgather backward gives the same gradients as ``dist.replica_allgather``.
MODE train:  a short training run: each region's parameters bit-identical across its replicas,
             different between regions, the occupancy grid identical on every rank.
MODE resume: 24 steps straight == 12 steps, checkpoint, resume, 12 more (bit-identical parameters).
Prints ``CHECK <name> OK`` lines on rank 0; any failure raises (non-zero exit).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import TINY_ARGS, tensor_digest as digest  # noqa: E402

from hvd_ngp.cluster import dist  # noqa: E402
from hvd_ngp.config import CPU_CONFIG, parse_args  # noqa: E402
from hvd_ngp.data import load_scene  # noqa: E402
from hvd_ngp.data.sampler import RaySampler  # noqa: E402
from hvd_ngp.model.field import NGPField  # noqa: E402
from hvd_ngp.render import render_rays  # noqa: E402
from hvd_ngp.render.regions import merge, render_segment  # noqa: E402
from hvd_ngp.training.model_parallel import ModelParallel, plan_partition  # noqa: E402
from hvd_ngp.training.recipe import Marching, make_grid, make_loss  # noqa: E402
from hvd_ngp.training.step import masked_mean  # noqa: E402
from hvd_ngp.training.trainer import run  # noqa: E402


def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Relative 1e-5 (of the reference's largest magnitude for values near zero)."""
    torch.testing.assert_close(
        a, b, rtol=1e-5, atol=1e-5 * float(b.detach().abs().max().clamp(min=1e-12)), msg=lambda m: f"{what}: {m}"
    )  # noqa: B023


def check_exact(args, scene, k: int) -> None:
    rt = dist.runtime()
    march = Marching.from_config(args.model["marching"], scene.aabb_scale)
    loss_fn = make_loss(args.model["loss"], "test")
    torch.manual_seed(0)
    field = NGPField(args.model, scene.aabb, "torch")
    with torch.no_grad():  # a denser field than the initial one: most rays cross several regions with weight
        for p in field.parameters():
            p.mul_(4.0)
    mp = ModelParallel(dist.groups(), plan_partition(scene.train, scene.aabb, k, 16, march.schedule.near))
    grid = make_grid(args.model["marching"], scene)  # every cell occupied: samples all along the rays
    rays = RaySampler(scene.train, 0, 1, 7, torch.device("cpu")).sample(512)  # the same rays on every rank
    jitter = torch.rand(512, generator=torch.Generator().manual_seed(3))
    background = torch.rand(512, 3, generator=torch.Generator().manual_seed(4))
    target = rays.rgba[:, :3] * rays.rgba[:, 3:] + background * (1 - rays.rgba[:, 3:])
    sigma_fn = lambda x: field.query_density(x)[0]  # noqa: E731

    def loss_of(rgb, opacity, depth):
        pred = rgb + background * (1.0 - opacity[:, None])
        return masked_mean(loss_fn(pred, target), None) + 1e-3 * depth.mean()  # depth in the loss: its gradient too

    out = mp(field, sigma_fn, rays.origins, rays.directions, field.aabb, grid, march.schedule, 0.0, jitter)
    field.zero_grad()
    loss_of(out.rgb, out.opacity, out.depth).backward()
    grads = [
        dist.group_allreduce(p.grad, "replica", "sum", name=f"check.grad.{i}") for i, p in enumerate(field.parameters())
    ]
    ref = render_rays(field, sigma_fn, rays.origins, rays.directions, field.aabb, grid, march.schedule, 0.0, jitter)
    field.zero_grad()
    loss_of(ref.rgb, ref.opacity, ref.depth).backward()
    close(out.rgb, ref.rgb, "colour")
    close(out.opacity, ref.opacity, "opacity")
    close(out.depth, ref.depth, "depth")
    for (name, p), g in zip(field.named_parameters(), grads):
        close(g, p.grad, f"gradient of {name}")
    samples = dist.allgather_object(out.n_samples, name="check.samples")
    assert sum(samples) == ref.n_samples, f"segments hold {samples} samples, the whole rays {ref.n_samples}"
    assert all(s > 0 for s in samples), f"a region rendered no samples: {samples}"
    if rt.is_root:
        print(f"CHECK exact_render OK (K={k}, 512 rays, samples per region {samples} = {ref.n_samples})", flush=True)

    # Horovod's own allgather autograd (backward: allreduce-average over the set, then the local slice)
    import horovod.torch as hvd

    groups = dist.groups()
    seg = render_segment(
        field, sigma_fn, rays.origins, rays.directions, mp.partition, groups.region, grid, march.schedule, 0.0, jitter
    )
    parts = hvd.allgather(seg.values, process_set=groups.replica_set).view(k, 512, -1)
    rgb, opacity, depth = merge(parts, mp.partition.entry_order(rays.origins, rays.directions))
    field.zero_grad()
    loss_of(rgb, opacity, depth).backward()
    theirs = [
        dist.group_allreduce(p.grad, "replica", "sum", name=f"check.hgrad.{i}")
        for i, p in enumerate(field.parameters())
    ]
    for g, h in zip(grads, theirs):
        close(h, g, "gradient through hvd.allgather")
    if rt.is_root:
        print(
            "CHECK horovod_allgather_backward OK (averages over the set: equal when every rank takes the same loss)",
            flush=True,
        )


def check_train(args) -> None:
    rt = dist.runtime()
    groups = dist.groups()
    result = run(args)
    mine = {
        "region": groups.region,
        "params": digest(result.field.parameters()),
        "grid": digest([result.grid.density, result.grid.occupied]),
    }
    every = dist.allgather_object(mine, name="check.digests")
    for r in every:
        same = [e for e in every if e["region"] == r["region"]]
        assert all(e["params"] == r["params"] for e in same), f"region {r['region']}'s copies differ: {every}"
    assert len({e["params"] for e in every}) == groups.model_parallel, f"regions share parameters: {every}"
    assert len({e["grid"] for e in every}) == 1, f"occupancy grids differ across ranks: {every}"
    if rt.is_root:
        m = json.loads((Path(args.out_dir) / "metrics.json").read_text())["model_parallel"]
        print(
            f"CHECK replicas_agree OK ({result.step} steps, {groups.replicas} replicas x {groups.model_parallel} "
            f"regions; hash params per rank {m['hash_params_per_rank']})",
            flush=True,
        )
        print(f"CHECK identical_grids OK (occupied {100 * result.grid.occupancy_fraction():.1f}%)", flush=True)


def check_resume(argv: list[str], out: Path) -> None:
    rt = dist.runtime()
    straight = run(parse_args([*argv, "--out_dir", str(out / "a"), "--n_steps", "24", "--ckpt_every", "12"]))
    a = digest(straight.field.parameters())
    ckpt = out / "a" / "checkpoints" / "ckpt-00000012.pt"
    resumed = run(parse_args([*argv, "--out_dir", str(out / "b"), "--n_steps", "24", "--resume", str(ckpt)]))
    b = digest(resumed.field.parameters())
    every = dist.allgather_object((a, b), name="check.resume")
    assert all(x == y for x, y in every), f"resumed parameters differ from the uninterrupted run: {every}"
    grids = dist.allgather_object(digest([straight.grid.density]) == digest([resumed.grid.density]), name="check.g")
    assert all(grids), "resumed occupancy grid differs"
    if rt.is_root:
        files = sorted(p.name for p in (out / "a" / "checkpoints").iterdir())
        print(f"CHECK exact_resume OK (24 steps == 12 + resume + 12 on every rank; files {files})", flush=True)


def main() -> None:
    mode, cache, out_dir, k = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    argv = [
        "--config",
        str(CPU_CONFIG),
        *TINY_ARGS,
        "--scene_cache",
        cache,
        "--device",
        "cpu",
        "--log_every",
        "12",
        "--model_parallel",
        str(k),
    ]
    dist.init("cpu", model_parallel=k)
    scene = load_scene("builtin", scene_cache=cache)
    if mode == "exact":
        check_exact(parse_args([*argv, "--out_dir", str(out_dir)]), scene, k)
    elif mode == "train":
        check_train(parse_args([*argv, "--out_dir", str(out_dir), "--n_steps", "30"]))
    elif mode == "resume":
        check_resume(argv, out_dir)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
