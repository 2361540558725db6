"""The snapshot viewer's page in a real headless Chromium against the render tool's image of the same camera.

    python -m hvd_ngp.bench pagecheck SNAPSHOT --device cuda --downscale 4 --out_dir DIR [--json FILE]

Renders the first test view with ``hvd-ngp-render`` (``--downscale``), serves the snapshot with
``hvd-ngp-view`` (its first camera is that view; the canvas is 4:1, so its middle square is the view), opens
the page in headless Chromium (``viewer.browser``), and compares the page's middle with the render: Pearson
correlation of the pixels and PSNR. Passes (exit 0) at correlation >= 0.9 and PSNR >= 18 dB and a page that is
not blank (else exit status 1); writes DIR/viewer.png (the screenshot) and DIR/render.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..options import options_from

#: the page passes at this correlation and PSNR with the render (and a screenshot that is not blank)
PASS_CORRELATION, PASS_PSNR = 0.9, 18.0
VIEWPORT = (960, 240)  # wide: the square in the middle is clear of the panel (right) and notices (left)
ROOT = Path(__file__).resolve().parents[2]


def check_page(
    snapshot: str, out_dir: Path, device: str = "cpu", downscale: int = 2, chromium: str | None = None
) -> dict:
    """Render, serve, screenshot, compare: {"correlation", "psnr", "std", "passed", "screenshot", "render"}."""
    import cv2
    import numpy as np

    from ..tools.render import main as render_main
    from ..viewer.browser import HeadlessChromium

    out_dir.mkdir(parents=True, exist_ok=True)
    render_dir = out_dir / "render"
    render_main(
        ["--load_snapshot", snapshot, "--out_dir", str(render_dir), "--split_views", "1", "--video", "none",
         "--downscale", str(downscale), "--device", device]
    )  # fmt: skip
    rendered = cv2.imread(str(render_dir / "test" / "test_000.png"))
    if rendered is None:
        raise RuntimeError(f"the render tool wrote no {render_dir / 'test' / 'test_000.png'}")
    reference = cv2.cvtColor(rendered, cv2.COLOR_BGR2RGB)
    h_ref = reference.shape[0]
    flat = reference.astype(np.float64).ravel()
    cv2.imwrite(str(out_dir / "render.png"), cv2.cvtColor(reference, cv2.COLOR_RGB2BGR))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    viewer = subprocess.Popen(
        [sys.executable, "-m", "hvd_ngp.tools.view", snapshot, "--port", "0", "--device", device,
         "--downscale", str(downscale), "--max_side", str(4 * h_ref), "--serve_s", "120", "--show", "none"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    result: dict[str, Any] = {"correlation": -1.0, "psnr": 0.0, "std": 0.0, "passed": False}
    try:
        url = None
        assert viewer.stdout is not None
        for line in viewer.stdout:
            if m := re.match(r"viewer: (http://\S+)", line):
                url = m.group(1)
                break
        if url is None:
            raise RuntimeError(f"hvd-ngp-view {snapshot} printed no address (exit {viewer.poll()})")
        with HeadlessChromium(*VIEWPORT, executable=chromium) as browser:
            browser.call(
                "Emulation.setDeviceMetricsOverride", width=VIEWPORT[0], height=VIEWPORT[1], deviceScaleFactor=1,
                mobile=False,
            )  # fmt: skip
            browser.open(url)
            deadline, png = time.monotonic() + 60, b""
            while time.monotonic() < deadline:
                time.sleep(1.0)
                png = browser.screenshot()
                decoded = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
                if decoded is None:
                    continue
                shot = cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB)
                H, W = shot.shape[:2]
                middle = shot[:, (W - H) // 2 : (W - H) // 2 + H]
                seen = cv2.resize(middle, (h_ref, h_ref), interpolation=cv2.INTER_AREA).astype(np.float64)
                corr = float(np.corrcoef(seen.ravel(), flat)[0, 1]) if seen.std() > 0 else -1.0  # blank: not yet
                psnr = 10 * math.log10(255**2 / max(float(np.mean((seen - reference) ** 2)), 1e-9))
                if corr > result["correlation"]:
                    result.update(correlation=corr, psnr=psnr, std=float(seen.std()))
                    (out_dir / "viewer.png").write_bytes(png)
                if corr >= PASS_CORRELATION and psnr >= PASS_PSNR:
                    break
    finally:
        viewer.terminate()
        viewer.wait(20)
    passing = result["correlation"] >= PASS_CORRELATION and result["psnr"] >= PASS_PSNR
    result["passed"] = passing and result["std"] > 10
    result.update(screenshot=str(out_dir / "viewer.png"), render=str(out_dir / "render.png"), device=device)
    return result


@dataclass(frozen=True)
class PageCheckOptions:
    """The command line of ``python -m hvd_ngp.bench pagecheck`` (``main``'s parser holds each option's help)."""

    snapshot: str
    device: str
    downscale: int
    out_dir: str
    json: str | None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m hvd_ngp.bench pagecheck", description=__doc__.split("\n\n")[0])
    p.add_argument("snapshot")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--downscale", type=int, default=2, help="of the first test view (the render tool's)")
    p.add_argument("--out_dir", default="runs/pagecheck")
    p.add_argument("--json", default=None, help="write the result here")
    opts = options_from(PageCheckOptions, p.parse_args(argv))
    result = check_page(opts.snapshot, Path(opts.out_dir), opts.device, opts.downscale)
    print(
        f"viewer page against the render ({opts.device}): correlation {result['correlation']:.3f}, "
        f"PSNR {result['psnr']:.1f} dB -> {'passed' if result['passed'] else 'FAILED'} ({result['screenshot']})"
    )
    if opts.json:
        Path(opts.json).write_text(json.dumps(result, indent=1))
    if not result["passed"]:
        raise SystemExit(1)
    return result
