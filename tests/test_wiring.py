"""The daemon's one composition root, and the dispatcher's middleware.

``mtgpu/server.py`` builds every part with what it uses in its constructor: it sets
no attribute of another object after making it (a callback assigned later is a
dependency the constructor does not show). The dispatcher's private table is its
own: leader forwarding is a middleware (``Dispatcher.use``), not a handler swapped
in from outside. Both are read from the source, so a shortcut added later fails
here with its line.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

from mtgpu.api.dispatcher import Caller, Dispatcher, Next

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mtgpu"
SERVER = PACKAGE / "server.py"
DISPATCHER = PACKAGE / "api" / "dispatcher.py"

#: Module-wide settings the daemon sets, not parts' attributes.
MODULE_SETTINGS = frozenset({"tempfile.tempdir"})

ADMIN = Caller("root", 0, True, "socket")
TENANT = Caller("ann", 2001, False, "socket")


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        found = [node.target]
    else:
        return []
    out: list[ast.expr] = []
    while found:
        t = found.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            found.extend(t.elts)
        else:
            out.append(t)
    return out


def test_the_daemon_sets_no_attribute_of_a_part_after_making_it():
    tree = ast.parse(SERVER.read_text())
    wrong = []
    for node in ast.walk(tree):
        for t in _targets(node):
            if not isinstance(t, ast.Attribute):
                continue
            own = isinstance(t.value, ast.Name) and t.value.id == "self"  # self.x: the daemon's own
            if not own and ast.unparse(t) not in MODULE_SETTINGS:
                wrong.append(f"server.py:{node.lineno}: {ast.unparse(t)} = ...")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            wrong.append(f"server.py:{node.lineno}: setattr(...)")
    assert not wrong, "give these to the part's constructor instead:\n" + "\n".join(wrong)


#: The parts the daemon makes; each is made in one place, Daemon.wire.
PARTS = frozenset(
    {"Gateway", "ClusterRuntime", "StateStore", "Runner", "Workspaces", "JobContainers", "Agent"}
    | {"Scheduler", "VramWatch", "Podman"}
)


def test_every_part_is_made_in_wire_the_one_composition_root():
    tree = ast.parse(SERVER.read_text(), str(SERVER))
    made: dict[str, list[str]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for fn in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PARTS:
                    made.setdefault(node.func.id, []).append(f"{cls.name}.{fn.name}")
    assert set(made) == PARTS, f"parts not made in server.py: {sorted(PARTS - set(made))}"
    elsewhere = {part: where for part, where in made.items() if where != ["Daemon.wire"]}
    assert not elsewhere, f"parts made outside Daemon.wire, or twice: {elsewhere}"


def _dispatcher_private() -> set[str]:
    """The private attributes the dispatcher keeps (``self._name = ...`` in its class)."""
    tree = ast.parse(DISPATCHER.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Dispatcher")
    return {
        t.attr
        for node in ast.walk(cls)
        for t in _targets(node)
        if isinstance(t, ast.Attribute)
        and isinstance(t.value, ast.Name)
        and t.value.id == "self"
        and t.attr.startswith("_")
    }


def test_nothing_outside_the_dispatcher_touches_its_private_table():
    private = _dispatcher_private()
    assert "_ops" in private and "_middleware" in private  # the scan reads the class
    wrong = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        if path == DISPATCHER:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in private:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    assert not wrong, "use the dispatcher's public methods (op, register, use):\n" + "\n".join(wrong)


def test_leader_forwarding_is_middleware_not_a_handler_swapped_in():
    """Cluster operations are registered in mtgpu/api/cluster.py, forwarding among them."""
    text = SERVER.read_text()
    assert "cluster_api.leader_forwarding(" in text and ".use(" in text
    calls = [
        ast.unparse(n.args[0])
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "register"
        and isinstance(n.func.value, ast.Attribute)
        and n.func.value.attr == "dispatcher"
        and n.args
    ]
    # What server.py registers itself: its host's own operations, none of the cluster's.
    assert sorted(calls) == ["'config.reload'", "'simulate'"]


# ---------------------------------------------------------------- middleware


def _ask(d: Dispatcher, op: str, caller: Caller = ADMIN, **args: Any) -> dict[str, Any]:
    return asyncio.run(d.handle(caller, {"op": op, "args": args, "id": 7}))


def test_middleware_runs_outermost_first_around_the_handler():
    seen: list[str] = []

    def layer(tag: str) -> Any:
        async def mw(caller: Caller, op: str, args: dict[str, Any], call_next: Next) -> Any:
            seen.append(f"{tag}>{op}")
            result = await call_next(caller, args)
            seen.append(f"<{tag}")
            return result

        return mw

    def handler(caller: Caller, args: dict[str, Any]) -> str:
        seen.append("handler")
        return "done"

    d = Dispatcher(middleware=[layer("a")])
    d.use(layer("b"))
    d.register("x", handler)
    assert _ask(d, "x") == {"id": 7, "ok": True, "result": "done"}
    assert seen == ["a>x", "b>x", "handler", "<b", "<a"]


def test_a_middleware_may_answer_itself_and_the_handler_is_not_called():
    called: list[str] = []

    async def answers(caller: Caller, op: str, args: dict[str, Any], call_next: Next) -> Any:
        if op == "relayed":
            return {"from": "elsewhere", "args": args}
        return await call_next(caller, args)

    d = Dispatcher(middleware=[answers])
    d.register("relayed", lambda caller, args: called.append("relayed"))
    d.register("local", lambda caller, args: called.append("local") or "here")
    assert _ask(d, "relayed", n=1)["result"] == {"from": "elsewhere", "args": {"n": 1}}
    assert _ask(d, "local")["result"] == "here"
    assert called == ["local"]


def test_a_middleware_passes_on_changed_arguments_and_async_handlers_are_awaited():
    async def adds(caller: Caller, op: str, args: dict[str, Any], call_next: Next) -> Any:
        return await call_next(caller, {**args, "added": True})

    async def handler(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        return args

    d = Dispatcher(middleware=[adds])
    d.register("x", handler)
    assert _ask(d, "x", n=2)["result"] == {"n": 2, "added": True}


def test_middleware_runs_after_the_admin_check_and_guards_and_its_refusals_are_answers():
    from mtgpu.errors import ApiError

    seen: list[str] = []

    async def mw(caller: Caller, op: str, args: dict[str, Any], call_next: Next) -> Any:
        seen.append(op)
        if args.get("refuse"):
            raise ApiError("the leader is away", "no_leader")
        return await call_next(caller, args)

    def guard(caller: Caller, args: dict[str, Any]) -> None:
        if args.get("bad"):
            raise ApiError("guarded", "forbidden")

    audited: list[tuple[str, str | None]] = []

    async def auditor(caller: Caller, op: str, args: dict[str, Any], error: str | None) -> None:
        audited.append((op, error))

    d = Dispatcher(middleware=[mw], auditor=auditor)
    d.register("admin.op", lambda caller, args: "ok", admin=True, audit=True)
    d.guard("admin.op", guard)
    assert _ask(d, "admin.op", TENANT)["code"] == "forbidden"
    assert _ask(d, "admin.op", bad=True)["error"] == "guarded"
    assert seen == []
    r = _ask(d, "admin.op", refuse=True)
    assert not r["ok"] and r["code"] == "no_leader" and r["id"] == 7
    assert _ask(d, "admin.op")["result"] == "ok"
    assert seen == ["admin.op", "admin.op"]
    assert audited == [("admin.op", "guarded"), ("admin.op", "the leader is away"), ("admin.op", None)]
