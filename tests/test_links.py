"""Horovod's allreduce over two simulated hosts with tc-shaped links agrees with the fabric model.

The small CI version of ``python -m hvd_ngp.bench links`` (docs/scaling.md, "emulated links"): one size,
one rate, the Gloo controller. Skipped, with the reason, where network namespaces or ``tc`` are unavailable.
"""

from __future__ import annotations

import json
import shutil

import pytest

from hvd_ngp.bench import links
from hvd_ngp.testing import simhosts

REASON = simhosts.unavailable() or ("" if shutil.which("tc") else "iproute2's tc not installed")
pytestmark = [pytest.mark.parallel, pytest.mark.skipif(bool(REASON), reason=f"emulated links: {REASON}")]


def test_shaped_link_allreduce_matches_the_model(tmp_path, capsys):
    out = tmp_path / "links.json"
    status = links.main(
        [
            "--hosts",
            "2",
            "--rates",
            "100mbit",
            "--sizes_mib",
            "2",
            "--controllers",
            "gloo",
            "--repeats",
            "3",
            "--json",
            str(out),
        ]
    )
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 1 and rows[0]["hosts"] == 2 and rows[0]["controller"] == "gloo"
    # the shaped link is a floor: 2 MiB at 100 Mbit/s cannot move faster than the TCP goodput allows
    assert rows[0]["measured_s"] > 0.9 * rows[0]["modelled_s"], rows
    assert status == 0 and rows[0]["ok"], capsys.readouterr().out


def test_rate_and_delay_parsing():
    assert simhosts.parse_rate("1gbit") == 1e9 and simhosts.parse_rate("100mbit") == 1e8
    assert simhosts.parse_delay("0.2ms") == 0.2 and simhosts.parse_delay("50us") == pytest.approx(0.05)
    with pytest.raises(simhosts.SimHostsError, match="--rate must look like 1gbit"):
        simhosts.parse_rate("fast")
    with pytest.raises(simhosts.SimHostsError, match="--delay must be between"):
        simhosts.parse_delay("5000ms")
