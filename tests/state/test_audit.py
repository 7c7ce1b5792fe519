"""The replicated audit log (its methods applied directly) and its doctests."""

from __future__ import annotations

import doctest

import mtgpu.cli.code_admin
import mtgpu.state.audit
from mtgpu.state.audit import MAX_ENTRIES, AuditLog, summarize


def entry(actor: str, action: str) -> dict:
    return {"time": 1.0, "actor": actor, "action": action, "args": {}, "ok": True}


def test_entries_are_numbered_and_filtered_by_actor_and_action_family():
    log = AuditLog()
    for actor, action in (("root", "user.add"), ("boss", "node.drain"), ("root", "node.undrain")):
        log.record(entry(actor, action), _doApply=True)
    assert [e["seq"] for e in log.list()] == [1, 2, 3]
    assert [e["action"] for e in log.list(actor="root")] == ["user.add", "node.undrain"]
    assert [e["action"] for e in log.list(action="node")] == ["node.drain", "node.undrain"]
    assert [e["seq"] for e in log.list(limit=1)] == [3]


def test_the_oldest_entries_go_past_the_limit():
    log = AuditLog()
    for _ in range(MAX_ENTRIES + 5):
        log.record(entry("root", "simulate"), _doApply=True)
    assert len(log.entries) == MAX_ENTRIES and log.entries[0]["seq"] == 6


def test_arguments_are_bounded():
    s = summarize({"keys": ["k" * 500] * 50, "deep": {"a": {"b": {"c": {"d": 1}}}}})
    assert len(s["keys"]) == 30 and s["keys"][0].endswith("...") and len(s["keys"][0]) == 203
    assert s["deep"] == {"a": {"b": "..."}}  # three levels deep at most


def test_doctests():
    for mod in (mtgpu.state.audit, mtgpu.cli.code_admin):
        failed, _ = doctest.testmod(mod)
        assert failed == 0
