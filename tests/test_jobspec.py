"""The job spec's dict codec: what the job table stores reads back as the same frozen
JobSpec that the job file parser made."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mtgpu.jobspec import GpuMode, JobSpec, ResourceRequest, spec_from_dict, spec_to_dict

_names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
requests = st.builds(
    ResourceRequest,
    gpus=st.integers(0, 8),
    gpu_brand=st.none() | st.sampled_from(["nvidia", "amd"]),
    gpu_mode=st.sampled_from(list(GpuMode)),
    vram=st.integers(0, 1 << 40),
    cpus=st.integers(1, 256),
    ram=st.integers(1, 1 << 42),
    nodes=st.integers(1, 16),
    servers=st.lists(_names, max_size=3).map(tuple),
    exclude=st.lists(_names, max_size=3).map(tuple),
    constraint=st.none() | _names,
    whole_member=st.booleans(),
)
specs = st.builds(
    JobSpec,
    request=requests,
    script=st.text(max_size=200),
    name=_names,
    array=st.none() | st.just("0-9%2"),
    priority=st.integers(0, 100),
    time_limit=st.none() | st.floats(1, 1e7),
    warnings=st.lists(_names, max_size=3).map(tuple),
    ntasks=st.none() | st.integers(1, 64),
    hold=st.booleans(),
    dependency=st.none() | st.just("afterok:7"),
    signal=st.none() | st.just("B:USR1@90"),
)


@given(specs)
def test_a_spec_reads_back_as_the_same_frozen_spec(spec: JobSpec) -> None:
    back = spec_from_dict(spec_to_dict(spec))
    assert back == spec and hash(back) == hash(spec)
    assert type(back) is JobSpec and type(back.request) is ResourceRequest
    assert isinstance(back.request.gpu_mode, GpuMode)
    assert isinstance(back.warnings, tuple) and isinstance(back.request.servers, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.priority = 0  # type: ignore[misc]
    # The same as the generated constructor makes from the same values.
    d = spec_to_dict(spec)
    d["request"] = back.request
    d["warnings"] = tuple(d["warnings"])
    made = JobSpec(**d)
    assert made == back
    # ...and as small: the instance shares its class's keys as the constructor's does
    # (12,000 pending jobs each hold one).
    assert sys.getsizeof(back.__dict__) == sys.getsizeof(made.__dict__)


def test_spec_from_dict_checks_what_the_constructor_would() -> None:
    # It fills the fields the constructor fills with their defaults; nothing of
    # JobSpec's runs in between, so it must have nothing that should.
    assert not hasattr(JobSpec, "__post_init__")
    d = spec_to_dict(JobSpec(ResourceRequest(), "true"))
    older = {k: v for k, v in d.items() if k not in ("signal", "open_mode", "wait")}
    assert spec_from_dict(older) == spec_from_dict(d)
    with pytest.raises(TypeError, match=r"unknown fields \['colour'\]"):
        spec_from_dict({**d, "colour": "blue"})
    with pytest.raises(TypeError, match="no 'script'"):
        spec_from_dict({k: v for k, v in d.items() if k != "script"})
    with pytest.raises(KeyError):
        spec_from_dict({k: v for k, v in d.items() if k != "request"})
    with pytest.raises(TypeError, match="unexpected keyword"):
        spec_from_dict({**d, "request": {**d["request"], "colour": "blue"}})
    with pytest.raises(ValueError, match="sometimes"):
        spec_from_dict({**d, "request": {**d["request"], "gpu_mode": "sometimes"}})


def test_what_the_table_stores_has_its_warnings_bounded_however_the_spec_was_made() -> None:
    from mtgpu.jobspec import MAX_WARNING_CHARS, MAX_WARNINGS

    many = ("the same warning",) * 300_000 + tuple(f"w{i} " + "x" * 5000 for i in range(100))
    stored = spec_to_dict(JobSpec(ResourceRequest(), "true", warnings=many))["warnings"]
    assert len(stored) == MAX_WARNINGS and all(len(w) <= MAX_WARNING_CHARS for w in stored)
    assert stored[0] == "the same warning (x300000)" and stored[1].startswith("w0 xxx")
    assert stored[-1] == f"... and {100 - MAX_WARNINGS + 2} more warnings"
    # Bounded lines are stored as they are (so reading back gives the same spec).
    again = JobSpec(ResourceRequest(), "true", warnings=tuple(stored))
    assert spec_from_dict(spec_to_dict(again)) == again
