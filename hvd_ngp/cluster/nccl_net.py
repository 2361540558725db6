"""Which transport NCCL uses between nodes, from NCCL's own INFO lines (``NET/IB``, ``NET/Socket``).

``capture_env`` asks NCCL (before ``hvd.init``) to write its INIT and NET messages to a file per process,
``read_capture`` reads this process's file after the first GPU collective, ``parse`` finds the
transport, and ``verdict`` warns when NCCL fell back to sockets on a host that has an InfiniBand device
(``/sys/class/infiniband``): the gradient allreduce then runs over TCP at a fraction of the fabric's rate.
Pure Python; used by ``hvd-ngp-doctor`` and the trainer's first log lines.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

CAPTURE_NAME = "hvd_ngp_nccl"
IB_SYSFS = "/sys/class/infiniband"

# "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB ib0:10.0.0.1<0>"
_USING_IB = re.compile(r"NET/IB ?: ?Using (.*?)(?: ?; ?OOB|$)")
_IB_DEVICE = re.compile(r"\[\d+\](\S+?)/(IB|RoCE)\b")
# "NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>"
_USING_SOCKET = re.compile(r"NET/Socket ?: ?Using (.*)$")
_SOCKET_DEVICE = re.compile(r"\[\d+\]([^:\s]+):")
# "NCCL INFO Using network IB" / "Using network Socket" / "Using network AWS Libfabric"
_NETWORK = re.compile(r"Using network (\S+)")
# "NCCL INFO Channel 00/0 : 0[0] -> 4[0] [send] via NET/IB/0" ; "via NET/Socket/1"
_CHANNEL_NET = re.compile(r"via NET/(IB|Socket|[A-Za-z]+)")


@dataclass
class NcclNet:
    """``transport``: "IB", "RoCE", "Socket", another plugin's name, or "" (NCCL reported no network use);
    ``network``: NCCL's chosen network module; ``devices``: the NICs it listed; ``inter_node``: a channel ran
    over the network (only then did traffic cross nodes)."""

    transport: str = ""
    network: str = ""
    devices: list[str] = field(default_factory=list)
    inter_node: bool = False

    def describe(self) -> str:
        if not self.network and not self.transport:
            return "NCCL transport between nodes: not reported (no NCCL INFO lines captured)"
        used = "carries inter-node traffic" if self.inter_node else "chosen (no channel crossed nodes yet)"
        devices = f" on {', '.join(self.devices)}" if self.devices else ""
        return f"NCCL transport between nodes: {self.transport or self.network}{devices} ({used})"


def parse(text: str) -> NcclNet:
    """NCCL's INFO output (any prefixes) -> what it uses between nodes."""
    net = NcclNet()
    ib_devices: list[tuple[str, str]] = []
    socket_devices: list[str] = []
    for line in text.splitlines():
        if "NCCL INFO" not in line:
            continue
        m = _USING_IB.search(line)
        if m:
            ib_devices = _IB_DEVICE.findall(m.group(1))
        m = _USING_SOCKET.search(line)
        if m:
            socket_devices = _SOCKET_DEVICE.findall(m.group(1))
        m = _NETWORK.search(line)
        if m:
            net.network = m.group(1)
        m = _CHANNEL_NET.search(line)
        if m:
            net.inter_node = True
            net.network = net.network or m.group(1)
    if net.network == "IB":
        kinds = {kind for _, kind in ib_devices}
        net.transport = "RoCE" if kinds == {"RoCE"} else ("IB" if kinds <= {"IB"} else "IB/RoCE")
        net.devices = [name for name, _ in ib_devices]
    elif net.network == "Socket":
        net.transport, net.devices = "Socket", socket_devices
    else:
        net.transport = net.network
    return net


def ib_devices(root: str = IB_SYSFS) -> list[str]:
    """InfiniBand/RoCE devices this host has (``mlx5_0``, ...), from sysfs."""
    try:
        return sorted(p.name for p in Path(root).iterdir())
    except OSError:
        return []


def verdict(net: NcclNet, devices: list[str]) -> tuple[str, str]:
    """("warning" | "ok" | "info", text): sockets while the host has an IB device is a warning."""
    if net.transport == "Socket" and devices:
        return "warning", (
            f"NCCL uses TCP sockets between nodes although this host has InfiniBand/RoCE device(s) "
            f"{', '.join(devices)}: check NCCL_IB_DISABLE, NCCL_IB_HCA and the IB driver/rdma-core "
            f"(hvd-ngp-launch --fabric ib)"
        )
    if not net.transport:
        return "info", net.describe()
    return "ok", net.describe()


def capture_env(environ: Mapping[str, str], directory: str | None = None) -> dict[str, str]:
    """Variables that make NCCL write its INIT/NET messages to a per-process file (set before ``hvd.init``);
    nothing when the user already chose NCCL_DEBUG or NCCL_DEBUG_FILE."""
    if environ.get("NCCL_DEBUG") or environ.get("NCCL_DEBUG_FILE"):
        return {}
    directory = directory or tempfile.gettempdir()
    return {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "NCCL_DEBUG_FILE": str(Path(directory) / f"{CAPTURE_NAME}.%h.%p.log"),
    }


def read_capture(environ: Mapping[str, str] | None = None, pid: int | None = None) -> str:
    """This process's capture (``%h``/``%p`` expanded by NCCL), or "" when there is none."""
    environ = os.environ if environ is None else environ
    pattern = environ.get("NCCL_DEBUG_FILE", "")
    if f"{CAPTURE_NAME}." not in pattern:
        return ""
    path = Path(pattern)
    glob = path.name.replace("%h", "*").replace("%p", str(pid or os.getpid()))
    return "".join(p.read_text(errors="replace") for p in sorted(path.parent.glob(glob)))
