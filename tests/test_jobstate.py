"""Job states are defined once (mtgpu/jobstate.py): the job table moves jobs only along
its transitions, no other module spells a state, and the manual's tables say what the
module says."""

from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mtgpu import jobstate
from mtgpu.jobstate import FINAL_STATES, TRANSITIONS, JobState
from mtgpu.schedd.jobtable import JobTable

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "mtgpu"
MANUAL = REPO / "docs" / "manual.md"

#: Places that spell a state's name for another vocabulary which shares the word:
#: (module, enclosing function or class, why). Anything else spells it through
#: mtgpu.jobstate.
OTHER_VOCABULARIES: tuple[tuple[str, str, str], ...] = (
    ("mtgpu/workspaces/service.py", "Workspaces.view", "a workspace's state"),
    ("mtgpu/workspaces/service.py", "Workspaces.shell_info", "a workspace's state"),
    ("mtgpu/cli/container.py", "_describe", "a workspace's state"),
    ("mtgpu/cli/container.py", "cmd_create", "a workspace's state"),
    ("mtgpu/cli/container.py", "cmd_start", "a workspace's state"),
    ("mtgpu/api/steps.py", "StepLog.begin", "a job step's state"),
    ("mtgpu/api/steps.py", "StepLog.end", "a job step's state"),
    ("mtgpu/api/steps.py", "StepLog.free_gpus", "a job step's state"),
    ("mtgpu/cli/sacct.py", "slurm_json", "Slurm's exit_code status, not a state"),
    ("mtgpu/gpuinfo/check.py", "format_check", "a GPU probe's outcome"),
)


def _literals(package: Path = PACKAGE) -> list[tuple[str, str, int, str]]:
    """(file, enclosing qualname, line, value) of every string constant under
    ``package`` that is a state's name, outside mtgpu/jobstate.py."""
    names = {s.value for s in JobState}
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = str(path.relative_to(package.parent))
        if rel == "mtgpu/jobstate.py":
            continue

        def walk(node: ast.AST, scope: list[str], rel: str = rel) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    walk(child, [*scope, child.name])
                    continue
                if isinstance(child, ast.Constant) and child.value in names:
                    found.append((rel, ".".join(scope), child.lineno, str(child.value)))
                walk(child, scope)

        walk(ast.parse(path.read_text(), rel), [])
    return found


def test_the_scan_sees_a_literal(tmp_path: Path) -> None:
    pkg = tmp_path / "mtgpu"
    pkg.mkdir()
    (pkg / "x.py").write_text(
        'S = {"PD"}\nclass A:\n    def f(self, j):\n        return j["state"] == "RUNNING"\n'
    )
    (pkg / "jobstate.py").write_text('PENDING = "PENDING"\n')
    assert _literals(pkg) == [("mtgpu/x.py", "A.f", 4, "RUNNING")]


def test_no_module_spells_a_state() -> None:
    allowed = {(f, q) for f, q, _ in OTHER_VOCABULARIES}
    wrong = [f"{f}:{line} ({q or 'module'}): {v!r}" for f, q, line, v in _literals() if (f, q) not in allowed]
    assert not wrong, (
        "job states are spelled only in mtgpu/jobstate.py (JobState, FINAL_STATES, ...); "
        "a word of another vocabulary goes in OTHER_VOCABULARIES here:\n" + "\n".join(wrong)
    )


def test_every_allowed_place_still_spells_one() -> None:
    """An entry of OTHER_VOCABULARIES that no longer matches anything goes."""
    seen = {(f, q) for f, q, _, _ in _literals()}
    assert not [(f, q) for f, q, _ in OTHER_VOCABULARIES if (f, q) not in seen]


