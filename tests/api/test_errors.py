"""One error tree: a malformed request is the caller's ``bad_request``, naming the
problem; any other failure in a handler is the server's ``internal`` error, logged
once with its traceback under an id the answer names; retryability is a code."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
from mtgpu_testing import Host
from security_testing import Tenant, api_socket, call, lines

from mtgpu.api.dispatcher import Caller, Dispatcher, arg
from mtgpu.errors import RESEND_CODES, RETRYABLE_CODES, ApiError, JobError, StateError, ValidationError

TENANT = Caller("tina", 20001, False, "socket")
INTERNAL = re.compile(
    r"^internal error \(id ([0-9a-f]{8})\): the administrator can find it in "
    r"the server log$"
)


def _dispatcher() -> Dispatcher:
    d = Dispatcher()

    def buggy(caller: Caller, args: dict) -> dict:
        return {}["no such key"]  # a server bug: a KeyError nobody meant

    def typo(caller: Caller, args: dict) -> int:
        return len(None)  # type: ignore[arg-type] - a TypeError in the server's own code

    def strict(caller: Caller, args: dict) -> int:
        return arg(args, "n", int)

    async def state(caller: Caller, args: dict) -> None:
        raise StateError("no scheduler is elected yet; retry shortly", "no_leader")

    def job(caller: Caller, args: dict) -> None:
        raise JobError("line 2: gpus=x is not a GPU request")

    for name, fn in (("buggy", buggy), ("typo", typo), ("strict", strict), ("state", state), ("job", job)):
        d.register(name, fn)
    return d


def _ask(d: Dispatcher, op: str, **args: object) -> dict:
    return asyncio.run(d.handle(TENANT, {"op": op, "args": args, "id": 9}))


@pytest.mark.parametrize("op", ["buggy", "typo"])
def test_a_handler_bug_is_internal_with_an_id_logged_once_with_its_trace(op, caplog):
    d = _dispatcher()
    with caplog.at_level(logging.ERROR, logger="mtgpu.api"):
        answer = _ask(d, op)
    assert answer["code"] == "internal" and answer["ok"] is False and answer["id"] == 9, answer
    assert answer["retryable"] is False
    m = INTERNAL.match(answer["error"])
    assert m, answer["error"]
    incident = m.group(1)
    logged = [r for r in caplog.records if incident in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    assert logged[0].exc_info is not None  # the traceback, for the admin
    text = caplog.text
    assert text.count("Traceback") == 1 and text.count(incident) == 1, text
    assert ("KeyError" if op == "buggy" else "TypeError") in text
    # Another bug gets another id.
    assert INTERNAL.match(_ask(d, op)["error"]).group(1) != incident


def test_only_validation_errors_are_bad_requests(caplog):
    d = _dispatcher()
    with caplog.at_level(logging.WARNING, logger="mtgpu.api"):
        missing, wrong = _ask(d, "strict"), _ask(d, "strict", n="three")
    assert missing["code"] == wrong["code"] == "bad_request"
    assert missing["error"] == "missing argument 'n'" and wrong["error"] == "argument 'n' must be int"
    assert "Traceback" not in caplog.text  # the caller's mistake is not a server fault
    job = _ask(d, "job")
    assert job["code"] == "error" and job["error"].startswith("line 2:"), job
    assert isinstance(ValidationError("x"), ValueError)  # the value parsers raise it


def test_retryability_is_a_code_on_the_wire():
    d = _dispatcher()
    answer = _ask(d, "state")
    assert answer["code"] == "no_leader" and answer["retryable"] is True, answer
    assert ApiError.from_answer(answer).retryable
    # The answer's own word wins over the code list (a new retryable refusal fits).
    assert ApiError.from_answer(
        {"ok": False, "error": "a minority", "code": "minority", "retryable": True}
    ).retryable
    assert not ApiError.from_answer(
        {"ok": False, "error": "x", "code": "no_leader", "retryable": False}
    ).retryable
    assert not ApiError.from_answer({"ok": False, "error": "retry later", "code": "error"}).retryable
    assert not RETRYABLE_CODES & RESEND_CODES
    assert not _ask(d, "strict")["retryable"]


def test_the_python_client_retries_by_code_not_by_message(monkeypatch):
    from mtgpu.api import client as client_mod
    from mtgpu.cli import job as job_cli

    monkeypatch.setattr(client_mod.time, "sleep", lambda s: None)
    monkeypatch.setattr(job_cli.time, "sleep", lambda s: None)
    answers = [
        ApiError("no scheduler is elected right now", "no_leader"),
        ApiError("lost in a hand-off", "leader_changed"),
        "done",
    ]

    def fn():
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    assert job_cli._retrying(fn) == "done"
    # A refusal whose message says "retry" but whose code is not retryable is shown at once.
    calls = []

    def refused():
        calls.append(1)
        raise ApiError("too many submissions; wait 1s and retry", "rate_limited")

    with pytest.raises(ApiError):
        job_cli._retrying(refused)
    assert calls == [1]


def test_a_refusal_quotes_a_bounded_prefix_of_what_it_was_sent():
    from mtgpu.jsonl import MAX_ERROR_CHARS

    d = _dispatcher()
    answer = _ask(d, "x" * 3_000_000)
    said = answer["error"]
    assert answer["code"] == "unknown_op" and "(3000000 characters)" in said, said[:200]
    assert said.startswith("unknown operation 'xxx") and said.endswith(
        "known: buggy, job, state, strict, typo"
    )
    assert len(said) < 300, len(said)

    def echo(caller: Caller, args: dict) -> None:
        raise ApiError(f"no job {args['job_id']} of yours; `mt-job list` shows them", "not_found")

    d.register("echo", echo)
    said = _ask(d, "echo", job_id="9" * 3_000_000)["error"]
    assert len(said) <= MAX_ERROR_CHARS and said.startswith("no job 999"), len(said)
    assert said.endswith("999 of yours; `mt-job list` shows them") and "characters left out" in said


# ------------------------------------------------------------ a hostile tenant


@pytest.fixture(scope="module")
def hostile():
    h = Host({"SIMULATED_CPUS": 1})
    h.start()
    try:
        key = h.add_user("mal")
        assert h.ssh("mal", key, "true").returncode == 0
        pw = h.passwd("mal")
        yield h, Tenant("mal", int(pw[2]), key, pw[5])
    finally:
        h.cleanup()


#: (operation, arguments, words the refusal must contain)
MALFORMED = [
    ("job.show", {}, "'job_id'"),
    ("job.show", {"job_id": ["1"]}, "'job_id' must be str"),
    ("job.show", {"job_id": {"$ne": 1}}, "'job_id'"),
    ("job.list", {"all": "yes please"}, "'all' must be bool"),
    ("job.submit", {"script": 7}, "'script' must be str"),
    ("job.submit", {"script": "#!/bin/sh\ntrue\n", "overrides": ["gpus=1"]}, "'overrides'"),
    ("job.submit", {"script": "#!/bin/sh\ntrue\n", "token": 12}, "'token'"),
    ("job.cancel", {"job_ids": "1"}, "'job_ids'"),
    ("workspace.create", {"name": "w", "image": "x", "ram": [1]}, "'ram'"),
    ("workspace.create", {"name": "w", "image": "x", "ram": "12 bananas"}, "ram"),
    ("workspace.create", {"name": "w", "image": "x", "ports": [0]}, "port 0"),
    ("workspace.create", {"name": "w", "image": "x", "wait": "forever"}, "'wait'"),
]


def test_a_hostile_tenants_malformed_requests_are_bad_requests_naming_the_problem(hostile):
    h, mal = hostile
    with api_socket(h.run_dir, mal.uid) as s:
        answers = [(op, want, call(s, op, args)) for op, args, want in MALFORMED]
        (raw,) = lines(s, [{"op": "job.show", "args": [1, 2]}])  # args not an object
    for op, want, a in answers:
        assert not a["ok"] and a["code"] == "bad_request", (op, a)
        assert want in a["error"] and len(a["error"]) < 300, (op, want, a)
        assert a["retryable"] is False
    assert raw["code"] == "bad_request" and '"args"' in raw["error"], raw
    log = h.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]


def test_a_hostile_tenants_submissions_are_stored_bounded_and_as_text(hostile):
    from mtgpu.jobspec import MAX_WARNING_CHARS, MAX_WARNINGS
    from mtgpu.jsonl import MAX_ERROR_CHARS

    h, mal = hostile
    # 256 lines of 1,362 ignored -Q each: 348,672 warnings, and a client's own list.
    script = "#!/bin/sh\n" + "\n".join(["#SBATCH " + "-Q " * 1362] * 256) + "\ntrue\n"
    with api_socket(h.run_dir, mal.uid) as s:
        sent = {"script": script, "options": ["--hold"], "warnings": ["w" * 100] * 20_000}
        a = call(s, "job.submit", sent)
        assert a["ok"], a.get("error", "")[:300]
        shown = call(s, "job.show", {"job_id": a["result"]["job_id"]})
        unknown = call(s, "x" * 3_000_000)
        long_id = call(s, "job.show", {"job_id": "9" * 3_000_000})
        bad = [
            (field, call(s, "job.submit", {"script": "#!/bin/sh\ntrue\n", **args}))
            for field, args in (
                ("workdir", {"workdir": "/tmp/a\udcffb"}),
                ("name", {"options": ["-J", "a\udcffb"]}),
                ("output", {"overrides": {"output": "/tmp/o\x00x"}}),
            )
        ]
        signal = call(s, "job.submit", {"script": "#!/bin/sh\ntrue\n", "options": ["--signal=B:USR1@99999"]})
        call(s, "job.cancel", {"job_ids": [a["result"]["job_id"]]})
    for w in (a["result"]["warnings"], shown["result"]["warnings"]):
        assert len(w) == MAX_WARNINGS and all(len(x) <= MAX_WARNING_CHARS for x in w), w
        assert w[0].endswith("(x1362)") and w[-1].startswith("... and "), (w[0], w[-1])
        assert not any(x.startswith("www") for x in w)
    assert unknown["code"] == "unknown_op" and len(unknown["error"]) < 2000, len(unknown["error"])
    assert long_id["code"] == "not_found" and len(long_id["error"]) <= MAX_ERROR_CHARS
    for field, r in bad:
        assert not r["ok"] and f"the value of {field} has " in r["error"], (field, r)
    assert not signal["ok"] and "0 to 65535" in signal["error"], signal
    log = h.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]


#: Exception classes of MTGPU's outside MtgpuError, on purpose (mtgpu/errors.py says why).
OUTSIDE_THE_TREE = {
    "mtgpu.schedd.bpfdev.BpfUnavailable",
    "mtgpu.cli.slurm.formats.FormatError",
    "mtgpu.cli.slurm.formats.HostlistError",
    "mtgpu.config.options._SubKeyError",
}


def test_every_exception_class_mtgpu_defines_is_in_the_one_tree() -> None:
    import importlib
    import inspect
    import pkgutil

    import mtgpu
    from mtgpu.errors import MtgpuError

    found = {}
    for info in pkgutil.walk_packages(mtgpu.__path__, "mtgpu."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{info.name}.{name}"] = obj
    outside = sorted(n for n, c in found.items() if not issubclass(c, MtgpuError))
    assert outside == sorted(OUTSIDE_THE_TREE), outside
    assert len(found) > 20, sorted(found)  # the walk saw the package
