"""Rank-aware data loading: shards, sampling strategies, importance weights, error map, complexity, stores,
load balance, dynamic resolution. Statistical tests use fixed seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hvd_ngp.cluster import dist
from hvd_ngp.data import load_scene
from hvd_ngp.data.balance import Balancer, RankTimes
from hvd_ngp.data.complexity import complexity_scores, scene_features, tile_features
from hvd_ngp.data.error_map import ErrorMap
from hvd_ngp.data.pixels import StackedPixels, StreamedPixels, plan_placement
from hvd_ngp.data.sampler import RaySampler
from hvd_ngp.data.shards import TileGrid, shard_tiles, shard_units
from hvd_ngp.errors import ConfigError
from hvd_ngp.observe.metrics import COL, RANK_FIELDS
from hvd_ngp.observe.monitor import interval_record

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def scene(scene_cache):
    return load_scene("builtin", scene_cache=scene_cache)


@pytest.fixture(autouse=True)
def size_one_runtime():
    dist.init("cpu")


# ------------------------------------------------------------------------------------ shards

MIXED_SIZES = torch.tensor([[80, 60], [33, 47], [100, 20], [7, 5]])


@pytest.mark.parametrize("by", ["tile", "image"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shards_are_disjoint_cover_and_balanced(by, world_size):
    grid = TileGrid.build(MIXED_SIZES, 16)
    n_pixels = int((MIXED_SIZES[:, 0] * MIXED_SIZES[:, 1]).sum())
    shards = [shard_tiles(grid, by, 7, r, world_size, epoch=3) for r in range(world_size)]
    pixels = torch.cat([grid.pixels_of(s) for s in shards])
    assert pixels.numel() == n_pixels and torch.unique(pixels).numel() == n_pixels  # disjoint and covering
    units = [
        shard_units(grid.n_tiles if by == "tile" else grid.n_images, 7, r, world_size, 3).numel()
        for r in range(world_size)
    ]
    assert max(units) - min(units) <= 1


def test_tiles_partition_each_image():
    grid = TileGrid.build(MIXED_SIZES, 16)
    assert int(grid.count.sum()) == int((MIXED_SIZES[:, 0] * MIXED_SIZES[:, 1]).sum())
    img, x, y = torch.tensor([1, 1, 2]), torch.tensor([32, 0, 99]), torch.tensor([46, 16, 19])
    tile = grid.tile_of(img, x, y)
    assert torch.all(grid.image[tile] == img)
    assert torch.all((grid.x0[tile] <= x) & (x < grid.x0[tile] + grid.w[tile]))
    assert torch.all((grid.y0[tile] <= y) & (y < grid.y0[tile] + grid.h[tile]))


def test_shards_are_stable_for_a_seed_and_change_with_epoch_seed_and_world_size():
    a = shard_units(1000, seed=5, rank=1, world_size=4, epoch=2)
    assert torch.equal(a, shard_units(1000, seed=5, rank=1, world_size=4, epoch=2))
    assert not torch.equal(a, shard_units(1000, seed=5, rank=1, world_size=4, epoch=3))
    assert not torch.equal(a, shard_units(1000, seed=6, rank=1, world_size=4, epoch=2))
    # a new world size deals the same permutation again: still disjoint and covering
    for world_size in (3, 5):
        units = torch.cat([shard_units(1000, 5, r, world_size, 2) for r in range(world_size)])
        assert torch.equal(units.sort().values, torch.arange(1000))
    with pytest.raises(ConfigError, match="every rank needs at least one"):
        shard_units(3, 0, 0, 4, 0)


def test_samplers_split_the_scene_and_each_draws_only_from_its_shard_and_reports_tiles(scene):
    n_pixels = len(scene.train) * scene.train.height * scene.train.width
    for world_size in (1, 2, 3, 5):  # the ranks' shards of the scene's pixels: disjoint and covering
        samplers = [RaySampler(scene.train, r, world_size, 0, CPU) for r in range(world_size)]
        pixels = torch.cat([s.shard_pixels() for s in samplers])
        assert pixels.numel() == n_pixels and torch.unique(pixels).numel() == n_pixels, world_size
        last = samplers[-1]  # the last rank draws only from its own shard
        assert torch.isin(last.sample(256).pixel, last.shard_pixels()).all(), world_size
    sampler = RaySampler(scene.train, 1, 3, 0, CPU)
    batch = sampler.sample(2048)
    assert torch.isin(batch.pixel, sampler.shard_pixels()).all()
    img, y, x = scene.train.locate(batch.pixel)
    assert torch.equal(sampler.grid.tile_of(img, x, y), batch.tile)
    assert torch.equal(batch.rgba, scene.train.images[img, y, x].float() / 255)
    assert batch.weight is None  # uniform sampling
    sampler.set_epoch(1)
    assert not torch.isin(sampler.sample(2048).pixel, batch.pixel).all()


def chi_square(counts: torch.Tensor, expected: torch.Tensor) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def test_uniform_sampling_is_uniform_over_the_shard(scene):
    sampler = RaySampler(scene.train, 0, 2, 3, CPU, tile_size=16)
    tiles = torch.cat([sampler.sample(8192).tile for _ in range(25)])
    counts = torch.bincount(tiles, minlength=sampler.grid.n_tiles)[sampler.shard].double()
    expected = sampler.grid.count[sampler.shard].double() / sampler.shard_size * tiles.numel()
    df = sampler.shard.numel() - 1
    assert chi_square(counts, expected) < df + 5 * math.sqrt(2 * df)


# ------------------------------------------------------------------------------------ error map and weights


def high_loss_tiles(sampler: RaySampler) -> torch.Tensor:
    """Per-tile synthetic loss: the tiles of images 0..3 are hard (1.0), all others easy (0.01)."""
    loss = torch.full((sampler.grid.n_tiles,), 0.01)
    loss[sampler.grid.image < 4] = 1.0
    return loss


def test_error_map_sampling_draws_more_from_high_loss_pixels(scene):
    sampler = RaySampler(scene.train, 0, 1, 11, CPU)
    emap = ErrorMap(sampler.grid.n_tiles, CPU)
    truth = high_loss_tiles(sampler)
    for _ in range(3):  # the training loop: record each batch's per-ray loss, reduce every interval
        batch = sampler.sample(20000)
        emap.record(batch.tile, truth[batch.tile])
        sampler.set_scores(emap.reduce())
    assert torch.allclose(emap.error[emap.seen].float(), truth[emap.seen], rtol=1e-5)
    hard = sampler.grid.image < 4
    tiles = torch.cat([sampler.sample(10000).tile for _ in range(5)])
    drawn = float(hard[tiles].float().mean())
    n = sampler.grid.count.double()
    uniform = float(n[hard].sum() / n.sum())  # 4 of 64 images: 1/16
    mass = float((n * truth)[hard].sum() / (n * truth).sum())
    expected = 0.75 * mass + 0.25 * uniform  # the default floor is 0.25
    assert drawn > 5 * uniform
    assert drawn == pytest.approx(expected, rel=0.03)


def test_importance_weights_make_the_weighted_mean_unbiased_and_the_floor_holds(scene):
    sampler = RaySampler(scene.train, 0, 1, 5, CPU, floor=0.2)
    truth = high_loss_tiles(sampler)
    sampler.set_scores(truth)
    n = sampler.grid.count[sampler.shard].double()
    assert bool((sampler.probability >= 0.2 * n / n.sum() - 1e-12).all())  # no tile below the floor
    per_pixel_loss = truth.double()  # the quantity whose mean over pixels the loss estimates
    uniform_mean = float((n * per_pixel_loss[sampler.shard]).sum() / n.sum())
    batches = [sampler.sample(20000) for _ in range(10)]
    weighted = torch.cat([b.weight.double() * per_pixel_loss[b.tile] for b in batches]).mean()
    unweighted = torch.cat([per_pixel_loss[b.tile] for b in batches]).mean()
    assert float(weighted) == pytest.approx(uniform_mean, rel=0.03)
    assert float(unweighted) > 3 * uniform_mean  # without weights, the hard tiles dominate
    assert float(torch.cat([b.weight for b in batches]).max()) <= 1 / 0.2 + 1e-4


def test_error_map_blends_intervals_and_fills_unseen_tiles():
    emap = ErrorMap(4, CPU, decay=0.5)
    emap.record(torch.tensor([0, 0, 1]), torch.tensor([1.0, 3.0, 4.0]))
    error = emap.reduce()
    assert error.tolist() == [2.0, 4.0, 3.0, 3.0]  # unseen tiles: the mean of the seen tiles' means
    emap.record(torch.tensor([0, 2]), torch.tensor([4.0, 1.0]), valid=torch.tensor([True, True]))
    emap.record(torch.tensor([1]), torch.tensor([100.0]), valid=torch.tensor([False]))  # left out of the loss
    assert emap.reduce().tolist() == [3.0, 4.0, 1.0, 2.5]


def test_masked_mean_with_weights():
    from hvd_ngp.training.step import masked_mean

    v = torch.tensor([[1.0, 1.0], [3.0, 3.0], [5.0, 5.0]])
    assert float(masked_mean(v, None, torch.tensor([1.0, 1.0, 1.0]))) == pytest.approx(3.0)
    assert float(masked_mean(v, torch.tensor([True, True, False]), torch.tensor([2.0, 0.0, 7.0]))) == pytest.approx(1.0)


# ------------------------------------------------------------------------------------ complexity


def synthetic(kind: str, size: int = 64) -> np.ndarray:
    rng = np.random.default_rng(0)
    img = np.full((size, size, 4), 255, np.uint8)
    img[..., :3] = 120
    if kind == "checker":
        yy, xx = np.mgrid[:size, :size]
        img[..., :3] = np.where(((yy // 4 + xx // 4) % 2)[..., None] > 0, 230, 20)
    elif kind == "noise":
        img[..., :3] = rng.integers(0, 256, (size, size, 3))
    return img


def test_complexity_is_larger_for_textured_than_flat_images():
    flat, checker, noise = (tile_features(synthetic(k), 32) for k in ("flat", "checker", "noise"))
    assert flat.shape == (4, 2) and np.all(flat == 0)
    assert np.all(checker[:, 0] > 0.1) and np.all(checker[:, 1] > 1000)
    assert np.all(noise[:, 1] > 1000)
    scores = complexity_scores(torch.from_numpy(np.concatenate([flat, checker, noise])))
    assert float(scores.mean()) == pytest.approx(1.0)
    assert float(scores[:4].max()) == 0.0 and float(scores[4:].min()) > 0.5
    # a half-textured image: its textured tiles score higher than its flat ones
    half = synthetic("flat")
    half[:, 32:] = synthetic("checker")[:, 32:]
    s = complexity_scores(torch.from_numpy(tile_features(half, 32)))
    assert float(s[[1, 3]].min()) > float(s[[0, 2]].max())


def test_complexity_sees_silhouettes_on_transparent_backgrounds():
    img = np.zeros((64, 64, 4), np.uint8)
    yy, xx = np.mgrid[:64, :64]
    img[(yy - 32) ** 2 + (xx - 32) ** 2 < 20**2] = (127, 128, 127, 255)  # mid-grey disc: only alpha shows it
    f = tile_features(img, 32)
    assert np.all(f[:, 0] > 0) and np.all(f[:, 1] > 0)


def test_complexity_features_are_cached_with_the_scene(scene, tmp_path):
    sampler = RaySampler(scene.train, 0, 1, 0, CPU)
    paths = scene.train.files.paths
    first, cached = scene_features(sampler.grid, sampler.store.image, paths, 1, tmp_path)
    assert not cached and len(list((tmp_path / "complexity").glob("*.npz"))) == 1
    again, cached = scene_features(sampler.grid, sampler.store.image, paths, 1, tmp_path)
    assert cached and torch.equal(first, again)  # bit for bit: a run reading the cache draws the same tiles
    other = TileGrid.build(scene.train.sizes, 16)  # another tile size is another entry
    _, cached = scene_features(other, sampler.store.image, paths, 1, tmp_path)
    assert not cached and len(list((tmp_path / "complexity").glob("*.npz"))) == 2
    scores = complexity_scores(first)
    background = bool((scene.train.images[..., 3] == 0).any())  # the built-in scene has empty corners
    assert background and float(scores.min()) < 0.2 < 2 < float(scores.max())


# ------------------------------------------------------------------------------------ stores


def test_host_store_gives_the_same_pixels_and_rays_as_the_device_store(scene):
    dev = RaySampler(scene.train, 0, 2, 4, CPU)
    host = RaySampler(scene.train, 0, 2, 4, CPU, store=StackedPixels(scene.train, CPU, on_device=False))
    assert host._pool is not None  # drawn in a background thread, one batch ahead
    pixels = torch.randint(0, scene.train.n_pixels, (512,), generator=torch.Generator().manual_seed(0))
    a, b = dev.rays_for_pixels(pixels, jitter=False), host.rays_for_pixels(pixels, jitter=False)
    assert torch.equal(a.rgba, b.rgba) and torch.equal(a.directions, b.directions)
    shard = host.shard_pixels()
    for n in (256, 300, 256, 1024, 64):  # prefetched batches are sliced or redrawn as the size changes
        batch = host.sample(n)
        assert len(batch) == n and torch.isin(batch.pixel, shard).all()
        img, y, x = scene.train.locate(batch.pixel)
        assert torch.equal(batch.rgba, scene.train.images[img, y, x].float() / 255)
    host.close()


def test_fp16_store_matches_uint8(scene):
    a = StackedPixels(scene.train, CPU, on_device=True)
    b = StackedPixels(scene.train, CPU, on_device=True, image_dtype="fp16")
    img, y, x = torch.tensor([0, 5, 63]), torch.tensor([0, 40, 79]), torch.tensor([3, 40, 0])
    assert torch.allclose(a.gather(img, y, x), b.gather(img, y, x), atol=1e-3)
    assert b.nbytes == 2 * a.nbytes and np.array_equal(a.image(5), b.image(5))


def test_streamed_store_cycles_through_this_ranks_images_in_bounded_memory(scene_cache):
    lazy = load_scene("builtin", scene_cache=scene_cache, lazy_train=True)
    eager = load_scene("builtin", scene_cache=scene_cache)
    assert lazy.train.images is None and torch.equal(lazy.train.sizes, eager.train.sizes)
    store = StreamedPixels(lazy.train, CPU, chunk=3, workers=2)
    sampler = RaySampler(lazy.train, 1, 2, 9, CPU, store=store, shard_by="image", stream_passes=0.5)
    shard_images = set(shard_units(len(lazy.train), 9, 1, 2, 0).tolist())
    seen, residents = set(), []
    for _ in range(60):
        batch = sampler.sample(2000)
        img, y, x = eager.train.locate(batch.pixel)
        assert set(img.tolist()) <= set(store.ids)  # only resident images are drawn
        assert torch.equal(batch.rgba, eager.train.images[img, y, x].float() / 255)
        seen |= set(img.tolist())
        residents.append(tuple(store.ids))
    assert seen == shard_images  # every image of the shard, none of the other rank's
    assert store.rotations >= len(shard_images) // 3 and len(set(residents)) > 3
    assert store.nbytes == 2 * 3 * 80 * 80 * 4  # two chunks of three images, whatever the scene's size
    sampler.set_epoch(1)  # a new epoch streams the new shard
    assert set(store.ids) <= set(shard_units(len(lazy.train), 9, 1, 2, 1).tolist())
    sampler.close()


def test_placement_follows_the_budgets():
    sizes = torch.tensor([[100, 100]] * 10)  # 400 kB decoded
    gib = float(1 << 30)
    assert plan_placement("auto", sizes, CPU, host_budget_gb=1).mode == "device"
    assert plan_placement("auto", sizes, CPU, host_budget_gb=300e3 / gib).mode == "stream"
    assert plan_placement("auto", sizes, CPU, "fp16", host_budget_gb=500e3 / gib).mode == "stream"
    assert plan_placement("host", sizes, CPU).mode == "host"
    with pytest.raises(ConfigError, match="--preload"):
        plan_placement("vram", sizes, CPU)


# ------------------------------------------------------------------------------------ dynamic resolution


def test_dynamic_resolution_trains_on_block_means(scene):
    sampler = RaySampler(scene.train, 0, 1, 2, CPU, tile_size=32)
    sampler.set_resolution(4)
    batch = sampler.sample(500)
    img, y, x = scene.train.locate(batch.pixel)
    images = scene.train.images.float() / 255
    for i in range(0, 500, 25):
        by, bx = int(y[i]) // 4 * 4, int(x[i]) // 4 * 4  # 80 px images, 32 px tiles: blocks clip at the tile edge
        h, w = min(4, 80 - by), min(4, 80 - bx)
        block = images[img[i], by : by + h, bx : bx + w].reshape(-1, 4).mean(0)
        torch.testing.assert_close(batch.rgba[i], block)
    with pytest.raises(ValueError, match="power of two"):
        sampler.set_resolution(3)


# ------------------------------------------------------------------------------------ load balance


def table(rows: list[dict]) -> np.ndarray:
    return np.array([[row.get(f, 0.0) for f in RANK_FIELDS] for row in rows], dtype=np.float64)


def two_ranks(busy0: float, busy1: float, samples=(1000.0, 1000.0), rays=(100.0, 100.0)) -> np.ndarray:
    """A 10-step interval of 10 s in which rank r worked busy_r seconds and waited the rest."""
    return table(
        [
            {"steps": 10, "seconds": 10.0, "comm_seconds": 10.0 - b, "samples": s * 10, "rays": r * 10}
            for b, s, r in zip((busy0, busy1), samples, rays)
        ]
    )


def test_time_balance_gives_slower_ranks_less_work():
    b0, b1 = (Balancer("time", r, 2, 1000) for r in (0, 1))
    times = RankTimes.from_table(two_ranks(9.0, 3.0), COL)
    assert times.spread() == pytest.approx(2 / 3)
    assert b0.update(times) and b1.update(times)
    assert b0.target_samples < 1000 < b1.target_samples
    assert b0.target_samples + b1.target_samples == pytest.approx(2000, abs=2)
    for _ in range(8):  # converge: targets proportional to throughput (1:3)
        for b in (b0, b1):
            b.update(times)
    assert b1.target_samples / b0.target_samples == pytest.approx(3.0, rel=0.05)
    # balanced ranks: no change
    b2 = Balancer("time", 0, 2, 1000)
    assert not b2.update(RankTimes.from_table(two_ranks(5.0, 5.1), COL)) and b2.target_samples == 1000


def test_balance_off_plans_equal_rays_and_loss_scale_follows_the_rays():
    off = Balancer("off", 1, 2, 1000)
    off.update(RankTimes.from_table(two_ranks(9.0, 3.0, samples=(3000.0, 1000.0), rays=(100.0, 100.0)), COL))
    assert off.equal_rays == 64 and off.loss_scale == 1.0  # 20 samples per ray on average: 50 rays -> the minimum 64
    # buffers sized per rank: equal rays give rank 0 (30 samples per ray) 3x rank 1's samples (10 per ray)
    r0, r1 = (Balancer("off", r, 2, 10_000) for r in (0, 1))
    assert r0.sample_capacity == r1.sample_capacity == 20_000  # before any plan: room for MAX_SHARE x the target
    busy = RankTimes.from_table(two_ranks(9.0, 3.0, samples=(15_000.0, 5_000.0), rays=(500.0, 500.0)), COL)
    for b in (r0, r1):
        b.update(busy)
    assert r0.equal_rays == r1.equal_rays == 448  # 20 samples per ray on average: 500 rays -> 448 (multiple of 64)
    assert r0.sample_capacity == int(1.15 * 448 * 30) and r1.sample_capacity == int(1.15 * 448 * 10)
    restored = Balancer("off", 0, 2, 10_000)
    restored.load_state_dict(r0.state_dict())
    assert restored.sample_capacity == r0.sample_capacity
    # an interval with nothing counted (the first log after a resume) keeps the plan: it once asked for max_rays
    assert not restored.update(RankTimes.from_table(two_ranks(0.0, 0.0, samples=(0.0, 0.0), rays=(0.0, 0.0)), COL))
    assert restored.equal_rays == 448 and restored.sample_capacity == r0.sample_capacity
    s = Balancer("samples", 0, 2, 1000)
    s.update(RankTimes.from_table(two_ranks(5.0, 5.0, rays=(100.0, 300.0)), COL))
    assert s.loss_scale == pytest.approx(0.5) and s.target_samples == 1000
    with pytest.raises(ConfigError, match="--balance"):
        Balancer("fast", 0, 2, 1000)


def test_monitor_reports_per_rank_step_times_and_their_spread():
    rec = interval_record(two_ranks(9.0, 3.0), step=10, train_s=10.0, occupancy=None)
    assert rec["rank_step_ms_max"] == pytest.approx(900.0) and rec["rank_step_ms_max_rank"] == 0
    assert rec["rank_step_ms_min"] == pytest.approx(300.0) and rec["rank_step_ms_min_rank"] == 1
    assert rec["step_time_spread"] == pytest.approx(2 / 3)
    no_comm = table([{"steps": 10, "seconds": 10.0, "comm_seconds": math.nan}] * 2)
    assert interval_record(no_comm, 10, 10.0, None)["step_time_spread"] is None


# ------------------------------------------------------------------------------------ the pipeline in training


def pipeline_of(frames, s, scene_cache: str):
    """The data pipeline ``Trainer.build`` makes from the settings ``s`` (size 1)."""
    from hvd_ngp.data.pipeline import DataPipeline

    return DataPipeline.build(
        frames, s.data, dist.runtime(), s.step.seed, s.step.target_samples, s.step.max_rays, scene_cache
    )


def test_pipeline_advances_epochs_and_resolution_from_the_interval_table(scene_cache, tmp_path):
    from hvd_ngp.config import CPU_CONFIG, parse_settings

    s = parse_settings(["--config", str(CPU_CONFIG), "--scene_cache", str(scene_cache), "--dynamic_resolution", "4"])
    lazy = load_scene("builtin", scene_cache=scene_cache, lazy_train=True)
    pipe = pipeline_of(lazy.train, s, str(tmp_path))
    assert pipe.sampler.resolution == 4 and pipe.sampler.epoch == 0
    n = pipe.sampler.n_pixels
    step = table([{"steps": 10, "seconds": 1.0, "rays": n * 0.6, "loss_sum": 10 * 0.5}])
    assert pipe.end_interval(step) == []  # 0.6 epochs; first loss
    notes = pipe.end_interval(step)  # 1.2 epochs; the loss did not fall
    assert pipe.sampler.epoch == 1 and pipe.resolution == 2 and pipe.sampler.resolution == 2
    assert any("epoch 1" in s for s in notes) and any("resolution raised to 1/2" in s for s in notes)
    falling = table([{"steps": 10, "seconds": 1.0, "rays": 1.0, "loss_sum": 10 * 0.1}])
    pipe.end_interval(falling)
    pipe.end_interval(table([{"steps": 10, "seconds": 1.0, "rays": 1.0, "loss_sum": 10 * 0.05}]))
    assert pipe.resolution == 2  # still falling fast: stays
    pipe.end_interval(table([{"steps": 10, "seconds": 1.0, "rays": 1.0, "loss_sum": 10 * 0.049}]))
    assert pipe.resolution == 1
    pipe.close()


@pytest.mark.parametrize(
    "options",
    [
        ["--sampling", "error_map", "--error_map_interval", "4", "--preload", "host"],
        ["--sampling", "complexity", "--importance_weights", "off", "--balance", "off", "--shard_by", "image"],
        ["--preload", "stream", "--host_image_budget_gb", "0.0001", "--dynamic_resolution", "2", "--log_every", "4"],
    ],
)
def test_training_runs_with_each_strategy_and_placement(options, scene_cache, tmp_path):
    from conftest import TINY_ARGS

    from hvd_ngp.config import CPU_CONFIG, parse_args
    from hvd_ngp.training.trainer import run

    args = parse_args(
        [
            "--config",
            str(CPU_CONFIG),
            *TINY_ARGS,
            "--scene_cache",
            str(scene_cache),
            "--device",
            "cpu",
            "--n_steps",
            "12",
            "--log_every",
            "6",
            "--out_dir",
            str(tmp_path / "o"),
            "--save_renders",
            "0",
            *options,
        ]
    )
    result = run(args)
    assert result.step == 12 and all(math.isfinite(h["loss"]) for h in result.metrics["history"])
    assert math.isfinite(result.metrics["test_psnr"])


@pytest.mark.parametrize(
    "option, message",
    [
        (["--complexity_weights", "0.3"], "--complexity_weights"),
        (["--dynamic_resolution", "3"], "power of two"),
        (["--sampling_floor", "0"], "--sampling_floor"),
        (["--tile_size", "8", "--dynamic_resolution", "16"], "must divide --tile_size"),
    ],
)
def test_bad_data_options_are_refused(option, message):
    from hvd_ngp.config import parse_args

    with pytest.raises(ConfigError, match=message):
        parse_args(option)


# ------------------------------------------------------------------------------------ the benchmark


def test_time_to_psnr_interpolates_between_evaluations():
    from hvd_ngp.bench.sampling import time_to_psnr

    curve = [{"seconds": 10.0, "psnr": 20.0}, {"seconds": 20.0, "psnr": 24.0}, {"seconds": 30.0, "psnr": 23.0}]
    assert time_to_psnr(curve, 19.0) == 10.0
    assert time_to_psnr(curve, 22.0) == pytest.approx(15.0)
    assert time_to_psnr(curve, 25.0) is None


def test_sampling_benchmark_writes_its_table_json_and_markdown(scene_cache, tmp_path, capsys):
    import json

    from conftest import TINY_ARGS

    from hvd_ngp.bench.sampling import main

    md = tmp_path / "BENCH.md"
    result = main(
        [
            "--device",
            "cpu",
            "--variants",
            "uniform,streamed",
            "--time_budget_s",
            "1",
            "--eval_points",
            "2",
            "--log_every",
            "2",
            "--out",
            str(tmp_path / "runs"),
            "--json",
            str(tmp_path / "b.json"),
            "--markdown",
            str(md),
            "--",
            *TINY_ARGS,
            "--scene_cache",
            str(scene_cache),
            "--n_eval_views",
            "1",
        ]
    )
    assert [v["variant"] for v in result["variants"]] == ["uniform", "streamed"]
    assert result["variants"][1]["data"]["placement"] == "stream" and result["memory_cap_gb"] > 0
    assert json.loads((tmp_path / "b.json").read_text())["target_psnr"] == pytest.approx(result["target_psnr"])
    text = md.read_text()
    assert "## Sampling strategies, load balance, streamed images" in text and "| streamed" in text
    assert "| uniform" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="--variants"):
        main(["--variants", "fastest"])


def test_pipeline_state_survives_a_json_round_trip(scene_cache, tmp_path):
    """Checkpoints keep the data schedule in the run's JSON progress record."""
    import json

    from hvd_ngp.config import CPU_CONFIG, parse_settings

    argv = [
        "--config",
        str(CPU_CONFIG),
        "--scene_cache",
        str(scene_cache),
        "--sampling",
        "error_map",
        "--dynamic_resolution",
        "2",
    ]
    frames = load_scene("builtin", scene_cache=scene_cache, lazy_train=True).train
    a = pipeline_of(frames, parse_settings(argv), str(tmp_path))
    batch = a.sample(4096)
    a.observe(a.settings.error_map_interval - 1, batch, torch.rand(len(batch)), None)  # one reduction
    a.end_interval(table([{"steps": 10, "seconds": 1.0, "rays": a.sampler.n_pixels * 1.5, "loss_sum": 5.0}]))
    assert a.sampler.epoch == 1 and a.error_map.updates == 1
    b = pipeline_of(frames, parse_settings(argv), str(tmp_path))
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.summary() == a.summary() and b.rays_drawn == a.rays_drawn
    assert torch.equal(b.sampler.probability, a.sampler.probability)
    a.close()
    b.close()


