"""``mt-container``: interactive container workspaces (rootless podman, as you).

Every verb is one API call over the Unix socket, made as the tenant; the daemon runs
podman as the tenant. Two verbs then run something here, as the tenant: ``shell``
opens ``podman exec`` in the tenant's tmux (so it survives disconnects) and
``logs -f`` follows ``podman logs``. ``--devcontainer PATH`` is read here, with the
tenant's own rights, and sent as JSON.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from typing import Any

from mtgpu.cli.common import add_common, emit, run_cli, table, tenant_client
from mtgpu.cmdline import with_examples
from mtgpu.workspaces.tenant_podman import podman_env

PROG = "mt-container"


def _size(n: int | None) -> str:
    from mtgpu.config.units import format_size

    return format_size(n) if n else "-"


def _ports(v: dict[str, Any]) -> str:
    live = [
        f"{p['container_port']}->{p.get('host_ip') or '0.0.0.0'}:{p['host_port']}"
        for p in v.get("ports") or []
    ]
    return ", ".join(live) or ", ".join(str(p) for p in v.get("requested_ports") or []) or "-"


def _describe(v: dict[str, Any]) -> str:
    gpus = ",".join(str(g) for g in v.get("gpus") or []) or "-"
    lines = [
        f"workspace {v['name']}: {v['state']}",
        f"  image:       {v.get('image')}  ({v.get('source')})",
        (
            f"  reservation: job {v.get('reservation') or '-'} on {v.get('node')}; GPUs {gpus}, "
            f"{v.get('cpus')} CPUs, {_size(v.get('ram'))} RAM"
        ),
        f"  ports:       {_ports(v)}",
    ]
    if v.get("state") == "PENDING":
        lines.append(f"  queued:      position {v.get('position')}; {v.get('reason') or 'waiting'}")
    elif v.get("reason"):
        lines.append(f"  reason:      {v['reason']}")
    if v.get("error"):
        lines.append(f"  error:       {v['error']}")
    return "\n".join(lines)


def _read_devcontainer(path: str) -> dict[str, Any]:
    from mtgpu.workspaces.devcontainer import load_devcontainer

    p = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(p):
        for cand in (".devcontainer/devcontainer.json", ".devcontainer.json", "devcontainer.json"):
            if os.path.isfile(os.path.join(p, cand)):
                p = os.path.join(p, cand)
                break
        else:
            raise SystemExit(f"{PROG}: no .devcontainer/devcontainer.json in {p}")
    try:
        with open(p) as f:
            text = f.read()
    except OSError as exc:
        raise SystemExit(f"{PROG}: cannot read {p}: {exc.strerror}") from exc
    return {"config": load_devcontainer(text, p), "path": p}


def _env_pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep:
            v = os.environ.get(k, "")
        out[k] = v
    return out


def cmd_create(args: argparse.Namespace, api: Any) -> int:
    req: dict[str, Any] = {
        "name": args.name,
        "template": args.template,
        "image": args.image,
        "saved": args.saved,
        "gpus": args.gpus,
        "cpus": args.cpus,
        "ram": args.ram,
        "vram": args.vram,
        "gpu_type": args.gpu_type,
        "ports": args.port or None,
        "env": _env_pairs(args.env) or None,
        "queue": not args.no_queue,
        "wait": args.wait,
    }
    if args.devcontainer:
        req["devcontainer"] = _read_devcontainer(args.devcontainer)
    v = api.call("workspace.create", **req)
    for w in v.get("warnings") or []:
        print(f"{PROG}: warning: {w}", file=sys.stderr)
    emit(args, v, _describe)
    if v["state"] == "PENDING" and not args.json:
        print(
            f"The host is busy: the workspace waits in the queue and starts when its "
            f"resources free up. `{PROG} list` shows it; `{PROG} rm {args.name}` gives up."
        )
    return 1 if v["state"] == "FAILED" else 0


def cmd_list(args: argparse.Namespace, api: Any) -> int:
    rows = api.call("workspace.list")

    def text(vs: list[dict[str, Any]]) -> str:
        return table(
            [
                [
                    v["name"],
                    v["state"],
                    (v.get("image") or "")[:40],
                    ",".join(str(g) for g in v.get("gpus") or []) or "-",
                    _ports(v),
                    v.get("reservation") or "-",
                ]
                for v in vs
            ],
            ["NAME", "STATE", "IMAGE", "GPUS", "PORTS", "RESERVATION"],
        )

    emit(args, rows, text)
    return 0


def cmd_show(args: argparse.Namespace, api: Any) -> int:
    emit(args, api.call("workspace.show", name=args.name), _describe)
    return 0


def cmd_start(args: argparse.Namespace, api: Any) -> int:
    v = api.call("workspace.start", name=args.name, wait=args.wait)
    emit(args, v, _describe)
    return 1 if v["state"] == "FAILED" else 0


def cmd_stop(args: argparse.Namespace, api: Any) -> int:
    emit(args, api.call("workspace.stop", name=args.name, release=args.release or None), _describe)
    return 0


def cmd_rm(args: argparse.Namespace, api: Any) -> int:
    out = [api.call("workspace.rm", name=n) for n in args.names]
    emit(args, out if len(out) > 1 else out[0], lambda _: "\n".join(f"removed {r['name']}" for r in out))
    return 0


def cmd_save(args: argparse.Namespace, api: Any) -> int:
    r = api.call("workspace.save", name=args.workspace, image=args.image)
    emit(
        args,
        r,
        lambda r: (
            f"saved {r['workspace']} as {r['image']}; "
            f"`{PROG} create NEW --saved {r['saved']}` starts it again"
        ),
    )
    return 0


def cmd_logs(args: argparse.Namespace, api: Any) -> int:
    r = api.call("workspace.logs", name=args.name, tail=args.tail)
    if args.json:
        emit(args, r)
        return 0
    sys.stdout.write(r["logs"])
    sys.stdout.flush()
    if args.follow:
        env = podman_env(api.call("workspace.policy"))
        os.execve(r["follow_argv"][0], r["follow_argv"], env)
    return 0


def ssh_hint(r: dict[str, Any], port: dict[str, Any], ssh_connection: str = "") -> str:
    """How to reach a published port from a laptop (``SSH_CONNECTION`` names this host
    as the laptop reached it).

    >>> ssh_hint({"user": "ann", "server": "gpu1", "ssh_port": 2222},
    ...          {"host_port": 41000, "container_port": 8888, "host_ip": "127.0.0.1"})
    'ssh -N -L 8888:127.0.0.1:41000 -p 2222 ann@gpu1   then open http://localhost:8888/'
    """
    conn = ssh_connection.split()
    host, sport = (conn[2], conn[3]) if len(conn) == 4 else (r["server"], r["ssh_port"])
    ip = port.get("host_ip") or "127.0.0.1"
    if ip in ("0.0.0.0", "::", ""):
        ip = "127.0.0.1"
    local = port["container_port"]
    return (
        f"ssh -N -L {local}:{ip}:{port['host_port']} -p {sport} {r['user']}@{host}"
        f"   then open http://localhost:{local}/"
    )


def cmd_ports(args: argparse.Namespace, api: Any) -> int:
    r = api.call("workspace.ports", name=args.name)

    def text(r: dict[str, Any]) -> str:
        if not r["ports"]:
            asked = ", ".join(str(p) for p in r["requested_ports"]) or "none"
            return (
                f"{r['name']} publishes no ports now (state {r['state']}; asked for: {asked}; "
                f"CONTAINERS.port_publishing is {r['port_publishing']})"
            )
        lines = []
        for p in r["ports"]:
            lines.append(
                f"{p['container_port']}/{p.get('protocol', 'tcp')} -> "
                f"{p.get('host_ip') or '0.0.0.0'}:{p['host_port']}"
            )
            lines.append(f"    from your laptop: {ssh_hint(r, p, os.environ.get('SSH_CONNECTION', ''))}")
        return "\n".join(lines)

    emit(args, r, text)
    return 0


def cmd_templates(args: argparse.Namespace, api: Any) -> int:
    rows = api.call("workspace.templates")
    emit(
        args,
        rows,
        lambda ts: table(
            [
                [
                    t["name"],
                    t["image"],
                    t["gpus"],
                    t["cpus"],
                    _size(t["ram"]),
                    ",".join(str(p) for p in t["ports"]) or "-",
                    t.get("description", ""),
                ]
                for t in ts
            ],
            ["NAME", "IMAGE", "GPUS", "CPUS", "RAM", "PORTS", "DESCRIPTION"],
        ),
    )
    return 0


# ---------------------------------------------------------------- shell


def exec_argv(info: dict[str, Any], cmd: list[str], tty: bool) -> list[str]:
    """``podman exec`` for a shell (or ``cmd``) in the workspace.

    >>> exec_argv({"podman": "podman", "workdir": "/h", "user": "", "container": "w"}, ["ls"], False)
    ['podman', 'exec', '-i', '--workdir', '/h', 'w', 'ls']
    """
    argv = [info["podman"], "exec", "-it" if tty else "-i", "--workdir", info["workdir"]]
    if info.get("user"):
        argv += ["--user", info["user"]]
    if tty:
        argv += ["--env", f"TERM={os.environ.get('TERM', 'xterm-256color')}"]
    login = ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"]
    return argv + [info["container"], *(cmd or login)]


def join_reservation(api: Any, info: dict[str, Any]) -> None:
    """Move this process into the cgroups of the job that holds the workspace's
    reservation (``job.adopt``), so that what ``podman exec`` starts inside is bound
    by the reservation (its GPUs, its memory) as the container is, never by the
    session's cgroup, which denies every GPU. Refuses rather than run outside it."""
    jid = info.get("reservation")
    if not jid:
        raise SystemExit(
            f"{PROG}: workspace {info['name']} holds no reservation on this server; "
            f"`mt-container start {info['name']}` reserves again"
        )
    api.call("job.adopt", job_id=jid, pid=os.getpid())


