"""The run loop and its schedule: log intervals, evaluations, checkpoints, stops, the time budget, metrics.

``train`` runs a built ``Trainer`` (every rank) through ``RunLoop``: steps until ``--n_steps``, a time
budget, a stop signal or ``stop_after_eval``; between steps, in the same order on every rank, the
stop vote, the monitor's interval, evaluations and checkpoints, all decided from one shared clock
reading so every rank decides the same way. The clocks, the watchdog and the monitor are paused
around each evaluation and checkpoint (``paused``). At the end: the final checkpoint, evaluation,
snapshot and metrics (``metrics.json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from ..cluster import dist, elastic, preempt
from ..errors import ConfigError, OutputError, os_cause
from ..model.field import NGPField
from ..observe.clock import TrainClock
from ..observe.memory import GIB
from ..observe.metrics import UNLIMITED_STEPS, IntervalStats
from ..observe.monitor import Monitor
from ..render.occupancy import OccupancyGrid
from ..settings import OutputSettings, Settings
from ..state import checkpoint
from ..state.failures import Watchdog
from ..state.outputs import OutputLock, check_output_files, describe_owner
from .builder import device_name
from .control import RunControl, Watcher
from .model_parallel import ModelParallel, hash_parameters
from .recipe import budget_lr_factor
from .step import StepResult

if TYPE_CHECKING:  # the trainer imports this module (its ``run`` hands over to ``train``)
    from .trainer import Trainer


@dataclass
class RunResult:
    """What a training run leaves behind (for tests and benchmarks that drive ``run`` in-process)."""

    field: NGPField
    grid: OccupancyGrid
    step: int
    metrics: dict
    stopped: str | None = None  # "SIGTERM on rank 1", ...: stopped early by a signal (exit EXIT_PREEMPTED)


def train(
    tr: "Trainer",
    s: Settings,
    stop_after_eval: Callable[[int, float], bool] | None = None,
    attach: Callable[["Trainer"], Watcher] | None = None,
) -> RunResult:
    """The run loop of ``trainer.run`` after start-up (every rank), with the output folder prepared and locked
    (``stop_after_eval``, ``attach``: as for ``run``)."""
    loop = RunLoop(tr, s, stop_after_eval, attach)
    if dist.elastic():
        elastic.run(loop.train_loop, tr.reseed, tr.state, s.loop.commit_every)
    else:
        loop.train_loop()
    return loop.finish()


class RunLoop:
    """One run's schedule state (the clock, watchdog, monitor, viewer control, pending evaluation times) and
    what happens between steps. ``tr.state.progress`` (saved in checkpoints) holds "history" (one entry per
    log interval), "curve" (test PSNR/SSIM against training time, with each evaluation's wall seconds),
    "total_samples" and "train_seconds" (training time before this process)."""

    def __init__(
        self,
        tr: "Trainer",
        s: Settings,
        stop_after_eval: Callable[[int, float], bool] | None,
        attach: Callable[["Trainer"], Watcher] | None,
    ) -> None:
        self.tr, self.s, self.stop_after_eval = tr, s, stop_after_eval
        self.out_dir = Path(s.output.out_dir)
        # what checkpoints and snapshots record: the resolved options (the precision as the trainer resolved it)
        self.config = {
            "args": {**s.flags, "precision": tr.precision},
            "trained_on": checkpoint.trained_on(s.model.blocks, tr.scene.digest()),
        }
        self.announce()
        progress = self.progress = tr.state.progress
        for key, empty in (("history", []), ("curve", []), ("total_samples", 0.0), ("train_seconds", 0.0)):
            progress.setdefault(key, empty)
        self.monitor = elastic.startup_agree(
            lambda: Monitor(s.monitor, s.loop.n_steps, tr.start_step, memory=tr.meter), "starting the monitor"
        )
        self.clock = TrainClock(tr.rt.device, already=progress["train_seconds"])
        self.watchdog = Watchdog(s.loop.watchdog_s, tr.rt.rank).start()
        self.last_timed_ckpt = progress["train_seconds"]  # a shared clock reading: the same on every rank
        self.watcher = None
        if attach is not None:  # off the training clock: the server's start (and a bench's wait for its watcher)
            with self.paused():
                self.watcher = dist.agree(lambda: attach(tr) if tr.rt.is_root else None, "starting the viewer")
        self.control = None if attach is None else RunControl(self.watcher, tr.stops.local)
        self.stopped: list[str] = []  # set when a stop signal was agreed (preempt)
        self.set_up = False  # this process's first step taken (outside the training clock: see first_step)
        self.eval_at: list[float] = []  # evaluation times (training seconds) still ahead
        # the monitor's current interval: ``train_loop`` starts it (``monitor.new_interval``) before any step
        self.stats = IntervalStats()

    def announce(self) -> None:
        tr, loop, march, grid = self.tr, self.s.loop, self.tr.march, self.tr.grid
        length = (
            f"{loop.n_steps} steps" + (f" (or {loop.time_budget_s:g} s)" if loop.time_budget_s else "")
            if loop.n_steps < UNLIMITED_STEPS
            else f"for {loop.time_budget_s:g} s"
        )
        dist.log(
            f"training {length}" + f", {self.s.step.target_samples} samples/step/rank, MLPs in {tr.precision}"
            f"{' (fused kernels)' if getattr(tr.field.density_mlp, 'train_fused', False) else ''}, "
            f"grid {grid.resolution}^3 x {grid.n_cascades}, "
            f"dt {march.schedule.dt_min:.5f}..{march.schedule.dt_max:.5f}, cone {march.schedule.cone_angle:.5f}"
            + (f", evaluations at dt {march.eval_schedule.dt_min:.5f}" if march.eval_schedule else "")
        )

    def paused(self):
        return paused(self.clock, self.watchdog, self.monitor)

    def write_checkpoint(self, step: int) -> Path:
        tr = self.tr
        tr.settle()  # a deferred verdict: the average and the error map of the last step first
        with self.paused():
            self.progress["train_seconds"] = self.clock.shared_seconds()
            self.progress["data"] = tr.data.state_dict()
            path = tr.ckpts.write(tr.state, self.config)
        dist.log(f"[step {step}] checkpoint {path}")
        return path

    def obey(self, step: int) -> None:
        """The viewer's requests, agreed by every rank after ``step`` (collective when due): a save writes a
        checkpoint; a pause holds every rank (off the training clock) until rank 0 resumes."""
        control = self.control
        assert control is not None, "between_steps obeys only where a viewer is attached (a RunControl)"
        asked = control.poll(step)
        while asked is not None:
            if asked.save:
                self.write_checkpoint(step)
                self.stats.started += self.clock.last_pause
            if not asked.pause or asked.stop:
                return
            dist.log(f"[step {step}] paused from the viewer")
            with self.paused():
                asked = control.wait()
            self.stats.started += self.clock.last_pause
            if not asked.pause:
                dist.log(f"[step {step}] resumed after {self.clock.last_pause:.1f} s")

    def stop_with_checkpoint(self, step: int, during: str = "") -> None:
        """Every rank agreed to stop (a signal, or the launcher gone): checkpoint, marker, then exit 75."""
        who = self.tr.stops.who()
        dist.log(
            f"[step {step}] stop requested ({who}){during}: writing a checkpoint, then exiting with status "
            f"{preempt.EXIT_PREEMPTED} (resume with --resume auto)"
        )
        path = self.write_checkpoint(step)
        dist.agree(
            lambda: preempt.write_marker(self.out_dir, step, self.s.loop.n_steps, who, path), "writing the stop marker"
        )
        self.stopped.append(who)

    def first_step(self) -> None:
        """The process's first step, off the training clock and the monitor's interval (the watchdog stays
        armed): on a GPU it compiles the Triton kernels when their cache is cold (about 15 s on one H200),
        which is set-up, like loading the scene, not training time in a --time_budget_s. Its samples are
        left out of the interval as well (settled here, before ``on_settled`` is back), so samples/s stays
        samples over the time they took."""
        tr, clock = self.tr, self.clock
        keep, tr.on_settled = tr.on_settled, None
        try:
            with clock.paused(), self.monitor.paused():
                tr.step(tr.state.step)
                tr.settle()
        finally:
            tr.on_settled = keep
        self.stats.started += clock.last_pause
        self.set_up = True
        dist.log(
            f"[step {tr.state.step + 1}] first step {clock.last_pause:.1f} s, not counted in the training time "
            f"(kernel compilation and warm-up; compiled kernels are cached for later runs)"
        )

    def train_loop(self, commit: Callable[[], None] | None = None) -> None:
        """Steps from ``tr.state.step`` to the end; re-entered after an elastic reset."""
        tr, ts, loop = self.tr, self.tr.state, self.s.loop
        self.eval_at = sorted(t for t in self.s.eval.eval_at_s if t > self.progress["train_seconds"])
        tr.budget_lr_factor = budget_lr_factor(self.progress["train_seconds"], loop.time_budget_s, loop.budget_lr_decay)
        self.stats = self.monitor.new_interval()

        def add(res: StepResult, n_rays: int) -> None:  # each step once its verdict is known (Trainer.settle)
            if not res.skipped:
                self.stats.add(res.loss, res.mse, n_rays, res.n_samples)

        tr.on_settled = add
        with self.watchdog.armed():
            while ts.step < loop.n_steps:
                if self.set_up:
                    tr.step(ts.step)
                else:
                    self.first_step()
                ts.step = step = ts.step + 1
                self.watchdog.kick(step)
                self.monitor.tick()
                if not self.between_steps(step, commit):
                    break
        tr.settle()
        if self.stats.steps and not self.stopped:  # the partial interval before a time-budget stop
            self.progress["total_samples"] += self.monitor.end_interval(
                ts.step, self.stats, self.clock.seconds(), tr.grid.occupancy_fraction()
            )["samples"]

    def between_steps(self, step: int, commit: Callable[[], None] | None) -> bool:
        """After ``step`` on every rank: the stop vote, the log interval, evaluations, checkpoints, the viewer,
        the elastic commit. False ends training."""
        tr = self.tr
        # a stop signal on any rank (preempt): agreed through this step's non-finite-guard allreduce
        # (or a tiny allreduce every 8 steps), so every rank stops after the same step
        if tr.stops.decide(step, tr.guard) and step < self.s.loop.n_steps:
            self.stop_with_checkpoint(step)
            return False
        if step % self.s.loop.log_every == 0 or step == self.s.loop.n_steps:
            self.end_interval(step)
        due, ckpt_due, stop = self.due(step)
        if due and not stop:
            verdict = self.evaluate_during(step)
            if verdict is None:  # a stop request cut the evaluation short
                return False
            stop = verdict
        if ckpt_due or (stop and self.s.output.checkpointing):
            self.write_checkpoint(step)
            self.stats.started += self.clock.last_pause
        if self.control is not None and not stop:
            if self.watcher is not None:
                self.watcher.after_step(step)  # rank 0 draws when a frame is due
            self.obey(step)
        if commit is not None:
            commit()
        return not stop

    def end_interval(self, step: int) -> None:
        """The log interval's end: the monitor's reduction (collective; rank 0 prints), the trainer's interval
        work (balance, resolution), the history entry, a new interval."""
        tr = self.tr
        tr.settle()
        seconds = self.clock.seconds()
        r = self.monitor.end_interval(step, self.stats, seconds, tr.grid.occupancy_fraction())
        if self.watcher is not None:
            self.watcher.record(step, {"loss": r["loss"], "train_psnr": r["train_psnr"]})
        tr.end_interval(self.monitor.table)
        self.progress["total_samples"] += r["samples"]
        self.progress["history"].append(
            {
                "step": step,
                "seconds": round(seconds, 3),
                "loss": r["loss"],
                "train_psnr": r["train_psnr"],
                "samples_per_sec": r["samples_per_s"],
                "rays_per_step": r["rays_per_step"],
                "step_time_spread": r["step_time_spread"],
                "gpu_util_spread": r["gpu_util_spread"],
                **{k: r[k] for k in ("interval_s", "comm_fraction", "gpu_util", "energy_j")},
            }
        )
        self.stats = self.monitor.new_interval()

    def due(self, step: int) -> tuple[bool, bool, bool]:
        """(evaluate now, checkpoint now, stop now) after ``step``: evaluation points, the time budget and timed
        checkpoints, decided from one shared clock reading every 8 steps."""
        tr, ev, loop, out = self.tr, self.s.eval, self.s.loop, self.s.output
        due = ((ev.eval_every and step % ev.eval_every == 0) or step in ev.eval_at_steps) and step < loop.n_steps
        ckpt_due = tr.ckpts.due_by_steps(step)
        stop = False
        if (self.eval_at or loop.time_budget_s or out.ckpt_every_minutes) and step % 8 == 0:
            elapsed = self.clock.shared_seconds()
            due = due or bool(self.eval_at and elapsed >= self.eval_at[0])
            self.eval_at = [t for t in self.eval_at if t > elapsed]
            stop = bool(loop.time_budget_s and elapsed >= loop.time_budget_s)
            tr.budget_lr_factor = budget_lr_factor(elapsed, loop.time_budget_s, loop.budget_lr_decay)
            if out.ckpt_every_minutes and elapsed - self.last_timed_ckpt >= 60 * out.ckpt_every_minutes:
                ckpt_due, self.last_timed_ckpt = True, elapsed
        return due, ckpt_due, stop

    def evaluate_during(self, step: int) -> bool | None:
        """An evaluation during training (off the clock): True when ``stop_after_eval`` ends training here,
        None when a stop request cut it short (checkpoint and marker written)."""
        tr, clock = self.tr, self.clock
        tr.settle()
        seconds = clock.seconds()
        with self.paused():
            ev = tr.evaluate()
        self.stats.started += clock.last_pause
        if ev.get("stopped"):
            self.stop_with_checkpoint(step, " during an evaluation")
            return None
        self.progress["curve"].append(
            {
                "step": step,
                "seconds": round(seconds, 3),
                "psnr": ev["psnr"],
                "ssim": ev["ssim"],
                "eval_seconds": round(clock.last_pause, 3),
            }
        )
        dist.log(
            f"[step {step}] test PSNR {ev['psnr']:.2f} dB, SSIM {ev['ssim']:.4f} over {ev['views']} "
            f"views at {seconds:.1f} s (evaluation {clock.last_pause:.1f} s)"
        )
        stop = self.stop_after_eval is not None and self.stop_after_eval(step, ev["psnr"])
        if self.watcher is not None:
            self.watcher.record(step, {"test_psnr": ev["psnr"]})
        return stop

    def finish(self) -> RunResult:
        """After the last step: the final checkpoint, the averaged models, the final evaluation, the snapshot
        and the metrics (rank 0 writes them)."""
        tr, s, progress = self.tr, self.s, self.progress
        self.watchdog.stop()
        self.monitor.close()
        if self.watcher is not None:
            self.watcher.close()
        step = tr.state.step
        if self.stopped:  # a stop signal: the checkpoint is written; no final evaluation, exit EXIT_PREEMPTED now
            tr.data.close()
            dist.log(
                f"stopped at step {step} of {s.loop.n_steps} on a signal ({self.stopped[0]}); checkpoint in "
                f"{tr.ckpts.directory}; exit status {preempt.EXIT_PREEMPTED}"
            )
            return RunResult(tr.field, tr.grid, step, {"steps": step, "stopped": self.stopped[0]}, self.stopped[0])
        train_seconds = progress["train_seconds"] = self.clock.seconds()
        if s.output.checkpointing and step not in [k for k, _ in tr.ckpts.existing()]:
            self.write_checkpoint(step)  # a restartable run always ends with a checkpoint
        if tr.exchange is not None:  # after the last checkpoint: the delayed average applied, the models averaged
            if tr.exchange.flush(tr.optimizer, tr.guard) and tr.state.ema is not None:
                tr.state.ema.update()
        stream = tr.data.stream_report()
        tr.data.close()
        if stream:
            dist.log(stream)
        eval_started = time.perf_counter()
        ev = tr.evaluate(save_dir=self.out_dir / "renders", n_save=s.eval.save_renders)
        if ev.get("stopped"):  # training is done, its final evaluation was cut short: a resume evaluates again
            self.stop_with_checkpoint(step, " during the final evaluation")
            dist.log(
                f"stopped after step {step} of {s.loop.n_steps} on a signal ({self.stopped[0]}) before the "
                f"final evaluation ended; checkpoint in {tr.ckpts.directory}; exit status "
                f"{preempt.EXIT_PREEMPTED}"
            )
            return RunResult(tr.field, tr.grid, step, {"steps": step, "stopped": self.stopped[0]}, self.stopped[0])
        progress["curve"].append(
            {
                "step": step,
                "seconds": round(train_seconds, 3),
                "psnr": ev["psnr"],
                "ssim": ev["ssim"],
                "eval_seconds": round(time.perf_counter() - eval_started, 3),
            }
        )
        samples_per_sec = progress["total_samples"] / max(train_seconds, 1e-9)
        dist.log(
            f"done: {step} steps in {train_seconds:.1f} s, {samples_per_sec / 1e6:.3f} M samples/s, "
            f"test PSNR {ev['psnr']:.2f} dB, SSIM {ev['ssim']:.4f} over {ev['views']} views"
        )
        if s.output.save_snapshot:
            checkpoint.save(tr.state, s.output.save_snapshot, self.config)
        metrics = self.metrics(step, train_seconds, samples_per_sec, ev)
        if dist.runtime().is_root:
            write_metrics(
                metrics,
                [self.out_dir / "metrics.json"] + ([Path(s.output.metrics_json)] if s.output.metrics_json else []),
            )
        return RunResult(tr.field, tr.grid, step, metrics)

    def metrics(self, step: int, train_seconds: float, samples_per_sec: float, ev: dict) -> dict:
        """The run's metrics (``metrics.json``); collective with model parallelism (its summary)."""
        tr, rt = self.tr, dist.runtime()
        metrics = {
            "world_size": rt.size,
            "steps": step,
            "train_seconds": round(train_seconds, 3),
            "samples_per_sec": samples_per_sec,
            "test_psnr": ev["psnr"],
            "test_ssim": ev["ssim"],
            "test_views": ev["views"],
            "psnr_per_view": ev.get("psnr_per_view", []),
            "curve": self.progress["curve"],
            "device": device_name(rt.device),
            "backend": tr.backend,
            "precision": tr.precision,
            "controller": rt.controller,
            "scene": tr.scene.source,
            "config": self.s.model.source,
            "nonfinite_skipped_steps": tr.guard.skipped if tr.guard else None,
            "history": self.progress["history"],
            "communication": self.s.runtime.comm.summary(os.environ, tr.lr_multiplier()),
            "data": tr.data.summary(),
            "memory": {
                "budget_gib": None if tr.memory.bytes is None else round(tr.memory.bytes / GIB, 3),
                "budget_source": tr.memory.source,
                "peak": tr.meter.summary(),
            },
        }
        if tr.mp is not None:
            metrics["model_parallel"] = model_parallel_summary(tr, tr.mp)
        return metrics


def write_metrics(metrics: dict, paths: list[Path]) -> None:
    for path in paths:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(metrics, indent=1))
        except OSError as exc:
            raise OutputError(f"{path}: cannot write the metrics: {os_cause(exc)}") from None


