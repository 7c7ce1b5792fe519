import { strict as assert } from "node:assert";
import { test } from "node:test";
import { attachedContainerUri, checkWorkspaceName, errorMessage, jobOutputArgv, remoteSshAuthority, remoteSshUri, shellQuote, sourceChoices, terminalCommand } from "../src/commands";
import { Fleet, monthUsage, usageRefused, type ServerState } from "../src/fleet";
import { ApiError, apiArgv, reasonFromSsh, requests, ServerUnreachable } from "../src/protocol";
import type { Target } from "../src/sources";
import { hours, jobDescription, printable, serverTree, statusSummary, usageText } from "../src/view";

const G = 2 ** 30;
const ssh = { sshPath: "ssh", timeoutMs: 10000 };
const alias: Target = { name: "gpu", host: "gpu", source: "ssh_config" };
const listed: Target = { name: "lab", host: "10.0.0.5", port: 2222, user: "alice", identity: "/k", source: "list" };

test("the API connection is `ssh -T -s HOST mtgpu-api`, never prompting", () => {
  const argv = apiArgv(listed, ssh);
  assert.deepEqual(argv.slice(0, 2), ["ssh", "-T"]);
  assert.deepEqual(argv.slice(-8), ["-s", "-p", "2222", "-l", "alice", "-i", "/k", "--", "10.0.0.5", "mtgpu-api"].slice(-8));
  assert.ok(argv.includes("BatchMode=yes") && argv.includes("ConnectTimeout=10"));
  assert.ok(apiArgv(listed, { ...ssh, timeoutMs: 120000, connectTimeoutMs: 5000 }).includes("ConnectTimeout=5"));
  assert.deepEqual(apiArgv(alias, ssh).slice(-4), ["-s", "--", "gpu", "mtgpu-api"]);
  // A host that looks like an option stays a host.
  assert.deepEqual(apiArgv({ name: "x", host: "-oProxyCommand=x", source: "list" }, ssh).slice(-3), ["--", "-oProxyCommand=x", "mtgpu-api"]);
});

test("ssh's failures become reasons to act on", () => {
  assert.match(reasonFromSsh("Host key verification failed.\n", 255, alias, 10000), /host key not trusted; check and accept it once with `ssh gpu`/);
  assert.match(reasonFromSsh("lena@127.0.0.1: Permission denied (publickey).\n", 255, alias, 10000), /key not accepted: ask an admin/);
  assert.equal(reasonFromSsh("subsystem request failed on channel 0\n", 1, alias, 10000), "not an MTGPU server (no mtgpu-api subsystem)");
  assert.equal(reasonFromSsh("ssh: connect to host x port 22: Connection refused\n", 255, listed, 10000), "connection refused on port 2222: is mtgpu-server running?");
  assert.equal(reasonFromSsh("", 3, alias, 10000), "ssh exited with status 3");
});

test("an unreachable server's notification is its reason", () => {
  assert.equal(errorMessage("cancel the job", new ServerUnreachable("no answer within 10 s")), "MTGPU: cancel the job: no answer within 10 s");
});

test("terminal, Remote - SSH and Dev Containers arguments", () => {
  assert.deepEqual(terminalCommand(alias, ssh), { name: "MTGPU: gpu", shellPath: "ssh", shellArgs: ["--", "gpu"] });
  assert.deepEqual(terminalCommand(listed, { ...ssh, configFile: "/c" }).shellArgs, ["-F", "/c", "-p", "2222", "-l", "alice", "-i", "/k", "--", "10.0.0.5"]);
  assert.equal(remoteSshUri(alias, "/srv/homes/lena", "lena"), "vscode-remote://ssh-remote+gpu/srv/homes/lena");
  assert.equal(remoteSshUri({ ...alias, user: "bob" }, undefined, undefined), "vscode-remote://ssh-remote+bob@gpu/home/bob");
  const auth = remoteSshAuthority(listed);
  assert.deepEqual(JSON.parse(Buffer.from(auth, "hex").toString()), { hostName: "10.0.0.5", port: 2222, user: "alice" });
  const uri = attachedContainerUri(alias, { name: "nb", state: "RUNNING", workdir: "/home/lena/proj" }, "/home/lena");
  const m = /^vscode-remote:\/\/attached-container\+([0-9a-f]+)@ssh-remote\+gpu\/home\/lena\/proj$/.exec(uri);
  assert.ok(m, uri);
  assert.deepEqual(JSON.parse(Buffer.from(m[1], "hex").toString()), { containerName: "/nb" });
  assert.ok(attachedContainerUri(alias, { name: "nb", state: "RUNNING" }, "/h/lena").endsWith("@ssh-remote+gpu/h/lena"));
});