def cmd_shell(args: argparse.Namespace, api: Any) -> int:
    info = api.call("workspace.shell", name=args.name)
    env = podman_env(info)
    cmd = list(args.command or [])
    while cmd[:1] in (["--json"], ["--no-tmux"]):  # options written after NAME
        setattr(args, cmd.pop(0)[2:].replace("-", "_"), True)
    if cmd[:1] == ["--"]:  # argparse keeps it when it follows an option
        cmd = cmd[1:]
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    argv = exec_argv(info, cmd, tty)
    if args.json:  # what would run, for scripts and editors; nothing is started
        emit(
            args,
            {
                **info,
                "argv": exec_argv(info, cmd, True),
                "tmux_session": f"ws-{args.name}",
                "tmux_socket": "mtgpu",
            },
        )
        return 0
    if not tty or args.no_tmux or shutil.which("tmux") is None:
        if tty and not args.no_tmux:
            print(f"{PROG}: tmux is not installed here; running without it", file=sys.stderr)
        join_reservation(api, info)
        os.execve(argv[0], argv, env)
    # The pane runs this command again without tmux: it joins the reservation itself
    # (the tmux server, which starts it, is in the session's cgroup).
    pane = shlex.join(
        [sys.executable, "-P", "-m", "mtgpu.cli.container", "shell", "--no-tmux", args.name, "--", *cmd]
    )
    # The tenant's tmux is mtgpu.tmux's to drive: it opens the window and attaches.
    window = [
        sys.executable,
        "-P",
        "-m",
        "mtgpu.tmux.window",
        *(["--new-window"] if cmd else []),
        "--",
        f"ws-{args.name}",
        args.name,
        info["home"],
        pane,
    ]
    os.execve(window[0], window, env)
    return 0


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Interactive container workspaces (rootless podman, as you), reserved like jobs.",
    )
    p.add_argument("--config", default=argparse.SUPPRESS, help="the daemon's configuration")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help)
        add_common(sp)
        return sp

    c = verb("create", "create a workspace and reserve its GPUs, CPUs and RAM")
    c.add_argument("name")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--template", "-t", help="an admin's template (`templates` lists them)")
    src.add_argument("--image", help="a pre-pulled image, or any image where the host allows")
    src.add_argument("--saved", help="an image you saved with `save WORKSPACE NAME`")
    src.add_argument(
        "--devcontainer",
        metavar="PATH",
        help="a devcontainer.json, or a folder with .devcontainer/devcontainer.json",
    )
    c.add_argument("--gpus", type=int, help="GPUs to reserve (default: the template's, else 0)")
    c.add_argument("--gpu-type", help="a GPU brand or type, such as nvidia or rtx4090")
    c.add_argument("--vram", help="VRAM per GPU (shared GPUs), such as 20G")
    c.add_argument("--cpus", type=int, help="CPUs to reserve")
    c.add_argument("--ram", help="RAM to reserve, such as 16G")
    c.add_argument("--port", "-p", type=int, action="append", help="a container port to publish")
    c.add_argument("--env", "-e", action="append", default=[], help="KEY=VALUE in the container")
    c.add_argument(
        "--no-queue", action="store_true", help="refuse if the host cannot hold it now, instead of queueing"
    )
    c.add_argument("--wait", type=float, default=30, help="seconds to wait for it to start")
    verb("list", "your workspaces and their state")
    s = verb("show", "one workspace")
    s.add_argument("name")
    sh = verb("shell", "a terminal inside (in your tmux, so it survives disconnects)")
    sh.add_argument("name")
    sh.add_argument("--no-tmux", action="store_true", help="run podman exec directly")
    sh.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD to run instead of a shell")
    st = verb("start", "start a stopped workspace (reserving again if it was released)")
    st.add_argument("name")
    st.add_argument("--wait", type=float, default=30)
    sp = verb("stop", "stop it; its reservation is kept (--release gives it back)")
    sp.add_argument("name")
    sp.add_argument("--release", action="store_true", help="also release GPUs, CPUs and RAM")
    r = verb("rm", "remove workspaces and end their reservations")
    r.add_argument("names", nargs="+")
    sv = verb("save", "save a workspace as an image (`create --saved NAME` uses it)")
    sv.add_argument("workspace")
    sv.add_argument("image")
    lg = verb("logs", "the output of the workspace's main process")
    lg.add_argument("name")
    lg.add_argument("-n", "--tail", type=int, default=200)
    lg.add_argument("-f", "--follow", action="store_true")
    pt = verb("ports", "published ports and the ssh -L command that reaches each")
    pt.add_argument("name")
    verb("templates", "the admin's workspace templates")
    return with_examples(p, EXAMPLES)


