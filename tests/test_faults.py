"""The test-only fault injection itself (in-process, no ranks): parsing and the ``slow`` fault's sleep."""

from __future__ import annotations

import pytest

from hvd_ngp import faultpoints
from hvd_ngp.errors import ConfigError
from hvd_ngp.testing import faults


def test_parse_reads_kinds_ranks_and_ranges_and_names_bad_specs():
    assert faults.parse("nan_loss@1:3-5, slow@0:7, raise@0:30") == [
        faults.Fault("nan_loss", 1, 3, 5),
        faults.Fault("slow", 0, 7, 7),
        faults.Fault("raise", 0, 30, 30),
    ]
    with pytest.raises(ConfigError, match="HVD_NGP_FAULTS: unknown fault 'slower'"):  # names the variable
        faults.parse("slower@0:1")
    with pytest.raises(ConfigError, match="cannot parse 'slow@0'"):  # no step
        faults.parse("slow@0")
    with pytest.raises(ConfigError, match="cannot parse 'nan_loss@x'"):  # not rank:step numbers
        faults.parse("nan_loss@x")


def test_slow_sleeps_in_proportion_to_the_samples_only_when_armed(monkeypatch):
    slept = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.slow_down(3, 1000)
    monkeypatch.setenv(faults.ENV, "slow@0:2-4,raise@1:3")
    faults.slow_down(1, 1000)  # before the range
    faults.slow_down(3, 1000)
    faults.at_step(3)  # the slow fault does nothing at the start of a step; raise@1 is another rank's
    assert slept == [pytest.approx(1000 * faults.SLOW_SECONDS_PER_SAMPLE)]


def test_registry_is_inert_unarmed_and_forwards_when_armed(monkeypatch):
    """``faultpoints`` (what the product calls) reads the same variable as ``testing.faults``."""
    assert faultpoints.ENV == faults.ENV
    loss = faults.torch.ones(())
    monkeypatch.delenv(faults.ENV, raising=False)
    assert faultpoints.poison_loss(loss, 1) is loss
    monkeypatch.setenv(faults.ENV, "nan_loss@0:1")
    assert faultpoints.poison_loss(loss, 1).isnan() and faultpoints.poison_loss(loss, 2) is loss
