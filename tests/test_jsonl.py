"""mtgpu.jsonl, the API's JSON lines: what every transport writes and how it reads
hostile lines (too long, not UTF-8, too deep, not an object, NaN), and the one refusal
shape with its code-based retry decision."""

from __future__ import annotations

import asyncio
import io
import json

import pytest

from mtgpu import jsonl
from mtgpu.errors import RESEND_CODES, RETRYABLE_CODES, ApiError, ValidationError


def _stream(data: bytes) -> asyncio.StreamReader:
    r = asyncio.StreamReader()
    r.feed_data(data)
    r.feed_eof()
    return r


def test_encode_is_one_line_that_decode_reads_back():
    msg = {"op": "job.submit", "args": {"script": "echo a\nb\r\n\u2028é", "n": [1, 2.5, None]}, "id": 7}
    line = jsonl.encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert jsonl.decode(line) == msg
    assert jsonl.decode(line.rstrip(b"\n").decode()) == msg  # str lines too
    # The bytes the clients have always sent (the fixture's and the C client's format).
    assert jsonl.encode({"op": "version", "args": {}, "id": 1}) == b'{"op": "version", "args": {}, "id": 1}\n'
    assert jsonl.encode({"b": 1, "a": 2}, sort_keys=True) == b'{"a": 2, "b": 1}\n'


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_encode_refuses_nan_and_infinity_with_a_clear_error(value):
    with pytest.raises(jsonl.LineError, match="NaN and Infinity are not JSON") as info:
        jsonl.encode({"op": "x", "args": {"v": value}, "id": 1})
    assert info.value.code == "bad_request" and isinstance(info.value, ValidationError)


def test_encode_refuses_what_json_cannot_say():
    with pytest.raises(jsonl.LineError, match="cannot be sent as JSON"):
        jsonl.encode({"op": "x", "args": {"v": object()}, "id": 1})


def test_answers_never_carry_nan_and_never_fail():
    line = jsonl.encode_answer({"id": 1, "ok": True, "result": {"a": float("nan"), "b": [float("inf")]}})
    assert json.loads(line)["result"] == {"a": None, "b": [None]}
    assert jsonl.encode_answer({"id": 1, "ok": True, "result": {1: "a", "b": object()}}).endswith(b"\n")
    assert list(json.loads(jsonl.encode_answer({"ok": True, "id": 2, "error": None}))) == [
        "error",
        "id",
        "ok",
    ]


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (b'{"op": NaN}', "NaN and Infinity are not JSON"),
        (b'{"op": "x", "id": -Infinity}', "not valid JSON"),
        (b'{"op": "x"', "not valid JSON"),
        (b"", "not valid JSON"),
        (b'{"op": "caf\xe9"}', "not UTF-8 text: byte 0xe9 at offset 11"),
        (b'{"op": "\xff\xfe"}', "not UTF-8"),
        (b"[" * 5000 + b"]" * 5000, "more than 32 deep"),
        (b"[" * 33 + b"]" * 33, "more than 32 deep"),
        (b'{"a":' * 40 + b"1" + b"}" * 40, "more than 32 deep"),
    ],
)
def test_hostile_lines_are_bad_requests_naming_the_problem(line, words):
    with pytest.raises(jsonl.LineError, match=words) as info:
        jsonl.decode_value(line)
    assert info.value.code == "bad_request"
    assert jsonl.refusal(info.value)["code"] == "bad_request"


def test_depth_is_counted_on_structure_not_on_brackets_in_strings():
    assert jsonl.decode_value(b"[" * 32 + b"]" * 32) is not None
    assert jsonl.decode(json.dumps({"op": "[" * 100 + "{" * 100}).encode())["op"].startswith("[[")


@pytest.mark.parametrize("line", [b"[1, 2]", b'"op"', b"3", b"null", b"true"])
def test_a_line_that_is_not_an_object_is_refused_by_decode(line):
    jsonl.decode_value(line)  # a JSON value all the same
    with pytest.raises(jsonl.LineError, match="must hold one JSON object"):
        jsonl.decode(line)


def test_an_oversize_line_is_too_large_before_it_is_parsed():
    with pytest.raises(jsonl.LineTooLong) as info:
        jsonl.decode(b'{"a": "' + b"x" * 200 + b'"}', limit=100)
    assert info.value.code == "too_large" and info.value.size == 209 and info.value.limit == 100
    assert not info.value.retryable


def test_the_refusal_shape_and_its_reader_decide_on_codes():
    a = jsonl.error_answer("no scheduler is elected; retry", "no_leader", rid=3)
    assert a == {"id": 3, "ok": False, "code": "no_leader", "retryable": True, "error": a["error"]}
    e = jsonl.answer_error(json.loads(jsonl.encode(a)))
    assert isinstance(e, ApiError) and e.code == "no_leader" and e.retryable
    # The word "retry" in a message decides nothing; the code and the flag do.
    e = jsonl.answer_error(jsonl.error_answer("wait 1s and retry", "rate_limited"))
    assert e is not None and not e.retryable
    assert jsonl.answer_error({"ok": False, "code": "no_leader", "retryable": False}).retryable is False
    assert jsonl.answer_error({"id": 1, "ok": True, "result": 5}) is None
    assert jsonl.result({"id": 1, "ok": True, "result": 5}) == 5
    with pytest.raises(ApiError) as info:
        jsonl.result({"id": 1, "ok": False})
    assert info.value.code == "error" and str(info.value) == "request refused"
    for code in RETRYABLE_CODES:
        assert jsonl.error_answer("x", code)["retryable"] is True
    for code in RESEND_CODES:
        assert jsonl.error_answer("x", code)["retryable"] is False


