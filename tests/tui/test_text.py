"""Text that tenants choose (job names, reasons, user names) on remotegpu-cli's screen."""

from __future__ import annotations

from mtgpu.tui.screen import Row


def test_a_job_name_with_terminal_escapes_reaches_the_screen_escaped() -> None:
    """A hostile tenant names a job to clear the screen and retitle the terminal of
    whoever lists jobs: the row shows the escapes as text and writes no control byte."""
    name = "train\x1b[2J\x1b]0;pwned\x07\u202eevil"
    row = Row([" 17 ", ("RUNNING", name), f" ann: {name}"], "job", ("job", "s", "17"), None)
    lines = row.render((120,)).text
    assert lines and all(not any(b < 0x20 or b == 0x7F for b in line) for line in lines)
    shown = b"".join(lines).decode()
    assert "train\\x1b[2J\\x1b]0;pwned\\x07\\u202eevil" in shown
