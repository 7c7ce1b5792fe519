"""The programs MTGPU installs, from one list: ``[project.scripts]`` in pyproject.toml.

The installer links them into ``BIN_DIR`` and the daemon links the tenants' ones into
its tools directory; both read the names here, so a new program is added in one place.
In a source tree (a checkout, an unpacked bundle) the list is read from the
pyproject.toml beside the package; in an installed one, from the distribution's
metadata, which setuptools wrote from the same table.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

#: Programs run by absolute path (podman's hook) or put in a workspace as a shim
#: (``docker``): never linked onto an admin's PATH.
INTERNAL = frozenset({"mtgpu-docker", "mtgpu-podman-hook"})
#: Slurm's commands, as front ends over the same API (mtgpu.cli.slurm).
SLURM_COMMANDS = ("sbatch", "squeue", "scancel", "sinfo", "scontrol", "salloc", "srun")
#: What tenants run on every host: the daemon links these into its tools directory.
TENANT_TOOLS = (
    "mt-job",
    "mt-container",
    "mt-podman",
    "mt-python",
    "mt-attach",
    "mtgpu-admin",
    "sacct",
    *SLURM_COMMANDS,
)

_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def console_scripts() -> dict[str, str]:
    """Every program's name and entry point (``module:function``)."""
    if _PYPROJECT.is_file():
        with _PYPROJECT.open("rb") as f:
            table = tomllib.load(f).get("project", {}).get("scripts", {})
        if table:
            return dict(table)
    dist = metadata.distribution("mtgpu")
    return {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}


def linked_scripts() -> tuple[str, ...]:
    """The programs the installer links into ``BIN_DIR``, sorted."""
    return tuple(sorted(name for name in console_scripts() if name not in INTERNAL))
