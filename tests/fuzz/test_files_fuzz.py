"""Malformed job files, configuration files and state journals: a clear error naming
the problem, never a crash (hypothesis, derandomized, a fixed number of cases)."""

from __future__ import annotations

import os
import struct

import yaml
from figures import tally
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtgpu.config.options import _KEYS, load_text
from mtgpu.errors import ConfigError, JobError
from mtgpu.schedd.jobfile import parse_job_file
from mtgpu.state.journal import _walk, repair_journal


def fuzz(cases: int) -> settings:
    """Modest and repeatable: the same cases every run, counted in the figures
    (MTGPU_FUZZ_EXAMPLES, when larger, for a long run)."""
    cases = max(cases, int(os.environ.get("MTGPU_FUZZ_EXAMPLES", 0)))
    return settings(
        max_examples=cases,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


DIRECTIVES = [
    "gpus",
    "gpu_mode",
    "vram",
    "cpus",
    "ram",
    "container",
    "nodes",
    "array",
    "server",
    "name",
    "priority",
    "time",
    "requeue",
    "output",
    "error",
    "workdir",
    "gpuz",
    "",
]
SBATCH = [
    "--gres",
    "--gpus",
    "-c",
    "--cpus-per-task",
    "--mem",
    "-t",
    "--time",
    "-N",
    "--nodes",
    "--array",
    "-J",
    "--job-name",
    "-o",
    "--output",
    "-e",
    "--nice",
    "--exclusive",
    "-w",
]
VALUES = st.one_of(
    st.sampled_from(
        [
            "1",
            "0",
            "-1",
            "nvidia:2",
            "amd:1:rtx4090",
            "20G",
            "20",
            "1.5T",
            "2h",
            "30m",
            "1-00:00:00",
            "0-9%4",
            "0-1000000",
            "yes",
            "no",
            "shared",
            "exclusive",
            "overcommit",
            "x" * 300,
            "%j.out",
            "/etc/shadow",
            "../..",
            "a=b",
            "",
            " ",
        ]
    ),
    st.text(max_size=20),
)


@st.composite
def job_files(draw) -> str:
    lines = [draw(st.sampled_from(["#!/bin/sh", "#!/bin/bash", "", "#!"]))]
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            pairs = draw(st.lists(st.tuples(st.sampled_from(DIRECTIVES), VALUES), max_size=4))
            lines.append("#MTGPU " + " ".join(f"{k}={v}" for k, v in pairs))
        elif kind == 1:
            opt = draw(st.sampled_from(SBATCH))
            lines.append(f"#SBATCH {opt}{draw(st.sampled_from(['=', ' ']))}{draw(VALUES)}")
        elif kind == 2:
            lines.append(draw(st.text(max_size=40)))
        else:
            lines.append("#MTGPU" + draw(st.text(max_size=30)))
    lines.append("echo hi")
    return "\n".join(lines) + "\n"


@fuzz(200)
@given(job_files(), st.dictionaries(st.sampled_from(DIRECTIVES[:-1]), VALUES, max_size=3))
def test_job_files_parse_or_name_the_problem(script, overrides):
    tally("fuzz_cases")
    try:
        spec = parse_job_file(script, overrides, default_workdir="/home/ann")
    except JobError as exc:
        text = str(exc)
        assert text and ("line" in text or "command line" in text or "job file" in text or ":" in text), text
        return
    assert spec.workdir.startswith("/")


#: Text with what a job may not carry: NULs and lone surrogates (undecodable bytes).
HOSTILE_TEXT = st.text(
    st.sampled_from(["a", "/", "-", "=", " ", "@", "1", "\x00", "\udcff", "\ud800", "é"]), max_size=12
)


@fuzz(200)
@given(
    st.lists(
        st.tuples(st.sampled_from([*SBATCH, "-J", "-o", "-D", "--signal", "--comment", "-Q"]), HOSTILE_TEXT),
        max_size=6,
    ),
    st.dictionaries(
        st.sampled_from(["name", "output", "error", "workdir", "container"]), HOSTILE_TEXT, max_size=2
    ),
)
def test_what_a_job_carries_is_text_or_refused_as_one_line_of_text(options, overrides):
    """A NUL or a lone surrogate in a value never reaches the spec (its supervisor
    cannot take them); the refusal names the problem, as text."""
    tally("fuzz_cases")
    argv = [f"{opt}={value}" for opt, value in options]
    try:
        spec = parse_job_file("#!/bin/sh\ntrue\n", overrides, default_workdir="/home/ann", options=argv)
    except JobError as exc:
        text = str(exc)
        assert text and "\n" not in text and "\x00" not in text, text
        text.encode("utf-8")
        return
    for value in (
        spec.name,
        spec.output,
        spec.error,
        spec.workdir,
        spec.container,
        spec.signal,
        *spec.warnings,
    ):
        if value is not None:
            assert "\x00" not in value, value
            value.encode("utf-8")


CONFIG_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**12), 10**12),
        st.floats(allow_nan=False),
        st.text(max_size=30),
        st.sampled_from(
            ["20G", "1h", "127.0.0.1:0", "/tmp", "cluster", "standalone", "20000-29999", "nvidia"]
        ),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=10), inner, max_size=3)
    ),
    max_leaves=8,
)


