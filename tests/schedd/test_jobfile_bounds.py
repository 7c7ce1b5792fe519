"""Job files are bounded before they are parsed: host lists are counted before any name
is made, directive lines and values have limits named in the refusal, array indices
keep job ids short, and every number goes through the one bounded parser."""

from __future__ import annotations

import tracemalloc

import pytest

from mtgpu.errors import JobError
from mtgpu.jobspec import MAX_WARNING_CHARS, MAX_WARNINGS
from mtgpu.schedd.jobfile import MAX_DIRECTIVE_LINE, MAX_HOST_LIST, expand_hostlist, parse_job_file


def _parse(directives: str, **overrides: str):
    return parse_job_file(f"#!/bin/sh\n{directives}\ntrue\n", overrides or None, default_workdir="/home/ann")


def test_a_ten_million_name_host_list_is_refused_without_building_it():
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="names 10000000 servers; a host list names at most 1024"):
            expand_hostlist("a[0-9999999]")
        with pytest.raises(JobError, match="at most 1024") as exc:
            _parse("#MTGPU server=a[0-999999999999],b[0-9999999]")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak  # nothing the size of the list was built
    assert len(str(exc.value)) < 300
    assert len(expand_hostlist(f"n[1-{MAX_HOST_LIST}]")) == MAX_HOST_LIST


@pytest.mark.parametrize("size", [MAX_DIRECTIVE_LINE + 1, 300_000, 1_000_000])
def test_a_long_directive_line_is_refused_before_it_is_split(size):
    with pytest.raises(JobError) as exc:
        _parse("#MTGPU name=" + "x" * size)
    msg = str(exc.value)
    assert msg.startswith("line 2: #MTGPU name: the line is") and "at most 4096" in msg, msg
    with pytest.raises(JobError, match="#SBATCH -J: the line is"):
        _parse("#SBATCH -J " + "x" * size)


def test_long_values_and_names_are_refused_naming_the_key():
    with pytest.raises(JobError, match="the value of output is 2000 characters; .* at most 1024"):
        _parse("#MTGPU output=" + "o" * 2000)
    with pytest.raises(JobError, match="longer than the 200 allowed"):
        _parse("#MTGPU name=" + "n" * 300)
    with pytest.raises(JobError, match="the value of name is 5000 characters") as exc:
        _parse("", name="n" * 5000)
    assert len(str(exc.value)) < 300


@pytest.mark.parametrize(
    "spec", ["9" * 400, "10000000", "0-" + "9" * 20, "0-10:" + "9" * 30, "1%" + "9" * 40]
)
def test_array_indices_keep_job_ids_short(spec):
    with pytest.raises(JobError) as exc:
        _parse(f"#MTGPU array={spec}")
    assert len(str(exc.value)) < 300
    assert _parse("#MTGPU array=9999999").array == "9999999"


@pytest.mark.parametrize(
    "directive",
    [
        "cpus=٣",
        "ram=３G",
        "ram=²G",
        "ram=" + "9" * 400 + "G",
        "vram=" + "9" * 40 + "G",
        "time=" + "9" * 400 + "s",
        "time=infm",
        "nodes=" + "9" * 400,
        "gpus=" + "9" * 30,
        "priority=" + "9" * 400,
        "cpus=1e9999",
    ],
)
def test_absurd_numbers_are_refused_naming_the_line(directive):
    with pytest.raises(JobError) as exc:
        _parse(f"#MTGPU {directive}")
    msg = str(exc.value)
    assert msg.startswith("line 2: #MTGPU ") and len(msg) < 300, msg
    with pytest.raises(JobError):
        _parse("", **dict([directive.split("=", 1)]))


