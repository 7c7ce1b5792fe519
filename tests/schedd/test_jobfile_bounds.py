"""Job files are bounded before they are parsed: host lists are counted before any name
is made, directive lines and values have limits named in the refusal, array indices
keep job ids short, and every number goes through the one bounded parser."""

from __future__ import annotations

import tracemalloc

import pytest

from mtgpu.errors import JobError
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
