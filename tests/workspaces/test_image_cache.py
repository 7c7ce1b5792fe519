"""The member's cache of streamed images: a size limit, least recently used out."""

from __future__ import annotations

import os
from pathlib import Path

from mtgpu.workspaces.jobs import ImageCache


def test_the_least_recently_used_images_go_first_and_the_new_one_stays(tmp_path: Path) -> None:
    cache = ImageCache(str(tmp_path), limit=250)
    for i, name in enumerate(("a" * 64, "b" * 64, "c" * 64)):
        p = cache.path(name)
        p.write_bytes(b"x" * 100)
        os.utime(p, (1000 + i, 1000 + i))
    assert cache.get("a" * 64) is not None  # used now: the newest
    assert cache.evict(keep="c" * 64) == ["b" * 64]  # 300 > 250: the oldest goes
    assert sorted(p.stem[0] for p in tmp_path.glob("*.tar")) == ["a", "c"]
    cache.limit = 50
    assert cache.evict(keep="c" * 64) == ["a" * 64]  # never the one just streamed
    assert cache.get("b" * 64) is None and cache.get("c" * 64) is not None
