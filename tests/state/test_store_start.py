"""A voter alone in its configuration (a standalone host, a cluster's founder) takes
its own vote at once instead of waiting out Raft's election timeout."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mtgpu.schedd.jobtable import JobTable
from mtgpu.state.store import StateStore

pytestmark = pytest.mark.timeout(60)


def test_a_lone_voter_leads_before_any_election_timeout(tmp_path: Path) -> None:
    async def go() -> None:
        # With a 20 s election timeout, waiting it out could not be ready within 10 s.
        store = StateStore(
            "solo",
            [JobTable()],
            str(tmp_path),
            raftMinTimeout=20.0,
            raftMaxTimeout=25.0,
            connectionTimeout=25.0,
        )
        try:
            await store.wait_ready(10)
            assert store.status()["leader"] == "solo"
        finally:
            store.close()

    asyncio.run(go())
