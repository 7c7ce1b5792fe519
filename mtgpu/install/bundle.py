"""The offline release bundle: MTGPU and the wheels of every dependency, in one tarball.

``mtgpu-setup bundle --output DIR`` writes ``mtgpu-VERSION-pyX.Y-MACHINE.tar.gz``,
which unpacks to ``mtgpu-VERSION/``::

    mtgpu-VERSION/
        BUNDLE.json     version, state format, target Python and machine, the wheels
        bin/ etc/ docs/ mtgpu/ pyproject.toml README.md   (bin/mtgpu-setup runs from here)
        wheels/         mtgpu-VERSION-py3-none-any.whl and every dependency's wheel

``bin/mtgpu-setup install --yes`` run from the unpacked directory installs from
``wheels/`` alone (``pip --no-index``): the host needs no registry. Standard library
only, like the first stage of install; pip does the downloading and building.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mtgpu.errors import CommandError, SetupError
from mtgpu.proc import run

MANIFEST = "BUNDLE.json"
#: What goes into the bundle from the source tree (tests/ and benchmarks/ do not).
CONTENTS = ("pyproject.toml", "README.md", "LICENSE", "bin", "etc", "docs", "mtgpu")
#: Put into the bundle beside MTGPU's dependencies: pip, which install runs from its
#: wheel (so the host needs neither pip nor python3-venv's ensurepip), and setuptools,
#: so that the source tree in the bundle can also be built offline.
BOOTSTRAP = ("pip", "setuptools>=64")


class BundleError(SetupError):
    pass


def source_version(root: Path) -> tuple[str, int]:
    """The version and state format of the MTGPU source under ``root``, read, not imported."""
    text = (root / "mtgpu" / "__init__.py").read_text()
    v = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M)
    f = re.search(r"^STATE_FORMAT\s*=\s*(\d+)", text, re.M)
    if not v:
        raise BundleError(f"no __version__ in {root / 'mtgpu' / '__init__.py'}")
    return v.group(1), int(f.group(1)) if f else 1


def version_key(v: str) -> tuple[int, ...]:
    """A comparable form of a release number (its leading numbers).

    >>> version_key("0.10.1") > version_key("0.9")
    True
    """
    nums = re.findall(r"\d+", v.split("+")[0])
    return tuple(int(n) for n in nums) or (0,)


def read_manifest(root: Path) -> dict | None:
    """The manifest of an unpacked bundle at ``root``, or None for a plain checkout."""
    try:
        data = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise BundleError(f"{root / MANIFEST} is unreadable ({exc}); unpack the bundle again") from exc
    if not isinstance(data, dict) or "version" not in data:
        raise BundleError(f"{root / MANIFEST} is not an MTGPU bundle manifest")
    return data


def _pip(py: str, args: list[str], say: Callable[[str], None]) -> None:
    argv = [py, "-m", "pip", *args]
    say("pip " + " ".join(args))
    proc = run(argv, check=False, timeout=None)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-2500:]
        raise BundleError(f"pip failed ({proc.returncode}):\n{tail}")


def build(
    root: Path,
    output: Path,
    *,
    python_version: str | None,
    platforms: list[str],
    find_links: list[str],
    no_index: bool,
    say: Callable[[str], None],
) -> Path:
    """Write the bundle of the source at ``root`` into ``output``; return its path."""
    py = sys.executable
    if run([py, "-m", "pip", "--version"], check=False).returncode != 0:
        raise BundleError(
            f"{py} has no pip: install python3-pip, or name a Python that has it "
            "(MTGPU_PYTHON=/path/to/python bin/mtgpu-setup bundle ...)"
        )
    version, state_format = source_version(root)
    cross = bool(python_version or platforms)
    target_py = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    if not re.fullmatch(r"3\.\d+", target_py):
        raise BundleError(f"--python-version {target_py!r}: give MAJOR.MINOR, such as 3.11")
    machine = platform.machine() if not platforms else _machine_of(platforms[0])
    output.mkdir(parents=True, exist_ok=True)
    name = f"mtgpu-{version}"
    tarball = output / f"{name}-py{target_py}-{machine}.tar.gz"
    stage = Path(tempfile.mkdtemp(prefix=".mtgpu-bundle-", dir=output))
    try:
        tree = stage / name
        tree.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
        for item in CONTENTS:
            src = root / item
            if src.is_dir():
                shutil.copytree(src, tree / item, symlinks=True, ignore=ignore)
            elif src.exists():
                shutil.copy2(src, tree / item)
        wheels = tree / "wheels"
        wheels.mkdir()
        source_opts = [a for d in find_links for a in ("--find-links", d)]
        if no_index:
            source_opts.append("--no-index")
        # MTGPU's own wheel, from the copied tree (pure Python: one wheel for every target),
        # with this Python's setuptools where it can build wheels (quicker than pip's
        # isolated build environment).
        isolation = ["--no-build-isolation"] if _can_build_here(py) else []
        _pip(py, ["wheel", "-q", "--no-deps", *isolation, *source_opts, "-w", str(wheels), str(tree)], say)
        own = next(wheels.glob("mtgpu-*.whl"))
        # With every optional part (amdsmi), so that any host installs from it offline.
        # pip builds a local tree in place: its leftovers do not belong in the bundle.
        for junk in [tree / "build", *tree.glob("*.egg-info")]:
            shutil.rmtree(junk, ignore_errors=True)
        if cross:
            # Another machine's Python or architecture: only wheels can be fetched for it.
            # A dependency published only as source and pure Python (pysyncobj) is built
            # here first: its py3-none-any wheel serves every target.
            local = stage / "local"
            _pip(py, ["wheel", "-q", *source_opts, "-w", str(local), f"{own}[amd]", *BOOTSTRAP], say)
            for f in local.iterdir():
                if not f.name.endswith("-none-any.whl"):
                    f.unlink()
            target = [
                "--only-binary=:all:",
                "--python-version",
                target_py,
                "--implementation",
                "cp",
                "--find-links",
                str(local),
            ]
            for p in platforms:
                target += ["--platform", p]
            _pip(
                py,
                ["download", "-q", *source_opts, *target, "-d", str(wheels), f"{own}[amd]", *BOOTSTRAP],
                say,
            )
        else:
            # This machine's Python: what has no wheel is built into one here.
            _pip(py, ["wheel", "-q", *source_opts, "-w", str(wheels), f"{own}[amd]", *BOOTSTRAP], say)
        for f in wheels.iterdir():
            if not f.name.endswith(".whl"):
                raise BundleError(
                    f"pip left {f.name}, which is not a wheel: the target cannot install it offline"
                )
        manifest = {
            "name": "mtgpu",
            "version": version,
            "state_format": state_format,
            "python": target_py,
            "machine": machine,
            "platforms": platforms,
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "wheels": sorted(f.name for f in wheels.iterdir()),
        }
        (tree / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")

        def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode |= 0o444 | (0o111 if info.isdir() or info.mode & 0o100 else 0)
            return info

        tmp = tarball.with_name(tarball.name + ".tmp")
        # Wheels are compressed already: more effort would gain nothing.
        with tarfile.open(tmp, "w:gz", compresslevel=5) as tar:
            tar.add(tree, arcname=name, filter=clean)
        os.replace(tmp, tarball)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return tarball


def _can_build_here(py: str) -> bool:
    """Whether ``py`` has a setuptools that builds MTGPU's wheel (pyproject: >=64, and
    bdist_wheel: setuptools 70.1 or the wheel package)."""
    probe = (
        "import setuptools, sys\n"
        "v = tuple(int(x) for x in setuptools.__version__.split('.')[:2])\n"
        "try:\n    import wheel  # noqa: F401\n    w = True\n"
        "except ImportError:\n    w = False\n"
        "sys.exit(0 if v >= (64, 0) and (w or v >= (70, 1)) else 1)\n"
    )
    return run([py, "-c", probe], check=False).returncode == 0


def _machine_of(platform_tag: str) -> str:
    """``manylinux2014_x86_64`` -> ``x86_64``; ``manylinux_2_28_aarch64`` -> ``aarch64``."""
    for m in ("x86_64", "aarch64", "ppc64le", "s390x", "i686", "armv7l"):
        if platform_tag.endswith(m):
            return m
    return platform_tag


def check_target(manifest: dict, python: str) -> None:
    """Refuse, before anything changes, a bundle built for another Python or machine."""
    try:
        probe = run(
            [python, "-c", "import platform, sys; print('%d.%d' % sys.version_info[:2], platform.machine())"],
            check=False,
        )
    except CommandError as exc:
        raise BundleError(f"cannot run {python}: {exc}") from exc
    if probe.returncode != 0:
        raise BundleError(f"cannot run {python}: {probe.stderr.strip()}")
    have_py, have_machine = probe.stdout.split()
    want_py, want_machine = manifest.get("python"), manifest.get("machine")
    if (want_py, want_machine) != (have_py, have_machine):
        raise BundleError(
            f"this bundle holds wheels for Python {want_py} on {want_machine}, but this host has "
            f"Python {have_py} on {have_machine}. Build one for it on a machine with registry access: "
            f"`bin/mtgpu-setup bundle --output DIR --python-version {have_py} --platform "
            f"manylinux2014_{have_machine} --platform manylinux_2_28_{have_machine}`"
        )
