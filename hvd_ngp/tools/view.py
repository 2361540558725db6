"""``hvd-ngp-view SNAPSHOT``: the web viewer (viser) of a finished snapshot or checkpoint.

Open the printed address in a browser: the NeRF renders from the browser's camera (the first test view
to start with), at a size that keeps each frame under ``--budget_ms`` while the camera moves and at the
browser's full size once it rests; the training cameras, the scene box and the occupancy grid are drawn
over it. On a cluster node: ``ssh -L PORT:localhost:PORT NODE`` and open http://localhost:PORT
(docs/viewer.md).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, run_cli
from ..options import options_from
from ..training.evaluate import BACKGROUNDS
from ..viewer.server import OVERLAYS, ViewedModel, Viewer
from .trained import load_trained


@dataclass(frozen=True)
class ViewOptions:
    """The command line of ``hvd-ngp-view`` (``main``'s parser holds each option's help)."""

    snapshot: str
    port: int
    host: str
    scene: str | None
    downscale: int | None
    background: str | None
    budget_ms: float
    max_side: int
    device: str
    gpu_memory_gb: float
    serve_s: float  # 0: until Ctrl-C
    show: str  # overlays shown at the start, comma-separated (none: none)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="hvd-ngp-view", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("snapshot", help="snapshot (--save_snapshot) or checkpoint (ckpt-<step>.pt) to look at")
    p.add_argument(
        "--port", type=int, default=8080, help="TCP port (0 or a busy port: the next free one is used and printed)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--scene", default=None, help="scene for the cameras (default: the training scene)")
    p.add_argument("--downscale", type=int, default=None, help="image downscale (default: as in training)")
    p.add_argument(
        "--background",
        choices=tuple(BACKGROUNDS),
        default=None,
        help="background (default: the training run's --eval_background)",
    )
    p.add_argument("--budget_ms", type=float, default=100.0, help="time budget of one frame while the camera moves")
    p.add_argument("--max_side", type=int, default=1920, help="longer side of a frame at most, in pixels")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument(
        "--gpu_memory_gb",
        type=float,
        default=0.0,
        help="GPU memory this process may use; renders are chunked to fit (0: the free memory)",
    )
    p.add_argument(
        "--show",
        default="cameras,box",
        help=f"overlays shown at the start, comma-separated, of {','.join(OVERLAYS)} (none: a bare view)",
    )
    p.add_argument("--serve_s", type=float, default=0.0, help="stop after this many seconds (0: until Ctrl-C)")
    opts = options_from(ViewOptions, p.parse_args(argv))
    if not 0 <= opts.port <= 65535 or opts.budget_ms <= 0 or opts.max_side < 32 or opts.serve_s < 0:
        raise ConfigError(
            f"hvd-ngp-view: --port must be 0-65535, --budget_ms > 0, --max_side >= 32 and "
            f"--serve_s >= 0, got {opts.port}, {opts.budget_ms:g}, {opts.max_side}, {opts.serve_s:g}"
        )

    shown = () if opts.show == "none" else tuple(filter(None, opts.show.split(",")))
    if unknown := [name for name in shown if name not in OVERLAYS]:
        raise ConfigError(f"hvd-ngp-view: --show: unknown overlay {unknown[0]!r} (of {', '.join(OVERLAYS)}, or none)")
    t = load_trained(opts.snapshot, opts.device, opts.scene, opts.downscale, None, opts.gpu_memory_gb)
    t.field.eval()
    background = opts.background or t.cfg.get("eval_background", "white")
    model = ViewedModel(t.field, t.grid, t.march, t.scene, background, fast=t.fast, memory=t.budget)
    viewer = Viewer(
        model,
        opts.host,
        opts.port,
        opts.budget_ms / 1000,
        live=False,
        max_side=opts.max_side,
        title=f"hvd_ngp: {Path(opts.snapshot).name}",
        shown=shown,
    )
    viewer.status(f"**{Path(opts.snapshot).name}**, step {t.step}  \nscene {t.scene.source}")
    print(viewer.describe(), flush=True)
    stop_at = time.monotonic() + opts.serve_s if opts.serve_s else None
    try:
        while stop_at is None or time.monotonic() < stop_at:
            if not viewer.draw():
                time.sleep(0.02)
    except KeyboardInterrupt:
        pass
    finally:
        viewer.close()
    return {"url": viewer.url, "frames": viewer.frames_sent}


def cli(argv: list[str] | None = None) -> None:
    """``hvd-ngp-view``: a user error is one line and exit status 2."""
    run_cli(main, argv, prog="hvd-ngp-view")


if __name__ == "__main__":
    cli()
