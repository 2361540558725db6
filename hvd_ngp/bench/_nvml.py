"""GPU utilization and energy from NVML through ctypes (the driver's libnvidia-ml; no Python package).

Everything returns None where NVML or a GPU is missing, so CPU runs report "n/a".
"""

from __future__ import annotations

import ctypes
import threading
import time

import torch


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def _library():
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    return lib if lib.nvmlInit_v2() == 0 else None


def _handle(lib, device: torch.device):
    """NVML handle of a CUDA device (by UUID, so CUDA_VISIBLE_DEVICES renumbering does not matter)."""
    handle = ctypes.c_void_p()
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is not None and lib.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}".encode(), ctypes.byref(handle)) == 0:
        return handle
    if lib.nvmlDeviceGetHandleByIndex_v2(device.index or 0, ctypes.byref(handle)) == 0:
        return handle
    return None


class GpuMonitor:
    """Samples utilization (and power) of one GPU in a thread between ``start()`` and ``stop()``.

    ``stop()`` returns {"util_percent": mean, "energy_j": joules} (None entries where unavailable):
    energy from the driver's cumulative counter (Volta and newer), else power samples x time.
    """

    def __init__(self, device: torch.device, interval_s: float = 0.2) -> None:
        self.lib = _library() if device.type == "cuda" else None
        self.handle = _handle(self.lib, device) if self.lib is not None else None
        self.interval_s = interval_s
        self.util: list[int] = []
        self.power_w: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _energy_mj(self) -> int | None:
        value = ctypes.c_ulonglong()
        ok = self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(value)) == 0
        return int(value.value) if ok else None

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            u, p = _Utilization(), ctypes.c_uint()
            if self.lib.nvmlDeviceGetUtilizationRates(self.handle, ctypes.byref(u)) == 0:
                self.util.append(int(u.gpu))
            if self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(p)) == 0:
                self.power_w.append(p.value / 1000.0)

    def start(self) -> "GpuMonitor":
        self._t0 = time.perf_counter()
        if self.handle is not None:
            self._e0 = self._energy_mj()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> dict:
        if self._thread is None:
            return {"util_percent": None, "energy_j": None}
        self._stop.set()
        self._thread.join()
        elapsed = time.perf_counter() - self._t0
        e1 = self._energy_mj()
        if self._e0 is not None and e1 is not None:
            energy = (e1 - self._e0) / 1000.0
        else:
            energy = sum(self.power_w) / len(self.power_w) * elapsed if self.power_w else None
        util = sum(self.util) / len(self.util) if self.util else None
        return {"util_percent": util, "energy_j": energy}
