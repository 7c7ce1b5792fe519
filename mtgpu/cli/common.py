"""What every command shares: --config, --json, errors and output."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mtgpu.errors import ApiError, ConfigError, MtgpuError
from mtgpu.text import printable


def base_parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    add_common(p)
    return p


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=argparse.SUPPRESS,
        help="configuration of the daemon to talk to (default $MTGPU_CONFIG, then /etc/mtgpu/mtgpu.yaml)",
    )
    p.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print machine-readable JSON"
    )


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


class _Printable:
    """A text stream that writes :func:`printable` text to ``stream``; ``buffer`` (raw
    bytes, such as a job's own log that ``mt-job logs`` copies) passes unchanged."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(printable(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def run_cli(prog: str, fn: Callable[[], int | None]) -> int:
    """Run a CLI body, turning MTGPU errors into one clear line and an exit status.

    Everything it prints as text goes through :func:`printable` (JSON escapes control
    characters already)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Printable(out), _Printable(err)
    try:
        return _run_cli(prog, fn)
    finally:
        sys.stdout, sys.stderr = out, err


def _run_cli(prog: str, fn: Callable[[], int | None]) -> int:
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


#: How long ``mt-job cancel`` and ``mtgpu-admin cancel`` wait for running jobs to end
#: (the daemon's MAX_CANCEL_WAIT at most): the job's SIGTERM grace and a margin.
CANCEL_WAIT = 15


def hold_report(r: dict[str, Any], released: bool) -> tuple[list[str], list[str], int]:
    """What a hold's (or release's) answer says: lines for standard output, lines for
    standard error, and the exit status (1 when a job named no longer waits or was not
    found), as :func:`cancel_report` says a cancel's."""
    done = "Released" if released else "Held"
    out = [f"{done} job {jid}" for jid in r["changed"]]
    err = [f"job {jid} is no longer pending" for jid in r["not_pending"]]
    err += [f"no job {jid} of yours" for jid in r["not_found"]]
    return out, err, 1 if r["not_pending"] or r["not_found"] else 0


def cancel_report(r: dict[str, Any]) -> tuple[list[str], list[str], int]:
    """What a cancel's answer (``job.cancel`` with ``wait``) says: lines for standard
    output, lines for standard error, and the exit status (1 when it ended nothing:
    every job named had already ended, or none was found)."""
    out, err = [], []
    if r["cancelled"]:
        out.append(f"Cancelled job{'s' if len(r['cancelled']) > 1 else ''} {', '.join(r['cancelled'])}")
    for jid in r["stopping"]:
        out.append(
            f"Cancelling job {jid}: it is still stopping after {CANCEL_WAIT} s "
            f"(`mt-job show {jid}` follows it)"
        )
    states = r.get("ended_states") or {}
    for jid in r.get("ended", []):
        err.append(f"job {jid} had already ended ({states.get(jid) or 'final'}); nothing to cancel")
    for jid in r.get("not_found", []):
        err.append(f"no job {jid} of yours")
    acted = bool(r["cancelled"] or r["stopping"])
    return out, err, 0 if acted and not r.get("not_found") else 1
