"""Several "hosts" on one Linux machine, for multi-node tests: network namespaces and an ssh shim.

    python -m hvd_ngp.simhosts up --name demo --hosts 2 --slots 1 [--gpus-per-host 1] [--rate 1gbit --delay 0.2ms]
    python -m hvd_ngp.simhosts run demo -- python -m hvd_ngp.launch --hostfile /tmp/hvd_ngp_simhosts/demo/hostfile \\
        --iface simnet0 --fabric eth -- --n_steps 100
    python -m hvd_ngp.simhosts down demo

``up`` creates the namespaces ``hvdsim-<name>-login`` (where launchers run, like a cluster's first
node or login node) and ``hvdsim-<name>-h0``.. (the hosts, ``simhost0``..), each with one interface
``simnet0`` on 10.213.0.0/24, all joined by a bridge in ``hvdsim-<name>-sw``; it writes the
hostfile, an ``/etc/hosts`` for the names, and an ``ssh`` shim into ``/tmp/hvd_ngp_simhosts/<name>``.
``run`` starts a command on the login node with the shim first on ``PATH``: when horovodrun or
mpirun ssh to ``simhostN``, the shim enters that host's network namespace, a fresh UTS namespace
named after the host and a mount namespace that sees the simulated ``/etc/hosts``, and runs the
command there with an sshd-like environment (``PATH``/``LD_LIBRARY_PATH`` kept) plus
``NCCL_HOSTID=simhostN`` and, with ``--gpus-per-host``, that host's ``CUDA_VISIBLE_DEVICES``.
Ranks on different simulated hosts therefore look like different machines to Horovod (cross_size),
Open MPI (one orted per host) and NCCL (distinct host ids: traffic goes over the network, not P2P).

Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and either iproute2's ``ip`` or the pyroute2 package
(pure Python: carry its wheel to machines without ``ip``). ``unavailable()`` says why not.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

from ..cluster.fabric_model import parse_rate_bps
from ..errors import ConfigError, HvdNgpError, run_cli
from ..options import command_options

STATE_ROOT = Path(os.environ.get("HVD_NGP_SIMHOSTS_DIR", "/tmp/hvd_ngp_simhosts"))
NETNS_DIR = Path("/var/run/netns")  # where both iproute2 and pyroute2 keep named namespaces
IFACE = "simnet0"
SUBNET = "10.213.0"
LOGIN = "simlogin"
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWNET = 0x00020000, 0x04000000, 0x40000000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
#: ssh options that take a value (OpenSSH), so the shim can find the host name and the command
SSH_OPTIONS_WITH_VALUE = set("BbcDEeFIiJLlmOoPpQRSWw")
#: the environment a fresh ssh session keeps from the caller (as if the login profile set it up)
SSH_KEEP_ENV = ("PATH", "LD_LIBRARY_PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM")


class SimHostsError(HvdNgpError):
    """The simulated hosts cannot be created or used here."""


@dataclass(frozen=True)
class SimHost:
    name: str  # simhost0, ...
    namespace: str
    address: str
    gpus: str  # CUDA_VISIBLE_DEVICES for this host ("" = inherit nothing special)


@dataclass(frozen=True)
class SimCluster:
    """A created set of simulated hosts; ``state_dir`` holds the hostfile, hosts file and ssh shim."""

    name: str
    state_dir: str
    hosts: tuple[SimHost, ...]
    login_namespace: str
    switch_namespace: str
    slots: int

    @property
    def hostfile(self) -> str:
        return str(Path(self.state_dir) / "hostfile")

    def host(self, name: str) -> SimHost:
        for h in self.hosts:
            if name in (h.name, h.address):
                return h
        raise SimHostsError(f"simhosts: unknown host {name!r} (known: {', '.join(h.name for h in self.hosts)})")

    def command_on_login(self, command: Sequence[str]) -> list[str]:
        """``command`` wrapped to run on the login node (for subprocess)."""
        return [sys.executable, "-m", "hvd_ngp.testing.simhosts", "run", self.name, "--", *command]

    def save(self) -> None:
        Path(self.state_dir, "state.json").write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def load(name: str) -> "SimCluster":
        path = STATE_ROOT / name / "state.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise SimHostsError(f"simhosts: no simulated cluster {name!r} ({path} missing; run 'up' first)") from None
        data["hosts"] = tuple(SimHost(**h) for h in data["hosts"])
        return SimCluster(**data)


# ------------------------------------------------------------------------------------- network backends


class IpBackend:
    """iproute2's ``ip``."""

    name = "ip"

    @staticmethod
    def _ip(*args: str) -> None:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True)
        if proc.returncode:
            raise SimHostsError(f"simhosts: 'ip {' '.join(args)}' failed: {proc.stderr.strip()}")

    def add_namespace(self, ns: str) -> None:
        self._ip("netns", "add", ns)

    def delete_namespace(self, ns: str) -> None:
        self._ip("netns", "delete", ns)

    def add_bridge(self, ns: str, bridge: str) -> None:
        self._ip("-n", ns, "link", "add", bridge, "type", "bridge")
        self._ip("-n", ns, "link", "set", bridge, "up")

    def connect(self, host_ns: str, switch_ns: str, port: str, bridge: str, address: str) -> None:
        """A veth pair: ``IFACE`` with ``address`` in ``host_ns``, ``port`` on ``bridge`` in ``switch_ns``."""
        self._ip(
            "link", "add", "name", IFACE, "netns", host_ns, "type", "veth", "peer", "name", port, "netns", switch_ns
        )
        self._ip("-n", switch_ns, "link", "set", port, "master", bridge, "up")
        self._ip("-n", host_ns, "addr", "add", f"{address}/24", "dev", IFACE)
        self._ip("-n", host_ns, "link", "set", IFACE, "up")
        self._ip("-n", host_ns, "link", "set", "lo", "up")


