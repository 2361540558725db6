"""The distributed runtime: the only module that imports Horovod.

Bootstrap order (as in Horovod's examples): ``init()`` -> pin the device by local rank -> seed by
GLOBAL rank -> build the model -> ``distributed_optimizer`` -> ``broadcast_state``.

Started without a launcher (no horovodrun/mpirun environment), everything here is a size-1
fallback that never imports Horovod, so ``python -m hvd_ngp.train`` works on a laptop.
Every collective in this module must be called by every rank in the same order. The blocking
allreduces and broadcasts, and the wait of the gradients' allreduce, report their time to
``commclock.COMM_CLOCK`` (the communication share of the live metrics); the allgathers do not (the
model-parallel exchange, ``replica_allgather``, is timed by its caller).
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

import torch

from .. import launcher_env
from ..errors import BackendError, ConfigError, HvdNgpError
from .commclock import COMM_CLOCK

T = TypeVar("T")


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


@dataclass(frozen=True)
class Groups:
    """Hybrid data x model parallelism: ``replicas`` (D) copies of the model, each split over
    ``model_parallel`` (K) regions. Global rank = replica * K + region, so the K ranks of a replica
    are neighbours (one node when K divides the ranks per node).

    The region group (the D ranks that hold this rank's region) averages gradients; the replica group
    (the K ranks of this rank's replica) exchanges ray segments. A group of one rank has no process
    set (``None``): its collectives are no-ops."""

    model_parallel: int = 1
    replicas: int = 1
    region: int = 0
    replica: int = 0
    region_set: Any = None
    replica_set: Any = None

    @property
    def enabled(self) -> bool:
        return self.model_parallel > 1

    def replica_ranks(self) -> list[int]:
        """Global ranks of this rank's replica group, in region order."""
        return [self.replica * self.model_parallel + k for k in range(self.model_parallel)]

    def region_ranks(self) -> list[int]:
        """Global ranks of this rank's region group, in replica order (the first is the region's leader)."""
        return [d * self.model_parallel + self.region for d in range(self.replicas)]


_hvd: Any = None  # horovod.torch, once initialised (an untyped module)
_runtime: Runtime | None = None
_groups = Groups()


def _declare_groups(k: int, environ: Mapping[str, str]) -> dict:
    """The process sets of a K-region layout, keyed ("region", k) / ("replica", d), before ``hvd.init``
    (Horovod needs static sets at init). Checks the layout on every rank (each raises the same error)."""
    if k <= 1:
        return {}
    size, _ = launcher_env.launcher_sizes(environ)
    if size % k:
        raise ConfigError(
            f"--model_parallel {k} must divide the number of ranks, but the job runs {size} "
            f"(D = ranks / K replicas of K regions each)"
        )
    import horovod.torch as hvd

    d = size // k
    sets: dict = {}
    for region in range(k):
        ranks = [r * k + region for r in range(d)]
        sets[("region", region)] = hvd.ProcessSet(ranks) if 1 < len(ranks) < size else None
    for replica in range(d):
        ranks = [replica * k + region for region in range(k)]
        sets[("replica", replica)] = hvd.ProcessSet(ranks) if len(ranks) < size else None  # all ranks: the global set
    return sets


def _make_groups(k: int, rank: int, size: int, sets: dict) -> Groups:
    if size % k:
        raise ConfigError(f"--model_parallel {k} must divide the number of ranks ({size})")
    region, replica = rank % k, rank // k
    replica_set = sets.get(("replica", replica))
    if replica_set is None and size == k:
        replica_set = _hvd.global_process_set
    return Groups(k, size // k, region, replica, sets.get(("region", region)), replica_set)


def groups() -> Groups:
    """This rank's place in the hybrid layout (``Groups()``: plain data parallelism)."""
    return _groups


def launched() -> bool:
    """True when started by horovodrun/mpirun (or any MPI launcher; see ``launcher_env``)."""
    return launcher_env.launched()


def wants_cuda(device: str) -> bool:
    """Whether ``--device`` (auto | cuda | cpu) means a GPU run on this machine."""
    return torch.cuda.is_available() if device == "auto" else device == "cuda"


def init(
    device: str = "auto", threads: int = 0, env: Mapping[str, str] | None = None, model_parallel: int = 1
) -> Runtime:
    """Initialise Horovod (or the size-1 fallback), pin the device and size the CPU thread pool.

    ``env``: variables Horovod and NCCL read inside ``hvd.init()`` (``HOROVOD_CYCLE_TIME``,
    ``NCCL_ALGO``, ...; see ``comm.CommSettings.init_env``), set just before it.
    ``model_parallel`` K > 1: the ranks form D = size / K replicas x K regions, and the process sets
    of ``groups()`` are declared to Horovod at init (static process sets, the same list on every rank).
    K = 1 declares none: today's data parallelism.
    """
    global _hvd, _runtime, _groups
    if _runtime is not None:
        if device == "auto" or (device == "cuda") == (_runtime.device.type == "cuda"):
            return _runtime
        if _hvd is not None:
            raise ConfigError(f"--device {device}: this process already runs Horovod on {_runtime.device}")
        _runtime = None  # a single process asked for another device (tests, tools): set up again
    if model_parallel > 1 and not launched():
        raise ConfigError(
            f"--model_parallel {model_parallel} needs {model_parallel} ranks or a multiple, but this "
            "process runs alone (start it with horovodrun -np N or mpirun)"
        )
    sets: dict = {}
    layout_error: ConfigError | None = None
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
            raise BackendError(
                f"started by a launcher but Horovod cannot be imported ({exc}); run scripts/setup.sh to build it"
            ) from None
        try:
            sets = _declare_groups(model_parallel, environ=os.environ)
        except ConfigError as exc:  # raised below, after init, by every rank together (see there)
            sets, layout_error = {}, exc
        hvd.init(process_sets=[ps for ps in sets.values() if ps is not None] or None)
        _hvd = hvd
        rank, size = hvd.rank(), hvd.size()
        local_rank, local_size, cross_size = hvd.local_rank(), hvd.local_size(), hvd.cross_size()
        controller = "gloo" if hvd.gloo_enabled() else "mpi"
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
    if layout_error is not None:
        # a rank that exits alone before any collective races the launcher, which may kill the others
        # before they print: agree first, so each rank says why
        def refuse() -> None:
            raise layout_error

        agree(refuse, "checking the model-parallel layout")
    if model_parallel > 1:
        _groups = _make_groups(model_parallel, rank, size, sets)
    return _runtime


def runtime() -> Runtime:
    if _runtime is None:
        raise RuntimeError("hvd_ngp.cluster.dist.init() has not been called")
    return _runtime


def horovod_info() -> dict[str, str]:
    """Horovod's version, what it was built with and the controller in use (for ``hvd_ngp.observe.doctor``).

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
        built += [
            name
            for name, flag in (
                ("cuda", hvd.cuda_built()),
                ("rocm", hvd.rocm_built()),
                ("ddl", hvd.ddl_built()),
                ("ccl", hvd.ccl_built()),
            )
            if flag
        ]
    except Exception as exc:  # ImportError, or a library that fails to load (wrong torch ABI)
        return {"version": f"error: {type(exc).__name__}: {exc}", "built": "-", "controller": "-"}
    controller = _runtime.controller if (_runtime is not None and _hvd is not None) else "not initialised"
    return {"version": horovod.__version__, "built": ", ".join(built) or "nothing", "controller": controller}


def communicating() -> bool:
    """True when collectives reach other ranks (Horovod initialised, more than one rank); False at size 1."""
    return _hvd is not None and _runtime is not None and _runtime.size > 1


def shutdown() -> None:
    global _hvd, _runtime, _groups
    if _hvd is not None:
        _hvd.shutdown()
    _hvd, _runtime, _groups = None, None, Groups()


# ------------------------------------------------------------------------------ collectives

_OPS = {"sum": "Sum", "avg": "Average", "max": "Max", "min": "Min"}


def allreduce(tensor: torch.Tensor, op: str = "sum", name: str | None = None) -> torch.Tensor:
    """Allreduce a tensor (op: sum | avg | max | min); returns a new tensor. Identity at size 1."""
    if not communicating():
        return tensor.clone()
    with COMM_CLOCK.blocking(tensor):
        return _hvd.allreduce(tensor, op=getattr(_hvd, _OPS[op]), name=name)


def allreduce_(tensor: torch.Tensor, op: str = "sum", name: str | None = None) -> torch.Tensor:
    """In-place allreduce."""
    if not communicating():
        return tensor
    with COMM_CLOCK.blocking(tensor):
        return _hvd.allreduce_(tensor, op=getattr(_hvd, _OPS[op]), name=name)


def allreduce_async(tensor: torch.Tensor, op: str = "sum", name: str | None = None) -> Any:
    """Start an allreduce without waiting (Horovod fuses it with tensors submitted in the same cycle).

    Returns a handle for ``synchronize``; at size 1 the handle is a copy of ``tensor``.
    """
    if not communicating():
        return tensor.clone()
    return _hvd.allreduce_async(tensor, op=getattr(_hvd, _OPS[op]), name=name)


def synchronize(handle: Any) -> torch.Tensor:
    """Wait for an ``allreduce_async`` and return its result."""
    if isinstance(handle, torch.Tensor):
        return handle
    return _hvd.synchronize(handle)


def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dim 0, in rank order (``[size * n, ...]`` when all have n rows)."""
    if not communicating():
        return tensor.clone()
    return _hvd.allgather(tensor, name=name)


def reducescatter(tensor: torch.Tensor, op: str = "avg", name: str | None = None) -> torch.Tensor:
    """This rank's block of the reduced ``tensor`` (op: sum | avg): ``[n / size, ...]`` when ``size`` divides
    the ``n`` rows (Horovod gives the first ranks one row more otherwise). A copy at size 1."""
    if not communicating():
        return tensor.clone()
    with COMM_CLOCK.blocking(tensor):
        return _hvd.reducescatter(tensor, op=getattr(_hvd, _OPS[op]), name=name)


def allgather_object(obj: T, name: str | None = None) -> list[T]:
    """Every rank's ``obj``, ordered by rank (picklable objects only; for small metadata)."""
    if not communicating():
        return [obj]
    with COMM_CLOCK.blocking():
        return _hvd.allgather_object(obj, name=name)


def broadcast_object(obj: T, root: int = 0, name: str | None = None) -> T:
    if not communicating():
        return obj
    with COMM_CLOCK.blocking():
        return _hvd.broadcast_object(obj, root_rank=root, name=name)


def barrier() -> None:
    if communicating():
        with COMM_CLOCK.blocking():
            _hvd.barrier()


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Make every rank start from rank 0's parameters, buffers and (if given) optimizer state.

    Pass the optimizer only when rank 0's holds state (a loaded snapshot): Horovod initialises an
    empty state with a zero-gradient step, which moves weight-decayed parameters. The optimizer
    state therefore goes first and the parameters after it, overwriting any such move.
    """
    if not communicating():
        return
    if optimizer is not None:
        _hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    _hvd.broadcast_parameters(model.state_dict(), root_rank=0)


def broadcast_(tensor: torch.Tensor, root: int = 0, name: str | None = None) -> torch.Tensor:
    """In-place broadcast from ``root``."""
    if not communicating():
        return tensor
    with COMM_CLOCK.blocking(tensor):
        return _hvd.broadcast_(tensor, root_rank=root, name=name)


def allreduce_many_(tensors: Sequence[torch.Tensor], op: str = "avg", name: str = "many") -> None:
    """In-place allreduce of several tensors, all in flight at once (Horovod fuses them like gradients),
    then wait for all (timed by ``COMM_CLOCK``)."""
    allreduce_buffers_start(tensors, [f"{name}.{i}" for i in range(len(tensors))], op).wait()


def _submit_all(
    tensors: Sequence[torch.Tensor],
    names: Sequence[str],
    op: str,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[Any]:
    """Submit an in-place allreduce of each tensor, waiting for none -> Horovod handles, in order."""
    return [
        _hvd.allreduce_async_(
            t, name=n, op=getattr(_hvd, _OPS[op]), prescale_factor=prescale_factor, postscale_factor=postscale_factor
        )
        for t, n in zip(tensors, names)
    ]


class PendingAllreduce:
    """In-place allreduces in flight (``allreduce_buffers_start``); ``wait()`` finishes them, once.

    Until then the tensors belong to Horovod: neither read nor written. No handle (size 1): ``wait()``
    does nothing."""

    def __init__(self, tensors: Sequence[torch.Tensor], handles: list[Any]) -> None:
        self._tensors, self._handles = list(tensors), handles

    def wait(self) -> None:
        """Block until every allreduce is done (timed by ``COMM_CLOCK``); a second call does nothing."""
        if not self._handles:
            return
        handles, self._handles = self._handles, []
        with COMM_CLOCK.blocking(*self._tensors):
            for h in handles:
                _hvd.synchronize(h)


def allreduce_buffers_start(
    tensors: Sequence[torch.Tensor],
    names: Sequence[str],
    op: str = "avg",
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> PendingAllreduce:
    """Submit an in-place allreduce of each of ``tensors`` (named ``names``: the same on every rank) and
    return at once. All are submitted before the first wait, so Horovod negotiates them in one cycle; tensors of
    different dtypes still travel as separate collectives (Horovod fuses only equal dtypes). The factors
    multiply before and after the sum (Horovod applies ``1 / size`` on top of ``postscale_factor`` for ``avg``).

    The host is free to work while Horovod reduces (its background thread; on a GPU, NCCL starts when
    the compute stream reaches the point of submission). ``.wait()`` on the result before the tensors
    are used; ``COMM_CLOCK`` times that wait only. No Horovod call at size 1.
    """
    if len(tensors) != len(names):
        raise ValueError(f"{len(tensors)} tensors but {len(names)} names")
    if not communicating():
        return PendingAllreduce(tensors, [])
    return PendingAllreduce(tensors, _submit_all(tensors, names, op, prescale_factor, postscale_factor))


def distributed_optimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
    compression: str = "none",
    backward_passes_per_step: int = 1,
    op: str = "average",
    group: str | None = None,
) -> torch.optim.Optimizer:
    """Wrap an optimizer so gradients are averaged across ranks (Horovod tensor fusion + NCCL/MPI/Gloo).

    compression: none | fp16; op: average | adasum; ``backward_passes_per_step`` backward passes
    accumulate locally before one allreduce. Not wrapped at size 1,
    except in an elastic job, whose world may grow later. ``COMM_CLOCK`` times the wait in ``synchronize()``.
    """
    if _hvd is None or (runtime().size == 1 and not elastic()):
        return optimizer
    extra = {}
    if group == "region":  # model parallel: average among the D copies of this rank's region only
        if _groups.region_set is None:
            return optimizer  # one replica: the region's gradient is already complete on this rank
        extra["process_set"] = _groups.region_set
    comp = _hvd.Compression.fp16 if compression == "fp16" else _hvd.Compression.none
    reduce_op = _hvd.Adasum if op == "adasum" else _hvd.Average
    wrapped = _hvd.DistributedOptimizer(
        optimizer,
        named_parameters=list(named_parameters),
        compression=comp,
        backward_passes_per_step=backward_passes_per_step,
        op=reduce_op,
        **extra,
    )
    return COMM_CLOCK.wrap_synchronize(wrapped)


# ------------------------------------------------------------------------------ process-set collectives
# (model parallelism, see ``Groups``): every rank of the group calls them in the same order; a group of
# one rank makes each a no-op.


def _set_of(group: str) -> Any:
    if group not in ("region", "replica"):
        raise ValueError(f"group must be 'region' or 'replica', got {group!r}")
    return _groups.region_set if group == "region" else _groups.replica_set


def _leader(group: str) -> int:
    return (_groups.region_ranks() if group == "region" else _groups.replica_ranks())[0]


class _SegmentGather(torch.autograd.Function):
    """Allgather within the replica group whose backward returns this rank's slice of the incoming gradient.

    Valid because every rank of the replica group computes the same function of the gathered tensor
    (the same merged loss on the same rays): each rank's gradient of its own slice is already the whole
    gradient. Horovod's own ``allgather`` backward would allreduce-average the ``[K * n, C]`` gradient
    over the group first (horovod/torch/mpi_ops.py, HorovodAllgather.backward): the same values, one
    collective more per backward pass."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, name: str | None) -> torch.Tensor:
        ctx.rows, ctx.index = tensor.shape[0], _groups.region
        with COMM_CLOCK.blocking(tensor):
            return _hvd.allgather(tensor.contiguous(), name=name, process_set=_groups.replica_set)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.narrow(0, ctx.index * ctx.rows, ctx.rows), None


def replica_allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """The replica group's ``tensor`` ``[n, C]`` (the same n on every rank) concatenated in region order ->
    ``[K * n, C]``, differentiable (see ``_SegmentGather``). Identity with one region."""
    if _hvd is None or _groups.replica_set is None:
        return tensor
    return _SegmentGather.apply(tensor, name)


def group_allreduce(tensor: torch.Tensor, group: str, op: str = "sum", name: str | None = None) -> torch.Tensor:
    """Allreduce within this rank's ``group`` ("region" | "replica"); a copy when the group is one rank."""
    ps = _set_of(group)
    if _hvd is None or ps is None:
        return tensor.clone()
    with COMM_CLOCK.blocking(tensor):
        return _hvd.allreduce(tensor, op=getattr(_hvd, _OPS[op]), name=name, process_set=ps)


def group_broadcast_(tensor: torch.Tensor, group: str, name: str | None = None) -> torch.Tensor:
    """In-place broadcast from the group's first rank (a region group: its leader, replica 0)."""
    ps = _set_of(group)
    if _hvd is None or ps is None:
        return tensor
    with COMM_CLOCK.blocking(tensor):
        return _hvd.broadcast_(tensor, root_rank=_leader(group), name=name, process_set=ps)


def group_broadcast_object(obj: T, group: str, name: str | None = None) -> T:
    """``obj`` of the group's first rank on every rank of the group."""
    ps = _set_of(group)
    if _hvd is None or ps is None:
        return obj
    with COMM_CLOCK.blocking():
        return _hvd.broadcast_object(obj, root_rank=_leader(group), name=name, process_set=ps)


def broadcast_region_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """``broadcast_state`` within the region group: every copy of a region starts from its leader's
    parameters, buffers and (if given) optimizer state (loaded and re-applied, so no zero-gradient step)."""
    if _hvd is None or _groups.region_set is None:
        return
    if optimizer is not None:
        state = group_broadcast_object(optimizer.state_dict(), "region", name="region.optimizer")
        optimizer.load_state_dict(state)
    for key, t in model.state_dict().items():
        group_broadcast_(t, "region", name=f"region.{key}")


# ------------------------------------------------------------------------------ elastic training


def elastic() -> bool:
    """True under an elastic horovodrun (``--min-np``/``--max-np``/``--host-discovery-script``)."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


def _refresh_runtime() -> None:
    """After an elastic reset: the new rank and sizes (the device stays: Horovod keeps slots stable)."""
    global _runtime
    old = runtime()
    _runtime = Runtime(
        _hvd.rank(), _hvd.size(), _hvd.local_rank(), _hvd.local_size(), _hvd.cross_size(), old.device, old.controller
    )


def elastic_run(
    body: Callable[[Any], T],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    tensors: dict[str, torch.Tensor],
    on_reset: Callable[[], None],
    **objects: Any,
) -> T:
    """Run ``body(state)`` under ``hvd.elastic.run`` with a ``TorchState`` of model, optimizer, ``objects``.

    ``state.commit()`` (inside ``body``, collective) keeps an in-memory copy and raises Horovod's
    interrupt when hosts were added or removed; the wrapper then re-forms the world, calls
    ``on_reset()`` (after this module's runtime is refreshed), syncs the state from rank 0 and calls
    ``body`` again. ``tensors`` (e.g. the occupancy grid, whose bool buffer Horovod cannot
    broadcast) are saved, restored and broadcast with the state. An optimizer with no state yet is
    not broadcast (Horovod would initialise it with a zero-gradient step that moves weight-decayed
    parameters); the model is broadcast after the optimizer so any such move is overwritten.
    """
    if _hvd is None:
        raise RuntimeError("elastic_run needs an elastic horovodrun")
    from horovod.torch.elastic import TorchState

    class State(TorchState):
        def __init__(self) -> None:
            self._tensors = tensors
            self._saved_tensors = {k: t.clone() for k, t in tensors.items()}
            super().__init__(model=model, optimizer=optimizer, **objects)

        def save(self) -> None:
            self._saved_tensors = {k: t.clone() for k, t in self._tensors.items()}
            super().save()

        def restore(self) -> None:
            for k, t in self._tensors.items():
                t.copy_(self._saved_tensors[k])
            super().restore()

        def sync(self) -> None:
            stateless = _hvd.broadcast_object(len(optimizer.state) == 0, root_rank=0, name="elastic.stateless")
            if not stateless:
                self._handlers["optimizer"].sync()
            self._handlers["model"].sync()
            for k, t in self._tensors.items():
                _hvd.broadcast_(t, root_rank=0, name=f"elastic.{k}")
            super(TorchState, self).sync()  # the plain objects

    state = State()
    state.register_reset_callbacks([_refresh_runtime, on_reset])
    return _hvd.elastic.run(body)(state)


# ------------------------------------------------------------------------------ agreement on failure


def is_collective_failure(exc: BaseException) -> bool:
    """True for Horovod's error when a collective was aborted because another rank failed or left."""
    return type(exc).__name__ == "HorovodInternalError"


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
    if not communicating():
        if message:
            raise RankFailure(message)
        return result
    messages = allgather_object(message, name="agree")  # not named after `what`: it may differ across ranks
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
