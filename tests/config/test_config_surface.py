"""What an administrator meets editing the configuration: a byte that is not UTF-8,
a misspelt key, durations with units, and ``--check --show``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mtgpu.config import Options, load, load_text, show
from mtgpu.config.options import _KEYS, DURATION_KEYS, RELOAD
from mtgpu.errors import ConfigError
from mtgpu.install import setup
from mtgpu.server import main as server_main


def test_a_byte_that_is_not_utf8_is_refused_with_its_line(tmp_path: Path) -> None:
    cfg = tmp_path / "site.yaml"
    cfg.write_bytes(b"ADMINS: [ann]\n# caf\xe9 au lait\nLOG_LEVEL: INFO\n")
    with pytest.raises(ConfigError) as info:
        load(str(cfg))
    assert info.value.line == 2
    assert str(info.value) == (f"{cfg}:2: the byte 0xe9 at column 6 is not UTF-8; save the file as UTF-8")


def test_the_daemon_check_says_so_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = tmp_path / "site.yaml"
    cfg.write_bytes(b"SERVER_NAME: gpu\xff01\n")
    assert server_main(["--config", str(cfg), "--check"]) == 2
    err = capsys.readouterr().err
    assert err == f"mtgpu-server: {cfg}:1: the byte 0xff at column 17 is not UTF-8; save the file as UTF-8\n"


@pytest.mark.parametrize(
    "typo, meant",
    [
        ("USAGE_SAMPLE_INTERVALL", "USAGE_SAMPLE_INTERVAL"),
        ("LOG_LEVLE", "LOG_LEVEL"),
        ("TENANT_HOMEROOT", "TENANT_HOME_ROOT"),
        ("admins", "ADMINS"),
        ("SSH_MAX_AUTH_TRIALS", "SSH_MAX_AUTH_TRIES"),
    ],
)
def test_a_misspelt_key_gets_did_you_mean_and_the_file_read(typo: str, meant: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(f"LOG_LEVEL: INFO\n{typo}: 1\n", "/srv/conf/gpu01.yaml")
    assert str(info.value) == f"/srv/conf/gpu01.yaml:2: {typo}: unknown key; did you mean {meant}?"
    assert "etc/mtgpu.yaml" not in str(info.value)


def test_an_unknown_key_with_no_near_one_points_to_the_list() -> None:
    with pytest.raises(ConfigError) as info:
        load_text("FROBNICATE: 1\n", "/srv/conf/gpu01.yaml")
    assert str(info.value).startswith("/srv/conf/gpu01.yaml:1: FROBNICATE: unknown key; ")
    assert "mtgpu-server --check --show" in str(info.value)


# Every duration key, each spelling: (text, seconds). A key capped below a unit is
# refused for it, naming the cap.
CAPS = {"VRAM_WATCH_INTERVAL": 1.0}
SPELLINGS = [("5s", 5), ("0.5s", 0.5), ("2m", 120), ("1h", 3600), ("1d", 86400), (" 3h ", 3 * 3600)]


@pytest.mark.parametrize("key", sorted(DURATION_KEYS))
@pytest.mark.parametrize("text, seconds", SPELLINGS)
def test_every_duration_key_takes_every_unit(key: str, text: str, seconds: float) -> None:
    scale = 86400 if DURATION_KEYS[key] == "d" else 1
    if seconds > CAPS.get(key, float("inf")):
        with pytest.raises(ValueError, match="at most"):
            _KEYS[key](text)
        return
    assert _KEYS[key](text) == pytest.approx(seconds / scale)


@pytest.mark.parametrize("key", sorted(DURATION_KEYS))
def test_every_duration_key_refuses_what_is_not_a_duration(key: str) -> None:
    for bad in ("soon", "5x", "-1s", "1e9999"):
        with pytest.raises(ValueError, match="is not a duration"):
            _KEYS[key](bad)


@pytest.mark.parametrize("key", sorted(DURATION_KEYS))
def test_a_bare_number_is_in_the_keys_unit(key: str) -> None:
    scale = 86400 if DURATION_KEYS[key] == "d" else 1
    value = 0.5 if key in CAPS else 7
    assert _KEYS[key](value) == pytest.approx(value)
    assert _KEYS[key](f"{value}{DURATION_KEYS[key]}") == pytest.approx(value)
    assert _KEYS[key](f"{value * scale}s") == pytest.approx(value)


def test_every_length_of_time_is_a_duration_key() -> None:
    """A new key of seconds or days that bypasses the one parser fails here."""
    timed = ("_INTERVAL", "_GRACE", "_TTL", "_AFTER", "_SECONDS", "_TIME", "_DAYS")
    for f in dataclasses.fields(Options):
        key = f.name.upper()
        if key in _KEYS and key.endswith(timed):
            assert key in DURATION_KEYS, f"{key} is a length of time but not read by duration_key"


def test_a_probes_timeout_is_a_duration_too() -> None:
    entry = {"brand": "acme", "command": "acme-smi --json", "visibility_env": "ACME_VISIBLE"}
    assert _KEYS["GPU_PROBES"]([{**entry, "timeout": "2m"}])[0].timeout == 120
    assert _KEYS["GPU_PROBES"]([{**entry, "timeout": 15}])[0].timeout == 15
    with pytest.raises(ValueError, match="is not a duration"):
        _KEYS["GPU_PROBES"]([{**entry, "timeout": "soon"}])


def test_usage_sample_interval_in_seconds_loads() -> None:
    """The manual's durations, in a whole file."""
    o = load_text("USAGE_SAMPLE_INTERVAL: 5s\nINVITE_TTL: 2d\nJOB_RETENTION_DAYS: 2w\n", "x.yaml")
    assert (o.usage_sample_interval, o.invite_ttl, o.job_retention_days) == (5.0, 172800.0, 14.0)


