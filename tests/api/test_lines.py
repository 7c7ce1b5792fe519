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
