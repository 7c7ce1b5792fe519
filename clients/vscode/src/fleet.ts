/**
 * The extension's model: every server, its hardware, usage, workspaces and the
 * user's jobs, refreshed in the background; and the actions, each one API call. It
 * follows remotegpu-cli's Fleet (mtgpu/tui/fleet.py) request for request, which the
 * shared protocol fixture checks. A server that does not answer is marked
 * unreachable with the reason and retried later; it never holds up the others.
 */

import { ApiConnection, ApiError, RESEND_CODES, RETRYABLE_CODES, ServerUnreachable, requests, submissionToken, untrustedHostKey, type Observer, type Request, type SshOptions } from "./protocol";
import { memberTarget, type Target } from "./sources";

export type Status = "connecting" | "up" | "unreachable";

export const FINAL_STATES = new Set(["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"]);

export interface Gpu {
  index: number;
  brand?: string;
  type?: string;
  vram_total?: number;
  vram_used?: number;
  util?: number | null;
  jobs?: string[];
}

export interface Node {
  name: string;
  state?: string;
  cpus?: number;
  cpu_percent?: number | null;
  ram_total?: number;
  ram_used?: number;
  gpus: Gpu[];
}

export interface Job {
  job_id: string;
  name?: string;
  state: string;
  user?: string;
  nodes?: string[];
  reason?: string | null;
  reason_detail?: string | null;
  position?: number | null;
  exit_code?: number | null;
  submit_time?: number | null;
  end_time?: number | null;
}

export interface Workspace {
  name: string;
  state: string;
  image?: string;
  node?: string;
  gpus?: number[];
  reason?: string;
  error?: string;
  workdir?: string | null;
  ports?: unknown[];
}

export interface Template {
  name: string;
  image?: string;
  description?: string;
  gpus?: unknown;
}

/** The user's own usage this month on a server, as `mt-job usage` reads it. */
export interface MonthUsage {
  /** `2026-12` (or `START..END` for a period the server gave across months). */
  month: string;
  start: string;
  end: string;
  jobs: number;
  /** GPU-hours by GPU type (CPU-only jobs have none). */
  gpuHours: Record<string, number>;
  cpuHours: number;
}

export interface ServerState {
  target: Target;
  status: Status;
  reason: string;
  user?: string;
  server?: string;
  clusterId?: string;
  home?: string;
  members: { name?: unknown; address?: unknown }[];
  nodes: Node[];
  jobs: Job[];
  /** null: workspaces are off on that server. */
  workspaces: Workspace[] | null;
  updated?: number;
  /** A ~/.ssh/config host that did not answer as MTGPU. */
  hidden: boolean;
  notice?: string;
  /** The user's own usage this month there; absent, with `usageError` saying why, when the server did not give it. */
  usage?: MonthUsage;
  usageError?: string;
}

/** This server's own entry of the `nodes` listing. */
export function ownNode(st: ServerState): Node | undefined {
  return st.nodes.find((n) => n.name === st.server) ?? (st.nodes.length === 1 ? st.nodes[0] : undefined);
}

/** Servers of one cluster share jobs; a standalone server is its own group. */
export function group(st: ServerState): string {
  return st.clusterId ? `cluster:${st.clusterId}` : `server:${st.server ?? st.target.name}`;
}

export interface FleetOptions {
  ssh: SshOptions;
  intervalMs: number;
  /** Workspaces are listed every this many refreshes (podman is asked each time). */
  workspaceEvery?: number;
  /** Sees every request and answer (the extension's log; the protocol tests). */
  observer?: Observer;
}

function asList<T>(v: unknown, what: string): T[] {
  if (!Array.isArray(v)) throw new ServerUnreachable(`the server's ${what} is not a list; is it an MTGPU server?`);
  return v as T[];
}

function asObject(v: unknown, what: string): Record<string, unknown> {
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    throw new ServerUnreachable(`the server's ${what} answer is not an object; is it an MTGPU server?`);
  }
  return v as Record<string, unknown>;
}

const str = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined);

/**
 * The usage from a `job.usage` answer grouped by gpu_type (the daemon's default
 * period is this month, UTC), as remotegpu-cli's month_usage (mtgpu/tui/view.py)
 * reads it. Throws an Error naming what is wrong with an answer of another shape.
 */
