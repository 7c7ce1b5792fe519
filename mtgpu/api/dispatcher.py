"""The one API dispatcher behind the Unix socket, the mtgpu-api subsystem and peers.

A request is a JSON object ``{"op": NAME, "args": {...}, "id": ANY}``; the answer is
``{"id": ANY, "ok": true, "result": ...}`` or ``{"id": ANY, "ok": false, "error":
TEXT, "code": WORD, "retryable": BOOL}`` (:func:`mtgpu.jsonl.refusal`).

Errors: a :class:`~mtgpu.errors.ValidationError` (a malformed request) is answered
``bad_request`` with its message; any other :class:`~mtgpu.errors.MtgpuError` with its
own code and message. Anything else a handler lets out is a bug in the server, not
the caller's mistake: it is logged once with its traceback under a short id, and
the caller is answered ``internal`` with that id, which the admin finds in the log.
Every handler gets an authenticated :class:`Caller`, never a
claimed one: the transports establish it (SO_PEERCRED, the SSH login) before any
request is read.

Middleware wraps the handlers: each is called with the caller, the operation's name,
its arguments and ``call_next`` (the rest of the chain, ending with the handler) and
returns the result; it answers itself by not calling ``call_next``. The first one
given is the outermost. It runs after the admin check and the guards, so what it
answers is audited like the handler's own answer (leader forwarding in a cluster is
one, :func:`mtgpu.api.cluster.leader_forwarding`).
"""

from __future__ import annotations

import inspect
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mtgpu.errors import ApiError, MtgpuError, ValidationError
from mtgpu.jsonl import MAX_DEPTH, MAX_ITEMS, MAX_LINE_BYTES, Page, refusal

log = logging.getLogger("mtgpu.api")

#: The longest request line, on the Unix socket and the mtgpu-api subsystem alike: room
#: for a JOB_SCRIPT_MAX script (2 MiB at most) with JSON's escapes. A longer line is
#: refused whole, with one answer.
MAX_REQUEST_BYTES = MAX_LINE_BYTES
#: The deepest nesting of arrays and objects in a request (no operation takes more than 3).
MAX_JSON_DEPTH = MAX_DEPTH
#: The most values (arrays, objects, strings, numbers) in a tenant's request, counted
#: on its bytes before it is parsed (:func:`mtgpu.jsonl.work_error`).
MAX_REQUEST_ITEMS = MAX_ITEMS


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
#: The rest of the middleware chain, ending with the operation's handler.
Next = Callable[[Caller, dict[str, Any]], Awaitable[Any]]
#: Wraps handling: (caller, operation, arguments, the rest of the chain) -> result.
Middleware = Callable[[Caller, str, dict[str, Any], Next], Awaitable[Any]]


@dataclass(frozen=True)
class _Op:
    fn: Handler
    admin: bool
    doc: str
    audit: bool = False


