"""Workspaces on a real host: rootless podman as the tenant, driven over real ssh."""

from __future__ import annotations

import json
import shlex
import time

import pytest

pytestmark = [pytest.mark.root, pytest.mark.podman]


def test_files_land_in_the_home_owned_by_the_tenant_and_datasets_are_read_only(ws_host) -> None:
    w = ws_host
    v = w.mc("create", "files", "--template", "busybox")
    try:
        assert v["state"] == "RUNNING" and v["reservation"] and v["image"] == "localhost/mtgpu-test:1"
        ds = w.datasets
        pub = f"/datasets/{ds.name}"  # the same dataset where every tenant finds it
        script = (
            f"id -u; echo $HOME; pwd; echo made-inside > $HOME/from-ws.txt; "
            f"cat {ds}/imagenet/labels.txt; touch {ds}/imagenet/new 2>&1 || echo ro-refused; "
            f"sed s/^/pub:/ {pub}/imagenet/labels.txt; "
            f"touch {pub}/imagenet/new 2>&1 || echo pub-ro-refused; "
            f"touch /cache/c && echo cache-ok; env | grep ^MTGPU_WORKSPACE="
        )
        info = w.mc("shell", "files")
        assert info["argv"][1:3] == ["exec", "-it"] and info["tmux_session"] == "ws-files"
        _, out, _ = w.run(shlex.join(["mt-container", "shell", "files", "--", "sh", "-c", script]))
        lines = out.splitlines()
        assert lines[0] == str(w.uid)
        assert lines[1] == lines[2] == str(w.home)
        assert "cat" in lines and "dog" in lines and "Read-only file system" in out
        assert "ro-refused" in lines and "cache-ok" in lines and "MTGPU_WORKSPACE=files" in lines
        assert "pub:cat" in lines and "pub:dog" in lines and "pub-ro-refused" in lines
        made = w.home / "from-ws.txt"
        assert made.read_text() == "made-inside\n"
        assert made.stat().st_uid == w.uid and made.stat().st_gid == w.uid
        assert (w.home / ".mtgpu" / "cache" / "cache" / "c").stat().st_uid == w.uid
        assert not (ds / "imagenet" / "new").exists()
    finally:
        w.rm("files")
    assert all(x["name"] != "files" for x in w.mc("list"))


def test_a_published_port_is_reachable_through_ssh_L(ws_host) -> None:
    from workspace_testing import get_through_ssh_L

    w = ws_host
    w.run("mkdir -p www && echo served-from-workspace > www/index.html")
    w.mc("create", "web", "--template", "busybox", "--port", "8080")
    try:
        w.run(
            shlex.join(
                ["mt-container", "shell", "web", "--", "httpd", "-p", "8080", "-h", str(w.home / "www")]
            )
        )
        ports = w.mc("ports", "web")
        [p] = ports["ports"]
        assert p["container_port"] == 8080 and p["host_ip"] == "127.0.0.1"
        _, text, _ = w.run("mt-container ports web")
        assert f"-L 8080:127.0.0.1:{p['host_port']}" in text
        assert get_through_ssh_L(w, p["host_port"]) == b"served-from-workspace\n"
    finally:
        w.rm("web")


def test_a_saved_workspace_starts_a_new_one(ws_host) -> None:
    w = ws_host
    w.mc("create", "orig", "--template", "busybox")
    try:
        w.run("mt-container shell orig -- sh -c 'echo in-the-layer > /tmp/layer.txt'")
        saved = w.mc("save", "orig", "snap")
        assert saved["image"] == "localhost/mtgpu-saved/snap:latest"
        v = w.mc("create", "copy", "--saved", "snap")
        assert v["state"] == "RUNNING" and v["source"] == "saved:snap"
        _, out, _ = w.run("mt-container shell copy -- cat /tmp/layer.txt")
        assert out == "in-the-layer\n"
        rc, _, err = w.run("mt-container create nope --saved never-saved", ok=False)
        assert rc == 1 and "no saved image 'never-saved'" in err
    finally:
        w.rm("orig", "copy")


