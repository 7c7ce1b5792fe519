"""The sampler: host-wide numbering, failures that do not stop it, host figures, the loop."""

from __future__ import annotations

import asyncio
import logging

import psutil
import pytest

from mtgpu.config import GpuProbeSpec, Options, SimulatedGpuSpec
from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.amd import AmdProbe
from mtgpu.gpuinfo.base import GpuProbe
from mtgpu.gpuinfo.command import CommandProbe
from mtgpu.gpuinfo.intel import IntelProbe
from mtgpu.gpuinfo.nvidia import NvidiaProbe
from mtgpu.gpuinfo.sampler import Sampler, default_probes, host_usage
from mtgpu.gpuinfo.simulated import SimulatedProbe
from mtgpu.gpuinfo.types import GpuInfo

GiB = 1 << 30


class ScriptedProbe(GpuProbe):
    """A probe whose answers the test sets: a GPU count, or an exception to raise."""

    def __init__(self, brand: str, count: int = 1) -> None:
        self.brand = brand
        super().__init__(brand)
        self.count = count
        self.fail: Exception | None = None

    def probe(self) -> list[GpuInfo]:
        if self.fail is not None:
            raise self.fail
        return self._found(
            [
                GpuInfo(
                    index=i,
                    brand=self.brand,
                    type=f"{self.brand}x",
                    name="X",
                    uuid=f"{self.brand}-{i}",
                    vram_total=GiB,
                    vram_used=0,
                    util=0,
                    visibility_id=f"{self.brand}{i}",
                )
                for i in range(self.count)
            ]
        )

    def device_nodes(self, indices):
        return [f"/dev/{self.brand}{i}" for i in indices] + [f"/dev/{self.brand}ctl"]


OPTS = Options(server_name="gpu01", tenant_home_root="/")


def test_default_probes():
    assert [type(p) for p in default_probes(OPTS)] == [NvidiaProbe, AmdProbe, IntelProbe]
    spec = GpuProbeSpec(brand="huawei", command=("npu-probe",), visibility_env="ASCEND_RT_VISIBLE_DEVICES")
    probes = default_probes(Options(gpu_probes=(spec,)))
    assert isinstance(probes[-1], CommandProbe) and len(probes) == 4
    # Simulated GPUs replace the real probes, so a demo never offers real cards.
    sim = default_probes(
        Options(simulated_gpus=(SimulatedGpuSpec("rtx4090", 2, 24 * GiB),), gpu_probes=(spec,))
    )
    assert [type(p) for p in sim] == [SimulatedProbe]


def test_numbering_is_host_wide_and_sticky():
    a, b = ScriptedProbe("aa", 2), ScriptedProbe("bb", 1)
    sampler = Sampler(OPTS, probes=[a, b])
    inv = sampler.sample()
    assert [(g.index, g.uuid) for g in inv.gpus] == [(0, "aa-0"), (1, "aa-1"), (2, "bb-0")]
    assert sampler.visibility_env([2]) == {"MTGPU_VISIBLE_DEVICES": "bb0"}
    assert sampler.visibility_env([1]) == {"MTGPU_VISIBLE_DEVICES": "aa1"}
    assert sampler.device_nodes([0, 1]) == ["/dev/aa0", "/dev/aa1", "/dev/aactl"]
    # aa's driver fails for a while: bb's GPU keeps number 2.
    a.fail = GpuProbeError("driver gone")
    inv = sampler.sample()
    assert [(g.index, g.uuid) for g in inv.gpus] == [(2, "bb-0")]
    assert inv.errors == ("aa: driver gone",)
    with pytest.raises(GpuProbeError, match="no GPU 0 in its last sample"):
        sampler.visibility_env([0])
    a.fail = None
    assert [g.index for g in sampler.sample().gpus] == [0, 1, 2]


def test_errors_are_logged_once_and_sampling_goes_on(caplog):
    a, b = ScriptedProbe("aa"), ScriptedProbe("bb")
    a.fail = RuntimeError("library surprise")
    sampler = Sampler(OPTS, probes=[a, b])
    with caplog.at_level(logging.INFO, logger="mtgpu.gpuinfo"):
        for _ in range(5):
            inv = sampler.sample()
        assert [g.uuid for g in inv.gpus] == ["bb-0"]
        assert inv.errors == ("aa: RuntimeError: library surprise",)
        a.fail = GpuProbeError("another message")  # a new message is logged again
        sampler.sample()
        sampler.sample()
    failures = [r for r in caplog.records if "GPU probe aa failed" in r.getMessage()]
    assert len(failures) == 2
    assert failures[0].exc_info is not None  # a surprise gets its traceback, once


def test_unavailable_is_logged_once_at_info(caplog, tmp_path):
    sampler = Sampler(OPTS, probes=[IntelProbe(sysfs_root=str(tmp_path), xpu_smi=None)])
    with caplog.at_level(logging.INFO, logger="mtgpu.gpuinfo"):
        for _ in range(3):
            assert sampler.sample().errors == ()
    assert len([r for r in caplog.records if r.getMessage().startswith("no intel GPUs")]) == 1


def test_host_usage_is_measured():
    inv = Sampler(OPTS, probes=[]).sample()
    h = inv.host
    assert h.cpus == psutil.cpu_count()
    assert 0 < h.ram_used < h.ram_total and 0 < h.disk_free <= h.disk_total
    assert 0.0 <= h.cpu_percent <= 100.0
    assert inv.name == "gpu01" and inv.sampled_at > 0


def test_disk_of_homes_not_yet_created(tmp_path):
    h = host_usage(str(tmp_path / "home" / "not" / "yet"))
    assert h.disk_total == psutil.disk_usage(str(tmp_path)).total


def test_simulated_through_the_sampler():
    opts = Options(
        server_name="gpu01", tenant_home_root="/", simulated_gpus=(SimulatedGpuSpec("rtx4090", 2, 24 * GiB),)
    )
    sampler = Sampler(opts)
    sampler.set_declared({1: 20 * GiB})
    assert sampler.simulated is not None
    sampler.simulated.set_outside_used(0, 2 * GiB)
    inv = sampler.sample()
    assert [g.vram_used for g in inv.gpus] == [2 * GiB, 20 * GiB]
    assert sampler.visibility_env([1])["CUDA_VISIBLE_DEVICES"] == "1"
    d = inv.to_dict({1: ["42"]})
    assert d["gpus"][1]["jobs"] == ["42"] and d["gpus"][0]["jobs"] == []


def test_run_loop_keeps_latest_fresh():
    sampler = Sampler(OPTS, probes=[ScriptedProbe("aa")], clock=iter(range(1, 10**6)).__next__)

    async def main():
        task = asyncio.create_task(sampler.run(0.01))
        while sampler.latest is None or sampler.latest.sampled_at < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert sampler.latest.gpus[0].uuid == "aa-0"


def test_close_closes_every_probe():
    closed = []

    class Closing(ScriptedProbe):
        def close(self):
            closed.append(self.brand)
            raise RuntimeError("ignored")

    Sampler(OPTS, probes=[Closing("aa"), Closing("bb")]).close()
    assert closed == ["aa", "bb"]
