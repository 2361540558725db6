"""A stand-in for ``pynvml`` with known readings, so the NVML code paths run on machines without a GPU."""

from __future__ import annotations

from types import SimpleNamespace


class FakeNvml:
    """One GPU: utilisation ``util`` %, ``mem_used``/``mem_total`` bytes, ``power_w`` W, and an energy
    counter that advances ``joules_per_read`` J per read (None: the GPU has no energy counter)."""

    def __init__(
        self,
        util: float = 80.0,
        mem_used: float = 2 << 30,
        mem_total: float = 16 << 30,
        power_w: float = 300.0,
        joules_per_read: float | None = 10.0,
    ) -> None:
        self.util, self.mem_used, self.mem_total, self.power_w = util, mem_used, mem_total, power_w
        self.joules_per_read = joules_per_read
        self.energy_mj = 1_000_000.0
        self.initialised = False
        self.util_reads = 0

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        raise RuntimeError("no such UUID")  # torch has no GPU here: the sampler falls back to the index

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        self.util_reads += 1
        return SimpleNamespace(gpu=self.util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(used=self.mem_used, total=self.mem_total, free=self.mem_total - self.mem_used)

    def nvmlDeviceGetPowerUsage(self, handle: str) -> float:
        return self.power_w * 1000.0  # NVML reports milliwatts

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> float:
        if self.joules_per_read is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        self.energy_mj += self.joules_per_read * 1000.0
        return self.energy_mj