def test_show_prints_every_key_with_its_origin(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = tmp_path / "site.yaml"
    cfg.write_text(
        "# a comment\nUSAGE_SAMPLE_INTERVAL: 10s\nADMINS: [ann, bob]\n"
        "CLUSTER_KEY: abcdefghijklmnopqrstuvwxyz\nLOG_MAX_SIZE: 8M\n"
    )
    cfg.chmod(0o600)
    lines = show(load(str(cfg)))
    assert [line.split(":", 1)[0] for line in lines] == list(_KEYS)
    assert set(RELOAD) == set(_KEYS)
    by_key = {line.split(":", 1)[0]: line for line in lines}
    assert by_key["USAGE_SAMPLE_INTERVAL"] == f"USAGE_SAMPLE_INTERVAL: 10.0  # {cfg}:2"
    assert by_key["ADMINS"] == f'ADMINS: ["ann", "bob"]  # {cfg}:3'
    assert by_key["LOG_MAX_SIZE"] == f"LOG_MAX_SIZE: 8388608  # {cfg}:5"
    assert by_key["LOG_KEEP"] == "LOG_KEEP: 5  # default"
    assert by_key["CLUSTER_KEY"] == f"CLUSTER_KEY: (set, not shown)  # {cfg}:4"
    assert "abcdefghijklmnop" not in "\n".join(lines)
    # The same from both commands that check a configuration.
    assert server_main(["--config", str(cfg), "--check", "--show"]) == 0
    from_server = capsys.readouterr().out
    assert setup.main(["check", "--show", "--config", str(cfg)]) == 0
    from_setup = capsys.readouterr().out
    assert setup.main(["--check", "--show", "--config", str(cfg)]) == 0  # as mtgpu-server spells it
    from_setup_flag = capsys.readouterr().out
    assert from_server == from_setup == from_setup_flag == "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text, words",
    [
        ("LOG_MAX_SIZE: 10K\n", "expected a size from 64K to 1T"),
        ("LOG_MAX_SIZE: lots\n", "is not a size"),
        ("LOG_KEEP: -1\n", "0 to 100"),
        ("LOG_KEEP: true\n", "0 to 100"),
    ],
)
def test_the_log_rotation_keys_are_bounded(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(text, "site.yaml")
    assert info.value.line == 1 and words in str(info.value)


def test_setup_check_refuses_a_bad_file_with_status_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = tmp_path / "site.yaml"
    cfg.write_text("LOG_KEEP: 500\n")
    assert setup.main(["check", "--config", str(cfg)]) == 2
    said = capsys.readouterr()
    assert f"{cfg}:1: LOG_KEEP: expected how many rotated log files to keep, 0 to 100" in said.out + said.err