def model_parallel_summary(tr: "Trainer", mp: ModelParallel) -> dict:
    """Collective: the layout (``mp``: the trainer's), every rank's parameter bytes and peak memory, and the
    interval reports."""
    g = mp.groups
    mine = {
        "hash_params": hash_parameters(tr.field),
        "param_bytes": sum(p.numel() * p.element_size() for p in tr.field.parameters()),
        "peak_memory": tr.meter.summary(),
    }
    ranks = dist.allgather_object(mine, name="model_parallel.summary")
    return {
        "model_parallel": g.model_parallel,
        "replicas": g.replicas,
        "partition": json.loads(mp.partition.to_json()),
        "hash_params_per_rank": [r["hash_params"] for r in ranks],
        "param_bytes_per_rank": [r["param_bytes"] for r in ranks],
        "peak_memory_per_rank": [r["peak_memory"] for r in ranks],
        "intervals": tr.mp_reports,
    }


@contextlib.contextmanager
def paused(clock: TrainClock, watchdog: Watchdog, monitor: Monitor) -> Iterator[None]:
    """Around an evaluation or a checkpoint: the training clock stops (``clock.last_pause`` holds how long
    afterwards), the watchdog waits, and the monitor leaves the block's collectives and GPU samples out."""
    with clock.paused(), watchdog.paused(), monitor.paused():
        yield


