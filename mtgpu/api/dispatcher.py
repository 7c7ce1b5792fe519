"""The one API dispatcher behind the Unix socket, the mtgpu-api subsystem and peers.

A request is a JSON object ``{"op": NAME, "args": {...}, "id": ANY}``; the answer is
``{"id": ANY, "ok": true, "result": ...}`` or ``{"id": ANY, "ok": false, "error":
TEXT, "code": WORD}``. Every handler gets an authenticated :class:`Caller`, never a
claimed one: the transports establish it (SO_PEERCRED, the SSH login) before any
request is read.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mtgpu.errors import ApiError, MtgpuError

log = logging.getLogger("mtgpu.api")

MAX_REQUEST_BYTES = 1 << 20


@dataclass(frozen=True)
class Caller:
    """Who is asking. ``uid`` is the OS account's UID (0 for root on the host)."""

    name: str
    uid: int
    admin: bool
    via: str  # "socket", "ssh" or "peer"


Handler = Callable[[Caller, dict[str, Any]], Awaitable[Any] | Any]
#: Writes one audit entry: (caller, operation, arguments, error or None).
Auditor = Callable[[Caller, str, dict[str, Any], "str | None"], Awaitable[None]]
#: A check run before an operation's handler; it refuses by raising ApiError.
Guard = Callable[[Caller, dict[str, Any]], Awaitable[None] | None]


@dataclass(frozen=True)
class _Op:
    fn: Handler
    admin: bool
    doc: str
    audit: bool = False


class Dispatcher:
    """Maps operation names to handlers, enforces the admin flag and audits actions."""

    def __init__(self) -> None:
        self._ops: dict[str, _Op] = {}
        #: Set by the daemon once the replicated audit log exists.
        self.auditor: Auditor | None = None
        self._guards: dict[str, list[Guard]] = {}
        #: A warning for the caller added to every successful answer (``notice``),
        #: such as being over USER_DISK_LIMIT; None for nothing to say.
        self.notice: Callable[[Caller], str | None] | None = None

    def guard(self, name: str, fn: Guard) -> None:
        """Run ``fn`` before the handler of ``name`` (kept when the handler is replaced)."""
        self._guards.setdefault(name, []).append(fn)

    def register(self, name: str, fn: Handler, *, admin: bool = False, audit: bool = False) -> None:
        """Serve ``name`` with ``fn``. ``admin``: admins only. ``audit``: an action an
        admin takes with it is written to the audit log, whether it succeeds or not
        (a tenant's own use of the operation, such as cancelling their job, is not)."""
        self._ops[name] = _Op(fn, admin, (inspect.getdoc(fn) or "").split("\n")[0], audit)

    def op(self, name: str) -> _Op | None:
        return self._ops.get(name)

    def ops(self, caller: Caller) -> list[str]:
        return sorted(n for n, op in self._ops.items() if caller.admin or not op.admin)

    async def handle(self, caller: Caller, request: object) -> dict[str, Any]:
        """Answer one request; never raises."""
        rid = request.get("id") if isinstance(request, dict) else None
        try:
            if not isinstance(request, dict):
                raise ApiError("a request must be a JSON object with an \"op\" field", "bad_request")
            name = request.get("op")
            args = request.get("args", {})
            if not isinstance(name, str) or not isinstance(args, dict):
                raise ApiError("a request needs \"op\" (a string) and \"args\" (an object)",
                               "bad_request")
            op = self._ops.get(name)
            if op is None:
                raise ApiError(f"unknown operation {name!r}; known: {', '.join(self.ops(caller))}",
                               "unknown_op")
            if op.admin and not caller.admin:
                raise ApiError(f"{name} needs an admin; ask an admin of this cluster",
                               "forbidden")
        except ApiError as exc:
            return {"id": rid, "ok": False, "error": str(exc), "code": exc.code}
        answer = await self._run(name, op, caller, args, rid, request)
        # Actions are audited where the admin asked (a relayed request was audited on
        # the member that relayed it).
        if op.audit and caller.admin and caller.via not in ("peer", "forwarded") \
                and self.auditor is not None:
            try:
                await self.auditor(caller, name, args,
                                   None if answer["ok"] else answer.get("error", "refused"))
            except Exception:  # noqa: BLE001 - the action stands even if its entry failed
                log.exception("could not write the audit entry of %s by %s", name, caller.name)
        return answer

    async def _run(self, name: str, op: _Op, caller: Caller, args: dict[str, Any], rid: Any,
                   request: dict[str, Any]) -> dict[str, Any]:
        try:
            for check in self._guards.get(name, ()):
                checked = check(caller, args)
                if inspect.isawaitable(checked):
                    await checked
            result = op.fn(caller, args)
            if inspect.isawaitable(result):
                result = await result
            answer = {"id": rid, "ok": True, "result": result}
            note = self.notice(caller) if self.notice is not None else None
            if note:
                answer["notice"] = note
            return answer
        except ApiError as exc:
            return {"id": rid, "ok": False, "error": str(exc), "code": exc.code}
        except MtgpuError as exc:
            return {"id": rid, "ok": False, "error": str(exc), "code": "error"}
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("request %r failed", request, exc_info=True)
            return {"id": rid, "ok": False, "error": f"bad arguments: {exc}", "code": "bad_request"}
        except Exception:  # noqa: BLE001 - one bad request must not take the daemon down
            log.exception("API handler failed for %r", request)
            return {"id": rid, "ok": False, "error": "internal error; see `mtgpu-admin logs`",
                    "code": "internal"}


def arg(args: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    """Fetch ``args[name]`` checking its type; raise ApiError naming it if wrong.

    >>> arg({"n": 3}, "n", int)
    3
    """
    if name not in args or args[name] is None:
        if default is ...:
            raise ApiError(f"missing argument {name!r}", "bad_request")
        return default
    v = args[name]
    if not isinstance(v, kind) or (isinstance(v, bool) and kind is int):
        want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ApiError(f"argument {name!r} must be {want}", "bad_request")
    return v
