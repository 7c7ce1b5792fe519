"""Which OS packages the install asks for: podman for workspaces, even where the
system Python (the install's first stage) cannot read the configuration."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mtgpu.install import ospackages


def _names(config: Path, **kw) -> set[str]:
    return {p.package for p in ospackages.missing(config, python=sys.executable, venv_check="pass", **kw)}


def test_podman_is_asked_for_where_workspaces_are_on_even_without_pyyaml(tmp_path, monkeypatch) -> None:
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    monkeypatch.setenv("MTGPU_HOST_ROOT", str(root))  # a host with none of the commands
    config = tmp_path / "mtgpu.yaml"
    config.write_text("CONTAINERS:\n  enabled: true\n")
    assert "podman" in _names(config)
    # The first stage runs on the system Python, which may lack PyYAML: it cannot tell,
    # and does not ask; the second stage (the virtualenv's, which has it) says so.
    monkeypatch.setitem(sys.modules, "yaml", None)
    assert "podman" not in _names(config)
    assert "podman" in _names(config, containers=True)
    config.write_text("CONTAINERS:\n  enabled: false\n")
    assert "podman" not in _names(config, containers=False)


@pytest.mark.parametrize("text", ["", "CONTAINERS: {enabled: false}\n", "[not, a, mapping]\n"])
def test_podman_is_not_asked_for_where_workspaces_are_off(tmp_path, monkeypatch, text) -> None:
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    monkeypatch.setenv("MTGPU_HOST_ROOT", str(root))
    config = tmp_path / "mtgpu.yaml"
    config.write_text(text)
    assert "podman" not in _names(config)
