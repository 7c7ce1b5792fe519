"""Simulated GPUs: numbering, measured use, admin changes, visibility."""

from __future__ import annotations

import threading

import pytest

from mtgpu.config import SimulatedGpuSpec, load_text
from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.simulated import SimulatedProbe

GiB = 1 << 30


@pytest.fixture
def probe() -> SimulatedProbe:
    specs = load_text("SIMULATED_GPUS:\n"
                      "  - {type: rtx4090, count: 2, vram: 24G}\n"
                      "  - {type: mi300x, brand: amd, vram: 192G, used: 10G}\n").simulated_gpus
    return SimulatedProbe(specs, server="gpu01")


def test_indices_run_on_across_entries(probe):
    gpus = probe.probe()
    assert [(g.index, g.brand, g.type, g.vram_total) for g in gpus] == [
        (0, "nvidia", "rtx4090", 24 * GiB), (1, "nvidia", "rtx4090", 24 * GiB),
        (2, "amd", "mi300x", 192 * GiB)]
    assert [g.uuid for g in gpus] == ["SIM-gpu01-0", "SIM-gpu01-1", "SIM-gpu01-2"]
    assert [g.visibility_id for g in gpus] == ["0", "1", "2"]
    assert gpus[2].vram_used == 10 * GiB  # the configured outside use
    assert gpus[0].name == "Simulated rtx4090" and gpus[0].processes == () and gpus[0].mig_mode is None


def test_measured_use_is_outside_plus_declared_capped(probe):
    probe.set_declared({0: 20 * GiB, 2: 100 * GiB})
    probe.set_outside_used(0, 8 * GiB)
    g0, g1, g2 = probe.probe()
    assert g0.vram_used == 24 * GiB  # 28G capped at the card's 24G
    assert g0.util == 83  # the declared share of VRAM
    assert (g1.vram_used, g1.util) == (0, 0)
    assert g2.vram_used == 110 * GiB
    probe.set_declared({})  # jobs finished: declared use goes back to 0
    assert [g.vram_used for g in probe.probe()] == [8 * GiB, 0, 10 * GiB]
    assert probe.outside_used(0) == 8 * GiB


def test_bad_admin_input_is_refused(probe):
    with pytest.raises(GpuProbeError, match="no simulated GPU 3; this host has 3 \\(0-2\\)"):
        probe.set_outside_used(3, 0)
    with pytest.raises(GpuProbeError, match="must be between 0 and that"):
        probe.set_outside_used(0, 25 * GiB)
    with pytest.raises(GpuProbeError):
        probe.set_declared({7: 1})
    with pytest.raises(GpuProbeError, match="set SIMULATED_GPUS"):
        SimulatedProbe([]).set_outside_used(0, 0)


def test_visibility_uses_the_brands_variables(probe):
    probe.probe()
    assert probe.visibility_env([1]) == {"MTGPU_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "1"}
    env = probe.visibility_env([2])
    assert env["ROCR_VISIBLE_DEVICES"] == "2" and env["MTGPU_VISIBLE_DEVICES"] == "2"
    assert probe.device_nodes([0]) == []


def test_visible_devices_runs_a_real_job(probe):
    probe.probe()
    assert probe.visible_devices(probe.visibility_env([1])) == ["SIM-gpu01-1"]


def test_changes_from_another_thread(probe):
    # The daemon's loop sets use while the sampler thread reads it.
    def writer():
        for n in range(200):
            probe.set_outside_used(1, n * (1 << 20))
    t = threading.Thread(target=writer)
    t.start()
    for _ in range(200):
        assert 0 <= probe.probe()[1].vram_used <= 24 * GiB
    t.join()
    assert probe.outside_used(1) == 199 * (1 << 20)


def test_spec_defaults():
    g = SimulatedProbe([SimulatedGpuSpec(type="h100", count=1, vram=80 * GiB)]).probe()[0]
    assert (g.brand, g.uuid, g.vram_used) == ("nvidia", "SIM-localhost-0", 0)
