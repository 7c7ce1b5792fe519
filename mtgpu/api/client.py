"""A small blocking client for the API socket, used by every CLI.

It imports nothing heavy, so ``mt-job`` and friends start fast.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

from mtgpu.errors import ApiError


class ApiClient:
    """One connection to ``RUN_DIR/api.sock``; requests are answered in order."""

    def __init__(self, path: str, timeout: float = 60.0) -> None:
        self.path = path
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buf = b""
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
                raise ApiError(f"MTGPU is not running here ({self.path} does not exist); "
                               "start it with `mtgpu-setup install --yes` or check "
                               "`mtgpu-setup status`", "not_running") from exc
            except (ConnectionRefusedError, PermissionError) as exc:
                s.close()
                raise ApiError(f"cannot reach the MTGPU daemon at {self.path}: {exc.strerror}; "
                               "check `mtgpu-setup status`", "not_running") from exc
            self._sock = s
        return self._sock

    def call(self, op: str, **args: Any) -> Any:
        """Send one request and return its result; raise ApiError on refusal."""
        s = self._connect()
        self._next += 1
        req = {"op": op, "args": {k: v for k, v in args.items() if v is not None}, "id": self._next}
        try:
            s.sendall(json.dumps(req).encode() + b"\n")
            answer = self._read_line(s)
        except (socket.timeout, OSError) as exc:
            self.close()
            raise ApiError(f"the MTGPU daemon did not answer: {exc}", "no_answer") from exc
        except ApiError:
            self.close()
            raise
        if not answer.get("ok"):
            raise ApiError(answer.get("error", "request refused"), answer.get("code", "error"))
        if answer.get("notice") and not self._noticed:
            # Once per command, on stderr, so --json output stays clean.
            self._noticed = True
            print(f"mtgpu: warning: {answer['notice']}", file=sys.stderr)
        return answer.get("result")

    def _read_line(self, s: socket.socket) -> dict[str, Any]:
        while b"\n" not in self._buf:
            chunk = s.recv(1 << 16)
            if not chunk:
                self._buf = b""
                raise ApiError("the MTGPU daemon closed the connection", "closed")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def socket_path_from_config(config: str | None) -> str:
    """The API socket of the daemon whose configuration is ``config`` (or the default)."""
    from mtgpu.config import load

    return load(config).api_socket
