"""Where the daemon's log goes, and in what shape.

- **Under systemd**, standard error is the journal (systemd says so in
  ``JOURNAL_STREAM``, the device and inode of that stream). journald stamps each line
  with its own time and reads a syslog priority prefix (``<3>`` for an error), so the
  lines carry that prefix and no time of their own: ``journalctl -p warning`` then
  shows the warnings and errors.
- **Elsewhere** (``mtgpu-setup start``, a terminal), each line starts with its time
  and level. With ``--log-file`` the daemon writes the file itself and rotates it:
  at ``LOG_MAX_SIZE`` the file becomes ``FILE.1`` (``FILE.1`` becomes ``FILE.2``...,
  ``LOG_KEEP`` of them are kept) and a new file is started. Its standard output and
  error are pointed at the new file too, so what Python itself prints there (a crash)
  lands in the current file.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from typing import TextIO

#: syslog priorities (sd-daemon(3)) of Python's levels.
PRIORITIES = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def priority(levelno: int) -> int:
    """The syslog priority of a Python level (between levels, the more urgent one).

    >>> priority(logging.ERROR), priority(logging.INFO), priority(25)
    (3, 6, 4)
    """
    for level in sorted(PRIORITIES, reverse=False):
        if levelno <= level:
            return PRIORITIES[level]
    return 2


class JournalFormatter(logging.Formatter):
    """``<PRIORITY>logger: message``: journald adds the time, host and unit.

    >>> rec = logging.LogRecord("mtgpu.sshd", logging.WARNING, "", 0, "refused %s", ("ann",), None)
    >>> JournalFormatter().format(rec)
    '<4>mtgpu.sshd: refused ann'
    """

    def __init__(self) -> None:
        super().__init__("%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        prefix = f"<{priority(record.levelno)}>"
        # journald reads each line as an entry: a traceback's lines keep the priority.
        return "\n".join(prefix + line for line in text.split("\n"))


def on_journal(stream: TextIO, environ: dict[str, str] | None = None) -> bool:
    """True if ``stream`` is the journal stream systemd named in ``JOURNAL_STREAM``
    (``DEVICE:INODE``): a stream redirected elsewhere by hand is not."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


def open_log(path: str) -> int:
    """``path`` for appending, root's alone (0600: it names tenants, addresses and
    keys). A link there is refused; an existing file is made 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file; move it away")
    if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
        os.fchown(fd, 0, 0)
    os.fchmod(fd, 0o600)
    return fd


class RotatingLog(logging.Handler):
    """Write to ``path``; past ``max_size`` bytes, shift ``path`` to ``path.1`` (and each
    ``path.N`` to ``path.N+1``, dropping those past ``keep``) and start a new file.

    With ``own_stdio``, standard output and error follow the current file.
    """

    def __init__(self, path: str, max_size: int, keep: int, *, own_stdio: bool = False) -> None:
        super().__init__()
        self.path = path
        self.max_size = max_size
        self.keep = keep
        self.own_stdio = own_stdio
        self.fd = -1
        self._open()

    def _open(self) -> None:
        fd = open_log(self.path)
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = fd
        if self.own_stdio:
            for std in (1, 2):
                os.dup2(fd, std)

    def rotate(self) -> None:
        """Shift the files by one and start a new one."""
        for n in range(self.keep, 0, -1):
            src = self.path if n == 1 else f"{self.path}.{n - 1}"
            try:
                os.replace(src, f"{self.path}.{n}")
            except FileNotFoundError:
                pass
        if self.keep == 0:
            os.unlink(self.path)
        self._open()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "replace")
            if os.fstat(self.fd).st_size + len(data) > self.max_size and os.fstat(self.fd).st_size:
                self.rotate()
            os.write(self.fd, data)
        except Exception:  # noqa: BLE001 - logging never takes the daemon down
            self.handleError(record)

    def close(self) -> None:
        if self.fd >= 0 and not self.own_stdio:
            os.close(self.fd)
            self.fd = -1
        super().close()


def setup(
    level: str, *, log_file: str | None = None, max_size: int = 64 << 20, keep: int = 5
) -> logging.Handler:
    """Send the root logger's lines to the journal, a rotated file or standard error."""
    handler: logging.Handler
    if log_file:
        handler = RotatingLog(log_file, max_size, keep, own_stdio=True)
        handler.setFormatter(logging.Formatter(PLAIN_FORMAT))
    elif on_journal(sys.stderr):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JournalFormatter())
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(PLAIN_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    return handler


def resize(max_size: int, keep: int) -> None:
    """Apply new ``LOG_MAX_SIZE`` and ``LOG_KEEP`` (a reload) to the rotated file, if any."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, RotatingLog):
            handler.max_size, handler.keep = max_size, keep