def test_a_devcontainer_json_with_image_env_and_post_create(ws_host) -> None:
    w = ws_host
    dc = """{
      // written by hand, with comments, as VS Code allows
      "image": "localhost/mtgpu-test:1",
      "containerEnv": {"GREETING": "hello-from-devcontainer"},
      "postCreateCommand": "echo $GREETING > ${containerWorkspaceFolder}/post-created.txt",
      "forwardPorts": [3000],
    }"""
    w.run("mkdir -p proj/.devcontainer && cat > proj/.devcontainer/devcontainer.json", input=dc.encode())
    v = w.mc("create", "dc", "--devcontainer", "proj")
    try:
        assert v["state"] == "RUNNING", v
        assert v["source"] == f"devcontainer:{w.home}/proj/.devcontainer/devcontainer.json"
        assert [p["container_port"] for p in v["ports"]] == [3000]
        made = w.home / "proj" / "post-created.txt"
        assert made.read_text() == "hello-from-devcontainer\n" and made.stat().st_uid == w.uid
        _, out, _ = w.run("mt-container shell dc -- sh -c 'pwd; echo $GREETING'")
        assert out.splitlines() == [str(w.home / "proj"), "hello-from-devcontainer"]
    finally:
        w.rm("dc")


def test_privileged_is_refused_by_mt_podman_plain_podman_and_the_hook(ws_host) -> None:
    w = ws_host
    for cmd in ("mt-podman", "podman", "docker"):
        rc, _, err = w.run(f"{cmd} run --rm --privileged localhost/mtgpu-test:1 true", ok=False)
        assert rc == 125 and "rule 'no-privileged'" in err, (cmd, err)
    # The podman binary itself, past the wrappers: the OCI hook refuses it.
    rc, _, err = w.run("/usr/bin/podman run --rm --privileged localhost/mtgpu-test:1 true", ok=False)
    assert rc != 0 and "mtgpu-podman-hook" in err and "podman-policy.log" in err
    _, log, _ = w.run("cat ~/.mtgpu/podman-policy.log")
    assert "rule 'no-privileged'" in log
    refused = {
        "-v /etc:/host-etc": "host-paths",
        "--network host": "no-host-namespaces",
        "--pid=host": "no-host-namespaces",
        "-p 8080:80": "ports",
        "--device /dev/kvm": "no-host-devices",
        f"-v {w.datasets}:/d": "datasets-read-only",
    }
    for flags, rule in refused.items():
        rc, _, err = w.run(f"mt-podman run --rm {flags} localhost/mtgpu-test:1 true", ok=False)
        assert rc == 125 and f"rule '{rule}'" in err, (flags, err)
    rc, out, err = w.run("/usr/bin/podman run --rm -v /etc:/host-etc localhost/mtgpu-test:1 true", ok=False)
    assert rc != 0
    # What the policy allows runs, as the tenant, with the home and datasets.
    _, out, _ = w.run(
        f"mt-podman run --rm --userns=keep-id -v $HOME:$HOME -v {w.datasets}:/d:ro "
        "-p 127.0.0.1::80 localhost/mtgpu-test:1 sh -c 'id -u; cat /d/imagenet/labels.txt'"
    )
    assert out.split() == [str(w.uid), "cat", "dog"]
    _, rules, _ = w.run("mt-podman --rules")
    assert "no-privileged" in rules and str(w.home) in rules


def test_the_docker_shim_answers_dev_containers_attach(ws_host) -> None:
    w = ws_host
    w.mc("create", "attach", "--template", "busybox")
    try:
        _, out, _ = w.run("docker version --format '{{.Server.APIVersion}}'")
        assert out.strip() == "1.41"
        _, out, _ = w.run("docker version --format '{{json .}}'")
        assert json.loads(out)["Server"]["Version"]
        _, out, _ = w.run("docker ps --format '{{.ID}} {{.Names}}'")
        cid = next(line.split()[0] for line in out.splitlines() if line.endswith(" attach"))
        _, out, _ = w.run("docker ps -q --filter label=mtgpu.workspace=attach")
        assert out.strip() and cid.startswith(out.strip()[:12])
        _, out, _ = w.run("docker inspect --type container attach")
        [info] = json.loads(out)
        assert info["State"]["Running"] is True and info["Name"].lstrip("/") == "attach"
        assert "MTGPU_WORKSPACE=attach" in info["Config"]["Env"]
        assert info["Config"]["Labels"]["mtgpu.workspace"] == "attach"
        _, out, _ = w.run(
            "docker exec -i -u root -e VSCODE_REMOTE_CONTAINERS_SESSION=x attach /bin/sh",
            input=b"echo from-$((40+2)) $VSCODE_REMOTE_CONTAINERS_SESSION\nid -u\nexit\n",
        )
        assert out.split() == ["from-42", "x", "0"]
        rc, _, err = w.run("docker exec --privileged attach true", ok=False)
        assert rc == 125 and "no-privileged" in err
    finally:
        w.rm("attach")


