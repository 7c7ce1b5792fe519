"""The API's line reader and JSON rules, shared by the Unix socket and the mtgpu-api
subsystem: one limit, a long line refused whole (one answer), bounded depth, no NaN."""

from __future__ import annotations

import asyncio
import json

from mtgpu.api.dispatcher import MAX_JSON_DEPTH, MAX_REQUEST_BYTES
from mtgpu.api.unix import parse_request
from mtgpu.jsonl import LineReader, LineTooLong, encode_answer


def _reader(data: bytes) -> asyncio.StreamReader:
    r = asyncio.StreamReader()
    r.feed_data(data)
    r.feed_eof()
    return r


def test_a_line_over_the_limit_is_one_refusal_and_the_stream_goes_on():
    async def go():
        lines = LineReader(_reader(b"a\n" + b"x" * (MAX_REQUEST_BYTES + 10) + b"\nb\n" + b"y" * 100))
        got = [await lines.next()]
        try:
            await lines.next()
        except LineTooLong as exc:
            got.append(exc.size)
        got += [await lines.next(), await lines.next(), await lines.next()]
        return got

    assert asyncio.run(go()) == [b"a", MAX_REQUEST_BYTES + 10, b"b", b"y" * 100, None]


def test_a_line_that_never_ends_is_given_up():
    async def go():
        lines = LineReader(_reader(b"z" * 5000), limit=100, discard_limit=1000)
        try:
            await lines.next()
        except ConnectionError:
            return "closed"
        return "read"

    assert asyncio.run(go()) == "closed"


def test_depth_nan_and_infinity_are_bad_requests():
    for line in (
        b"[" * 5000 + b"]" * 5000,
        b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1),
        b'{"op": NaN}',
        b'{"op": "x", "id": -Infinity}',
    ):
        request, refusal = parse_request(line)
        assert request is None and refusal["code"] == "bad_request", line[:40]
    request, refusal = parse_request(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH)
    assert refusal is None
    # Brackets inside strings do not count.
    assert parse_request(json.dumps({"op": "[" * 100}).encode())[1] is None


def test_answers_never_carry_nan_or_infinity():
    line = encode_answer({"id": 1, "ok": True, "result": {"a": float("nan"), "b": [float("inf")]}})
    assert b"NaN" not in line and b"Infinity" not in line
    assert json.loads(line)["result"] == {"a": None, "b": [None]}


def test_rate_buckets_keep_the_most_recent_tenants_only():
    from mtgpu.api.limits import SubmitLimits

    lim = SubmitLimits(rate=1, burst=1, max_queued=None, clock=lambda: 0.0)
    lim.MAX_BUCKETS = 10
    for i in range(50):
        lim.take(f"t{i}")
    assert len(lim._buckets) == 10 and "t49" in lim._buckets and "t0" not in lim._buckets


def test_values_and_depth_are_counted_before_parsing_and_never_echoed():
    """4 MiB of ``[[],[],...]`` or ``[[[...]]]`` is refused naming the limit, after a
    few scans of its bytes (json.loads built 1.4 million lists for it before); the
    count is exact at the limit, and brackets and commas inside strings count for
    nothing; another member's line (items None) is bounded by size and depth only."""
    import time

    from mtgpu.api.dispatcher import MAX_REQUEST_ITEMS

    room = MAX_REQUEST_BYTES - 64
    wide = b'{"op": "x", "args": {"v": [' + b"[]," * (room // 3 - 1) + b"[]]}}"
    deep = b'{"op": "x", "args": {"v": ' + b"[" * (room // 2) + b"]" * (room // 2) + b"}}"
    for line in (wide, deep):
        t = time.monotonic()
        request, refusal = parse_request(line)
        took = time.monotonic() - t
        print(f"{len(line)} bytes refused in {took:.3f} s")
        assert request is None and refusal["code"] == "bad_request", refusal
        assert f"more than {MAX_REQUEST_ITEMS} values" in refusal["error"] and "[]" not in refusal["error"]
        assert took < 2.0  # a liveness bound: it was 3.2 s, holding the event loop
    # Two objects, "x", a list and n numbers in it: 4 + n values.
    at = json.dumps({"op": "x", "args": {"v": [0] * (MAX_REQUEST_ITEMS - 4)}}).encode()
    over = json.dumps({"op": "x", "args": {"v": [0] * (MAX_REQUEST_ITEMS - 3)}}).encode()
    assert parse_request(at)[1] is None
    assert parse_request(over)[1]["code"] == "bad_request"
    assert parse_request(over, None)[1] is None  # a member's batch of job records
    text = json.dumps({"op": "x", "args": {"s": "[{," * 400_000}}).encode()
    assert parse_request(text)[1] is None


def test_a_page_carries_its_cursor_beside_the_result_and_through_a_relay():
    from mtgpu.api.dispatcher import Caller, Dispatcher
    from mtgpu.jsonl import Page

    d = Dispatcher()
    d.register("paged", lambda caller, args: Page([1, 2], "2" if not args.get("last") else None))
    tina = Caller("tina", 20001, False, "socket")
    first = asyncio.run(d.handle(tina, {"op": "paged", "args": {}, "id": 1}))
    last = asyncio.run(d.handle(tina, {"op": "paged", "args": {"last": True}, "id": 2}))
    assert first == {"id": 1, "ok": True, "result": [1, 2], "next_cursor": "2"}
    assert last == {"id": 2, "ok": True, "result": [1, 2]}
