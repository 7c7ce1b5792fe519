"""JSON lines, the wire protocol of the API, written once.

Every API transport speaks it: the daemon's Unix socket (``mt-*`` tools), the
``mtgpu-api`` SSH subsystem (remotegpu-cli, mtcode-admin, the editor extension) and
the ``mtgpu-peer`` channel between members. One UTF-8 JSON object per line, ended by
``\\n``: a request ``{"op": NAME, "args": {...}, "id": ANY}``; an answer ``{"id": ANY,
"ok": true, "result": ...}`` or a refusal ``{"id": ANY, "ok": false, "error": TEXT,
"code": WORD, "retryable": BOOL}`` (:func:`refusal`, read back by :func:`answer_error`).
Clients decide on ``code`` and ``retryable``, never on the words of ``error``.

A line read is bounded (:data:`MAX_LINE_BYTES` for requests, :data:`MAX_ANSWER_BYTES`
for answers); NaN and Infinity, which Python's json would read and write, are not
JSON and are refused; so is nesting deeper than :data:`MAX_DEPTH` and, in a request,
more than :data:`MAX_ITEMS` values: both are counted on the bytes, in C-speed scans that
build nothing, before ``json.loads`` builds a single object (:func:`work_error`). A
listing given in pages (:class:`Page`) answers ``"next_cursor"`` beside its result
while more remain. The C client
(``mt-job``'s fast path, mtgpu/cli/fastjob.c) writes and reads the same lines.

This module imports only the standard library and :mod:`mtgpu.errors`:
remotegpu-cli's own package carries it (clients/remotegpu/pyproject.toml).

>>> encode({"op": "version", "args": {}, "id": 1})
b'{"op": "version", "args": {}, "id": 1}\\n'
>>> decode(b'{"id": 1, "ok": true, "result": 3}')
{'id': 1, 'ok': True, 'result': 3}
>>> answer_error(refusal(ApiError("no scheduler is elected", "no_leader"), 7)).retryable
True
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mtgpu.errors import ApiError, MtgpuError, ValidationError

#: The longest request line, on every transport: room for a JOB_SCRIPT_MAX script (2 MiB
#: at most) with JSON's escapes. A longer line is refused whole, with one answer.
MAX_LINE_BYTES = 4 << 20
#: The longest answer line a client reads (a long job list is a few MiB; this bounds
#: what a broken or hostile server can make a client hold).
MAX_ANSWER_BYTES = 256 << 20
#: The deepest nesting of arrays and objects in a line (no operation takes more than 3).
MAX_DEPTH = 32
#: The most values (arrays, objects, strings, numbers...) a request may hold: what
#: ``json.loads`` builds is bounded by this, not by the line's 4 MiB (a line of empty
#: lists held the GIL for seconds and doubled the daemon's memory).
MAX_ITEMS = 100_000
#: A line that does not end is read and dropped up to this many times its limit, then
#: the stream is given up.
DISCARD_FACTOR = 16


class LineError(ValidationError):
    """A line that is not one JSON message: bad JSON, NaN, too deep, not an object,
    not UTF-8 (code ``bad_request``), or too long (:class:`LineTooLong`)."""


class LineTooLong(LineError):
    """A line over its limit (code ``too_large``); a reader has dropped all of it."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the line is {size} bytes; a line is at most {limit} ({limit >> 20} MiB); "
            "keep data out of requests",
            code="too_large",
        )
        self.size, self.limit = size, limit


@dataclass(frozen=True)
class Page:
    """One page of a listing (``job.list``): what a handler returns for ``items`` when
    more may follow. Its answer is ``{"result": items, "next_cursor": TEXT}``, the
    cursor there only while more remain; a client sends it back as ``cursor`` for the
    next page (clients that know nothing of pages read the first one as before)."""

    items: list[Any]
    next_cursor: str | None = None


#: The most pages a client reads of one listing: more means a cursor that never ends.
MAX_PAGES = 100_000


def too_many_pages(op: str) -> ApiError:
    """What a client raises when ``op`` gave more than :data:`MAX_PAGES` pages."""
    return ApiError(f"{op} gave more than {MAX_PAGES} pages; the server is broken", "no_answer")