def test_a_full_host_queues_in_the_one_ledger_and_stop_keeps_the_reservation(ws_host) -> None:
    w = ws_host
    a = w.mc("create", "big1", "--template", "busybox", "--gpus", "1")
    try:
        assert a["state"] == "RUNNING" and a["gpus"] == [0]
        [node] = json.loads(w.run("mt-job nodes --json")[1])
        assert node["gpus"][0]["jobs"] == [a["reservation"]]  # the workspace, in the job ledger
        b = w.mc("create", "big2", "--template", "busybox", "--gpus", "1", "--wait", "3")
        assert b["state"] == "PENDING" and b["position"] == 1 and "Resources" in b["reason"]
        rc, _, err = w.run("mt-container create big3 --template busybox --gpus 1 --no-queue", ok=False)
        assert rc == 1 and "without --no-queue it waits in the queue" in err
        job = w.run("mt-job submit --parsable --gpus=1 -", input=b"#!/bin/sh\necho ran\n")[1].strip()
        assert json.loads(w.run(f"mt-job show {job} --json")[1])["state"] == "PENDING"
        # stop keeps the reservation: nothing else gets the GPU
        assert w.mc("stop", "big1")["state"] == "STOPPED"
        time.sleep(1.5)
        assert w.mc("show", "big2")["state"] == "PENDING"
        assert w.mc("start", "big1")["state"] == "RUNNING"
        # stop --release gives it back: the head of the queue (big2) gets it
        assert w.mc("stop", "big1", "--release")["state"] == "RELEASED"
        assert w.wait_state("big2", {"RUNNING"})["gpus"] == [0]
        assert w.mc("start", "big1", "--wait", "2")["state"] == "PENDING"
    finally:
        w.rm("big1", "big2")
        w.ssh("mt-job", "cancel", locals().get("job", "0"))


def test_shell_opens_in_the_tenants_tmux_and_survives_a_disconnect(ws_host) -> None:
    from mtgpu_testing import ClientTerminal

    w = ws_host
    w.mc("create", "tm", "--template", "busybox")
    term = ClientTerminal(w.host, w.user, w.key, "mt-container", "shell", "tm")
    try:
        term.type("echo inside-$((6*7)) $MTGPU_WORKSPACE")
        term.wait_for("inside-42 tm")
        term.kill()
        time.sleep(0.5)
        _, out, _ = w.run("tmux -L mtgpu list-sessions -F '#{session_name}'")
        assert "ws-tm" in out.split()
        term.close()
        term = ClientTerminal(w.host, w.user, w.key, "mt-container", "shell", "tm")
        term.wait_for("inside-42 tm")  # the same shell, screen and all
    finally:
        term.close()
        w.ssh("tmux", "-L", "mtgpu", "kill-session", "-t", "ws-tm")
        w.rm("tm")


def test_user_images_follow_the_policy_and_podman_check_is_clean(ws_host) -> None:
    w = ws_host
    rc, _, err = w.run("mt-container create ext --image docker.io/library/alpine:3", ok=False)
    assert rc == 1 and "rule 'user-images'" in err
    rc, _, err = w.run("mt-container create bad --template nope", ok=False)
    assert rc == 1 and "no template 'nope'" in err
    assert all(
        line.startswith("ok")
        for line in w.podman_check.splitlines()
        if line.strip() and not line.startswith("mtgpu-setup:")
    ), w.podman_check
    assert [t["name"] for t in w.mc("templates")] == ["busybox"]
