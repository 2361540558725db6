"""The python watcher (``viewer.probe.CameraProbe``, ``bench viewer --client python``): its orbit's cameras look
at the scene, and with it connected the live viewer renders and sends frames that decode to the size it chose;
a watched run that gets no frame is an error, not a slowdown of 0."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import tiny_cpu_args

from hvd_ngp.errors import HvdNgpError
from hvd_ngp.viewer.cameras import quaternion_matrix
from hvd_ngp.viewer.probe import Orbit
from hvd_ngp.viewer.resolution import frame_size

WINDOW = (160, 90)


def test_the_orbit_circles_the_centre_looking_at_it_upright():
    orbit = Orbit((1.0, 2.0, 3.0), (4.0, 2.0, 3.0), (0.0, 0.0, 1.0), 0.8, *WINDOW, degrees_per_s=90.0)
    for t, expected in ((0.0, (4.0, 2.0, 3.0)), (1.0, (1.0, 5.0, 3.0)), (2.0, (-2.0, 2.0, 3.0))):
        pose = orbit.pose(t)
        assert np.allclose(pose["position"], expected, atol=1e-9)
        r = quaternion_matrix(pose["wxyz"])
        to_centre = np.subtract((1.0, 2.0, 3.0), expected) / 3.0
        assert np.allclose(r[:, 2], to_centre, atol=1e-9)  # +z (forward) at the centre
        assert np.allclose(r[:, 1], (0.0, 0.0, -1.0), atol=1e-9)  # +y (down) against up
        assert (pose["image_width"], pose["image_height"], pose["type"]) == (*WINDOW, "ViewerCameraMessage")


def bench(scene_cache, tmp_path, *more: str) -> dict:
    """``bench viewer --client python`` on the tiny model (the last frame to tmp_path/last.jpg); its JSON."""
    from hvd_ngp.bench.viewer import main

    out = tmp_path / "viewer.json"
    trainer = tiny_cpu_args(scene_cache, tmp_path / "run", "--n_steps", "150", "--log_every", "150")
    argv = ["--client", "python", "--window", "x".join(map(str, WINDOW)), "--json", str(out)]
    main([*argv, "--last_frame", str(tmp_path / "last.jpg"), *more, "--", *trainer, "--n_eval_views", "1"])
    return json.loads(out.read_text())


def test_the_python_watcher_gets_frames_while_it_orbits_and_the_bench_writes_both_rows(
    scene_cache, tmp_path, monkeypatch
):
    import cv2

    result = bench(scene_cache, tmp_path, "--", "--viewer_share", "0.5")
    assert result["client"] == "python" and "draws nothing" in result["watcher"]
    plain, watched = result["rows"]
    assert (plain["viewer"], watched["viewer"]) == (False, True) and plain["frames"] == 0
    assert plain["steps"] == watched["steps"] == 150 and plain["steps_per_s"] > 0 and watched["steps_per_s"] > 0
    received = watched["received"]
    assert received["error"] is None
    assert (
        3 <= received["frames_received"] <= watched["frames"]
    )  # what the server sent arrived (the last may be in flight)
    assert received["poses_with_frames"] >= 3  # frames kept coming while the camera moved
    assert received["poses_sent"] >= 10 and received["frame_kib_mean"] > 0
    img = cv2.imread(str(tmp_path / "last.jpg"))
    assert img is not None
    h, w = img.shape[:2]
    assert (w, h) == frame_size(max(w, h), WINDOW[0] / WINDOW[1]) and max(w, h) <= WINDOW[0]
    if received["frames_received"] == watched["frames"]:  # the last frame sent is the one decoded
        assert max(w, h) == watched["last_frame_side"]
    assert img.std() > 1.0  # a rendering, not a blank canvas


def test_a_watched_run_without_frames_is_an_error(scene_cache, tmp_path):
    """A client whose camera has no canvas (as before a page lays out: width 0) gets no frame: the bench says so."""
    with pytest.raises(HvdNgpError, match="sent no frame to the python watcher"):
        bench(scene_cache, tmp_path, "--window", "0x90")


def test_a_watcher_that_cannot_connect_says_so_in_one_line():
    from hvd_ngp.bench.viewer import free_port
    from hvd_ngp.viewer.probe import ProbeProcess

    orbit = Orbit((0.0, 0.0, 0.0), (3.0, 0.0, 0.0), (0.0, 0.0, 1.0), 0.8, *WINDOW)
    with pytest.raises(HvdNgpError, match=r"did not start: .*cannot reach ws://127\.0\.0\.1:\d+") as caught:
        ProbeProcess(f"http://127.0.0.1:{free_port()}", orbit)  # nothing listens there
    assert "\n" not in str(caught.value)
