"""A small blocking client for the API socket, used by every CLI.

It imports nothing heavy, so ``mt-job`` and friends start fast.
"""

from __future__ import annotations

import socket
import sys
import time
from typing import Any

from mtgpu import jsonl
from mtgpu.errors import RESEND_CODES, RETRYABLE_CODES, ApiError

#: How long a retryable answer (``"retryable": true``: nothing was done, such as
#: ``no_leader`` during an election or ``not_caught_up``) is retried for (seconds).
RETRY_FOR = 30.0
#: Answers after which a submission may have been made or not (a timeout, a dropped
#: connection, a leader change, a relay or commit that did not answer in time): sent
#: again with the same key, which returns the first outcome if there was one.
IN_DOUBT = RESEND_CODES
#: Answers that say nothing was done (no scheduler reachable from this member, a
#: replica behind, a daemon starting, busy) when the answer does not say
#: ``"retryable"`` itself: sent again as they are.
NOT_DONE = RETRYABLE_CODES
#: Refusals of the moment (the submit limits, a daemon restarting): after an attempt
#: in doubt, that first attempt may still be committed, so they are sent again too.
OF_THE_MOMENT = ("rate_limited", "queue_full", "not_running")


class ApiClient:
    """One connection to ``RUN_DIR/api.sock``; requests are answered in order."""

    def __init__(self, path: str, timeout: float = 60.0) -> None:
        self.path = path
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._lines: jsonl.BlockingLineReader | None = None
        self._next = 0
        self._noticed = False

    def _connect(self) -> socket.socket:
        if self._sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(self.timeout)
            try:
                s.connect(self.path)
            except FileNotFoundError as exc:
                s.close()
                raise ApiError(
                    f"MTGPU is not running here ({self.path} does not exist); "
                    "start it with `mtgpu-setup install --yes` or check "
                    "`mtgpu-setup status`",
                    "not_running",
                ) from exc
            except (ConnectionRefusedError, PermissionError) as exc:
                s.close()
                raise ApiError(
                    f"cannot reach the MTGPU daemon at {self.path}: {exc.strerror}; "
                    "check `mtgpu-setup status`",
                    "not_running",
                ) from exc
            self._sock = s
            self._lines = jsonl.BlockingLineReader(s.recv)
        return self._sock

    #: How long a request answered ``starting`` (the daemon is loading its state) is
    #: retried before the refusal is shown.
    STARTING_RETRY = 120.0

    def call(self, op: str, **args: Any) -> Any:
        """Send one request and return its result; raise ApiError on refusal.

        While the daemon answers that it is still starting, the request is sent
        again every half second (for ``STARTING_RETRY`` seconds at most); any other
        retryable answer (nothing was done) is retried for ``RETRY_FOR`` seconds."""
        return self._retried(op, args).get("result")

    def call_all(self, op: str, **args: Any) -> list[Any]:
        """Every item of a listing given in pages (``job.list``): each page's result
        in turn, sending its ``next_cursor`` back as ``cursor`` until none is given;
        each page is retried as :meth:`call` retries. A server that does not page
        answers everything at once, which is the one page."""
        items: list[Any] = []
        cursor = None
        for _ in range(jsonl.MAX_PAGES):
            answer = self._retried(op, {**args, "cursor": cursor})
            items.extend(answer.get("result") or ())
            cursor = answer.get("next_cursor")
            if not cursor:
                return items
        raise jsonl.too_many_pages(op)

    def _retried(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``op``, retried as :meth:`call` says; ApiError on refusal."""
        starting_until = time.monotonic() + self.STARTING_RETRY
        retry_until = time.monotonic() + RETRY_FOR
        while True:
            try:
                return self._answer(op, args)
            except ApiError as exc:
                now = time.monotonic()
                if exc.code == "starting" and now < starting_until:
                    time.sleep(0.5)
                elif exc.retryable and exc.code != "starting" and now < retry_until:
                    time.sleep(0.2)
                else:
                    raise

    def call_once(self, op: str, **args: Any) -> Any:
        """Send one request once and return its result; raise ApiError on refusal (for
        a caller that decides its own retries, as a submission with its key does)."""
        return self._answer(op, args).get("result")

    def _answer(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        s = self._connect()
        self._next += 1
        req = {"op": op, "args": {k: v for k, v in args.items() if v is not None}, "id": self._next}
        line = jsonl.encode(req)
        try:
            s.sendall(line)
            answer = self._read_answer()
        except (TimeoutError, OSError) as exc:
            self.close()
            raise ApiError(f"the MTGPU daemon did not answer: {exc}", "no_answer") from exc
        except ApiError:
            self.close()
            raise
        refused = jsonl.answer_error(answer)
        if refused is not None:
            raise refused
        if answer.get("notice") and not self._noticed:
            # Once per command, on stderr, so --json output stays clean.
            self._noticed = True
            print(f"mtgpu: warning: {answer['notice']}", file=sys.stderr)
        return answer

    def _read_answer(self) -> dict[str, Any]:
        assert self._lines is not None
        try:
            answer = self._lines.message()
        except jsonl.LineError as exc:
            raise ApiError(f"the MTGPU daemon sent a line that is not an answer: {exc}", "no_answer") from exc
        if answer is None:
            raise ApiError("the MTGPU daemon closed the connection", "closed")
        return answer

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self._lines = None


def socket_path_from_config(config: str | None) -> str:
    """The API socket of the daemon whose configuration is ``config`` (or the default)."""
    from mtgpu.config import load

    return load(config).api_socket
