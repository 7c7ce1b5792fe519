"""The full-screen view of remotegpu-cli (urwid): one list of servers, GPUs, jobs and
workspaces, with the keys of the focused line shown at the bottom.

It only draws :class:`~mtgpu.tui.fleet.Fleet` and calls its actions. Colours are the
terminal's own 16 (default background); with ``NO_COLOR`` set only bold and reverse
video are used.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import urwid

from mtgpu.errors import MtgpuError
from mtgpu.tui.fleet import FINAL, UP, Fleet, ServerState
from mtgpu.tui.main import gib
from mtgpu.tui.sources import LIST, ServerListError, parse_destination, ssh_config_file

#: (name, foreground, background, mono): the mono column is used under NO_COLOR.
PALETTE = [
    ("header", "bold", "default", "bold"),
    ("heading", "bold", "default", "bold"),
    ("up", "dark green", "default", ""),
    ("down", "dark red", "default", "bold"),
    ("wait", "brown", "default", ""),
    ("bar", "dark cyan", "default", ""),
    ("hot", "dark red", "default", "bold"),
    ("dim", "dark gray", "default", ""),
    ("key", "bold", "default", "bold"),
    ("error", "dark red", "default", "bold"),
    ("focus", "standout", "default", "standout"),
]

MAX_FINISHED = 8
BAR = 10

KEYS = {
    "server": [("t", "terminal"), ("j", "submit job"), ("n", "new workspace"), ("a", "add server"),
               ("d", "drop server")],
    "job": [("c", "cancel"), ("l", "log"), ("t", "terminal"), ("j", "submit job")],
    "workspace": [("t", "shell"), ("s", "start"), ("x", "stop"), ("D", "remove"),
                  ("f", "forward ports"), ("n", "new")],
}


def state_attr(state: str) -> str:
    if state in ("RUNNING", "COMPLETED", UP):
        return "up"
    if state in ("PENDING", "STARTING", "STOPPED", "connecting"):
        return "wait"
    return "down" if state in FINAL or state in ("unreachable", "ENDED") else "dim"


def bar(used: int, total: int) -> list[Any]:
    """A usage bar as urwid markup: ``[█████░░░░░]``."""
    frac = 0.0 if total <= 0 else min(1.0, max(0.0, used / total))
    n = round(frac * BAR)
    return ["[", ("hot" if frac >= 0.9 else "bar", "\u2588" * n), ("dim", "\u2591" * (BAR - n)), "]"]


class Row(urwid.WidgetWrap):
    """One selectable line; ``kind`` says which keys apply to it."""

    def __init__(self, markup: Any, kind: str, key: tuple[Any, ...], state: ServerState,
                 item: dict[str, Any] | None = None, wrap: Literal["clip", "space"] = "clip") -> None:
        self.kind, self.key, self.state, self.item = kind, key, state, item
        super().__init__(urwid.AttrMap(urwid.Text(markup, wrap=wrap), None, focus_map="focus"))

    def selectable(self) -> bool:
        return True

    def keypress(self, size: tuple[()] | tuple[int] | tuple[int, int], key: str) -> str:
        return key


class Prompt(urwid.Edit):
    """A one-line question in the footer: Enter answers, Esc gives up."""

    def __init__(self, caption: str, done: Callable[[str | None], None]) -> None:
        super().__init__(caption)
        self.done = done

    def keypress(self, size: tuple[()] | tuple[int] | tuple[int, int], key: str) -> str | None:
        if key == "enter":
            self.done(self.edit_text)
            return None
        if key == "esc":
            self.done(None)
            return None
        return super().keypress(size, key)  # type: ignore[arg-type]  # an Edit is a flow widget


class App:
    """The screen: builds rows from the fleet and turns keys into actions."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.walker: Any = urwid.SimpleFocusListWalker([])
        self.listbox = urwid.ListBox(self.walker)
        self.header = urwid.Text("", wrap="clip")
        self.message = urwid.Text("", wrap="clip")
        self.keys = urwid.Text("", wrap="clip")
        self.footer = urwid.Pile([self.message, self.keys])
        self.frame = urwid.Frame(self.listbox, header=urwid.AttrMap(self.header, "header"),
                                 footer=self.footer)
        self.loop: urwid.MainLoop | None = None
        self.confirm: tuple[str, Callable[[], Awaitable[Any]], str] | None = None
        self.overlay: dict[str, Any] | None = None
        self._pending = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.forwards: list[str] = []
        fleet.on_change = self.changed
        self.rebuild()

    # ------------------------------------------------------------ drawing

    def changed(self) -> None:
        """The fleet changed: redraw soon (many changes make one redraw)."""
        if not self._pending:
            self._pending = True
            asyncio.get_running_loop().call_soon(self._redraw)

    def _redraw(self) -> None:
        self._pending = False
        self.rebuild()
        if self.loop is not None and self.loop.screen.started:
            self.loop.draw_screen()

    def rows(self) -> list[urwid.Widget]:
        fleet = self.fleet
        out: list[urwid.Widget] = [urwid.AttrMap(urwid.Text("SERVERS"), "heading")]
        servers = fleet.visible()
        if not servers:
            out.append(urwid.Text(("dim", "  none yet: press a to add one, or add a Host to "
                                   "~/.ssh/config")))
        for st in servers:
            out += self.server_rows(st)
        out.append(urwid.AttrMap(urwid.Text("JOBS"), "heading"))
        jobs = fleet.jobs()
        active = [x for x in jobs if x[1].get("state") not in FINAL]
        done = [x for x in jobs if x[1].get("state") in FINAL][:MAX_FINISHED]
        if not active and not done:
            out.append(urwid.Text(("dim", "  no jobs: press j on a server to submit a job file")))
        for st, j in active + done:
            out.append(self.job_row(st, j))
        if any(st.workspaces is not None for st in servers if st.status == UP):
            out.append(urwid.AttrMap(urwid.Text("WORKSPACES"), "heading"))
            wss = fleet.workspaces()
            if not wss:
                out.append(urwid.Text(("dim", "  none: press n on a server to create one")))
            for st, w in wss:
                out.append(self.workspace_row(st, w))
        return out

    def server_rows(self, st: ServerState) -> list[urwid.Widget]:
        if st.status != UP:
            mark = "\u2717" if st.status != "connecting" else "\u2026"
            text = [(state_attr(st.status), f"{mark} {st.name}"), "  ",
                    (state_attr(st.status), st.status)]
            if st.reason:
                text.append(f": {st.reason}")
            return [Row(text, "server", ("server", st.name), st, wrap="space")]
        n = st.node() or {}
        where = st.server if st.server == st.name else f"{st.server}"
        head = [("up", f"\u25cf {st.name}"), f"  {st.user}@{where}",
                f"  {st.cluster_id or 'standalone'}" if st.cluster_id else "",
                f"  CPU {n.get('cpus', '-')} {int(n.get('cpu_percent') or 0):>3}%",
                f"  RAM {gib(n.get('ram_used'))}/{gib(n.get('ram_total'))}"]
        if n.get("state") and n.get("state") != "up":
            head.append(("wait", f"  {n['state']}"))
        rows: list[urwid.Widget] = [Row(head, "server", ("server", st.name), st)]
        for g in n.get("gpus", []):
            used, total = int(g.get("vram_used") or 0), int(g.get("vram_total") or 0)
            jobs = ",".join(str(x) for x in g.get("jobs", []))
            text = [f"   GPU{g.get('index')} {str(g.get('type'))[:12]:<12} ", *bar(used, total),
                    f" {used / 2**30:5.1f}/{gib(total):<6} {int(g.get('util') or 0):>3}%",
                    ("dim", f"  jobs {jobs}") if jobs else ""]
            rows.append(Row(text, "server", ("gpu", st.name, g.get("index")), st))
        if not n.get("gpus"):
            rows.append(Row(("dim", "   no GPUs"), "server", ("gpu", st.name, None), st))
        return rows

    def job_row(self, st: ServerState, j: dict[str, Any]) -> Row:
        state = str(j.get("state"))
        where = ",".join(j.get("nodes") or []) or st.server or st.name
        gpus = ",".join(f"GPU{g['index']}" for g in j.get("gpus") or [])
        extra = ""
        if state == "PENDING":
            pos = j.get("position")
            extra = (f"#{pos} " if pos else "") + str(j.get("reason") or "")
        elif state == "RUNNING" and j.get("start_time"):
            extra = _age(time.time() - float(j["start_time"]))
        elif state in FINAL:
            extra = f"exit {j.get('exit_code')}" if j.get("exit_code") is not None else ""
            if j.get("reason") and state != "COMPLETED":
                extra = (extra + " " + str(j["reason"])).strip()
        text = [f" {str(j.get('job_id')):>6} {str(j.get('name', ''))[:14]:<14} ",
                (state_attr(state), f"{state:<10}"), f" {where[:12]:<12} {gpus[:9]:<9} ",
                ("dim", extra)]
        return Row(text, "job", ("job", st.group, str(j.get("job_id"))), st, j)

    def workspace_row(self, st: ServerState, w: dict[str, Any]) -> Row:
        state = str(w.get("state"))
        ports = " ".join(f"{p.get('container_port')}\u2192{p.get('host_port')}"
                         for p in w.get("ports") or [])
        extra = w.get("reason") or w.get("error") or ""
        text = [f" {str(w.get('name'))[:16]:<16} ", (state_attr(state), f"{state:<9}"),
                f" {st.name[:12]:<12} {str(w.get('image') or '').removeprefix('localhost/')[-20:]:<20} ", ports,
                ("dim", f" {extra}" if extra else "")]
        return Row(text, "workspace", ("ws", st.name, w.get("name")), st, w)

    def rebuild(self) -> None:
        focus = self.focused()
        key = focus.key if focus is not None else None
        rows = self.rows()
        self.walker[:] = rows
        for i, r in enumerate(rows):
            if isinstance(r, Row) and (key is None or r.key == key):
                self.walker.set_focus(i)
                break
        up = sum(1 for s in self.fleet.visible() if s.status == UP)
        self.header.set_text(f"remotegpu-cli  {up}/{len(self.fleet.visible())} servers up  "
                             f"{time.strftime('%H:%M:%S')}   ? help  q quit")
        self.show_keys()

    def focused(self) -> Row | None:
        w = self.walker.get_focus()[0] if len(self.walker) else None
        return w if isinstance(w, Row) else None

    def show_keys(self) -> None:
        if self.confirm is not None:
            self.keys.set_text([("key", self.confirm[0]), " (y/n)"])
            return
        row = self.focused()
        pairs = KEYS.get(row.kind, []) if row else [("a", "add server")]
        markup: list[Any] = []
        for k, what in pairs:
            markup += [("key", k), f" {what}  "]
        self.keys.set_text(markup)

    def say(self, text: str, error: bool = False) -> None:
        self.message.set_text(("error", text) if error else text)
        if self.loop is not None and self.loop.screen.started:
            self.loop.draw_screen()

    # ------------------------------------------------------------- input

    def on_key(self, key: Any) -> bool:
        if not isinstance(key, str):
            return False
        if self.overlay is not None:
            if key in ("esc", "q", "enter"):
                self.close_overlay()
            return True
        if self.confirm is not None:
            _, action, busy = self.confirm
            self.confirm = None
            if key in ("y", "Y"):
                self.run(action(), busy)
            else:
                self.say("not done")
            self.show_keys()
            return True
        row = self.focused()
        handler = {"q": self.quit, "Q": self.quit, "?": self.help, "r": self.refresh,
                   "a": self.ask_add_server}.get(key)
        if handler is not None:
            handler()
            return True
        if row is None:
            return False
        st = row.state
        if key in ("t", "enter"):
            self.terminal(row)
        elif key == "j":
            self.ask("Job file to submit on %s: " % st.name,
                     lambda p: self.run(self.fleet.submit_job(st, p), f"submitting {p}",
                                        lambda r: f"submitted job {r['job_id']}"))
        elif key == "n":
            self.ask(f"New workspace on {st.name} (NAME TEMPLATE|IMAGE [PORT...]): ",
                     lambda text: self.new_workspace(st, text))
        elif key == "d" and row.kind == "server":
            if st.target.source != LIST:
                self.say(f"{st.name} comes from {st.target.source.replace('_', ' ')}, not "
                         "your list: remove it there", error=True)
            else:
                self.ask_confirm(f"Drop {st.name} from your list?",
                                 lambda: self.fleet.remove_server(st), "dropping")
        elif row.kind == "job" and key in ("c", "l"):
            jid = str(row.item["job_id"]) if row.item else ""
            if key == "c":
                self.ask_confirm(f"Cancel job {jid} on {st.name}?",
                                 lambda: self.fleet.cancel_job(st, jid), f"cancelling {jid}",
                                 lambda r: (f"cancelled {jid}" if r.get("cancelled") else
                                            f"cancelled {jid}; its processes are stopping"
                                            if r.get("stopping") else f"job {jid}: nothing to cancel"))
            else:
                self.follow_log(st, jid)
        elif row.kind == "workspace" and key in ("s", "x", "D", "f"):
            name = str(row.item["name"]) if row.item else ""
            if key == "f":
                self.run(self.fleet.forward_ports(st, name), f"forwarding {name}",
                         lambda pairs: self.forwarded(st, name, pairs))
            elif key == "D":
                self.ask_confirm(f"Remove workspace {name} on {st.name}?",
                                 lambda: self.fleet.workspace_action(st, "rm", name), f"removing {name}")
            else:
                verb = "start" if key == "s" else "stop"
                self.run(self.fleet.workspace_action(st, verb, name), f"{verb} {name}",
                         lambda r: f"{name} is {r.get('state', 'done')}")
        else:
            return False
        return True

    def ask(self, caption: str, then: Callable[[str], None]) -> None:
        def done(answer: str | None) -> None:
            self.footer.contents[0] = (self.message, self.footer.options())
            self.frame.focus_position = "body"
            if answer is not None and answer.strip():
                then(answer.strip())
            else:
                self.say("not done")

        self.footer.contents[0] = (Prompt(caption, done), self.footer.options())
        self.footer.focus_position = 0
        self.frame.focus_position = "footer"

    def ask_confirm(self, question: str, action: Callable[[], Awaitable[Any]], busy: str,
                    done: Callable[[Any], str] | None = None) -> None:
        async def go() -> Any:
            r = await action()
            return done(r) if done else f"{busy}: done"

        self.confirm = (question, go, busy)
        self.show_keys()

    def run(self, coro: Awaitable[Any], busy: str, done: Callable[[Any], str] | None = None) -> None:
        """Run an action in the background; its outcome goes to the message line."""
        self.say(f"{busy}\u2026")

        async def go() -> None:
            try:
                r = await coro
            except MtgpuError as exc:
                self.say(f"{busy}: {exc}", error=True)
                return
            except Exception as exc:  # noqa: BLE001 - shown, never a crash of the screen
                self.say(f"{busy}: {type(exc).__name__}: {exc}", error=True)
                return
            self.say(done(r) if done else (r if isinstance(r, str) else f"{busy}: done"))

        t = asyncio.get_running_loop().create_task(go())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def new_workspace(self, st: ServerState, text: str) -> None:
        parts = text.split()
        if len(parts) < 2 or not all(p.isdigit() for p in parts[2:]):
            self.say("write a name and a template or image, then any ports: dev busybox 8888",
                     error=True)
            return
        name, source, ports = parts[0], parts[1], [int(p) for p in parts[2:]]
        self.run(self.fleet.create_workspace(st, name, source, ports), f"creating {name}",
                 lambda r: f"workspace {name} is {r.get('state', 'created')}")

    def forwarded(self, st: ServerState, name: str, pairs: list[tuple[int, int]]) -> str:
        text = ", ".join(f"localhost:{local} \u2192 {name}:{c}" for c, local in pairs)
        self.forwards.append(text)
        return f"forwarding {text} (while remotegpu-cli runs)"

    def ask_add_server(self) -> None:
        def add(text: str) -> None:
            try:
                st = self.fleet.add_server(parse_destination(text))
            except ServerListError as exc:
                self.say(str(exc), error=True)
                return
            except OSError as exc:
                self.say(f"cannot save the list: {exc}", error=True)
                return
            self.say(f"added {st.name}; connecting")

        self.ask("Add server ([user@]host[:port] or a Host of ~/.ssh/config): ", add)

    def refresh(self) -> None:
        self.fleet.refresh_now()
        self.say("refreshing")

    def quit(self) -> None:
        raise urwid.ExitMainLoop()

    # ---------------------------------------------------------- terminals

    def terminal(self, row: Row) -> None:
        """Hand the terminal to the system ``ssh``: the server's tmux session, or a
        shell in the focused workspace; the view comes back when it ends."""
        st = row.state
        if shutil.which("ssh") is None:
            self.say("no `ssh` program found: install the OpenSSH client", error=True)
            return
        if row.kind == "workspace" and row.item:
            argv = self._ssh(st, "mt-container", "shell", str(row.item["name"]), tty=True)
        else:
            argv = self._ssh(st)
        assert self.loop is not None
        self.loop.screen.stop()
        try:
            rc = subprocess.call(argv)
        except OSError as exc:
            self.say(f"`{' '.join(argv)}` could not start: {exc}", error=True)
            return
        finally:
            self.loop.screen.start()
            self.loop.screen.clear()
        self.say(f"back from {st.name} (ssh exited {rc})", error=rc != 0)

    def _ssh(self, st: ServerState, *command: str, tty: bool = False) -> list[str]:
        argv = st.target.ssh_argv(*command, tty=tty)
        cfg = ssh_config_file()
        # The same ~/.ssh/config as this program read, even where HOME was changed.
        if cfg.is_file():
            argv[1:1] = ["-F", str(cfg)]
        if st.user and not st.target.user:
            argv[1:1] = ["-l", st.user]
        return argv

    def follow_log(self, st: ServerState, job_id: str) -> None:
        body: Any = urwid.SimpleFocusListWalker([])
        box = urwid.LineBox(urwid.ListBox(body), title=f"job {job_id} on {st.name}  (Esc closes)")
        assert self.loop is not None
        self.loop.widget = urwid.Overlay(box, self.frame, "center", ("relative", 96), "middle",
                                         ("relative", 90))
        self.overlay = {"body": body, "partial": ""}

        async def go() -> None:
            ov = self.overlay
            try:
                async for chunk in self.fleet.follow_log(st, job_id):
                    if self.overlay is not ov or ov is None:
                        return
                    self._log_add(ov, chunk)
                if self.overlay is ov and ov is not None:
                    self._log_add(ov, "\n-- end of output --\n")
            except MtgpuError as exc:
                if self.overlay is ov and ov is not None:
                    self._log_add(ov, f"\n-- {exc} --\n")

        t = asyncio.get_running_loop().create_task(go())
        self.overlay["task"] = t

    def _log_add(self, ov: dict[str, Any], chunk: str) -> None:
        text = ov["partial"] + chunk.replace("\r\n", "\n")
        *lines, ov["partial"] = text.split("\n")
        body = ov["body"]
        for line in lines:
            body.append(urwid.Text(line.expandtabs()))
        if len(body) > 5000:
            del body[:len(body) - 5000]
        if len(body):
            body.set_focus(len(body) - 1)
        if self.loop is not None and self.loop.screen.started:
            self.loop.draw_screen()

    def close_overlay(self) -> None:
        if self.overlay is not None and self.overlay.get("task") is not None:
            self.overlay["task"].cancel()
        self.overlay = None
        assert self.loop is not None
        self.loop.widget = self.frame

    def help(self) -> None:
        lines = [
            "remotegpu-cli keys",
            "",
            "  up/down, PgUp/PgDn  move        r  refresh now        q  quit",
            "  on a server:     t/Enter terminal (ssh into its tmux session)",
            "                   j submit a job file   n new workspace",
            "                   a add a server        d drop it from your list",
            "  on a job:        c cancel   l follow its log   t terminal",
            "  on a workspace:  t shell in it   s start   x stop   D remove",
            "                   f forward its ports to localhost",
            "",
            f"  your list: {self.fleet.server_list.path}",
            "  Esc closes this",
        ]
        box = urwid.LineBox(urwid.ListBox(urwid.SimpleFocusListWalker([urwid.Text(x) for x in lines])))
        assert self.loop is not None
        self.loop.widget = urwid.Overlay(box, self.frame, "center", ("relative", 96), "middle",
                                         len(lines) + 2)
        self.overlay = {}


def _age(seconds: float) -> str:
    """Elapsed time in the largest unit.

    >>> _age(59), _age(125), _age(7300)
    ('59s', '2m', '2h01')
    """
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}"


def no_color() -> bool:
    """NO_COLOR (https://no-color.org): set and not empty turns colours off."""
    return bool(os.environ.get("NO_COLOR"))


def run_screen(fleet: Fleet) -> int:
    """Run the full-screen view until the user quits."""
    from urwid.display.raw import Screen

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    screen = Screen()
    if no_color():
        screen.set_terminal_properties(colors=1)
    app = App(fleet)
    app.loop = urwid.MainLoop(app.frame, PALETTE, screen=screen, unhandled_input=app.on_key,
                              event_loop=urwid.AsyncioEventLoop(loop=loop), handle_mouse=False)
    loop.call_soon(fleet.start)
    try:
        app.loop.run()
    finally:
        loop.run_until_complete(fleet.stop())
        loop.close()
    return 0


