"""The distributed runtime: the only module that imports Horovod.

Bootstrap order (as in Horovod's examples): ``init()`` -> pin the device by local rank -> seed by
GLOBAL rank -> build the model -> ``distributed_optimizer`` -> ``broadcast_state``.

Started without a launcher (no horovodrun/mpirun environment), everything here is a size-1
fallback that never imports Horovod, so ``python -m hvd_ngp.train`` works on a laptop.
Every collective in this module must be called by every rank in the same order. The blocking
ones report their time to ``commclock.COMM_CLOCK`` (the communication share of the live metrics).
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

import torch

from .commclock import COMM_CLOCK
from .errors import BackendError, HvdNgpError

T = TypeVar("T")

#: environment variables set by the launchers we support
_LAUNCHER_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")


@dataclass(frozen=True)
class Runtime:
    """Where this process sits in the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_size: int
    device: torch.device
    controller: str  # "mpi" | "gloo" | "none"

    @property
    def is_root(self) -> bool:
        return self.rank == 0


_hvd = None  # horovod.torch, once initialised
_runtime: Runtime | None = None


def launched() -> bool:
    """True when started by horovodrun/mpirun (or any MPI launcher)."""
    return any(v in os.environ for v in _LAUNCHER_VARS)


def wants_cuda(device: str) -> bool:
    """Whether ``--device`` (auto | cuda | cpu) means a GPU run on this machine."""
    return torch.cuda.is_available() if device == "auto" else device == "cuda"


