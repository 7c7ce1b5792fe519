"""The load benchmark's simulated runner stands in for the real one: it must take
every call the agent makes the way :class:`~mtgpu.schedd.runner.Runner` takes it.
(An out-of-date ``ack`` made every agent tick of the 1,000-member run fail once
jobs ended, so the ends were recorded again and again and the benchmark measured
its own flood of commits.)"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType

from mtgpu.schedd import agent
from mtgpu.schedd.runner import Runner

LOAD = Path(__file__).resolve().parents[2] / "benchmarks" / "cluster_load.py"


def load_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cluster_load", LOAD)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def runner_calls() -> set[str]:
    """The runner methods the agent calls."""
    return set(re.findall(r"runner\.([a-z_]+)\b", Path(agent.__file__).read_text())) - {"Runner"}


def test_the_agent_calls_what_the_simulated_runner_has_with_the_same_parameters() -> None:
    sim = load_module().SleepRunner
    calls = runner_calls()
    assert {"ack", "cancel", "poll", "start", "running", "result"} <= calls
    # Only the VRAM watchdog's calls (real GPUs, never simulated) may be missing.
    missing = {c for c in calls if not hasattr(sim, c)}
    assert missing <= {"stop_over_limit", "supervisor_pid"}, missing
    for name in calls - missing:
        real = inspect.signature(getattr(Runner, name)).parameters
        mine = inspect.signature(getattr(sim, name)).parameters
        assert list(mine) == list(real), (name, list(mine), list(real))
        for p, q in zip(real.values(), mine.values(), strict=True):
            assert p.default == q.default, (name, p.name, p.default, q.default)


def test_the_simulated_runner_acks_only_the_attempt_recorded() -> None:
    mod = load_module()

    class Launch:
        job_id, term, attempt = "7", 1, 2

    async def go() -> None:
        mod.JOB_SECONDS = (0.0, 0.01)
        r = mod.SleepRunner(asyncio.get_running_loop())
        r.start(Launch())
        for _ in range(100):
            if r.poll():
                break
            await asyncio.sleep(0.01)
        assert [x.attempt for x in r.poll()] == [2]
        assert r.cancel("7", 1.0) is False  # it has ended
        r.ack("7", 1)  # another attempt's record: left alone
        assert r.result("7") is not None
        r.ack("7", 2)
        assert r.result("7") is None and r.running() == []

    asyncio.run(go())
