"""``mtgpu-setup reload``: make the running daemon reread its configuration file and
say what it did: the changed keys it applied, and those that need a restart (their
old values stay in force until ``systemctl restart mtgpu``)."""

from __future__ import annotations

import argparse
import json

from mtgpu.errors import ApiError, ConfigError


def reload(args: argparse.Namespace) -> int:
    """0: reloaded (restart keys named); 1: the daemon could not be asked; 2: the file
    is refused (the daemon keeps its configuration)."""
    from mtgpu.api.client import ApiClient
    from mtgpu.config import load

    try:
        socket_path = load(args.config).api_socket
    except ConfigError as exc:
        print(
            f"mtgpu-setup: {exc}\nmtgpu-setup: not reloaded: the daemon keeps its "
            "configuration; fix the file and run `mtgpu-setup reload` again"
        )
        return 2
    api = ApiClient(socket_path)
    try:
        r = api.call("config.reload")
    except ApiError as exc:
        print(f"mtgpu-setup: cannot reload: {exc}")
        return 1
    finally:
        api.close()
    if getattr(args, "json", False):
        print(json.dumps(r, indent=2, sort_keys=True))
        return 2 if r.get("error") else 0
    if r.get("error"):
        print(
            f"mtgpu-setup: not reloaded: {r['error']}\nmtgpu-setup: the daemon keeps its "
            "configuration; fix the file and run `mtgpu-setup reload` again"
        )
        return 2
    print(f"mtgpu-setup: reloaded {r.get('source') or 'the defaults'}")
    print(f"mtgpu-setup: applied: {', '.join(r['applied']) or 'no key changed'}")
    for key in r["needs_restart"]:
        print(
            f"mtgpu-setup: {key} needs a restart: its old value stays in force until "
            "`systemctl restart mtgpu`"
        )
    return 0