class Pyroute2Backend:
    """pyroute2 (pure Python netlink), for machines without iproute2."""

    name = "pyroute2"

    def __init__(self) -> None:
        from pyroute2 import IPRoute, netns

        self.IPRoute, self.netns = IPRoute, netns

    def add_namespace(self, ns: str) -> None:
        self.netns.create(ns)

    def delete_namespace(self, ns: str) -> None:
        self.netns.remove(ns)

    def add_bridge(self, ns: str, bridge: str) -> None:
        with self.IPRoute(netns=ns) as ipr:
            ipr.link("add", ifname=bridge, kind="bridge")
            ipr.link("set", index=ipr.link_lookup(ifname=bridge)[0], state="up")

    def connect(self, host_ns: str, switch_ns: str, port: str, bridge: str, address: str) -> None:
        with self.IPRoute(netns=switch_ns) as sw:
            sw.link("add", ifname=port, kind="veth", peer={"ifname": IFACE, "net_ns_fd": host_ns})
            sw.link("set", index=sw.link_lookup(ifname=port)[0], master=sw.link_lookup(ifname=bridge)[0], state="up")
        with self.IPRoute(netns=host_ns) as h:
            index = h.link_lookup(ifname=IFACE)[0]
            h.addr("add", index=index, address=address, prefixlen=24)
            h.link("set", index=index, state="up")
            h.link("set", index=h.link_lookup(ifname="lo")[0], state="up")


def parse_rate(text: str) -> float:
    """``1gbit``, ``100mbit``, ``500kbit`` -> bits per second (tc's spelling, as ``bench links`` reads it)."""
    try:
        value = parse_rate_bps(text)
    except ConfigError:
        raise SimHostsError(f"simhosts: --rate must look like 1gbit or 100mbit, got {text!r}") from None
    if not 1e5 <= value <= 1e12:
        raise SimHostsError(f"simhosts: --rate must be between 100kbit and 1000gbit, got {text!r}")
    return value


def parse_delay(text: str) -> float:
    """``0.2ms``, ``50us`` or ``0`` -> milliseconds."""
    t = text.strip().lower()
    scale = 1e-3 if t.endswith("us") else 1.0
    t = t[:-2] if t.endswith(("us", "ms")) else t
    try:
        value = float(t) * scale
    except ValueError:
        raise SimHostsError(f"simhosts: --delay must look like 0.2ms or 50us, got {text!r}") from None
    if not 0 <= value <= 1000:
        raise SimHostsError(f"simhosts: --delay must be between 0 and 1000 ms, got {text!r}")
    return value


