"""MTGPU: a multi-tenant GPU cluster from existing Linux hosts, reached over SSH."""

from __future__ import annotations

import warnings

__version__ = "0.1.0"


def _quiet_crypto_deprecations() -> None:
    """Hide the CryptographyDeprecationWarning lines (DSA and others) that asyncssh
    triggers on import with a newer cryptography: every MTGPU program starts here,
    and they are about asyncssh's code, not anything a user or admin can act on."""
    try:
        from cryptography.utils import CryptographyDeprecationWarning
    except ImportError:  # pragma: no cover - cryptography comes with asyncssh
        return
    warnings.filterwarnings(
        "ignore", category=CryptographyDeprecationWarning, module=r"(asyncssh|cryptography)(\.|$)"
    )


_quiet_crypto_deprecations()


def _keep_inet_ntop() -> None:
    """PySyncObj 0.3.17 (pinned) loads ``pysyncobj/win_inet_pton.py`` with its TCP
    transport, and that module puts a Windows-only ``inet_ntop`` into ``socket`` on
    every platform: every later ``socket.inet_ntop`` in the process (psutil's
    connection lists, asyncssh's X11 code) then fails. It is for Windows alone:
    elsewhere an empty module stands in for it, so ``socket`` is left as it is."""
    import os
    import sys
    import types

    if os.name != "nt":
        sys.modules.setdefault("pysyncobj.win_inet_pton", types.ModuleType("pysyncobj.win_inet_pton"))


_keep_inet_ntop()

#: The layout of STATE_DIR. A release that changes it so that older releases can no
#: longer read it raises this; `mtgpu-setup install` refuses to put an older
#: release over state written in a newer format.
#: 2: every job record holds ``requeues``, ``held``, ``numeric_id`` and
#: ``placed_time``, and the job table's dump names its format (mtgpu.state.codec,
#: which converts format 1 at start).
STATE_FORMAT = 2