# ---------------------------------------------------------------------- encoding


def encode(msg: dict[str, Any], *, sort_keys: bool = False) -> bytes:
    """One line of strict JSON for ``msg`` (a request, or an answer whose content is
    known to be JSON). LineError for NaN, Infinity or a value JSON has no form for."""
    try:
        text = json.dumps(msg, sort_keys=sort_keys, allow_nan=False)
    except ValueError as exc:
        raise LineError(f"NaN and Infinity are not JSON; send a number or null ({exc})") from None
    except TypeError as exc:
        raise LineError(f"this message cannot be sent as JSON: {exc}") from None
    return text.encode() + b"\n"


def _finite(value: Any) -> Any:
    """``value`` with every NaN and infinity replaced by null (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def encode_answer(answer: dict[str, Any]) -> bytes:
    """One answer line, never failing: strict JSON (a NaN or infinity becomes null,
    anything else JSON has no form for becomes its ``str``). Keys are sorted, so a
    client may print a result as it came."""
    for attempt in (answer, _finite(answer)):
        try:
            text = json.dumps(attempt, default=str, sort_keys=True, allow_nan=False)
        except TypeError:  # keys of mixed types cannot be sorted
            try:
                text = json.dumps(attempt, default=str, allow_nan=False)
            except ValueError:
                continue
        except ValueError:  # a NaN or infinity somewhere: send null in its place
            continue
        return text.encode() + b"\n"
    return encode(error_answer("the answer could not be written as JSON", "internal"))


# ---------------------------------------------------------------------- errors


def error_answer(
    message: str, code: str, rid: object = None, retryable: bool | None = None
) -> dict[str, Any]:
    """The one refusal shape: ``{"id", "ok": false, "code", "retryable", "error"}``.
    ``retryable`` defaults to what ``code`` says (:data:`mtgpu.errors.RETRYABLE_CODES`)."""
    return refusal(ApiError(message, code, retryable=retryable), rid)


#: The longest ``error`` text of a refusal: a message that quotes a tenant's input
#: (an operation's name, a job id) never echoes more of it than this.
MAX_ERROR_CHARS = 2048


def bounded_error(text: str) -> str:
    """``text``, or for a longer one its start and end (where the fix is said) with
    the middle left out, MAX_ERROR_CHARS characters at most.

    >>> len(bounded_error("no job " + "9" * 3_000_000 + " of yours")) <= MAX_ERROR_CHARS
    True
    """
    if len(text) <= MAX_ERROR_CHARS:
        return text
    cut = ""
    for _ in range(3):  # the count's digits change its own length at most once
        kept = MAX_ERROR_CHARS - len(cut)
        cut = f" ... ({len(text) - kept} characters left out) ... "
    head = (MAX_ERROR_CHARS - len(cut)) * 3 // 4
    tail = MAX_ERROR_CHARS - len(cut) - head
    return text[:head] + cut + text[-tail:]


def refusal(exc: MtgpuError, rid: object = None) -> dict[str, Any]:
    """The API answer for ``exc``: ``{"id", "ok": false, "error", "code", "retryable"}``,
    its text bounded (:func:`bounded_error`)."""
    error = bounded_error(str(exc))
    return {"id": rid, "ok": False, "error": error, "code": exc.code, "retryable": exc.retryable}


def answer_error(answer: dict[str, Any]) -> ApiError | None:
    """The refusal an answer carries as an ApiError (its code and ``retryable`` kept);
    None for an answer that is ``ok``."""
    if answer.get("ok"):
        return None
    return ApiError.from_answer(answer)


def result(answer: dict[str, Any]) -> Any:
    """An answer's result; its refusal raised as ApiError."""
    exc = answer_error(answer)
    if exc is not None:
        raise exc
    return answer.get("result")


