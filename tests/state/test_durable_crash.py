"""A power cut of a standalone host while a submitter streams writes: every
acknowledged write is on disk (tests/durability_testing.py says how the cut is made;
tests/cluster/test_durability.py cuts a 3-voter cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from durability_testing import PowerCut, recovered

pytestmark = [pytest.mark.root, pytest.mark.timeout(240)]


@pytest.fixture
def cut(tmp_path: Path) -> Iterator[PowerCut]:
    p = PowerCut(tmp_path, ["n1"])
    yield p
    p.close()


def test_every_acknowledged_write_survives_a_power_cut_of_a_standalone_host(cut: PowerCut) -> None:
    acked, copies = cut.cut(cut.start(0), min_acked=300)
    after = recovered(cut.start(1, copies), ["n1"], acked)
    assert after["missing"] == 0, (
        f"{after['missing']} of {len(acked)} acknowledged writes lost: {after['sample']}"
    )
    assert after["puts"] == after["n"], after  # no write applied twice
