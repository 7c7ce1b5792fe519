"""Node features (``NODE_FEATURES``) and sbatch's ``--constraint`` over them.

A constraint is feature names joined by ``&`` (all of) and ``|`` (any of), ``&``
binding tighter, as Slurm reads them: ``a100&nvlink|h100`` is a member with both
``a100`` and ``nvlink``, or one with ``h100``. Slurm's brackets, counts (``a100*2``)
and parentheses are refused rather than read some other way.
"""

from __future__ import annotations

import functools
from collections.abc import Collection

from mtgpu.config.options import FEATURE_NAME as _NAME
from mtgpu.config.options import MAX_NODE_FEATURES as MAX_FEATURES


@functools.lru_cache(maxsize=1024)
def parse_constraint(text: str) -> tuple[frozenset[str], ...]:
    """The any-of groups of all-of features; ValueError names what is wrong.

    >>> parse_constraint("a100&nvlink|h100") == (frozenset({"a100", "nvlink"}), frozenset({"h100"}))
    True
    """
    groups = []
    names = 0
    for part in text.split("|"):
        group = set()
        for name in part.split("&"):
            name = name.strip()
            if not _NAME.fullmatch(name):
                raise ValueError(
                    f"{name[:40]!r} is not a feature name; a constraint is names joined by & (all) "
                    "and | (any), such as a100&nvlink|h100"
                )
            group.add(name)
            names += 1
        groups.append(frozenset(group))
    if names > MAX_FEATURES:
        raise ValueError(f"a constraint names at most {MAX_FEATURES} features")
    return tuple(groups)


def satisfies(features: Collection[str], constraint: str) -> bool:
    """True if a member with ``features`` meets ``constraint``.

    >>> satisfies({"a100", "nvlink"}, "a100&nvlink|h100"), satisfies({"a100"}, "a100&nvlink|h100")
    (True, False)
    """
    have = features if isinstance(features, (set, frozenset)) else set(features)
    return any(group <= have for group in parse_constraint(constraint))
