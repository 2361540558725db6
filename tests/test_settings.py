"""Typed settings (hvd_ngp/settings.py): filled once from the parsed flags, frozen, grouped as --help is;
a mistyped flag is one line with the nearest flags and exit status 2."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hvd_ngp.config import BASE_CONFIG, CPU_CONFIG, DEFAULT_STEPS, build_parser, parse_args, parse_settings
from hvd_ngp.errors import ConfigError
from hvd_ngp.observe.metrics import UNLIMITED_STEPS
from hvd_ngp.settings import (
    EvalSettings,
    LoopSettings,
    ModelSettings,
    OutputSettings,
    RuntimeSettings,
    SceneSettings,
    Settings,
    StepSettings,
    ViewerSettings,
)

#: the groups whose fields are flags of the same name (derived or validated elsewhere: comm, blocks)
FLAG_GROUPS = (
    SceneSettings,
    ModelSettings,
    RuntimeSettings,
    StepSettings,
    LoopSettings,
    EvalSettings,
    OutputSettings,
    ViewerSettings,
)
NOT_FLAGS = {
    "comm",
    "blocks",
    "config",
    "timeline",
    "timeline_mark_cycles",
    "autotune",
    "autotune_log",
    "stall_check_s",
    "stall_shutdown_s",
}


def test_each_group_holds_its_flags_with_the_command_line_values():
    s = parse_settings(
        [
            "--config",
            str(CPU_CONFIG),
            "--seed",
            "5",
            "--eval_at_s",
            "30,10",
            "--out_dir",
            "o",
            "--ckpt_every",
            "7",
            "--viewer_share",
            "0.5",
            "--downscale",
            "2",
            "--backend",
            "torch",
            "--stop_signals",
            "TERM,USR1",
            "--grad_sync",
            "periodic",
            "--sampling",
            "complexity",
        ]
    )
    assert (s.step.seed, s.eval.eval_at_s, s.output.out_dir, s.viewer.viewer_share) == (5, (10.0, 30.0), "o", 0.5)
    assert (s.scene.downscale, s.model.backend, s.loop.stop_signals) == (2, "torch", ("TERM", "USR1"))
    assert s.runtime.comm.grad_sync == "periodic" and s.data.sampling == "complexity"
    assert s.output.checkpointing and str(s.output.checkpoint_dir) == "o/checkpoints"
    assert s.model.source == str(CPU_CONFIG.resolve()) and s.model.blocks["encoding"]["log2_hashmap_size"] == 15
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.step.seed = 6  # type: ignore[misc]


def test_derived_values_are_computed_once_and_the_namespace_stays_as_parsed():
    ns = parse_args(["--config", str(BASE_CONFIG), "--time_budget_s", "60"])
    assert parse_settings(["--config", str(BASE_CONFIG)]).loop.n_steps == DEFAULT_STEPS
    s = parse_settings(["--config", str(BASE_CONFIG), "--time_budget_s", "60"])
    assert s.loop.n_steps == UNLIMITED_STEPS == ns.n_steps and s.flags["n_steps"] == UNLIMITED_STEPS
    # flags: what checkpoints record and ranks compare, JSON values only (the validated groups left out)
    assert json.loads(json.dumps(s.flags)) == s.flags and "comm" not in s.flags and s.flags["model"] == s.model.blocks
    with pytest.raises(ConfigError, match="--n_steps must be positive"):
        parse_settings(["--n_steps", "0"])


def test_help_groups_are_the_settings_groups_and_every_flag_has_one():
    parser = build_parser()
    groups = {g.title: {a.dest for a in g._group_actions} for g in parser._action_groups}
    for cls in FLAG_GROUPS:
        names = {f.name for f in dataclasses.fields(cls)} - NOT_FLAGS
        assert groups[cls.TITLE] == names, cls.__name__
    fields = {f.name for cls in FLAG_GROUPS for f in dataclasses.fields(cls)}
    dests = {a.dest for a in parser._actions} - {"help", "config"}
    grouped_elsewhere = {
        a.dest for g in parser._action_groups if g.title not in {c.TITLE for c in FLAG_GROUPS} for a in g._group_actions
    }
    assert dests <= fields | grouped_elsewhere
    assert {f.name for f in dataclasses.fields(Settings)} >= {"data", "monitor", "runtime", "model"}


def test_help_shows_each_default_once():
    text = build_parser().format_help()
    assert "(default: None)" not in text and "(default: False)" not in text
    n_steps = text[text.index("\n  --n_steps N_STEPS") : text.index("\n  --time_budget_s TIME")]
    assert n_steps.count("default") == 1  # the help's own "default 2000", not the formatter's "None"
    assert "(default: 1337)" in " ".join(text.split())  # --seed


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--devise", "cpu"], "unknown option --devise (did you mean --device?)"),
        (["--targt_samples=5"], "unknown option --targt_samples (did you mean --target_samples?)"),
        (["--qqqqq"], "unknown option --qqqqq; see --help"),
    ],
)
def test_a_mistyped_flag_is_one_line_with_the_nearest_and_exit_2(argv, expected, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--config", str(CPU_CONFIG), *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and expected in err and err.count("\n") == 1 and "usage:" not in err


def test_a_mistyped_config_file_key_names_the_nearest(tmp_path):
    path = tmp_path / "typo.json"
    path.write_text(json.dumps({"parent": str(CPU_CONFIG), "target_sampels": 10}))
    with pytest.raises(
        ConfigError, match=r"typo\.json: unknown option 'target_sampels' \(did you mean 'target_samples'"
    ):
        parse_settings(["--config", str(path)])
