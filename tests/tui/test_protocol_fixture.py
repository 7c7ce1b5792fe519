"""remotegpu-cli replays the clients' shared protocol description (clients/protocol/api.jsonl)
against a real server: for each step its own Fleet action runs, the requests it writes on
the wire must be the step's, and the server's answers must match the step's patterns. The
VS Code extension's tests replay the same file (tests/tui/test_vscode.py), so the two
clients cannot drift apart without one of them failing."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from mtgpu.errors import ApiError, MtgpuError
from mtgpu.tui.fleet import Fleet, ServerState
from mtgpu.tui.link import ApiChannel
from mtgpu.tui.sources import load_server_list

pytestmark = [pytest.mark.root, pytest.mark.podman]

REPO = Path(__file__).resolve().parent.parent.parent
FIXTURE = REPO / "clients" / "protocol" / "api.jsonl"
_TYPES: dict[str, Any] = {
    "string": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "any": lambda v: True,
}
_VAR = re.compile(r"\{(=?)([a-z_]+)\}")


def steps() -> list[dict[str, Any]]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]


def subst(text: str, env: dict[str, Any]) -> str:
    return _VAR.sub(lambda m: str(env[m[2]]) if not m[1] else m[0], text)


def match(pattern: Any, value: Any, env: dict[str, Any], exact: bool, where: str = "$") -> None:
    """Raise AssertionError naming the first place ``value`` does not match ``pattern``."""
    if isinstance(pattern, str):
        m = re.fullmatch(r"<([a-z|]+)>", pattern)
        if m:
            assert any(_TYPES[t](value) for t in m[1].split("|")), f"{where}: {value!r} is not {pattern}"
            return
        cap = re.fullmatch(r"\{=([a-z_]+)\}", pattern)
        if cap:
            env[cap[1]] = value
            return
        assert value == subst(pattern, env), f"{where}: {value!r} != {subst(pattern, env)!r}"
    elif isinstance(pattern, dict) and "$each" in pattern:
        assert isinstance(value, list), f"{where}: {value!r} is not a list"
        for i, item in enumerate(value):
            match(pattern["$each"], item, env, exact, f"{where}[{i}]")
    elif isinstance(pattern, dict):
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        if exact:
            assert set(value) == set(pattern), f"{where}: keys {sorted(value)} != {sorted(pattern)}"
        for k, p in pattern.items():
            assert k in value, f"{where}: no {k!r} in {value!r}"
            match(p, value[k], env, exact, f"{where}.{k}")
    elif isinstance(pattern, list):
        assert isinstance(value, list) and len(value) == len(pattern), f"{where}: {value!r} != {pattern!r}"
        for i, (p, v) in enumerate(zip(pattern, value, strict=True)):
            match(p, v, env, exact, f"{where}[{i}]")
    else:
        assert value == pattern and type(value) is type(pattern), f"{where}: {value!r} != {pattern!r}"


class _Tap:
    """The API channel's writer, noting each request line it is given."""

    def __init__(self, writer: Any, wire: list[dict[str, Any]]) -> None:
        self._writer, self._wire = writer, wire

    def write(self, data: str) -> None:
        req = json.loads(data)
        req.pop("id")
        self._wire.append(req)
        self._writer.write(data)

    def close(self) -> None:
        self._writer.close()


def test_every_request_of_remotegpu_is_described() -> None:
    """Each operation Fleet sends is in the fixture (workspace.{action} by its steps)."""
    tree = ast.parse((REPO / "mtgpu" / "tui" / "fleet.py").read_text())
    sent = {
        n.args[0].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("call", "call_long")
        and n.args
        and isinstance(n.args[0], ast.Constant)
    }
    described = {r["op"] for s in steps() for r in s["requests"]}
    assert sent, "no requests found in fleet.py"
    assert sent <= described, f"sent by remotegpu-cli but not in {FIXTURE.name}: {sorted(sent - described)}"
    assert {"workspace.start", "workspace.stop", "workspace.rm"} <= described


