"""The viser server: the NeRF drawn as the browser's background, the scene's cameras, box and occupancy
grid as 3-D overlays, and the side panel (plots, numbers, training buttons).

Only this module imports viser. Frames are rendered on the calling thread (``draw``), so the weights
never change under a render; the browser's camera arrives through viser's own thread.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ..data import Scene
from ..errors import HvdNgpError
from ..model.field import RadianceField
from ..observe.memory import MemoryBudget
from ..render.occupancy import OccupancyGrid
from ..training.evaluate import BACKGROUNDS, ViewRenderer, to_uint8
from ..training.recipe import Marching
from .cameras import camera_frames, look_from, matrix_quaternion, vertical_fov
from .resolution import AdaptiveResolution, frame_size

MAX_FRUSTUMS = 200  # training cameras drawn (evenly spaced through the list)
MAX_GRID_POINTS = 30000  # occupied cells drawn (a seeded subset)
#: what the panel can show over the view: occupied cells, training cameras, scene box
OVERLAYS = ("grid", "cameras", "box")


@dataclass
class ViewedModel:
    """What the viewer draws: a field with its occupancy grid and marching settings, and the scene it learnt
    (cameras, box, up direction). ``fast``: render with the Triton kernels; ``memory``: the render budget."""

    field: RadianceField
    grid: OccupancyGrid
    march: Marching
    scene: Scene
    background: str = "white"
    fast: bool = False
    memory: MemoryBudget | None = None


@dataclass
class Frame:
    """The last frame sent to one browser: its camera (position, wxyz, fov, canvas size), its side, seconds."""

    camera: tuple
    side: int
    seconds: float
    refined: bool


class Viewer:
    """A viser server on ``host:port`` (port 0 or a busy port: the next free one, see ``url``) showing ``model``.

    ``draw()`` renders a frame for each connected browser whose camera moved (``live``: also when the weights
    changed, i.e. every call), at the size ``AdaptiveResolution`` picks for ``budget_s``; when a camera rests,
    a snapshot viewer (not ``live``) refines it once at the canvas size (at most ``max_side``).
    ``on_pause(bool)`` and ``on_save()``: the training buttons (none when not given)."""

    def __init__(
        self,
        model: ViewedModel,
        host: str = "127.0.0.1",
        port: int = 8080,
        budget_s: float = 0.1,
        live: bool = False,
        max_side: int = 1920,
        title: str = "hvd_ngp",
        on_pause: Callable[[bool], None] | None = None,
        on_save: Callable[[], None] | None = None,
        shown: tuple[str, ...] = ("cameras", "box"),
    ) -> None:
        try:
            import viser
        except ImportError:
            raise HvdNgpError("the web viewer needs viser: pip install viser (scripts/requirements.txt)") from None
        self.model, self.live = model, live
        self.resolution = AdaptiveResolution(budget_s, max_side=max_side)
        self.frames: dict[int, Frame] = {}
        self.frames_sent = 0
        self.last_side: int | None = None  # the longer side of the last frame sent
        self.lock = threading.Lock()  # the history, written by the trainer, read by the panel
        self.history: dict[str, list[tuple[int, float]]] = {"loss": [], "train_psnr": [], "test_psnr": []}
        self._renderer: ViewRenderer | None = None
        self.overlays: dict[str, list] = {}  # scene handles: "box", "cameras", "grid"
        self.shown = {name: name in shown for name in OVERLAYS}  # at the start; the panel's checkboxes change it
        self.server = viser.ViserServer(host=host, port=port, label=title, verbose=False)
        self.host = host
        self.port = self.server.get_port()
        scene = model.scene
        up_x, up_y, up_z = (float(v) for v in scene.up)
        self.server.scene.set_up_direction((up_x, up_y, up_z))
        self.server.gui.configure_theme(control_width="medium", show_share_button=False)
        self._place_initial_camera()
        self._add_box()
        self._add_cameras()
        self.update_grid()
        self._build_panel(on_pause, on_save)

    # ------------------------------------------------------------------------------------ set-up

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def describe(self) -> str:
        """A log line: where to point the browser, and the tunnel for a remote node."""
        return (
            f"viewer: {self.url} (from another machine: ssh -L {self.port}:localhost:{self.port} "
            f"{socket.gethostname()}, then http://localhost:{self.port})"
        )

    def _views(self):
        """The frames whose first view the browser starts from: the test split when it has one."""
        scene = self.model.scene
        return scene.test if len(scene.test) else scene.train

    def _place_initial_camera(self) -> None:
        views = self._views()
        centre = self.model.scene.aabb.mean(dim=0).double().numpy()
        position, look_at, up = look_from(views, 0, centre)
        cam = self.server.initial_camera
        cam.fov = vertical_fov(views, 0)
        cam.position, cam.look_at, cam.up = tuple(position), tuple(look_at), tuple(up)

    def _add_box(self) -> None:
        lo, hi = self.model.scene.aabb.double().numpy()
        corners = np.array([[(hi if (i >> a) & 1 else lo)[a] for a in range(3)] for i in range(8)])
        edges = [(i, i | (1 << a)) for i in range(8) for a in range(3) if not (i >> a) & 1]
        self.overlays["box"] = [
            self.server.scene.add_line_segments(
                "/scene_box",
                np.stack([corners[[i, j]] for i, j in edges]),
                colors=(230, 120, 30),
                thickness=2.0,
                thickness_units="screen",
                visible=self.shown["box"],
            )
        ]

    def _add_cameras(self) -> None:
        train = self.model.scene.train
        n = len(train)
        size = float((self.model.scene.aabb[1] - self.model.scene.aabb[0]).norm()) * 0.04
        self.overlays["cameras"] = []
        for k in np.unique(np.linspace(0, n - 1, min(n, MAX_FRUSTUMS)).round().astype(int)):
            c2w = train.c2w[k].double().numpy()
            w, h = train.image_size(int(k))
            self.overlays["cameras"].append(
                self.server.scene.add_camera_frustum(
                    f"/train_cameras/{k:05d}",
                    fov=vertical_fov(train, int(k)),
                    aspect=w / h,
                    scale=size,
                    thickness=size * 0.04,
                    color=(40, 90, 200),
                    wxyz=tuple(matrix_quaternion(c2w[:, :3])),
                    position=tuple(c2w[:, 3]),
                    visible=self.shown["cameras"],
                )
            )

    def update_grid(self) -> None:
        """The occupancy grid's occupied cells of the innermost cascade as points (a seeded subset)."""
        grid = self.model.grid
        cells = torch.nonzero(grid.occupied[0].view(-1)).view(-1)
        if cells.numel() > MAX_GRID_POINTS:
            pick = torch.randperm(cells.numel(), generator=torch.Generator().manual_seed(0))[:MAX_GRID_POINTS]
            cells = cells[pick.to(cells.device)]
        points = grid.cell_positions(cells, torch.full((cells.numel(), 3), 0.5, device=cells.device))
        cell = float(2 * grid.half0.max() / grid.resolution)
        self.overlays["grid"] = [
            self.server.scene.add_point_cloud(
                "/occupancy_grid",
                points.float().cpu().numpy(),
                colors=(120, 120, 120),
                point_size=cell * 0.5,
                point_shape="square",
                visible=self.shown["grid"],
            )
        ]

    def _build_panel(self, on_pause, on_save) -> None:
        gui = self.server.gui
        self._status = gui.add_markdown("starting")
        if on_pause is not None:
            pause = gui.add_button("Pause training", icon=None)
            resume = gui.add_button("Resume training", visible=False)

            def toggle(paused: bool) -> None:
                pause.visible, resume.visible = not paused, paused
                on_pause(paused)

            pause.on_click(lambda _: toggle(True))
            resume.on_click(lambda _: toggle(False))
        if on_save is not None:
            gui.add_button("Save snapshot (checkpoint)").on_click(lambda _: on_save())
        for name, label in (("grid", "Occupancy grid"), ("cameras", "Training cameras"), ("box", "Scene box")):
            box = gui.add_checkbox(label, initial_value=self.shown[name])

            def toggled(event: Any, name: str = name) -> None:
                self._set_visible(name, event.target.value)

            box.on_update(toggled)
        self._plots: dict[str, Any] | None = None
        if self.live:
            empty = (np.zeros(0), np.zeros(0))
            self._plots = {
                "loss": gui.add_uplot(
                    empty,
                    ({"label": "step"}, {"label": "loss", "stroke": "#c0392b"}),
                    title="training loss",
                    aspect=2.0,
                    scales={"y": {"distr": 3}},
                ),
                "psnr": gui.add_uplot(
                    (np.zeros(0),) * 3,
                    (
                        {"label": "step"},
                        {"label": "train PSNR", "stroke": "#2471a3"},
                        {"label": "test PSNR", "stroke": "#27ae60", "spanGaps": True, "points": {"show": True}},
                    ),
                    title="PSNR (dB)",
                    aspect=2.0,
                ),
            }

    def _set_visible(self, name: str, visible: bool) -> None:
        self.shown[name] = visible
        for handle in self.overlays[name]:
            handle.visible = visible

    # ------------------------------------------------------------------------------------ numbers

    def record(self, step: int, values: dict[str, float]) -> None:
        """Numbers to plot at ``step`` (loss, train_psnr, test_psnr)."""
        with self.lock:
            for key, value in values.items():
                if key in self.history and value is not None and math.isfinite(value):
                    self.history[key].append((step, float(value)))
        if self._plots is not None:
            self._update_plots()

    def _update_plots(self) -> None:
        with self.lock:
            loss = np.array(self.history["loss"]).reshape(-1, 2)
            train = dict(self.history["train_psnr"])
            test = dict(self.history["test_psnr"])
        plots = self._plots
        assert plots is not None  # live viewers only
        if len(loss):
            plots["loss"].data = (loss[:, 0], loss[:, 1])
        steps = np.array(sorted(set(train) | set(test)), dtype=np.float64)
        if len(steps):
            plots["psnr"].data = (
                steps,
                np.array([train.get(s, np.nan) for s in steps]),
                np.array([test.get(s, np.nan) for s in steps]),
            )

    def status(self, text: str) -> None:
        self._status.content = text

    # ------------------------------------------------------------------------------------ frames

    def renderer(self) -> ViewRenderer:
        if self._renderer is None:
            m = self.model
            self._renderer = ViewRenderer(
                m.field, m.grid, m.march.render_schedule, m.march.early_termination, m.fast, m.memory
            )
        return self._renderer

    def clients(self) -> dict:
        return self.server.get_clients()

    def draw(self) -> int:
        """Render and send a frame to every browser that needs one (see the class); returns how many."""
        sent = 0
        for cid, client in list(self.clients().items()):
            cam = client.camera
            if cam.image_height <= 0 or cam.image_width <= 0:
                continue  # no camera message yet
            key = (
                tuple(np.round(cam.position, 6)),
                tuple(np.round(cam.wxyz, 6)),
                round(float(cam.fov), 6),
                int(cam.image_width),
                int(cam.image_height),
            )
            last = self.frames.get(cid)
            canvas = max(key[3], key[4])
            if self.live or last is None or last.camera != key:
                side, refined = min(self.resolution.side, canvas), False
            elif not last.refined and not self.live:
                side, refined = min(canvas, self.resolution.max_side), True
            else:
                continue
            seconds = self._send(client, key, side)
            if not refined:
                self.resolution.update(seconds, canvas)
            self.frames[cid] = Frame(key, side, seconds, refined)
            sent += 1
        for gone in set(self.frames) - set(self.clients()):
            del self.frames[gone]
        return sent

    def _send(self, client, key: tuple, side: int) -> float:
        """Render the camera ``key`` with the longer side ``side`` and send it; returns the seconds it took."""
        position, wxyz, fov, cw, ch = key
        w, h = frame_size(side, cw / ch)
        m = self.model
        device = m.field.aabb.device
        started = time.perf_counter()
        was_training = m.field.training
        m.field.eval()
        try:
            frames = camera_frames(position, wxyz, fov, w, h)
            bg = torch.tensor(BACKGROUNDS[m.background], device=device)
            if device.type == "cuda":  # a side stream, after the step's work and before the next step's
                side_stream = self._side_stream()
                side_stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side_stream):
                    img = to_uint8(self.renderer().view(frames, 0, bg))
                torch.cuda.current_stream(device).wait_stream(side_stream)
            else:
                img = to_uint8(self.renderer().view(frames, 0, bg))
        finally:
            m.field.train(was_training)
        client.scene.set_background_image(img, format="jpeg", jpeg_quality=90)
        seconds = time.perf_counter() - started
        self.frames_sent += 1
        self.last_side = max(w, h)
        return seconds

    def _side_stream(self):
        if not hasattr(self, "_stream"):
            self._stream = torch.cuda.Stream(self.model.field.aabb.device)
        return self._stream

    def close(self) -> None:
        self.server.stop()
