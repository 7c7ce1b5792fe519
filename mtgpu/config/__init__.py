"""The configuration file, validated once at load into one typed :class:`Options`.

``load(path)`` reads ``/etc/mtgpu/mtgpu.yaml`` (or ``$MTGPU_CONFIG``, or an explicit
path), checks every key, and raises :class:`~mtgpu.errors.ConfigError` naming the key,
the line and what is expected. MTGPU never falls back to a default when a given value
is bad.
"""

from __future__ import annotations

import os

from mtgpu.config.options import (
    DEFAULT_CONFIG_PATH,
    ContainersOptions,
    GpuProbeSpec,
    InterpreterSpec,
    Options,
    SimulatedGpuSpec,
    load,
    load_text,
    show,
)
from mtgpu.config.units import format_size, parse_duration, parse_size


def config_path(explicit: str | None = None) -> str:
    """The configuration path: ``explicit``, else ``$MTGPU_CONFIG``, else the default."""
    return explicit or os.environ.get("MTGPU_CONFIG") or DEFAULT_CONFIG_PATH


__all__ = [
    "DEFAULT_CONFIG_PATH",
    "ContainersOptions",
    "GpuProbeSpec",
    "InterpreterSpec",
    "Options",
    "SimulatedGpuSpec",
    "config_path",
    "format_size",
    "load",
    "load_text",
    "show",
    "parse_duration",
    "parse_size",
]
