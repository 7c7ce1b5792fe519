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
    assert o.python_interpreters == (InterpreterSpec("/usr/bin/python3"),
                                     InterpreterSpec("/opt/python3.12/bin/python3.12", "py312"))


def test_the_quoted_duplicate_refusal_is_real() -> None:
    quoted = re.search(r"mtgpu-server: (/etc/mtgpu/mtgpu.yaml:3: DATASETS_DIRECTORIES.*)",
                       section()).group(1)
    with pytest.raises(ConfigError) as info:
        load_text("DATASETS_DIRECTORIES:\n  - /srv/a/imagenet\n  - /mnt/b/imagenet\n",
                  "/etc/mtgpu/mtgpu.yaml")
    assert str(info.value) == quoted
