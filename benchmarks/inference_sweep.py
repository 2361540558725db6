"""Inference settings side by side on one snapshot, in one process (GPU; run.sh step ``inference-sweep``).

    python benchmarks/inference_sweep.py SNAPSHOT --json OUT.json [--settings two_pass:20:32:2,single_pass:20:16:2]

Each setting is ``PATH:LOG2_CHUNK:FIRST_WINDOW:GROWTH``: the inference path (``render.volume.INFERENCE_PATHS``),
``render.plan.MAX_CHUNK_RAYS`` as a power of two, ``render.fast.FIRST_WINDOW`` and ``render.fast.WINDOW_GROWTH``
(the last two are ``two_pass``'s). After one warm-up view, every setting renders the snapshot's test views
(``--views``, all by default) with the render tool (``hvd-ngp-render --video none``) in this process, so each sees the same
compiled kernels and a warm allocator. Prints a table (seconds per view, after the first view, PSNR) and writes
the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

DEFAULT_SETTINGS = (
    "two_pass:18:16:2,two_pass:20:16:2,two_pass:20:32:2,two_pass:20:64:2,two_pass:20:32:4,single_pass:20:16:2"
)


def parse_setting(text: str) -> tuple[str, int, int, int]:
    path, chunk, first, growth = text.split(":")
    return path, int(chunk), int(first), int(growth)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("snapshot")
    p.add_argument("--settings", default=DEFAULT_SETTINGS, help="comma-separated PATH:LOG2_CHUNK:FIRST:GROWTH")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--views", type=int, default=-1, help="test views per setting (-1: all)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="as the render tool's")
    opts = p.parse_args(argv)
    settings = [parse_setting(t) for t in opts.settings.split(",")]

    import hvd_ngp.render.fast as fast
    import hvd_ngp.render.plan as plan
    from hvd_ngp.tools import render

    out = Path(tempfile.mkdtemp(prefix="inference_sweep_"))
    base = ["--load_snapshot", opts.snapshot, "--video", "none", "--out_dir", str(out), "--device", opts.device]
    render.main([*base, "--split_views", "1"])  # kernels compile outside the timed renders
    rows = []
    defaults = plan.MAX_CHUNK_RAYS, fast.FIRST_WINDOW, fast.WINDOW_GROWTH
    try:
        for path, chunk, first, growth in settings:
            plan.MAX_CHUNK_RAYS, fast.FIRST_WINDOW, fast.WINDOW_GROWTH = 1 << chunk, first, growth
            render.main([*base, "--inference", path, "--split_views", str(opts.views)])
            result = json.loads((out / "render.json").read_text())
            rows.append(
                {
                    "path": path,
                    "chunk_rays": 1 << chunk,
                    "first_window": first,
                    "growth": growth,
                    "seconds_per_view": result["test_seconds_per_view"],
                    "seconds_per_view_after_first": result["test_seconds_per_view_after_first"],
                    "psnr": result["test_psnr"],
                }
            )
    finally:
        plan.MAX_CHUNK_RAYS, fast.FIRST_WINDOW, fast.WINDOW_GROWTH = defaults
    print("| path | chunk | first window | growth | s per view | after the first | PSNR |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['path']} | 2^{r['chunk_rays'].bit_length() - 1} | {r['first_window']} | {r['growth']} | "
            f"{r['seconds_per_view']:.4f} | {r['seconds_per_view_after_first']:.4f} | {r['psnr']:.3f} |"
        )
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
