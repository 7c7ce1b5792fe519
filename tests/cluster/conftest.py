"""Fixtures of the cluster tests (see ``cluster_harness``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_harness import cluster  # noqa: E402

__all__ = ["cluster"]