class Dispatcher:
    """Maps operation names to handlers, enforces the admin flag and audits actions."""

    def __init__(
        self,
        *,
        auditor: Auditor | None = None,
        starting: bool = False,
        middleware: tuple[Middleware, ...] | list[Middleware] = (),
    ) -> None:
        self._ops: dict[str, _Op] = {}
        #: Writes the audit entries (the daemon's goes to the replicated audit log).
        self.auditor: Auditor | None = auditor
        self._guards: dict[str, list[Guard]] = {}
        self._middleware: list[Middleware] = list(middleware)
        #: What adds a warning for the caller to every successful answer (``notice``),
        #: such as being over USER_DISK_LIMIT: see :meth:`add_notice`.
        self._notices: list[Callable[[Caller], str | None]] = []
        #: True while the daemon starts: its socket may already answer (peers need it
        #: to form the cluster) before every operation is registered, and an operation
        #: not registered yet is answered ``starting`` (the tools retry) rather than
        #: ``unknown_op``. :meth:`started` ends it.
        self.starting = starting

    def add_notice(self, fn: Callable[[Caller], str | None]) -> None:
        """Add a warning source: ``fn(caller)`` says what every successful answer to
        that caller should warn about (None or "" for nothing). Refusals carry none."""
        self._notices.append(fn)

    def notice(self, caller: Caller) -> str | None:
        """Every source's warning for ``caller``, joined with "; ", or None."""
        notes = [n for n in (fn(caller) for fn in self._notices) if n]
        return "; ".join(notes) or None

    def started(self) -> None:
        """Every operation is registered: one not known is now ``unknown_op``."""
        self.starting = False

    def use(self, fn: Middleware) -> None:
        """Add ``fn`` to the middleware chain, inside those added before it."""
        self._middleware.append(fn)

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
                raise ValidationError('a request must be a JSON object with an "op" field')
            name = request.get("op")
            args = request.get("args", {})
            if not isinstance(name, str) or not isinstance(args, dict):
                raise ValidationError('a request needs "op" (a string) and "args" (an object)')
            op = self._ops.get(name)
            if op is None and self.starting:
                raise ApiError(
                    "the MTGPU daemon is starting (loading its state); retry in a few seconds", "starting"
                )
            if op is None:
                raise ApiError(
                    f"unknown operation {quoted(name)}; known: {', '.join(self.ops(caller))}", "unknown_op"
                )
            if op.admin and not caller.admin:
                raise ApiError(f"{name} needs an admin; ask an admin of this cluster", "forbidden")
        except ApiError as exc:
            return refusal(exc, rid)
        answer = await self._run(name, op, caller, args, rid, request)
        # Actions are audited where the admin asked (a relayed request was audited on
        # the member that relayed it).
        if op.audit and caller.admin and caller.via not in ("peer", "forwarded") and self.auditor is not None:
            try:
                await self.auditor(
                    caller, name, args, None if answer["ok"] else answer.get("error", "refused")
                )
            except Exception:  # noqa: BLE001 - the action stands even if its entry failed
                log.exception("could not write the audit entry of %s by %s", name, caller.name)
        return answer

    async def _run(
        self, name: str, op: _Op, caller: Caller, args: dict[str, Any], rid: Any, request: dict[str, Any]
    ) -> dict[str, Any]:
        try:
            for check in self._guards.get(name, ()):
                checked = check(caller, args)
                if inspect.isawaitable(checked):
                    await checked
            result = await self._chain(name, op.fn, 0)(caller, args)
            answer = {"id": rid, "ok": True, "result": result}
            if isinstance(result, Page):  # a listing's page: its cursor beside the result
                answer["result"] = result.items
                if result.next_cursor:
                    answer["next_cursor"] = result.next_cursor
            note = self.notice(caller)
            if note:
                answer["notice"] = note
            return answer
        except MtgpuError as exc:
            return refusal(exc, rid)
        except Exception:  # noqa: BLE001 - one bug must not take the daemon down
            return internal_error(name, caller, rid)

    def _chain(self, name: str, fn: Handler, i: int) -> Next:
        """Middleware ``i`` onwards, ending with the handler ``fn``."""
        if i == len(self._middleware):

            async def handler(caller: Caller, args: dict[str, Any]) -> Any:
                result = fn(caller, args)
                return await result if inspect.isawaitable(result) else result

            return handler
        mw, rest = self._middleware[i], self._chain(name, fn, i + 1)

        async def wrapped(caller: Caller, args: dict[str, Any]) -> Any:
            return await mw(caller, name, args, rest)

        return wrapped


def quoted(text: str, n: int = 60) -> str:
    """A tenant's ``text`` quoted in a message: its first ``n`` characters, with its
    length if it is longer (a refusal never echoes a whole input back).

    >>> quoted("job.lits")
    "'job.lits'"
    >>> quoted("x" * 100, 4)
    "'xxxx'... (100 characters)"
    """
    return repr(text) if len(text) <= n else f"{text[:n]!r}... ({len(text)} characters)"


def internal_error(name: str, caller: Caller, rid: Any = None) -> dict[str, Any]:
    """Log the exception being handled once, with its traceback, under a new short id,
    and return the ``internal`` answer naming that id (call from an ``except`` block).

    The request's arguments are not logged: they may hold a tenant's script."""
    incident = secrets.token_hex(4)
    log.exception(  # noqa: LOG004 - called only from except blocks (see above)
        "internal error (id %s) in %s for %s (via %s)", incident, name, caller.name, caller.via
    )
    return {
        "id": rid,
        "ok": False,
        "code": "internal",
        "retryable": False,
        "error": f"internal error (id {incident}): the administrator can find it in the server log",
    }


def arg(args: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    """Fetch ``args[name]`` checking its type; raise ValidationError naming it if wrong.

    >>> arg({"n": 3}, "n", int)
    3
    """
    if name not in args or args[name] is None:
        if default is ...:
            raise ValidationError(f"missing argument {name!r}")
        return default
    v = args[name]
    if not isinstance(v, kind) or (isinstance(v, bool) and kind is int):
        want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ValidationError(f"argument {name!r} must be {want}")
    return v
