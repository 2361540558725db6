"""Inference settings side by side on one snapshot, in one process (GPU; run.sh step ``inference-sweep``).

    python benchmarks/inference_sweep.py SNAPSHOT --json OUT.json [--settings two_pass:20:32:2,single_pass:20:4:32]

Each setting is ``PATH:LOG2_CHUNK:A:B[:SEGMENT[:STEPS[:MATH[:STOP[:UPDATE]]]]]``:

- the inference path (``render.volume.INFERENCE_PATHS``);
- ``render.plan.MAX_CHUNK_RAYS`` as a power of two;
- the windows, ``A:B``: for ``two_pass`` ``render.fast.FIRST_WINDOW`` and ``render.fast.WINDOW_GROWTH``, for
  ``single_pass`` and ``density_first`` ``render.infer.WINDOWS`` (``InferenceWindows(first=A, most=B)``);
- the march launch's lattice steps per program (``render.fast.INFERENCE_LAUNCH.segment``; empty or absent:
  unchanged; ``two_pass`` only: the other paths walk a whole ray per program);
- the ray step as ``marching.eval_steps_per_diagonal`` (the render tool's ``--marching``; absent: the
  snapshot's, 2048 with base.json; training marches 1024: half the samples, for a PSNR the row shows);
- the kernels' math (the render tool's ``--inference_math``: tf32, fp16 or ieee; absent:
  ``render.volume.INFERENCE_MATH``);
- the transmittance at which a ray stops, ``marching.early_termination`` (absent: the snapshot's; instant-ngp
  renders with 0.01: ``single_pass:20:8:128::1024::0.01`` marches as it does);
- ``single_pass``'s update of the rays' state: ``fused`` (the default, ``render.infer.FUSED_UPDATE``: one
  kernel) or ``torch`` (the count, the compositing and torch updates: the sequence it replaced).

Every setting renders one view untimed (its kernels compile there), then the snapshot's test views (``--views``,
all by default) with the render tool (``hvd-ngp-render --video none``) in this process, so each sees compiled
kernels and a warm allocator. Prints a table (seconds per view, after the first view, PSNR) and writes the rows
as JSON. ``--profile N`` then renders N more views inside ``torch.profiler`` (the last setting's path, ray step,
math, stop and update; the default windows and chunks) and prints where the device time went (the kernels,
grouped by name, per view) beside the render's time per view: device time well under it means the host bounds it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

DEFAULT_SETTINGS = (  # the default first and last (a noise check); two_pass, tf32 math, training's ray step,
    # narrower windows (fewer samples behind surfaces, more iterations), larger chunks
    "single_pass:20:8:128,two_pass:20:32:2,single_pass:20:8:128:::tf32,single_pass:20:8:128::1024,"
    "single_pass:20:4:32,single_pass:20:4:32::1024,single_pass:21:8:128,single_pass:21:4:32::1024,"
    "single_pass:20:8:128"
)


Setting = tuple[str, int, int, int, int | None, int | None, str | None, float | None, bool]


def parse_setting(text: str) -> Setting:
    path, chunk, first, growth, *more = text.split(":")
    segment, steps, math, stop, update = (more + ["", "", "", "", ""])[:5]
    if update not in ("", "fused", "torch"):
        raise ValueError(f"setting {text!r}: the update is fused or torch, not {update!r}")
    return (
        path,
        int(chunk),
        int(first),
        int(growth),
        int(segment) if segment else None,
        int(steps) if steps else None,
        math or None,
        float(stop) if stop else None,
        update != "torch",
    )


def render_flags(steps: int | None, math: str | None, stop: float | None) -> list[str]:
    """The render tool's flags for a setting's ray step, math and stop (none where the setting keeps them)."""
    marching = {} if steps is None else {"eval_steps_per_diagonal": steps}
    marching |= {} if stop is None else {"early_termination": stop}
    flags = ["--marching", json.dumps(marching)] if marching else []
    return flags + ([] if math is None else ["--inference_math", math])


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("snapshot")
    p.add_argument(
        "--settings",
        default=DEFAULT_SETTINGS,
        help="comma-separated PATH:LOG2_CHUNK:A:B[:SEGMENT[:STEPS[:MATH[:STOP[:UPDATE]]]]] (A:B: the windows)",
    )
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--views", type=int, default=-1, help="test views per setting (-1: all)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="as the render tool's")
    p.add_argument("--profile", type=int, default=0, help="views rendered under the profiler after the sweep")
    opts = p.parse_args(argv)
    settings = [parse_setting(t) for t in opts.settings.split(",")]

    import dataclasses

    import hvd_ngp.render.fast as fast
    import hvd_ngp.render.infer as infer
    import hvd_ngp.render.plan as plan
    from hvd_ngp.render.volume import INFERENCE_MATH
    from hvd_ngp.tools import render

    out = Path(tempfile.mkdtemp(prefix="inference_sweep_"))
    base = ["--load_snapshot", opts.snapshot, "--video", "none", "--out_dir", str(out), "--device", opts.device]
    rows = []
    defaults = plan.MAX_CHUNK_RAYS, fast.FIRST_WINDOW, fast.WINDOW_GROWTH, fast.INFERENCE_LAUNCH, infer.WINDOWS
    fused = infer.FUSED_UPDATE
    try:
        for path, chunk, a, b, segment, steps, math, stop, update in settings:
            plan.MAX_CHUNK_RAYS = 1 << chunk
            infer.FUSED_UPDATE = update
            if path == "two_pass":
                fast.FIRST_WINDOW, fast.WINDOW_GROWTH = a, b
            else:
                infer.WINDOWS = infer.InferenceWindows(a, b)
            launch = defaults[3] if segment is None else dataclasses.replace(defaults[3], segment=segment)
            fast.INFERENCE_LAUNCH = launch
            # one view first under this setting: a new march launch compiles its own kernel variants, which
            # otherwise land in the timed views (the first H100 sweep of 2026-12-07 read 0.058 for 0.034 s)
            marching = render_flags(steps, math, stop)
            render.main([*base, *marching, "--inference", path, "--split_views", "1"])
            render.main([*base, *marching, "--inference", path, "--split_views", str(opts.views)])
            result = json.loads((out / "render.json").read_text())
            rows.append(
                {
                    "path": path,
                    "chunk_rays": 1 << chunk,
                    "windows": f"{a}:{b}",  # two_pass: first window, growth; else first, most (InferenceWindows)
                    "segment": launch.segment,
                    "steps_per_diagonal": steps,
                    "math": math or INFERENCE_MATH,  # asked for: the Triton backends' (a torch field ignores it)
                    "early_termination": stop,  # None: the snapshot's
                    "update": "fused" if update else "torch",
                    "seconds_per_view": result["test_seconds_per_view"],
                    "seconds_per_view_after_first": result["test_seconds_per_view_after_first"],
                    "psnr": result["test_psnr"],
                }
            )
    finally:
        plan.MAX_CHUNK_RAYS, fast.FIRST_WINDOW, fast.WINDOW_GROWTH, fast.INFERENCE_LAUNCH, infer.WINDOWS = defaults
        infer.FUSED_UPDATE = fused
    print(
        "| path | chunk | windows | segment | ray steps | math | stop | update | s per view | after the first | PSNR |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['path']} | 2^{r['chunk_rays'].bit_length() - 1} | {r['windows']} | {r['segment']} | "
            f"{r['steps_per_diagonal'] or 'snapshot'} | {r['math'] or '-'} | {r['early_termination'] or 'snapshot'} | {r['update']} | "
            f"{r['seconds_per_view']:.4f} | {r['seconds_per_view_after_first']:.4f} | {r['psnr']:.3f} |"
        )
    profile = profile_views(base, out, settings[-1], opts.profile) if opts.profile > 0 else None
    if opts.json:
        Path(opts.json).write_text(json.dumps({"rows": rows, "profile": profile} if profile else rows, indent=1))
    return rows


def profile_views(base: list[str], out: Path, setting: Setting, views: int) -> dict:
    """Render ``views`` test views under ``setting`` (its path, ray step, math, stop, update) in ``torch.profiler``: the
    device's time per view by kernel name (the top 15 and the rest; on a machine without CUDA the CPU operators'
    own time) beside the render's own seconds per view (the render tool's ``render.json``), and for the
    ``single_pass`` renderers the rays, iterations, network rows and composited samples per view; prints a table."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import hvd_ngp.render.infer as infer
    from hvd_ngp.tools import render

    path, _, _, _, _, steps, math, stop, update = setting
    args = [*base, *render_flags(steps, math, stop), "--inference", path, "--split_views", str(views)]
    cuda = torch.cuda.is_available() and "cpu" not in base
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    stats, rays, plain = infer.InferenceStats(), [0], infer.render_rays_single_pass

    def counted(rgb_sigma_fn, sigma_fn, origins, *more, **kw):
        rays[0] += origins.shape[0]
        return plain(rgb_sigma_fn, sigma_fn, origins, *more, **{**kw, "stats": stats})

    infer.render_rays_single_pass = counted  # volume.inference_path looks it up at each render
    fused, infer.FUSED_UPDATE = infer.FUSED_UPDATE, update
    try:
        with profile(activities=activities) as prof:
            render.main(args)
    finally:
        infer.render_rays_single_pass, infer.FUSED_UPDATE = plain, fused
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    events = [e for e in prof.key_averages() if e.device_type == kind and e.count > 0]

    def own_us(e) -> float:
        return e.self_device_time_total if cuda else e.self_cpu_time_total

    events.sort(key=lambda e: -own_us(e))
    total_ms = sum(own_us(e) for e in events) / 1e3 / views
    top = [(e.key[:70], own_us(e) / 1e3 / views, e.count / views) for e in events[:15]]
    render_ms = json.loads((out / "render.json").read_text())["test_seconds_per_view"] * 1e3
    where = "device" if cuda else "CPU operators"
    print(f"profile: {views} views, the render {render_ms:.1f} ms per view, {where} {total_ms:.1f} ms per view")
    print("| kernel | ms per view | launches per view |")
    print("|---|---|---|")
    for name, ms, n in top:
        print(f"| {name} | {ms:.2f} | {n:.0f} |")
    print(f"| (the other {max(len(events) - 15, 0)}) | {total_ms - sum(ms for _, ms, _ in top):.2f} | |")
    launches = sum(e.count for e in events) / views
    print(f"launches per view: {launches:.0f}")
    counts = {  # zeros for two_pass, which does not count
        "rays_per_view": rays[0] / views,
        "iterations_per_view": stats.iterations / views,
        "network_rows_per_ray": stats.network_rows / max(rays[0], 1),
        "composited_per_ray": int(stats.composited) / max(rays[0], 1),
    }
    print(", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in counts.items()))
    return {
        **counts,
        "views": views,
        "render_ms_per_view": render_ms,
        "device": "cuda" if cuda else "cpu",
        "own_ms_per_view": total_ms,
        "launches_per_view": launches,
        "kernels": [{"name": n, "ms_per_view": ms, "launches_per_view": c} for n, ms, c in top],
    }


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