def test_new_sampler_keeps_strategy_and_epoch_for_a_new_world(scene_cache, tmp_path):
    from hvd_ngp.config import CPU_CONFIG, parse_settings

    s = parse_settings(["--config", str(CPU_CONFIG), "--scene_cache", str(scene_cache), "--sampling", "complexity"])
    frames = load_scene("builtin", scene_cache=scene_cache, lazy_train=True).train
    pipe = pipeline_of(frames, s, str(tmp_path))
    pipe.sampler.set_epoch(3)
    first = pipe.sampler
    assert pipe.new_sampler(first.rank, first.world_size, first.seed) is first
    shards = [pipe.new_sampler(r, 2, 99).shard_pixels() for r in (1, 0)]
    assert pipe.sampler is not first and pipe.sampler.epoch == 3 and pipe.balancer.world_size == 2
    assert torch.equal(pipe.sampler.scores, first.scores) and pipe.sampler.store is first.store
    allpix = torch.cat(shards)
    assert allpix.numel() == frames.n_pixels and torch.unique(allpix).numel() == frames.n_pixels
    pipe.close()


def test_elastic_jobs_build_the_pipeline_without_collectives(scene, tmp_path, monkeypatch):
    """A rank that joins an elastic job later builds alone: the same features, computed locally."""
    sampler = RaySampler(scene.train, 0, 1, 0, CPU)
    paths = scene.train.files.paths
    reference, _ = scene_features(sampler.grid, sampler.store.image, paths, 1, None)
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    monkeypatch.setattr(dist, "allreduce", lambda *a, **k: pytest.fail("a collective in an elastic build"))
    monkeypatch.setattr(dist, "agree", lambda *a, **k: pytest.fail("a collective in an elastic build"))
    features, cached = scene_features(sampler.grid, sampler.store.image, paths, 1, tmp_path)
    assert not cached and torch.equal(features, reference)
    assert plan_placement("auto", scene.train.sizes, CPU).mode == "device"
    from hvd_ngp.data.pipeline import agree_placement

    assert agree_placement(plan_placement("stream", scene.train.sizes, CPU)).mode == "stream"