def test_the_async_reader_drops_an_overlong_line_whole_and_goes_on():
    async def go():
        lines = jsonl.LineReader(_stream(b'{"a": 1}\n' + b"x" * 1000 + b'\n{"b": 2}\n["c"]\n{"d"'), limit=100)
        got: list[object] = [await lines.message()]
        with pytest.raises(jsonl.LineTooLong) as info:
            await lines.message()
        got += [info.value.size, await lines.message()]
        with pytest.raises(jsonl.LineError):
            await lines.message()
        with pytest.raises(jsonl.LineError):  # the cut-off last line is a line (a request's)
            await lines.message()
        got.append(await lines.message())
        return got

    assert asyncio.run(go()) == [{"a": 1}, 1000, {"b": 2}, None]


def test_an_answer_reader_drops_a_line_cut_off_by_the_end():
    async def go():
        lines = jsonl.LineReader(_stream(b'{"a": 1}\n{"id": 2, "ok"'), partial=False)
        return [await lines.message(), await lines.message()]

    assert asyncio.run(go()) == [{"a": 1}, None]


def test_a_line_that_never_ends_is_given_up():
    async def go():
        lines = jsonl.LineReader(_stream(b"z" * 5000), limit=100, discard_limit=1000)
        await lines.next()

    with pytest.raises(ConnectionError):
        asyncio.run(go())


def test_the_blocking_reader_reads_lines_split_anywhere():
    data = jsonl.encode({"id": 1, "ok": True}) + jsonl.encode({"id": 2, "ok": False, "code": "busy"})
    chunks = [data[i : i + 3] for i in range(0, len(data), 3)]
    lines = jsonl.BlockingLineReader(lambda n: chunks.pop(0) if chunks else b"")
    assert lines.message() == {"id": 1, "ok": True}
    assert jsonl.answer_error(lines.message() or {}).retryable  # type: ignore[union-attr]
    assert lines.message() is None


def test_the_blocking_reader_bounds_an_answer():
    f = io.BytesIO(b"[" * 40 + b"]" * 40 + b"\n" + b"y" * 500 + b"\n" + b'{"ok": true}\n' + b'{"cut')
    lines = jsonl.BlockingLineReader(f.read1, limit=100)
    with pytest.raises(jsonl.LineError, match="deep"):
        lines.message()
    with pytest.raises(jsonl.LineTooLong):
        lines.message()
    assert lines.message() == {"ok": True}
    assert lines.message() is None


# ---------------------------------------------------------------------- its users


def _one_shot_server(path, reply: bytes):
    import socket
    import threading

    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(1 << 16)
            conn.sendall(reply)
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (b"<html>not an answer</html>\n", "no_answer"),
        (b'{"id": 1, "ok": NaN}\n', "no_answer"),
        (b'{"id": 1, "ok": tr', "closed"),  # cut off by the end of the connection
    ],
)
def test_the_tools_client_turns_a_bad_answer_line_into_a_code(tmp_path, reply, code):
    from mtgpu.api.client import ApiClient

    t = _one_shot_server(tmp_path / "api.sock", reply)
    with pytest.raises(ApiError) as info:
        ApiClient(str(tmp_path / "api.sock"), timeout=10).call_once("version")
    t.join(10)
    assert info.value.code == code, info.value


def test_remotegpu_skips_lines_that_are_not_answers():
    from mtgpu.tui.link import ApiChannel

    class Writer:
        def __init__(self) -> None:
            self.sent: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.sent.append(data)

        def close(self) -> None:
            pass

    async def go():
        reader = asyncio.StreamReader()
        w = Writer()
        chan = ApiChannel(w, reader)  # type: ignore[arg-type]
        calls = [asyncio.ensure_future(chan.call("version", 10)) for _ in range(2)]
        await asyncio.sleep(0)  # both are waiting for their answers
        reader.feed_data(b'garbage\n[1]\n"x"\n{"id": NaN}\n\xff\n' + b"[" * 100 + b"]" * 100 + b"\n")
        reader.feed_data(b'{"id": 1, "ok": true, "result": 5}\n{"id": 2, "ok": false, "code": "busy"}\n')
        first = await calls[0]
        with pytest.raises(ApiError) as info:
            await calls[1]
        chan.close()
        return first, info.value, w.sent

    first, refused, sent = asyncio.run(go())
    assert first == 5 and refused.code == "busy" and refused.retryable
    assert [json.loads(s) for s in sent] == [{"op": "version", "args": {}, "id": i} for i in (1, 2)]


def test_the_modules_examples_hold():
    import doctest

    failed, tried = doctest.testmod(jsonl)
    assert failed == 0 and tried >= 3
