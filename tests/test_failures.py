"""Failure handling in one process: the non-finite step guard, the watchdog and exit messages. (Real ranks:
test_reliability.py; fault parsing: test_faults.py; the elastic learning-rate rule: test_comm.py.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ROOT, gpu_or_skip

from hvd_ngp.cluster import dist
from hvd_ngp.errors import SceneError
from hvd_ngp.state.failures import NonFiniteError, NonFiniteGuard, report


@pytest.fixture(autouse=True)
def size_one_runtime():
    dist.init("cpu")
    yield
    dist.shutdown()


def model_and_adam():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(4, 3)).sum().backward()
    opt.step()  # some Adam state to protect
    return model, opt


def guarded_step(model, opt, guard, step, poison: float = 1.0) -> bool:
    loss = model(torch.ones(4, 3)).sum() * poison
    guard.submit(loss)
    opt.zero_grad()
    loss.backward()
    if guard.should_skip(opt, step):
        return True
    opt.step()
    return False


def snapshot(model, opt):
    return [t.clone() for t in model.state_dict().values()] + [
        t.clone() for s in opt.state_dict()["state"].values() for t in s.values()
    ]


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_a_non_finite_step_changes_nothing(poison):
    model, opt = model_and_adam()
    guard = NonFiniteGuard(limit=3)
    before = snapshot(model, opt)
    assert guarded_step(model, opt, guard, 5, poison) is True
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(model, opt)))
    assert guard.skipped == [5]
    assert guarded_step(model, opt, guard, 6) is False  # a finite step goes through and resets the count
    assert guard.consecutive == 0
    assert not all(torch.equal(a, b) for a, b in zip(before, snapshot(model, opt)))


def test_non_finite_gradients_with_a_finite_loss_are_caught():
    model, opt = model_and_adam()
    guard = NonFiniteGuard(limit=3)
    loss = model(torch.ones(4, 3)).sum()
    guard.submit(loss)
    opt.zero_grad()
    loss.backward()
    model.weight.grad[0, 0] = float("inf")
    assert guard.should_skip(opt, 1) is True
    guard.submit(loss.detach())
    assert guard.should_skip(opt, 2, check_gradients=False) is False  # fp16: the scaler handles gradients


def test_repeated_non_finite_steps_stop_the_run():
    model, opt = model_and_adam()
    guard = NonFiniteGuard(limit=3)
    assert guarded_step(model, opt, guard, 10, float("nan"))
    assert guarded_step(model, opt, guard, 11, float("nan"))
    with pytest.raises(NonFiniteError, match=r"non-finite loss or gradients in 3 consecutive steps \(10-12\)"):
        guarded_step(model, opt, guard, 12, float("nan"))


def run_script(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("stop", [False, True])
def test_the_flags_hold_the_loss_verdict_and_the_stop_request(stop):
    guard = NonFiniteGuard(3, stop_requested=lambda: stop)
    assert guard.flags(torch.tensor(float("nan"))).tolist() == [1.0, float(stop)]
    tail = torch.full((2,), 7.0)
    guard.fold_stop(tail)  # the loss flag (written on the device by the graphed step) stays
    assert tail.tolist() == [7.0, float(stop)]
    zeroed = torch.tensor([7.0, 0.0])
    version = zeroed._version
    guard.fold_stop(zeroed, zeroed=True)  # the graphed step's zeroed tail: written only for a stop
    assert zeroed.tolist() == [7.0, float(stop)] and (zeroed._version > version) == stop


def test_writing_the_flags_on_a_gpu_does_not_wait_for_it():
    """``tail[1] = float(flag)`` synchronised the stream on every step (the host waited there for the whole
    graphed step); torch's sync debug mode turns any such wait into an error."""
    gpu_or_skip()
    guard = NonFiniteGuard(3, stop_requested=lambda: True)
    tail = torch.zeros(2, device="cuda")
    loss = torch.ones((), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        guard.fold_stop(tail)
        flags = guard.flags(loss)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tail.tolist() == [0.0, 1.0] and flags.tolist() == [0.0, 1.0]


def test_watchdog_ends_a_stuck_process_with_a_message_and_status_3():
    proc = run_script("""
        import time
        from hvd_ngp.state.failures import Watchdog
        dog = Watchdog(1.0, rank=0).start()
        with dog.armed():
            dog.kick(41)
            with dog.paused():
                time.sleep(2.5)  # paused: a long evaluation is fine
            dog.kick(42)
            time.sleep(60)       # stuck
    """)
    assert proc.returncode == 3, proc.stderr
    assert "[rank 0] hvd_ngp: error: no training step finished for 1 s (last finished: step 42)" in proc.stderr
    assert "time.sleep(60)" in proc.stderr or "<string>" in proc.stderr  # where it was stuck


def test_watchdog_is_quiet_outside_the_loop():
    proc = run_script("""
        import time
        from hvd_ngp.state.failures import Watchdog
        dog = Watchdog(0.5, rank=0).start()
        time.sleep(2)  # not armed: start-up, final evaluation
        print("finished")
    """)
    assert proc.returncode == 0 and "finished" in proc.stdout, proc.stderr


def test_unexpected_exceptions_exit_fast_with_status_1_and_a_short_traceback(tmp_path):
    proc = run_script("""
        import sys
        from hvd_ngp import train
        train.main = lambda argv=None: 1 / 0
        train.cli([])
    """)
    assert proc.returncode == 1
    assert proc.stderr.startswith("hvd_ngp: fatal: unexpected ZeroDivisionError")
    assert "ZeroDivisionError: division by zero" in proc.stderr


def test_report_exit_codes(capsys):
    assert report(SceneError("scene.json: broken")) == 2
    assert report(KeyboardInterrupt()) == 130
    assert report(RuntimeError("boom")) == 1
    err = capsys.readouterr().err
    assert "hvd_ngp: error: scene.json: broken" in err and "hvd_ngp: interrupted" in err and "RuntimeError: boom" in err
