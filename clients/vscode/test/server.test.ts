/**
 * The extension's logic against a real MTGPU server over the real OpenSSH client:
 * discovery from the laptop's own files, the model and the tree from live data, an
 * unreachable server shown with its reason, the SSH terminal landing in tmux, and a
 * job followed from submission to its output and cancellation.
 */

import { strict as assert } from "node:assert";
import { execFileSync, spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { test } from "node:test";
import { errorMessage, follow, jobOutputArgv, remoteSshUri, terminalCommand } from "../src/commands";
import { Fleet, monthUsage } from "../src/fleet";
import { ApiConnection } from "../src/protocol";
import { discover, loadServerList, sshConfigHosts } from "../src/sources";
import { serverTree, statusSummary } from "../src/view";
import { needsServer, real, sshOptions, tmpDir, until } from "./support";

const G = 2 ** 30;

function fleetFromHome(timeoutMs: number): Fleet {
  const list = loadServerList();
  return new Fleet(discover(list, sshConfigHosts()), { ssh: sshOptions(timeoutMs), intervalMs: 300 });
}

test("one pass finds the server, its GPUs and the dead one, from the laptop's own files", needsServer, async () => {
  const f = fleetFromHome(3000);
  assert.deepEqual([...f.states.keys()].sort(), ["dead", "elsewhere", "gpu"]);
  const shown = await f.once();
  // The Host pattern is no server; `elsewhere` never answered as MTGPU, so it is hidden.
  assert.deepEqual(shown.map((s) => s.target.name).sort(), ["dead", "gpu"]);
  assert.equal(f.state("elsewhere").hidden, true);
  const gpu = f.state("gpu");
  assert.deepEqual([gpu.status, gpu.user, gpu.server, gpu.target.source], ["up", real!.user, real!.server, "ssh_config"]);
  const node = gpu.nodes.find((n) => n.name === real!.server);
  assert.deepEqual(node?.gpus.map((g) => [g.index, g.type, g.vram_total]), [[0, "rtx4090", 24 * G], [1, "rtx4090", 24 * G]]);
  assert.ok(Array.isArray(gpu.workspaces));
  const dead = f.state("dead");
  assert.deepEqual([dead.status, dead.reason], ["unreachable", "no answer within 3 s"]);
  // The tree: the live server with its GPUs, the dead one with its reason, never a hang.
  const tree = serverTree(f);
  const [g, d] = [tree.find((n) => n.id === "gpu")!, tree.find((n) => n.id === "dead")!];
  assert.equal(g.children?.[0].children?.length, 2);
  assert.match(g.description ?? "", /^\d\/2 GPUs busy · CPU \d+% · RAM [\d.]+\/[\d.]+ GiB$/);
  assert.equal(d.description, "unreachable: no answer within 3 s");
  assert.match(statusSummary(f).text, /^\$\(server\) 1\/2 · GPUs \d\/2 busy/);
  // The user's own usage this month, read in the same pass.
  assert.equal(gpu.usageError, undefined);
  assert.match(g.children?.at(-1)?.description ?? "", /^\d+ jobs? · GPU-h .+ · CPU-h [\d.<]+$/);
  // Remote - SSH opens the home the server gave.
  assert.match(gpu.home ?? "", new RegExp(`^/.+/${real!.user}$`));
  assert.equal(remoteSshUri(gpu.target, gpu.home, gpu.user), `vscode-remote://ssh-remote+gpu${gpu.home}`);
});

test("the SSH terminal's command lands in the user's tmux session there", needsServer, async () => {
  const cmd = terminalCommand({ name: "gpu", host: "gpu", source: "ssh_config" }, sshOptions());
  const sock = `mtgpu-vscode-${process.pid}`;
  const tmux = (...a: string[]): string => execFileSync("tmux", ["-L", sock, ...a], { encoding: "utf-8" });
  tmux("new-session", "-d", "-x", "120", "-y", "30", cmd.shellPath, ...cmd.shellArgs);
  try {
    await until(() => tmux("capture-pane", "-p").includes("$"), "a prompt", 30000);
    tmux("send-keys", "-l", "echo IN-${TMUX:+TMUX}-$(tmux display -p '#{session_name}')-END");
    tmux("send-keys", "Enter");
    const screen = await until(() => /IN-TMUX-\S+-END/.exec(tmux("capture-pane", "-p")), "the echo inside tmux", 30000);
    assert.match(screen[0], /^IN-TMUX-\S+-END$/);
  } finally {
    spawnSync("tmux", ["-L", sock, "kill-server"]);
  }
});

test("a ~/.ssh/config host whose key is not trusted yet stays in the panel, with how to trust it", needsServer, async () => {
  // The real server, under a name whose known_hosts is empty: it answers, its key is unknown.
  const g = new Map<string, string>();
  for (const line of execFileSync("ssh", ["-G", "-F", real!.sshConfig, "gpu"], { encoding: "utf-8" }).split("\n")) {
    const i = line.indexOf(" ");
    if (i > 0 && !g.has(line.slice(0, i))) g.set(line.slice(0, i), line.slice(i + 1));
  }
  const dir = tmpDir("mtgpu-untrusted-");
  const cfg = path.join(dir, "config");
  fs.writeFileSync(
    cfg,
    `Host fresh\n  HostName ${g.get("hostname")}\n  Port ${g.get("port")}\n  User ${g.get("user")}\n` +
      `  StrictHostKeyChecking yes\n  UserKnownHostsFile ${path.join(dir, "known_hosts")}\n`,
  );
  const f = new Fleet([{ name: "fresh", host: "fresh", source: "ssh_config" }], { ssh: sshOptions(10000, cfg), intervalMs: 300 });
  const shown = await f.once();
  const st = f.state("fresh");
  assert.deepEqual([shown.map((s) => s.target.name), st.hidden, st.status], [["fresh"], false, "unreachable"]);
  assert.match(st.reason, /^host key not trusted; check and accept it once with `ssh fresh`/);
  assert.match(serverTree(f).find((n) => n.id === "fresh")?.description ?? "", /^unreachable: host key not trusted/);
  f.stop();
});

test("a listing the server gives in pages is read whole, as one page of everything gives it", needsServer, async () => {
  const f = fleetFromHome(20000);
  const st = f.state("gpu");
  await f.connect(st);
  const ids: string[] = [];
  try {
    for (let i = 0; i < 3; i++) ids.push((await f.submitJob(st, `#!/bin/sh\n#MTGPU name=page${i}\ntrue\n`)).job_id);
    const c = new ApiConnection(st.target, sshOptions(20000));
    try {
      const whole = (await c.call("job.list", { all: true, limit: 5000 })) as { job_id: string }[];
      const paged = (await c.callAll("job.list", { all: true, limit: 1 })) as { job_id: string }[];
      assert.ok(paged.length >= 3 && ids.every((id) => paged.some((j) => j.job_id === id)), JSON.stringify(paged));
      assert.deepEqual(paged.map((j) => j.job_id), whole.map((j) => j.job_id));
      const one = await c.call("job.list", { all: true, limit: 1 });
      assert.equal((one as unknown[]).length, 1); // so the paged read above took pages
    } finally {
      c.close();
    }
    await f.refresh(st, false);
    assert.ok(ids.every((id) => st.jobs.some((j) => j.job_id === id)));
  } finally {
    for (const id of ids) await f.cancelJob(st, id).catch(() => undefined);
    f.stop();
  }
});

test("a job: submitted, running on a GPU, its output followed, a waiting one's reason, cancelled", needsServer, async () => {
  const f = fleetFromHome(20000);
  const st = f.state("gpu");
  await f.connect(st);
  // A refusal reaches the user as the server's own words and code.
  const refusal = await f.submitJob(st, "#MTGPU gpus=nvidia:9\ntrue\n").then(() => undefined, (e: unknown) => e);
  assert.equal(errorMessage("submit the job", refusal), "MTGPU: submit the job: rejected: no member has 9 nvidia GPUs; the most on one member is 2 (rejected)");
  const both = await f.submitJob(st, "#!/bin/sh\n#MTGPU gpus=nvidia:2 name=both\necho hello-from-$MTGPU_JOB_ID\nsleep 120\n");
  const waits = await f.submitJob(st, "#!/bin/sh\n#MTGPU gpus=nvidia:1 name=waits\nsleep 1\n");
  try {
    const job = (id: string) => st.jobs.find((j) => j.job_id === id);
    await until(async () => (await f.refresh(st, false), job(both.job_id)?.state === "RUNNING"), "RUNNING", 90000);
    await until(async () => (await f.refresh(st, false), job(waits.job_id)?.reason === "Resources"), "the waiting reason", 30000);
    const line = serverTree(f).find((n) => n.id === "gpu")?.children?.find((c) => c.label === "Jobs")?.children?.find((c) => c.job === waits.job_id);
    assert.match(line?.description ?? "", /^PENDING #\d+ \(Resources/);
    assert.equal(line?.contextValue, "job-active");
    // Cancelled now, so that nothing ends while the usage is compared below.
    await f.cancelJob(st, waits.job_id);
    let out = "";
    const follower = follow(jobOutputArgv(st.target, sshOptions(), both.job_id), (t) => (out += t));
    try {
      await until(() => out.includes(`hello-from-${both.job_id}`), "the job's output", 60000);
    } finally {
      follower.stop();
    }
    const r = await f.cancelJob(st, both.job_id);
    assert.ok([...r.cancelled, ...r.stopping].includes(both.job_id));
    await until(async () => (await f.refresh(st, false), job(both.job_id)?.state === "CANCELLED" && job(waits.job_id)?.state === "CANCELLED"), "both CANCELLED", 60000);
    // Its GPU time is in the user's usage this month: the same numbers as `mt-job usage` there.
    await f.readUsage(st);
    assert.ok(st.usage, st.usageError);
    assert.ok((st.usage.gpuHours.rtx4090 ?? 0) > 0 && st.usage.jobs >= 1, JSON.stringify(st.usage));
    const there = execFileSync("ssh", ["-F", real!.sshConfig, "-o", "BatchMode=yes", "gpu", "mt-job", "usage", "--by", "gpu_type", "--json"], { encoding: "utf-8" });
    assert.deepEqual(st.usage, monthUsage(JSON.parse(there)));
  } finally {
    await f.cancelJob(st, waits.job_id).catch(() => undefined);
    await f.cancelJob(st, both.job_id).catch(() => undefined);
    f.stop();
  }
});
