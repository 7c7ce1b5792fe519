"""MTGPU: a multi-tenant GPU cluster from existing Linux hosts, reached over SSH."""

from __future__ import annotations

__version__ = "0.1.0"

#: The layout of STATE_DIR. A release that changes it so that older releases can no
#: longer read it raises this; `mtgpu-setup install` refuses to put an older
#: release over state written in a newer format.
STATE_FORMAT = 1