export function monthUsage(answer: unknown): MonthUsage {
  if (typeof answer !== "object" || answer === null || Array.isArray(answer)) throw new Error("not an object");
  const a = answer as Record<string, unknown>;
  const total = a.total as Record<string, unknown> | undefined;
  if (typeof total !== "object" || total === null || Array.isArray(total) || !Array.isArray(a.rows)) throw new Error("no total or rows");
  const start = str(a.start);
  const end = str(a.end);
  if (start === undefined || end === undefined) throw new Error("no period");
  const hours = (v: unknown, what: string): number => {
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0 || v >= 1e12) throw new Error(`${what} is not a number of hours`);
    return v;
  };
  const gpuHours: Record<string, number> = {};
  for (const r of (a.rows as unknown[]).slice(0, 64)) {
    const row = r as Record<string, unknown> | null;
    if (typeof row !== "object" || row === null || typeof row.gpu_type !== "string") throw new Error("a row has no GPU type");
    if (row.gpu_type) gpuHours[row.gpu_type.slice(0, 40)] = hours(row.gpu_hours, "gpu_hours"); // "": CPU-only jobs
  }
  const jobs = total.jobs;
  if (typeof jobs !== "number" || !Number.isInteger(jobs) || jobs < 0) throw new Error("jobs is not a count");
  return {
    month: start.slice(0, 7) === end.slice(0, 7) ? start.slice(0, 7) : `${start.slice(0, 10)}..${end.slice(0, 10)}`,
    start: start.slice(0, 10),
    end: end.slice(0, 10),
    jobs,
    gpuHours,
    cpuHours: hours(total.cpu_hours, "cpu_hours"),
  };
}

/** Why a server did not give its usage, from its refusal (an older MTGPU lists every operation it knows: too long to show). */
export function usageRefused(e: ApiError): string {
  if (e.code === "unknown_op") return "this server runs an MTGPU older than usage reporting";
  return e.message.length <= 160 ? e.message : e.message.slice(0, 159) + "…";
}

export class Fleet {
  readonly states = new Map<string, ServerState>();
  private readonly conns = new Map<string, ApiConnection>();
  private readonly wake = new Map<string, () => void>();
  private readonly running = new Set<string>();
  private stopping = false;
  onChange: () => void = () => undefined;

  constructor(
    targets: Target[],
    readonly options: FleetOptions,
  ) {
    for (const t of targets) this.add(t);
  }

  private add(target: Target): ServerState {
    let name = target.name;
    for (let n = 2; this.states.has(name); n++) name = `${target.name}~${n}`;
    const st: ServerState = {
      target: { ...target, name },
      status: "connecting",
      reason: "",
      members: [],
      nodes: [],
      jobs: [],
      workspaces: null,
      hidden: false,
    };
    this.states.set(name, st);
    return st;
  }

  visible(): ServerState[] {
    return [...this.states.values()].filter((s) => !s.hidden);
  }

  /** Start the background refresh of every server not yet running. */
  start(): void {
    this.stopping = false;
    for (const st of this.states.values()) {
      if (!this.running.has(st.target.name)) {
        this.running.add(st.target.name);
        void this.run(st);
      }
    }
  }

  stop(): void {
    this.stopping = true;
    for (const w of this.wake.values()) w();
    for (const c of this.conns.values()) c.close();
    this.conns.clear();
  }

  refreshNow(st?: ServerState): void {
    for (const [name, w] of this.wake) if (!st || name === st.target.name) w();
  }

  private alive(st: ServerState): boolean {
    return !this.stopping && this.states.get(st.target.name) === st;
  }

