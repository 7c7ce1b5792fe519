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
    specs = load_text(
        "SIMULATED_GPUS:\n"
        "  - {type: rtx4090, count: 2, vram: 24G}\n"
        "  - {type: mi300x, brand: amd, vram: 192G, used: 10G}\n"
    ).simulated_gpus
    return SimulatedProbe(specs, server="gpu01")


def test_indices_run_on_across_entries(probe):
    gpus = probe.probe()
    assert [(g.index, g.brand, g.type, g.vram_total) for g in gpus] == [
        (0, "nvidia", "rtx4090", 24 * GiB),
        (1, "nvidia", "rtx4090", 24 * GiB),
        (2, "amd", "mi300x", 192 * GiB),
    ]
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


# ---------------------------------------------------------------- MIG cards

MIG_CONFIG = (
    "SIMULATED_GPUS:\n"
    "  - {type: rtx4090, vram: 24G}\n"
    "  - {type: h100, vram: 80G, mig: [3g.40gb, 2g.20gb, 1g.10gb], device_dir: /dev/sim}\n"
)


def test_a_mig_card_reports_its_devices_under_it():
    probe = SimulatedProbe(load_text(MIG_CONFIG).simulated_gpus, server="gpu01")
    gpus = {g.index: g for g in probe.probe()}
    assert sorted(gpus) == [0, 1, 2 + 8, 2 + 8 + 3, 2 + 8 + 5]
    card = gpus[1]
    assert (card.mig_mode, card.parent, card.placeable) == (True, None, False)
    assert [(gpus[i].type, gpus[i].vram_total, gpus[i].parent) for i in (10, 13, 15)] == [
        ("h100-3g.40gb", 40 * GiB, 1),
        ("h100-2g.20gb", 20 * GiB, 1),
        ("h100-1g.10gb", 10 * GiB, 1),
    ]
    assert gpus[13].uuid == "MIG-SIM-gpu01-13" and gpus[13].placeable
    # CUDA gets the MIG device's UUID; MTGPU_VISIBLE_DEVICES keeps the index.
    assert probe.visibility_env([13]) == {
        "MTGPU_VISIBLE_DEVICES": "13",
        "CUDA_VISIBLE_DEVICES": "MIG-SIM-gpu01-13",
    }
    assert probe.device_nodes([13]) == ["/dev/sim/nvidia1", "/dev/sim/nvidia-caps/nvidia-cap13"]
    assert probe.visible_devices(probe.visibility_env([13])) == ["MIG-SIM-gpu01-13"]


def test_a_mig_cards_use_is_its_devices_use():
    probe = SimulatedProbe(load_text(MIG_CONFIG).simulated_gpus)
    probe.set_declared({10: 30 * GiB})
    probe.set_outside_used(15, 2 * GiB)
    gpus = {g.index: g for g in probe.probe()}
    assert (gpus[10].vram_used, gpus[15].vram_used, gpus[1].vram_used) == (30 * GiB, 2 * GiB, 32 * GiB)
    with pytest.raises(GpuProbeError, match="GPU 1 is in MIG mode; set the use of its MIG devices"):
        probe.set_outside_used(1, 0)
    with pytest.raises(GpuProbeError, match="has 5: 0, 1, 10, 13, 15"):
        probe.set_outside_used(2, 0)


@pytest.mark.parametrize(
    "entry, said",
    [
        (
            "{type: h100, vram: 80G, mig: [3g.40gb, 4g.40gb, 1g.10gb]}",
            "more than the card's 7 compute slices",
        ),
        ("{type: h100, vram: 80G, mig: [3g.40gb, 3g.50gb]}", "more than the card's vram"),
        ("{type: h100, vram: 80G, mig: [big]}", "not a MIG profile"),
        ("{type: h100, vram: 80G, mig: 3g.40gb}", "expected a list"),
        ("{type: mi300x, brand: amd, vram: 192G, mig: [1g.10gb]}", "for nvidia cards"),
        ("{type: h100, vram: 80G, used: 1G, mig: [1g.10gb]}", "a MIG card's use is its MIG devices'"),
    ],
)
def test_bad_mig_profiles_are_refused_with_the_key(entry, said):
    from mtgpu.errors import ConfigError

    with pytest.raises(ConfigError, match="SIMULATED_GPUS") as exc:
        load_text(f"SIMULATED_GPUS:\n  - {entry}\n")
    assert said in str(exc.value)
