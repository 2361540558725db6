"""``python -m hvd_ngp.bench viewer [trainer flags]``: training speed with and without a watcher.

Trains twice in this process (size 1) with the same flags: once plain, once with ``--viewer`` on a free port
and a watcher connected, so frames are rendered and sent all along. The watcher (``--client``) is a headless
Chromium (the system's) showing the page, or ``python``: ``viewer.probe.ProbeProcess``, a websocket client in
a child process (as a browser is) sending a browser's camera messages along an orbit (30 Hz) and counting the
frames it gets back - it decodes and draws nothing, so it stands in for a browser on the server's side only
(for machines without Chromium).
Prints a table (steps/s, the slowdown, frames sent) and writes JSON (``--json``; ``client`` names the
watcher). A watched run that sends no frame is an error. On a GPU machine:
``python -m hvd_ngp.bench viewer --json viewer.json -- --scene ../shared/data/nerf_synthetic/lego --n_steps 3000``.
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..cluster import dist
from ..config import parse_settings
from ..errors import HvdNgpError
from ..options import options_from
from ..training.trainer import run
from ..viewer.browser import HeadlessChromium
from ..viewer.cameras import look_from, vertical_fov
from ..viewer.live import LiveViewer
from ..viewer.probe import Orbit, ProbeProcess

CLIENTS = {
    "chromium": "headless Chromium showing the viewer page",
    "python": "Python websocket client sending a browser's camera messages along an orbit; decodes and draws nothing",
}


def orbit_of(scene, width: int, height: int) -> Orbit:
    """The python watcher's orbit: from the first test view (else train view) around the scene box's centre."""
    views = scene.test if len(scene.test) else scene.train
    centre = scene.aabb.mean(dim=0).double().numpy()
    position, _, _ = look_from(views, 0, centre)
    return Orbit(
        tuple(centre), tuple(position), tuple(float(v) for v in scene.up), vertical_fov(views, 0), width, height
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class ViewerBenchOptions:
    """The command line of ``python -m hvd_ngp.bench viewer`` (``main``'s parser holds each option's help)."""

    json: str | None
    window: str  # WIDTHxHEIGHT
    client: str  # a key of CLIENTS
    rate_hz: float
    last_frame: str | None
    trainer: list[str]  # trainer flags


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m hvd_ngp.bench viewer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--window", default="1280x720", help="browser window (or the python client's canvas) WxH")
    p.add_argument(
        "--client",
        choices=sorted(CLIENTS),
        default="chromium",
        help="the watcher: " + "; ".join(f"{k}: {v}" for k, v in CLIENTS.items()),
    )
    p.add_argument("--rate_hz", type=float, default=30.0, help="camera messages per second (--client python)")
    p.add_argument("--last_frame", default=None, help="--client python: write the last frame it got here (JPEG)")
    p.add_argument("trainer", nargs=argparse.REMAINDER, help="trainer flags (after --)")
    opts = options_from(ViewerBenchOptions, p.parse_args(argv))
    flags = [f for f in opts.trainer if f != "--"]
    width, height = (int(v) for v in opts.window.split("x"))
    rows = []
    for watched in (False, True):
        port = free_port()
        settings = parse_settings([*flags, "--save_renders", "0"] + (["--viewer", str(port)] if watched else []))
        view = settings.viewer
        live: list[LiveViewer] = []
        browser: list[HeadlessChromium] = []
        probe: list[ProbeProcess] = []

        def attach(tr):
            live.append(LiveViewer(tr, "127.0.0.1", port, view.viewer_budget_ms / 1000, view.viewer_share))
            if opts.client == "python":
                orbit = orbit_of(tr.scene, width, height)
                probe.append(ProbeProcess(live[0].viewer.url, orbit, opts.rate_hz, opts.last_frame))
            else:
                b = HeadlessChromium(width, height)
                b.open(live[0].viewer.url)
                browser.append(b)
            deadline = time.monotonic() + 30  # training starts once the watcher has connected
            while not live[0].viewer.clients() and time.monotonic() < deadline:
                time.sleep(0.1)
            return live[0]

        started = time.perf_counter()
        try:
            result = run(settings, attach=attach if watched else None)
        finally:
            for b in browser:
                b.close()
            received = [c.stop() for c in probe]
        m = result.metrics
        rows.append(
            {
                "viewer": watched,
                "steps": m["steps"],
                "train_seconds": m["train_seconds"],
                "steps_per_s": m["steps"] / m["train_seconds"],
                "wall_s": round(time.perf_counter() - started, 2),
                "frames": live[0].viewer.frames_sent if live else 0,
                "last_frame_side": live[0].viewer.last_side if live else None,
                "device": m["device"],
                "test_psnr": m["test_psnr"],
                **({"received": received[0]} if received else {}),
            }
        )
        if watched and not rows[-1]["frames"]:
            raise HvdNgpError(
                f"bench viewer: the viewer sent no frame to the {opts.client} watcher in {rows[-1]['steps']} steps "
                f"({received[0] if received else 'is the page loading?'}): no slowdown to report"
            )
    slowdown = 1 - rows[1]["steps_per_s"] / rows[0]["steps_per_s"]
    out = {
        "client": opts.client,
        "watcher": CLIENTS[opts.client],
        "rows": rows,
        "slowdown": slowdown,
        "viewer_share": view.viewer_share,
        "viewer_budget_ms": view.viewer_budget_ms,
        "flags": flags,
    }
    if dist.runtime().is_root:
        print(f"{'viewer':>8} {'steps':>6} {'train s':>8} {'steps/s':>8} {'frames':>7} {'side':>5}  device")
        for r in rows:
            print(
                f"{'on' if r['viewer'] else 'off':>8} {r['steps']:>6} {r['train_seconds']:>8.2f} "
                f"{r['steps_per_s']:>8.2f} {r['frames']:>7} {str(r['last_frame_side'] or '-'):>5}  {r['device']}"
            )
        print(
            f"slowdown with a {opts.client} watcher ({CLIENTS[opts.client]}): {100 * slowdown:.1f}% (frames may take {100 * view.viewer_share:g}% "
            f"of the time)"
        )
        print(json.dumps(out))
        if opts.json:
            Path(opts.json).write_text(json.dumps(out, indent=1))
    return out
