"""Config files with parent chains, and CLI > environment > config file > default precedence."""

from __future__ import annotations

import json

import pytest

from hvd_ngp.config import BASE_CONFIG, CONFIG_DIR, load_json_config, merge_patch, parse_args
from hvd_ngp.errors import ConfigError


def write(path, obj):
    path.write_text(json.dumps(obj))
    return path


def test_merge_patch_semantics():
    base = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2]}
    out = merge_patch(base, {"b": {"c": 20, "d": None}, "e": [3], "f": "x"})
    assert out == {"a": 1, "b": {"c": 20}, "e": [3], "f": "x"}
    assert base["b"] == {"c": 2, "d": 3}  # inputs are not modified


def test_parent_chain_is_resolved_relative_to_the_file(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    write(tmp_path / "grand.json", {"encoding": {"n_levels": 8, "log2_hashmap_size": 14}, "n_steps": 5})
    write(sub / "parent.json", {"parent": "../grand.json", "encoding": {"n_levels": 12}})
    child = write(sub / "child.json", {"parent": "parent.json", "encoding": {"log2_hashmap_size": None}})
    cfg = load_json_config(child)
    assert cfg == {"encoding": {"n_levels": 12}, "n_steps": 5}


def test_shipped_configs_merge_to_complete_blocks():
    big = load_json_config(CONFIG_DIR / "big.json")
    assert big["encoding"]["log2_hashmap_size"] == 21 and big["encoding"]["n_levels"] == 16
    assert big["network"]["n_neurons"] == 128 and big["network"]["n_hidden_layers"] == 1
    base = load_json_config(BASE_CONFIG)
    assert base["optimizer"]["nested"]["nested"]["epsilon"] == 1e-15
    assert base["optimizer"]["nested"]["decay_interval"] == 20000
    captured = load_json_config(CONFIG_DIR / "captured.json")
    assert captured["rgb_network"] == {**base["rgb_network"], "n_neurons": 64}
    assert {k: v for k, v in captured.items() if k not in ("rgb_network", "comment")} == {
        k: v for k, v in base.items() if k not in ("rgb_network", "comment")
    }


def test_circular_parent_and_bad_json_name_the_file(tmp_path):
    a = write(tmp_path / "a.json", {"parent": "b.json"})
    write(tmp_path / "b.json", {"parent": "a.json"})
    with pytest.raises(ConfigError, match="circular"):
        load_json_config(a)
    bad = tmp_path / "bad.json"
    bad.write_text('{"encoding": {"n_levels": 4,}}')
    with pytest.raises(ConfigError, match=r"bad\.json: invalid JSON at line 1"):
        load_json_config(bad)


def test_precedence_cli_over_env_over_file_over_default(tmp_path, monkeypatch):
    cfg = write(
        tmp_path / "run.json",
        {"parent": str(CONFIG_DIR / "cpu.json"), "n_steps": 11, "log_every": 7, "seed": 3, "encoding": {"n_levels": 6}},
    )
    monkeypatch.setenv("HVD_NGP_LOG_EVERY", "9")
    monkeypatch.setenv("HVD_NGP_SEED", "4")
    args = parse_args(["--config", str(cfg), "--seed", "5"])
    assert args.seed == 5  # CLI beats env and file
    assert args.log_every == 9  # env beats file
    assert args.n_steps == 11  # file beats default
    assert args.eval_every == 0  # default
    assert args.target_samples == 8192  # from the parent cpu.json
    assert args.model["encoding"]["n_levels"] == 6
    assert args.model["encoding"]["log2_hashmap_size"] == 15  # cpu.json, through the parent chain
    assert args.model["rgb_network"]["n_hidden_layers"] == 2  # base.json


def test_cli_block_is_a_patch_over_the_file_block(tmp_path):
    cfg = write(tmp_path / "run.json", {"encoding": {"n_levels": 6, "log2_hashmap_size": 13}})
    args = parse_args(["--config", str(cfg), "--encoding", '{"log2_hashmap_size": 12}'])
    assert args.model["encoding"]["n_levels"] == 6
    assert args.model["encoding"]["log2_hashmap_size"] == 12


def test_training_block_sets_precision_and_batch(tmp_path):
    args = parse_args(["--config", str(CONFIG_DIR / "hashgrid.json")])
    assert args.target_samples == 262144 and args.precision == "fp32"
    assert args.model["distributed"]["enable"] is True


def test_unknown_config_keys_and_bad_values_are_refused(tmp_path):
    cfg = write(tmp_path / "typo.json", {"n_stepz": 10})
    with pytest.raises(ConfigError, match=r"typo\.json: unknown option 'n_stepz'"):
        parse_args(["--config", str(cfg)])
    with pytest.raises(ConfigError, match="n_steps must be positive"):
        parse_args(["--n_steps", "0"])
    with pytest.raises(ConfigError, match="--max_rays must be at least 64"):  # the count would round to 0 rays
        parse_args(["--max_rays", "32", "--n_rays_init", "32"])
    blk = write(tmp_path / "blk.json", {"encodings": {"n_levels": 4}})
    with pytest.raises(ConfigError, match="unknown block 'encodings'"):
        parse_args(["--config", str(blk)])


def test_time_budget_alone_trains_until_the_budget_and_decays_the_learning_rate():
    from hvd_ngp.config import DEFAULT_STEPS, UNLIMITED_STEPS
    from hvd_ngp.training.recipe import budget_lr_factor

    assert parse_args([]).n_steps > 0 and parse_args(["--config", str(BASE_CONFIG)]).n_steps == DEFAULT_STEPS
    assert parse_args(["--config", str(BASE_CONFIG), "--time_budget_s", "60"]).n_steps == UNLIMITED_STEPS
    assert parse_args(["--time_budget_s", "60", "--n_steps", "50"]).n_steps == 50
    factors = [budget_lr_factor(t, 60.0, "on") for t in (0, 29.9, 30, 44.9, 45, 53.9, 54, 600)]
    assert factors == pytest.approx([1, 1, 0.33, 0.33, 0.33**2, 0.33**2, 0.33**3, 0.33**3])
    assert budget_lr_factor(59, 60.0, "off") == 1.0 and budget_lr_factor(1e6, 0.0, "on") == 1.0
