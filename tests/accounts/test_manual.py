"""The manual's "Datasets and Python interpreters" section: its configuration loads and
the messages it quotes are the real ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtgpu.config import InterpreterSpec, load_text
from mtgpu.errors import ConfigError

MANUAL = Path(__file__).resolve().parents[2] / "docs" / "manual.md"


def section() -> str:
    text = MANUAL.read_text()
    start = text.index("\n## Datasets and Python interpreters")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_the_configuration_example_loads() -> None:
    [yaml_text] = re.findall(r"```yaml\n(.*?)```", section(), flags=re.DOTALL)
    o = load_text(yaml_text)
    assert o.datasets_directories == ("/srv/datasets/imagenet", "/mnt/nfs/coco")
    assert o.python_interpreters == (
        InterpreterSpec("/usr/bin/python3"),
        InterpreterSpec("/opt/python3.12/bin/python3.12", "py312"),
    )


def test_the_quoted_duplicate_refusal_is_real() -> None:
    quoted = re.search(r"mtgpu-server: (site.yaml:4: DATASETS_DIRECTORIES.*)", section()).group(1)
    with pytest.raises(ConfigError) as info:
        load_text(
            "SERVER_NAME: gpu01\nDATASETS_DIRECTORIES:\n  - /srv/a/imagenet\n  - /mnt/b/imagenet\n",
            "site.yaml",
        )
    assert str(info.value) == quoted


def retention_section() -> str:
    text = MANUAL.read_text()
    start = text.index("\n### `TENANT_RETENTION_DAYS`")
    return text[start : text.index("\n## ", start + 1)]


def test_the_retention_example_loads_and_its_messages_are_the_real_ones() -> None:
    import calendar

    from mtgpu.accounts.retention import DAY, locked_message, warning

    text = retention_section()
    o = load_text(re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)[0])
    assert (o.tenant_retention_days, o.tenant_retention_grace, o.tenant_retention_warn_days) == (
        90,
        14 * DAY,
        7,
    )
    last = calendar.timegm((2027, 1, 1, 12, 0, 0))
    quoted = re.search(r"mtgpu: warning: (.*)", text).group(1)
    login = calendar.timegm((2027, 3, 28, 12, 0, 0))
    assert warning("alice", last, login, 90, 7, ["boss"]) == quoted
    assert warning("alice", last, login - 4 * DAY, 90, 7, ["boss"]) is None  # before 03-25
    quoted = re.search(r"Received disconnect from .*?:14: (.*)", text).group(1)
    locked = calendar.timegm((2027, 4, 1, 16, 0, 0))
    assert locked_message("alice", locked, 14 * DAY, "archive", ["boss"]) == quoted