def prepare_outputs(out: OutputSettings, n_steps: int, ckpt_dir: Path | None) -> OutputLock | None:
    """Rank 0: create the output folders, lock the output folder for this run (``OutputLock``) and prove that
    every file the run writes can be written now, not after hours of training. Returns the lock (rank 0)."""
    if not dist.runtime().is_root:
        return None
    written = {"save_snapshot": out.save_snapshot, "metrics_json": out.metrics_json}
    folders = [("output folder (--out_dir)", Path(out.out_dir))]
    if ckpt_dir is not None:
        folders.append(("checkpoint folder (--ckpt_dir)", ckpt_dir))
    folders += [(f"folder of --{option}", Path(path).parent) for option, path in written.items() if path]
    for what, folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise ConfigError(f"{folder}: cannot write to the {what}: {os_cause(exc)}") from None
    out_dir = Path(out.out_dir)
    lock = OutputLock.acquire(out_dir)
    try:
        files = [("metrics file", out_dir / "metrics.json"), ("stop marker", out_dir / preempt.MARKER)]
        files += [(f"file of --{option}", Path(path)) for option, path in written.items() if path]
        if ckpt_dir is not None:
            files.append(("checkpoint", ckpt_dir / f"ckpt-{n_steps:08d}.pt"))
        check_output_files(files)
    except ConfigError:
        lock.release()
        raise
    if lock.took_over:
        dist.log(
            f"{lock.path}: took over the lock of a run that ended without releasing it (crashed or killed: "
            f"{describe_owner(lock.took_over)})"
        )
    preempt.clear_marker(out_dir)  # a previous stop's marker: this run decides anew
    return lock
