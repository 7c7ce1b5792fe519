"""``mtgpu-setup``: headless, idempotent install, status and uninstall.

``install`` runs in two stages. The first uses only the standard library, so it
works from a fresh checkout with the system Python: it installs what the host needs,
builds the virtualenv under ``--prefix`` from ``/usr/bin/python3`` (never from an
interpreter under /root, so tenants can run the tools) and installs MTGPU into it.
The second stage runs inside that virtualenv: configuration, host keys, links,
the systemd unit, and start.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

PREFIX = "/opt/mtgpu"
CONFIG = "/etc/mtgpu/mtgpu.yaml"
BIN_DIR = "/usr/local/bin"
UNIT_DIR = "/etc/systemd/system"
SYSTEM_PYTHON = "/usr/bin/python3"
LOG_FILE = "/var/log/mtgpu.log"
SCRIPTS = ("mtgpu-server", "mtgpu-setup", "mtgpu-admin", "mtgpu-shell", "mtcode-admin", "mt-job",
           "mt-container", "mt-podman", "mt-python", "mt-attach", "remotegpu-cli")
# Debian/Ubuntu packages the host needs, and what needs them.
OS_PACKAGES = {"tmux": "tmux", "sftp-server": "openssh-sftp-server", "setsid": "util-linux",
               "useradd": "passwd", "newuidmap": "uidmap",
               # The C fast paths: mt-job's submit and list (fastjob.c) and the job-start
               # helper (jobinit.c). Without them MTGPU works, only slower.
               "cc": "gcc"}


def say(msg: str) -> None:
    print(f"mtgpu-setup: {msg}", flush=True)


class SetupFailed(Exception):
    pass


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise SetupFailed(f"`{' '.join(argv)}` failed ({proc.returncode}):\n"
                          f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
    return proc


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
    return Path("/run/systemd/system").is_dir()


# ---------------------------------------------------------------- stage one

def ensure_os_packages(assume_yes: bool) -> None:
    missing = sorted({pkg for cmd, pkg in OS_PACKAGES.items() if not _have(cmd)})
    venv_ok = subprocess.run([SYSTEM_PYTHON, "-c", "import ensurepip, venv"],
                             capture_output=True).returncode == 0
    if not venv_ok:
        missing.append("python3-venv")
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise SetupFailed(f"these packages are missing and there is no apt-get to install them: "
                          f"{', '.join(missing)}. Install them, then run install again")
    say(f"installing OS packages: {', '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(["apt-get", "install", "-y", "-q", *missing], capture_output=True,
                          text=True, env=env)
    if proc.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env)
        _run(["apt-get", "install", "-y", "-q", *missing], env=env)


def _have(cmd: str) -> bool:
    if cmd == "sftp-server":
        return any(Path(p).exists() for p in ("/usr/lib/openssh/sftp-server",
                                              "/usr/libexec/openssh/sftp-server"))
    return shutil.which(cmd) is not None or Path("/usr/sbin", cmd).exists()


def build_venv(prefix: Path, root: Path, *, wheelhouse: str | None, force: bool) -> bool:
    """Create ``prefix/venv`` and install MTGPU from ``root``; True if anything changed."""
    venv = prefix / "venv"
    py = venv / "bin" / "python"
    stamp = prefix / "installed-source.sha256"
    digest = source_digest(root)
    if py.exists() and stamp.exists() and stamp.read_text().strip() == digest and not force:
        return False
    prefix.mkdir(parents=True, exist_ok=True)
    os.chmod(prefix, 0o755)
    if not py.exists():
        say(f"creating the virtualenv {venv} from {SYSTEM_PYTHON}")
        _run([SYSTEM_PYTHON, "-m", "venv", str(venv)])
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if wheelhouse:
        pip += ["--no-index", "--find-links", wheelhouse]
    say(f"installing MTGPU from {root} into {venv}")
    _run(pip + [str(root)])
    # Tenants run the tools from here: everything must be world-readable.
    _run(["chmod", "-R", "a+rX", str(prefix)])
    docs = root / "docs"
    if docs.is_dir():
        shutil.copytree(docs, prefix / "docs", dirs_exist_ok=True)
    stamp.write_text(digest + "\n")
    return True


def stage_one(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise SetupFailed("install needs root: run it with sudo")
    if not args.yes:
        raise SetupFailed("install changes this host; pass --yes to confirm (it is unattended)")
    root = source_root()
    if root is None:
        raise SetupFailed("cannot find the MTGPU source next to this program; run "
                          "bin/mtgpu-setup from a checkout or an unpacked release")
    if not args.skip_os_packages:
        ensure_os_packages(args.yes)
    changed = build_venv(Path(args.prefix), root, wheelhouse=args.wheelhouse, force=args.force)
    py = str(Path(args.prefix) / "venv" / "bin" / "python")
    argv = [py, "-m", "mtgpu.cli.setup", "install", "--yes", "--stage2",
            "--prefix", args.prefix, "--config", args.config, "--bin-dir", args.bin_dir,
            "--unit-dir", args.unit_dir]
    if changed:
        argv.append("--code-changed")
    if args.no_start:
        argv.append("--no-start")
    argv += ["--log-file", args.log_file]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.call(argv, env=env)


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
    if options.containers.enabled and os.geteuid() == 0:
        podman_check(argparse.Namespace(config=str(config), fix=True))  # workspaces' host needs
    for name in SCRIPTS:
        src = prefix / "venv" / "bin" / name
        if not src.exists():
            continue
        link = Path(args.bin_dir) / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and os.readlink(link) == str(src):
            continue
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(src)
    build_fast_mtjob(prefix, Path(args.bin_dir))
    unit_text = ((Path(__file__).resolve().parent.parent / "data" / "mtgpu.service").read_text()
                 .replace("@PREFIX@", str(prefix)).replace("@CONFIG@", str(config)))
    unit = Path(args.unit_dir) / "mtgpu.service"
    unit_changed = not unit.exists() or unit.read_text() != unit_text
    if unit_changed:
        unit.parent.mkdir(parents=True, exist_ok=True)
        unit.write_text(unit_text)
    restart = args.code_changed or unit_changed
    if args.no_start:
        say("installed; not started (--no-start)")
    elif systemd_running():
        _run(["systemctl", "daemon-reload"])
        _run(["systemctl", "enable", "mtgpu.service"])
        _run(["systemctl", "restart" if restart else "start", "mtgpu.service"])
        say("mtgpu.service is enabled and running; it starts at boot")
    else:
        pid = running_pid(options.run_dir)
        if pid and restart:
            stop_pid(pid)
            pid = None
        if pid:
            say(f"mtgpu-server already runs (pid {pid})")
        else:
            pid = start_background(prefix, config, options, args.log_file)
            say(f"started mtgpu-server in the background (pid {pid}), logging to {args.log_file}")
        say("systemd is not running on this host, so nothing starts MTGPU at boot yet. "
            f"Add `{Path(args.bin_dir) / 'mtgpu-server'} --config {config}` to the host's boot "
            "commands (for example WSL's [boot] command in /etc/wsl.conf, or a cron @reboot line)")
    host, port = options.ssh_listen
    say(f"MTGPU listens for SSH on {host}:{port}; host keys:")
    for fp in fingerprints(options.state_dir):
        print(f"    {fp}")
    say("next: `mtgpu-admin invite NAME` prints a code for a new user")
    return 0


def build_fast_mtjob(prefix: Path, bin_dir: Path) -> None:
    """Compile the C fast path of ``mt-job submit`` where a C compiler exists.

    It is installed as ``mt-job-fast`` beside the Python ``mt-job`` (which it hands
    every other command to), and becomes the ``mt-job`` on PATH.
    """
    src = Path(__file__).resolve().parent / "fastjob.c"
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
        f.write(f"\n# Generated by mtgpu-setup: copy this file, key included, to every member.\n"
                f"CLUSTER_KEY: {key}\n")
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


def start_background(prefix: Path, config: Path, options: object, log_file: str) -> int:
    log = open(log_file, "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen([str(prefix / "venv" / "bin" / "mtgpu-server"), "--config", str(config)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True, close_fds=True)
    run_dir = getattr(options, "run_dir")
    for _ in range(300):
        if running_pid(run_dir) == proc.pid:
            return proc.pid
        if proc.poll() is not None:
            raise SetupFailed(f"mtgpu-server exited with status {proc.returncode}; see {log_file}")
        time.sleep(0.1)
    raise SetupFailed(f"mtgpu-server did not come up within 30s; see {log_file}")


# -------------------------------------------------------- status, uninstall

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
    if pid:
        try:
            api = ApiClient(options.api_socket, timeout=30)
            version = api.call("version")["version"]
            published = api.call("published")
        except MtgpuError as exc:
            if version == "unknown":
                version = f"not answering ({exc})"
    lines = [f"daemon:     {'running (pid %d)' % pid if pid else 'not running'}",
             f"version:    {version}",
             f"config:     {options.source or 'defaults (no file)'}",
             f"ssh:        {host}:{port}",
             f"server:     {options.server_name}",
             f"state:      {options.state_dir}",
             "host keys:"] + [f"  {fp}" for fp in fingerprints(options.state_dir)]
    lines += published_lines(options, published)
    print("\n".join(lines))
    return 0 if pid else 3


def published_lines(options: object, published: dict | None) -> list[str]:
    """The datasets and interpreters, as the daemon published them or, with the daemon
    down, as they would be (nothing is mounted then)."""
    from mtgpu.accounts.published import plan_datasets, plan_interpreters

    if published is None:
        published = {"datasets": [d.to_dict() for d in plan_datasets(
                         getattr(options, "datasets_directories"))],
                     "interpreters": [i.to_dict() for i in plan_interpreters(
                         getattr(options, "python_interpreters"))]}
    out = ["datasets:" + ("" if published["datasets"] else " none")]
    for d in published["datasets"]:
        out.append(f"  {d['path']}  from {d['source']}, read-only" if d["ok"] else
                   f"  {d['name']}: NOT PUBLISHED: {d['problem']}")
    out.append("python interpreters:" + ("" if published["interpreters"] else " none"))
    for i in published["interpreters"]:
        out.append(f"  {i['name']}  Python {i['version']}  {i['path']}" if i["ok"] else
                   f"  {i['name']}: NOT PUBLISHED: {i['problem']}")
    return out


def gpu_check(args: argparse.Namespace) -> int:
    """Run each probe, then a one-device job under its visibility setting; say what works."""
    from mtgpu.config import load
    from mtgpu.gpuinfo.check import format_check, gpu_check as check

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
        subprocess.run(["systemctl", "disable", "--now", "mtgpu.service"], capture_output=True)
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
            subprocess.run(["systemctl", "daemon-reload"], capture_output=True)
    for name in SCRIPTS:
        link = Path(args.bin_dir) / name
        if link.is_symlink() and str(Path(args.prefix)) in os.readlink(link):
            link.unlink()
    shutil.rmtree(args.prefix, ignore_errors=True)
    say(f"removed {args.prefix}, the links in {args.bin_dir} and the unit")
    if args.purge:
        if options is not None:
            shutil.rmtree(options.state_dir, ignore_errors=True)
            shutil.rmtree(options.run_dir, ignore_errors=True)
        Path(args.config).unlink(missing_ok=True)
        say("--purge: removed the configuration and the state (users, invites, keys). "
            "Tenant accounts and their homes are kept")
    else:
        home = options.tenant_home_root if options else "/home"
        state = options.state_dir if options else "/var/lib/mtgpu"
        say(f"kept {args.config}, the state in {state} and tenant homes under {home}; "
            "`uninstall --purge` also removes the configuration and state")
    return 0


def unpublish(run_dir: str, prefix: Path) -> None:
    """Unmount the published datasets and interpreters (what ``RUN_DIR/published.json``
    records)."""
    try:
        from mtgpu.accounts.published import Publisher
    except ImportError:  # stage one's system Python: the virtualenv has the libraries
        py = prefix / "venv" / "bin" / "python"
        if py.exists():
            subprocess.call([str(py), "-m", "mtgpu.cli.setup", "unpublish", "--run-dir", run_dir])
        return
    undone = Publisher(run_dir).undo_all()
    if undone:
        say(f"unmounted the published datasets and interpreters: {', '.join(undone)}")


# ---------------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtgpu-setup", description="Install and manage MTGPU on this host.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", default=os.environ.get("MTGPU_CONFIG", CONFIG),
                        help=f"configuration file (default {CONFIG})")
        sp.add_argument("--prefix", default=PREFIX, help=f"install location (default {PREFIX})")
        sp.add_argument("--bin-dir", default=BIN_DIR, help=f"where command links go (default {BIN_DIR})")
        sp.add_argument("--unit-dir", default=UNIT_DIR, help=f"systemd unit directory (default {UNIT_DIR})")

    i = sub.add_parser("install", help="install or upgrade, unattended, and start MTGPU")
    common(i)
    i.add_argument("--yes", "-y", action="store_true", help="confirm: run unattended")
    i.add_argument("--no-start", action="store_true", help="install but do not start")
    i.add_argument("--force", action="store_true", help="reinstall the package even if unchanged")
    i.add_argument("--wheelhouse", help="install from this directory of wheels, offline")
    i.add_argument("--skip-os-packages", action="store_true", help="do not install OS packages")
    i.add_argument("--log-file", default=LOG_FILE,
                   help=f"daemon log where systemd is absent (default {LOG_FILE})")
    i.add_argument("--stage2", action="store_true", help=argparse.SUPPRESS)
    i.add_argument("--code-changed", action="store_true", help=argparse.SUPPRESS)
    s = sub.add_parser("status", help="is the daemon running, its version, port and host keys")
    common(s)
    g = sub.add_parser("gpu-check", help="test every GPU probe, built-in and configured")
    common(g)
    pc = sub.add_parser("podman-check", help="what rootless podman needs here; --fix sets it up")
    common(pc)
    pc.add_argument("--fix", action="store_true", help="set up what can be set up (as root)")
    u = sub.add_parser("uninstall", help="stop and remove MTGPU (keeps config, state and homes)")
    common(u)
    u.add_argument("--purge", action="store_true", help="also remove the configuration and state")
    up = sub.add_parser("unpublish", help=argparse.SUPPRESS)  # uninstall's second half
    up.add_argument("--run-dir", required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "install":
            return stage_two(args) if args.stage2 else stage_one(args)
        if args.cmd == "status":
            return status(args)
        if args.cmd == "uninstall":
            return uninstall(args)
        if args.cmd == "gpu-check":
            return gpu_check(args)
        if args.cmd == "podman-check":
            return podman_check(args)
        if args.cmd == "unpublish":
            unpublish(args.run_dir, Path(PREFIX))
            return 0
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
