"""The figures of the security, fuzz and fault suites (docs/SECURITY.md quotes them).

Tests call :func:`tally` with what they did; ``tests/conftest.py`` prints the totals
at the end of the run and, with ``MTGPU_FIGURES=PATH``, writes them there as JSON.
"""

from __future__ import annotations

from collections import Counter

#: attacks_refused, attacks_succeeded, fuzz_cases, faults_survived, acked_lost...
FIGURES: Counter[str] = Counter()


def tally(kind: str, n: int = 1) -> None:
    FIGURES[kind] += n


def highest(kind: str, value: int) -> None:
    """Keep the largest ``value`` seen under ``kind`` (a slowest time in ms, say)."""
    FIGURES[kind] = max(FIGURES[kind], value)
