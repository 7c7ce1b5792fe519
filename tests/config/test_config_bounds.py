"""Hostile configuration files: aliases, deep nesting, keys that are not names, NaN and
infinity. Each is a one-line error with the file, the line and the key, found without
building anything large."""

from __future__ import annotations

import pytest

from mtgpu.config.options import load_text
from mtgpu.errors import ConfigError

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(9)
)


@pytest.mark.parametrize(
    "text, line, key, words",
    [
        (LAUGHS, 2, "b", "aliases"),
        ("CONTAINERS: &c {templates: *c}\n", 1, "CONTAINERS", "aliases"),
        ("CONTAINERS:" + " [" * 500 + " ]" * 500 + "\n", 1, "CONTAINERS", "nested more than 16"),
        ("SERVER_NAME: x\nnull: 1\n", 2, "null", "null"),
        ("true: 1\n", 1, "true", "true/false"),
        ("CONTAINERS:\n  1: x\n", 2, "CONTAINERS.1", "number"),
        ("USER_SUBMIT_RATE: .nan\n", 1, "USER_SUBMIT_RATE", "finite"),
        ("USAGE_SAMPLE_INTERVAL: .inf\n", 1, "USAGE_SAMPLE_INTERVAL", "finite"),
        ("INVITE_TTL: .inf\n", 1, "INVITE_TTL", "finite"),
        ("JOB_RETENTION_DAYS: .nan\n", 1, "JOB_RETENTION_DAYS", "finite"),
        ("USER_SUBMIT_BURST: " + "9" * 400 + "\n", 1, "USER_SUBMIT_BURST", "400 digits"),
        ("USER_DISK_LIMIT: " + "9" * 400 + "G\n", 1, "USER_DISK_LIMIT", "not a size"),
        ("JOB_SCRIPT_MAX: 3M\n", 1, "JOB_SCRIPT_MAX", "2M"),
    ],
)
def test_hostile_configuration_is_one_line_with_file_line_and_key(text, line, key, words):
    with pytest.raises(ConfigError) as exc:
        load_text(text, "/etc/mtgpu/mtgpu.yaml")
    msg = str(exc.value)
    assert msg.startswith(f"/etc/mtgpu/mtgpu.yaml:{line}: {key}: "), msg
    assert words in msg and "\n" not in msg and len(msg) < 300, msg


def test_the_new_limits_load_and_default():
    o = load_text("JOB_SCRIPT_MAX: 512K\nUSER_MAX_QUEUED_SCRIPT_BYTES: null\n", "c.yaml")
    assert o.job_script_max == 512 << 10 and o.user_max_queued_script_bytes is None
    d = load_text("", "c.yaml")
    assert d.job_script_max == 1 << 20 and d.user_max_queued_script_bytes == 64 << 20


def test_node_features_are_checked_names() -> None:
    from mtgpu.config.options import _node_features

    assert _node_features(["a100", "nvlink"]) == ("a100", "nvlink")
    for bad in (["a b"], ["x" * 65], [1], {"a": 1}, ["ok"] * 65):
        with pytest.raises(ValueError):
            _node_features(bad)