def shape(namespace: str, device: str, rate_bps: float | None, delay_ms: float) -> None:
    """Limit ``device``'s egress in ``namespace`` to ``rate_bps`` (bits/s of Ethernet frames, iproute2's ``tc``):
    a token bucket (tbf, 1 ms of burst, a queue of 50 ms so TCP rarely sees drops) without a delay, netem
    (delay, and rate) with one; netem needs CONFIG_NET_SCH_NETEM, which some kernels lack."""
    tc = shutil.which("tc")
    if tc is None:
        raise SimHostsError("simhosts: --rate/--delay need iproute2's 'tc' (apt-get install iproute2)")
    if delay_ms > 0:
        args = ["netem", "delay", f"{delay_ms * 1000:.0f}us"]
        if rate_bps:
            args += ["rate", f"{rate_bps:.0f}bit", "limit", str(max(1000, int(rate_bps / 8 / 1500 / 20)))]
    else:
        if rate_bps is None:
            raise SimHostsError("simhosts: shaping a link needs a rate or a delay")
        args = [
            "tbf",
            "rate",
            f"{rate_bps:.0f}bit",
            "burst",
            str(max(32 * 1024, int(rate_bps / 8 / 1000))),
            "latency",
            "50ms",
        ]
    proc = subprocess.run(
        [tc, "-n", namespace, "qdisc", "replace", "dev", device, "root", *args], capture_output=True, text=True
    )
    if proc.returncode:
        why = proc.stderr.strip()
        if args[0] == "netem" and "unknown" in why:
            why += " (this kernel has no netem, CONFIG_NET_SCH_NETEM: --rate alone works with tbf)"
        raise SimHostsError(
            f"simhosts: 'tc qdisc replace dev {device} root {' '.join(args)}' in {namespace} failed: {why}"
        )


def backend(choice: str = "auto"):
    if choice in ("auto", "ip") and shutil.which("ip"):
        return IpBackend()
    if choice in ("auto", "pyroute2"):
        try:
            return Pyroute2Backend()
        except ImportError:
            pass
    raise SimHostsError(f"simhosts: no network backend ({choice}): install iproute2 ('ip') or pyroute2")


