"""The one-device check jobs run for real; where the runtime is missing they say so."""

from __future__ import annotations

import ctypes.util
import doctest
import importlib

import pytest

from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.amd import AmdProbe
from mtgpu.gpuinfo.intel import IntelProbe
from mtgpu.gpuinfo.nvidia import NvidiaProbe


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="this host has libcuda")
def test_cuda_job_without_a_driver():
    with pytest.raises(GpuProbeError, match="libcuda.so.1 cannot be loaded"):
        NvidiaProbe().visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-x"})


@pytest.mark.skipif(ctypes.util.find_library("amdhip64") is not None, reason="this host has HIP")
def test_hip_job_without_rocm():
    with pytest.raises(GpuProbeError, match="libamdhip64 cannot be loaded"):
        AmdProbe().visible_devices({"ROCR_VISIBLE_DEVICES": "0"})


@pytest.mark.skipif(ctypes.util.find_library("ze_loader") is not None, reason="this host has Level Zero")
def test_level_zero_job_without_a_loader():
    with pytest.raises(GpuProbeError, match="libze_loader.so.1 cannot be loaded"):
        IntelProbe().visible_devices({"ZE_AFFINITY_MASK": "0"})


@pytest.mark.parametrize("name", ["names", "command", "drmclients", "report"])
def test_doctests(name):
    module = importlib.import_module(f"mtgpu.gpuinfo.{name}")
    failed, tried = doctest.testmod(module)
    assert tried > 0 and failed == 0