  private sleep(st: ServerState, ms: number): Promise<boolean> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => done(false), ms);
      const done = (woken: boolean): void => {
        clearTimeout(timer);
        this.wake.delete(st.target.name);
        resolve(woken);
      };
      this.wake.set(st.target.name, () => done(true));
    });
  }

  private async run(st: ServerState): Promise<void> {
    let backoff = 2000;
    const every = Math.max(1, this.options.workspaceEvery ?? 6);
    while (this.alive(st)) {
      try {
        await this.connect(st);
        backoff = 2000;
        for (let count = 0; this.alive(st); count++) {
          await this.refresh(st, count % every === 0);
          if (count % every === 0) await this.readUsage(st); // it changes only as jobs end
          if (await this.sleep(st, this.options.intervalMs)) count = -1; // an action asked: workspaces too
        }
      } catch (e) {
        if (!this.alive(st)) break;
        this.unreachable(st, e instanceof ServerUnreachable ? e.message : e instanceof ApiError ? `refused: ${e.message}` : `internal error: ${String(e)}`);
        if (st.hidden) break;
      }
      await this.sleep(st, backoff);
      backoff = Math.min(backoff * 2, 30000);
    }
    this.running.delete(st.target.name);
  }

  private unreachable(st: ServerState, reason: string): void {
    // A ~/.ssh/config host that never answered as MTGPU is some other host: hide it.
    // One whose host key is not trusted yet stays, with how to trust it (as in
    // remotegpu-cli): it may well be a server, and hiding it leaves an empty panel.
    if (st.target.source === "ssh_config" && st.server === undefined && !untrustedHostKey(reason)) st.hidden = true;
    st.status = "unreachable";
    st.reason = reason;
    this.conns.get(st.target.name)?.close();
    this.conns.delete(st.target.name);
    this.onChange();
  }

  private conn(st: ServerState): ApiConnection {
    const c = this.conns.get(st.target.name);
    if (!c || !c.up) throw new ServerUnreachable(`${st.target.name} is not connected (${st.reason || "connecting"})`);
    return c;
  }

  private open(st: ServerState): ApiConnection {
    const c = new ApiConnection(st.target, this.options.ssh);
    c.observer = this.options.observer;
    return c;
  }

  private send(c: ApiConnection, r: Request, timeoutMs?: number): Promise<unknown> {
    return c.call(r.op, r.args, timeoutMs);
  }

  /** Connect and learn who we are there, its cluster and whether workspaces are on. */
  async connect(st: ServerState): Promise<void> {
    this.conns.get(st.target.name)?.close();
    if (st.status !== "connecting") {
      st.status = "connecting";
      this.onChange();
    }
    const c = this.open(st);
    this.conns.set(st.target.name, c);
    const who = asObject(await this.send(c, requests.whoami()), "whoami");
    st.user = str(who.name);
    st.server = str(who.server);
    try {
      const m = asObject(await this.send(c, requests.members()), "cluster.members");
      st.clusterId = str(m.cluster_id);
      st.members = Array.isArray(m.members) ? (m.members as ServerState["members"]) : [];
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      st.members = []; // an older server: no member list
    }
    let on = false;
    try {
      const policy = asObject(await this.send(c, requests.policy()), "workspace.policy");
      on = policy.enabled === true;
      st.home = str(policy.home);
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
    }
    st.workspaces = on ? [] : null;
    st.status = "up";
    st.reason = "";
    st.notice = c.notice;
    this.learnMembers(st);
    this.onChange();
  }

  private learnMembers(st: ServerState): void {
    const knownServers = new Set([...this.states.values()].map((s) => s.server).filter(Boolean));
    const key = (t: Target): string => `${t.host.toLowerCase()}|${t.port ?? ""}|${t.user ?? ""}`;
    const knownKeys = new Set([...this.states.values()].map((s) => key(s.target)));
    let added = false;
    for (const m of st.members) {
      if (knownServers.has(String(m.name)) || m.name === st.server) continue;
      const t = memberTarget(st.target, m, st.user);
      if (!t || knownKeys.has(key(t))) continue;
      if ([...this.states.values()].some((s) => s.target.source === "cluster" && s.target.name === t.name)) continue;
      this.add(t);
      added = true;
    }
    if (added && this.running.size && !this.stopping) this.start();
  }

  /** Read usage and jobs (and workspaces when asked) once. */
  async refresh(st: ServerState, workspaces = true): Promise<void> {
    const c = this.conn(st);
    st.nodes = asList<Node>(await this.send(c, requests.nodes()), "nodes");
    const jobs = requests.jobs(); // every page: a user with thousands of jobs sees them all
    st.jobs = (await c.callAll(jobs.op, jobs.args)) as Job[];
    if (workspaces && st.workspaces !== null) {
      try {
        st.workspaces = asList<Workspace>(
          await this.send(c, requests.workspaces(), Math.max(this.options.ssh.timeoutMs, 30000)),
          "workspace.list",
        );
      } catch (e) {
        if (!(e instanceof ApiError)) throw e;
      }
    }
    st.status = "up";
    st.reason = "";
    st.updated = Date.now();
    st.notice = c.notice ?? st.notice;
    this.onChange();
  }

  /**
   * The user's own usage this month, as `mt-job usage` reads it (one `job.usage`
   * call, by GPU type). A server that refuses it (an older MTGPU), gives an answer of
   * another shape or does not answer in time keeps working: its usage is shown as
   * not available, and why.
   */
  async readUsage(st: ServerState): Promise<void> {
    const c = this.conn(st);
    let why: string | undefined;
    try {
      st.usage = monthUsage(await this.send(c, requests.usage()));
    } catch (e) {
      if (e instanceof ApiError) why = usageRefused(e);
      else if (e instanceof ServerUnreachable) throw e;
      else why = `its answer is not a usage summary: ${(e as Error).message}`;
    }
    if (why !== undefined) st.usage = undefined;
    st.usageError = why;
    this.onChange();
  }

  /** Connect to every server, read everything once, and close. */
  async once(): Promise<ServerState[]> {
    const seen = new Set<string>();
    for (;;) {
      const batch = [...this.states.values()].filter((s) => !seen.has(s.target.name));
      if (!batch.length) break;
      batch.forEach((s) => seen.add(s.target.name));
      await Promise.all(
        batch.map(async (st) => {
          try {
            await this.connect(st);
            await this.refresh(st);
            await this.readUsage(st);
          } catch (e) {
            this.unreachable(st, e instanceof ApiError ? `refused: ${e.message}` : (e as Error).message);
          }
        }),
      );
    }
    this.stop();
    return this.visible();
  }

  /** The user's jobs across servers, each once per cluster: running, pending by position, then finished, newest first. */
  jobs(): [ServerState, Job][] {
    const seen = new Set<string>();
    const out: [ServerState, Job][] = [];
    for (const st of this.states.values()) {
      if (st.status !== "up") continue;
      for (const j of st.jobs) {
        const k = `${group(st)}|${j.job_id}`;
        if (!seen.has(k)) {
          seen.add(k);
          out.push([st, j]);
        }
      }
    }
    const rank = (j: Job): (number | string)[] =>
      FINAL_STATES.has(j.state)
        ? [2, -(j.end_time ?? j.submit_time ?? 0), String(j.job_id)]
        : [j.state === "RUNNING" ? 0 : 1, j.position ?? 0, j.submit_time ?? 0, String(j.job_id)];
    return out.sort((a, b) => compare(rank(a[1]), rank(b[1])));
  }

  state(name: string): ServerState {
    const st = this.states.get(name);
    if (!st) throw new Error(`no server '${name}'`);
    return st;
  }

  // ------------------------------------------------------------- actions

  /** A request on a connection of its own, so a slow action holds up no refresh. */
  private async long(st: ServerState, r: Request, timeoutMs = 120000): Promise<unknown> {
    this.conn(st); // only on a server that is up
    const c = new ApiConnection(st.target, { ...this.options.ssh, connectTimeoutMs: this.options.ssh.timeoutMs, timeoutMs });
    c.observer = this.options.observer;
    try {
      return await this.send(c, r);
    } finally {
      c.close();
    }
  }

  async cancelJob(st: ServerState, jobId: string): Promise<{ cancelled: string[]; stopping: string[] }> {
    const r = asObject(await this.send(this.conn(st), requests.cancel(jobId)), "job.cancel");
    this.refreshNow(st);
    return { cancelled: asList<string>(r.cancelled ?? [], "cancelled"), stopping: asList<string>(r.stopping ?? [], "stopping") };
  }

  /**
   * Submit a job file's text; its workdir is the home there. Sent again with its
   * key (for a minute at most) while its outcome is unknown or nothing was done, so
   * that a retry returns the first job rather than a second one.
   */
  async submitJob(st: ServerState, script: string): Promise<{ job_id: string; warnings: string[] }> {
    const token = submissionToken();
    const deadline = Date.now() + 60000;
    for (;;) {
      try {
        const r = asObject(await this.long(st, requests.submit(script, token)), "job.submit");
        this.refreshNow(st);
        return { job_id: String(r.job_id), warnings: Array.isArray(r.warnings) ? r.warnings.map(String) : [] };
      } catch (e) {
        const again = e instanceof ApiError && (RESEND_CODES.has(e.code) || RETRYABLE_CODES.has(e.code));
        if (!again || Date.now() > deadline) throw e;
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  }

  async templates(st: ServerState): Promise<Template[]> {
    return asList<Template>(await this.send(this.conn(st), requests.templates()), "workspace.templates");
  }

  async createWorkspace(st: ServerState, name: string, source: string): Promise<Workspace> {
    const r = asObject(await this.long(st, requests.createWorkspace(name, source)), "workspace.create");
    this.refreshNow(st);
    return r as unknown as Workspace;
  }

  async workspaceAction(st: ServerState, action: "start" | "stop" | "rm", name: string): Promise<Workspace> {
    const r = asObject(await this.long(st, requests.workspaceAction(action, name)), `workspace.${action}`);
    this.refreshNow(st);
    return r as unknown as Workspace;
  }
}

function compare(a: (number | string)[], b: (number | string)[]): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    if (a[i] < b[i]) return -1;
    if (a[i] > b[i]) return 1;
  }
  return a.length - b.length;
}
