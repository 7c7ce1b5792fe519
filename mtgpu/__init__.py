"""MTGPU: a multi-tenant GPU cluster from existing Linux hosts, reached over SSH."""

from __future__ import annotations

__version__ = "0.1.0"

#: The layout of STATE_DIR. A release that changes it so that older releases can no
#: longer read it raises this; `mtgpu-setup install` refuses to put an older
#: release over state written in a newer format.
#: 2: every job record holds ``requeues``, ``held``, ``numeric_id`` and
#: ``placed_time``, and the job table's dump names its format (mtgpu.state.codec,
#: which converts format 1 at start).
STATE_FORMAT = 2
