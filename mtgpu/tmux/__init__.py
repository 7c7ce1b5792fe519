"""Terminals that survive disconnects: each tenant's tmux on MTGPU's socket.

The gateway runs :func:`terminal_argv` (or :func:`attach_argv`) as the tenant in a
login's pty; everything else happens in that tenant process.
"""

from __future__ import annotations

from mtgpu.tmux.terminal import SOCKET_NAME, attach_argv, terminal_argv

__all__ = ["SOCKET_NAME", "attach_argv", "terminal_argv"]
