"""Warnings added to answers (``notice``): each part of the daemon that has something
to warn a caller about adds its own source; every successful answer carries their
warnings joined, a refusal carries none."""

from __future__ import annotations

import asyncio

from mtgpu.api.dispatcher import Caller, Dispatcher
from mtgpu.errors import ApiError

TINA = Caller("tina", 20001, False, "socket")
OTTO = Caller("otto", 20002, False, "socket")


def _dispatcher() -> Dispatcher:
    d = Dispatcher()

    def ping(caller: Caller, args: dict) -> str:
        return "pong"

    def refuse(caller: Caller, args: dict) -> None:
        raise ApiError("not today", "busy")

    d.register("ping", ping)
    d.register("refuse", refuse)
    d.add_notice(lambda c: "over USER_DISK_LIMIT" if c.name == "tina" else None)
    d.add_notice(lambda c: "locked in 3 days" if c.name == "tina" else "")
    return d


def _ask(d: Dispatcher, caller: Caller, op: str) -> dict:
    return asyncio.run(d.handle(caller, {"op": op, "args": {}, "id": 1}))


def test_every_sources_warning_is_on_a_successful_answer_joined():
    d = _dispatcher()
    answer = _ask(d, TINA, "ping")
    assert answer["ok"] is True and answer["result"] == "pong"
    assert answer["notice"] == "over USER_DISK_LIMIT; locked in 3 days"
    assert "notice" not in _ask(d, OTTO, "ping")  # nothing to say: no key at all


def test_a_refusal_carries_no_warning():
    answer = _ask(_dispatcher(), TINA, "refuse")
    assert answer["ok"] is False and answer["code"] == "busy"
    assert "notice" not in answer
