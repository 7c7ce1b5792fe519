"""The full-screen view of remotegpu-cli (urwid): one list of servers, GPUs, jobs and
workspaces, laid out for the terminal's width, with the keys of the focused line shown
at the bottom (the keys themselves are :data:`mtgpu.tui.view.KEYMAP`).

It only draws :class:`~mtgpu.tui.fleet.Fleet` and calls its actions. Colours are the
terminal's own 16 (default background); with ``NO_COLOR`` set only bold and reverse
video are used.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import urwid

from mtgpu.errors import MtgpuError
from mtgpu.jobstate import COMPLETED, PENDING, RUNNING
from mtgpu.proc import call
from mtgpu.text import printable
from mtgpu.tui.fleet import UP, Fleet, ServerState
from mtgpu.tui.main import mig_under_cards
from mtgpu.tui.sources import LIST, ServerListError, parse_destination, ssh_config_file
from mtgpu.tui.view import (
    FINAL,
    WIDE,
    Column,
    GpuLayout,
    action_for,
    bar_cells,
    fit,
    footer_keys,
    gib,
    gpu_layout,
    help_lines,
    job_cells,
    job_columns,
    job_details,
    sparkline,
    usage_text,
)

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


def state_attr(state: str) -> str:
    if state in (RUNNING, COMPLETED, UP):
        return "up"
    if state in (PENDING, "STARTING", "STOPPED", "connecting"):
        return "wait"
    return "down" if state in FINAL or state in ("unreachable", "ENDED") else "dim"


def bar(fraction: float, width: int) -> list[Any]:
    """A usage bar as urwid markup: ``[█████░░░░░]``, red from 90 %."""
    n = bar_cells(fraction, width)
    return ["[", ("hot" if fraction >= 0.9 else "bar", "\u2588" * n), ("dim", "\u2591" * (width - n)), "]"]


def safe_markup(markup: Any) -> Any:
    r"""urwid markup with every string passed through :func:`printable`: job names,
    reasons and user names come from tenants, and urwid writes control characters to
    the terminal as they are.

    >>> safe_markup([("up", "a\x1b[2Jb"), " c\x07"])
    [('up', 'a\\x1b[2Jb'), ' c\\x07']
    """
    if isinstance(markup, str):
        return printable(markup)
    if isinstance(markup, tuple):
        return (markup[0], safe_markup(markup[1]))
    if isinstance(markup, list):
        return [safe_markup(m) for m in markup]
    return markup


class Row(urwid.WidgetWrap):
    """One selectable line; ``kind`` says which keys apply to it. ``markup`` is urwid
    text markup (made printable here), or a widget whose texts already are."""

    def __init__(
        self,
        markup: Any,
        kind: str,
        key: tuple[Any, ...],
        state: ServerState,
        item: dict[str, Any] | None = None,
        wrap: Literal["clip", "space"] = "clip",
    ) -> None:
        self.kind, self.key, self.state, self.item = kind, key, state, item
        inner = markup if isinstance(markup, urwid.Widget) else urwid.Text(safe_markup(markup), wrap=wrap)
        super().__init__(urwid.AttrMap(inner, None, focus_map="focus"))

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

    def __init__(self, fleet: Fleet, width: int = 80) -> None:
        self.fleet = fleet
        #: The terminal's width the rows were laid out for (the loop's, once running).
        self.width = width
        #: Only lines containing this text are shown (``/``); empty: all.
        self.filter = ""
        self.walker: Any = urwid.SimpleFocusListWalker([])
        self.listbox = urwid.ListBox(self.walker)
        self.header = urwid.Text("", wrap="clip")
        self.message = urwid.Text("", wrap="clip")
        self.keys = urwid.Text("", wrap="space")
        self.footer = urwid.Pile([self.message, self.keys])
        self.frame = urwid.Frame(
            self.listbox, header=urwid.AttrMap(self.header, "header"), footer=self.footer
        )
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

    def _shown(self, *texts: Any) -> bool:
        """Whether a line with these texts passes the filter (case does not matter)."""
        if not self.filter:
            return True
        return self.filter.lower() in " ".join(str(t) for t in texts if t is not None).lower()

    def rows(self) -> list[urwid.Widget]:
        fleet = self.fleet
        now = time.time()
        out: list[urwid.Widget] = [urwid.AttrMap(urwid.Text("SERVERS"), "heading")]
        servers = fleet.visible()
        if not servers:
            out.append(urwid.Text(("dim", "  none yet: press a to add one, or add a Host to ~/.ssh/config")))
        for st in servers:
            n = st.node() or {}
            gpu_types = " ".join(str(g.get("type")) for g in n.get("gpus") or [])
            if self._shown(st.name, st.status, st.reason, st.user, st.server, st.cluster_id, gpu_types):
                out += self.server_rows(st)
        out.append(urwid.AttrMap(urwid.Text("JOBS"), "heading"))
        if fleet.jobs():
            cols = job_columns(self.width)
            out.append(
                urwid.Text(("dim", self._cells_text({c.name: c.heading for c in cols}, cols)), wrap="clip")
            )
        jobs = [
            (st, j)
            for st, j in fleet.jobs()
            if self._shown(*job_cells(j, st.server or st.name, now, self.width >= WIDE).values())
        ]
        active = [x for x in jobs if x[1].get("state") not in FINAL]
        done = [x for x in jobs if x[1].get("state") in FINAL][:MAX_FINISHED]
        if not active and not done:
            what = (
                f"no jobs matching {self.filter!r}"
                if self.filter
                else "no jobs: press b on a server to submit a job file"
            )
            out.append(urwid.Text(("dim", f"  {what}")))
        for st, j in active + done:
            out.append(self.job_row(st, j, now))
        if any(st.workspaces is not None for st in servers if st.status == UP):
            out.append(urwid.AttrMap(urwid.Text("WORKSPACES"), "heading"))
            wss = [
                (st, w)
                for st, w in fleet.workspaces()
                if self._shown(w.get("name"), w.get("state"), st.name, w.get("image"), w.get("reason"))
            ]
            if not wss:
                out.append(urwid.Text(("dim", "  none: press n on a server to create one")))
            for st, w in wss:
                out.append(self.workspace_row(st, w))
        return out

    def server_rows(self, st: ServerState) -> list[urwid.Widget]:
        if st.status != UP:
            mark = "\u2717" if st.status != "connecting" else "\u2026"
            text = [(state_attr(st.status), f"{mark} {st.name}"), "  ", (state_attr(st.status), st.status)]
            if st.reason:
                text.append(f": {st.reason}")
            return [Row(text, "server", ("server", st.name), st, wrap="space")]
        n = st.node() or {}
        head = [
            ("up", f"\u25cf {st.name}"),
            f"  {st.user}@{st.server}",
            f"  {st.cluster_id}" if st.cluster_id else "",
            f"  CPU {n.get('cpus', '-')} {int(n.get('cpu_percent') or 0):>3}%",
            f"  RAM {gib(n.get('ram_used'))}/{gib(n.get('ram_total'))}",
        ]
        if n.get("state") and n.get("state") != "up":
            head.append(("wait", f"  {n['state']}"))
        rows: list[urwid.Widget] = [Row(head, "server", ("server", st.name), st)]
        if st.notice:
            rows.append(
                Row(("error", f"   warning: {st.notice}"), "server", ("notice", st.name), st, wrap="space")
            )
        if st.usage is not None or st.usage_error is not None:
            # The user's own usage this month: a line to read, not one to act on (the
            # cursor passes it by, as it does headings).
            used = f"   {usage_text(st.usage, st.usage_error)}"
            rows.append(
                urwid.Text(safe_markup(used if st.usage is not None else ("dim", used)), wrap="space")
            )
        lay = gpu_layout(self.width)
        for g in mig_under_cards(n.get("gpus", [])):
            rows.append(
                Row(
                    self.gpu_text(st, str(n.get("name")), g, lay),
                    "server",
                    ("gpu", st.name, g.get("index")),
                    st,
                    g,
                )
            )
        if not n.get("gpus"):
            rows.append(Row(("dim", "   no GPUs"), "server", ("gpu", st.name, None), st))
        return rows

    def gpu_text(self, st: ServerState, node: str, g: dict[str, Any], lay: GpuLayout) -> list[Any]:
        """``GPU0 rtx4090  [███░░] 45% ▁▂▅▇ [██░░░] 12.0/24.0G  jobs 3``: utilisation
        as a bar, its recent history, then memory in use (and its history when wide)."""
        used, total = int(g.get("vram_used") or 0), int(g.get("vram_total") or 0)
        util = int(g.get("util") or 0)
        jobs = ",".join(str(x) for x in g.get("jobs", []))
        hist = st.history.get((node, g.get("index")))
        # A MIG device is drawn under its card, which no job gets whole.
        lead = "     \u2514 " if g.get("parent") is not None else "   "
        kind = str(g.get("type")) + (" MIG" if g.get("mig_mode") and g.get("parent") is None else "")
        text = [
            f"{lead}GPU{g.get('index')} {fit(kind, lay.type_width)} ",
            *bar(util / 100, lay.bar),
            f" {util:>3}% ",
            ("bar", sparkline(hist.util if hist else (), lay.spark)),
            " ",
            *bar(used / total if total else 0.0, lay.bar),
            f" {used / 2**30:4.1f}/{gib(total)}",
        ]
        if lay.mem_spark:
            text += [" ", ("bar", sparkline(hist.mem if hist else (), lay.mem_spark))]
        if jobs:
            text.append(("dim", f"  jobs {jobs}"))
        return text

    @staticmethod
    def _cells_text(cells: dict[str, str], cols: list[Column]) -> str:
        return " ".join(
            fit(cells.get(c.name, ""), c.width, c.align) if c.width else cells.get(c.name, "") for c in cols
        )

    def job_row(self, st: ServerState, j: dict[str, Any], now: float | None = None) -> Row:
        """One job in the columns that fit the terminal; its reason wraps in the last."""
        cols = job_columns(self.width)
        cells = job_cells(j, st.server or st.name, time.time() if now is None else now, self.width >= WIDE)
        parts: list[Any] = []
        for c in cols:
            if not c.width:
                # A waiting job's reason is what the user acts on: all of it, wrapped.
                # A finished one's stays on its line (Enter shows it whole).
                wrap: Literal["clip", "space"] = "space" if cells["state"] == PENDING else "clip"
                parts.append(urwid.Text(("dim", printable(cells["reason"])), wrap=wrap))
                continue
            text = fit(printable(cells[c.name]), c.width, c.align)
            markup = (state_attr(cells["state"]), text) if c.name == "state" else text
            parts.append((c.width, urwid.Text(markup, wrap="clip")))
        return Row(urwid.Columns(parts, dividechars=1), "job", ("job", st.group, str(j.get("job_id"))), st, j)

    def workspace_row(self, st: ServerState, w: dict[str, Any]) -> Row:
        state = str(w.get("state"))
        ports = " ".join(f"{p.get('container_port')}\u2192{p.get('host_port')}" for p in w.get("ports") or [])
        extra = w.get("reason") or w.get("error") or ""
        wide = self.width >= WIDE
        text = [
            f" {fit(str(w.get('name')), 24 if wide else 16)} ",
            (state_attr(state), f"{state:<9}"),
            f" {fit(st.name, 16 if wide else 12)} {str(w.get('image') or '').removeprefix('localhost/')[-20:]:<20} ",
            ports,
            ("dim", f" {extra}" if extra else ""),
        ]
        return Row(text, "workspace", ("ws", st.name, w.get("name")), st, w, wrap="space")

    def rebuild(self) -> None:
        if self.loop is not None and self.loop.screen.started:
            self.width = self.loop.screen.get_cols_rows()[0]
        focus = self.focused()
        key = focus.key if focus is not None else None
        rows = self.rows()
        self.walker[:] = rows
        for i, r in enumerate(rows):
            if isinstance(r, Row) and (key is None or r.key == key):
                self.walker.set_focus(i)
                break
        up = sum(1 for s in self.fleet.visible() if s.status == UP)
        shown = f"   filter: {printable(self.filter)} (Esc clears)" if self.filter else ""
        self.header.set_text(
            f"remotegpu-cli  {up}/{len(self.fleet.visible())} servers up  "
            f"{time.strftime('%H:%M:%S')}{shown}   ? keys  q quit"
        )
        self.show_keys()

    def focused(self) -> Row | None:
        w = self.walker.get_focus()[0] if len(self.walker) else None
        return w if isinstance(w, Row) else None

    def show_keys(self) -> None:
        if self.confirm is not None:
            self.keys.set_text([("key", self.confirm[0]), " (y/n)"])
            return
        row = self.focused()
        pairs = footer_keys(row.kind if row else None)
        if row is None:
            pairs = [("a", "add server"), *pairs]
        markup: list[Any] = []
        for k, what in pairs:
            markup += ["  " if markup else "", ("key", k), f" {what}"]
        self.keys.set_text(markup)

    def say(self, text: str, error: bool = False) -> None:
        # An error is shown whole, over as many lines as it takes; news stays one line.
        self.message.set_wrap_mode("space" if error else "clip")
        self.message.set_text(("error", text) if error else text)
        if self.loop is not None and self.loop.screen.started:
            self.loop.draw_screen()

    # ------------------------------------------------------------- input

    def move(self, where: int | str) -> None:
        """Focus the next (``1``), previous (``-1``), ``first`` or ``last`` line that
        takes keys."""
        rows = [i for i, w in enumerate(self.walker) if isinstance(w, Row)]
        if not rows:
            return
        here = self.walker.get_focus()[1] or 0
        if where == "first":
            i = rows[0]
        elif where == "last":
            i = rows[-1]
        elif where == 1:
            i = next((r for r in rows if r > here), rows[-1])
        else:
            i = next((r for r in reversed(rows) if r < here), rows[0])
        self.walker.set_focus(i)
        self.show_keys()

    def input_filter(self, keys: list[Any], raw: list[int]) -> list[Any]:
        """The terminal was resized: lay the rows out again for its new width."""
        if "window resize" in keys:
            self.changed()
        return keys

    def on_key(self, key: Any) -> bool:
        if not isinstance(key, str):
            return False
        if self.overlay is not None:
            if key in ("q", "Q"):
                self.quit()
            if key in ("esc", "enter"):
                self.close_overlay()
            elif key in ("j", "k") and self.loop is not None:  # scroll, as in less
                self.loop.widget.keypress(self.loop.screen.get_cols_rows(), "down" if key == "j" else "up")
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
        if key == "esc" and self.filter:
            self.set_filter("")
            return True
        row = self.focused()
        name = action_for(key, row.kind if row else None)
        anywhere = {
            "down": lambda: self.move(1),
            "up": lambda: self.move(-1),
            "top": lambda: self.move("first"),
            "bottom": lambda: self.move("last"),
            "filter": self.ask_filter,
            "help": self.help,
            "refresh": self.refresh,
            "add_server": self.ask_add_server,
            "quit": self.quit,
        }
        if name in anywhere:
            anywhere[name]()
            return True
        if row is None or name is None:
            return False
        self.act(name, row)
        return True

    def act(self, name: str, row: Row) -> None:
        """Do ``name`` (an action of :data:`~mtgpu.tui.view.KEYMAP`) on ``row``."""
        st = row.state
        item = row.item or {}
        if name == "details":
            self.details(row)
        elif name == "ssh":
            self.terminal(row)
        elif name == "submit":
            self.ask(
                f"Job file to submit on {st.name}: ",
                lambda p: self.run(
                    self.fleet.submit_job(st, p), f"submitting {p}", lambda r: f"submitted job {r['job_id']}"
                ),
            )
        elif name == "new_workspace":
            self.ask_new_workspace(st)
        elif name == "drop_server":
            if st.target.source != LIST:
                self.say(
                    f"{st.name} comes from {st.target.source.replace('_', ' ')}, not "
                    "your list: remove it there",
                    error=True,
                )
            else:
                self.ask_confirm(
                    f"Drop {st.name} from your list?", lambda: self.fleet.remove_server(st), "dropping"
                )
        elif name == "cancel":
            jid = str(item.get("job_id"))
            self.ask_confirm(
                f"Cancel job {jid} on {st.name}?",
                lambda: self.fleet.cancel_job(st, jid),
                f"cancelling {jid}",
                lambda r: (
                    f"cancelled {jid}"
                    if r.get("cancelled")
                    else f"cancelled {jid}; its processes are stopping"
                    if r.get("stopping")
                    else f"job {jid}: nothing to cancel"
                ),
            )
        elif name == "log":
            self.follow_log(st, str(item.get("job_id")))
        elif name == "forward":
            ws = str(item.get("name"))
            self.run(
                self.fleet.forward_ports(st, ws),
                f"forwarding {ws}",
                lambda pairs: self.forwarded(st, ws, pairs),
            )
        elif name == "remove":
            ws = str(item.get("name"))
            self.ask_confirm(
                f"Remove workspace {ws} on {st.name}?",
                lambda: self.fleet.workspace_action(st, "rm", ws),
                f"removing {ws}",
            )
        elif name in ("start", "stop"):
            ws = str(item.get("name"))
            self.run(
                self.fleet.workspace_action(st, name, ws),
                f"{name} {ws}",
                lambda r: f"{ws} is {r.get('state', 'done')}",
            )

    def set_filter(self, text: str) -> None:
        self.filter = text.strip()
        self.rebuild()
        if self.loop is not None and self.loop.screen.started:
            self.loop.draw_screen()

    def ask_filter(self) -> None:
        """``/``: lines are filtered as the text is typed; Enter keeps it, Esc clears it."""
        before = self.filter

        def done(answer: str | None) -> None:
            self.footer.contents[0] = (self.message, self.footer.options())
            self.frame.focus_position = "body"
            self.set_filter(answer if answer is not None else "")
            self.say(f"showing lines with {self.filter!r}; Esc shows all" if self.filter else "")

        prompt = Prompt("/", done)
        prompt.set_edit_text(before)
        prompt.set_edit_pos(len(before))
        urwid.connect_signal(prompt, "postchange", lambda w, _old: self.set_filter(w.edit_text))
        self.footer.contents[0] = (prompt, self.footer.options())
        self.footer.focus_position = 0
        self.frame.focus_position = "footer"

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

    def ask_confirm(
        self,
        question: str,
        action: Callable[[], Awaitable[Any]],
        busy: str,
        done: Callable[[Any], str] | None = None,
    ) -> None:
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

    def ask_new_workspace(self, st: ServerState) -> None:
        """Ask for a new workspace, listing what the server offers: its templates and
        the images every tenant may use (asked for first; without them, the bare prompt)."""

        async def go() -> None:
            try:
                templates, images, any_image = await self.fleet.workspace_choices(st)
            except MtgpuError:
                templates, images, any_image = [], [], False
            offered = [f"templates: {', '.join(templates)}" if templates else "no templates"]
            if images:
                offered.append(f"images: {', '.join(images)}")
            if any_image:
                offered.append("or any image")
            self.ask(
                f"New workspace on {st.name} ({'; '.join(offered)}). NAME TEMPLATE|IMAGE [PORT...]: ",
                lambda text: self.new_workspace(st, text),
            )

        t = asyncio.get_running_loop().create_task(go())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def new_workspace(self, st: ServerState, text: str) -> None:
        parts = text.split()
        if len(parts) < 2 or not all(p.isdigit() for p in parts[2:]):
            self.say("write a name and a template or image, then any ports: dev busybox 8888", error=True)
            return
        name, source, ports = parts[0], parts[1], [int(p) for p in parts[2:]]
        self.run(
            self.fleet.create_workspace(st, name, source, ports),
            f"creating {name}",
            lambda r: f"workspace {name} is {r.get('state', 'created')}",
        )

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
        """Leave at once: nothing waits for a server (see :meth:`Fleet.abort`)."""
        for t in self._tasks:
            t.cancel()
        if self.overlay is not None and self.overlay.get("task") is not None:
            self.overlay["task"].cancel()
        self.fleet.abort()
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
            rc = call(argv)
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
        self.loop.widget = urwid.Overlay(
            box, self.frame, "center", ("relative", 96), "middle", ("relative", 90)
        )
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
            del body[: len(body) - 5000]
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

    def _show_overlay(self, title: str, lines: list[Any]) -> None:
        texts = [urwid.Text(safe_markup(x)) for x in lines]
        box = urwid.LineBox(urwid.ListBox(urwid.SimpleFocusListWalker(texts)), title=printable(title))
        assert self.loop is not None
        cols, rows = self.loop.screen.get_cols_rows()
        inner = max(10, cols * 96 // 100 - 2)
        height = min(sum(t.rows((inner,)) for t in texts) + 2, max(5, rows - 2))
        self.loop.widget = urwid.Overlay(box, self.frame, "center", ("relative", 96), "middle", height)
        self.overlay = {}

    def help(self) -> None:
        lines = [*help_lines(), "", f"your list: {self.fleet.server_list.path}"]
        self._show_overlay("remotegpu-cli keys  (Esc closes)", lines)

    def details(self, row: Row) -> None:
        """Enter: everything known of the focused line, long texts wrapped in full."""
        st = row.state
        if row.kind == "job" and row.item is not None:
            pairs = job_details(row.item, st.server or st.name, time.time())
            title = f"job {row.item.get('job_id')} on {st.name}"
        elif row.kind == "workspace" and row.item is not None:
            pairs = [(str(k), str(v)) for k, v in row.item.items() if v not in (None, "", [], {})]
            title = f"workspace {row.item.get('name')} on {st.name}"
        else:
            pairs = self.server_details(st)
            title = f"server {st.name}"
        width = max(len(k) for k, _ in pairs) if pairs else 0
        self._show_overlay(f"{title}  (Esc closes)", [[("key", f"{k:<{width}}  "), v] for k, v in pairs])

    def server_details(self, st: ServerState) -> list[tuple[str, str]]:
        n = st.node() or {}
        pairs = [
            ("server", st.name),
            ("reached as", " ".join(self._ssh(st))),
            ("from", st.target.source.replace("_", " ")),
            ("status", st.status),
            ("reason", st.reason or "-"),
            ("user", st.user or "-"),
            ("name there", st.server or "-"),
            ("cluster", st.cluster_id or "standalone"),
            ("cpus", f"{n.get('cpus', '-')} ({int(n.get('cpu_percent') or 0)}% busy)"),
            ("ram", f"{gib(n.get('ram_used'))} of {gib(n.get('ram_total'))}"),
        ]
        if st.notice:
            pairs.append(("warning", st.notice))
        if st.usage is not None or st.usage_error is not None:
            pairs.append(("your usage", usage_text(st.usage, st.usage_error)))
        if st.usage is not None:
            u = st.usage
            pairs.append(("period", f"{u['start']} to {u['end']} (UTC days)"))
        for g in mig_under_cards(n.get("gpus", [])):
            hist = st.history.get((str(n.get("name")), g.get("index")))
            jobs = ",".join(str(x) for x in g.get("jobs", [])) or "none"
            pairs.append(
                (
                    f"GPU{g.get('index')}",
                    f"{g.get('type')}  util {int(g.get('util') or 0)}% "
                    f"{sparkline(hist.util if hist else (), min(30, len(hist.util) if hist else 0))}  memory {gib(g.get('vram_used'))} "
                    f"of {gib(g.get('vram_total'))} {sparkline(hist.mem if hist else (), min(30, len(hist.mem) if hist else 0))}"
                    f"  jobs {jobs}",
                )
            )
        return pairs


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
    app.loop = urwid.MainLoop(
        app.frame,
        PALETTE,
        screen=screen,
        unhandled_input=app.on_key,
        input_filter=app.input_filter,
        event_loop=urwid.AsyncioEventLoop(loop=loop),
        handle_mouse=False,
    )
    loop.call_soon(fleet.start)
    try:
        app.loop.run()
    finally:
        # Connections are dropped, not closed politely: quitting waits for no server.
        loop.run_until_complete(fleet.stop())
        loop.close()
    return 0