def init(device: str = "auto", threads: int = 0, env: Mapping[str, str] | None = None) -> Runtime:
    """Initialise Horovod (or the size-1 fallback), pin the device and size the CPU thread pool.

    ``env``: variables Horovod and NCCL read inside ``hvd.init()`` (``HOROVOD_CYCLE_TIME``,
    ``NCCL_ALGO``, ...; see ``comm.CommSettings.init_env``), set just before it.
    """
    global _hvd, _runtime
    if _runtime is not None:
        return _runtime
    if launched():
        want_cuda = wants_cuda(device)
        os.environ.update(env or {})
        if not want_cuda:
            # CPU ranks share cores with MPI's progress loop: let it yield instead of spinning
            # (measured 43 s -> 31 s for 300 steps of the built-in scene on 2 cores, 2 ranks).
            os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        try:
            import horovod.torch as hvd
        except ImportError as exc:
            raise BackendError(f"started by a launcher but Horovod cannot be imported ({exc}); "
                               "run scripts/setup.sh to build it") from None
        hvd.init()
        _hvd = hvd
        rank, size = hvd.rank(), hvd.size()
        local_rank, local_size, cross_size = hvd.local_rank(), hvd.local_size(), hvd.cross_size()
        controller = "mpi" if hvd.mpi_enabled() and not hvd.gloo_enabled() else ("gloo" if hvd.gloo_enabled() else "mpi")
    else:
        rank, size, local_rank, local_size, cross_size, controller = 0, 1, 0, 1, 1, "none"

    use_cuda = wants_cuda(device)
    if use_cuda:
        if not torch.cuda.is_available():
            raise BackendError("--device cuda but torch sees no CUDA GPU")
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        dev = torch.device("cuda", index)
    else:
        dev = torch.device("cpu")
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(threads or max(1, cores // local_size))
    _runtime = Runtime(rank, size, local_rank, local_size, cross_size, dev, controller)
    return _runtime


def runtime() -> Runtime:
    if _runtime is None:
        raise RuntimeError("hvd_ngp.dist.init() has not been called")
    return _runtime


def horovod_info() -> dict[str, str]:
    """Horovod's version, what it was built with and the controller in use (for ``hvd_ngp.doctor``).

    Imports Horovod even in a size-1 run (it does not initialise it); never raises.
    """
    try:
        import horovod
        import horovod.torch as hvd

        nccl = hvd.nccl_built()  # NCCL_VERSION_CODE, or 0
        built = [name for name, flag in (("mpi", hvd.mpi_built()), ("gloo", hvd.gloo_built())) if flag]
        if nccl:
            major, rest = (nccl // 10000, nccl % 10000) if nccl >= 20900 else (nccl // 1000, nccl % 1000)
            built.append(f"nccl {major}.{rest // 100}.{rest % 100}")
        built += [name for name, flag in (("cuda", hvd.cuda_built()), ("rocm", hvd.rocm_built()),
                                          ("ddl", hvd.ddl_built()), ("ccl", hvd.ccl_built())) if flag]
    except Exception as exc:  # ImportError, or a library that fails to load (wrong torch ABI)
        return {"version": f"error: {type(exc).__name__}: {exc}", "built": "-", "controller": "-"}
    controller = _runtime.controller if (_runtime is not None and _hvd is not None) else "not initialised"
    return {"version": horovod.__version__, "built": ", ".join(built) or "nothing", "controller": controller}


def shutdown() -> None:
    global _hvd, _runtime
    if _hvd is not None:
        _hvd.shutdown()
    _hvd, _runtime = None, None


# ------------------------------------------------------------------------------ collectives

_OPS = {"sum": "Sum", "avg": "Average", "max": "Max", "min": "Min"}


def allreduce(tensor: torch.Tensor, op: str = "sum", name: str | None = None) -> torch.Tensor:
    """Allreduce a tensor (op: sum | avg | max | min); returns a new tensor. Identity at size 1."""
    if _hvd is None or _runtime.size == 1:
        return tensor.clone()
    with COMM_CLOCK.blocking(tensor):
        return _hvd.allreduce(tensor, op=getattr(_hvd, _OPS[op]), name=name)


def allreduce_(tensor: torch.Tensor, op: str = "sum", name: str | None = None) -> torch.Tensor:
    """In-place allreduce."""
    if _hvd is None or _runtime.size == 1:
        return tensor
    with COMM_CLOCK.blocking(tensor):
        return _hvd.allreduce_(tensor, op=getattr(_hvd, _OPS[op]), name=name)


def allgather_object(obj: T, name: str | None = None) -> list[T]:
    """Every rank's ``obj``, ordered by rank (picklable objects only; for small metadata)."""
    if _hvd is None or _runtime.size == 1:
        return [obj]
    with COMM_CLOCK.blocking():
        return _hvd.allgather_object(obj, name=name)


def broadcast_object(obj: T, root: int = 0, name: str | None = None) -> T:
    if _hvd is None or _runtime.size == 1:
        return obj
    with COMM_CLOCK.blocking():
        return _hvd.broadcast_object(obj, root_rank=root, name=name)


def barrier() -> None:
    if _hvd is not None and _runtime.size > 1:
        with COMM_CLOCK.blocking():
            _hvd.barrier()


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Make every rank start from rank 0's parameters, buffers and (if given) optimizer state.

    Pass the optimizer only when rank 0's holds state (a loaded snapshot): Horovod initialises an
    empty state with a zero-gradient step, which moves weight-decayed parameters. The optimizer
    state therefore goes first and the parameters after it, overwriting any such move.
    """
    if _hvd is None or _runtime.size == 1:
        return
    if optimizer is not None:
        _hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    _hvd.broadcast_parameters(model.state_dict(), root_rank=0)


def broadcast_(tensor: torch.Tensor, root: int = 0, name: str | None = None) -> torch.Tensor:
    """In-place broadcast from ``root``."""
    if _hvd is None or _runtime.size == 1:
        return tensor
    with COMM_CLOCK.blocking(tensor):
        return _hvd.broadcast_(tensor, root_rank=root, name=name)


def allreduce_many_(tensors: Sequence[torch.Tensor], op: str = "avg", name: str = "many") -> None:
    """In-place allreduce of several tensors, all in flight at once (Horovod fuses them like gradients)."""
    if _hvd is None or _runtime.size == 1:
        return
    handles = [_hvd.allreduce_async_(t, op=getattr(_hvd, _OPS[op]), name=f"{name}.{i}") for i, t in enumerate(tensors)]
    for h in handles:
        _hvd.synchronize(h)


def distributed_optimizer(optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
                          compression: str = "none", backward_passes_per_step: int = 1,
                          op: str = "average") -> torch.optim.Optimizer:
    """Wrap an optimizer so gradients are averaged across ranks (Horovod tensor fusion + NCCL/MPI/Gloo).

    compression: none | fp16; op: average | adasum; ``backward_passes_per_step`` backward passes
    accumulate locally before one allreduce. ``COMM_CLOCK`` times the wait in ``synchronize()``.
    """
    if _hvd is None or _runtime.size == 1:
        return optimizer
    comp = _hvd.Compression.fp16 if compression == "fp16" else _hvd.Compression.none
    reduce_op = _hvd.Adasum if op == "adasum" else _hvd.Average
    wrapped = _hvd.DistributedOptimizer(optimizer, named_parameters=list(named_parameters), compression=comp,
                                        backward_passes_per_step=backward_passes_per_step, op=reduce_op)
    return COMM_CLOCK.wrap_synchronize(wrapped)


# ------------------------------------------------------------------------------ agreement on failure


class RankFailure(HvdNgpError):
    """Raised on every rank when ``agree`` saw an error on any rank."""


def agree(fn: Callable[[], T], what: str) -> T:
    """Run ``fn`` on every rank; if it raised a user-facing error on any rank, raise it on all.

    Turns "one rank failed to load its input and the others hang in the next collective" into
    one clear error everywhere. Costs one small allgather.
    """
    result: Any = None
    message = ""
    try:
        result = fn()
    except HvdNgpError as exc:
        message = str(exc)
    except Exception as exc:  # an unexpected failure still must not hang the other ranks
        message = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
    if _hvd is None or _runtime.size == 1:
        if message:
            raise RankFailure(message)
        return result
    messages = allgather_object(message, name=f"agree.{what}")
    failed = [(r, m) for r, m in enumerate(messages) if m]
    if failed:
        r, m = failed[0]
        others = f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""
        raise RankFailure(f"{what} failed on rank {r}{others}: {m}")
    return result


def log(*parts: Any, all_ranks: bool = False) -> None:
    """Print on global rank 0 only (or on every rank, prefixed by its rank)."""
    rt = _runtime
    if rt is None or rt.is_root or all_ranks:
        prefix = f"[rank {rt.rank}] " if (all_ranks and rt is not None and rt.size > 1) else ""
        print(prefix + " ".join(str(p) for p in parts), file=sys.stderr, flush=True)