def test_remotegpu_replays_the_protocol_fixture(at_home, tmp_path, monkeypatch) -> None:
    wire: list[dict[str, Any]] = []
    answers: list[dict[str, Any]] = []
    original = ApiChannel.call

    async def spy(self: ApiChannel, op: str, timeout: float, **args: Any) -> Any:
        if not isinstance(self._writer, _Tap):
            self._writer = _Tap(self._writer, wire)  # type: ignore[assignment]
        try:
            result = await original(self, op, timeout, **args)
        except ApiError as exc:
            answers.append({"ok": False, "code": exc.code, "error": str(exc)})
            raise
        answers.append({"ok": True, "result": result})
        return result

    monkeypatch.setattr(ApiChannel, "call", spy)
    env: dict[str, Any] = {"user": "lena", "server": "testhost", "client": "remotegpu"}

    async def act(f: Fleet, st: ServerState, step: dict[str, Any], params: dict[str, Any]) -> None:
        name = step["step"]
        if "remotegpu" not in step["clients"]:
            for r in step["requests"]:
                args = json.loads(subst(json.dumps(r["args"]), env))
                await f.links[st.name].call(r["op"], **args)
        elif name == "connect":
            await f._connect(st)
        elif name == "refresh":
            await f._refresh(st, workspaces=True)
        elif name == "submit":
            # A script with no file behind it (a file adds its name: `file_name`).
            await f._submit(st, params["script"])
        elif name == "cancel":
            await f.cancel_job(st, params["job"])
        elif name == "usage":
            await f.read_usage(st)
            assert st.usage is not None, st.usage_error
        elif name == "create_workspace":
            await f.create_workspace(st, params["name"], params["source"])
        elif name.endswith("_workspace"):
            action = {"stop": "stop", "start": "start", "remove": "rm"}[name.split("_")[0]]
            await f.workspace_action(st, action, params["name"])
        else:
            raise AssertionError(f"no remotegpu-cli action for step {name!r}")

    async def running(f: Fleet, st: ServerState, name: str) -> None:
        """Until the workspace runs (outside the steps: not compared)."""
        for _ in range(600):
            ws = await f.links[st.name].call("workspace.show", name=name)
            if ws["state"] == "RUNNING":
                return
            assert ws["state"] in ("PENDING", "STARTING"), ws
            await asyncio.sleep(0.2)
        raise AssertionError(f"{name} did not start")

    async def go() -> None:
        f = Fleet(load_server_list(), timeout=20.0)
        st = f.states["gpu"]
        try:
            for i, step in enumerate(steps()):
                params = {k: subst(v, env) for k, v in step.get("params", {}).items()}
                env.update(params)
                del wire[:], answers[:]
                try:
                    await act(f, st, step, params)
                except (ApiError, MtgpuError):
                    pass  # a refusal the step expects: its answer is compared below
                where = f"step {i + 1} ({step['step']})"
                assert len(wire) == len(step["requests"]), f"{where}: sent {wire}"
                for n, (req, pattern) in enumerate(zip(wire, step["requests"], strict=True)):
                    match(pattern, req, env, exact=True, where=f"{where} request {n + 1}")
                assert len(answers) == len(step["answers"]), f"{where}: answers {answers}"
                for n, (ans, pattern) in enumerate(zip(answers, step["answers"], strict=True)):
                    match(pattern, ans, env, exact=False, where=f"{where} answer {n + 1}")
                if step["step"] in ("create_workspace", "start_workspace") and answers[0]["ok"]:
                    await running(f, st, params["name"])
        finally:
            if f.links[st.name].up:
                with contextlib.suppress(MtgpuError):
                    await f.links[st.name].call("workspace.rm", name="proto-remotegpu")
            await f.stop()

    asyncio.run(go())
