"""Normalized GPU type names: the vocabulary of ``gpus=TYPE:N`` in job files.

A driver reports a marketing name such as ``NVIDIA A100-SXM4-80GB``; users write
``a100-80gb``. The rule is short: drop the brand and product-line words, drop
form-factor words (SXM4, PCIe, HBM3, VF), join what is left in lower case, and
keep the memory size only for models that ship in more than one size under the
same name (A100, A800, V100). :data:`EXAMPLES` is the table the manual shows and
the tests check.
"""

from __future__ import annotations

import re

# Models sold in several memory sizes under one name; the size picks the card.
_SIZED = frozenset({"a100", "a800", "v100", "p100"})

_MARKS = re.compile(r"\((?:r|tm|c)\)", re.IGNORECASE)
_SPLIT = re.compile(r"[\s/_\-]+")
_MEM = re.compile(r"^(\d+)g(?:b)?$")
_FORM = re.compile(r"^(?:sxm\d*|pcie|hbm\d*e?|oam|vf|mxm|dgx|nvlink)$")

_NVIDIA_DROP = frozenset(
    {"nvidia", "geforce", "tesla", "quadro", "generation", "graphics", "device", "edition", "corporation"}
)
_AMD_DROP = frozenset(
    {"amd", "ati", "radeon", "instinct", "graphics", "pro", "series", "advanced", "micro", "devices", "inc"}
)
_INTEL_DROP = frozenset({"intel", "corporation", "data", "center", "gpu", "graphics", "series"})

EXAMPLES: tuple[tuple[str, str, str], ...] = (
    ("nvidia", "NVIDIA GeForce RTX 4090", "rtx4090"),
    ("nvidia", "NVIDIA GeForce RTX 3090 Ti", "rtx3090ti"),
    ("nvidia", "NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("nvidia", "NVIDIA A100-PCIE-40GB", "a100-40gb"),
    ("nvidia", "NVIDIA A100 80GB PCIe", "a100-80gb"),
    ("nvidia", "NVIDIA H100 80GB HBM3", "h100"),
    ("nvidia", "NVIDIA H100 PCIe", "h100"),
    ("nvidia", "NVIDIA H100 NVL", "h100nvl"),
    ("nvidia", "NVIDIA H200", "h200"),
    ("nvidia", "NVIDIA L40S", "l40s"),
    ("nvidia", "NVIDIA L4", "l4"),
    ("nvidia", "NVIDIA RTX A6000", "rtxa6000"),
    ("nvidia", "NVIDIA RTX 6000 Ada Generation", "rtx6000ada"),
    ("nvidia", "Tesla V100-SXM2-32GB", "v100-32gb"),
    ("nvidia", "Tesla T4", "t4"),
    ("amd", "AMD Instinct MI300X", "mi300x"),
    ("amd", "AMD Instinct MI300X VF", "mi300x"),
    ("amd", "AMD Instinct MI250X/MI250", "mi250x"),
    ("amd", "AMD Instinct MI210", "mi210"),
    ("amd", "Radeon RX 7900 XTX", "rx7900xtx"),
    ("amd", "AMD Radeon RX 7900 XTX", "rx7900xtx"),
    ("amd", "AMD Radeon PRO W7900", "w7900"),
    ("intel", "Intel(R) Data Center GPU Max 1550", "max1550"),
    ("intel", "Intel(R) Data Center GPU Flex Series 170", "flex170"),
    ("intel", "Intel Arc A770", "arca770"),
    ("intel", "Intel(R) Arc(TM) A770 Graphics", "arca770"),
    ("intel", "Intel(R) Arc(TM) B580 Graphics", "arcb580"),
    ("huawei", "Ascend 910B", "ascend910b"),
)


def normalize_type(brand: str, model_name: str) -> str:
    """The type name users write in job files for a card called ``model_name``.

    >>> normalize_type("nvidia", "NVIDIA GeForce RTX 4090")
    'rtx4090'
    >>> normalize_type("nvidia", "NVIDIA A100-SXM4-80GB")
    'a100-80gb'
    >>> normalize_type("nvidia", "NVIDIA H100 80GB HBM3")
    'h100'
    >>> normalize_type("amd", "AMD Instinct MI300X")
    'mi300x'
    >>> normalize_type("intel", "Intel Data Center GPU Max 1550")
    'max1550'
    >>> normalize_type("nvidia", "")
    'nvidia'
    """
    brand = brand.strip().lower()
    words = [w for w in _SPLIT.split(_MARKS.sub(" ", model_name).lower()) if w]
    if brand == "nvidia":
        out = _nvidia(words)
    elif brand == "amd":
        out = _amd(words)
    elif brand == "intel":
        out = _join(words, _INTEL_DROP)
    else:
        out = _join(words, frozenset({brand}))
    if out and out[0].isdigit():
        # "910B" alone says nothing; the brand makes it a name (ascend910b).
        out = brand + out
    return out if re.match(r"^[a-z0-9][a-z0-9_.-]*$", out or "") else brand


_PROFILE = re.compile(r"^(?:\d+c\.)?\d+g\.\d+gb(?:\+[a-z.]+)?$")


def mig_type(card_type: str, device_name: str) -> str:
    """The type of a MIG device: its card's type and the profile NVML names it by.

    NVML names a MIG device after its card, then ``MIG`` and the profile
    (``NVIDIA H100 80GB HBM3 MIG 3g.40gb``); ``gpus=h100-3g.40gb:1`` asks for one.

    >>> mig_type("h100", "NVIDIA H100 80GB HBM3 MIG 3g.40gb")
    'h100-3g.40gb'
    >>> mig_type("a100-40gb", "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb")
    'a100-40gb-1c.3g.20gb'
    >>> mig_type("h200", "NVIDIA H200 MIG 1g.18gb+me")
    'h200-1g.18gb-me'
    >>> mig_type("h100", "NVIDIA H100 80GB HBM3")
    'h100-mig'
    """
    words = device_name.lower().split()
    after = words[words.index("mig") + 1 :] if "mig" in words else []
    profile = after[0] if after and _PROFILE.match(after[0]) else "mig"
    # "+me" (media extensions) profiles: job files' type names have no "+".
    return f"{card_type}-{profile.replace('+', '-')}"


def _clean(word: str) -> str:
    return re.sub(r"[^a-z0-9]", "", word)


def _join(words: list[str], drop: frozenset[str]) -> str:
    return "".join(_clean(w) for w in words if w not in drop and not _FORM.match(w))


def _nvidia(words: list[str]) -> str:
    if "mig" in words:
        # A MIG device's name is its parent's plus the slice ("... MIG 1g.10gb").
        words = words[: words.index("mig")]
    mem = ""
    kept = []
    for w in words:
        m = _MEM.match(w)
        if m:
            mem = mem or m.group(1)
        elif w not in _NVIDIA_DROP and not _FORM.match(w):
            kept.append(_clean(w))
    out = "".join(kept)
    if out in _SIZED and mem:
        out = f"{out}-{mem}gb"
    return out


def _amd(words: list[str]) -> str:
    for w in words:
        # Instinct names say it all in one word: MI300X, MI250X/MI250, MI210.
        if re.match(r"^mi\d+[a-z]*$", w):
            return w
    return _join(words, _AMD_DROP)
