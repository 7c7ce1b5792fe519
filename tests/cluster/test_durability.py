"""A power cut of every machine of a 3-voter cluster while writes stream through its
leader: each acknowledged write was on disk on a majority, so the restarted cluster
holds every one, once (tests/durability_testing.py says how the cut is made)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from durability_testing import PowerCut, recovered  # noqa: E402

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(300)]

VOTERS = ["n1", "n2", "n3"]


@pytest.fixture
def cut(tmp_path: Path) -> Iterator[PowerCut]:
    p = PowerCut(tmp_path, VOTERS)
    yield p
    p.close()


def test_every_acknowledged_write_survives_a_power_cut_of_every_voter(cut: PowerCut) -> None:
    acked, copies = cut.cut(cut.start(0), min_acked=500)
    after = recovered(cut.start(1, copies), VOTERS, acked)
    assert after["missing"] == 0, (
        f"{after['missing']} of {len(acked)} acknowledged writes lost: {after['sample']}"
    )
    assert after["puts"] == after["n"], after  # no write applied twice
