"""A headless Chromium driven over the DevTools protocol : open a page, take a screenshot
(the viewer's browser test and its slowdown bench).

Uses the system's Chromium (Debian's ``chromium``; scripts/setup.sh installs it with HVD_NGP_BROWSER=1)
and the ``websockets`` package (a dependency of viser); no browser download.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The Chromium executable (``HVD_NGP_CHROMIUM`` or the first of ``CANDIDATES`` on the PATH), else None."""
    named = os.environ.get("HVD_NGP_CHROMIUM")
    if named:
        return named
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


class HeadlessChromium:
    """``with HeadlessChromium(1280, 720) as b: b.open(url); png = b.screenshot()``."""

    def __init__(self, width: int, height: int, executable: str | None = None, start_timeout_s: float = 20.0) -> None:
        from websockets.sync.client import connect

        exe = executable or find_chromium()
        if exe is None:
            raise FileNotFoundError("no Chromium found (apt-get install chromium, or set HVD_NGP_CHROMIUM)")
        self.profile = tempfile.TemporaryDirectory(prefix="hvd_ngp_chromium_", ignore_cleanup_errors=True)
        self.proc = subprocess.Popen(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--disable-extensions",
                "--mute-audio",
                f"--window-size={width},{height}",
                "--remote-debugging-port=0",
                f"--user-data-dir={self.profile.name}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: close() ends its helper processes too
        )
        deadline = time.monotonic() + start_timeout_s
        port = None
        stderr = self.proc.stderr
        assert stderr is not None  # stderr=PIPE
        while port is None and time.monotonic() < deadline:
            line = stderr.readline()
            if not line and self.proc.poll() is not None:
                break
            if m := re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line):
                port = int(m.group(1))
        if port is None:
            self.close()
            raise RuntimeError(f"{exe} did not start its DevTools server within {start_timeout_s:g} s")
        # the stderr pipe must not fill up: drain it in the background
        threading.Thread(target=lambda: [None for _ in stderr], daemon=True).start()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t.get("type") == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
        self.ids = itertools.count(1)

    def call(self, method: str, timeout_s: float = 30.0, **params) -> dict:
        """One DevTools command; its result (events in between are skipped)."""
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            reply = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def screenshot(self) -> bytes:
        """The page as PNG bytes."""
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])

    def close(self) -> None:
        """End the browser and every helper process of its group, then remove its profile. Helpers that outlive
        the main process could still be writing there ("Directory not empty"), so the removal is retried and a
        profile left behind in the temporary folder is not an error."""
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group's helpers (renderer, GPU, crash handler)
        except (ProcessLookupError, PermissionError):
            pass  # none left
        for attempt in range(5):
            try:
                shutil.rmtree(self.profile.name)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.2 * (attempt + 1))
        self.profile.cleanup()  # a no-op once removed; ignore_cleanup_errors covers a profile still in use

    def __enter__(self) -> "HeadlessChromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
