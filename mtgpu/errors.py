"""The one exception tree of MTGPU.

Every error that reaches a user says what was wrong and what to do about it.
Third-party errors are translated at the boundary with ``raise ... from exc``::

    MtgpuError
    ├── ConfigError          a bad configuration file or value (exit status 2)
    ├── CommandError         a subprocess failed (argv and stderr attached)
    ├── StateError           the replicated state refused or timed out
    ├── AccountError         a tenant account cannot be created or used
    │   ├── UidConflictError a local account already holds the registry's UID
    │   └── MountError       a published directory cannot be mounted read-only
    ├── AuthError            an invite or key cannot be accepted
    ├── ApiError             an API request was refused (carries a code)
    ├── GpuProbeError        a GPU probe failed or printed bad output
    ├── JobError             a job file or job request is invalid
    └── SetupError           mtgpu-setup cannot do what was asked
"""

from __future__ import annotations

from collections.abc import Sequence


class MtgpuError(Exception):
    """Root of every error MTGPU raises on purpose."""


class ConfigError(MtgpuError):
    """A configuration key is unknown, missing or has a bad value."""

    exit_status = 2

    def __init__(self, message: str, *, key: str | None = None, line: int | None = None,
                 path: str | None = None) -> None:
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

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str = "",
                 stdout: str = "") -> None:
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
    """The replicated state could not accept or answer a request."""


class AccountError(MtgpuError):
    """A tenant account cannot be created, found or used."""


class UidConflictError(AccountError):
    """A local account already holds the UID the registry assigned."""


class MountError(AccountError):
    """A dataset or interpreter cannot be bound read-only, or unbound."""


class AuthError(MtgpuError):
    """An invite code or a key cannot be accepted."""


class ApiError(MtgpuError):
    """An API request was refused. ``code`` is a short machine-readable word."""

    def __init__(self, message: str, code: str = "error") -> None:
        self.code = code
        super().__init__(message)


class GpuProbeError(MtgpuError):
    """A GPU probe failed, or a probe command printed output MTGPU cannot use."""


class JobError(MtgpuError):
    """A job file or job request is invalid or cannot be satisfied."""


class SetupError(MtgpuError):
    """mtgpu-setup cannot carry out what was asked."""
