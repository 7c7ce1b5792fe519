"""gpu-check: each probe is run, then a real one-device job proves its visibility variable."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

from mtgpu.config import GpuProbeSpec, Options, SimulatedGpuSpec
from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.check import FAILED, NOT_CHECKED, OK, all_probes, check_probe, format_check, gpu_check
from mtgpu.gpuinfo.command import CommandProbe
from mtgpu.gpuinfo.intel import IntelProbe
from mtgpu.gpuinfo.simulated import SimulatedProbe

GiB = 1 << 30
CARDS = [
    {"index": i, "name": "Acme X1", "uuid": f"ACME-{i}", "vram_total": 16 * GiB, "vram_used": 0}
    for i in range(2)
]


def probe_script(tmp_path: Path, name: str, honour: bool = True, body: str | None = None) -> Path:
    if body is None:
        filt = (
            (
                "vis = os.environ.get('ACME_VISIBLE_DEVICES')\n"
                "if vis is not None:\n"
                "    cards = [c for c in cards if str(c['index']) in vis.split(',')]\n"
            )
            if honour
            else ""
        )
        body = f"import json, os\ncards = {json.dumps(CARDS)!s}\n{filt}print(json.dumps({{'gpus': cards}}))\n"
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def spec(path: Path, name: str) -> GpuProbeSpec:
    return GpuProbeSpec(brand="acme", command=(str(path),), visibility_env="ACME_VISIBLE_DEVICES", name=name)


def test_a_probe_that_confines_jobs(tmp_path):
    r = check_probe(CommandProbe(spec(probe_script(tmp_path, "good"), "good")))
    assert r.ok and r.visibility == OK and len(r.gpus) == 2
    assert r.detail == "a job with ACME_VISIBLE_DEVICES=0 saw only ACME-0"


def test_a_probe_that_leaks(tmp_path):
    r = check_probe(CommandProbe(spec(probe_script(tmp_path, "leaky", honour=False), "leaky")))
    assert not r.ok and r.visibility == FAILED
    assert "saw 2 devices (ACME-0, ACME-1); expected only ACME-0" in r.detail


def test_a_probe_printing_garbage(tmp_path):
    r = check_probe(CommandProbe(spec(probe_script(tmp_path, "junk", body="print('hello')\n"), "junk")))
    assert not r.ok and r.visibility == NOT_CHECKED and "not JSON" in r.errors[0]


def test_absent_hardware_is_fine(tmp_path):
    r = check_probe(IntelProbe(sysfs_root=str(tmp_path), xpu_smi=None))
    assert r.ok and not r.available and r.visibility == NOT_CHECKED and r.reason


def test_check_job_that_cannot_run(tmp_path):
    class NoRuntime(SimulatedProbe):
        def visible_devices(self, env):
            raise GpuProbeError("libze_loader.so.1 cannot be loaded")

    r = check_probe(NoRuntime([SimulatedGpuSpec("x1", 1, GiB)]))
    assert r.ok and r.visibility == NOT_CHECKED and "libze_loader" in r.detail


def test_gpu_check_covers_every_probe_and_reports(tmp_path):
    opts = Options(
        server_name="gpu01",
        gpu_probes=(
            spec(probe_script(tmp_path, "good"), "good"),
            spec(probe_script(tmp_path, "leaky", honour=False), "leaky"),
        ),
        simulated_gpus=(SimulatedGpuSpec("rtx4090", 2, 24 * GiB),),
    )
    assert [p.name for p in all_probes(opts)] == [
        "nvidia",
        "amd",
        "intel",
        "command:good",
        "command:leaky",
        "simulated",
    ]
    probes = [p for p in all_probes(opts) if p.name != "intel"] + [
        IntelProbe(sysfs_root=str(tmp_path), xpu_smi=None)
    ]  # this host's /sys is not ours to assume
    results = {r.probe: r for r in gpu_check(opts, probes)}
    assert results["simulated"].visibility == OK
    assert results["command:good"].ok and not results["command:leaky"].ok
    text = format_check(list(results.values()))
    assert "command:good     ok" in text
    assert "command:leaky    LEAKS" in text
    assert "GPU 0: x1 (Acme X1), VRAM 0/16G, util 0%" in text
    assert "intel            absent" in text
    assert text.splitlines()[-1] == "problems: command:leaky"


def test_a_host_whose_only_card_is_in_mig_mode_is_checked_on_a_mig_device():
    probe = SimulatedProbe(
        [SimulatedGpuSpec(type="h100", count=1, vram=80 * GiB, mig=("3g.40gb", "3g.40gb"))], server="gpu01"
    )
    r = check_probe(probe)
    assert r.visibility == OK, r.detail
    # The card itself is never what a job gets: the check ran on its first MIG device.
    assert "MTGPU_VISIBLE_DEVICES=1 " in r.detail and "MIG-SIM-gpu01-1" in r.detail
    assert "MIG device of GPU 0" in format_check([r])
