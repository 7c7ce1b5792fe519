"""The one exception tree of MTGPU.

Every error that reaches a user says what was wrong and what to do about it.
Third-party errors are translated at the boundary with ``raise ... from exc``.
Every error carries a ``code``, the short word an API answer sends (``"error"``
unless a subclass says more), and ``retryable``: whether the request was not
carried out at all and may be sent again as it is (see :data:`RETRYABLE_CODES`).
Clients decide on codes, never on the words of a message::

    MtgpuError
    ├── ConfigError          a bad configuration file or value (exit status 2)
    ├── CommandError         a subprocess failed (argv and stderr attached)
    ├── StateError           the replicated state refused or timed out
    ├── AccountError         a tenant account cannot be created or used
    │   ├── UidConflictError a local account already holds the registry's UID
    │   └── MountError       a published directory cannot be mounted read-only
    ├── AuthError            an invite or key cannot be accepted
    ├── ApiError             an API request was refused (carries a code)
    │   └── ValidationError  the request itself is malformed: code ``bad_request``
    │                        (also a ValueError, for the parsers that raise it)
    ├── GpuProbeError        a GPU probe failed or printed bad output
    ├── JobError             a job file or job request is invalid
    ├── FenceError           a tenant's isolation cannot be set up: its session or
    │                        job is refused, never run with less (code ``isolation``)
    ├── SetupError           mtgpu-setup cannot do what was asked
    │   ├── SetupFailed      a step of install/uninstall failed (mtgpu.install.setup)
    │   └── BundleError      a release bundle is unusable here (mtgpu.install.bundle)
    ├── LimitReached         an SSH connection limit (mtgpu.sshd.limits)
    ├── SubmissionUnknown    a submission's outcome is not known (mtgpu.cli.job)
    ├── Unavailable          no job launcher took a start (mtgpu.schedd.launcher)
    └── FrameError           not a cluster handshake frame (mtgpu.cluster.framing)

Outside it, on purpose: ``BpfUnavailable`` is an ``OSError`` (it carries the errno of
bpf(2)); ``FormatError`` and ``HostlistError`` of the Slurm formats and the
configuration's ``_SubKeyError`` are ``ValueError`` for the parsers that catch those.
``tests/api/test_errors.py`` checks every exception class MTGPU defines.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Codes of refusals after which nothing was done: the same request may be sent again
#: (clients do, for a bounded time). ``starting``: the daemon is loading its state;
#: ``not_caught_up``: this member's replica lags the scheduler's log; ``no_leader``: no
#: scheduler is elected (an election is under way); ``busy``: the replicated log's
#: queue is full. A new retryable refusal adds its code here.
RETRYABLE_CODES = frozenset({"starting", "not_caught_up", "no_leader", "busy"})
#: Codes after which it is not known whether the request was carried out (the answer
#: was lost to a leader change or a lost connection, or a commit did not finish in
#: time): only a read, or a submission carrying its key, is sent again. ``no_answer``
#: and ``closed`` are the client's own (the daemon did not answer, or closed the
#: connection).
RESEND_CODES = frozenset({"in_doubt", "leader_changed", "unreachable", "no_answer", "closed"})


class MtgpuError(Exception):
    """Root of every error MTGPU raises on purpose."""

    #: The API answer's code for this error.
    code = "error"

    @property
    def retryable(self) -> bool:
        """True when nothing was done and the request may be sent again unchanged."""
        return self.code in RETRYABLE_CODES


class ConfigError(MtgpuError):
    """A configuration key is unknown, missing or has a bad value."""

    exit_status = 2

    def __init__(
        self, message: str, *, key: str | None = None, line: int | None = None, path: str | None = None
    ) -> None:
        self.key = key
        self.line = line
        self.path = path
        where = []
        if path:
            where.append(str(path) + (f":{line}" if line else ""))
        elif line:
            where.append(f"line {line}")
        if key:
            where.append(key)
        prefix = ": ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class CommandError(MtgpuError):
    """A subprocess exited non-zero or could not be started."""

    def __init__(
        self, argv: Sequence[str], returncode: int | None, stderr: str = "", stdout: str = ""
    ) -> None:
        import shlex

        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        self.stdout = stdout
        detail = stderr.strip() or stdout.strip()
        status = "could not start" if returncode is None else f"exited {returncode}"
        msg = f"`{shlex.join(self.argv)}` {status}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class StateError(MtgpuError):
    """The replicated state could not accept or answer a request.

    ``code`` says why when it is known: ``no_leader`` and ``busy`` (nothing was
    appended to the log: retryable), ``leader_changed`` (a leader change lost the
    command, which may or may not have committed)."""

    def __init__(self, message: str, code: str = "error") -> None:
        self.code = code
        super().__init__(message)


class AccountError(MtgpuError):
    """A tenant account cannot be created, found or used."""


class UidConflictError(AccountError):
    """A local account already holds the UID the registry assigned."""


class MountError(AccountError):
    """A dataset or interpreter cannot be bound read-only, or unbound."""


class AuthError(MtgpuError):
    """An invite code or a key cannot be accepted."""


class ApiError(MtgpuError):
    """An API request was refused. ``code`` is a short machine-readable word.

    ``retryable`` defaults to the code's membership of :data:`RETRYABLE_CODES`; an
    answer that says otherwise (``"retryable": true``) wins."""

    def __init__(self, message: str, code: str = "error", *, retryable: bool | None = None) -> None:
        self.code = code
        self._retryable = retryable
        super().__init__(message)

    @property
    def retryable(self) -> bool:
        if self._retryable is not None:
            return self._retryable
        return self.code in RETRYABLE_CODES

    @classmethod
    def from_answer(cls, answer: dict) -> ApiError:
        """The refusal in an API answer ``{"ok": false, "error", "code", "retryable"}``.

        >>> e = ApiError.from_answer({"ok": False, "error": "no scheduler", "code": "no_leader"})
        >>> e.code, e.retryable
        ('no_leader', True)
        """
        retryable = answer.get("retryable")
        return cls(
            str(answer.get("error", "request refused")),
            str(answer.get("code", "error")),
            retryable=retryable if isinstance(retryable, bool) else None,
        )


class ValidationError(ApiError, ValueError):
    """A request (or a value in it) is malformed: the caller's mistake, named.

    The only error the dispatcher answers ``bad_request``; any other exception a
    handler lets out is a server bug, answered ``internal``. It is a ``ValueError``
    too, so the value parsers (sizes, durations, counts) raise it and the
    configuration loader still catches what they raise."""

    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(message, code, retryable=False)


class GpuProbeError(MtgpuError):
    """A GPU probe failed, or a probe command printed output MTGPU cannot use."""


class JobError(MtgpuError):
    """A job file or job request is invalid or cannot be satisfied."""


class FenceError(MtgpuError):
    """A part of a tenant's fence (its private network, private /tmp, session cgroup)
    cannot be set up here: what would have run in it is refused."""

    code = "isolation"


class SetupError(MtgpuError):
    """mtgpu-setup cannot carry out what was asked."""