@fuzz(200)
@given(
    st.dictionaries(
        st.one_of(st.sampled_from(sorted(_KEYS)), st.text(max_size=12)), CONFIG_VALUES, max_size=5
    )
)
def test_configuration_files_load_or_name_key_and_line(config):
    tally("fuzz_cases")
    text = yaml.safe_dump(config)
    try:
        load_text(text, "/etc/mtgpu/mtgpu.yaml")
    except ConfigError as exc:
        assert "/etc/mtgpu/mtgpu.yaml" in str(exc), str(exc)


@fuzz(150)
@given(st.binary(max_size=400))
def test_configuration_garbage_is_a_clear_error(raw):
    tally("fuzz_cases")
    try:
        load_text(raw.decode("utf-8", "replace"), "cfg.yaml")
    except ConfigError as exc:
        assert "cfg.yaml" in str(exc)


def _journal(records: list[bytes]) -> bytes:
    head = b"PYSYNCOBJ".ljust(24, b"\0") + b"0.3.17".ljust(8, b"\0")
    body = b""
    for i, cmd in enumerate(records, 1):
        data = struct.pack("<QQ", i, 1) + cmd
        body += struct.pack("<I", len(data)) + data + struct.pack("<I", len(data))
    return head + struct.pack("<II", 1, 40 + len(body)) + body


@fuzz(200)
@given(
    st.integers(1, 6),
    st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=6),
    st.integers(0, 400),
)
def test_damaged_journals_are_cut_to_an_intact_prefix(tmp_path_factory, n, flips, cut):
    from pysyncobj import pickle as raft_pickle

    tally("fuzz_cases")
    records = [b"\x01"] + [b"\x00" + raft_pickle.dumps(("submit", [i, "x" * i])) for i in range(n)]
    data = bytearray(_journal(records))
    for at, value in flips:
        data[at % len(data)] = value
    path = tmp_path_factory.mktemp("j") / "raft.journal"
    path.write_bytes(bytes(data[: max(0, len(data) - cut)]))
    repair_journal(path)  # never raises
    if path.exists():
        assert repair_journal(path) is None  # what is left is intact
        assert _walk(path.read_bytes())[3] == ""


@st.composite
def hostile_yaml(draw) -> str:
    """YAML documents from the configuration keys, with what a hostile file carries:
    anchors and aliases (a "billion laughs"), deep nesting, keys that are not names,
    NaN and infinity, huge numbers."""
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        key = draw(
            st.one_of(
                st.sampled_from(sorted(_KEYS)), st.sampled_from(["null", "true", "1", "~", "? [a]", "'x'"])
            )
        )
        kind = draw(st.integers(0, 5))
        if kind == 0:
            value = draw(st.sampled_from([".nan", ".inf", "-.inf", "9" * 400, "1e999", "٣", "３G"]))
        elif kind == 1:
            depth = draw(st.sampled_from([5, 17, 200, 1000]))
            value = "[" * depth + "]" * depth
        elif kind == 2:
            value = "&a [x, x, x, x]"
            lines.append(f"{key}: {value}")
            key, value = draw(st.sampled_from(sorted(_KEYS))), "[*a, *a, *a, *a]"
        elif kind == 3:
            value = "&self [*self]"
        elif kind == 4:
            value = (
                "{"
                + ", ".join(
                    f"{draw(st.sampled_from(['null', 'true', '3', 'a']))}: 1"
                    for _ in range(draw(st.integers(1, 3)))
                )
                + "}"
            )
        else:
            value = draw(st.sampled_from(["20G", "1h", "x" * 2000, "/tmp", "null"]))
        lines.append(f"{key}: {value}")
    return "\n".join(lines) + "\n"


@fuzz(80)
@given(hostile_yaml())
def test_hostile_yaml_is_one_line_naming_the_file(text):
    tally("fuzz_cases")
    try:
        load_text(text, "/etc/mtgpu/mtgpu.yaml")
    except ConfigError as exc:
        msg = str(exc)
        assert msg.startswith("/etc/mtgpu/mtgpu.yaml") and "\n" not in msg, msg
        assert len(msg) < 3000, msg[:300]
        assert "Traceback" not in msg and "RecursionError" not in msg