# ---------------------------------------------------------------------- decoding


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: A JSON string, closing quote or not (so that a match never fails and is looked for
#: again further on: linear on any input). Possessive: no backtracking.
_STRING = re.compile(rb'"[^"\\]*+(?:\\(?s:.)?[^"\\]*+)*+"?')
#: Every byte but the brackets, deleted to leave the nesting.
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
#: Opening brackets to 1, closing ones to -1 (as signed bytes).
_SIGNS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def work_error(data: bytes, depth: int = MAX_DEPTH, items: int | None = None) -> str | None:
    """Why ``json.loads`` should not be given ``data``: it nests arrays and objects more
    than ``depth`` deep, or (``items`` given) holds more than ``items`` values; None if
    neither. Counted on the bytes, strings' contents left out, with scans that run in C
    and build no objects: the cost is a few passes over the line, whatever it holds
    (exact for JSON; for a line that is not, ``json.loads`` stops at the first fault).
    The reason says the limit, never the line.

    >>> work_error(b'{"op": "x", "args": {"ids": ["[", "]"]}}', depth=3) is None
    True
    >>> work_error(b"[" * 3 + b"]" * 3, depth=2)
    'the line nests arrays and objects more than 2 deep; no operation takes that'
    >>> work_error(b"[" + b"[]," * 5 + b"[]]", items=5)[:46]
    'the line holds more than 5 values (arrays, obj'
    """
    opens = data.count(b"[") + data.count(b"{")
    over_items = items is not None and opens + data.count(b",") >= items
    if opens <= depth and not over_items:
        return None  # bounded even counting the brackets and commas of strings
    if items is not None and (data.count(b'"') - data.count(b'\\"')) // 2 > items:
        return _too_many(items)  # a lower bound of the strings: each is a value or a key
    bare = _STRING.sub(b"", data) if b'"' in data else data
    opens = bare.count(b"[") + bare.count(b"{")
    if items is not None and opens + bare.count(b",") >= items:
        return _too_many(items)
    if opens <= depth:
        return None
    brackets = bare.translate(None, _NOT_BRACKETS)
    if len(brackets) > 2 * opens:
        brackets = brackets[: 2 * opens]  # more closing than opening: not JSON anyway
    if max(itertools.accumulate(memoryview(brackets.translate(_SIGNS)).cast("b"))) > depth:
        return f"the line nests arrays and objects more than {depth} deep; no operation takes that"
    return None


def _too_many(items: int) -> str:
    return (
        f"the line holds more than {items} values (arrays, objects, strings, numbers); "
        f"a request holds at most {items}: send fewer in each"
    )


def decode_value(
    line: bytes | str, *, limit: int = MAX_LINE_BYTES, depth: int = MAX_DEPTH, items: int | None = None
) -> Any:
    """The JSON value on one line (its newline may be there or not); LineError naming
    what is wrong: over ``limit`` bytes, not UTF-8, not JSON (NaN and Infinity are
    not), nested deeper than ``depth``, or (``items`` given: a request) more than
    ``items`` values. Depth and values are counted before anything is parsed
    (:func:`work_error`)."""
    data = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else bytes(line)
    if len(data) > limit:
        raise LineTooLong(len(data), limit)
    too_deep = LineError(f"the line nests arrays and objects more than {depth} deep; no operation takes that")
    why = work_error(data, depth, items)
    if why is not None:
        raise LineError(why)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LineError(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}; send JSON as UTF-8"
        ) from None
    try:
        value = json.loads(text, parse_constant=_no_constants)
    except RecursionError:
        raise too_deep from None
    except ValueError:
        raise LineError(
            "not valid JSON (NaN and Infinity are not JSON either); send one JSON object per line"
        ) from None
    return value


def decode(line: bytes | str, *, limit: int = MAX_LINE_BYTES, depth: int = MAX_DEPTH) -> dict[str, Any]:
    """The JSON object on one line: :func:`decode_value`, and LineError if the value is
    not an object."""
    value = decode_value(line, limit=limit, depth=depth)
    if not isinstance(value, dict):
        raise LineError(f"a line must hold one JSON object, not {type(value).__name__}")
    return value


# ---------------------------------------------------------------------- readers


class ByteStream(Protocol):
    """What :class:`LineReader` reads: an asyncio StreamReader, asyncssh's SSHReader."""

    async def read(self, n: int = -1) -> bytes: ...


