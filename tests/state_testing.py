"""The format-1 state left by a real daemon (tests/data/state-format-1), loaded as
the daemon loads it: a StateStore with the daemon's consumers."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from mtgpu.accounts.registry import Registry
from mtgpu.schedd.drains import Drains
from mtgpu.schedd.jobtable import JobTable
from mtgpu.state.audit import AuditLog
from mtgpu.state.store import StateStore

FIXTURE = Path(__file__).resolve().parent / "data" / "state-format-1"


def copy_fixture(kind: str, to: Path) -> Path:
    """A copy of the fixture's ``journal`` or ``snapshot`` state directory under ``to``."""
    d = to / kind
    shutil.copytree(FIXTURE / kind, d)
    return d


def load_jobs(state_dir: Path, dump: bool = False) -> JobTable:
    """The job table as a standalone daemon would hold it once ``state_dir`` is loaded;
    with ``dump``, the state is then written out as a full dump again."""
    table = JobTable()

    async def go() -> None:
        store = StateStore("testhost", [Registry((1, 2)), table, Drains(), AuditLog()], str(state_dir))
        try:
            await store.wait_ready(30)
            if dump:
                assert await asyncio.to_thread(store.snapshot, 10)
        finally:
            store.close()

    asyncio.run(go())
    return table