def test_a_state_is_its_plain_string_on_the_wire_and_in_the_journal() -> None:
    for s in JobState:
        assert s == s.value and str(s) == s.value and json.dumps(s) == json.dumps(s.value)
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            data = pickle.dumps({"state": s}, protocol)
            assert b"jobstate" not in data and b"JobState" not in data, data
            back = pickle.loads(data)["state"]
            assert type(back) is str and back == s.value
    assert {s.code for s in JobState} == set(jobstate.CODES.values())
    assert len(set(jobstate.CODES.values())) == len(JobState)
    assert all(s.meaning for s in JobState)
    assert FINAL_STATES | jobstate.ACTIVE_STATES == set(JobState)
    assert not FINAL_STATES & jobstate.ACTIVE_STATES


def test_the_runner_ends_jobs_in_the_final_states() -> None:
    from mtgpu.schedd.runner import FinalState

    assert {s.value for s in FinalState} == {s.value for s in FINAL_STATES}


def test_no_move_leaves_a_final_state() -> None:
    assert not [k for k in TRANSITIONS if k[0] in FINAL_STATES]
    assert {to for frm, to in TRANSITIONS if frm is not None} == set(JobState)


# ------------------------------------------------------------ the job table's moves

RECORD = {"name": "j", "user": "ann", "uid": 20001, "workdir": "/tmp", "spec": {}}


class Recording(JobTable):
    """A job table that notes every change of a job's state."""

    def __init__(self) -> None:
        super().__init__()
        self.moves: list[tuple[str | None, str]] = []

    def _put(self, record: dict[str, Any]) -> None:
        old = self.jobs.get(record["job_id"])
        before = old["state"] if old is not None else None
        if before != record["state"]:
            self.moves.append((before, record["state"]))
        super()._put(record)
        assert type(self.jobs[record["job_id"]]["state"]) is str


def _submit(t: JobTable) -> str:
    return str(t.submit(dict(RECORD), None, 1.0, _doApply=True)["job_id"])


def _placed(t: JobTable, members: int = 1) -> str:
    jid = _submit(t)
    t.place(jid, {"members": [{"node": f"n{i}"} for i in range(members)]}, 1, 2.0, _doApply=True)
    return jid


def _drive() -> Recording:
    """Every operation of the job table that changes a state, on every state it acts on."""
    t = Recording()
    t.cancel([_submit(t)], "ann", 3.0, _doApply=True)  # pending -> cancelled
    t.end_never_satisfied([(_submit(t), "job 1 ended FAILED (afterok)")], 3.0, _doApply=True)
    t.finish(_submit(t), JobState.FAILED, None, "rejected: no member has 9 GPUs", 3.0, _doApply=True)
    for state in FINAL_STATES:
        jid = _placed(t)
        t.started(jid, "n0", 3.0, _doApply=True)
        t.finish(jid, state, 0, "", 4.0, attempt=0, _doApply=True)
        jid = _placed(t)
        t.part_ended(jid, "n0", 1, state, 0, "", 4.0, 0, _doApply=True)
    jid = _placed(t, members=2)
    t.part_ended(jid, "n0", 1, JobState.COMPLETED, 0, "", 4.0, 0, _doApply=True)
    t.part_ended(jid, "n1", 1, JobState.COMPLETED, 0, "", 4.0, 0, _doApply=True)
    jid = _placed(t, members=2)
    t.part_ended(jid, "n1", 1, JobState.NODE_FAIL, None, "", 4.0, 0, _doApply=True)
    jid = _placed(t)
    t.cancel([jid], "ann", 3.0, _doApply=True)  # running: asks; the end is CANCELLED
    t.finish(jid, JobState.FAILED, None, "killed", 4.0, attempt=0, _doApply=True)
    jid = _placed(t)
    t.requeue(jid, "requeued: member lost", 3.0, _doApply=True)  # running -> pending
    jid = _placed(t)
    t.cancel([jid], "ann", 3.0, _doApply=True)
    t.requeue(jid, "requeued: member lost", 3.0, _doApply=True)  # cancel asked: ends
    # And what changes nothing: ends of ended jobs, placing a running one.
    t.finish(jid, JobState.COMPLETED, 0, "", 5.0, _doApply=True)
    t.place(_placed(t), {"members": []}, 1, 5.0, _doApply=True)
    return t


