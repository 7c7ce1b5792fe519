"""The one subprocess helper: every external command goes through :func:`run`.

It takes an argv list (never a shell string), logs it quoted, and raises
:class:`~mtgpu.errors.CommandError` carrying argv and stderr on failure.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence

from mtgpu.errors import CommandError

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
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` and return the completed process with text output.

    >>> run(["echo", "hi"]).stdout
    'hi\\n'
    """
    argv = [os.fspath(a) for a in argv]
    log.debug("run: %s", shlex.join(argv))
    if isinstance(input, bytes):
        input = input.decode()
    kwargs: dict = {}
    if user is not None:
        kwargs["user"] = user
    if group is not None:
        kwargs["group"] = group
    if extra_groups is not None:
        kwargs["extra_groups"] = list(extra_groups)
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
