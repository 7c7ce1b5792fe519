"""Node inventory: which GPUs a host has, and how busy it and they are.

The daemon creates one :class:`Sampler` and runs ``await sampler.run()``; the
scheduler reads ``sampler.latest`` (a :class:`NodeInventory`). The job agent
asks ``sampler.visibility_env(indices)`` and ``sampler.device_nodes(indices)``.
``mtgpu-setup gpu-check`` calls :func:`gpu_check` and prints
:func:`format_check`; the ``nodes`` commands print :func:`format_nodes_table`.

Modules: ``types`` (data), ``names`` (type names), ``base`` (probe contract),
``nvidia``/``amd``/``intel``/``command``/``simulated`` (probes), ``drmclients``
(fdinfo reading), ``sampler``, ``check``, ``report``.
"""

from __future__ import annotations

from mtgpu.gpuinfo.base import GpuProbe
from mtgpu.gpuinfo.check import CheckResult, format_check, gpu_check
from mtgpu.gpuinfo.names import normalize_type
from mtgpu.gpuinfo.report import format_nodes_table
from mtgpu.gpuinfo.sampler import Sampler, default_probes
from mtgpu.gpuinfo.simulated import SimulatedProbe
from mtgpu.gpuinfo.types import GpuInfo, GpuProcess, HostUsage, NodeInventory

__all__ = [
    "CheckResult",
    "GpuInfo",
    "GpuProbe",
    "GpuProcess",
    "HostUsage",
    "NodeInventory",
    "Sampler",
    "SimulatedProbe",
    "default_probes",
    "format_check",
    "format_nodes_table",
    "gpu_check",
    "normalize_type",
]
