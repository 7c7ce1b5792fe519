"""MTGPU: a multi-tenant GPU cluster from existing Linux hosts, reached over SSH."""

from __future__ import annotations

__version__ = "0.1.0"