def test_repeated_warnings_are_counted_once_and_bounded_in_all():
    # 64 lines of 1,362 ignored -Q each: 87,168 warnings, once each kept in the record.
    line = "#SBATCH " + "-Q " * 1362
    tracemalloc.start()
    try:
        spec = _parse("\n".join([line] * 64))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak  # counted as found, not listed and then counted
    w = spec.warnings
    assert len(w) == MAX_WARNINGS and all(len(x) <= MAX_WARNING_CHARS for x in w), w
    assert w[0].startswith("line 2: #SBATCH -Q: ") and w[0].endswith(" (x1362)"), w[0]
    assert w[1].startswith("line 3: #SBATCH -Q: ") and w[1].endswith(" (x1362)"), w[1]
    assert w[-1] == f"... and {(64 - MAX_WARNINGS + 1) * 1362} more warnings", w[-1]
    assert sum(map(len, w)) <= MAX_WARNINGS * MAX_WARNING_CHARS
    # A warning that comes once is as it was; the command line's are counted too.
    once = _parse("#SBATCH --mail-type=ALL").warnings
    assert len(once) == 1 and not once[0].endswith("(x1)"), once
    spec = parse_job_file(
        "#!/bin/sh\ntrue\n", default_workdir="/home/ann", options=["--mail-type=ALL"] * 5000
    )
    said = once[0].removeprefix("line 2: #SBATCH ")
    assert spec.warnings == (f"command line: {said} (x5000)",), spec.warnings


def test_many_distinct_warnings_keep_the_first_and_count_the_rest():
    spec = parse_job_file(
        "#!/bin/sh\ntrue\n",
        default_workdir="/home/ann",
        options=[f"--mail-user=u{i}@x" for i in range(200)] + ["--comment=" + "c" * 4000],
    )
    w = spec.warnings
    assert len(w) == MAX_WARNINGS and w[0].startswith("command line: --mail-user=u0@x: ")
    assert w[-1] == f"... and {201 - MAX_WARNINGS + 1} more warnings", w[-1]
    assert all(len(x) <= MAX_WARNING_CHARS for x in w)


@pytest.mark.parametrize("seconds", ["99999", "65536"])
def test_a_signal_time_beyond_the_range_it_names_is_refused(seconds):
    with pytest.raises(JobError, match=r"is not a number of seconds \(0 to 65535\)"):
        _parse(f"#SBATCH --signal=B:USR1@{seconds}")
    with pytest.raises(JobError, match=r"0 to 65535"):
        parse_job_file("#!/bin/sh\ntrue\n", default_workdir="/", options=[f"--signal=USR1@{seconds}"])
    assert _parse("#SBATCH --signal=B:USR1@65535").signal == "B:USR1@65535"


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"options": ["-J", "a\udcffb"]}, "name"),
        ({"options": ["--output=/tmp/o\udcffx"]}, "output"),
        ({"options": ["--chdir=/tmp/\x00"]}, "workdir"),
        ({"overrides": {"workdir": "/tmp/w\udcff"}}, "workdir"),
        ({"overrides": {"error": "/tmp/e\ud800"}}, "error"),
        ({"overrides": {"container": "img\x00"}}, "container"),
        ({"script": "#!/bin/sh\n#MTGPU name=a\x00b\ntrue\n"}, "name"),
        ({"script": "#!/bin/sh\n#SBATCH --comment=x\n#SBATCH --export=A=\udcfe\ntrue\n"}, "export"),
        ({"default_workdir": "/home/ann/\udcff"}, "workdir"),
        ({"default_name": "j\x00b"}, "name"),
    ],
)
def test_a_value_with_a_nul_or_an_undecodable_byte_is_refused_naming_the_field(kw, field):
    kw = {"default_workdir": "/home/ann", **kw}
    script = kw.pop("script", "#!/bin/sh\ntrue\n")
    overrides = kw.pop("overrides", None)
    with pytest.raises(JobError) as exc:
        parse_job_file(script, overrides, **kw)
    msg = str(exc.value)
    assert f"the value of {field} has " in msg and "\n" not in msg, msg
    assert ("NUL" in msg) or ("not UTF-8 text" in msg), msg
    msg.encode("utf-8")  # the refusal itself is text: its bad bytes are escapes


def test_warnings_quote_nuls_and_undecodable_bytes_as_escapes():
    spec = parse_job_file(
        "#!/bin/sh\ntrue\n", default_workdir="/home/ann", options=["--comment=a\x00b\udcff", "-Q\x00"]
    )
    assert spec.warnings[0].startswith("command line: --comment=a\\x00b\\udcff: "), spec.warnings
    assert spec.warnings[1].startswith("command line: -Q\\x00: "), spec.warnings
    for w in spec.warnings:
        assert "\x00" not in w, w
        w.encode("utf-8")
