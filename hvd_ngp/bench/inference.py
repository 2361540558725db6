"""The inference rows of ``bench throughput``: one view of the trained field rendered by the fast renderer's
two inference paths side by side (``render.volume.INFERENCE_PATHS``: the two-pass ``fast.render_rays_fast``
and the single-pass ``infer.render_rays_single_pass`` under each ``--inference_windows``).

The view: the first test camera with its longer side scaled to ``--inference_size`` (800: lego's own size).
Per path: ms per view (``repeat`` renders after one warm-up, the device synchronised), rays/s, network rows
per ray (density and colour calls alike), the largest pixel difference from the two-pass render (max abs diff) and the
PSNR against the test image when the view is at its own size. The single pass's stage breakdown (march,
network, composite, compaction, host waits) comes from CUDA events (``observe.profiling.StageTimer``) in
one more render: its host waits are the device's idle time while the host reads a count back.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from ..data import Frames
from ..data.sampler import image_rays
from ..observe.metrics import mse_to_psnr
from ..observe.profiling import NULL_TIMER, StageTimer
from ..render.camera_path import CameraPath
from ..render.fast import render_rays_fast
from ..render.infer import InferenceStats, InferenceWindows, render_rays_single_pass
from ..render.volume import render_in_chunks
from ..tools.render import path_frames
from ..training.evaluate import ViewRenderer, reference_view
from ..training.trainer import Trainer


def bench_camera(frames: Frames, size: int) -> tuple[Frames, bool]:
    """The first camera of ``frames`` with its longer side at ``size`` pixels -> (one-camera Frames, whether
    that is the image's own size)."""
    w, h = frames.image_size(0)
    k = size / max(w, h)
    if k == 1.0:
        return frames, True
    cams = CameraPath(frames.c2w[:1], frames.intrinsics[:1] * k, (max(1, round(w * k)), max(1, round(h * k))))
    return path_frames(cams), False


def synced(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def bench_inference(tr: Trainer, size: int, repeat: int, windows: list[InferenceWindows]) -> dict:
    """The paths' rows and the single pass's stages on ``tr``'s trained field (its averaged weights, in eval
    mode, on black) -> {"size": [w, h], "rows": [...], "stages_ms": {...}, "windows": "F:M"}."""
    dev = tr.field.aabb.device
    frames, own = bench_camera(tr.scene.test, size)
    o, d = image_rays(frames, 0, dev)
    n_rays = o.shape[0]
    black = torch.zeros(3, device=dev)
    schedule, eps = tr.march.render_schedule, tr.march.early_termination
    was_training = tr.field.training
    rows: list[dict[str, Any]] = []
    images: dict[str, Tensor] = {}  # path name -> its render
    stages: dict[str, float] = {}
    with tr.averaged_weights(), torch.no_grad():
        tr.field.eval()
        view = ViewRenderer(tr.field, tr.grid, schedule, eps, fast=True, budget=tr.memory)
        assert view.workspace is not None  # a fast renderer without model parallelism plans its workspace
        workspace, chunk = view.workspace, view.workspace.plan.rays
        network_rows = [0]

        def counted(fn):
            def call(x: Tensor, *rest, **kw):
                network_rows[0] += x.shape[0]
                return fn(x, *rest, **kw)

            return call

        field, density = counted(tr.field), counted(tr.field.density)

        def two_pass(ob: Tensor, db: Tensor, j: Tensor | None):
            return render_rays_fast(field, density, ob, db, tr.field.aabb, tr.grid, schedule, eps, workspace, j)

        def single_pass(w: InferenceWindows, stats: InferenceStats | None = None, timer: StageTimer = NULL_TIMER):
            def render(ob: Tensor, db: Tensor, j: Tensor | None):
                return render_rays_single_pass(
                    field,
                    density,
                    ob,
                    db,
                    tr.field.aabb,
                    tr.grid,
                    schedule,
                    eps,
                    workspace,
                    j,
                    windows=w,
                    timer=timer,
                    stats=stats,
                )

            return render

        paths = [("two_pass", two_pass, None)] + [
            (f"single_pass {w.first}:{w.most}", single_pass(w), w) for w in windows
        ]
        for name, render, w in paths:
            stats = InferenceStats()
            images[name] = render_in_chunks(render if w is None else single_pass(w, stats), o, d, black, chunk)[0]
            network_rows[0] = 0
            synced(dev)
            t0 = time.perf_counter()
            for _ in range(repeat):
                render_in_chunks(render, o, d, black, chunk)
            synced(dev)
            seconds = (time.perf_counter() - t0) / repeat
            row = {
                "path": name,
                "ms/view": seconds * 1e3,
                "M rays/s": n_rays / seconds / 1e6,
                "network rows/ray": network_rows[0] / repeat / n_rays,
                "iterations": stats.iterations if w is not None else None,
                "max abs diff vs two_pass": float((images[name] - images["two_pass"]).abs().max()),
            }
            if own:
                gt = reference_view(frames, 0, "std", black)
                row["PSNR"] = mse_to_psnr(float(torch.mean((images[name].clamp(0, 1) - gt) ** 2)))
            rows.append(row)
        if windows:
            timer = StageTimer(dev)
            timer.start()
            render_in_chunks(single_pass(windows[0], timer=timer), o, d, black, chunk)
            timer.collect()
            stages = timer.mean_ms()
    tr.field.train(was_training)
    for row in rows:
        row["speed vs two_pass"] = rows[0]["ms/view"] / row["ms/view"]
    w_, h_ = frames.image_size(0)
    return {
        "size": [w_, h_],
        "rays": n_rays,
        "repeat": repeat,
        "rows": rows,
        "stages_ms": stages,
        "stage_windows": f"{windows[0].first}:{windows[0].most}" if windows else None,
    }
