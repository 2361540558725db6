"""Each command line parsed once into a frozen options dataclass (issue 47): ``hvd_ngp.options`` refuses a
dataclass that does not match its Namespace, and every tool's and bench's dataclass matches its parser, field
for option, so a new flag without a field (or a field without a flag) fails here, not at a user's first run."""

from __future__ import annotations

import argparse
import dataclasses
import importlib

import pytest

from hvd_ngp.options import command_options, option_dests, options_from


@dataclasses.dataclass(frozen=True)
class Two:
    scene: str
    steps: int


@dataclasses.dataclass(frozen=True)
class Named:
    what: str
    out: str


def test_options_from_copies_every_field_and_refuses_drift():
    opts = options_from(Two, argparse.Namespace(scene="lego", steps=3))
    assert opts == Two("lego", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.steps = 4  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"fields without a value \['steps'\], values without a field none"):
        options_from(Two, argparse.Namespace(scene="lego"))
    with pytest.raises(TypeError, match=r"values without a field \['port'\]"):
        options_from(Two, argparse.Namespace(scene="lego", steps=3, port=1))
    assert options_from(Two, argparse.Namespace(scene="lego", steps=3, port=1), subset=True) == Two("lego", 3)
    with pytest.raises(TypeError, match="not a dataclass"):
        options_from(argparse.Namespace, argparse.Namespace())


def test_command_options_picks_the_sub_commands_class():
    ns = argparse.Namespace(what="mesh", out="a.ply")
    assert command_options(ns, "what", {"mesh": Named, "two": Two}) == Named("mesh", "a.ply")
    with pytest.raises(TypeError, match="values without a field"):
        command_options(ns, "what", {"mesh": Two})


class Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def parser_of(module: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser ``module.main`` parses its command line with (caught at ``parse_args``: nothing runs)."""

    def capture(self, *args, **kwargs):
        raise Captured(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    with pytest.raises(Captured) as caught:
        importlib.import_module(module).main([])
    return caught.value.parser


def fields_of(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


#: every command line of the package with its options dataclass (one per sub-command where it has them)
TOOLS = {
    "hvd_ngp.tools.render": "RenderOptions",
    "hvd_ngp.tools.export": "COMMANDS",
    "hvd_ngp.tools.data_info": "COMMANDS",
    "hvd_ngp.tools.view": "ViewOptions",
    "hvd_ngp.tools.config_reference": "ReferenceOptions",
    "hvd_ngp.tools.pose_check": "PoseCheckOptions",
    "hvd_ngp.tools.launch": "LaunchOptions",
    "hvd_ngp.observe.doctor": "DoctorOptions",
    "hvd_ngp.testing.simhosts": "ACTIONS",
    "hvd_ngp.bench.batch": "BatchOptions",
    "hvd_ngp.bench.fabric": "FabricOptions",
    "hvd_ngp.bench.links": "LinksOptions",
    "hvd_ngp.bench._links_rank": "LinksRankOptions",
    "hvd_ngp.bench.memory": "MemoryOptions",
    "hvd_ngp.bench.mlp": "MlpOptions",
    "hvd_ngp.bench.sampling": "SamplingOptions",
    "hvd_ngp.bench.scaling": "ScalingOptions",
    "hvd_ngp.bench._scaling_rank": "ScalingRankOptions",
    "hvd_ngp.bench.startup": "StartupOptions",
    "hvd_ngp.bench.syncmodes": "SyncModesOptions",
    "hvd_ngp.bench.throughput": "ThroughputOptions",
    "hvd_ngp.bench.viewer": "ViewerBenchOptions",
    "hvd_ngp.viewer.probe": "ProbeOptions",
}


@pytest.mark.parametrize("module", sorted(TOOLS))
def test_each_tools_options_match_its_parser(module, monkeypatch):
    parser = parser_of(module, monkeypatch)
    target = getattr(importlib.import_module(module), TOOLS[module])
    if isinstance(target, dict):  # sub-commands: the top parser's dests (the command's name) plus the sub-parser's
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        assert set(sub.choices) == set(target), module
        for name, cls in target.items():
            assert fields_of(cls) == option_dests(parser) | option_dests(sub.choices[name]), f"{module} {name}"
    else:
        assert fields_of(target) == option_dests(parser), module


def test_the_settings_groups_flags_match_their_option_groups():
    """DataFlags, CommFlags and MonitorFlags hold their group's flags (plus the few other flags each is checked
    against), so ``config.validate`` hands every flag of the group over."""
    from hvd_ngp.cluster.comm import CommFlags, add_options as add_comm_options
    from hvd_ngp.config import build_parser
    from hvd_ngp.data.pipeline import DataFlags, DataSettings
    from hvd_ngp.observe.monitor import MonitorFlags, MonitorSettings

    trainer = option_dests(build_parser()) | {"model"}  # parse_flags adds the merged blocks
    for cls, add, others in (
        (DataFlags, DataSettings.add_options, set()),
        (CommFlags, add_comm_options, {"model", "precision"}),
        (MonitorFlags, MonitorSettings.add_options, {"out_dir", "load_snapshot", "resume"}),
    ):
        group = argparse.ArgumentParser()
        add(group)
        assert fields_of(cls) == option_dests(group) | others, cls.__name__
        assert fields_of(cls) <= trainer, cls.__name__
