"""What every command shares: --config, --json, errors and output."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mtgpu.errors import ApiError, ConfigError, MtgpuError


def base_parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    add_common(p)
    return p


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=argparse.SUPPRESS,
                   help="configuration of the daemon to talk to (default $MTGPU_CONFIG, "
                        "then /etc/mtgpu/mtgpu.yaml)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print machine-readable JSON")


def client(args: argparse.Namespace) -> Any:
    from mtgpu.api.client import ApiClient, socket_path_from_config

    return ApiClient(socket_path_from_config(getattr(args, "config", None)))


def tenant_client(args: argparse.Namespace, timeout: float = 60.0) -> Any:
    """A tenant's client: the socket their session was given (``MTGPU_API_SOCKET``), with
    ``timeout``; with ``--config`` or without that variable, :func:`client`'s."""
    from mtgpu.api.client import ApiClient

    path = os.environ.get("MTGPU_API_SOCKET")
    if getattr(args, "config", None) or not path:
        return client(args)
    return ApiClient(path, timeout=timeout)


def emit(args: argparse.Namespace, data: Any, text: Callable[[Any], str] | str | None = None) -> None:
    """Print ``data`` as JSON with --json, else as ``text`` (a string or a formatter)."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    elif callable(text):
        out = text(data)
        if out:
            print(out)
    elif text is not None:
        print(text)


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    from tabulate import tabulate

    return tabulate(rows, headers=headers, tablefmt="simple") if rows else "(none)"


def run_cli(prog: str, fn: Callable[[], int | None]) -> int:
    """Run a CLI body, turning MTGPU errors into one clear line and an exit status."""
    try:
        return fn() or 0
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except ApiError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except MtgpuError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
