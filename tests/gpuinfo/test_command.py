"""The command probe (GPU_PROBES) with real scripts: good, garbage, failing, slow, wrong."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from mtgpu.config import GpuProbeSpec
from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.command import SCHEMA, CommandProbe, parse_output, validate

GiB = 1 << 30

CARDS = [
    {
        "index": 0,
        "name": "Ascend 910B",
        "uuid": "NPU-7f3a-0",
        "vram_total": 64 * GiB,
        "vram_used": 3 * GiB,
        "util": 12,
        "devices": ["DEV/davinci0"],
        "processes": [{"pid": 4242, "used_memory": 3 * GiB, "uid": 1000}],
    },
    {
        "index": 1,
        "name": "Ascend 910B",
        "uuid": "NPU-7f3a-1",
        "vram_total": 64 * GiB,
        "vram_used": 0,
        "devices": ["DEV/davinci1"],
    },
]

# A well-behaved probe: it honours its visibility variable, renumbering from 0,
# as a vendor runtime does.
GOOD = """
import json, os
cards = json.loads({cards!r})
vis = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
if vis is not None:
    keep = [int(x) for x in vis.split(",") if x]
    cards = [dict(c, index=n) for n, c in enumerate(c for c in cards if c["index"] in keep)]
print(json.dumps({{"gpus": cards}}))
"""


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def spec(path: Path, **kw) -> GpuProbeSpec:
    return GpuProbeSpec(
        brand="huawei",
        command=(str(path),),
        visibility_env="ASCEND_RT_VISIBLE_DEVICES",
        devices=kw.pop("devices", ()),
        name="ascend",
        timeout=kw.pop("timeout", 10.0),
    )


@pytest.fixture
def good(tmp_path: Path) -> Path:
    cards = json.dumps(CARDS).replace("DEV", str(tmp_path))
    for n in ("davinci0", "davinci1", "davinci_manager"):
        (tmp_path / n).touch()
    return script(tmp_path, "npu-probe", GOOD.format(cards=cards))


def test_good_script(good, tmp_path):
    probe = CommandProbe(spec(good, devices=(f"{tmp_path}/davinci_manager", "/dev/nonexistent")))
    gpus = probe.probe()
    assert probe.available and probe.name == "command:ascend"
    a, b = gpus
    assert (a.brand, a.type, a.name, a.uuid) == ("huawei", "ascend910b", "Ascend 910B", "NPU-7f3a-0")
    assert (a.vram_total, a.vram_used, a.util) == (64 * GiB, 3 * GiB, 12)
    assert [(p.pid, p.uid, p.used_memory) for p in a.processes] == [(4242, 1000, 3 * GiB)]
    assert b.util == 0 and b.visibility_id == "1"
    assert probe.visibility_env([1]) == {"ASCEND_RT_VISIBLE_DEVICES": "1"}
    # The GPU's own node, then the shared ones that exist.
    assert probe.device_nodes([1]) == [f"{tmp_path}/davinci1", f"{tmp_path}/davinci_manager"]


def test_good_script_honours_visibility(good):
    probe = CommandProbe(spec(good))
    probe.probe()
    assert probe.visible_devices(probe.visibility_env([1])) == ["NPU-7f3a-1"]


def test_garbage_output(tmp_path):
    path = script(tmp_path, "garbage", "print('npu-smi 23.0.rc3 | Health OK | 910B | 65536 MB')\n")
    with pytest.raises(GpuProbeError, match=r"command:ascend: the output is not JSON .* began 'npu-smi 23"):
        CommandProbe(spec(path)).probe()


def test_non_zero_exit(tmp_path):
    path = script(
        tmp_path,
        "fails",
        "import sys\nsys.stderr.write('dcmi init failed: driver not loaded\\n')\nsys.exit(3)\n",
    )
    with pytest.raises(GpuProbeError, match="exited 3: dcmi init failed: driver not loaded; fix the command"):
        CommandProbe(spec(path)).probe()


def test_timeout(tmp_path):
    path = script(tmp_path, "slow", "import time\ntime.sleep(30)\n")
    with pytest.raises(GpuProbeError, match="timed out after 0.5s"):
        CommandProbe(spec(path, timeout=0.5)).probe()


def test_missing_command_is_not_an_error(tmp_path):
    probe = CommandProbe(spec(tmp_path / "not-there"))
    assert probe.probe() == [] and not probe.available and "does not exist" in probe.reason
    bare = CommandProbe(
        GpuProbeSpec(
            brand="acme", command=("acme-smi-nonexistent", "--json"), visibility_env="ACME_VISIBLE_DEVICES"
        )
    )
    assert bare.probe() == [] and "not found on PATH" in bare.reason


def test_schema_errors_name_the_path(tmp_path):
    bad = {
        "gpus": [
            {"index": "0", "name": "", "vram_total": "64G", "vram_used": 1, "util": 150, "colour": "red"},
            {"index": 1, "name": "X", "vram_total": 1, "vram_used": 2, "processes": [{"pid": 0}]},
            {"index": 1, "name": "Y", "vram_total": 1, "vram_used": 0, "devices": ["davinci0"]},
        ]
    }
    path = script(tmp_path, "wrong", f"print({json.dumps(json.dumps(bad))})\n")
    with pytest.raises(GpuProbeError) as err:
        CommandProbe(spec(path)).probe()
    msg = str(err.value)
    for expected in (
        "gpus[0].colour: unknown key",
        "gpus[0].index: expected a whole number (0 or more), got a string ('0')",
        "gpus[0].name: expected the model name as a string, got a string ('')",
        "gpus[0].vram_total: expected a whole number of bytes (0 or more), got a string ('64G')",
        "gpus[0].util: expected a number from 0 to 100, got a number (150)",
        "gpus[1].vram_used: 2 is more than vram_total 1",
        "gpus[1].processes[0]: expected pid (a number above 0) and used_memory (bytes)",
        "gpus[2].index: 1 is used twice",
        "gpus[2].devices: expected a list of absolute paths",
    ):
        assert expected in msg, expected


def test_validate_shapes():
    assert validate([]) == ([], ['expected an object like {"gpus": [...]}, got a list'])
    assert validate({"gpus": []}) == ([], [])
    gpus, errors = validate(
        {
            "gpus": [
                {"index": 1, "name": "B", "vram_total": 2, "vram_used": 1},
                {
                    "index": 0,
                    "name": "A",
                    "vram_total": 2,
                    "vram_used": 1,
                    "visibility_id": 7,
                    "type": "acme-a",
                },
            ]
        }
    )
    assert errors == [] and [g["name"] for g in gpus] == ["A", "B"]  # in index order
    (a, b) = parse_output(json.dumps({"gpus": [gpus[0], gpus[1]]}), "acme")
    assert (a.visibility_id, a.type, b.type, b.uuid) == ("7", "acme-a", "b", "")


def test_schema_lists_every_key_validate_accepts():
    item = SCHEMA["properties"]["gpus"]["items"]
    assert set(item["required"]) <= set(item["properties"])
    assert item["additionalProperties"] is False
