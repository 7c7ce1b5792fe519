"""The configuration file: every bad value is named with its key and line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from mtgpu_testing import REPO, python_env

from mtgpu.config import load, load_text, parse_size
from mtgpu.errors import ConfigError


def test_documented_example_is_valid_and_complete():
    text = (REPO / "etc" / "mtgpu.yaml").read_text()
    opts = load_text(text, "etc/mtgpu.yaml")
    assert opts.ssh_listen == ("0.0.0.0", 2222)
    assert opts.cluster_mode == "standalone"
    # Every key the loader knows is documented in the example.
    from mtgpu.config.options import _KEYS

    for key in _KEYS:
        assert f"{key}:" in text, f"{key} is not documented in etc/mtgpu.yaml"


@pytest.mark.parametrize(
    "text, key, line, words",
    [
        ("SSH_LISTEN: 127.0.0.1:2\nUSER_DISK_LIMIT: 20Q\n", "USER_DISK_LIMIT", 2, "not a size"),
        ("BOGUS: 1\n", "BOGUS", 1, "unknown key"),
        ("ssh_listen: 1.2.3.4:22\n", "ssh_listen", 1, "did you mean SSH_LISTEN"),
        ("TENANT_UID_RANGE: 500-900\n", "TENANT_UID_RANGE", 1, "system accounts"),
        ("TENANT_UID_RANGE: 30000-20000\n", "TENANT_UID_RANGE", 1, "empty"),
        ("TENANT_UID_RANGE: 20000-61000\n", "TENANT_UID_RANGE", 1, "33767"),
        ("SSH_LISTEN: nowhere\n", "SSH_LISTEN", 1, "HOST:PORT"),
        ("RENDEZVOUS_PORTS: 80-9000\n", "RENDEZVOUS_PORTS", 1, "1024-65535"),
        ("RENDEZVOUS_PORTS: 30000-30010\n", "RENDEZVOUS_PORTS", 1, "at least 256"),
        ("RENDEZVOUS_PORTS: lots\n", "RENDEZVOUS_PORTS", 1, "FIRST-LAST"),
        ("CLUSTER_MODE: swarm\n", "CLUSTER_MODE", 1, "standalone or cluster"),
        ("CLUSTER_MODE: cluster\nCLUSTER_ID: a\n", "CLUSTER_KEY", 1, "must be set"),
        ("STATE_DIR: relative/path\n", "STATE_DIR", 1, "absolute path"),
        ("ADMINS: alice\n", "ADMINS", 1, "list of user names"),
        ("SIMULATED_GPUS:\n  - {type: a100, count: 2}\n", "SIMULATED_GPUS[0]", 2, "needs 'vram'"),
        ("SIMULATED_GPUS:\n  - {type: a100, vram: 8G, used: 9G}\n", "SIMULATED_GPUS[0].used", 2, "exceed"),
        (
            "CONTAINERS:\n  enabled: yes\n  port_publishing: all\n",
            "CONTAINERS.port_publishing",
            3,
            "none, loopback or any",
        ),
        ("JOB_RETENTION_DAYS: -1\n", "JOB_RETENTION_DAYS", 1, "is not a duration"),
        ("TENANT_RETENTION_WARN_DAYS: -2\n", "TENANT_RETENTION_WARN_DAYS", 1, "is not a duration"),
        ("TENANT_RETENTION_WARN_DAYS: soon\n", "TENANT_RETENTION_WARN_DAYS", 1, "is not a duration"),
        ("USAGE_RETENTION_DAYS: null\n", "USAGE_RETENTION_DAYS", 1, "got nothing"),
        ("USAGE_RETENTION_DAYS: 0\n", "USAGE_RETENTION_DAYS", 1, "longer than 0"),
        ("LOG_LEVEL: loud\n", "LOG_LEVEL", 1, "DEBUG"),
        (
            "DATASETS_DIRECTORIES:\n  - /srv/a/imagenet\n  - /srv/b/imagenet\n",
            "DATASETS_DIRECTORIES[1]",
            3,
            "both would be published at /datasets/imagenet",
        ),
        ("DATASETS_DIRECTORIES: [/srv/x, /srv/x]\n", "DATASETS_DIRECTORIES[1]", 1, "is listed twice"),
        ("DATASETS_DIRECTORIES: [/]\n", "DATASETS_DIRECTORIES[0]", 1, "cannot be published"),
        (
            "PYTHON_INTERPRETERS:\n  - py: /opt/a/bin/python3\n  - py: /opt/b/bin/python3\n",
            "PYTHON_INTERPRETERS[1]",
            3,
            "given twice",
        ),
        ("PYTHON_INTERPRETERS: [bin/python3]\n", "PYTHON_INTERPRETERS[0]", 1, "absolute path"),
        ("PYTHON_INTERPRETERS: [{a: /x, b: /y}]\n", "PYTHON_INTERPRETERS[0]", 1, "one NAME: PATH pair"),
        ("[1, 2]\n", None, 1, "mapping"),
        ("SSH_LISTEN: [\n", None, 2, "not valid YAML"),
    ],
)
def test_bad_values_name_key_and_line(text, key, line, words):
    with pytest.raises(ConfigError) as info:
        load_text(text, "cfg.yaml")
    err = info.value
    assert err.line == line
    if key:
        assert err.key == key
        assert key in str(err)
    assert words in str(err)
    assert str(err).startswith(f"cfg.yaml:{line}")


def test_interpreters_are_paths_or_named_paths():
    from mtgpu.config import InterpreterSpec

    o = load_text("PYTHON_INTERPRETERS:\n  - /usr/bin/python3\n  - py311: /opt/py311/bin/python3/\n")
    assert o.python_interpreters == (
        InterpreterSpec("/usr/bin/python3"),
        InterpreterSpec("/opt/py311/bin/python3", "py311"),
    )


def test_sizes_are_binary():
    assert parse_size("24G") == 24 << 30
    assert parse_size("1.5T") == int(1.5 * (1 << 40))
    assert parse_size("512MiB") == 512 << 20
    with pytest.raises(ValueError):
        parse_size("-3G")


def test_server_exits_2_naming_the_key(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("SERVER_NAME: ok\nUSER_DISK_LIMIT: 20Q\n")
    r = subprocess.run(
        [sys.executable, "-m", "mtgpu.server", "--config", str(cfg)],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=60,
    )
    assert r.returncode == 2
    assert "USER_DISK_LIMIT" in r.stderr and ":2:" in r.stderr


def test_missing_explicit_config_is_an_error(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "mtgpu.server", "--config", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=60,
    )
    assert r.returncode == 2 and "does not exist" in r.stderr


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_cluster_key_file_open_to_others_is_refused(tmp_path, mode):
    """As sshd refuses a host key others can read: the daemon exits 2 naming the key,
    the mode and the fix."""
    cfg = tmp_path / "mtgpu.yaml"
    cfg.write_text("CLUSTER_MODE: cluster\nCLUSTER_ID: lab\nCLUSTER_KEY: 0123456789abcdef-secret\n")
    os.chmod(cfg, mode)
    r = subprocess.run(
        [sys.executable, "-m", "mtgpu.server", "--config", str(cfg), "--check"],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=60,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "CLUSTER_KEY" in r.stderr and f"mode {mode:04o}" in r.stderr and f"chmod 600 {cfg}" in r.stderr
    assert "Traceback" not in r.stderr
    os.chmod(cfg, 0o600)
    assert load(str(cfg)).cluster_key == "0123456789abcdef-secret"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("VRAM_WATCH_INTERVAL: 2\n", "at most 1s (the VRAM watchdog reads at least once a second)"),
        ("VRAM_WATCH_INTERVAL: 0\n", "longer than 0"),
        ("VRAM_TOLERANCE: 150\n", "percentage from 0 to 100"),
        ("VRAM_TOLERANCE: -1\n", "percentage from 0 to 100"),
        ("VRAM_TOLERANCE: lots\n", "percentage from 0 to 100"),
    ],
)
def test_vram_watchdog_keys_are_bounded(text, words):
    with pytest.raises(ConfigError) as info:
        load_text(text, "cfg.yaml")
    assert info.value.key == text.split(":")[0] and words in str(info.value)


def test_vram_watchdog_defaults_and_values():
    o = load_text("")
    assert (o.vram_watch_interval, o.vram_tolerance) == (1.0, 5.0)
    o = load_text("VRAM_WATCH_INTERVAL: 0.25\nVRAM_TOLERANCE: 0\n")
    assert (o.vram_watch_interval, o.vram_tolerance) == (0.25, 0.0)


@pytest.mark.parametrize(
    "text, key, lines",
    [
        ("USER_SUBMIT_RATE: 20\nLOG_LEVEL: INFO\nUSER_SUBMIT_RATE: 5\n", "USER_SUBMIT_RATE", (1, 3)),
        ("CONTAINERS:\n  enabled: true\n  network: true\n  enabled: false\n", "CONTAINERS.enabled", (2, 4)),
    ],
)
def test_a_key_given_twice_is_refused_naming_both_lines(text, key, lines):
    # YAML itself keeps the last of two equal keys, silently: an admin who edits the
    # first of two copies would see the change ignored.
    with pytest.raises(ConfigError) as e:
        load_text(text, "cfg.yaml")
    assert e.value.key == key and e.value.line == lines[1]
    assert f"given twice (lines {lines[0]} and {lines[1]})" in str(e.value)


def test_the_example_configuration_gives_every_key_once():
    import re

    text = (REPO / "etc" / "mtgpu.yaml").read_text()
    keys = re.findall(r"^([A-Z_]+):", text, re.M)
    assert len(keys) == len(set(keys)), sorted(k for k in set(keys) if keys.count(k) > 1)
