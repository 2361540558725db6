"""Where the training pixels live: on the device, in (pinned) host memory, or streamed from disk.

- ``StackedPixels`` on the training device (``--preload device``): the padded image stack
  ``[N, H, W, 4]`` as uint8 (or fp16 in [0, 1]); rays gather their colours there.
- ``StackedPixels`` in host memory (``--preload host``): the same stack in pinned memory; the
  sampler draws and gathers each batch on the CPU (in a background thread) and copies it to the
  device asynchronously.
- ``StreamedPixels`` (``--preload stream``): only a window of this rank's shard is decoded, in two
  buffers of ``chunk`` images: one in use, one being decoded by ``--num_workers`` threads. ``rotate``
  swaps them. Memory stays bounded whatever the scene's size.

``plan_placement`` picks one from the decoded size and the memory budgets (``--preload auto``).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError, SceneError
from ..observe.memory import GIB, host_memory_available
from .scene import FrameFiles, Frames
from .shards import image_bytes

PLACEMENTS = ("auto", "device", "host", "stream")


@dataclass(frozen=True)
class Placement:
    """Where the training images go and why."""

    mode: str  # "device" | "host" | "stream"
    nbytes: int  # the decoded stack at the chosen dtype
    device_budget: int  # bytes allowed on the device for images
    host_budget: int  # bytes allowed in host memory for images (per rank)

    def describe(self) -> str:
        return (
            f"{self.mode} ({human_bytes(self.nbytes)} decoded; budgets: device {human_bytes(self.device_budget)}, "
            f"host {human_bytes(self.host_budget)})"
        )


def human_bytes(n: int) -> str:
    """1234567 -> '1.2 MiB'."""
    for unit, scale in (("GiB", GIB), ("MiB", float(1 << 20)), ("KiB", 1024.0)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def plan_placement(
    preload: str,
    sizes: Tensor,
    device: torch.device,
    image_dtype: str = "uint8",
    device_budget_gb: float = 0.0,
    host_budget_gb: float = 0.0,
    local_size: int = 1,
) -> Placement:
    """``--preload auto``: the device if the images fit its budget, else host memory if they fit there,
    else stream from disk. Budgets of 0 mean: a quarter of the GPU's memory; half the available host
    memory shared by the node's ranks. On a CPU device, device and host memory are the same."""
    if preload not in PLACEMENTS:
        raise ConfigError(f"--preload must be one of {', '.join(PLACEMENTS)}, got {preload!r}")
    per_pixel = 4 * (2 if image_dtype == "fp16" else 1)
    nbytes = image_bytes(sizes, per_pixel)
    host = int(host_budget_gb * GIB) if host_budget_gb > 0 else host_memory_available() // 2 // max(local_size, 1)
    if device.type == "cuda":
        dev = (
            int(device_budget_gb * GIB)
            if device_budget_gb > 0
            else torch.cuda.get_device_properties(device).total_memory // 4
        )
    else:
        dev = int(device_budget_gb * GIB) if device_budget_gb > 0 else host
    if preload != "auto":
        return Placement(preload, nbytes, dev, host)
    if nbytes <= dev:
        mode = "device"
    elif nbytes <= host and device.type == "cuda":
        mode = "host"
    else:
        mode = "stream"
    return Placement(mode, nbytes, dev, host)


def _pinned(shape: tuple[int, ...], dtype: torch.dtype, pin: bool) -> Tensor:
    return torch.zeros(shape, dtype=dtype, pin_memory=pin)


def decode_into(frames: Frames, ids: list[int], out: Tensor, pool: ThreadPoolExecutor) -> None:
    """Decode frames ``ids`` into ``out[k]`` (``[K, H, W, 4]`` uint8), checking each size against ``frames.sizes``."""

    files = frames.files
    assert files is not None  # only frames without decoded images are decoded here, and those have their files

    def one(k: int) -> None:
        i = ids[k]
        im = files.read(i)
        w, h = (int(v) for v in frames.sizes[i].tolist())
        if im.shape[:2] != (h, w):
            raise SceneError(
                f"{files.paths[i]}: decoded to {im.shape[1]}x{im.shape[0]} but was "
                f"{w}x{h} when the scene was loaded (the file changed?)"
            )
        out[k].zero_()
        out[k, :h, :w] = torch.from_numpy(im)

    for _ in pool.map(one, range(len(ids))):
        pass


class StackedPixels:
    """Every training image in one padded stack, on the device or in (pinned) host memory."""

    def __init__(
        self, frames: Frames, device: torch.device, on_device: bool, image_dtype: str = "uint8", workers: int = 4
    ) -> None:
        self.on_device = on_device
        self.gather_device = device if on_device else torch.device("cpu")
        pin = (not on_device) and device.type == "cuda"
        self._frames = frames
        if frames.images is not None:
            stack = frames.images.cpu()
            if pin:
                stack = stack.pin_memory()
        else:
            stack = _pinned((len(frames), frames.height, frames.width, 4), torch.uint8, pin)
            with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
                decode_into(frames, list(range(len(frames))), stack, pool)
        self.fp16 = image_dtype == "fp16"
        if self.fp16:  # convert image by image: no second full-size copy at float32
            half = torch.empty(stack.shape, dtype=torch.float16, device=self.gather_device, pin_memory=pin)
            for i in range(stack.shape[0]):
                half[i] = stack[i].to(self.gather_device).to(torch.float16) / 255.0
            stack = half
        self.images = stack.to(self.gather_device)
        self.nbytes = self.images.numel() * self.images.element_size()

    def gather(self, img: Tensor, y: Tensor, x: Tensor) -> Tensor:
        """Colours of pixels (img, y, x) ``[R]`` -> ``[R, 4]`` float32 in [0, 1] on ``gather_device``."""
        v = self.images[img, y, x]
        return v.float() if self.fp16 else v.float() / 255.0

    def resident(self) -> Tensor | None:
        return None  # every image

    def image(self, index: int) -> np.ndarray:
        """One decoded image ``[H, W, 4]`` uint8 (without padding)."""
        w, h = (int(v) for v in self._frames.sizes[index].tolist())
        im = self.images[index, :h, :w]
        return (im.float() * 255.0 + 0.5).to(torch.uint8).cpu().numpy() if self.fp16 else im.cpu().numpy()

    def close(self) -> None:
        pass


