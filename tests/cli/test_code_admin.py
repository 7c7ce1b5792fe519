"""mtcode-admin's own list of clusters: clear errors for a bad file or an unknown
cluster, and an unreachable cluster named with ssh's reason (in process, no server)."""

from __future__ import annotations

import json

from mtgpu.cli.code_admin import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_unknown_cluster_and_a_bad_file_say_what_to_do(tmp_path, capsys):
    f = tmp_path / "clusters.yaml"
    rc, _, err = run(capsys, "--clusters", str(f), "revoke", "alice", "alpha")
    assert rc == 1 and f"no cluster 'alpha' in {f} (known: none yet)" in err
    assert "mtcode-admin cluster add alpha HOST[:PORT]" in err
    f.write_text("clusters:\n  alpha: {}\n")
    rc, _, err = run(capsys, "--clusters", str(f), "cluster", "list", "--offline")
    assert rc == 1 and "cluster 'alpha' needs `members:`" in err
    f.write_text("clusters: [a, b]\n")
    rc, _, err = run(capsys, "--clusters", str(f), "cluster", "list")
    assert rc == 1 and "expected a mapping with `clusters:`" in err


def test_an_unreachable_cluster_is_named_with_the_reason(tmp_path, capsys):
    f = tmp_path / "clusters.yaml"
    f.write_text("clusters:\n  alpha:\n    members: ['127.0.0.1:1']\n")
    rc, out, _ = run(capsys, "--clusters", str(f), "cluster", "list", "--json")
    (row,) = json.loads(out)
    assert rc == 1 and row["reachable"] is False
    assert row["error"].startswith("cannot reach cluster alpha: 127.0.0.1:1: ")
    assert "Connection refused" in row["error"]
    rc, out, _ = run(capsys, "--clusters", str(f), "cluster", "list", "--offline")
    assert rc == 0 and "alpha" in out and "127.0.0.1:1" in out
    rc, out, _ = run(capsys, "--clusters", str(f), "cluster", "remove", "alpha", "--json")
    assert rc == 0 and json.loads(out)["removed"] == "alpha"
    assert "alpha" not in f.read_text()