@pytest.mark.parametrize("placement", ["device", "host", "stream"])
def test_stores_on_the_gpu_give_the_cpu_pixels(placement, scene_cache):
    """Device store, pinned host store with asynchronous copies, streamed store: the same pixels on a GPU."""
    from conftest import gpu_or_skip

    gpu_or_skip()
    cuda = torch.device("cuda")
    eager = load_scene("builtin", scene_cache=scene_cache)
    if placement == "stream":
        lazy = load_scene("builtin", scene_cache=scene_cache, lazy_train=True)
        sampler = RaySampler(
            lazy.train, 0, 2, 1, cuda, store=StreamedPixels(lazy.train, cuda, chunk=4, workers=2), shard_by="image"
        )
    else:
        sampler = RaySampler(
            eager.train, 0, 2, 1, cuda, store=StackedPixels(eager.train, cuda, on_device=placement == "device")
        )
    for _ in range(20):
        batch = sampler.sample(4096)
        assert batch.rgba.device.type == "cuda" and batch.origins.device.type == "cuda"
        img, y, x = eager.train.locate(batch.pixel.cpu())
        # same pixels; the GPU may scale by 1/255 as a multiplication (last-bit differences)
        torch.testing.assert_close(batch.rgba.cpu(), eager.train.images[img, y, x].float() / 255, atol=1e-6, rtol=0)
    sampler.close()