test("a job's output is `mt-job logs -f ID` there, the id quoted for the remote shell", () => {
  assert.deepEqual(jobOutputArgv(alias, ssh, "12").slice(-3), ["--", "gpu", "mt-job logs -f 12"]);
  assert.equal(jobOutputArgv(alias, ssh, "1; rm -rf ~").at(-1), "mt-job logs -f '1; rm -rf ~'");
  assert.equal(shellQuote("it's"), `'it'\\''s'`);
});

test("workspace names and the source picker", () => {
  assert.equal(checkWorkspaceName("nb-1.x_y"), undefined);
  assert.match(checkWorkspaceName("NB") ?? "", /lower-case letters/);
  assert.match(checkWorkspaceName("") ?? "", /give the workspace a name/);
  const choices = sourceChoices([{ name: "jupyter", image: "quay.io/jupyter/x:1", description: "JupyterLab" }]);
  assert.deepEqual(choices.map((c) => [c.label, c.source]), [["jupyter", "jupyter"], ["Image…", undefined]]);
  assert.deepEqual(requests.createWorkspace("a", "jupyter").args, { name: "a", template: "jupyter" });
  assert.deepEqual(requests.createWorkspace("a", "localhost/x:1").args, { name: "a", image: "localhost/x:1" });
});

function state(fleet: Fleet, name: string, patch: Partial<ServerState>): void {
  Object.assign(fleet.state(name), patch);
}

test("the tree and the status bar: GPUs, workspaces, jobs with pending reasons, unreachable servers", () => {
  const f = new Fleet([alias, listed], { ssh, intervalMs: 1000 });
  state(f, "gpu", {
    status: "up", user: "lena", server: "testhost", workspaces: [{ name: "nb", state: "RUNNING", gpus: [1] }],
    nodes: [{ name: "testhost", cpus: 4, cpu_percent: 12, ram_total: 8 * G, ram_used: 2 * G, gpus: [
      { index: 0, type: "rtx4090", vram_total: 24 * G, vram_used: 3 * G, util: 40, jobs: ["7"] },
      { index: 1, type: "rtx4090", vram_total: 24 * G, vram_used: 0, util: 0, jobs: [] },
    ] }],
    jobs: [
      { job_id: "9", name: "big", state: "PENDING", reason: "Resources", reason_detail: "no member has 4 free GPUs", position: 1 },
      { job_id: "7", name: "train\u001b[2J", state: "RUNNING", nodes: ["testhost"] },
      { job_id: "3", name: "old", state: "COMPLETED", exit_code: 0, end_time: 5 },
    ],
  });
  state(f, "lab", { status: "unreachable", reason: "no answer within 10 s" });
  const [gpu, lab] = serverTree(f);
  assert.equal(gpu.contextValue, "server-up-ws");
  assert.equal(gpu.description, "1/2 GPUs busy · CPU 12% · RAM 2.0/8.0 GiB");
  const [gpus, ws, jobs] = gpu.children ?? [];
  assert.deepEqual(gpus.children?.map((g) => [g.label, g.description]), [
    ["GPU 0: rtx4090", "3.0/24.0 GiB · 40% · jobs 7"],
    ["GPU 1: rtx4090", "0.0/24.0 GiB · 0%"],
  ]);
  assert.deepEqual(ws.children?.map((w) => [w.label, w.contextValue, w.description]), [["nb", "workspace-RUNNING", "RUNNING · GPUs 1"]]);
  // Running first, then pending by position, then finished; control characters never drawn.
  assert.deepEqual(jobs.children?.map((j) => [j.label, j.description, j.contextValue]), [
    ["7 train [2J", "RUNNING on testhost", "job-active"],
    ["9 big", "PENDING #1 (Resources: no member has 4 free GPUs)", "job-active"],
    ["3 old", "COMPLETED (exit 0)", "job-final"],
  ]);
  assert.equal(lab.description, "unreachable: no answer within 10 s");
  assert.equal(lab.contextValue, "server-unreachable");
  assert.equal(lab.children, undefined);
  const s = statusSummary(f);
  assert.equal(s.text, "$(server) 1/2 · GPUs 1/2 busy · jobs 1 running, 1 pending");
  assert.match(s.tooltip, /lab: no answer within 10 s/);
  assert.equal(jobDescription({ job_id: "1", state: "PENDING", reason: "None", position: null }), "PENDING");
  assert.equal(jobDescription({ job_id: "2", state: "CANCELLED", exit_code: 0 }), "CANCELLED");
  assert.equal(jobDescription({ job_id: "3", state: "FAILED", exit_code: 2 }), "FAILED (exit 2)");
  assert.equal(printable("a\u202eb\nc"), "a b c");
});

