"""Run under ``horovodrun -np N``: ``FlatGradients.allreduce_`` (and ``allreduce_start``) against Horovod's
per-tensor allreduce.

    python tests/parallel/check_flatgrad.py

A small model (float32 MLP, float16 and float32 "tables") on rank-dependent inputs. Asserted on
every rank, each printed as ``CHECK <name> OK`` on rank 0:

1. ``exact``: the flat allreduce (one call per dtype, counted) equals ``hvd.allreduce`` per
   parameter (average) and the DistributedOptimizer's reduced gradients, identical on every
   rank and unlike this rank's own; also with pre/postscale factors that cancel;
2. ``fp16``: with fp16 compression it equals Horovod's ``Compression.fp16`` per parameter (cast
   to half, average, cast back) and the DistributedOptimizer with ``compression="fp16"``;
3. ``guard``: the non-finite guard's flags folded into the float32 tail: one NaN loss or one
   stop request on one rank is seen by every rank, with no collective beyond the gradients';
4. ``views``: Horovod's DistributedOptimizer keeps the views without compression and replaces
   them (``p.grad.set_``) with fp16 compression;
5. ``start``: ``allreduce_start``, host work of rank-dependent length, ``wait()``: the same
   collectives and bit-identical buffers as ``allreduce_``, with and without fp16 compression.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import tensor_digest as digest  # noqa: E402

from hvd_ngp.cluster import dist  # noqa: E402
from hvd_ngp.cluster.flatgrad import FlatGradientError, FlatGradients  # noqa: E402
from hvd_ngp.state.failures import NonFiniteGuard  # noqa: E402


class Tiny(torch.nn.Module):
    """MLP on looked-up features: x [B, 3], idx [B] -> [B]; float16 and float32 tables."""

    def __init__(self) -> None:
        super().__init__()
        self.table16 = torch.nn.Parameter(torch.randn(64, 4).half())
        self.table32 = torch.nn.Parameter(torch.randn(32, 4))
        self.mlp = torch.nn.Sequential(torch.nn.Linear(11, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        feats = torch.cat([x, self.table16[idx].float(), self.table32[idx % 32]], dim=1)
        return self.mlp(feats)[:, 0]


def model() -> Tiny:
    torch.manual_seed(0)
    return Tiny()


def backward(m: Tiny, poison: float = 1.0) -> torch.Tensor:
    """Loss on this rank's own batch (different on every rank); gradients accumulate."""
    gen = torch.Generator().manual_seed(100 + dist.runtime().rank)
    x = torch.randn(48, 3, generator=gen)
    idx = torch.randint(0, 64, (48,), generator=gen)
    loss = (m(x, idx) ** 2).mean() * (1.0 + dist.runtime().rank) * poison
    loss.backward()
    return loss.detach()


