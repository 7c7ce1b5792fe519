"""Makes this directory's state (see README.md): run as root from the repository root,
at the commit the README names, with ``.venv/bin/python -I tests/data/state-format-1/make.py``."""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from mtgpu_testing import Host, wait_for  # noqa: E402

JOBS = {
    "completed": "#!/bin/bash\necho done\n",
    "failed": "#!/bin/bash\nexit 3\n",
    "running": "#!/bin/bash\n#MTGPU gpus=1 cpus=1 ram=50M\nsleep 600\n",
    "cancelled": "#!/bin/bash\n#SBATCH --hold\nsleep 600\n",
    "held": "#!/bin/bash\n#SBATCH --hold\necho held\n",
    "array": "#!/bin/bash\n#SBATCH --array=0-2\necho task $SLURM_ARRAY_TASK_ID\n",
}


def main() -> None:
    host = Host({"SIMULATED_GPUS": [{"type": "rtx4090", "count": 1, "vram": "24G"}], "SIMULATED_CPUS": 4})
    try:
        host.start()
        key = host.add_user("fixture")

        def submit(script: str, *args: str) -> str:
            r = host.ssh("fixture", key, "mt-job", "submit", "--parsable", *args, "-", input=script.encode())
            assert r.returncode == 0, r.stderr
            return r.stdout.decode().strip()

        def state(jid: str) -> str:
            r = host.api("job.show", job_id=jid)
            return str(r["result"]["state"])

        ids = {name: submit(script) for name, script in JOBS.items()}
        for name in ("completed", "failed"):
            wait_for(lambda n=name: state(ids[n]) in ("COMPLETED", "FAILED"), timeout=60, what=name)
        wait_for(lambda: state(ids["running"]) == "RUNNING", timeout=60, what="running")
        # Waits for the running job: pending, its reason Dependency.
        ids["dependency"] = submit("#!/bin/bash\necho after\n", f"--dependency=afterok:{ids['running']}")
        r = host.ssh("fixture", key, "mt-job", "cancel", ids["cancelled"])
        assert r.returncode == 0, r.stderr
        wait_for(lambda: state(ids["cancelled"]) == "CANCELLED", timeout=30, what="cancelled")
        time.sleep(1)
        shows = {name: state(jid) for name, jid in ids.items()}
        print(shows)
        host.stop()
        out = HERE / "journal"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        for f in ("raft.journal", "raft.journal.meta"):
            shutil.copy(host.state_dir / f, out / f)
        snapshot(host.state_dir, HERE / "snapshot")
        (HERE / "jobs.txt").write_text("".join(f"{jid} {name} {shows[name]}\n" for name, jid in ids.items()))
    finally:
        host.cleanup()


def snapshot(state_dir: Path, out: Path) -> None:
    """Open a copy of the state with the daemon's consumers, write its full dump."""
    from mtgpu.accounts.registry import Registry
    from mtgpu.schedd.drains import Drains
    from mtgpu.schedd.jobtable import JobTable
    from mtgpu.state.audit import AuditLog
    from mtgpu.state.store import StateStore

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    for f in ("raft.journal", "raft.journal.meta"):
        shutil.copy(state_dir / f, out / f)

    async def go() -> None:
        store = StateStore("testhost", [Registry((1, 2)), JobTable(), Drains(), AuditLog()], str(out))
        try:
            await store.wait_ready(30)
            assert await asyncio.to_thread(store.snapshot, 10)
        finally:
            store.close()

    asyncio.run(go())


if __name__ == "__main__":
    main()
