"""``mt-python``: the Python interpreters this host publishes, and venvs made from them.

``list`` asks the daemon which interpreters it publishes (API operation
``published``). ``venv`` and ``run`` then run the chosen interpreter here, as you, so
a venv is yours like any file you make; nothing runs as root.
"""

from __future__ import annotations

import argparse
import os
import pwd
import sys
from typing import Any

from mtgpu.cli.common import add_common, emit, run_cli, table, tenant_client
from mtgpu.cmdline import with_examples
from mtgpu.proc import call

PROG = "mt-python"


def interpreters(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The published interpreters that work (broken ones are the admin's to fix)."""
    return [i for i in tenant_client(args, timeout=30).call("published")["interpreters"] if i["ok"]]


def pick(found: list[dict[str, Any]], name: str | None) -> dict[str, Any]:
    if not found:
        raise SystemExit(
            f"{PROG}: no Python interpreters are published on this host; an admin "
            "lists them in PYTHON_INTERPRETERS"
        )
    if name is None:
        return found[0]
    for i in found:
        if i["name"] == name:
            return i
    raise SystemExit(
        f"{PROG}: no published interpreter is named {name!r}; choose one of "
        f"{', '.join(i['name'] for i in found)} (see `mt-python list`)"
    )


def inside_home(path: str) -> str:
    """``path`` made absolute, if it lies inside the caller's home; else exit saying so."""
    home = os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir)
    target = os.path.realpath(os.path.abspath(os.path.expanduser(path)))
    if not target.startswith(home.rstrip("/") + "/"):
        raise SystemExit(
            f"{PROG}: {path} is outside your home {home}; make the venv inside "
            "your home, for example ~/venvs/NAME"
        )
    return target


def cmd_list(args: argparse.Namespace) -> int:
    found = interpreters(args)
    rows = [[i["name"], i["version"], i["path"], "yes" if i["pip"] else "no (--without-pip)"] for i in found]
    emit(args, found, lambda _: table(rows, ["NAME", "VERSION", "PATH", "PIP IN VENVS"]))
    return 0


def cmd_venv(args: argparse.Namespace) -> int:
    interp = pick(interpreters(args), args.interpreter)
    target = inside_home(args.path)
    if (
        os.path.isdir(target)
        and os.listdir(target)
        and not os.path.exists(os.path.join(target, "pyvenv.cfg"))
    ):
        raise SystemExit(f"{PROG}: {target} already exists and is not a venv; choose a new path")
    if os.path.lexists(target) and not os.path.isdir(target):
        raise SystemExit(f"{PROG}: {target} already exists and is not a directory; choose a new path")
    argv = [interp["path"], "-m", "venv"]
    if args.system_site_packages:
        argv.append("--system-site-packages")
    without_pip = args.without_pip or not interp["pip"]
    if without_pip:
        argv.append("--without-pip")
    rc = call([*argv, target], stdout=sys.stderr if getattr(args, "json", False) else None)
    if rc != 0:
        raise SystemExit(f"{PROG}: `{' '.join([*argv, target])}` failed (exit status {rc})")
    result = {
        "path": target,
        "python": os.path.join(target, "bin", "python"),
        "interpreter": interp["name"],
        "version": interp["version"],
        "base": interp["path"],
        "pip": not without_pip,
    }
    note = (
        ""
        if not without_pip or args.without_pip
        else f"\n(no pip: {interp['name']} has no ensurepip here; the admin can install it)"
    )
    emit(
        args,
        result,
        f"made the venv {target} from {interp['name']} (Python {interp['version']}, "
        f"{interp['path']}); run {result['python']}, or "
        f"`source {target}/bin/activate`{note}",
    )
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    interp = pick(interpreters(args), args.name)
    rest = list(args.args)
    if rest and rest[0] == "--":
        rest = rest[1:]
    sys.stdout.flush()
    os.execv(interp["path"], [interp["path"], *rest])
    return 127  # not reached


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Use the Python interpreters this host "
        "publishes: list them, make venvs in your home, run them.",
    )
    add_common(p)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    ls = sub.add_parser("list", help="the published interpreters: name, version and path")
    add_common(ls)
    ls.set_defaults(fn=cmd_list)
    v = sub.add_parser("venv", help="make a venv in your home from a published interpreter")
    add_common(v)
    v.add_argument("path", metavar="PATH", help="where the venv goes (inside your home)")
    v.add_argument(
        "--interpreter",
        "-i",
        metavar="NAME",
        help="which interpreter (a NAME from `mt-python list`; default the first)",
    )
    v.add_argument(
        "--system-site-packages", action="store_true", help="let the venv see the interpreter's own packages"
    )
    v.add_argument("--without-pip", action="store_true", help="do not install pip into the venv")
    v.set_defaults(fn=cmd_venv)
    r = sub.add_parser("run", help="run a published interpreter: mt-python run NAME -- ARGS")
    add_common(r)
    r.add_argument("name", metavar="NAME", help="a NAME from `mt-python list`")
    r.add_argument(
        "args", nargs=argparse.REMAINDER, metavar="-- ARGS", help="arguments for the interpreter, after --"
    )
    r.set_defaults(fn=cmd_run)
    return with_examples(p, EXAMPLES)


#: The examples at the end of each command's --help (and manual page).
EXAMPLES = {
    "": "mt-python list\nmt-python venv ~/venvs/train --interpreter py312",
    "list": "mt-python list\nmt-python list --json",
    "venv": "mt-python venv /tmp/scratch\nmt-python venv ~/venvs/train --interpreter py312",
    "run": "mt-python run python3.11 -- -c 'import sys; print(sys.version_info[:2])'",
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli(PROG, lambda: args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