/** A `job.usage` answer by gpu_type, as the daemon gives it (tests/tui/test_view.py has the same). */
const USAGE = {
  cluster: "lab",
  start: "2026-12-01",
  end: "2026-12-31",
  by: ["gpu_type"],
  rows: [
    { gpu_type: "", jobs: 2, gpu_hours: 0, cpu_hours: 1 },
    { gpu_type: "rtx4090", jobs: 3, gpu_hours: 12.5, cpu_hours: 4 },
    { gpu_type: "a100", jobs: 1, gpu_hours: 0.001, cpu_hours: 0.5 },
  ],
  total: { jobs: 6, gpu_hours: 12.501, cpu_hours: 5.5 },
  cut_months: [],
};

test("this month's usage: read from job.usage as remotegpu-cli reads it, in the tree and the status bar", () => {
  assert.deepEqual(requests.usage(), { op: "job.usage", args: { by: ["gpu_type"] } });
  const u = monthUsage(USAGE);
  assert.deepEqual(u, { month: "2026-12", start: "2026-12-01", end: "2026-12-31", jobs: 6, gpuHours: { rtx4090: 12.5, a100: 0.001 }, cpuHours: 5.5 });
  // The same line as remotegpu-cli's (mtgpu/tui/view.py usage_text).
  assert.equal(usageText(u), "usage 2026-12: 6 jobs  GPU-hours a100 <0.01, rtx4090 12.50  CPU-hours 5.50");
  assert.equal(usageText(monthUsage({ ...USAGE, rows: [], total: { jobs: 1, cpu_hours: 0 } })), "usage 2026-12: 1 job  GPU-hours 0  CPU-hours 0");
  assert.deepEqual([0, 0.001, 1.5, 250.4].map(hours), ["0", "<0.01", "1.50", "250"]);
  const f = new Fleet([alias, listed], { ssh, intervalMs: 1000 });
  const up = { status: "up" as const, user: "lena", server: "testhost", nodes: [{ name: "testhost", gpus: [] }] };
  state(f, "gpu", { ...up, usage: u });
  state(f, "lab", { ...up, server: "lab", usageError: usageRefused(new ApiError("unknown operation 'job.usage'; known: " + "x, ".repeat(99), "unknown_op", false)) });
  const [gpu, lab] = serverTree(f);
  const usage = gpu.children?.at(-1);
  assert.deepEqual([usage?.label, usage?.description, usage?.contextValue], ["Usage this month", "6 jobs · GPU-h a100 <0.01, rtx4090 12.50 · CPU-h 5.50", "usage"]);
  assert.match(usage?.tooltip ?? "", /from 2026-12-01 to 2026-12-31 \(UTC days\)/);
  const none = lab.children?.at(-1);
  assert.deepEqual([none?.label, none?.description], ["Usage this month", "not available (this server runs an MTGPU older than usage reporting)"]);
  assert.deepEqual(gpu.children?.map((c) => c.label), ["GPUs", "Jobs", "Usage this month"]);
  const s = statusSummary(f);
  assert.match(s.tooltip, /gpu: usage 2026-12: 6 jobs/);
  assert.match(s.tooltip, /lab: usage: not available \(this server runs an MTGPU older/);
  // Not read yet: no line at all.
  state(f, "gpu", { usage: undefined });
  assert.equal(serverTree(f)[0].children?.some((c) => c.label === "Usage this month"), false);
  assert.equal(usageRefused(new ApiError("E".repeat(500), "internal", false)), "E".repeat(159) + "…");
});

test("a usage answer of another shape is refused naming what is wrong; a server's texts stay printable", () => {
  const bad: [unknown, RegExp][] = [
    [[], /not an object/],
    [{ ...USAGE, total: null }, /no total or rows/],
    [{ ...USAGE, start: 7 }, /no period/],
    [{ ...USAGE, rows: [{ gpu_hours: 1 }] }, /a row has no GPU type/],
    [{ ...USAGE, rows: [{ gpu_type: "x", gpu_hours: "1" }] }, /gpu_hours is not a number/],
    [{ ...USAGE, rows: [{ gpu_type: "x", gpu_hours: -1 }] }, /gpu_hours is not a number/],
    [{ ...USAGE, total: { jobs: true, cpu_hours: 0 } }, /jobs is not a count/],
    [{ ...USAGE, total: { jobs: 1.5, cpu_hours: 0 } }, /jobs is not a count/],
  ];
  for (const [answer, why] of bad) assert.throws(() => monthUsage(answer), why);
  const evil = monthUsage({ ...USAGE, rows: [{ gpu_type: "\u001b[2Jevil\u202e", gpu_hours: 1 }] });
  assert.equal(usageText(evil), "usage 2026-12: 6 jobs  GPU-hours  [2Jevil  1.00  CPU-hours 5.50");
  assert.equal(usageText(undefined, "\u001b]0;owned\u0007"), "usage: not available ( ]0;owned )");
});
