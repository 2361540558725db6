"""A Python stand-in for a browser watching the viewer (``bench viewer --client python``).

``CameraProbe`` connects to the viser server's websocket as viser's web client does (the ``viser-v<version>``
subprotocol; a server of another version closes the connection), sends ``ViewerCameraMessage`` poses along an
orbit around the scene at a steady rate, and counts the background images (the NeRF frames) the server sends
back, with their sizes. It is not a browser: it decodes no images and draws nothing, so it measures the
server's side of a watched run (rendering, encoding, sending), not a page's. ``ProbeProcess`` runs it in a child
process (``python -m hvd_ngp.viewer._probe_child``, which runs ``main``), as a browser is, so its work does not
share the trainer's interpreter.

Wire format (viser 1.x, ``viser/infra/_infra.py``): the client sends one msgpack map per message
(``{"type": "ViewerCameraMessage", ...fields}``); the server sends windows of messages as
``[u64 msgpack size][u64 compressed size][zstd(msgpack {"messages": [...], ...})][binary buffers, 8-aligned]``.
Only this module speaks it; ``server`` stays the only viser importer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import msgspec.msgpack
import numpy as np
import zstandard

from ..errors import HvdNgpError
from ..options import options_from
from .cameras import matrix_quaternion

FRAME_MESSAGE = "BackgroundImageMessage"


@dataclass(frozen=True)
class Orbit:
    """Camera poses around ``centre`` ``[3]``: starting at ``start`` ``[3]`` and turning about the axis ``up``
    ``[3]`` through the centre by ``degrees_per_s``, looking at the centre; vertical ``fov`` radians and a
    ``width`` x ``height`` canvas (pixels)."""

    centre: tuple[float, ...]
    start: tuple[float, ...]
    up: tuple[float, ...]
    fov: float
    width: int
    height: int
    degrees_per_s: float = 30.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Orbit":
        d = json.loads(text)
        centre, start, up = (tuple(float(c) for c in d[k]) for k in ("centre", "start", "up"))
        return cls(centre, start, up, float(d["fov"]), int(d["width"]), int(d["height"]), float(d["degrees_per_s"]))

    def pose(self, t: float) -> dict:
        """The ``ViewerCameraMessage`` fields at ``t`` seconds (OpenCV axes: x right, y down, z forward)."""
        centre, up = np.asarray(self.centre, float), np.asarray(self.up, float)
        k = up / np.linalg.norm(up)
        v = np.asarray(self.start, float) - centre
        a = math.radians(self.degrees_per_s * t)  # Rodrigues: v turned by a about k
        v = v * math.cos(a) + np.cross(k, v) * math.sin(a) + k * np.dot(k, v) * (1 - math.cos(a))
        position = centre + v
        forward = -v / np.linalg.norm(v)
        right = np.cross(-k, forward)
        right /= np.linalg.norm(right)
        down = np.cross(forward, right)
        wxyz = matrix_quaternion(np.stack([right, down, forward], axis=1))
        radius = float(np.linalg.norm(v))
        return {
            "type": "ViewerCameraMessage",
            "wxyz": [float(c) for c in wxyz],
            "position": [float(c) for c in position],
            "fov": float(self.fov),
            "near": 0.01 * radius,
            "far": 100.0 * radius,
            "image_height": int(self.height),
            "image_width": int(self.width),
            "look_at": [float(c) for c in centre],
            "up_direction": [float(c) for c in k],
        }


@dataclass
class ProbeCount:
    """What the probe sent and received. ``frame_bytes``: the encoded size of each frame; ``frame_poses``: the
    number of poses sent before each frame arrived; ``last_frame``: the last frame's (format, encoded bytes)."""

    poses_sent: int = 0
    frame_bytes: list[int] = field(default_factory=list)
    frame_poses: list[int] = field(default_factory=list)
    last_frame: tuple[str, bytes] | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def frames(self) -> int:
        return len(self.frame_bytes)

    def summary(self) -> dict:
        """The numbers for a bench's JSON (no image bytes)."""
        n = self.frames
        return {
            "poses_sent": self.poses_sent,
            "frames_received": n,
            "frame_kib_mean": round(sum(self.frame_bytes) / n / 1024, 2) if n else None,
            "frame_kib_max": round(max(self.frame_bytes) / 1024, 2) if n else None,
            "frames_per_s": round(n / self.seconds, 2) if self.seconds > 0 else None,
            "poses_with_frames": len(set(self.frame_poses)),  # frames arrived after this many different poses
            "seconds": round(self.seconds, 2),
            "error": self.error,
        }


def decode_window(payload: bytes) -> list[dict]:
    """The messages of one server -> client websocket message (viser's hybrid zstd + msgpack format)."""
    size = int.from_bytes(payload[0:8], "little")
    compressed = int.from_bytes(payload[8:16], "little")
    inner = zstandard.ZstdDecompressor().decompress(payload[16 : 16 + compressed], max_output_size=size)
    window = msgspec.msgpack.decode(inner)
    buffers, offset = [], 16 + compressed
    for length in window.get("binaryBufferLengths", ()):
        offset += (8 - offset % 8) % 8
        buffers.append(payload[offset : offset + length])
        offset += length
    messages = window["messages"]
    for m in messages:  # arrays sent as placeholders: the raw bytes back in place
        for key, value in m.items():
            if isinstance(value, dict) and "__binary_index" in value:
                m[key] = buffers[value["__binary_index"]]
    return messages


