/**
 * What the "MTGPU servers" tree and the status bar show, as plain data: the adapter
 * (extension.ts) turns each TreeNode into a vscode.TreeItem and nothing more.
 * Every text from a server goes through `printable` first: a hostile or broken
 * server cannot draw control characters or reorder the panel.
 */

import { FINAL_STATES, group, ownNode, type Fleet, type Gpu, type Job, type MonthUsage, type ServerState, type Workspace } from "./fleet";

export interface TreeNode {
  id: string;
  label: string;
  description?: string;
  tooltip?: string;
  /** The menus' `viewItem`: server-up, server-up-ws, server-unreachable, workspace-STATE, job-active, job-final... */
  contextValue: string;
  /** A codicon name. */
  icon?: string;
  children?: TreeNode[];
  server?: string;
  job?: string;
  workspace?: string;
}

/** `text` without control, format or line-breaking characters, at most `max` long. */
export function printable(v: unknown, max = 200): string {
  const s = v === undefined || v === null ? "" : String(v);
  // eslint-disable-next-line no-control-regex
  const clean = s.replace(/[\u0000-\u001f\u007f-\u009f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]/g, " ");
  return clean.length > max ? clean.slice(0, max - 1) + "…" : clean;
}

/** Bytes as GiB with one decimal: 25769803776 -> "24.0". */
export function gib(n: number | undefined): string {
  return typeof n === "number" && Number.isFinite(n) ? (n / (1 << 30)).toFixed(1) : "?";
}

function gpuNode(st: ServerState, g: Gpu): TreeNode {
  const util = typeof g.util === "number" ? `${Math.round(g.util)}%` : "–";
  const jobs = Array.isArray(g.jobs) && g.jobs.length ? ` · jobs ${g.jobs.map((j) => printable(j, 20)).join(", ")}` : "";
  return {
    id: `${st.target.name}/gpu/${printable(g.index, 10)}`,
    label: `GPU ${printable(g.index, 10)}: ${printable(g.type ?? g.brand ?? "gpu", 40)}`,
    description: `${gib(g.vram_used)}/${gib(g.vram_total)} GiB · ${util}${jobs}`,
    contextValue: "gpu",
    icon: "circuit-board",
    server: st.target.name,
  };
}

/** A job's line: its state and, while pending, why it waits and its place in the queue. */
export function jobDescription(j: Job): string {
  const state = printable(j.state, 20);
  if (j.state === "PENDING") {
    const why = [j.reason, j.reason_detail].filter((x) => x && x !== "None").map((x) => printable(x, 120)).join(": ");
    const pos = typeof j.position === "number" ? ` #${j.position}` : "";
    return `PENDING${pos}${why ? ` (${why})` : ""}`;
  }
  if (j.state === "RUNNING") return `RUNNING on ${(j.nodes ?? []).map((n) => printable(n, 40)).join(", ") || "?"}`;
  // A cancelled job's exit status is the cancellation's, not its program's: "CANCELLED (exit 0)" read as a success.
  if (FINAL_STATES.has(j.state) && j.state !== "CANCELLED" && typeof j.exit_code === "number") return `${state} (exit ${j.exit_code})`;
  return state;
}

function jobNode(st: ServerState, j: Job): TreeNode {
  const id = printable(j.job_id, 40);
  return {
    id: `${group(st)}/job/${id}`,
    label: `${id} ${printable(j.name ?? "", 60)}`.trim(),
    description: jobDescription(j),
    tooltip: `job ${id} on ${st.target.name}: ${jobDescription(j)}`,
    contextValue: FINAL_STATES.has(j.state) ? "job-final" : "job-active",
    icon: j.state === "RUNNING" ? "play-circle" : j.state === "PENDING" ? "watch" : j.state === "COMPLETED" ? "pass" : "circle-slash",
    server: st.target.name,
    job: String(j.job_id),
  };
}

function workspaceNode(st: ServerState, w: Workspace): TreeNode {
  const why = w.state === "PENDING" ? w.reason : w.state === "FAILED" ? w.error : "";
  const gpus = Array.isArray(w.gpus) && w.gpus.length ? ` · GPUs ${w.gpus.join(", ")}` : "";
  return {
    id: `${st.target.name}/ws/${printable(w.name, 80)}`,
    label: printable(w.name, 80),
    description: `${printable(w.state, 20)}${gpus}${why ? ` (${printable(why, 120)})` : ""}`,
    tooltip: `${printable(w.image ?? "", 200)}`,
    contextValue: `workspace-${printable(w.state, 20)}`,
    icon: "package",
    server: st.target.name,
    workspace: String(w.name),
  };
}

/** Hours with two decimals, fewer when large; a little above none is `<0.01` (as remotegpu-cli). */
export function hours(h: number): string {
  if (!(h > 0)) return "0";
  if (h < 0.005) return "<0.01";
  return h >= 100 ? h.toFixed(0) : h.toFixed(2);
}

/** GPU-hours by type, `a100 0.20, rtx4090 1.50`, or `0`. */
function gpuHoursText(u: MonthUsage): string {
  return Object.keys(u.gpuHours).sort().map((t) => `${printable(t, 40)} ${hours(u.gpuHours[t])}`).join(", ") || "0";
}

