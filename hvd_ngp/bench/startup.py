"""``python -m hvd_ngp.bench startup --scenes A,B``: start-up time from scene load to the first step's rays.

Launch it like the trainer (``horovodrun -np 2 -H localhost:2 python -m hvd_ngp.bench startup ...``). For
each scene in turn (e.g. a JPEG scene and its ``hvd-ngp-data pack``), every rank times what the
trainer does before its first step: ``load_scene`` (the test views decoded, the training images'
sizes), the data pipeline (the training images decoded or copied into the pixel store, shards,
sampling scores) and the first ray batch. Each scene runs ``--repeat`` times after a barrier; the
reported time of a run is the slowest rank's, and a scene's is the median over runs (the first run
reads files the later ones find in the page cache: ``first_run_s`` shows it). Trainer flags after ``--``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

from ..cluster import dist
from ..config import BASE_CONFIG, CPU_CONFIG, parse_settings
from ..data import load_scene, scene_format
from ..data.pipeline import DataPipeline
from ..options import options_from
from ..settings import Settings
from .report import append_markdown, table, write_json


def one_run(s: Settings, rt, n_rays: int) -> dict:
    """Seconds of each start-up stage on this rank, then the slowest rank's per stage."""
    dist.barrier()
    t0 = time.perf_counter()
    scene = load_scene(s.scene.scene, **s.scene.load_kwargs(), lazy_train=True)
    t1 = time.perf_counter()
    data = DataPipeline.build(
        scene.train, s.data, rt, s.step.seed, s.step.target_samples, s.step.max_rays, s.scene.scene_cache
    )
    t2 = time.perf_counter()
    batch = data.sampler.sample(n_rays)
    float(batch.rgba.sum())  # the batch is there
    t3 = time.perf_counter()
    data.sampler.close()
    mine = [t1 - t0, t2 - t1, t3 - t2, t3 - t0]
    worst = dist.allgather_object(mine, name="startup.times")
    return {k: max(w[i] for w in worst) for i, k in enumerate(("load_s", "pipeline_s", "first_batch_s", "total_s"))}


@dataclass(frozen=True)
class StartupOptions:
    """The command line of ``python -m hvd_ngp.bench startup`` (``main``'s parser holds each option's help)."""

    scenes: str
    holdout_every: int
    device: str
    repeat: int
    rays: int
    json: str
    markdown: str
    extra: list[str]  # trainer flags


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m hvd_ngp.bench startup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenes", required=True, help="comma-separated scenes (folders, transforms files, 'builtin')")
    p.add_argument("--holdout_every", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rays", type=int, default=4096, help="rays in the first batch")
    p.add_argument("--json", default="", help="write the results to this JSON file")
    p.add_argument("--markdown", default="", help="append a table to this markdown file")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="-- then trainer flags")
    opts = options_from(StartupOptions, p.parse_args(argv))
    extra = opts.extra[1:] if opts.extra[:1] == ["--"] else opts.extra
    default_config = BASE_CONFIG if opts.device != "cpu" else CPU_CONFIG
    rows = []
    for scene in opts.scenes.split(","):
        settings = parse_settings(
            ["--scene", scene, "--holdout_every", str(opts.holdout_every), "--device", opts.device, *extra],
            default_config=default_config,
        )
        rt = dist.init(settings.runtime.device, settings.runtime.threads)
        runs = [one_run(settings, rt, opts.rays) for _ in range(opts.repeat)]
        row = {
            "scene": scene,
            "format": scene_format(scene),
            "ranks": rt.size,
            **{k: statistics.median(r[k] for r in runs) for k in runs[0]},
            "first_run_s": runs[0]["total_s"],
            "runs": runs,
        }
        dist.log(
            f"startup {scene} ({row['format']}, {rt.size} rank(s)): {row['total_s']:.3f} s median "
            f"(load {row['load_s']:.3f}, pipeline {row['pipeline_s']:.3f}, first batch {row['first_batch_s']:.3f}); "
            f"first run {row['first_run_s']:.3f} s"
        )
        rows.append(row)
    if dist.runtime().is_root:
        if opts.json:
            write_json(opts.json, {"startup": rows})
        if opts.markdown:
            cols = ["scene", "format", "ranks", "total_s", "load_s", "pipeline_s", "first_batch_s", "first_run_s"]
            body = table(
                [{c: (f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c])) for c in cols} for r in rows], cols
            )
            append_markdown(opts.markdown, "Start-up: scene load to the first step's rays", body, argv)
    dist.shutdown()
    return 0