class CountCalls:
    """Counts Horovod allreduce submissions (``allreduce_async_``) while active."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __enter__(self) -> "CountCalls":
        hvd = dist._hvd
        self._inner = inner = hvd.allreduce_async_

        def counted(tensor, *a, **kw):
            self.names.append(kw.get("name"))
            return inner(tensor, *a, **kw)

        hvd.allreduce_async_ = counted
        return self

    def __exit__(self, *exc) -> None:
        dist._hvd.allreduce_async_ = self._inner


def per_tensor(grads: list[torch.Tensor], tag: str, compression: str = "none") -> list[torch.Tensor]:
    """Horovod's per-tensor average (``hvd.allreduce``), with ``Compression.fp16``'s cast when asked."""
    if compression == "fp16":
        return [dist.allreduce(g.half(), "avg", name=f"{tag}.{i}").to(g.dtype) for i, g in enumerate(grads)]
    return [dist.allreduce(g, "avg", name=f"{tag}.{i}") for i, g in enumerate(grads)]


def distributed_optimizer_grads(compression: str) -> list[torch.Tensor]:
    """The gradients a Horovod DistributedOptimizer reduces (hooks, fusion, its own compression)."""
    m = model()
    opt = dist.distributed_optimizer(torch.optim.SGD(m.parameters(), lr=0.0), m.named_parameters(), compression)
    opt.zero_grad()
    backward(m)
    opt.synchronize()
    return [p.grad.clone() for p in m.parameters()]


def assert_same_everywhere(tensors, what: str) -> None:
    every = dist.allgather_object(digest(tensors), name=f"check.{what}")
    assert len(set(every)) == 1, f"{what}: ranks differ: {every}"


def assert_matches(got: list[torch.Tensor], want: list[torch.Tensor], names: list[str], what: str) -> bool:
    """Close to float tolerance; returns whether every value is bit-identical."""
    exact = True
    for name, g, w in zip(names, got, want):
        assert g.dtype == w.dtype, f"{what} {name}: dtype {g.dtype} vs {w.dtype}"
        tol = {"rtol": 1e-3, "atol": 1e-5} if g.dtype == torch.float16 else {"rtol": 1e-6, "atol": 1e-9}
        torch.testing.assert_close(g, w, **tol, msg=lambda m: f"{what} {name}: {m}")
        exact = exact and torch.equal(g, w)
    return exact


def check_exact(root: bool) -> None:
    m = model()
    names = [n for n, _ in m.named_parameters()]
    flat = FlatGradients(m.named_parameters())
    assert sorted(map(str, flat.buffers)) == ["torch.float16", "torch.float32"], flat.describe()
    backward(m)
    local = [p.grad.clone() for p in m.parameters()]
    reference = per_tensor(local, "ref")
    with CountCalls() as calls:
        flat.allreduce_()
    assert calls.names == ["flatgrad.float16", "flatgrad.float32"], calls.names
    flat.check_views()
    reduced = [p.grad.clone() for p in m.parameters()]
    assert_same_everywhere(reduced, "exact")
    assert any(not torch.equal(a, b) for a, b in zip(local, reduced)), "inputs were not rank-dependent"
    bitwise = assert_matches(reduced, reference, names, "vs hvd.allreduce")
    bitwise &= assert_matches(reduced, distributed_optimizer_grads("none"), names, "vs DistributedOptimizer")
    # pre/postscale: halve before the sum, double after it -> the same average
    flat.zero_()
    backward(m)
    flat.allreduce_(prescale_factor=0.5, postscale_factor=2.0)
    assert_matches([p.grad for p in m.parameters()], reference, names, "scaled")
    # sum instead of average
    flat.zero_()
    backward(m)
    flat.allreduce_(average=False)
    n = dist.runtime().size
    assert_matches([p.grad for p in m.parameters()], [r * n for r in reference], names, "sum")
    if root:
        print(
            f"CHECK exact OK ({len(names)} parameters, 2 collectives, {'bit-identical' if bitwise else 'close'} "
            f"to per-tensor allreduce and DistributedOptimizer)",
            flush=True,
        )


def check_fp16(root: bool) -> None:
    m = model()
    names = [n for n, _ in m.named_parameters()]
    flat = FlatGradients(m.named_parameters())
    backward(m)
    local = [p.grad.clone() for p in m.parameters()]
    reference = per_tensor(local, "ref16", "fp16")
    plain = per_tensor(local, "ref32")
    with CountCalls() as calls:
        flat.allreduce_(compression="fp16")
    assert calls.names == ["flatgrad.float16", "flatgrad.float32.fp16"], calls.names
    flat.check_views()
    reduced = [p.grad.clone() for p in m.parameters()]
    assert_same_everywhere(reduced, "fp16")
    bitwise = assert_matches(reduced, reference, names, "vs Compression.fp16 per tensor")
    bitwise &= assert_matches(reduced, distributed_optimizer_grads("fp16"), names, "vs DistributedOptimizer fp16")
    # the compression really happened: some float32 gradient lost bits against the uncompressed average
    assert any(
        not torch.equal(r, p) for r, p, (_, q) in zip(reduced, plain, m.named_parameters()) if q.dtype == torch.float32
    ), "fp16 compression changed nothing"
    if root:
        print(f"CHECK fp16 OK ({'bit-identical' if bitwise else 'close'} to Compression.fp16)", flush=True)


def check_guard(root: bool) -> None:
    rank = dist.runtime().rank
    for compression in ("none", "fp16"):
        stop = {"value": False}
        guard = NonFiniteGuard(limit=5, stop_requested=lambda: stop["value"])
        m = model()
        flat = FlatGradients(m.named_parameters(), tail=guard.width)
        opt = torch.optim.SGD(m.parameters(), lr=0.0)
        verdicts = []
        # step 1: clean; step 2: NaN loss on the last rank; step 3: a stop request on the last rank only
        for step, (poison, stop_here) in enumerate([(1.0, False), (float("nan"), False), (1.0, True)], start=1):
            last = rank == dist.runtime().size - 1
            stop["value"] = stop_here and last
            flat.zero_()
            loss = backward(m, poison if last else 1.0)
            guard.fold(loss, flat.tail)
            with CountCalls() as calls:
                flat.allreduce_(compression=compression)
            assert len(calls.names) == 2, calls.names  # the flags cost no collective of their own
            verdicts.append((guard.should_skip(opt, step, grads=flat), guard.stop_agreed))
        assert verdicts == [(False, False), (True, False), (False, True)], f"{compression}: {verdicts}"
        every = dist.allgather_object(verdicts, name=f"check.guard.{compression}")
        assert all(v == verdicts for v in every), every
    if root:
        print(
            "CHECK guard OK (NaN loss and stop request on one rank seen by all, folded into the gradients)", flush=True
        )


def check_views(root: bool) -> None:
    kept = {}
    for compression in ("none", "fp16"):
        m = model()
        flat = FlatGradients(m.named_parameters())
        opt = dist.distributed_optimizer(torch.optim.SGD(m.parameters(), lr=0.0), m.named_parameters(), compression)
        backward(m)
        opt.synchronize()
        try:
            flat.check_views()
            kept[compression] = True
        except FlatGradientError:
            kept[compression] = False
    assert kept == {"none": True, "fp16": False}, kept
    if root:
        print(
            "CHECK views OK (DistributedOptimizer keeps them uncompressed, fp16 compression replaces them)", flush=True
        )


def check_start(root: bool) -> None:
    rank = dist.runtime().rank
    for compression in ("none", "fp16"):
        waited, started = model(), model()
        flat_waited, flat_started = FlatGradients(waited.named_parameters()), FlatGradients(started.named_parameters())
        backward(waited)
        backward(started)
        flat_waited.allreduce_(compression=compression)
        with CountCalls() as calls:
            pending = flat_started.allreduce_start(compression=compression)
            # host work meanwhile (as the trainer's rays drawn ahead), longer on some ranks than on others
            gen = torch.Generator().manual_seed(7 + rank)
            for _ in range(20 * (1 + rank)):
                torch.rand(256, 256, generator=gen) @ torch.rand(256, 256, generator=gen)
            pending.wait()
        assert calls.names == ["flatgrad.float16", "flatgrad.float32" + (".fp16" if compression == "fp16" else "")], (
            calls.names
        )
        flat_started.check_views()
        got = [p.grad for p in started.parameters()]
        want = [p.grad for p in waited.parameters()]
        assert all(torch.equal(g, w) for g, w in zip(got, want)), f"{compression}: start + wait != allreduce_"
        assert all(torch.equal(flat_started.buffers[dt], b) for dt, b in flat_waited.buffers.items()), compression
        assert_same_everywhere(got, f"start.{compression}")
    if root:
        print(
            "CHECK start OK (allreduce_start, work, wait: bit-identical to allreduce_, with and without fp16)",
            flush=True,
        )


def main() -> None:
    dist.init("cpu")
    rt = dist.runtime()
    assert rt.size > 1, "run under horovodrun -np 2 or more"
    check_exact(rt.is_root)
    check_fp16(rt.is_root)
    check_guard(rt.is_root)
    check_views(rt.is_root)
    check_start(rt.is_root)


if __name__ == "__main__":
    main()