COMMANDS = {
    "create": cmd_create,
    "list": cmd_list,
    "show": cmd_show,
    "shell": cmd_shell,
    "start": cmd_start,
    "stop": cmd_stop,
    "rm": cmd_rm,
    "save": cmd_save,
    "logs": cmd_logs,
    "ports": cmd_ports,
    "templates": cmd_templates,
}


#: The examples at the end of each command's --help (and manual page).
EXAMPLES = {
    "": "mt-container create nb --template jupyter\nmt-container shell nb\nmt-container rm nb",
    "create": "mt-container create nb --template jupyter\n"
    "mt-container create scratch --image docker.io/library/python:3.12 --gpus 1 --ram 16G",
    "list": "mt-container list",
    "show": "mt-container show nb --json",
    "shell": "mt-container shell nb\nmt-container shell nb -- nvidia-smi",
    "start": "mt-container start nb",
    "stop": "mt-container stop nb\nmt-container stop nb --release",
    "rm": "mt-container rm nb scratch",
    "save": "mt-container save nb my-env\nmt-container create nb2 --saved my-env",
    "logs": "mt-container logs -n 50 nb\nmt-container logs -f nb",
    "ports": "mt-container ports nb",
    "templates": "mt-container templates",
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not hasattr(args, "json"):
        args.json = False
    return run_cli(PROG, lambda: COMMANDS[args.cmd](args, tenant_client(args, timeout=900)))


if __name__ == "__main__":
    sys.exit(main())