def unavailable(choice: str = "auto") -> str:
    """'' when simulated hosts can be made here, else why not (for test skips)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        b = backend(choice)
    except SimHostsError as exc:
        return str(exc)
    probe = f"hvdsim-probe-{os.getpid()}"
    try:
        b.add_namespace(probe)
        b.add_bridge(probe, "br0")
    except Exception as exc:  # EPERM in unprivileged containers, missing kernel support, ...
        return f"cannot create a network namespace here ({exc})"
    finally:
        try:
            b.delete_namespace(probe)
        except Exception:
            pass
    return ""


# ------------------------------------------------------------------------------------- up / down


def up(
    name: str,
    n_hosts: int = 2,
    slots: int = 1,
    gpus_per_host: int = 0,
    choice: str = "auto",
    rate: str | None = None,
    delay: str | None = None,
) -> SimCluster:
    """Create the namespaces, the bridge, the hostfile, the hosts file and the ssh shim.

    ``rate`` (e.g. ``1gbit``) and ``delay`` (e.g. ``0.2ms``) shape each host's link in both directions: the
    host's ``simnet0`` egress and its bridge port's egress (a switched network: host to host crosses two
    links, so twice the delay; a host's uplink is shared by all its flows). The login node stays unshaped."""
    if not name.replace("-", "").isalnum():
        raise SimHostsError(f"simhosts: cluster name must be letters, digits and '-', got {name!r}")
    if not 1 <= n_hosts <= 200:
        raise SimHostsError(f"simhosts: --hosts must be between 1 and 200, got {n_hosts}")
    rate_bps = parse_rate(rate) if rate else None
    delay_ms = parse_delay(delay) if delay else 0.0
    b = backend(choice)
    prefix = f"hvdsim-{name}"
    if any(p.name.startswith(prefix + "-") for p in NETNS_DIR.glob("*")) if NETNS_DIR.is_dir() else False:
        raise SimHostsError(f"simhosts: cluster {name!r} exists already (run 'down {name}' first)")
    hosts = tuple(
        SimHost(
            f"simhost{i}",
            f"{prefix}-h{i}",
            f"{SUBNET}.{i + 1}",
            ",".join(str(g) for g in range(i * gpus_per_host, (i + 1) * gpus_per_host)),
        )
        for i in range(n_hosts)
    )
    cluster = SimCluster(name, str(STATE_ROOT / name), hosts, f"{prefix}-login", f"{prefix}-sw", slots)
    created: list[str] = []
    try:
        for ns in (cluster.switch_namespace, cluster.login_namespace, *(h.namespace for h in hosts)):
            b.add_namespace(ns)
            created.append(ns)
        b.add_bridge(cluster.switch_namespace, "br0")
        b.connect(cluster.login_namespace, cluster.switch_namespace, "plogin", "br0", f"{SUBNET}.254")
        for i, h in enumerate(hosts):
            b.connect(h.namespace, cluster.switch_namespace, f"p{i}", "br0", h.address)
            if rate_bps or delay_ms:
                shape(h.namespace, IFACE, rate_bps, delay_ms)
                shape(cluster.switch_namespace, f"p{i}", rate_bps, delay_ms)
    except Exception:
        for ns in created:
            try:
                b.delete_namespace(ns)
            except Exception:
                pass
        raise
    state = Path(cluster.state_dir)
    (state / "bin").mkdir(parents=True, exist_ok=True)
    (state / "hostfile").write_text("".join(f"{h.name} slots={slots}\n" for h in hosts))
    (state / "hosts").write_text(
        f"127.0.0.1 localhost\n{SUBNET}.254 {LOGIN}\n" + "".join(f"{h.address} {h.name}\n" for h in hosts)
    )
    root = Path(__file__).resolve().parent.parent
    shim = state / "bin" / "ssh"
    shim.write_text(
        "#!/bin/sh\n# ssh to a simulated host (hvd_ngp.testing.simhosts)\n"
        f"exec {shlex.quote(sys.executable)} -c 'import sys; sys.path.insert(0, sys.argv.pop(1)); "
        "from hvd_ngp.testing.simhosts import ssh_main; ssh_main(sys.argv[1:])' "
        f'{shlex.quote(str(root))} {shlex.quote(name)} "$@"\n'
    )
    shim.chmod(0o755)
    cluster.save()
    return cluster


def down(name: str, choice: str = "auto") -> None:
    """Delete the cluster's namespaces and state (processes still inside keep running)."""
    b = backend(choice)
    prefix = f"hvdsim-{name}-"
    for ns in sorted(NETNS_DIR.glob(prefix + "*")) if NETNS_DIR.is_dir() else []:
        b.delete_namespace(ns.name)
    shutil.rmtree(STATE_ROOT / name, ignore_errors=True)


def _remove_stale_test_clusters(choice: str = "auto") -> None:
    """Clusters named ``t<pid>`` (made by ``simulated``) whose process is gone."""
    for state in STATE_ROOT.glob("t*") if STATE_ROOT.is_dir() else []:
        pid = state.name[1:]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            down(state.name, choice)


@contextmanager
def simulated(
    n_hosts: int = 2,
    slots: int = 1,
    gpus_per_host: int = 0,
    name: str | None = None,
    choice: str = "auto",
    rate: str | None = None,
    delay: str | None = None,
) -> Iterator[SimCluster]:
    """``with simulated(2) as cluster:`` ... (always torn down)."""
    _remove_stale_test_clusters(choice)
    name = name or f"t{os.getpid()}"
    cluster = up(name, n_hosts, slots, gpus_per_host, choice, rate, delay)
    try:
        yield cluster
    finally:
        down(name, choice)


# ------------------------------------------------------------------------------------- entering a host


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SimHostsError(f"simhosts: {what} failed: {os.strerror(err)}")


def enter(namespace: str, hostname: str, hosts_file: str) -> None:
    """Move this process into ``namespace`` (network), a new UTS namespace named ``hostname`` and a
    private mount namespace where ``hosts_file`` is ``/etc/hosts``."""
    libc = _libc()
    fd = os.open(NETNS_DIR / namespace, os.O_RDONLY)
    try:
        _check(libc.setns(fd, CLONE_NEWNET), f"entering network namespace {namespace}")
    finally:
        os.close(fd)
    _check(libc.unshare(CLONE_NEWUTS | CLONE_NEWNS), "unshare(UTS, mount)")
    socket.sethostname(hostname)
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    _check(libc.mount(hosts_file.encode(), b"/etc/hosts", None, MS_BIND, None), "bind-mounting /etc/hosts")


def split_ssh_args(args: Sequence[str]) -> tuple[str, str]:
    """``ssh [options] [user@]host [options] [command...]`` -> (host, command line)."""
    host, i = None, 0
    while i < len(args):
        a = args[i]
        if a.startswith("-") and len(a) > 1:
            i += 2 if (len(a) == 2 and a[1] in SSH_OPTIONS_WITH_VALUE) else 1
        elif host is None:
            host, i = a.rsplit("@", 1)[-1], i + 1
        else:
            return host, " ".join(args[i:])
    if host is None:
        raise SimHostsError(f"simhosts ssh: no host in {' '.join(args)!r}")
    return host, ""


def ssh_main(argv: Sequence[str]) -> None:
    """The shim: ``ssh_main([cluster, *ssh_args])`` runs the command on the simulated host."""
    cluster = SimCluster.load(argv[0])
    name, command = split_ssh_args(argv[1:])
    host = cluster.host(name)
    enter(host.namespace, host.name, str(Path(cluster.state_dir) / "hosts"))
    env = {k: os.environ[k] for k in SSH_KEEP_ENV if k in os.environ}
    env.update(SHELL="/bin/sh", NCCL_HOSTID=host.name)
    if host.gpus:
        env["CUDA_VISIBLE_DEVICES"] = host.gpus
    os.chdir(env.get("HOME", "/"))
    os.execve("/bin/sh", ["sh", "-c", command or "exec sh"], env)


def run_on_login(name: str, command: Sequence[str]) -> None:
    """Replace this process with ``command`` on the cluster's login node (shim first on PATH)."""
    cluster = SimCluster.load(name)
    enter(cluster.login_namespace, LOGIN, str(Path(cluster.state_dir) / "hosts"))
    env = dict(os.environ)
    env["PATH"] = f"{Path(cluster.state_dir) / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    # per-host values come from the shim; the launcher would forward the login node's to every host
    for key in ("NCCL_HOSTID", "CUDA_VISIBLE_DEVICES") if any(h.gpus for h in cluster.hosts) else ("NCCL_HOSTID",):
        env.pop(key, None)
    if env.get("OMPI_MCA_plm") == "isolated":
        # Some container images pin Open MPI to local-only launching; mpirun then refuses the second
        # host ("All nodes which are allocated for this job are already filled"). Hosts here are reached
        # through the ssh shim, which is Open MPI's rsh launcher.
        print(
            "simhosts: OMPI_MCA_plm=isolated in the environment: using plm=rsh (the ssh shim) for this run",
            file=sys.stderr,
            flush=True,
        )
        env["OMPI_MCA_plm"] = "rsh"
    os.execvpe(command[0], list(command), env)


def probe() -> None:
    """Run under a launcher: one line per rank saying where it runs, and a checked allreduce."""
    import torch

    from ..cluster import dist

    rt = dist.init()
    # on the rank's device: on GPUs this allreduce goes through NCCL
    total = float(dist.allreduce(torch.tensor([rt.rank + 1.0], device=rt.device), "sum", name="probe")[0])
    ok = total == rt.size * (rt.size + 1) / 2
    print(
        f"PROBE rank {rt.rank}/{rt.size} local {rt.local_rank}/{rt.local_size} cross_size {rt.cross_size} "
        f"host {socket.gethostname()} controller {rt.controller} device {rt.device} "
        f"NCCL_HOSTID={os.environ.get('NCCL_HOSTID', '')} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')} "
        f"allreduce {'ok' if ok else f'WRONG ({total})'}",
        flush=True,
    )
    dist.barrier()
    if not ok:
        raise SimHostsError(f"probe: allreduce of ranks 1..{rt.size} gave {total}")


# ------------------------------------------------------------------------------------- CLI


@dataclass(frozen=True)
class UpOptions:
    """``up``: the simulated hosts to create (``main``'s parser holds each option's help)."""

    action: str
    name: str
    hosts: int
    slots: int
    gpus_per_host: int
    backend: str
    rate: str | None  # e.g. 1gbit
    delay: str | None  # e.g. 0.2ms


@dataclass(frozen=True)
class RunOptions:
    """``run NAME -- COMMAND``: the hosts whose login node runs the command."""

    action: str
    name: str


@dataclass(frozen=True)
class DownOptions:
    """``down NAME``: the hosts to delete."""

    action: str
    name: str
    backend: str


@dataclass(frozen=True)
class ActionOnly:
    """``check`` and ``probe``: no options."""

    action: str


ACTIONS: dict[str, type] = {
    "up": UpOptions,
    "run": RunOptions,
    "down": DownOptions,
    "check": ActionOnly,
    "probe": ActionOnly,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(prog="python -m hvd_ngp.simhosts", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    u = sub.add_parser("up", help="create simulated hosts")
    u.add_argument("--name", default="sim")
    u.add_argument("--hosts", type=int, default=2)
    u.add_argument("--slots", type=int, default=1, help="slots per host in the hostfile")
    u.add_argument(
        "--gpus-per-host", type=int, default=0, help="give host i GPUs [i*k, (i+1)*k) via CUDA_VISIBLE_DEVICES"
    )
    u.add_argument("--backend", choices=("auto", "ip", "pyroute2"), default="auto")
    u.add_argument("--rate", default=None, help="each host link's rate in both directions, e.g. 1gbit (tc netem)")
    u.add_argument("--delay", default=None, help="each host link's one-way delay, e.g. 0.2ms (host to host: twice)")
    r = sub.add_parser("run", help="run a command (after --) on the login node")
    r.add_argument("name")
    d = sub.add_parser("down", help="delete simulated hosts")
    d.add_argument("name")
    d.add_argument("--backend", choices=("auto", "ip", "pyroute2"), default="auto")
    sub.add_parser("check", help="say whether simulated hosts can be made here")
    sub.add_parser("probe", help="under a launcher: print each rank's host and cross_size, check an allreduce")
    opts: UpOptions | RunOptions | DownOptions | ActionOnly = command_options(p.parse_args(argv), "action", ACTIONS)
    if isinstance(opts, UpOptions):
        cluster = up(opts.name, opts.hosts, opts.slots, opts.gpus_per_host, opts.backend, opts.rate, opts.delay)
        shaped = f"; links {opts.rate or 'unlimited'}, delay {opts.delay or '0'}" if opts.rate or opts.delay else ""
        print(
            f"simulated hosts {', '.join(h.name for h in cluster.hosts)} ({backend(opts.backend).name}); "
            f"hostfile {cluster.hostfile}; interface {IFACE}{shaped}"
        )
    elif isinstance(opts, RunOptions):
        if not command:
            raise SimHostsError("simhosts run: give the command after '--'")
        run_on_login(opts.name, command)
    elif isinstance(opts, DownOptions):
        down(opts.name, opts.backend)
    elif opts.action == "probe":
        probe()
    else:
        reason = unavailable()
        print(reason or "simulated hosts can be made here")
        return 1 if reason else 0
    return 0


def cli(argv: list[str] | None = None) -> None:
    """``hvd-ngp-simhosts`` (``python -m hvd_ngp.simhosts``)."""
    run_cli(main, argv, prog="simhosts")


if __name__ == "__main__":
    cli()
