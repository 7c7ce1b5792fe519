"""What the daemon could not start with is refused by ``--check`` too, through the same
validation: a NUL byte in any string (paths, names, commands) and more simulated GPUs
than a host can make. Each is a one-line error naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtgpu.config import load_text
from mtgpu.config.options import MAX_SIMULATED_GPUS
from mtgpu.errors import ConfigError
from mtgpu.install import setup
from mtgpu.server import main as server_main


def _refused(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        load_text(text, "/etc/mtgpu/mtgpu.yaml")
    msg = str(exc.value)
    assert "\n" not in msg and len(msg) < 300, msg
    return msg


@pytest.mark.parametrize(
    "text, line, key",
    [
        ('STATE_DIR: "/var/lib/mt\\0gpu"\n', 1, "STATE_DIR"),
        ('SERVER_NAME: gpu\nRUN_DIR: "/run/\\0"\n', 2, "RUN_DIR"),
        ('TENANT_HOME_ROOT: "/home\\0/x"\n', 1, "TENANT_HOME_ROOT"),
        (
            'SIMULATED_GPUS:\n  - {type: a, vram: 1G, device_dir: "/dev/\\0x"}\n',
            2,
            "SIMULATED_GPUS[0].device_dir",
        ),
        (
            'SIMULATED_GPUS:\n  - {type: a, vram: 1G}\n  - {type: "b\\0", vram: 1G}\n',
            3,
            "SIMULATED_GPUS[1].type",
        ),
    ],
)
def test_a_nul_byte_is_refused_naming_the_key(text: str, line: int, key: str) -> None:
    msg = _refused(text)
    assert msg.startswith(f"/etc/mtgpu/mtgpu.yaml:{line}: {key}: "), msg
    assert "NUL byte" in msg, msg


def test_a_nul_byte_in_a_mapping_key_is_refused() -> None:
    msg = _refused('CONTAINERS:\n  "temp\\0lates": {}\n')
    assert ": CONTAINERS: " in msg and "NUL byte" in msg, msg


@pytest.mark.parametrize("count", [MAX_SIMULATED_GPUS + 1, 1_000_000_000])
def test_too_many_simulated_gpus_in_one_entry_is_refused_with_the_bound(count: int) -> None:
    msg = _refused(f"SIMULATED_GPUS:\n  - {{type: a100, count: {count}, vram: 80G}}\n")
    assert msg.startswith("/etc/mtgpu/mtgpu.yaml:2: SIMULATED_GPUS[0].count: "), msg
    assert str(MAX_SIMULATED_GPUS) in msg, msg


def test_too_many_simulated_gpus_in_all_is_refused_with_the_bound() -> None:
    half = MAX_SIMULATED_GPUS // 2 + 1
    msg = _refused(
        f"SIMULATED_GPUS:\n  - {{type: a, count: {half}, vram: 1G}}\n  - {{type: b, count: {half}, vram: 1G}}\n"
    )
    assert msg.startswith("/etc/mtgpu/mtgpu.yaml:1: SIMULATED_GPUS: "), msg
    assert f"{2 * half}" in msg and str(MAX_SIMULATED_GPUS) in msg, msg


def test_the_bound_itself_loads() -> None:
    o = load_text(f"SIMULATED_GPUS:\n  - {{type: a, count: {MAX_SIMULATED_GPUS}, vram: 1G}}\n", "c.yaml")
    assert sum(g.count for g in o.simulated_gpus) == MAX_SIMULATED_GPUS


@pytest.mark.parametrize(
    "text, key",
    [
        ('STATE_DIR: "/var/lib/\\0"\n', "STATE_DIR"),
        ("SIMULATED_GPUS:\n  - {type: a, count: 1000000000, vram: 1G}\n", "SIMULATED_GPUS[0].count"),
    ],
)
def test_both_checks_refuse_what_the_daemon_cannot_start_with(
    tmp_path: Path, capsys: pytest.CaptureFixture, text: str, key: str
) -> None:
    cfg = tmp_path / "site.yaml"
    cfg.write_text(text)
    assert server_main(["--config", str(cfg), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mtgpu-server: {cfg}:") and f": {key}: " in err and err.count("\n") == 1, err
    assert setup.main(["check", "--config", str(cfg)]) != 0
    said = "".join(capsys.readouterr())
    assert f": {key}: " in said and ": OK" not in said and "Traceback" not in said, said
