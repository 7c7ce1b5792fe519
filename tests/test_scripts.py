"""The programs come from one list, ``[project.scripts]`` in pyproject.toml: the
installer's links, the daemon's tenant tools and the checkout's bin/ launchers agree
with it."""

from __future__ import annotations

import importlib
import re
import tomllib
from importlib import metadata
from pathlib import Path

from mtgpu import scripts

REPO = Path(__file__).resolve().parent.parent


def _pyproject() -> dict[str, str]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def test_the_list_is_pyprojects_and_the_installed_metadata_agrees() -> None:
    assert scripts.console_scripts() == _pyproject()
    installed = {
        ep.name: ep.value
        for ep in metadata.distribution("mtgpu").entry_points
        if ep.group == "console_scripts"
    }
    assert installed == _pyproject()


def test_every_entry_point_is_a_function() -> None:
    for name, target in scripts.console_scripts().items():
        module, _, func = target.partition(":")
        assert callable(getattr(importlib.import_module(module), func)), name


def test_the_installer_links_every_program_but_the_internal_ones() -> None:
    every = set(scripts.console_scripts())
    assert scripts.INTERNAL <= every and set(scripts.TENANT_TOOLS) <= every
    assert set(scripts.linked_scripts()) == every - scripts.INTERNAL
    assert {"mtgpu-server", "mtgpu-setup", "mt-job", "remotegpu-cli"} <= set(scripts.linked_scripts())


def test_the_installer_and_the_daemon_keep_no_list_of_their_own() -> None:
    from mtgpu import server
    from mtgpu.install import setup

    assert not hasattr(setup, "SCRIPTS") and not hasattr(server, "TOOLS")


def test_bin_launchers_run_the_entry_points_module() -> None:
    table = scripts.console_scripts()
    launchers = [p for p in (REPO / "bin").iterdir() if not p.name.startswith("_")]
    assert launchers
    for path in launchers:
        m = re.search(r"^launch (\S+) ", path.read_text(), re.M)
        assert m, f"{path}: no `launch MODULE` line"
        assert path.name in table, f"bin/{path.name} is not in [project.scripts]"
        module = table[path.name].partition(":")[0]
        assert m.group(1) == module, f"bin/{path.name} runs {m.group(1)}, pyproject {module}"
        assert "__main__" in Path(importlib.import_module(module).__file__ or "").read_text()