class CameraProbe:
    """``probe = CameraProbe(url, orbit); probe.start(); ...; count = probe.stop()``: a websocket client on
    its own thread sending ``orbit``'s pose every ``1 / rate_hz`` seconds and counting the frames it gets."""

    def __init__(self, url: str, orbit: Orbit, rate_hz: float = 30.0, connect_timeout_s: float = 20.0) -> None:
        self.url = url.replace("http://", "ws://").replace("https://", "wss://")
        self.orbit, self.period = orbit, 1.0 / rate_hz
        self.connect_timeout_s = connect_timeout_s
        self.count = ProbeCount()
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "CameraProbe":
        """Connect and start sending (returns once the first pose is sent; raises when it cannot connect)."""
        self._thread = threading.Thread(target=self._run, name="hvd_ngp-camera-probe", daemon=True)
        self._thread.start()
        if not self._connected.wait(self.connect_timeout_s + 5) or self.count.error:
            self._stop.set()
            raise ConnectionError(f"camera probe: cannot reach {self.url}: {self.count.error or 'timed out'}")
        return self

    def stop(self) -> ProbeCount:
        """Stop sending, close the connection, return the counts."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        return self.count

    def _run(self) -> None:
        from websockets.exceptions import ConnectionClosed
        from websockets.sync.client import connect
        from websockets.typing import Subprotocol

        try:
            ws = connect(
                self.url,
                subprotocols=[Subprotocol(f"viser-v{version('viser')}")],  # viser's client sends its version
                max_size=None,
                open_timeout=self.connect_timeout_s,
                compression=None,
            )
        except Exception as e:  # noqa: BLE001 - reported by start()
            self.count.error = f"{type(e).__name__}: {e}"
            self._connected.set()
            return
        started = time.monotonic()
        next_pose = started
        try:
            with ws:
                while not self._stop.is_set():
                    now = time.monotonic()
                    if now >= next_pose:
                        ws.send(msgspec.msgpack.encode(self.orbit.pose(now - started)))
                        with self.lock:
                            self.count.poses_sent += 1
                        self._connected.set()
                        next_pose += self.period
                        if next_pose < now:  # fell behind (a long frame): keep the rate, skip the backlog
                            next_pose = now + self.period
                    try:
                        payload = ws.recv(timeout=max(0.0, next_pose - time.monotonic()))
                    except TimeoutError:
                        continue
                    if isinstance(payload, bytes):
                        self._take(payload)
        except ConnectionClosed as e:
            if e.rcvd is None or e.rcvd.code != 1001:  # 1001 "going away": the server stopped (the run ended)
                self.count.error = f"the connection closed ({e})"
        finally:
            self.count.seconds = time.monotonic() - started
            self._connected.set()

    def _take(self, payload: bytes) -> None:
        for m in decode_window(payload):
            if m.get("type") == FRAME_MESSAGE and m.get("rgb_data"):
                data = bytes(m["rgb_data"])
                with self.lock:
                    self.count.frame_bytes.append(len(data))
                    self.count.frame_poses.append(self.count.poses_sent)
                    self.count.last_frame = (str(m.get("format")), data)


class ProbeProcess:
    """``CameraProbe`` in a child process: ``p = ProbeProcess(url, orbit)`` returns once it has sent its first
    pose; ``p.stop()`` ends it and returns its ``ProbeCount.summary()``. ``last_frame``: the child writes the
    last frame it got there (encoded, as sent)."""

    def __init__(self, url: str, orbit: Orbit, rate_hz: float = 30.0, last_frame: str | None = None) -> None:
        root = str(Path(__file__).resolve().parents[2])  # the folder holding hvd_ngp
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        argv = [sys.executable, "-m", "hvd_ngp.viewer._probe_child", url, "--orbit", orbit.to_json()]
        argv += ["--rate_hz", str(rate_hz)] + (["--last_frame", last_frame] if last_frame else [])
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None  # PIPEs
        if self.proc.stdout.readline().strip() != READY:
            _, err = self.proc.communicate(timeout=30)
            lines = err.strip().splitlines()
            raise HvdNgpError(f"the python watcher did not start: {lines[-1] if lines else 'no message'}")

    def stop(self) -> dict:
        try:
            out, err = self.proc.communicate(timeout=30)  # closes the child's stdin: it stops and reports
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise HvdNgpError("the python watcher did not stop within 30 s (killed)") from None
        lines = out.strip().splitlines()
        if self.proc.returncode != 0 or not lines:
            raise HvdNgpError(f"the python watcher failed: {(err.strip().splitlines() or ['no message'])[-1]}")
        return json.loads(lines[-1])


READY = "probe: sending cameras"


@dataclass(frozen=True)
class ProbeOptions:
    """The command line of ``python -m hvd_ngp.viewer._probe_child`` (``main``'s parser holds each option's help)."""

    url: str
    orbit: str  # Orbit's fields as JSON
    rate_hz: float
    last_frame: str | None


def main(argv: list[str] | None = None) -> None:
    """Connect, print ``READY``, send cameras until stdin closes, then print the counts as one JSON line."""
    p = argparse.ArgumentParser(prog="python -m hvd_ngp.viewer._probe_child", description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="the viewer's address (http://HOST:PORT)")
    p.add_argument("--orbit", required=True, help="the orbit: Orbit's fields as a JSON object")
    p.add_argument("--rate_hz", type=float, default=30.0, help="camera messages per second")
    p.add_argument("--last_frame", default=None, help="write the last frame received here (JPEG or PNG bytes)")
    opts = options_from(ProbeOptions, p.parse_args(argv))
    orbit = Orbit.from_json(opts.orbit)
    try:
        probe = CameraProbe(opts.url, orbit, opts.rate_hz).start()
    except ConnectionError as e:
        raise HvdNgpError(str(e)) from None
    print(READY, flush=True)
    sys.stdin.read()  # until the parent closes it
    count = probe.stop()
    if opts.last_frame and count.last_frame is not None:
        Path(opts.last_frame).write_bytes(count.last_frame[1])
    print(json.dumps(count.summary()), flush=True)
