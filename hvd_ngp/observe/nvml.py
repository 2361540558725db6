"""GPU utilisation, memory and power of this rank's GPU from NVML, sampled in a background thread.

NVML queries the driver, not a CUDA stream, so sampling never synchronises the host with the
GPU and the training loop never waits for it. ``nvidia-ml-py`` (module ``pynvml``) is imported
lazily: without it, without a GPU or without a driver the sampler is simply unavailable and the
metrics say "n/a".
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class GpuReading:
    """One log interval of one GPU; ``None`` where NVML cannot tell."""

    util_pct: float | None  # mean of the samples (NVML's own utilisation is a 1/6-1 s average)
    mem_used_bytes: float | None  # largest sample (all processes on the GPU, like nvidia-smi)
    mem_total_bytes: float | None
    power_w: float | None  # mean of the samples
    energy_j: float | None  # the driver's energy counter over the interval, else mean power x seconds
    samples: int


class GpuSampler:
    """Samples one CUDA device every ``period_s`` seconds; ``begin()``/``take()`` bracket an interval,
    ``pause()``/``resume()`` leave a stretch of it out (evaluation).

    ``nvml`` is the ``pynvml`` module (injectable for tests). ``available`` is False, with the
    reason in ``why_unavailable``, when there is nothing to sample.
    """

    def __init__(self, device: torch.device, period_s: float = 0.5, nvml: Any = None) -> None:
        self.period_s = period_s
        self.available = False
        self.why_unavailable = ""
        self.uuid = ""
        self._nvml = nvml
        self._handle = None
        self._unsupported: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mem_max: float | None = None  # interval state, set by _reset
        self._mem_total: float | None = None
        self._energy_start: float | None = None
        self._paused_at: float | None = None
        self._pause_energy: float | None = None
        try:
            self._open(device)
            self.available = True
        except _Unavailable as exc:
            self.why_unavailable = str(exc)
        self._reset(time.perf_counter())

    # -------------------------------------------------------------------------- lifecycle

    def _open(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise _Unavailable("no GPU")
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                raise _Unavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:
            raise _Unavailable(f"NVML did not start: {exc}") from None
        index = device.index if device.index is not None else torch.cuda.current_device()
        try:
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            self.uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid
            self._handle = nvml.nvmlDeviceGetHandleByUUID(self.uuid)
        except Exception:
            # Older torch without .uuid: map the CUDA index through CUDA_VISIBLE_DEVICES (integers only).
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            ids = [v.strip() for v in visible.split(",") if v.strip()]
            physical = int(ids[index]) if index < len(ids) and ids[index].isdigit() else index
            try:
                self._handle = nvml.nvmlDeviceGetHandleByIndex(physical)
                self.uuid = self.uuid or f"index-{physical}"
            except Exception as exc:
                raise _Unavailable(f"NVML cannot find CUDA device {index}: {exc}") from None

    def start(self) -> None:
        """Begin the first interval and start the sampling thread (no-op when unavailable)."""
        self.begin()
        if self.available and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hvd_ngp-nvml", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.period_s + 1)
            self._thread = None
        if self.available:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self.available = False

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    # -------------------------------------------------------------------------- measurements

    def _query(self, what: str, fn: Callable[[], float]) -> float | None:
        """One NVML query; a metric this GPU does not support (MIG, old boards) is not asked again."""
        if what in self._unsupported:
            return None
        try:
            return float(fn())
        except Exception:
            self._unsupported.add(what)
            return None

    def _energy_mj(self) -> float | None:
        if not self.available:
            return None
        return self._query("energy", lambda: self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def sample(self) -> None:
        """Take one sample now (the thread calls this every ``period_s``; skipped while paused)."""
        if not self.available or self._paused_at is not None:
            return
        nvml, h = self._nvml, self._handle
        util = self._query("util", lambda: nvml.nvmlDeviceGetUtilizationRates(h).gpu)
        mem = self._query("mem", lambda: nvml.nvmlDeviceGetMemoryInfo(h).used)
        total = self._query("mem_total", lambda: nvml.nvmlDeviceGetMemoryInfo(h).total)
        power = self._query("power", lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0)  # mW -> W
        with self._lock:
            self._count += 1
            if util is not None:
                self._util_sum += util
                self._util_n += 1
            if mem is not None:
                self._mem_max = max(self._mem_max or 0.0, mem)
            if total is not None:
                self._mem_total = total
            if power is not None:
                self._power_sum += power
                self._power_n += 1

    def _reset(self, now: float) -> None:
        with self._lock:
            self._count = 0
            self._util_sum = self._power_sum = 0.0
            self._util_n = self._power_n = 0
            self._mem_max = None
            self._mem_total = None
            self._started = now
            self._energy_start = None
            self._paused_at = None
            self._paused_s = 0.0
            self._pause_energy = None
            self._excluded_mj = 0.0

    def begin(self) -> None:
        """Start a new interval: forget earlier samples (evaluation, start-up) and read the energy counter."""
        self._reset(time.perf_counter())
        self._energy_start = self._energy_mj()

    def pause(self) -> None:
        """Stop counting (samples and energy) until ``resume()``."""
        self._pause_energy = self._energy_mj()
        with self._lock:
            self._paused_at = time.perf_counter()

    def resume(self) -> None:
        energy = self._energy_mj()
        with self._lock:
            if self._paused_at is not None:
                self._paused_s += time.perf_counter() - self._paused_at
            self._paused_at = None
            if energy is not None and self._pause_energy is not None:
                self._excluded_mj += energy - self._pause_energy

    def take(self) -> GpuReading:
        """This interval's reading (one extra sample is taken now, so short intervals have one too)."""
        self.sample()
        energy_end = self._energy_mj()
        with self._lock:
            seconds = time.perf_counter() - self._started - self._paused_s
            util = self._util_sum / self._util_n if self._util_n else None
            power = self._power_sum / self._power_n if self._power_n else None
            energy: float | None
            if energy_end is not None and self._energy_start is not None:
                energy = (energy_end - self._energy_start - self._excluded_mj) / 1000.0  # mJ -> J
            else:
                energy = power * seconds if power is not None else None
            return GpuReading(util, self._mem_max, self._mem_total, power, energy, self._count)


class _Unavailable(Exception):
    pass
