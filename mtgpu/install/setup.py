"""``mtgpu-setup``: headless, idempotent install, upgrade, status and uninstall.

``install`` runs in two stages. The first uses only the standard library, so it
works from a fresh checkout or an unpacked release bundle with the system Python:
it refuses a release older than the one installed, installs what the host needs,
builds the virtualenv under ``--prefix`` from ``/usr/bin/python3`` (never from an
interpreter under /root, so tenants can run the tools) and installs MTGPU into it,
from the bundle's wheels alone when it runs from a bundle. The second stage runs
inside that virtualenv: configuration, host keys, links, the systemd unit, the WSL2
steps, start, and the release stamp.

``bundle`` makes the offline release tarball (mtgpu.install.bundle); ``start`` starts the
daemon in the background where systemd does not (WSL's ``[boot] command``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtgpu.cmdline import VERSION, with_examples
from mtgpu.errors import CommandError, SetupError
from mtgpu.install import ospackages
from mtgpu.install.bundle import BundleError, check_target, read_manifest, source_version, version_key
from mtgpu.install.ospackages import host_root
from mtgpu.proc import ROOT_CHILD_ENV, call, run, spawn
from mtgpu.scripts import SLURM_COMMANDS, linked_scripts

if TYPE_CHECKING:  # the first stage runs on a bare system Python, without PyYAML
    from mtgpu.config import Options
    from mtgpu.install.wsl import WslReport

PREFIX = "/opt/mtgpu"
CONFIG = "/etc/mtgpu/mtgpu.yaml"
BIN_DIR = "/usr/local/bin"
UNIT_DIR = "/etc/systemd/system"
SYSTEM_PYTHON = "/usr/bin/python3"
LOG_FILE = "/var/log/mtgpu.log"
DEFAULT_STATE_DIR = "/var/lib/mtgpu"
#: Written into PREFIX and STATE_DIR after each install: the release and state format.
RELEASE_STAMP = "release.json"


def slurm_installed(name: str, link: Path, prefix: Path) -> bool:
    """Whether Slurm's own ``name`` is on this host (at ``link`` or on PATH): MTGPU's
    front end then never replaces or shadows it for the admin."""
    found = shutil.which(name)
    theirs = [p for p in (link if link.exists() or link.is_symlink() else None, found) if p]
    return any(not os.path.realpath(p).startswith(str(prefix) + os.sep) for p in theirs)


def say(msg: str) -> None:
    print(f"mtgpu-setup: {msg}", flush=True)


class SetupFailed(SetupError):
    pass


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        proc = run(argv, env=env, check=False, timeout=None)  # pip and compilers take their time
    except CommandError as exc:
        raise SetupFailed(str(exc)) from exc
    if proc.returncode != 0:
        raise SetupFailed(
            f"`{' '.join(argv)}` failed ({proc.returncode}):\n{(proc.stderr or proc.stdout).strip()[-2000:]}"
        )
    return proc


def _extras() -> str:
    """The optional parts of MTGPU this host needs, as pip writes them after the name:
    ``[amd]`` (amdsmi, from ROCm's releases) where the AMD GPU driver is loaded."""
    if os.path.exists("/dev/kfd"):
        say("AMD GPU driver found (/dev/kfd): installing amdsmi for the AMD probe")
        return "[amd]"
    return ""


def source_root() -> Path | None:
    """The checkout or unpacked source this setup runs from, if any."""
    here = Path(__file__).resolve().parent.parent.parent
    return here if (here / "pyproject.toml").exists() and (here / "mtgpu").is_dir() else None


def source_digest(root: Path) -> str:
    """A digest of the installable source, so an unchanged tree is not reinstalled."""
    h = hashlib.sha256()
    files = [root / "pyproject.toml"] + sorted((root / "mtgpu").rglob("*"))
    for f in files:
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def systemd_running() -> bool:
    return (host_root() / "run/systemd/system").is_dir()


# ---------------------------------------------------------------- stage one


def ensure_os_packages(config: Path, *, skip: bool, venv_check: str = "import ensurepip, venv") -> list[str]:
    """Install the missing OS packages where a package mirror answers (mtgpu.install.ospackages).

    What is still missing is listed with what does not work without it. A missing
    package MTGPU cannot work without stops the install (unless ``skip``); the
    others are returned, to be named again at the end of the install.
    """
    missing, why = ospackages.ensure(config, skip=skip, python=SYSTEM_PYTHON, venv_check=venv_check, say=say)
    if not missing:
        return []
    width = max(len(m.package) for m in missing)
    say(f"these OS packages are missing ({why}):")
    for m in missing:
        print(
            f"    {m.package:<{width}}  {'required' if m.required else 'optional'}  without it: {m.without}",
            flush=True,
        )
    required = [m.package for m in missing if m.required]
    if required and not skip:
        raise SetupFailed(
            f"MTGPU cannot work without {', '.join(required)}. Install them (from a package mirror, "
            "or copy their .deb files up with scp and `apt-get install ./FILE.deb`), then run install "
            "again; `install --yes --skip-os-packages` installs MTGPU without them. Nothing was changed"
        )
    say("going on without them; install them later and run install again")
    return [m.package for m in missing]


# ------------------------------------------------------------- the release stamp


def _state_dir_of(config: Path) -> str:
    """STATE_DIR from the configuration, read with the standard library where need be."""
    import re

    try:
        text = config.read_text()
    except OSError:
        return DEFAULT_STATE_DIR
    try:
        import yaml

        raw = yaml.safe_load(text)
        if isinstance(raw, dict) and isinstance(raw.get("STATE_DIR"), str):
            return raw["STATE_DIR"]
        return DEFAULT_STATE_DIR
    except Exception:  # noqa: BLE001 - no PyYAML in this Python, or a broken file
        m = re.search(r"""^STATE_DIR:\s*["']?([^"'#\s]+)""", text, re.M)
        return m.group(1) if m else DEFAULT_STATE_DIR


def refuse_older(prefix: Path, config: Path, version: str, state_format: int) -> None:
    """Refuse to install ``version`` over an installation or state of a newer release."""
    stamps = []
    state_dir = None
    try:
        data = json.loads((prefix / RELEASE_STAMP).read_text())
        stamps.append((str(prefix), data))
        state_dir = data.get("state_dir")
    except (OSError, ValueError):
        pass
    state_dir = state_dir or _state_dir_of(config)
    try:
        stamps.append((state_dir, json.loads((Path(state_dir) / RELEASE_STAMP).read_text())))
    except (OSError, ValueError):
        pass
    for where, data in stamps:
        have = str(data.get("version", "0"))
        fmt = int(data.get("state_format", 1))
        if version_key(version) < version_key(have) or state_format < fmt:
            raise SetupFailed(
                f"this is MTGPU {version} (state format {state_format}), older than MTGPU {have} "
                f"(state format {fmt}) recorded in {where}/{RELEASE_STAMP}. An older release may not "
                f"read the newer state (users, jobs, keys in {state_dir}), so nothing was changed. "
                f"Install MTGPU {have} or newer; to go back anyway, `mtgpu-setup uninstall --purge` "
                "first (it deletes the users, jobs and keys)"
            )


def write_release_stamps(prefix: Path, state_dir: str) -> None:
    import mtgpu

    data = {
        "version": mtgpu.__version__,
        "state_format": mtgpu.STATE_FORMAT,
        "installed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (Path(state_dir) / RELEASE_STAMP).write_text(json.dumps(data) + "\n")
    (prefix / RELEASE_STAMP).write_text(json.dumps({**data, "state_dir": state_dir}) + "\n")
    os.chmod(prefix / RELEASE_STAMP, 0o644)


def build_env() -> dict[str, str]:
    """The environment for venv, pip and the packages pip builds: the admin's, less
    every ``PYTHON*`` setting. MTGPU's launcher runs its own modules with
    ``PYTHONSAFEPATH`` and ``PYTHONPATH`` set; a package built from source whose
    ``setup.py`` imports itself from its own directory (PySyncObj's does) fails under
    the first, and the second would put this tree before the virtualenv's."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def _offline_pip_env() -> dict[str, str]:
    """pip's environment for a bundle install: no registry, and no pip configuration of
    the host's (an index or find-links in /etc/pip.conf must not be consulted)."""
    env = {k: v for k, v in build_env().items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}


def _pip(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    """Run a pip or venv step; a failure names the step, pip's error lines and what to do."""
    try:
        proc = run(argv, env=env if env is not None else build_env(), check=False, timeout=None)
    except CommandError as exc:
        raise SetupFailed(f"{what} failed: {exc}") from exc
    if proc.returncode == 0:
        return
    lines = [ln.strip(" ×╰─>│") for ln in (proc.stderr + proc.stdout).splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(("note:", "hint:", "See above"))]
    errors = [ln for ln in lines if "rror" in ln or "No matching distribution" in ln]
    detail = " / ".join(dict.fromkeys((errors or lines)[-3:])).rstrip(".")
    raise SetupFailed(
        f"{what} failed ({proc.returncode}): {detail}. Check that this host reaches the package "
        "index (pip's index, proxy and certificate settings), then run `mtgpu-setup install --yes` again"
    )


def build_venv(
    prefix: Path, root: Path, *, wheelhouse: str | None, force: bool, bundle: dict | None = None
) -> bool:
    """Create ``prefix/venv`` and install MTGPU from ``root``; True if anything changed.

    From a bundle, MTGPU's own wheel and its dependencies come from ``root/wheels``
    alone; the wheel is reinstalled even when its version did not change, since the
    code may have.
    """
    venv = prefix / "venv"
    py = venv / "bin" / "python"
    stamp = prefix / "installed-source.sha256"
    digest = source_digest(root)
    if py.exists() and stamp.exists() and stamp.read_text().strip() == digest and not force:
        return False
    prefix.mkdir(parents=True, exist_ok=True)
    os.chmod(prefix, 0o755)
    fresh = not py.exists()
    if bundle is not None:
        wheels = root / "wheels"
        own = sorted(wheels.glob(f"mtgpu-{bundle['version']}-*.whl"))
        pip_whl = sorted(wheels.glob("pip-*.whl"))
        if not own or not pip_whl:
            raise SetupFailed(
                f"the bundle's {wheels} lacks the mtgpu-{bundle['version']} or the pip wheel; unpack it again"
            )
        if fresh:
            # pip runs from the bundle's own wheel: no ensurepip (python3-venv) needed.
            say(f"creating the virtualenv {venv} from {SYSTEM_PYTHON}")
            _pip([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], f"creating {venv}")
        say(f"installing MTGPU {bundle['version']} into {venv} from the bundle's wheels ({wheels}), offline")
        offline = [
            str(py),
            str(pip_whl[-1] / "pip"),
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-index",
            "--find-links",
            str(wheels),
        ]
        what = f"installing MTGPU from the bundle's wheels into {venv}"
        _pip(offline + [str(own[-1]) + _extras()], what, env=_offline_pip_env())
        if _installed_version(prefix) == bundle["version"]:
            # The same release again with other code: pip would call it satisfied.
            _pip(offline + ["--no-deps", "--force-reinstall", str(own[-1])], what, env=_offline_pip_env())
    else:
        if fresh:
            say(f"creating the virtualenv {venv} from {SYSTEM_PYTHON}")
            _pip([SYSTEM_PYTHON, "-m", "venv", str(venv)], f"creating {venv}")
        elif run([str(py), "-c", "import pip"], check=False, env=build_env()).returncode != 0:
            _pip([str(py), "-m", "ensurepip"], f"adding pip to {venv}")  # a bundle's venv has none
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        if wheelhouse:
            pip += ["--no-index", "--find-links", wheelhouse]
        say(f"installing MTGPU from {root} into {venv}")
        _pip(pip + [str(root) + _extras()], f"installing MTGPU and its Python dependencies into {venv}")
    # Tenants run the tools from here: everything must be world-readable.
    _run(["chmod", "-R", "a+rX", str(prefix)])
    docs = root / "docs"
    if docs.is_dir():
        shutil.copytree(docs, prefix / "docs", dirs_exist_ok=True)
    stamp.write_text(digest + "\n")
    return True


def _installed_version(prefix: Path) -> str | None:
    try:
        return str(json.loads((prefix / RELEASE_STAMP).read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def stage_one(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise SetupFailed("install needs root: run it with sudo")
    if not args.yes:
        raise SetupFailed("install changes this host; pass --yes to confirm (it is unattended)")
    root = source_root()
    if root is None:
        raise SetupFailed(
            "cannot find the MTGPU source next to this program; run "
            "bin/mtgpu-setup from a checkout or an unpacked release"
        )
    try:
        bundle = read_manifest(root)
        version, state_format = source_version(root)
        if bundle is not None:
            check_target(bundle, SYSTEM_PYTHON)
    except BundleError as exc:
        raise SetupFailed(str(exc)) from exc
    refuse_older(Path(args.prefix), Path(args.config), version, state_format)
    # From a bundle pip comes with it: the venv module alone will do (no ensurepip).
    without = ensure_os_packages(
        Path(args.config),
        skip=args.skip_os_packages,
        venv_check="import venv" if bundle else "import ensurepip, venv",
    )
    changed = build_venv(Path(args.prefix), root, wheelhouse=args.wheelhouse, force=args.force, bundle=bundle)
    py = str(Path(args.prefix) / "venv" / "bin" / "python")
    argv = [
        py,
        "-m",
        "mtgpu.install.setup",
        "install",
        "--yes",
        "--stage2",
        "--prefix",
        args.prefix,
        "--config",
        args.config,
        "--bin-dir",
        args.bin_dir,
        "--unit-dir",
        args.unit_dir,
        "--wsl-boot",
        args.wsl_boot,
    ]
    if changed:
        argv.append("--code-changed")
    if args.no_start:
        argv.append("--no-start")
    if args.restart:
        argv.append("--restart")
    if args.skip_os_packages:
        argv.append("--skip-os-packages")
    argv += ["--source-root", str(root)]
    if without:
        argv += ["--without", ",".join(without)]
    argv += ["--log-file", args.log_file]
    argv += ["--share-dir", str(share_dir(args)), "--profile-dir", str(profile_dir(args))]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return call(argv, env=env)


# ---------------------------------------------------------------- stage two


def stage_two(args: argparse.Namespace) -> int:
    from mtgpu.config import load
    from mtgpu.errors import ConfigError
    from mtgpu.sshd.server import ensure_host_keys, fingerprints

    prefix = Path(args.prefix)
    config = Path(args.config)
    if not config.exists():
        config.parent.mkdir(parents=True, exist_ok=True)
        example = Path(__file__).resolve().parent.parent / "data" / "mtgpu.yaml"
        shutil.copyfile(example, config)
        os.chmod(config, 0o644)
        say(f"wrote {config} from the documented defaults")
    else:
        say(f"keeping the existing {config}")
    _ensure_cluster_key(config)
    try:
        options = load(str(config))
    except ConfigError as exc:
        say(f"{exc}")
        say("fix the configuration, then run install again")
        return 2
    Path(options.state_dir).mkdir(parents=True, exist_ok=True)
    os.chmod(options.state_dir, 0o700)
    ensure_host_keys(options.state_dir)
    from mtgpu.schedd.jobinit import helper

    # Built here, not when the first job starts: a job's start never waits on a compiler.
    jobinit = helper(Path(options.state_dir) / "jobs")
    say(
        f"job-start helper: {jobinit}"
        if jobinit
        else "no C compiler: job supervisors fork their jobs (slower starts)"
    )
    if options.containers.enabled and os.geteuid() == 0:
        if not ospackages.have("podman"):
            # The first stage reads the configuration with the system Python, which
            # may lack PyYAML: podman for the workspaces it turns on is asked for here.
            still, why = ospackages.ensure(
                config,
                skip=args.skip_os_packages,
                python=SYSTEM_PYTHON,
                venv_check="import venv",
                say=say,
                containers=True,
            )
            if still:
                say(f"podman is missing ({why}): container workspaces do not work until it is installed")
        podman_check(argparse.Namespace(config=str(config), fix=True))  # workspaces' host needs
    kept: set[str] = set()
    for name in linked_scripts():
        src = prefix / "venv" / "bin" / name
        if not src.exists():
            continue
        link = Path(args.bin_dir) / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and os.readlink(link) == str(src):
            continue
        if name in SLURM_COMMANDS and slurm_installed(name, link, prefix):
            say(f"keeping this host's own {name} (Slurm); tenants get MTGPU's on their PATH")
            kept.add(name)
            continue
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(src)
    build_fast_mtjob(prefix, Path(args.bin_dir))
    install_shell_files(prefix, share_dir(args), profile_dir(args), keep=kept)
    unit_text = (
        (Path(__file__).resolve().parent.parent / "data" / "mtgpu.service")
        .read_text()
        .replace("@PREFIX@", str(prefix))
        .replace("@CONFIG@", str(config))
    )
    unit = Path(args.unit_dir) / "mtgpu.service"
    unit_changed = not unit.exists() or unit.read_text() != unit_text
    if unit_changed:
        unit.parent.mkdir(parents=True, exist_ok=True)
        unit.write_text(unit_text)
    restart = args.code_changed or unit_changed or args.restart
    start_cmd = f"{Path(args.bin_dir) / 'mtgpu-setup'} start --config {config}"
    wsl = wsl_step(options, boot=args.wsl_boot, start_command=start_cmd, config=str(config))
    if wsl is not None and wsl.boot_systemd and not systemd_running():
        _enable_unit_offline(unit)
    if not args.no_start and not restart:
        refuse_mode_change(options, config, args)
    if args.no_start:
        say("installed; not started (--no-start)")
    elif systemd_running():
        _run(["systemctl", "daemon-reload"])
        _run(["systemctl", "enable", "mtgpu.service"])
        _run(["systemctl", "restart" if restart else "start", "mtgpu.service"])
        say(
            "mtgpu.service is enabled and running; it starts at boot. Restarts and upgrades "
            "stop only the daemon (KillMode=process): tenants' tmux sessions and jobs run on"
        )
    else:
        pid = running_pid(options.run_dir)
        if pid and restart:
            # Only the daemon stops: tenants' tmux servers and each job's supervisor are
            # processes of their own, and the new daemon re-adopts the jobs.
            stop_pid(pid)
            why = "to run the new code" if args.code_changed or unit_changed else "to restart it"
            say(f"stopped mtgpu-server (pid {pid}) {why}; tenants' tmux sessions and running jobs are kept")
            pid = None
        if pid:
            say(f"mtgpu-server already runs (pid {pid})")
        else:
            pid = start_background(prefix / "venv" / "bin" / "mtgpu-server", config, options, args.log_file)
            say(f"started mtgpu-server in the background (pid {pid}), logging to {args.log_file}")
        if wsl is None:
            say(
                "systemd is not running on this host, so nothing starts MTGPU at boot yet. "
                f"Add `{start_cmd}` to the host's boot commands (for example a cron @reboot line)"
            )
    write_release_stamps(prefix, options.state_dir)
    host, port = options.ssh_listen
    say(f"MTGPU listens for SSH on {host}:{port}; host keys:")
    for fp in fingerprints(options.state_dir):
        print(f"    {fp}")
    if args.without:
        say(
            f"installed WITHOUT these OS packages: {args.without.replace(',', ', ')} (listed above "
            "with what does not work without them); install them and run install again"
        )
    say("next: `mtgpu-admin invite NAME` prints a code for a new user")
    return 0


def running_mode(options: Options) -> tuple[int, str] | None:
    """The running daemon's pid and the CLUSTER_MODE it was started with, as it answers
    ``version``; None where none runs, it does not answer, or it is older than that
    answer."""
    from mtgpu.api.client import ApiClient
    from mtgpu.errors import MtgpuError

    pid = running_pid(options.run_dir)
    if not pid:
        return None
    api = ApiClient(options.api_socket, timeout=30)
    try:
        mode = api.call("version").get("cluster_mode")
    except MtgpuError:
        return None
    finally:
        api.close()
    return (pid, mode) if isinstance(mode, str) else None


def restart_command(args: argparse.Namespace) -> str:
    """The command that restarts the daemon on this host: systemd's, or install's
    ``--restart`` with the options this install was given."""
    if systemd_running():
        return "systemctl restart mtgpu"
    # The installed mtgpu-setup has no source to install from: the clone's or bundle's has.
    argv = [str(Path(args.source_root or ".") / "bin" / "mtgpu-setup"), "install", "--yes", "--restart"]
    for opt, value, default in (
        ("--prefix", args.prefix, PREFIX),
        ("--config", args.config, CONFIG),
        ("--bin-dir", args.bin_dir, BIN_DIR),
        ("--unit-dir", args.unit_dir, UNIT_DIR),
        ("--log-file", args.log_file, LOG_FILE),
    ):
        if value != default:
            argv += [opt, value]
    return " ".join(argv)


def refuse_mode_change(options: Options, config: Path, args: argparse.Namespace) -> None:
    """Refuse to leave a running daemon in another CLUSTER_MODE than the file's: only a
    restart changes the mode, and install restarts only for new code or a new unit."""
    running = running_mode(options)
    if running is None or running[1] == options.cluster_mode:
        return
    pid, mode = running
    raise SetupFailed(
        f"the running mtgpu-server (pid {pid}) is {mode} but {config} now says CLUSTER_MODE: "
        f"{options.cluster_mode}, and only a restart changes that; everything else is installed. "
        f"Run `{restart_command(args)}`: only the daemon restarts, tenants' tmux sessions and "
        "running jobs carry on"
    )


def wsl_step(options: Options, *, boot: str, start_command: str, config: str) -> WslReport | None:
    """On a WSL2 host, lock the Windows drives, arrange the start at boot and look for
    NVIDIA's driver (mtgpu.install.wsl); say what was done and how to undo it. None elsewhere."""
    from mtgpu.install.wsl import prepare, wsl_version

    root = host_root()
    v = wsl_version(root)
    if v is None:
        return None
    if v == 1:
        say(
            "WARNING: this is WSL1, which MTGPU does not support (no cgroups, no rootless podman); "
            "convert it in Windows with `wsl --set-version DISTRO 2`"
        )
        return None
    say("WSL2 host: locking the Windows drives away from tenants, arranging the start at boot")
    rep = prepare(
        root,
        lock_drives=options.wsl_lock_drives,
        boot=boot,
        start_command=start_command,
        systemd_running=systemd_running(),
        config=config,
    )
    for line in rep.done:
        say(line)
    for line in rep.warnings:
        say(f"WARNING: {line}")
    for line in rep.undo:
        say(f"to undo, {line}")
    return rep


def _enable_unit_offline(unit: Path) -> None:
    """What ``systemctl enable`` does, for a systemd that is not running yet (WSL before
    its restart with [boot] systemd = true)."""
    wants = unit.parent / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / unit.name
    if not link.is_symlink():
        link.symlink_to(unit)
    say(f"enabled {unit.name} for systemd's next start ({link})")


PROFILE_SCRIPT = "mtgpu-completion.sh"


def share_dir(args: argparse.Namespace) -> Path:
    """Where completions and manual pages are linked: ``--share-dir``, else the
    ``share`` beside ``--bin-dir`` (``/usr/local/share``)."""
    return Path(args.share_dir) if args.share_dir else Path(args.bin_dir).parent / "share"


def profile_dir(args: argparse.Namespace) -> Path:
    """``--profile-dir``, else ``/etc/profile.d`` (beside another ``--bin-dir``: its ``../etc/profile.d``)."""
    if args.profile_dir:
        return Path(args.profile_dir)
    if Path(args.bin_dir) == Path(BIN_DIR):
        return Path("/etc/profile.d")
    return Path(args.bin_dir).parent / "etc" / "profile.d"


def install_shell_files(prefix: Path, share: Path, profile: Path, keep: Collection[str] = ()) -> None:
    """Bash and zsh completion and manual pages of every command, made from their
    argument parsers: written under ``PREFIX/share`` and linked into ``share``
    (``bash-completion/completions``, ``zsh/site-functions``, ``man/manN``), where
    bash-completion, zsh and man look; and a profile script that loads the bash ones in
    every interactive login shell, tenants' terminals included. The commands in
    ``keep`` (a host's own Slurm commands, kept) get none, so that their own completion
    and manual pages are not shadowed."""
    from mtgpu.cmdline import parsers, profile_script, shell_files

    programs = {name: parser for name, parser in parsers().items() if name not in keep}
    own = prefix / "share"
    for rel, text in shell_files(programs).items():
        path = own / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o644)
        link = share / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            if link.is_symlink() and os.readlink(link) == str(path):
                continue
            link.unlink()
        link.symlink_to(path)
    profile.mkdir(parents=True, exist_ok=True)
    script = profile / PROFILE_SCRIPT
    script.write_text(profile_script(str(share), sorted(programs)))
    script.chmod(0o644)
    say(f"shell completion (bash, zsh) and manual pages for {len(programs)} commands in {share}")


def remove_shell_files(prefix: Path, share: Path, profile: Path) -> None:
    """Undo :func:`install_shell_files`: the links into ``PREFIX/share`` and the profile script."""
    own = prefix / "share"
    if own.is_dir():
        for path in own.rglob("*"):
            link = share / path.relative_to(own)
            if link.is_symlink() and os.readlink(link) == str(path):
                link.unlink()
    (profile / PROFILE_SCRIPT).unlink(missing_ok=True)


def build_fast_mtjob(prefix: Path, bin_dir: Path) -> None:
    """Compile the C fast path of ``mt-job submit`` where a C compiler exists.

    It is installed as ``mt-job-fast`` beside the Python ``mt-job`` (which it hands
    every other command to), and becomes the ``mt-job`` on PATH.
    """
    src = Path(__file__).resolve().parent.parent / "cli" / "fastjob.c"
    py = prefix / "venv" / "bin" / "mt-job"
    fast = prefix / "venv" / "bin" / "mt-job-fast"
    cc = shutil.which("cc") or shutil.which("gcc")
    if not (cc and src.exists() and py.exists()):
        say("no C compiler: mt-job stays the Python one (about 0.1 s a call)")
        return
    tmp = fast.with_name(".mt-job-fast.tmp")
    try:
        _run([cc, "-O2", "-o", str(tmp), str(src), f'-DMTGPU_PY_MTJOB="{py}"'])
    except SetupFailed as exc:
        say(f"could not build the C mt-job, keeping the Python one: {exc}")
        return
    os.chmod(tmp, 0o755)
    os.replace(tmp, fast)
    link = bin_dir / "mt-job"
    if link.exists() or link.is_symlink():
        link.unlink()
    link.symlink_to(fast)


def _ensure_cluster_key(config: Path) -> None:
    """In cluster mode without a CLUSTER_KEY, generate one and add it to the file."""
    import secrets

    import yaml

    try:
        raw = yaml.safe_load(config.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return  # the loader reports what is wrong
    if not isinstance(raw, dict) or raw.get("CLUSTER_MODE") != "cluster" or raw.get("CLUSTER_KEY"):
        return
    key = secrets.token_urlsafe(32)
    with open(config, "a") as f:
        f.write(
            f"\n# Generated by mtgpu-setup: copy this file, key included, to every member.\n"
            f"CLUSTER_KEY: {key}\n"
        )
    os.chmod(config, 0o600)
    say(f"generated CLUSTER_KEY in {config}; copy the file to the other members (it is secret)")


def running_pid(run_dir: str) -> int | None:
    try:
        pid = int(Path(run_dir, "mtgpu.pid").read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if b"mtgpu" in cmdline else None


def stop_pid(pid: int, timeout: float = 15) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def open_log(log_file: str) -> int:
    """The daemon's log file for appending, root's alone (0600): it names tenants,
    addresses and keys. A link there is refused, an existing file is made 0600."""
    from mtgpu.logsetup import open_log as open_root_log

    try:
        return open_root_log(log_file)
    except OSError as exc:
        raise SetupFailed(
            str(exc) if exc.errno is None else f"cannot open {log_file}: {exc.strerror}"
        ) from exc


def start_background(server: Path, config: Path, options: Options, log_file: str) -> int:
    """Start ``server`` detached, isolated from the caller: in ``/``, with a clean
    environment, its Python run with ``-I`` (nothing from the admin's current
    directory or ``PYTHON*`` variables is imported)."""
    log = open_log(log_file)
    python = sys.executable
    try:
        proc = spawn(
            # The daemon rotates the file itself (LOG_MAX_SIZE, LOG_KEEP); until its
            # logging is set up, what it prints goes to the same file.
            [python, "-I", str(server), "--config", str(config.resolve()), "--log-file", log_file],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd="/",
            env=dict(ROOT_CHILD_ENV),
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(log)
    run_dir = options.run_dir
    for _ in range(300):
        if running_pid(run_dir) == proc.pid:
            return proc.pid
        if proc.poll() is not None:
            raise SetupFailed(f"mtgpu-server exited with status {proc.returncode}; see {log_file}")
        time.sleep(0.1)
    raise SetupFailed(f"mtgpu-server did not come up within 30s; see {log_file}")


def start(args: argparse.Namespace) -> int:
    """Start the daemon in the background unless it runs (WSL's [boot] command, hosts
    without systemd)."""
    from mtgpu.config import load

    options = load(args.config)
    pid = running_pid(options.run_dir)
    if pid:
        say(f"mtgpu-server already runs (pid {pid})")
        return 0
    pid = start_background(
        Path(sys.executable).parent / "mtgpu-server", Path(args.config), options, args.log_file
    )
    say(f"started mtgpu-server in the background (pid {pid}), logging to {args.log_file}")
    return 0


def wsl(args: argparse.Namespace) -> int:
    """The WSL2 step of install on its own: drives, start at boot, NVIDIA's driver."""
    from mtgpu.config import load

    options = load(args.config)
    start_cmd = f"{Path(args.bin_dir) / 'mtgpu-setup'} start --config {args.config}"
    rep = wsl_step(options, boot=args.wsl_boot, start_command=start_cmd, config=args.config)
    if rep is None:
        raise SetupFailed(
            "this is not a WSL2 host (its kernel release names no "
            "microsoft-standard-WSL2); install does what it needs"
        )
    if rep.boot_systemd and not systemd_running():
        _enable_unit_offline(Path(args.unit_dir) / "mtgpu.service")
    return 1 if any(w.startswith("/") for w in rep.warnings) else 0


def bundle(args: argparse.Namespace) -> int:
    from mtgpu.install.bundle import build

    root = Path(args.source) if args.source else source_root()
    if root is None or not (root / "pyproject.toml").exists():
        raise SetupFailed(
            "bundle needs MTGPU's source: run bin/mtgpu-setup bundle from a checkout or "
            "an unpacked release, or pass --source DIR"
        )
    try:
        tarball = build(
            root,
            Path(args.output),
            python_version=args.python_version,
            platforms=args.platform or [],
            find_links=args.find_links or [],
            no_index=args.no_index,
            say=say,
        )
    except BundleError as exc:
        raise SetupFailed(str(exc)) from exc
    manifest = read_manifest_of_tarball(tarball)
    size = tarball.stat().st_size / 2**20
    say(
        f"wrote {tarball} ({size:.0f} MiB, {len(manifest['wheels'])} wheels, for Python "
        f"{manifest['python']} on {manifest['machine']})"
    )
    top = f"mtgpu-{manifest['version']}"
    print(
        f"Copy it to the GPU host and install from it, with no registry needed there:\n"
        f"    scp {tarball.name} root@gpu01:\n"
        f"    ssh root@gpu01 'tar xzf {tarball.name} && {top}/bin/mtgpu-setup install --yes'",
        flush=True,
    )
    return 0


def read_manifest_of_tarball(tarball: Path) -> dict:
    import tarfile

    with tarfile.open(tarball) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/BUNDLE.json"))
        f = tar.extractfile(member)
        assert f is not None
        return json.loads(f.read())


# -------------------------------------------------------- status, uninstall


def check(args: argparse.Namespace) -> int:
    """Validate the configuration (exit 2 naming the key and line if it is bad)."""
    from mtgpu.config import load, show

    options = load(args.config)
    if args.show:
        print("\n".join(show(options)), flush=True)
    else:
        print(f"{options.source or 'defaults'}: OK", flush=True)
    return 0


def status(args: argparse.Namespace) -> int:
    from mtgpu.api.client import ApiClient
    from mtgpu.config import load
    from mtgpu.errors import MtgpuError
    from mtgpu.sshd.server import fingerprints

    options = load(args.config)
    pid = running_pid(options.run_dir)
    host, port = options.ssh_listen
    version = "unknown"
    published = None
    retention = None
    certificate = None
    if pid:
        try:
            api = ApiClient(options.api_socket, timeout=30)
            version = f"mtgpu {api.call('version')['version']}"
            published = api.call("published")
            retention = api.call("retention.status")
            if options.cluster_mode == "cluster":
                certificate = api.call("ssh.host_certificate")
        except MtgpuError as exc:
            if version == "unknown":
                version = f"not answering ({exc})"
    lines = [
        f"daemon:     {f'running (pid {pid})' if pid else 'not running'}",
        f"version:    {version}",
        f"config:     {options.source or 'defaults (no file)'}",
        f"ssh:        {host}:{port}",
        f"server:     {options.server_name}",
        f"state:      {options.state_dir}",
        "host keys:",
    ] + [f"  {fp}" for fp in fingerprints(options.state_dir)]
    lines += host_certificate_lines(certificate)
    if pid and version.startswith("mtgpu ") and version != VERSION:
        lines.insert(2, f"installed:  {VERSION} (the daemon runs the older one until it restarts)")
    lines += published_lines(options, published)
    lines += retention_lines(options, retention)
    refused = None
    if pid:
        try:
            refused = ApiClient(options.api_socket, timeout=30).call("isolation")["refused"]
        except MtgpuError:
            pass  # not answering (said above), or a daemon older than this operation
    lines += isolation_lines(options, refused)
    print("\n".join(lines))
    return 0 if pid else 3


def host_certificate_lines(c: dict | None) -> list[str]:
    """A member's host certificate: until when it is valid, or a warning when it is
    near its end without renewal (the cluster CA's trust in this host ends then)."""
    if c is None:
        return []
    until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(c["valid_before"]))
    if c["warning"]:
        return [f"host cert:  WARNING: {c['warning']}"]
    return [f"host cert:  signed by the cluster's host CA, valid until {until} (renewed while running)"]


def retention_lines(options: Any, r: dict | None) -> list[str]:
    """TENANT_RETENTION_DAYS, the tenants it locked and any removal that failed."""
    days = options.tenant_retention_days
    if days is None:
        return ["retention:  off (TENANT_RETENTION_DAYS is not set)"]
    out = [f"retention:  tenants inactive {days:g} days are locked, then removed"]
    if r is None:
        return out

    def when(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))

    for t in r["locked"]:
        f = t.get("removal_failed")
        out.append(
            f"  {t['user']}: locked since {when(t['locked'])}"
            + (
                f"; REMOVAL FAILED {f['attempts']} time(s), retried {when(f['retry_at'])}: {f['reason']}"
                if f
                else ""
            )
        )
    return out


def isolation_lines(options: Options, refused: list[dict] | None = None) -> list[str]:
    """What tenant sessions are fenced with on this host, what this kernel lacks, and
    the tenants' fence parts the running daemon cannot set up (``refused``, from its
    ``isolation`` operation), whose sessions and jobs it refuses."""
    from mtgpu.schedd.fence import from_options

    fence = from_options(options)
    return (
        [
            "isolation:",
            f"  {fence.describe()}",
            f"  {fence.network.describe() if fence.network else 'network: shared'}",
        ]
        + [f"  WARNING: {line}" for line in fence.lacking()]
        + [
            f"  REFUSED: uid {r['uid']}: its {r['part']} cannot be set up (refused "
            f"{r['refused']} time(s) since "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(r['since']))}): {r['cause']}; "
            f"{r['fix']}"
            for r in refused or []
        ]
    )


def published_lines(options: Options, published: dict[str, Any] | None) -> list[str]:
    """The datasets and interpreters, as the daemon published them or, with the daemon
    down, as they would be (nothing is mounted then)."""
    from mtgpu.accounts.published import plan_datasets, plan_interpreters

    if published is None:
        published = {
            "datasets": [d.to_dict() for d in plan_datasets(options.datasets_directories)],
            "interpreters": [i.to_dict() for i in plan_interpreters(options.python_interpreters)],
        }
    out = ["datasets:" + ("" if published["datasets"] else " none")]
    for d in published["datasets"]:
        out.append(
            f"  {d['path']}  from {d['source']}, read-only"
            if d["ok"]
            else f"  {d['name']}: NOT PUBLISHED: {d['problem']}"
        )
    out.append("python interpreters:" + ("" if published["interpreters"] else " none"))
    for i in published["interpreters"]:
        out.append(
            f"  {i['name']}  Python {i['version']}  {i['path']}"
            if i["ok"]
            else f"  {i['name']}: NOT PUBLISHED: {i['problem']}"
        )
    return out


def gpu_check(args: argparse.Namespace) -> int:
    """Run each probe, then a one-device job under its visibility setting; say what works."""
    from mtgpu.config import load
    from mtgpu.gpuinfo.check import format_check
    from mtgpu.gpuinfo.check import gpu_check as check

    results = check(load(args.config))
    print(format_check(results))
    return 0 if all(r.ok for r in results) else 1


def podman_check(args: argparse.Namespace) -> int:
    """What rootless podman needs on this host (mtgpu.workspaces.hostcheck); --fix sets it up."""
    from mtgpu.config import load
    from mtgpu.workspaces.hostcheck import check

    findings, done = check(load(args.config), apply=args.fix)
    for line in done:
        say(line)
    print("\n".join(f.line() for f in findings))
    return 0 if all(f.ok for f in findings) else 1


def uninstall(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise SetupFailed("uninstall needs root: run it with sudo")
    options = None
    try:
        from mtgpu.config import load

        options = load(args.config)
    except Exception:  # noqa: BLE001 - uninstall must work with a broken config too
        pass
    unit = Path(args.unit_dir) / "mtgpu.service"
    if systemd_running() and unit.exists():
        run(["systemctl", "disable", "--now", "mtgpu.service"], check=False)
    run_dir = options.run_dir if options else "/run/mtgpu"
    pid = running_pid(run_dir)
    if pid:
        stop_pid(pid)
        say(f"stopped mtgpu-server (pid {pid})")
    # The read-only mounts of datasets and interpreters outlive the daemon; not MTGPU.
    unpublish(run_dir, Path(args.prefix))
    if unit.exists():
        unit.unlink()
        if systemd_running():
            run(["systemctl", "daemon-reload"], check=False)
    for name in linked_scripts():
        link = Path(args.bin_dir) / name
        if link.is_symlink() and str(Path(args.prefix)) in os.readlink(link):
            link.unlink()
    remove_shell_files(Path(args.prefix), share_dir(args), profile_dir(args))
    shutil.rmtree(args.prefix, ignore_errors=True)
    say(f"removed {args.prefix}, the links in {args.bin_dir}, the completions and manual pages, and the unit")
    if args.purge:
        if options is not None:
            shutil.rmtree(options.state_dir, ignore_errors=True)
            shutil.rmtree(options.run_dir, ignore_errors=True)
        Path(args.config).unlink(missing_ok=True)
        say(
            "--purge: removed the configuration and the state (users, invites, keys). "
            "Tenant accounts and their homes are kept"
        )
    else:
        home = options.tenant_home_root if options else "/home"
        state = options.state_dir if options else "/var/lib/mtgpu"
        say(
            f"kept {args.config}, the state in {state} and tenant homes under {home}; "
            "`uninstall --purge` also removes the configuration and state"
        )
    return 0


#: Set for the virtualenv's ``unpublish`` that stage one asks: it never asks again.
_UNPUBLISH_ASKED = "MTGPU_UNPUBLISH_ASKED"


def unpublish(run_dir: str, prefix: Path) -> None:
    """Unmount the published datasets and interpreters (what ``RUN_DIR/published.json``
    records)."""
    try:
        from mtgpu.accounts.published import Publisher
    except ImportError as exc:
        # Stage one's system Python lacks the libraries: the virtualenv's has them. It
        # is asked once, and never by itself: a half-installed virtualenv lacks them too.
        venv = prefix / "venv"
        py = venv / "bin" / "python"
        inside = os.path.realpath(sys.prefix) == os.path.realpath(venv)
        if py.exists() and not inside and not os.environ.get(_UNPUBLISH_ASKED):
            env = {**build_env(), _UNPUBLISH_ASKED: "1"}
            call([str(py), "-I", "-m", "mtgpu.install.setup", "unpublish", "--run-dir", run_dir], env=env)
        else:
            say(
                f"skipped unmounting published datasets and interpreters ({exc}); the virtualenv is incomplete"
            )
        return
    undone = Publisher(run_dir).undo_all()
    if undone:
        say(f"unmounted the published datasets and interpreters: {', '.join(undone)}")


# ---------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtgpu-setup", description="Install and manage MTGPU on this host.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--config",
            default=os.environ.get("MTGPU_CONFIG", CONFIG),
            help=f"configuration file (default {CONFIG})",
        )
        sp.add_argument("--prefix", default=PREFIX, help=f"install location (default {PREFIX})")
        sp.add_argument("--bin-dir", default=BIN_DIR, help=f"where command links go (default {BIN_DIR})")
        sp.add_argument("--unit-dir", default=UNIT_DIR, help=f"systemd unit directory (default {UNIT_DIR})")
        sp.add_argument(
            "--share-dir",
            help="where shell completions and manual pages are linked (default: the share "
            "directory beside --bin-dir, /usr/local/share)",
        )
        sp.add_argument(
            "--profile-dir",
            help="where the script that loads completion in login shells goes (default /etc/profile.d)",
        )

    i = sub.add_parser("install", help="install or upgrade, unattended, and start MTGPU")
    common(i)
    i.add_argument("--yes", "-y", action="store_true", help="confirm: run unattended")
    i.add_argument("--no-start", action="store_true", help="install but do not start")
    i.add_argument(
        "--restart",
        action="store_true",
        help="restart the running daemon even if nothing changed (tenants' sessions and jobs are kept)",
    )
    i.add_argument("--force", action="store_true", help="reinstall the package even if unchanged")
    i.add_argument("--wheelhouse", help="install from this directory of wheels, offline")
    i.add_argument(
        "--skip-os-packages",
        action="store_true",
        help="install no OS package and go on without missing ones (they are listed)",
    )
    i.add_argument(
        "--log-file", default=LOG_FILE, help=f"daemon log where systemd is absent (default {LOG_FILE})"
    )
    wsl_boot: dict[str, Any] = dict(
        choices=("auto", "command", "systemd"),
        default="auto",
        help="on WSL2, how MTGPU starts at boot: systemd where it runs or wsl.conf "
        "turns it on, else a [boot] command (auto, the default); or force one",
    )
    i.add_argument("--wsl-boot", **wsl_boot)
    i.add_argument("--stage2", action="store_true", help=argparse.SUPPRESS)
    i.add_argument("--code-changed", action="store_true", help=argparse.SUPPRESS)
    i.add_argument("--source-root", help=argparse.SUPPRESS)  # the clone or bundle stage one ran from
    i.add_argument("--without", help=argparse.SUPPRESS)
    b = sub.add_parser(
        "bundle",
        help="make the offline release tarball: MTGPU and every dependency's wheel, to copy up with scp",
    )
    b.add_argument("--output", required=True, help="directory to write the tarball into")
    b.add_argument(
        "--python-version", help="the target's Python as MAJOR.MINOR (default: this Python's); wheels only"
    )
    b.add_argument(
        "--platform",
        action="append",
        help="the target's wheel platform, such as manylinux2014_x86_64 or "
        "manylinux_2_28_aarch64 (repeatable; default: this machine)",
    )
    b.add_argument(
        "--find-links",
        action="append",
        help="also take wheels from this directory (repeatable), such as an older bundle's wheels/",
    )
    b.add_argument("--no-index", action="store_true", help="use --find-links only, no registry")
    b.add_argument("--source", help="the MTGPU source to bundle (default: the one this runs from)")
    st = sub.add_parser(
        "start",
        help="start the daemon in the background unless it runs "
        "(hosts without systemd; WSL's [boot] command)",
    )
    common(st)
    st.add_argument("--log-file", default=LOG_FILE, help=f"daemon log (default {LOG_FILE})")
    w = sub.add_parser(
        "wsl",
        help="WSL2: lock the Windows drives, start at boot, check NVIDIA's driver (install does this too)",
    )
    common(w)
    w.add_argument("--wsl-boot", **wsl_boot)
    s = sub.add_parser("status", help="is the daemon running, its version, port and host keys")
    common(s)
    ck = sub.add_parser(
        "check", help="validate the configuration; --show prints every key's value and origin"
    )
    common(ck)
    ck.add_argument(
        "--show",
        action="store_true",
        help="print every key's effective value and where it comes from (a file line or the default)",
    )
    rl = sub.add_parser(
        "reload", help="make the daemon reread its configuration; names the changed keys that need a restart"
    )
    common(rl)
    rl.add_argument("--json", action="store_true", help="print the daemon's answer as JSON")
    g = sub.add_parser("gpu-check", help="test every GPU probe, built-in and configured")
    common(g)
    pc = sub.add_parser("podman-check", help="what rootless podman needs here; --fix sets it up")
    common(pc)
    pc.add_argument("--fix", action="store_true", help="set up what can be set up (as root)")
    u = sub.add_parser("uninstall", help="stop and remove MTGPU (keeps config, state and homes)")
    common(u)
    u.add_argument("--purge", action="store_true", help="also remove the configuration and state")
    # uninstall's second half, run by uninstall itself: no help, so no line in the list.
    up = sub.add_parser("unpublish")
    up.add_argument("--run-dir", required=True)
    return with_examples(p, SETUP_EXAMPLES)


#: The examples at the end of each command's --help (and manual page).
SETUP_EXAMPLES = {
    "": "mtgpu-setup install --yes\nmtgpu-setup status\nmtgpu-setup check --show",
    "install": "mtgpu-setup install --yes\nmtgpu-setup install --yes --wheelhouse ./wheels --no-start",
    "bundle": "mtgpu-setup bundle --output /tmp/release",
    "start": "mtgpu-setup start --log-file /var/log/mtgpu.log",
    "wsl": "mtgpu-setup wsl --wsl-boot systemd",
    "status": "mtgpu-setup status",
    "check": "mtgpu-setup check\nmtgpu-setup check --show --config /etc/mtgpu/mtgpu.yaml\n"
    "mtgpu-setup --check --show      # the same, spelt as mtgpu-server --check",
    "reload": "mtgpu-setup reload\nmtgpu-setup reload --json",
    "gpu-check": "mtgpu-setup gpu-check",
    "podman-check": "mtgpu-setup podman-check\nmtgpu-setup podman-check --fix",
    "uninstall": "mtgpu-setup uninstall\nmtgpu-setup uninstall --purge",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--check"]:  # as mtgpu-server --check and sshd -t spell it
        argv[0] = "check"
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "install":
            return stage_two(args) if args.stage2 else stage_one(args)
        if args.cmd == "status":
            return status(args)
        if args.cmd == "check":
            return check(args)
        if args.cmd == "reload":
            from mtgpu.cli.reload import reload

            return reload(args)
        if args.cmd == "uninstall":
            return uninstall(args)
        if args.cmd == "gpu-check":
            return gpu_check(args)
        if args.cmd == "podman-check":
            return podman_check(args)
        if args.cmd == "unpublish":
            unpublish(args.run_dir, Path(PREFIX))
            return 0
        if args.cmd == "bundle":
            return bundle(args)
        if args.cmd == "start":
            return start(args)
        if args.cmd == "wsl":
            return wsl(args)
    except SetupFailed as exc:
        say(str(exc))
        return 1
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - e.g. ConfigError from status
        from mtgpu.errors import ConfigError

        if isinstance(exc, ConfigError):
            say(str(exc))
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
