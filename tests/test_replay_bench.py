"""The replay benchmark (benchmarks/replay.py) on a tiny recording: every recorded event
is replayed through the real dispatcher, scheduler and store, and the CPU figures it
reports are there. No timing is asserted."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType

import pytest

REPLAY = Path(__file__).resolve().parents[1] / "benchmarks" / "replay.py"


def load_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("replay_bench", REPLAY)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_tiny_recording_is_replayed_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mod = load_module()
    rec = tmp_path / "tiny.jsonl.gz"
    argv = ["--members", "20", "--seconds", "10", "--warmup", "2", "--rate", "10", "--recording", str(rec)]
    assert mod.main([*argv, "--record-only"]) == 0
    header, members, events, digest = mod.load(rec)
    assert header["members"] == 20 and len(members) == 20
    kinds = {e[0]["k"] for e in events}
    assert kinds == {"report", "submit", "pass", "end"}, kinds

    # The same seed gives the same recording.
    again = tmp_path / "again.jsonl.gz"
    assert mod.main([*argv[:-1], str(again), "--record-only"]) == 0
    assert mod.load(again)[3] == digest

    assert mod.main([*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["recording"]["sha256"] == digest
    assert r["replayed"] == r["events"] == len(events)
    replayed = {k: r["warmup_events"][k] + r["counts"][k] for k in ("report", "submit", "pass", "end")}
    recorded = {k: sum(1 for e in events if e[0]["k"] == k) for k in replayed}
    assert replayed == recorded
    assert r["refused"] == {}, r["refused"]  # every report and submission was answered ok
    # Every submission became a job (an array one per task) and was placed.
    assert r["placed"] > 0 and r["counts"]["start"] > 0 and r["parts_ended"] > 0
    for k in ("per_1000_reports", "per_1000_submissions", "per_pass"):
        v = r["figures"][k]
        assert v > 0 and math.isfinite(v), (k, v)
    assert r["total_cpu_s"] > 0
