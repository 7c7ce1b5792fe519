"""The one subprocess helper: every external command MTGPU starts goes through here.

Each takes an argv list (never a shell string) and logs it quoted:

- :func:`run` and, on the event loop, :func:`arun`: run to completion with the output
  captured; they raise :class:`~mtgpu.errors.CommandError` carrying argv and stderr when
  the command cannot start, times out or (with ``check``) exits non-zero;
- :func:`call`: an interactive command on the caller's terminal, its exit status back;
- :func:`spawn` and, on the event loop, :func:`aspawn`: a process the caller streams
  to or from and waits for itself (``Popen`` / ``create_subprocess_exec`` keywords);
  these three raise what the standard library raises (``OSError``), unchanged.

``tests/test_layers.py`` checks that no other module starts a process itself.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from mtgpu.errors import CommandError

if TYPE_CHECKING:  # asyncio is imported when used: the tenant tools start faster without
    import asyncio

log = logging.getLogger("mtgpu.proc")


def run(
    argv: Sequence[str],
    *,
    input: bytes | str | None = None,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 120,
    user: int | None = None,
    group: int | None = None,
    extra_groups: Sequence[int] | None = None,
    cwd: str | None = None,
    stdin: IO[Any] | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` and return the completed process with text output. ``stdin``
    (instead of ``input``) is an open file the command reads; ``timeout=None`` waits
    as long as it takes (package installs).

    >>> run(["echo", "hi"]).stdout
    'hi\\n'
    >>> run(["false"], check=False).returncode
    1
    """
    argv = _argv(argv)
    if isinstance(input, bytes):
        input = input.decode()
    kwargs = _identity(user, group, extra_groups)
    if stdin is not None:
        kwargs["stdin"] = stdin
    if pass_fds:
        kwargs["pass_fds"] = tuple(pass_fds)
    try:
        proc = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            env=dict(env) if env is not None else None,
            timeout=timeout,
            cwd=cwd,
            **kwargs,
        )
    except FileNotFoundError as exc:
        raise CommandError(argv, None, f"{argv[0]}: not found; install it or fix PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise CommandError(argv, None, f"timed out after {timeout}s") from exc
    except OSError as exc:
        raise CommandError(argv, None, str(exc)) from exc
    if check and proc.returncode != 0:
        raise CommandError(argv, proc.returncode, proc.stderr, proc.stdout)
    return proc


async def arun(
    argv: Sequence[str],
    *,
    input: bytes | None = None,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 120,
    user: int | None = None,
    group: int | None = None,
    extra_groups: Sequence[int] | None = None,
    cwd: str | None = None,
    stderr: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """:func:`run` for the event loop, with bytes output; a command past ``timeout``
    is killed (it is our child: its PID cannot have been reused before we reap it).
    ``stderr=False`` discards the command's error output.

    >>> import asyncio
    >>> asyncio.run(arun(["printf", "hi"])).stdout
    b'hi'
    """
    import asyncio

    argv = _argv(argv)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE if stderr else asyncio.subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            **_identity(user, group, extra_groups),
        )
    except FileNotFoundError as exc:
        raise CommandError(argv, None, f"{argv[0]}: not found; install it or fix PATH") from exc
    except OSError as exc:
        raise CommandError(argv, None, str(exc)) from exc
    try:
        out, err = await asyncio.wait_for(proc.communicate(input), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise CommandError(argv, None, f"timed out after {timeout}s") from None
    except BaseException:  # cancelled: the command must not outlive its caller
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    rc = proc.returncode if proc.returncode is not None else -1
    err = err or b""
    if check and rc != 0:
        raise CommandError(argv, rc, err.decode(errors="replace"), out.decode(errors="replace"))
    return subprocess.CompletedProcess(argv, rc, out, err)


def call(argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdout: IO[Any] | None = None) -> int:
    """Run an interactive command on the caller's terminal (``ssh`` from
    remotegpu-cli, ``python -m venv`` printing its progress) and return its exit
    status. ``stdout`` sends its output elsewhere (a JSON answer keeps stdout clean).

    >>> call(["true"])
    0
    """
    argv = _argv(argv)
    return subprocess.call(argv, env=dict(env) if env is not None else None, stdout=stdout)


def spawn(argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start a process the caller streams to or from and waits for itself (srun's
    tasks, the ssh channel of an admin client, the daemon started in the background):
    ``Popen``'s keywords.

    >>> p = spawn(["true"]); p.wait()
    0
    """
    return subprocess.Popen(_argv(argv), **popen)


async def aspawn(argv: Sequence[str], **kwargs: Any) -> asyncio.subprocess.Process:
    """:func:`spawn` for the event loop (a tenant's session processes, a streamed
    image): ``asyncio.create_subprocess_exec``'s keywords."""
    import asyncio

    return await asyncio.create_subprocess_exec(*_argv(argv), **kwargs)


def posix_spawn(path: str, argv: Sequence[str], env: Mapping[str, str], **kwargs: Any) -> int:
    """``os.posix_spawn``: how a job's supervisor starts its start helper (no fork of a
    threaded process, the environment given whole); returns the PID."""
    return os.posix_spawn(path, _argv(argv), env, **kwargs)


def _argv(argv: Sequence[str]) -> list[str]:
    out = [os.fspath(a) for a in argv]
    log.debug("run: %s", shlex.join(out))
    return out


def _identity(user: int | None, group: int | None, extra_groups: Sequence[int] | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if user is not None:
        kwargs["user"] = user
    if group is not None:
        kwargs["group"] = group
    if extra_groups is not None:
        kwargs["extra_groups"] = list(extra_groups)
    return kwargs


#: The environment root's Python children start with: nothing of the caller's.
ROOT_CHILD_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def python_argv(python: str, module: str, *args: str) -> list[str]:
    """The argv that runs ``module`` as ``python -m`` would, isolated.

    ``-I``: neither the current directory nor ``PYTHON*`` variables nor the user's
    site directory are looked at, so nothing a tenant (or the admin's current
    directory) holds is imported. MTGPU is imported from where this code is
    installed, which root owns. Run it with ``cwd="/"`` and :data:`ROOT_CHILD_ENV`.

    >>> python_argv("/usr/bin/python3", "mtgpu.x", "a")[:2]
    ['/usr/bin/python3', '-I']
    """
    import mtgpu

    root = os.path.dirname(os.path.dirname(os.path.realpath(mtgpu.__file__)))
    code = (
        f"import runpy, sys; sys.path.insert(0, {root!r}); "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )
    return [python, "-I", "-c", code, *args]
