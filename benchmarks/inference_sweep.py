"""Inference settings side by side on one snapshot, in one process (GPU; run.sh step ``inference-sweep``).

    python benchmarks/inference_sweep.py SNAPSHOT --json OUT.json [--settings two_pass:20:32:2,single_pass:20:4:32]

Each setting is ``PATH:LOG2_CHUNK:A:B[:SEGMENT[:STEPS[:MATH[:STOP[:UPDATE[:COUNT[:LOG2_ROWS]]]]]]]``:

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
  kernel) or ``torch`` (the count, the compositing and torch updates: the sequence it replaced);
- ``single_pass``'s count of the network's rows: ``device`` (the default, ``render.infer.DEVICE_ROW_COUNT``: no
  host wait per group) or ``host`` (read before each group's network call, which it sizes exactly);
- ``render.plan.MAX_ROWS`` as a power of two: the most rows per network call, which also bounds the candidates
  written at once (the rays per group are these over the window's width).

Every setting renders one view untimed (its kernels compile there), then the snapshot's test views (``--views``,
all by default) with the render tool (``hvd-ngp-render --video none``) in this process, so each sees compiled
kernels and a warm allocator. Prints a table (seconds per view, after the first view, PSNR) and writes the rows
as JSON. ``--profile N`` then renders N more views inside ``torch.profiler`` (the last setting's path, ray step,
math, stop, update, row count and rows per call; the default windows and chunks) and prints where the
device time went (the kernels, grouped by name, per view) beside the render's time per view: device time well
under it means the host bounds it. ``--trace FILE`` writes that profile's timeline (Chrome trace JSON) there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Iterator, NamedTuple

DEFAULT_SETTINGS = (  # the default first and last (a noise check); two_pass, tf32 math, training's ray step,
    # narrower windows (fewer samples behind surfaces, more iterations), larger chunks
    "single_pass:20:8:128,two_pass:20:32:2,single_pass:20:8:128:::tf32,single_pass:20:8:128::1024,"
    "single_pass:20:4:32,single_pass:20:4:32::1024,single_pass:21:8:128,single_pass:21:4:32::1024,"
    "single_pass:20:8:128"
)


class Setting(NamedTuple):
    """One row of the sweep (see the module docstring); None: the default."""

    path: str
    chunk: int  # log2 of render.plan.MAX_CHUNK_RAYS
    first: int
    growth: int
    segment: int | None
    steps: int | None
    math: str | None
    stop: float | None
    fused: bool  # render.infer.FUSED_UPDATE
    device_count: bool  # render.infer.DEVICE_ROW_COUNT
    rows: int | None  # log2 of render.plan.MAX_ROWS


def parse_setting(text: str) -> Setting:
    path, chunk, first, growth, *more = text.split(":")
    segment, steps, math, stop, update, count, rows = (more + [""] * 7)[:7]
    if update not in ("", "fused", "torch"):
        raise ValueError(f"setting {text!r}: the update is fused or torch, not {update!r}")
    if count not in ("", "device", "host"):
        raise ValueError(f"setting {text!r}: the row count is device or host, not {count!r}")
    return Setting(
        path,
        int(chunk),
        int(first),
        int(growth),
        int(segment) if segment else None,
        int(steps) if steps else None,
        math or None,
        float(stop) if stop else None,
        update != "torch",
        count != "host",
        int(rows) if rows else None,
    )


@contextlib.contextmanager
def applied(setting: Setting, windows: bool = True) -> Iterator[None]:
    """The renderer's module settings of ``setting`` while inside (``windows``: its chunks, windows and march
    segment too), restored after."""
    import dataclasses

    import hvd_ngp.render.fast as fast
    import hvd_ngp.render.infer as infer
    import hvd_ngp.render.plan as plan

    names = [(infer, "FUSED_UPDATE"), (infer, "DEVICE_ROW_COUNT"), (plan, "MAX_ROWS")]
    values: list[object] = [
        setting.fused,
        setting.device_count,
        plan.MAX_ROWS if setting.rows is None else 1 << setting.rows,
    ]
    if windows:
        launch = fast.INFERENCE_LAUNCH
        names += [(plan, "MAX_CHUNK_RAYS"), (fast, "INFERENCE_LAUNCH")]
        values += [
            1 << setting.chunk,
            launch if setting.segment is None else dataclasses.replace(launch, segment=setting.segment),
        ]
        if setting.path == "two_pass":
            names += [(fast, "FIRST_WINDOW"), (fast, "WINDOW_GROWTH")]
            values += [setting.first, setting.growth]
        else:
            names.append((infer, "WINDOWS"))
            values.append(infer.InferenceWindows(setting.first, setting.growth))
    saved = [getattr(module, name) for module, name in names]
    try:
        for (module, name), value in zip(names, values):
            setattr(module, name, value)
        yield
    finally:
        for (module, name), value in zip(names, saved):
            setattr(module, name, value)


def render_flags(steps: int | None, math: str | None, stop: float | None) -> list[str]:
    """The render tool's flags for a setting's ray step, math and stop (none where the setting keeps them)."""
    marching: dict[str, float] = {} if steps is None else {"eval_steps_per_diagonal": steps}
    marching |= {} if stop is None else {"early_termination": stop}
    flags = ["--marching", json.dumps(marching)] if marching else []
    return flags + ([] if math is None else ["--inference_math", math])


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("snapshot")
    p.add_argument(
        "--settings",
        default=DEFAULT_SETTINGS,
        help="comma-separated PATH:LOG2_CHUNK:A:B[:SEGMENT[:STEPS[:MATH[:STOP[:UPDATE[:COUNT[:LOG2_ROWS]]]]]]] (A:B: the windows)",
    )
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--views", type=int, default=-1, help="test views per setting (-1: all)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="as the render tool's")
    p.add_argument("--profile", type=int, default=0, help="views rendered under the profiler after the sweep")
    p.add_argument("--trace", default=None, help="with --profile: write the profile's timeline (Chrome trace) here")
    opts = p.parse_args(argv)
    settings = [parse_setting(t) for t in opts.settings.split(",")]

    import hvd_ngp.render.fast as fast
    import hvd_ngp.render.plan as plan
    from hvd_ngp.render.volume import INFERENCE_MATH
    from hvd_ngp.tools import render

    out = Path(tempfile.mkdtemp(prefix="inference_sweep_"))
    base = ["--load_snapshot", opts.snapshot, "--video", "none", "--out_dir", str(out), "--device", opts.device]
    rows = []
    for st in settings:
        with applied(st):
            # one view first under this setting: a new march launch compiles its own kernel variants, which
            # otherwise land in the timed views (the first H100 sweep of 2026-12-07 read 0.058 for 0.034 s)
            marching = render_flags(st.steps, st.math, st.stop)
            render.main([*base, *marching, "--inference", st.path, "--split_views", "1"])
            render.main([*base, *marching, "--inference", st.path, "--split_views", str(opts.views)])
            segment, max_rows = fast.INFERENCE_LAUNCH.segment, plan.MAX_ROWS
        result = json.loads((out / "render.json").read_text())
        rows.append(
            {
                "path": st.path,
                "chunk_rays": 1 << st.chunk,
                # two_pass: first window, growth; else first, most (InferenceWindows)
                "windows": f"{st.first}:{st.growth}",
                "segment": segment,
                "steps_per_diagonal": st.steps,
                "math": st.math or INFERENCE_MATH,  # asked for: the Triton backends' (a torch field ignores it)
                "early_termination": st.stop,  # None: the snapshot's
                "update": "fused" if st.fused else "torch",
                "row_count": "device" if st.device_count else "host",
                "max_rows": max_rows,
                "seconds_per_view": result["test_seconds_per_view"],
                "seconds_per_view_after_first": result["test_seconds_per_view_after_first"],
                "psnr": result["test_psnr"],
            }
        )
    print(
        "| path | chunk | windows | segment | ray steps | math | stop | update | row count | rows | s per view | "
        "after the first | PSNR |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['path']} | 2^{r['chunk_rays'].bit_length() - 1} | {r['windows']} | {r['segment']} | "
            f"{r['steps_per_diagonal'] or 'snapshot'} | {r['math'] or '-'} | {r['early_termination'] or 'snapshot'} | "
            f"{r['update']} | {r['row_count']} | 2^{r['max_rows'].bit_length() - 1} | "
            f"{r['seconds_per_view']:.4f} | {r['seconds_per_view_after_first']:.4f} | {r['psnr']:.3f} |"
        )
    profile = profile_views(base, out, settings[-1], opts.profile, opts.trace) if opts.profile > 0 else None
    if opts.json:
        Path(opts.json).write_text(json.dumps({"rows": rows, "profile": profile} if profile else rows, indent=1))
    return rows


def profile_views(base: list[str], out: Path, setting: Setting, views: int, trace: str | None = None) -> dict:
    """Render ``views`` test views under ``setting`` (its path, ray step, math, stop, update, row count and rows per
    call) in ``torch.profiler``: the device's time per view by kernel name (the top 15 and the rest; on a machine
    without CUDA the CPU operators' own time) beside the render's own seconds per view (the render tool's ``render.json``), and for the
    ``single_pass`` renderers the rays, iterations, network rows and composited samples per view; prints a table."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import hvd_ngp.render.infer as infer
    from hvd_ngp.tools import render

    args = [*base, *render_flags(setting.steps, setting.math, setting.stop), "--inference", setting.path]
    args += ["--split_views", str(views)]
    cuda = torch.cuda.is_available() and "cpu" not in base
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    stats, rays, plain = infer.InferenceStats(), [0], infer.render_rays_single_pass

    def counted(rgb_sigma_fn, sigma_fn, origins, *more, **kw):
        rays[0] += origins.shape[0]
        return plain(rgb_sigma_fn, sigma_fn, origins, *more, **{**kw, "stats": stats})

    infer.render_rays_single_pass = counted  # volume.inference_path looks it up at each render
    try:
        with applied(setting, windows=False), profile(activities=activities) as prof:
            render.main(args)
    finally:
        infer.render_rays_single_pass = plain
    if trace:
        prof.export_chrome_trace(trace)
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
        "network_rows_per_ray": int(stats.network_rows) / max(rays[0], 1),
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
