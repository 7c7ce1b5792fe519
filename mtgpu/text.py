"""Text a tenant chose, made safe to show on someone's terminal.

Shared by the commands (``mtgpu.cli``) and the laptop client (``mtgpu.tui``), so it
imports nothing but the standard library.
"""

from __future__ import annotations

import re

#: C0 and C1 controls but newline and tab, DEL, and bidirectional overrides/isolates.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    r"""``text`` with control characters (but newlines and tabs), and the characters that
    reorder text on a terminal, shown as escapes: a job name, reason or user name a
    tenant chose cannot move an admin's cursor, retitle the terminal or hide a line.

    >>> printable("train\x1b]0;pwned\x07\rjob\n")
    'train\\x1b]0;pwned\\x07\\rjob\n'
    """
    return _UNPRINTABLE.sub(_escape, text)


def one_line(text: str) -> str:
    r"""``text`` as :func:`printable` shows it, newlines and tabs escaped too: for a
    log line or a one-line answer that a tenant's text must not split.

    >>> one_line("bad\nline\x1b[2K")
    'bad\\nline\\x1b[2K'
    """
    return printable(text).replace("\n", "\\n").replace("\t", "\\t")


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return {"\r": "\\r", "\b": "\\b"}.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that orders the numbers in ``text`` as numbers: job ``113_2`` before
    ``113_10``.

    >>> sorted(["113_10", "113_2", "9"], key=natural_key)
    ['9', '113_2', '113_10']
    """
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in _DIGITS.split(str(text)) if p)