def test_every_move_of_the_job_table_is_a_transition() -> None:
    t = _drive()
    wrong = [m for m in t.moves if not jobstate.can_move(*m)]
    assert not wrong, f"the job table made moves mtgpu/jobstate.py's TRANSITIONS lacks: {wrong}"


def test_every_transition_is_one_the_job_table_makes() -> None:
    assert set(_drive().moves) == set(TRANSITIONS)


OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["submit", "place", "started", "part", "finish", "reject", "cancel", "never", "requeue", "purge"]
        ),
        st.integers(0, 30),
        st.sampled_from(sorted(FINAL_STATES)),  # what the agents and the scheduler end jobs with
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(OPS)
def test_whatever_is_asked_the_job_table_moves_only_along_transitions(
    ops: list[tuple[str, int, str]],
) -> None:
    t = Recording()
    for op, n, state in ops:
        ids = sorted(t.jobs)
        jid = ids[n % len(ids)] if ids else "1"
        if op == "submit":
            t.submit(dict(RECORD), list(range(n % 3)) if n % 2 else None, 1.0, _doApply=True)
        elif op == "place":
            t.place(jid, {"members": [{"node": f"n{i}"} for i in range(n % 3)]}, 1, 2.0, _doApply=True)
        elif op == "started":
            t.started(jid, "n0", 3.0, _doApply=True)
        elif op == "part":
            t.part_ended(jid, f"n{n % 3}", 1, state, 0, "", 4.0, n % 2, _doApply=True)
        elif op == "finish":
            t.finish(jid, state, 0, "", 4.0, attempt=n % 2, _doApply=True)
        elif op == "reject":
            if (t.get(jid) or {}).get("state") == JobState.PENDING:  # the scheduler rejects pending jobs only
                t.finish(jid, JobState.FAILED, None, "rejected: never", 4.0, _doApply=True)
        elif op == "cancel":
            t.cancel([jid], "ann", 5.0, _doApply=True)
        elif op == "never":
            t.end_never_satisfied([(jid, "job 1 ended FAILED (afterok)")], 5.0, _doApply=True)
        elif op == "requeue":
            t.requeue(jid, "requeued: member lost", 6.0, _doApply=True)
        else:
            t.purge([jid], _doApply=True)
    wrong = [m for m in t.moves if not jobstate.can_move(*m)]
    assert not wrong, f"moves mtgpu/jobstate.py's TRANSITIONS lacks: {wrong}"


def test_cancel_requested_becomes_cancelled() -> None:
    t = _drive()
    assert (JobState.RUNNING, JobState.CANCELLED) in t.moves
    assert all(type(j["state"]) is str for j in t.jobs.values())


# ------------------------------------------------------------ the manual


def _manual_table(heading: str) -> list[list[str]]:
    """The rows of the first table after ``heading`` in docs/manual.md, cells stripped
    of backquotes."""
    text = MANUAL.read_text()
    at = text.index(heading + "\n")
    rows = []
    for line in text[at:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip().strip("`") for c in line.strip().strip("|").split("|")])
        elif rows:
            break
        elif line.startswith("#"):
            break
    assert rows, f"docs/manual.md: no table under {heading!r}"
    return [r for r in rows[2:]]


def test_the_manual_lists_every_state_with_its_code_and_meaning() -> None:
    rows = _manual_table("### Job states")
    assert [r[:3] for r in rows] == [[s.value, s.code, s.meaning] for s in JobState], (
        "docs/manual.md's table under 'Job states' (state | code | meaning) says what mtgpu/jobstate.py says"
    )


def test_the_manual_lists_every_transition() -> None:
    rows = _manual_table("#### Moves between states")
    want = [[frm.value if frm else "(new)", to.value, why] for (frm, to), why in TRANSITIONS.items()]
    assert rows == want, "docs/manual.md's 'Moves between states' table says what TRANSITIONS says"
