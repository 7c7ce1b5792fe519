"""What the README and the manuals promise about getting MTGPU is there.

Nothing tells anyone to ``pip install`` MTGPU (or its laptop client) by name from a
package index: those names there belong to other projects, and MTGPU installs from a
clone or a bundle, by path. The VS Code extension is not said to be on the Marketplace
(it is installed from its ``.vsix``), no placeholder stands in for a URL, every
``mtgpu-setup install`` option is in the manual's list, and LICENSE is the license
pyproject.toml declares, in full.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from mtgpu_testing import REPO

from mtgpu.cmdline import options
from mtgpu.install.bundle import CONTENTS
from mtgpu.install.setup import build_parser

DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "clients").glob("*/README.md")])
#: The Apache License 2.0 as the Apache Software Foundation publishes it
#: (https://www.apache.org/licenses/LICENSE-2.0.txt).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
PIP = re.compile(r"\bpip(?:3|x)?\s+install\b([^`\n]*)")


def _project_names() -> set[str]:
    """The distributions this repository builds: the server's and each client's."""
    names = set()
    for pyproject in [REPO / "pyproject.toml", *(REPO / "clients").glob("*/pyproject.toml")]:
        names.add(_normal(tomllib.loads(pyproject.read_text())["project"]["name"]))
    return names


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def index_installs(text: str, names: set[str]) -> list[str]:
    """The ``pip install`` commands in ``text`` that fetch one of ``names`` from a
    package index (by name, not by a path to a clone or a bundle's wheel)."""
    bad = []
    for m in PIP.finditer(text):
        try:
            words = shlex.split(m.group(1), comments=True)
        except ValueError:
            words = m.group(1).split()
        for word in words:
            if word.startswith("-") or word.startswith((".", "/", "~", "$")) or "/" in word:
                continue  # an option, or a path (a clone, a wheel)
            name = re.match(r"[A-Za-z0-9._-]*", word)
            if name and _normal(name.group()) in names:
                bad.append(m.group().strip())
    return bad


def marketplace_claims(text: str) -> list[str]:
    """Paragraphs that send anyone to the Marketplace for the extension, or say it is
    published there, rather than that it is not."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        if re.search(r"marketplace", para, re.I) and not re.search(
            r"\bnot (?:on|published|in)\b|\(not published\)", para
        ):
            out.append(para.strip())
        elif re.search(r"\bfrom the (?:visual studio )?marketplace\b|search(?:ing)? for mtgpu", para, re.I):
            if not re.search(r"does not find it", para):
                out.append(para.strip())
    return out


def placeholders(text: str) -> list[str]:
    """Lines that download from no URL: a stand-in for the address, or ``curl`` with none."""
    out = []
    for line in text.splitlines():
        if re.search(r"\bURL-OF\b|\bURL_OF\b|<url>", line, re.I):
            out.append(line)
        elif re.search(r"\b(?:curl -\w*O\w*|wget)\b", line) and not re.search(r"\w://", line):
            out.append(line)  # a download to a file, from nowhere
        elif re.search(r"\bgit clone\s+[A-Z][A-Z_-]+\b", line):
            out.append(line)
    return out


def test_the_checks_catch_what_they_are_for() -> None:
    names = {"mtgpu", "remotegpu"}
    assert index_installs("`pip install 'mtgpu[amd]'`", names) == ["pip install 'mtgpu[amd]'"]
    assert index_installs("pip install mtgpu\npipx install remotegpu\n", names) == [
        "pip install mtgpu",
        "pipx install remotegpu",
    ]
    assert index_installs("python3 -m pip install -q MTGPU==0.1.0", names)
    assert not index_installs(
        "pip install ./clients/remotegpu    # from a checkout of mtgpu\n"
        "`pip install .` in a clone of MTGPU\n~/venvs/train/bin/pip install numpy\n"
        "pip install dist/mtgpu-0.1.0-py3-none-any.whl\n",
        names,
    )
    assert marketplace_claims("The extension (published on the Visual Studio\nMarketplace as **MTGPU**)")
    assert marketplace_claims("From the Marketplace (Extensions view, search for MTGPU)")
    assert not marketplace_claims("It is not on the Visual Studio Marketplace (not published).")
    assert placeholders("git clone URL-OF-THE-MTGPU-REPOSITORY mtgpu")
    assert placeholders("(or fetch a bundle with `curl -LO`)")
    assert not placeholders("git clone ssh://alice@gpu01:2222/~/repo.git")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_docs_install_mtgpu_only_from_this_repository(doc: Path) -> None:
    text = doc.read_text()
    names = _project_names()
    assert names >= {"mtgpu", "remotegpu"}
    assert index_installs(text, names) == [], (
        f"{doc.relative_to(REPO)} tells users to pip install MTGPU by name from a package "
        "index, where that name is another project's; install from a clone or a bundle (a path)"
    )
    assert marketplace_claims(text) == [], (
        f"{doc.relative_to(REPO)} says the VS Code extension is on the Marketplace; it is "
        "installed from the .vsix built from clients/vscode"
    )
    assert placeholders(text) == [], f"{doc.relative_to(REPO)} downloads from no URL"


def test_every_install_option_is_in_the_manual() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "cmd")
    install = sub.choices["install"]  # type: ignore[attr-defined]
    manual = (REPO / "docs" / "manual.md").read_text()
    section = manual.split("## Installing MTGPU on a host", 1)[1].split("\n### ", 1)[0]
    missing = [o for o in options(install) if o.startswith("--") and o not in ("--help", "--yes")]
    missing = [o for o in missing if f"`{o}" not in section]
    assert missing == [], f"the manual's list of install options lacks {missing}"


def test_license_is_the_one_pyproject_declares_in_full() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    license_file = REPO / "LICENSE"
    assert license_file.is_file(), "pyproject.toml says Apache-2.0 but there is no LICENSE"
    text = license_file.read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert hashlib.sha256(text.encode()).hexdigest() == APACHE_2_SHA256, (
        "LICENSE is not the standard Apache License 2.0 text"
    )
    # The release bundle carries it, with the rest of what it lists.
    assert [c for c in CONTENTS if not (REPO / c).exists()] == []