class StreamedPixels:
    """A window of ``chunk`` images of this rank's shard in host memory, the next chunk decoding behind it.

    ``set_order(ids)`` starts a new pass (a new epoch's shard) and blocks until its first chunk is
    decoded; ``rotate()`` swaps in the next chunk (waiting for it if decoding is slower than
    training: ``wait_seconds``). When the whole shard fits in one chunk nothing rotates.
    """

    on_device = False
    gather_device = torch.device("cpu")

    def __init__(self, frames: Frames, device: torch.device, chunk: int, workers: int = 4) -> None:
        if frames.files is None:
            raise ConfigError("--preload stream needs image files to decode from")
        self.frames = frames
        self.files: FrameFiles = frames.files
        self.chunk = max(1, int(chunk))
        pin = device.type == "cuda"
        shape = (self.chunk, frames.height, frames.width, 4)
        self.buffers = [_pinned(shape, torch.uint8, pin), _pinned(shape, torch.uint8, pin)]
        self.active = 0
        self.slot_of = torch.full((len(frames),), -1, dtype=torch.long)
        self.ids: list[int] = []
        self.order: list[int] = []
        self.pos = 0
        self.workers = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="hvd_ngp-decode")
        self.loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hvd_ngp-stream")
        self.pending: tuple[Future, list[int]] | None = None
        self.wait_seconds = 0.0
        self.rotations = 0
        self.decoded = 0
        self.nbytes = sum(b.numel() for b in self.buffers)

    def _next_ids(self) -> list[int]:
        n = len(self.order)
        ids = [self.order[(self.pos + k) % n] for k in range(min(self.chunk, n))]
        self.pos = (self.pos + len(ids)) % n
        return ids

    def _submit(self) -> None:
        if len(self.order) <= self.chunk:
            return
        ids = self._next_ids()
        buf = self.buffers[1 - self.active]
        self.pending = (self.loader.submit(decode_into, self.frames, ids, buf, self.workers), ids)

    def _finish(self, ids: list[int]) -> None:
        self.active = 1 - self.active
        self.slot_of.fill_(-1)
        self.slot_of[torch.tensor(ids, dtype=torch.long)] = torch.arange(len(ids))
        self.ids = ids
        self.decoded += len(ids)

    def _drop_pending(self) -> None:
        if self.pending is not None:
            try:
                self.pending[0].result()
            except Exception:  # the chunk is discarded anyway
                pass
            self.pending = None

    def set_order(self, order: list[int]) -> None:
        """A new pass over ``order`` (image ids): decode its first chunk now, the next in the background."""
        if not order:
            raise ConfigError("--preload stream: this rank's shard holds no images")
        self._drop_pending()
        self.order, self.pos = list(order), 0
        ids = self._next_ids()
        t0 = time.perf_counter()
        decode_into(self.frames, ids, self.buffers[1 - self.active], self.workers)
        self.wait_seconds += time.perf_counter() - t0
        self._finish(ids)
        self._submit()

    def rotate(self) -> bool:
        """Swap in the chunk decoded in the background (waits for it); False when the shard is all resident."""
        if self.pending is None:
            return False
        future, ids = self.pending
        t0 = time.perf_counter()
        future.result()  # a decoding error surfaces here, naming the file
        self.wait_seconds += time.perf_counter() - t0
        self.pending = None
        self._finish(ids)
        self.rotations += 1
        self._submit()
        return True

    def resident(self) -> Tensor:
        return torch.tensor(self.ids, dtype=torch.long)

    def gather(self, img: Tensor, y: Tensor, x: Tensor) -> Tensor:
        return self.buffers[self.active][self.slot_of[img], y, x].float() / 255.0

    def image(self, index: int) -> np.ndarray:
        return self.files.read(index)

    def close(self) -> None:
        self._drop_pending()
        self.loader.shutdown(wait=True)
        self.workers.shutdown(wait=True)


def stream_chunk(placement: Placement, sizes: Tensor) -> int:
    """Images per streaming buffer: two buffers within the host budget."""
    one = image_bytes(sizes, 4) // max(len(sizes), 1)  # one slot of the padded stack
    chunk = placement.host_budget // (2 * max(one, 1))
    if chunk < 1:
        raise ConfigError(
            f"--preload stream: the host budget of {placement.host_budget / GIB:.3f} GiB cannot hold two "
            f"decoded images of {one / GIB:.3f} GiB (raise --host_image_budget_gb or --downscale)"
        )
    return int(chunk)
