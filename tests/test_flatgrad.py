"""Flat gradient buffers (``cluster.flatgrad``): views that survive backward and zeroing, dtype groups,
no Horovod call at size 1, one call per dtype otherwise, started and waited for apart; against Horovod itself
at 2 ranks (Gloo and MPI)."""

from __future__ import annotations

import pytest
import torch
from conftest import run_ranks

from hvd_ngp.cluster import dist
from hvd_ngp.cluster.flatgrad import ALIGN_BYTES, FlatGradientError, FlatGradients
from hvd_ngp.state.failures import NonFiniteGuard


class Mixed(torch.nn.Module):
    """Float32 MLP on a float16 table's features: idx [B] -> [B]."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(50, 3).half())
        self.mlp = torch.nn.Sequential(torch.nn.Linear(3, 7), torch.nn.ReLU(), torch.nn.Linear(7, 1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.table[idx].float())[:, 0]


def loss_of(m: Mixed, seed: int) -> torch.Tensor:
    idx = torch.randint(0, 50, (32,), generator=torch.Generator().manual_seed(seed))
    return (m(idx) ** 2).mean()


def reference_grads(seeds: list[int]) -> list[torch.Tensor]:
    """Gradients of the summed losses, accumulated the ordinary way (no flat buffer)."""
    m = Mixed()
    for s in seeds:
        loss_of(m, s).backward()
    return [p.grad.clone() for p in m.parameters()]


def in_buffer(flat: FlatGradients, m: torch.nn.Module) -> bool:
    """Every gradient's memory lies inside its dtype's buffer."""
    for p in m.parameters():
        buf = flat.buffers[p.dtype]
        lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()
        if not (lo <= p.grad.data_ptr() < hi):
            return False
    return True


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.0),
        lambda ps: torch.optim.Adam(ps, lr=0.0, eps=1e-3, foreach=True),
    ],  # fp16 eps
    ids=["sgd", "adam_foreach"],
)
def test_views_survive_backward_step_and_zeroing(make_opt):
    m = Mixed()
    flat = FlatGradients(m.named_parameters())
    opt = make_opt(list(m.parameters()))
    loss_of(m, 1).backward()
    loss_of(m, 2).backward()  # accumulates in place into the views
    flat.check_views()
    assert in_buffer(flat, m)
    for g, want in zip((p.grad for p in m.parameters()), reference_grads([1, 2])):
        torch.testing.assert_close(g, want)
    opt.step()
    flat.check_views()
    opt.zero_grad(set_to_none=False)
    flat.check_views()
    assert all(float(b.abs().sum()) == 0 for b in flat.buffers.values())
    loss_of(m, 3).backward()
    assert float(flat.buffers[torch.float32].abs().sum()) > 0 and float(flat.buffers[torch.float16].abs().sum()) > 0
    flat.zero_()
    flat.check_views()
    assert all(float(p.grad.abs().sum()) == 0 for p in m.parameters())
    loss_of(m, 3).backward()
    for g, want in zip((p.grad for p in m.parameters()), reference_grads([3])):
        torch.testing.assert_close(g, want)


def test_set_to_none_is_caught_and_attach_repairs_it():
    m = Mixed()
    flat = FlatGradients(m.named_parameters())
    loss_of(m, 1).backward()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    opt.zero_grad()  # default set_to_none=True
    with pytest.raises(FlatGradientError, match=r"table: \.grad is None.*zero_grad\(set_to_none=False\)"):
        flat.check_views()
    with pytest.raises(FlatGradientError):
        flat.allreduce_()
    loss_of(m, 1).backward()  # autograd allocated fresh gradients
    with pytest.raises(FlatGradientError, match="a separate tensor"):
        flat.check_views()
    flat.attach()  # copies them in and re-points
    flat.check_views()
    assert in_buffer(flat, m)
    for g, want in zip((p.grad for p in m.parameters()), reference_grads([1])):
        torch.testing.assert_close(g, want)


def test_dtype_groups_alignment_and_tail():
    a = torch.nn.Parameter(torch.randn(3))
    b = torch.nn.Parameter(torch.randn(5, 2).half())
    c = torch.nn.Parameter(torch.randn(4, 4))
    d = torch.nn.Parameter(torch.randn(6, dtype=torch.float64))
    frozen = torch.nn.Parameter(torch.randn(9), requires_grad=False)
    a.grad = torch.full_like(a, 7.0)  # an existing gradient is kept
    flat = FlatGradients([a, b, c, d, frozen, a], tail=2)
    assert list(flat.buffers) == [torch.float16, torch.float32, torch.float64]  # by dtype name: same on every rank
    assert [p for _, p in flat.params] == [a, b, c, d]
    for p in (a, b, c, d):
        buf = flat.buffers[p.dtype]
        assert p.grad.dtype == p.dtype and p.grad.shape == p.shape
        assert (p.grad.data_ptr() - buf.data_ptr()) % ALIGN_BYTES == 0
    assert frozen.grad is None
    f32 = flat.buffers[torch.float32]
    # a: [0, 3), c: [16, 32) (aligned to 64 bytes), the tail [32, 34), float32 alone
    assert f32.numel() == 34 and c.grad.data_ptr() == f32.data_ptr() + 16 * 4
    assert flat.tail.shape == (2,) and flat.tail.data_ptr() == f32.data_ptr() + 32 * 4
    assert torch.equal(a.grad, torch.full((3,), 7.0)) and float(f32[3:].abs().sum()) == 0
    assert flat.buffers[torch.float16].numel() == 10 and flat.buffers[torch.float64].numel() == 6
    assert flat.numel == 50 and flat.nbytes == 10 * 2 + 34 * 4 + 6 * 8
    assert flat.describe() == "flat gradients: float16 10 (20 B), float32 32 + tail 2 (136 B), float64 6 (48 B)"
    # the tail is not a gradient: a non-finite flag there does not make the gradients non-finite
    flat.tail.fill_(float("inf"))
    assert flat.all_finite()
    c.grad[1, 1] = float("nan")
    assert not flat.all_finite()
    # a tail and no float32 parameter: a float32 buffer for the tail alone
    only16 = FlatGradients([torch.nn.Parameter(torch.zeros(4).half())], tail=1)
    assert only16.buffers[torch.float32].numel() == 1 and only16.tail.numel() == 1


def test_clear_errors():
    with pytest.raises(ValueError, match="nothing to reduce"):
        FlatGradients([torch.nn.Parameter(torch.zeros(2), requires_grad=False)])
    with pytest.raises(ValueError, match="one device"):
        FlatGradients([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, device="meta"))])
    with pytest.raises(ValueError, match="tail must be >= 0"):
        FlatGradients([torch.nn.Parameter(torch.zeros(2))], tail=-1)
    flat = FlatGradients([torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(ValueError, match="compression must be one of"):
        flat.allreduce_(compression="bf16")


class FakeHorovod:
    """Records what would reach Horovod; ``allreduce_async_`` applies the factors (identical ranks: sum / size
    * size = the tensor itself for an average)."""

    Average, Sum = "Average", "Sum"

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def allreduce_async_(self, tensor, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0):
        self.calls.append(
            {
                "name": name,
                "dtype": tensor.dtype,
                "numel": tensor.numel(),
                "op": op,
                "prescale": prescale_factor,
                "postscale": postscale_factor,
            }
        )
        tensor.mul_(prescale_factor * postscale_factor * (2 if op == "Sum" else 1))
        return len(self.calls)

    def synchronize(self, handle):
        self.calls[handle - 1]["synchronized"] = True


def fake_world(monkeypatch, size: int) -> FakeHorovod:
    fake = FakeHorovod()
    monkeypatch.setattr(dist, "_hvd", fake)
    monkeypatch.setattr(dist, "_runtime", dist.Runtime(0, size, 0, size, 1, torch.device("cpu"), "gloo"))
    return fake


@pytest.mark.parametrize("started", [False, True], ids=["allreduce_", "allreduce_start"])
@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_size_one_makes_no_horovod_call_and_changes_nothing(monkeypatch, compression, started):
    fake = fake_world(monkeypatch, 1)
    m = Mixed()
    flat = FlatGradients(m.named_parameters(), tail=1)
    loss_of(m, 1).backward()
    before = {dt: b.clone() for dt, b in flat.buffers.items()}

    def reduce(**kwargs) -> None:
        if not started:
            return flat.allreduce_(**kwargs)
        pending = flat.allreduce_start(**kwargs)
        pending.wait()
        pending.wait()  # a second wait does nothing

    reduce(compression=compression, prescale_factor=3.0)
    assert fake.calls == []
    assert all(torch.equal(before[dt], b) for dt, b in flat.buffers.items())  # not even the fp16 cast
    if started:  # one rank's sum, even scaled by 3: the buffers as they were, with no Horovod call
        dist.allreduce_buffers_start(list(flat.buffers.values()), ["a", "b"], op="sum", prescale_factor=3.0).wait()
        assert fake.calls == [] and all(torch.equal(before[dt], b) for dt, b in flat.buffers.items())
    monkeypatch.setattr(dist, "_hvd", None)  # never initialised (no launcher): the same
    reduce(compression=compression)
    assert all(torch.equal(before[dt], b) for dt, b in flat.buffers.items())


def two_ranks_with_gradients(monkeypatch) -> tuple[FakeHorovod, FlatGradients]:
    """A fake 2-rank world and flat gradients (named "step", a 2-float tail) after one backward."""
    fake = fake_world(monkeypatch, 2)
    m = Mixed()
    flat = FlatGradients(m.named_parameters(), tail=2, name="step")
    loss_of(m, 1).backward()
    return fake, flat


def test_start_submits_everything_and_wait_synchronizes_then_copies_back(monkeypatch):
    fake, flat = two_ranks_with_gradients(monkeypatch)
    f32 = flat.buffers[torch.float32].clone()
    pending = flat.allreduce_start(average=False, compression="fp16")
    assert [(c["name"], c["dtype"], c["op"], "synchronized" in c) for c in fake.calls] == [
        ("step.float16", torch.float16, "Sum", False),
        ("step.float32.fp16", torch.float16, "Sum", False),
    ]
    assert torch.equal(flat.buffers[torch.float32], f32)  # the fp16 result is still in the staging buffer
    pending.wait()
    assert all(c["synchronized"] for c in fake.calls)
    torch.testing.assert_close(flat.buffers[torch.float32], (f32.half() * 2).float(), rtol=0, atol=0)
    fake.calls.clear()
    pending.wait()  # once only: no second synchronize, no second copy
    assert fake.calls == []
    torch.testing.assert_close(flat.buffers[torch.float32], (f32.half() * 2).float(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="2 tensors but 1 names"):
        dist.allreduce_buffers_start(list(flat.buffers.values()), ["one"])


def test_one_call_per_dtype_with_compression_and_factors(monkeypatch):
    fake, flat = two_ranks_with_gradients(monkeypatch)
    f32 = flat.buffers[torch.float32].clone()
    flat.allreduce_(prescale_factor=0.5, postscale_factor=2.0)
    calls = [(c["name"], c["dtype"], c["op"], c["prescale"], c["postscale"], c["synchronized"]) for c in fake.calls]
    assert calls == [
        ("step.float16", torch.float16, "Average", 0.5, 2.0, True),
        ("step.float32", torch.float32, "Average", 0.5, 2.0, True),
    ]
    assert fake.calls[1]["numel"] == flat.buffers[torch.float32].numel()  # the tail travels with the gradients
    fake.calls.clear()
    flat.allreduce_(average=False, compression="fp16")
    # fp16 on the wire for both; the float32 buffer comes back as float32, rounded through half precision
    assert [(c["name"], c["dtype"], c["op"]) for c in fake.calls] == [
        ("step.float16", torch.float16, "Sum"),
        ("step.float32.fp16", torch.float16, "Sum"),
    ]
    assert flat.buffers[torch.float32].dtype == torch.float32
    torch.testing.assert_close(flat.buffers[torch.float32], (f32.half() * 2).float(), rtol=0, atol=0)
    assert not torch.equal(flat.buffers[torch.float32], f32 * 2)  # the rounding did happen
    flat.check_views()


def test_guard_flags_fold_into_the_tail():
    stop = {"value": False}
    guard = NonFiniteGuard(limit=3, stop_requested=lambda: stop["value"])
    m = Mixed()
    flat = FlatGradients(m.named_parameters(), tail=guard.width)
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    with pytest.raises(RuntimeError, match="before submit\\(\\) or fold\\(\\)"):
        guard.should_skip(opt, 1)
    with pytest.raises(ValueError, match=r"float32 \[2\]"):
        guard.fold(torch.tensor(1.0), flat.tail[:1])
    loss = loss_of(m, 1)
    loss.backward()
    guard.fold(loss.detach(), flat.tail)
    flat.allreduce_()
    assert flat.tail.tolist() == [0.0, 0.0] and guard.should_skip(opt, 1, grads=flat) is False
    stop["value"] = True
    guard.fold(torch.tensor(float("nan")), flat.tail)
    assert flat.tail.tolist() == [1.0, 1.0]
    assert guard.should_skip(opt, 2, grads=flat) is True and guard.stop_agreed
    stop["value"] = False
    guard.fold(torch.tensor(0.5), flat.tail)
    m.mlp[0].weight.grad[0, 0] = float("inf")  # a non-finite gradient with a finite loss
    assert guard.should_skip(opt, 3, grads=flat) is True and not guard.stop_agreed
    assert guard.skipped == [2, 3]


@pytest.mark.parallel
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_flat_allreduce_matches_horovod_per_tensor(controller):
    proc = run_ranks(["tests/parallel/check_flatgrad.py"], controller=controller, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for check in ("exact", "fp16", "guard", "views", "start"):
        assert f"CHECK {check} OK" in out, out[-4000:]
