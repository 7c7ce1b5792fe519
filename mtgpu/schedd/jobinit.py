"""The job-start helper (``jobinit.c``): built once per source, used by supervisors.

A supervisor that forks its job copies its own page tables, and every page that
either side then touches: on a small host that is a few milliseconds of CPU per job,
the largest single cost of starting one. With the helper, the supervisor starts the
job with ``posix_spawn`` (a vfork) and the helper, a small C program, does the
child's set-up before exec'ing the script. ``mtgpu-setup install`` builds it with the
host's C compiler into the root-only ``STATE_DIR/jobs``, keyed by a hash of the
source, and the daemon checks it is there when it starts (building it if an upgrade
changed the source); without a compiler, supervisors fork as before.

The helper runs as root until it becomes the tenant, so it is started with an empty
environment and refuses ``LD_*``/``PYTHON*`` variables in its own; the job's
environment reaches it through a file descriptor and only the exec'd job gets it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from pathlib import Path

from mtgpu.errors import CommandError
from mtgpu.proc import run

log = logging.getLogger("mtgpu.schedd.jobinit")

SOURCE = Path(__file__).resolve().parent / "jobinit.c"
_lock = threading.Lock()
_built: dict[str, str | None] = {}


def helper(state_dir: Path) -> str | None:
    """The helper's path, building it into ``state_dir`` if needed; None if it cannot be."""
    key = str(state_dir)
    with _lock:
        if key in _built:
            return _built[key]
        _built[key] = path = _build(state_dir)
        return path


def _build(state_dir: Path) -> str | None:
    try:
        source = SOURCE.read_bytes()
    except OSError:
        return None
    cc = shutil.which("cc") or shutil.which("gcc")
    target = state_dir / f".jobinit-{hashlib.sha256(source).hexdigest()[:16]}"
    if os.access(target, os.X_OK):
        return str(target)
    if cc is None:
        log.info("no C compiler: job supervisors fork their jobs (slower starts)")
        return None
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        run([cc, "-O2", "-o", str(tmp), str(SOURCE)], timeout=120)
        os.chmod(tmp, 0o700)
        os.rename(tmp, target)
    except (CommandError, OSError) as exc:
        log.warning("cannot build the job-start helper (%s); supervisors fork their jobs", exc)
        tmp.unlink(missing_ok=True)
        return None
    log.info("built the job-start helper %s", target)
    return str(target)
