"""Datasets and Python interpreters published read-only to every tenant.

- Each ``DATASETS_DIRECTORIES`` entry SOURCE is bound read-only over itself and at
  ``/datasets/NAME`` (NAME: its directory's name), so a tenant can write to it
  neither way, whatever the files' modes. ``/datasets`` is a small tmpfs that holds
  the mount points, unless the host already has a ``/datasets`` with files in it.
  Every tenant home gets a ``datasets`` link to ``/datasets``.
- Each ``PYTHON_INTERPRETERS`` entry is run once (as ``nobody``, so an interpreter a
  tenant could not run is found out) to learn its version and prefix, and named
  from its version (``python3.11``) unless the entry names it. A prefix of its own
  (not ``/usr``, ``/usr/local`` or ``/``, which the package manager owns) is bound
  read-only over itself, like a dataset.

A missing directory or a broken interpreter is a :attr:`problem` of its entry,
logged and shown by ``mtgpu-setup status``, and skipped; it never stops the daemon.

What was mounted is recorded in ``RUN_DIR/published.json`` so that a changed
configuration (SIGHUP, restart) and ``mtgpu-setup uninstall`` undo exactly that.
The daemon leaves the mounts in place when it stops: running jobs keep reading the
datasets, and nothing becomes writable while it restarts.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mtgpu.accounts import mounts
from mtgpu.config import InterpreterSpec, Options
from mtgpu.errors import CommandError, MountError
from mtgpu.fsafe import open_trusted, untrusted_component
from mtgpu.proc import run

log = logging.getLogger("mtgpu.accounts.published")

DATASETS_ROOT = "/datasets"
HOME_LINK = "datasets"
TMPFS_DEVICE = "mtgpu-datasets"
RECORD = "published.json"
# Prefixes the host's package manager owns: never bound read-only over themselves.
SYSTEM_PREFIXES = ("/", "/usr", "/usr/local")
NOBODY = 65534

# Run by each interpreter: what it is. Works on any Python 3.
PROBE = (
    "import json, sys, importlib.util as u; print(json.dumps({"
    "'version': '%d.%d.%d' % sys.version_info[:3], 'prefix': sys.prefix, "
    "'venv': u.find_spec('venv') is not None, 'pip': u.find_spec('ensurepip') is not None}))"
)


@dataclass(frozen=True)
class Dataset:
    """A published dataset: ``source`` as configured, seen by tenants at ``path``."""

    name: str
    source: str
    path: str
    ok: bool
    problem: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Interpreter:
    """A published interpreter. ``pip``: its venvs can have pip (``ensurepip`` is there)."""

    name: str
    path: str
    ok: bool
    version: str = ""
    prefix: str = ""
    pip: bool = False
    read_only: bool = False
    problem: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Published:
    datasets: tuple[Dataset, ...] = ()
    interpreters: tuple[Interpreter, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "datasets": [d.to_dict() for d in self.datasets],
            "interpreters": [i.to_dict() for i in self.interpreters],
        }

    def problems(self) -> list[str]:
        """One line per entry that is not published, saying why."""
        return [f"dataset {d.name}: {d.problem}" for d in self.datasets if not d.ok] + [
            f"interpreter {i.name}: {i.problem}" for i in self.interpreters if not i.ok
        ]


# ------------------------------------------------------------ interpreters


def probe(path: str, timeout: float = 10) -> dict[str, Any]:
    """Run the interpreter at ``path`` as ``nobody``; its version and prefix, or a problem."""
    if not os.path.exists(path):
        return {"problem": f"{path} does not exist; install it or remove it from PYTHON_INTERPRETERS"}
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        return {"problem": f"{path} is not an executable file; fix PYTHON_INTERPRETERS"}
    try:
        out = run(
            [path, "-I", "-c", PROBE],
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            cwd="/",
            timeout=timeout,
        )
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except CommandError as exc:
        detail = (exc.stderr.strip().splitlines() or ["no output"])[-1]
        status = "could not start" if exc.returncode is None else f"exited {exc.returncode}"
        return {
            "problem": f"{path} does not run for tenants (it {status}: {detail}); an "
            "interpreter must be readable and executable by every user"
        }
    except (ValueError, IndexError):
        return {"problem": f"{path} does not look like Python 3 (it did not say its version)"}
    if not info.get("venv"):
        return {
            "problem": f"{path} (Python {info.get('version')}) has no venv module; "
            "install the full Python (Debian: python3-venv)"
        }
    return info


def version_name(version: str) -> str:
    """The name an unnamed interpreter gets.

    >>> version_name("3.11.2")
    'python3.11'
    """
    return "python" + ".".join(version.split(".")[:2])


def plan_interpreters(
    specs: Sequence[InterpreterSpec], probe_fn: Callable[[str], dict[str, Any]] = probe
) -> list[Interpreter]:
    """Probe each entry and name it; a later entry whose name is taken is not published."""
    out: list[Interpreter] = []
    taken: dict[str, str] = {s.name: s.path for s in specs if s.name}
    for s in specs:
        info = probe_fn(s.path)
        if "problem" in info:
            out.append(Interpreter(s.name or s.path, s.path, False, problem=info["problem"]))
            continue
        name = s.name or version_name(info["version"])
        if taken.setdefault(name, s.path) != s.path:
            out.append(
                Interpreter(
                    name,
                    s.path,
                    False,
                    info["version"],
                    info["prefix"],
                    problem=f"{s.path} would be named {name}, which {taken[name]} "
                    f"has; give it a name of its own (NAME: {s.path})",
                )
            )
            continue
        prefix = os.path.normpath(info["prefix"])
        out.append(
            Interpreter(
                name,
                s.path,
                True,
                info["version"],
                prefix,
                bool(info.get("pip")),
                read_only=prefix not in SYSTEM_PREFIXES,
            )
        )
    return out


# --------------------------------------------------------------- datasets


def plan_datasets(sources: Iterable[str], root: str = DATASETS_ROOT) -> list[Dataset]:
    out = []
    for src in sources:
        name = Path(src).name
        path = f"{root}/{name}"
        if not os.path.isdir(src):
            why = "does not exist" if not os.path.lexists(src) else "is not a directory"
            out.append(
                Dataset(
                    name, src, path, False, f"{src} {why}; create it or remove it from DATASETS_DIRECTORIES"
                )
            )
        elif problem := untrusted_source(src):
            out.append(Dataset(name, src, path, False, problem))
        else:
            out.append(Dataset(name, src, path, True))
    return out


def untrusted_source(src: str) -> str:
    """Why ``src`` cannot be published, if someone other than root could change what it
    names (a tenant's directory or link on the way would let them point root's bind
    mount anywhere, another home or ``/`` included); "" if it can be.

    >>> untrusted_source("/usr/share")
    ''
    """
    try:
        # The dataset's own modes do not matter (it is bound read-only); the way to it does.
        bad = untrusted_component(src, last=False)
    except OSError as exc:
        return f"DATASETS_DIRECTORIES: {src} cannot be checked: {exc.strerror or exc}"
    if bad is None:
        return ""
    component, why = bad
    return (
        f"DATASETS_DIRECTORIES: {src} is refused: {component} {why}, so a user other "
        "than root could change what is published; make every directory on the way "
        "root's and writable by root alone (or move the dataset)"
    )


# ----------------------------------------------------------------- mounts


class Publisher:
    """Makes the mounts a configuration asks for, and undoes the ones it no longer does."""

    def __init__(self, run_dir: str, root: str = DATASETS_ROOT) -> None:
        self.record_path = Path(run_dir) / RECORD
        self.root = root

    def _record(self) -> dict[str, Any]:
        """``protected``: directories bound over themselves; ``published``: each
        ``/datasets/NAME`` made, with the directory bound there."""
        try:
            d = json.loads(self.record_path.read_text())
            return {"protected": list(d.get("protected", [])), "published": dict(d.get("published", {}))}
        except (OSError, ValueError, TypeError):
            return {"protected": [], "published": {}}

    def _save(self, rec: dict[str, Any]) -> None:
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, indent=1))
        os.replace(tmp, self.record_path)

    def apply(self, options: Options) -> Published:
        """Publish what ``options`` lists; return each entry with its problem, if any."""
        datasets = plan_datasets(options.datasets_directories, self.root)
        interpreters = plan_interpreters(options.python_interpreters)
        rec = self._record()
        protect = {os.path.realpath(d.source): d.source for d in datasets if d.ok}
        protect.update({i.prefix: i.prefix for i in interpreters if i.ok and i.read_only})
        # What an earlier configuration published and this one does not: undone first.
        wanted = {d.path: os.path.realpath(d.source) for d in datasets if d.ok}
        for path, real in reversed(list(rec["published"].items())):
            if wanted.get(path) != real:
                self._undo(path, rec, "published")
        for path in list(reversed(rec["protected"])):
            if path not in protect:
                self._undo(path, rec, "protected")
        failed: dict[str, str] = {}
        if options.private_tmp:
            # Tenants' private /tmp namespaces see a dataset published after they were
            # made only if /datasets was already a shared mount then: it is made from
            # the first start, datasets or not.
            try:
                self._ensure_root()
            except (MountError, OSError) as exc:
                log.warning(
                    "%s cannot be prepared: %s; datasets a reload publishes reach "
                    "only tenants who log in afresh",
                    self.root,
                    exc,
                )
        for real, configured in protect.items():
            try:
                self._protect(real, rec)
            except (MountError, OSError) as exc:
                failed[configured] = f"{configured} cannot be made read-only: {exc}"
        datasets = [
            self._publish(d, rec) if d.ok and d.source not in failed else _failed(d, failed.get(d.source))
            for d in datasets
        ]
        interpreters = [_failed(i, failed.get(i.prefix)) if i.ok and i.read_only else i for i in interpreters]
        self._save(rec)
        pub = Published(tuple(datasets), tuple(interpreters))
        for d in pub.datasets:
            if d.ok:
                log.info("dataset %s published read-only at %s", d.source, d.path)
        for i in pub.interpreters:
            if i.ok:
                log.info(
                    "interpreter %s: Python %s at %s%s",
                    i.name,
                    i.version,
                    i.path,
                    f" (prefix {i.prefix} read-only)" if i.read_only else "",
                )
        for line in pub.problems():
            log.warning("not published: %s", line)
        return pub

    def _protect(self, real: str, rec: dict[str, Any]) -> None:
        """Bind ``real`` read-only over itself, unless its visible mount already is read-only."""
        m = mounts.top(real)
        if m is not None and m.read_only:
            return
        fd = open_trusted(real)
        try:
            mounts.bind_read_only(real, real, source_fd=fd)
        finally:
            os.close(fd)
        if real not in rec["protected"]:
            rec["protected"].append(real)

    def _ensure_root(self) -> None:
        """``/datasets``: our tmpfs, or the host's own directory if it has files already."""
        m = mounts.top(self.root)
        if m is None or m.device != TMPFS_DEVICE:
            if os.path.isdir(self.root) and os.listdir(self.root):
                return  # the host's own /datasets: the mount points go into it
            mounts.mount_tmpfs(self.root, TMPFS_DEVICE)
        # Shared: a dataset a reload publishes reaches tenants' private /tmp namespaces
        # made before it, on hosts whose root mount does not propagate too.
        mounts.make_shared(self.root)

    def _publish(self, d: Dataset, rec: dict[str, Any]) -> Dataset:
        real = os.path.realpath(d.source)
        if real == os.path.realpath(d.path):
            return d  # it already lives at /datasets/NAME, and is read-only there
        try:
            self._ensure_root()
            m = mounts.top(d.path)
            if m is not None and d.path in rec["published"]:
                if not m.read_only:
                    mounts.make_read_only(d.path)
                return d
            if (
                m is not None
                or (os.path.isdir(d.path) and os.listdir(d.path))
                or (os.path.lexists(d.path) and not os.path.isdir(d.path))
            ):
                return _failed(
                    d, f"{d.path} is already there and is not MTGPU's; move it away or rename {d.source}"
                )
            os.makedirs(d.path, mode=0o755, exist_ok=True)
            # Resolved and checked once: the directory bound is the one opened now.
            fd = open_trusted(real)
            try:
                mounts.bind_read_only(real, d.path, source_fd=fd)
            finally:
                os.close(fd)
        except (MountError, OSError) as exc:
            return _failed(d, f"{d.source} cannot be published at {d.path}: {exc}")
        rec["published"][d.path] = real
        return d

    def _undo(self, path: str, rec: dict[str, Any], kind: str) -> None:
        try:
            if mounts.top(path) is not None:
                mounts.unmount(path)
            if kind == "published":
                try:
                    os.rmdir(path)
                except OSError:
                    pass
            log.info("%s is no longer published", path)
        except MountError as exc:
            log.warning("%s", exc)
            return
        if kind == "published":
            del rec[kind][path]
        else:
            rec[kind].remove(path)

    def undo_all(self) -> list[str]:
        """Unmount everything this host published (``mtgpu-setup uninstall``); what was done."""
        rec = self._record()
        done = []
        for kind in ("published", "protected"):
            for path in list(reversed(list(rec[kind]))):
                self._undo(path, rec, kind)
                if path not in rec[kind]:
                    done.append(path)
        m = mounts.top(self.root)
        if m is not None and m.device == TMPFS_DEVICE:
            try:
                mounts.unmount(self.root)
                done.append(self.root)
            except MountError as exc:
                log.warning("%s", exc)
        # The empty /datasets directory stays: removing a directory that is a mount point
        # in another mount namespace would detach that namespace's mounts.
        if self.record_path.parent.is_dir():
            self._save(rec)
        return done


def _failed(entry: Any, problem: str | None) -> Any:
    if not problem:
        return entry
    import dataclasses

    return dataclasses.replace(entry, ok=False, problem=problem)


# ------------------------------------------------------------------ homes


def link_home(home: str, uid: int, gid: int, target: str = DATASETS_ROOT) -> bool:
    """Add ``HOME/datasets -> /datasets``, owned by the tenant, unless something is there.

    Works relative to the home's directory descriptor (opened without following a
    link), so a tenant's own links cannot send it anywhere else. True if it made one.
    """
    try:
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_uid != uid:
            return False
        try:
            os.lstat(HOME_LINK, dir_fd=fd)
            return False  # the tenant's own file, directory or link: left alone
        except FileNotFoundError:
            pass
        os.symlink(target, HOME_LINK, dir_fd=fd)
        os.chown(HOME_LINK, uid, gid, dir_fd=fd, follow_symlinks=False)
        return True
    except OSError as exc:
        log.warning("cannot add %s/%s: %s", home, HOME_LINK, exc.strerror)
        return False
    finally:
        os.close(fd)
