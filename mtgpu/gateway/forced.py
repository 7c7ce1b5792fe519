"""``mtgpu-shell``: the gateway as an OpenSSH ``ForceCommand``.

For hosts that keep OpenSSH's sshd in front. sshd has already authenticated the
user and switched to their account; this program makes the same routing decision as
the embedded server (:func:`mtgpu.gateway.route.route`) and carries it out in place:

- a terminal with no command: the user's tmux (:func:`mtgpu.tmux.terminal_argv`);
- a command: the login shell ``-c`` it, with MTGPU's tools first on ``PATH``;
- the ``sftp`` subsystem: OpenSSH's ``sftp-server``;
- the ``mtgpu-api`` subsystem (``Subsystem mtgpu-api /usr/local/bin/mtgpu-shell --api``):
  a byte pipe to the daemon's API socket, which identifies the user by SO_PEERCRED.

sshd_config::

    ForceCommand /usr/local/bin/mtgpu-shell
    Subsystem mtgpu-api /usr/local/bin/mtgpu-shell --api
"""

from __future__ import annotations

import argparse
import os
import pwd
import shlex
import socket
import sys

from mtgpu.cmdline import with_examples
from mtgpu.gateway.route import Kind, route

SFTP_NAMES = ("sftp-server", "internal-sftp")


def _env(run_dir: str, config: str) -> dict[str, str]:
    env = dict(os.environ)
    env["MTGPU_CONFIG"] = config
    path = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PATH"] = f"{run_dir}/bin:{path}"
    # The tmux socket directory, where the daemon made it (tmux's /tmp place otherwise).
    env["MTGPU_TMUX_DIR"] = os.path.join(run_dir, "tmux")
    return env


def _api_bridge(sock_path: str) -> int:
    """Copy stdin to the API socket and its answers to stdout."""
    import selectors

    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sock_path)
    except OSError as exc:
        sys.stderr.write(f"mtgpu-shell: cannot reach the MTGPU daemon at {sock_path}: {exc}\n")
        return 1
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ, "in")
    sel.register(s, selectors.EVENT_READ, "sock")
    open_in = True
    while True:
        for key, _ in sel.select():
            if key.data == "in":
                data = os.read(0, 1 << 16)
                if not data:
                    sel.unregister(0)
                    s.shutdown(socket.SHUT_WR)
                    open_in = False
                else:
                    s.sendall(data)
            else:
                data = s.recv(1 << 16)
                if not data:
                    return 0
                os.write(1, data)
        if not open_in and not sel.get_map():
            return 0


def _not_granted(sock_path: str) -> str | None:
    """The daemon's reason when this user is a tenant not granted this cluster.

    sshd let them in with their own authorized_keys; the grant is the daemon's to
    decide. Without a daemon to ask, the session goes on as it would without MTGPU.
    """
    from mtgpu.api.client import ApiClient
    from mtgpu.errors import ApiError

    client = ApiClient(sock_path, timeout=10)
    try:
        client.call("whoami")
    except ApiError as exc:
        return str(exc) if exc.code == "not_granted" else None
    finally:
        client.close()
    return None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="mtgpu-shell",
        description="MTGPU's gateway for hosts that keep OpenSSH's sshd in front: set it as sshd's "
        "ForceCommand, and each login gets what MTGPU's own server gives it (the user's tmux for a "
        "terminal, the login shell for a command, sftp, and the mtgpu-api subsystem).",
    )
    ap.add_argument(
        "--config", help="the MTGPU configuration (default $MTGPU_CONFIG, then /etc/mtgpu/mtgpu.yaml)"
    )
    ap.add_argument("--api", action="store_true", help="serve the mtgpu-api subsystem")
    return with_examples(
        ap,
        {
            "": "# in /etc/ssh/sshd_config:\nForceCommand /usr/local/bin/mtgpu-shell\n"
            "Subsystem mtgpu-api /usr/local/bin/mtgpu-shell --api"
        },
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from mtgpu.config import config_path, load

    config = config_path(args.config)
    options = load(args.config)
    if args.api:
        return _api_bridge(options.api_socket)  # the daemon refuses an ungranted caller
    refused = _not_granted(options.api_socket)
    if refused:
        sys.stderr.write(f"mtgpu: {refused}\n")
        return 1
    original = os.environ.get("SSH_ORIGINAL_COMMAND")
    subsystem = None
    if original:
        first = os.path.basename(shlex.split(original)[0]) if original.strip() else ""
        if first in SFTP_NAMES:
            subsystem = "sftp"
        elif first == "mtgpu-shell" and "--api" in original.split():
            subsystem = "mtgpu-api"
    r = route(
        invitee=False,
        command=None if subsystem else original,
        subsystem=subsystem,
        pty=bool(os.environ.get("SSH_TTY")),
    )
    env = _env(options.run_dir, config)
    shell = pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
    if r.kind is Kind.API:
        return _api_bridge(options.api_socket)
    if r.kind is Kind.SFTP:
        from mtgpu.gateway.session import SFTP_SERVER_PATHS

        sftp = next((p for p in SFTP_SERVER_PATHS if os.path.exists(p)), None)
        if sftp is None:
            sys.stderr.write("mtgpu-shell: sftp-server is not installed on this host\n")
            return 1
        os.execve(sftp, [sftp], env)
    if r.kind is Kind.TERMINAL:
        from mtgpu.tmux import terminal_argv

        argv_ = terminal_argv(sys.executable)
        os.execve(argv_[0], argv_, {**env, "PYTHONCOERCECLOCALE": "0"})
    if r.kind is Kind.SHELL:
        os.execve(shell, ["-" + os.path.basename(shell)], env)
    if r.kind in (Kind.EXEC, Kind.EXEC_PTY):
        os.execve(shell, [os.path.basename(shell), "-c", r.command or ""], env)
    sys.stderr.write(f"mtgpu-shell: {r.detail}\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
