"""Normalized type names: the table the manual shows, and the edges."""

from __future__ import annotations

import re

import pytest

from mtgpu.gpuinfo.names import EXAMPLES, normalize_type


@pytest.mark.parametrize(("brand", "model", "expected"), EXAMPLES)
def test_examples(brand, model, expected):
    assert normalize_type(brand, model) == expected


@pytest.mark.parametrize(
    ("brand", "model", "expected"),
    [
        ("nvidia", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "a100-40gb"),  # a MIG device: its parent's type
        ("nvidia", "NVIDIA GeForce RTX 4090 D", "rtx4090d"),
        ("nvidia", "NVIDIA A800 80GB PCIe", "a800-80gb"),
        ("nvidia", "NVIDIA H200 NVL", "h200nvl"),
        ("NVIDIA", "  NVIDIA L40S  ", "l40s"),
        ("amd", "AMD Radeon Graphics", "amd"),  # nothing left: the brand
        ("intel", "Intel(R) Data Center GPU Max 1100", "max1100"),
        ("ascend", "Ascend 910B", "ascend910b"),  # brand dropped, then put back before a digit
        ("acme", "???", "acme"),
    ],
)
def test_edges(brand, model, expected):
    assert normalize_type(brand, model) == expected


def test_every_name_is_valid_in_a_job_file():
    # The configuration's own rule for SIMULATED_GPUS types.
    for brand, model, _ in EXAMPLES:
        assert re.match(r"^[a-z0-9][a-z0-9_.-]*$", normalize_type(brand, model))