class _Lines:
    """Splitting bytes into lines of at most ``limit`` bytes. Each byte is looked at
    once, so a long line costs its length, not its square."""

    def __init__(self, limit: int, discard_limit: int | None, partial: bool) -> None:
        self.limit, self.partial = limit, partial
        self.discard_limit = DISCARD_FACTOR * limit if discard_limit is None else discard_limit
        self._buf = bytearray()
        self._scanned = 0
        self._dropping: int | None = None  # bytes of an overlong line dropped so far

    def _take(self) -> bytes | None:
        """A complete line from the buffer, or None (more is needed); LineTooLong once
        an overlong line has ended (it is dropped, the stream goes on)."""
        if self._dropping is not None:
            i = self._buf.find(b"\n")
            if i < 0:
                self._dropping += len(self._buf)
                self._buf.clear()
                if self._dropping > self.discard_limit:
                    raise ConnectionError("a line that does not end")
                return None
            size = self._dropping + i
            del self._buf[: i + 1]
            self._dropping = None
            self._scanned = 0
            raise LineTooLong(size, self.limit)
        i = self._buf.find(b"\n", self._scanned)
        if 0 <= i <= self.limit:
            line = bytes(self._buf[:i])
            del self._buf[: i + 1]
            self._scanned = 0
            return line
        if i > self.limit:
            del self._buf[: i + 1]
            self._scanned = 0
            raise LineTooLong(i, self.limit)
        if len(self._buf) > self.limit:
            self._dropping = 0
            return self._take()
        self._scanned = len(self._buf)
        return None

    def _end(self) -> bytes | None:
        """At the end of the stream: a last line without its newline, or None."""
        if self._dropping is not None:
            size, self._dropping = self._dropping, None
            raise LineTooLong(size, self.limit)
        line = bytes(self._buf)
        self._buf.clear()
        return line if line and self.partial else None


class LineReader(_Lines):
    """Lines from an asyncio or asyncssh byte stream. :meth:`next` gives each line
    without its newline, None at the end of the stream, and raises
    :class:`LineTooLong` once for a line over ``limit`` (read to its end and dropped:
    the client gets one answer for it and the stream goes on). A line that never ends
    is dropped until ``discard_limit`` bytes, then ConnectionError gives the stream up.
    A last line without its newline is a line when ``partial`` (a request), and is
    dropped otherwise (an answer cut off by a closed connection).
    """

    def __init__(
        self,
        reader: ByteStream,
        limit: int = MAX_LINE_BYTES,
        discard_limit: int | None = None,
        partial: bool = True,
    ) -> None:
        super().__init__(limit, discard_limit, partial)
        self.reader = reader

    async def next(self) -> bytes | None:
        while True:
            line = self._take()
            if line is not None:
                return line
            data = await self.reader.read(1 << 16)
            if not data:
                return self._end()
            self._buf += data

    async def message(self) -> dict[str, Any] | None:
        """The next line's JSON object; None at the end of the stream; LineError."""
        line = await self.next()
        return None if line is None else decode(line, limit=self.limit)


class BlockingLineReader(_Lines):
    """:class:`LineReader` for blocking code: ``read`` is ``socket.recv`` or a pipe's
    ``read1`` (it returns b"" at the end of the stream). It reads answers: its limit is
    :data:`MAX_ANSWER_BYTES` and a line cut off by the end of the stream is dropped."""

    def __init__(
        self,
        read: Callable[[int], bytes],
        limit: int = MAX_ANSWER_BYTES,
        discard_limit: int | None = None,
        partial: bool = False,
    ) -> None:
        super().__init__(limit, discard_limit, partial)
        self.read = read

    def next(self) -> bytes | None:
        while True:
            line = self._take()
            if line is not None:
                return line
            data = self.read(1 << 16)
            if not data:
                return self._end()
            self._buf += data

    def message(self) -> dict[str, Any] | None:
        """The next line's JSON object; None at the end of the stream; LineError."""
        line = self.next()
        return None if line is None else decode(line, limit=self.limit)

    def reset(self) -> None:
        """Forget what was buffered (the connection it came from is closed)."""
        self._buf.clear()
        self._scanned = 0
        self._dropping = None