/** The user's own usage this month on a server, or why it is not shown: remotegpu-cli's usage line. */
export function usageText(u: MonthUsage | undefined, error?: string): string {
  if (!u) return `usage: not available (${printable(error ?? "not read yet", 200)})`;
  const gpu = gpuHoursText(u);
  return `usage ${printable(u.month, 30)}: ${u.jobs} job${u.jobs === 1 ? "" : "s"}  GPU-hours ${gpu}  CPU-hours ${hours(u.cpuHours)}`;
}

function usageNode(st: ServerState): TreeNode {
  const name = st.target.name;
  const u = st.usage;
  if (!u) {
    const why = usageText(undefined, st.usageError);
    return { id: `${name}/usage`, label: "Usage this month", description: why.replace(/^usage: /, ""), tooltip: why, contextValue: "usage-none", icon: "graph", server: name };
  }
  const gpu = gpuHoursText(u);
  return {
    id: `${name}/usage`,
    label: "Usage this month",
    description: `${u.jobs} job${u.jobs === 1 ? "" : "s"} · GPU-h ${gpu} · CPU-h ${hours(u.cpuHours)}`,
    tooltip: `Your own usage on ${printable(st.server ?? name, 80)} from ${printable(u.start, 10)} to ${printable(u.end, 10)} (UTC days): ${usageText(u)}`,
    contextValue: "usage",
    icon: "graph",
    server: name,
  };
}

/** The line beside a server's name. */
export function serverDescription(st: ServerState): string {
  if (st.status === "unreachable") return `unreachable: ${printable(st.reason, 160)}`;
  if (st.status === "connecting") return "connecting…";
  const n = ownNode(st);
  if (!n) return "up";
  const gpus = n.gpus ?? [];
  const busy = gpus.filter((g) => (g.jobs ?? []).length > 0).length;
  const parts = [gpus.length ? `${busy}/${gpus.length} GPUs busy` : "no GPUs"];
  if (typeof n.cpu_percent === "number") parts.push(`CPU ${Math.round(n.cpu_percent)}%`);
  if (typeof n.ram_total === "number") parts.push(`RAM ${gib(n.ram_used)}/${gib(n.ram_total)} GiB`);
  if (n.state && n.state !== "up" && n.state !== "idle") parts.push(printable(n.state, 20));
  return parts.join(" · ");
}

/** The whole tree: one node per visible server, with GPUs, workspaces and jobs below. */
export function serverTree(fleet: Fleet): TreeNode[] {
  const jobsBy = new Map<string, Job[]>();
  for (const [st, j] of fleet.jobs()) {
    const list = jobsBy.get(st.target.name) ?? [];
    list.push(j);
    jobsBy.set(st.target.name, list);
  }
  return fleet.visible().map((st) => {
    const name = st.target.name;
    const up = st.status === "up";
    const node: TreeNode = {
      id: name,
      label: name,
      description: serverDescription(st),
      tooltip: up ? `${st.user ?? "?"} on ${printable(st.server ?? name, 80)}${st.notice ? `\n${printable(st.notice, 400)}` : ""}` : printable(st.reason, 400),
      contextValue: up ? (st.workspaces !== null ? "server-up-ws" : "server-up") : `server-${st.status}`,
      icon: up ? "server" : st.status === "connecting" ? "loading~spin" : "error",
      server: name,
    };
    if (!up) return node;
    const gpus = (ownNode(st)?.gpus ?? []).map((g) => gpuNode(st, g));
    const children: TreeNode[] = [
      { id: `${name}/gpus`, label: "GPUs", description: String(gpus.length), contextValue: "gpus", icon: "dashboard", children: gpus, server: name },
    ];
    if (st.workspaces !== null) {
      const ws = st.workspaces.map((w) => workspaceNode(st, w));
      children.push({ id: `${name}/workspaces`, label: "Workspaces", description: String(ws.length), contextValue: "workspaces", icon: "folder-library", children: ws, server: name });
    }
    const jobs = (jobsBy.get(name) ?? []).map((j) => jobNode(st, j));
    const active = (jobsBy.get(name) ?? []).filter((j) => !FINAL_STATES.has(j.state)).length;
    children.push({ id: `${name}/jobs`, label: "Jobs", description: `${active} active`, contextValue: "jobs", icon: "list-ordered", children: jobs, server: name });
    if (st.usage || st.usageError !== undefined) children.push(usageNode(st));
    node.children = children;
    return node;
  });
}

/** The status bar: servers up, GPUs busy, and the user's running and pending jobs. */
export function statusSummary(fleet: Fleet): { text: string; tooltip: string } {
  const shown = fleet.visible();
  const up = shown.filter((s) => s.status === "up");
  let gpus = 0;
  let busy = 0;
  for (const st of up) {
    for (const g of ownNode(st)?.gpus ?? []) {
      gpus++;
      if ((g.jobs ?? []).length) busy++;
    }
  }
  const jobs = fleet.jobs().map(([, j]) => j);
  const running = jobs.filter((j) => j.state === "RUNNING").length;
  const pending = jobs.filter((j) => j.state === "PENDING").length;
  const down = shown.filter((s) => s.status === "unreachable").map((s) => `${s.target.name}: ${printable(s.reason, 160)}`);
  const usage = up.filter((s) => s.usage || s.usageError !== undefined).map((s) => `${s.target.name}: ${usageText(s.usage, s.usageError)}`);
  return {
    text: `$(server) ${up.length}/${shown.length} · GPUs ${busy}/${gpus} busy · jobs ${running} running, ${pending} pending`,
    tooltip: ["MTGPU servers", ...down, ...usage].join("\n"),
  };
}
