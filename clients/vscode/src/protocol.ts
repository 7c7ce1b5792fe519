/**
 * The `mtgpu-api` protocol over the system OpenSSH client: `ssh -T -s HOST mtgpu-api`,
 * one JSON request per line (`{"op", "args", "id"}`), one JSON answer per line
 * (`{"id", "ok": true, "result"}` or `{"id", "ok": false, "error", "code"}`), as
 * mtgpu/api/dispatcher.py serves it and remotegpu-cli (mtgpu/tui/link.py) speaks it.
 * clients/protocol/api.jsonl holds the requests both clients send and the answers
 * they read; both clients' tests replay it against a real server.
 *
 * Nothing from the server is trusted to be well formed: a line longer than
 * MAX_ANSWER_BYTES ends the connection, a line that is not an answer to a request
 * of ours is dropped, and every request has a deadline, after which the connection
 * is ended too. No call ever waits longer than its timeout.
 *
 * Errors:
 *   Error
 *   ├── ServerUnreachable  no working connection (the reason, in words to act on)
 *   └── ApiError           the server refused a request (its code and message)
 */

import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { destination, type Target } from "./sources";

export const SUBSYSTEM = "mtgpu-api";
/** The longest answer line read; the server's own request bound is 4 MiB. */
export const MAX_ANSWER_BYTES = 8 << 20;
/** What of ssh's standard error is kept for the reason of a failure. */
const MAX_STDERR_BYTES = 8192;

/** Codes after which nothing was done: the request may be sent again (mtgpu/errors.py). */
export const RETRYABLE_CODES = new Set(["starting", "not_caught_up", "no_leader", "busy"]);
/** Codes after which the outcome is unknown: only a read, or a keyed submission, is resent. */
export const RESEND_CODES = new Set(["in_doubt", "leader_changed", "unreachable", "no_answer", "closed"]);

export class ServerUnreachable extends Error {}

export class ApiError extends Error {
  constructor(
    message: string,
    readonly code: string,
    readonly retryable: boolean,
  ) {
    super(message);
  }

  static fromAnswer(a: Answer): ApiError {
    const code = typeof a.code === "string" ? a.code : "error";
    const retryable = typeof a.retryable === "boolean" ? a.retryable : RETRYABLE_CODES.has(code);
    return new ApiError(typeof a.error === "string" ? a.error.slice(0, 4000) : "request refused", code, retryable);
  }
}

export interface Request {
  op: string;
  args: Record<string, unknown>;
}

export interface Answer {
  id?: unknown;
  ok?: unknown;
  result?: unknown;
  error?: unknown;
  code?: unknown;
  retryable?: unknown;
  notice?: unknown;
  next_cursor?: unknown;
}

/** The most pages read of one listing (as the Python clients' `jsonl.MAX_PAGES`): more is a cursor that never ends. */
export const MAX_PAGES = 100_000;

export interface SshOptions {
  /** The OpenSSH client (default `ssh`). */
  sshPath: string;
  /** Per request, and for connecting unless connectTimeoutMs says otherwise. */
  timeoutMs: number;
  connectTimeoutMs?: number;
  /** `-F FILE`: another client configuration than ~/.ssh/config. */
  configFile?: string;
}

/** The ssh options and destination that reach `t`, without the program name. */
export function targetArgs(t: Target, ssh: SshOptions): string[] {
  const out: string[] = [];
  if (ssh.configFile) out.push("-F", ssh.configFile);
  if (t.port) out.push("-p", String(t.port));
  if (t.user) out.push("-l", t.user);
  if (t.identity) out.push("-i", expandTilde(t.identity));
  // "--" ends the options: a host named "-oProxyCommand=..." is a host, not an option.
  out.push("--", t.host);
  return out;
}

function expandTilde(p: string): string {
  const home = process.env.HOME || process.env.USERPROFILE || "";
  return p === "~" || p.startsWith("~/") ? home + p.slice(1) : p;
}

/** Options for a connection that must never prompt or hang (no terminal to answer in). */
export function batchOptions(ssh: SshOptions): string[] {
  const secs = Math.max(1, Math.ceil((ssh.connectTimeoutMs ?? ssh.timeoutMs) / 1000));
  return [
    "-o", "BatchMode=yes",
    "-o", `ConnectTimeout=${secs}`,
    "-o", "ServerAliveInterval=15",
    "-o", "ServerAliveCountMax=3",
  ];
}

/** `ssh -T -s ... HOST mtgpu-api`. */
export function apiArgv(t: Target, ssh: SshOptions): string[] {
  return [ssh.sshPath, "-T", ...batchOptions(ssh), "-s", ...targetArgs(t, ssh), SUBSYSTEM];
}

/** How a reason begins when the server answered but its host key is not trusted here. */
export const HOST_KEY_UNTRUSTED = "host key not trusted";

/** Whether `reason` (from {@link reasonFromSsh}) says only that the host key is not trusted yet. */
export function untrustedHostKey(reason: string): boolean {
  return reason.startsWith(HOST_KEY_UNTRUSTED);
}

/** What went wrong, and what to do, from ssh's last words on standard error. */
export function reasonFromSsh(stderr: string, status: number | null, t: Target, timeoutMs: number): string {
  const dest = destination(t);
  const lines = stderr.split(/\r?\n/).map((l) => l.trim()).filter((l) => l && !l.startsWith("Warning: Permanently added"));
  const text = lines.join("\n");
  if (/Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED|No .* host key is known/i.test(text)) {
    return `${HOST_KEY_UNTRUSTED}; check and accept it once with \`ssh ${dest}\` in a terminal, or add the cluster's @cert-authority line to known_hosts`;
  }
  if (/Permission denied/i.test(text)) {
    return `key not accepted: ask an admin to add your public key or for an invite (\`ssh ${dest}\` redeems it)`;
  }
  if (/subsystem request failed/i.test(text)) return `not an MTGPU server (no ${SUBSYSTEM} subsystem)`;
  if (/timed out|Connection timeout/i.test(text)) return `no answer within ${timeoutMs / 1000} s`;
  if (/Connection refused/i.test(text)) return `connection refused on port ${t.port ?? 22}: is mtgpu-server running?`;
  if (/Could not resolve hostname|Name or service not known/i.test(text)) return `unknown host '${t.host}'`;
  const last = lines[lines.length - 1];
  if (last) return last.slice(0, 500);
  return status === null ? "ssh was stopped" : `ssh exited with status ${status}`;
}

interface Pending {
  op: string;
  resolve: (a: Answer) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

/** Sees every request sent and the answer it got (undefined: none came). */
export type Observer = (req: Request, answer: Answer | undefined) => void;

/** One `mtgpu-api` channel: one ssh process, requests matched to answers by id. */
export class ApiConnection {
  private readonly child: ChildProcess;
  private readonly waiting = new Map<number, Pending>();
  private nextId = 1;
  private chunks: Buffer[] = [];
  private buffered = 0;
  private stderr = "";
  private answered = false;
  /** Why the connection ended; undefined while it works. */
  closed: string | undefined;
  /** The last warning the server added to an answer (disk limit, retention). */
  notice: string | undefined;
  observer: Observer | undefined;

  constructor(
    readonly target: Target,
    readonly ssh: SshOptions,
    readonly maxAnswerBytes: number = MAX_ANSWER_BYTES,
  ) {
    const argv = apiArgv(target, ssh);
    this.child = spawn(argv[0], argv.slice(1), { stdio: ["pipe", "pipe", "pipe"], windowsHide: true });
    this.child.on("error", (e) => this.fail(`cannot run ${ssh.sshPath}: ${e.message}`));
    this.child.stdin?.on("error", () => undefined); // EPIPE: the exit says why
    this.child.stdout?.on("data", (b: Buffer) => this.onData(b));
    this.child.stderr?.on("data", (b: Buffer) => {
      this.stderr = (this.stderr + b.toString("utf-8")).slice(-MAX_STDERR_BYTES);
    });
    this.child.on("close", (status) => this.fail(reasonFromSsh(this.stderr, status, target, ssh.timeoutMs)));
  }

  private onData(b: Buffer): void {
    let start = 0;
    for (let nl = b.indexOf(10); nl >= 0; nl = b.indexOf(10, start)) {
      const part = b.subarray(start, nl);
      const line = this.buffered ? Buffer.concat([...this.chunks, part]) : part;
      this.chunks = [];
      this.buffered = 0;
      start = nl + 1;
      if (line.length > this.maxAnswerBytes) return this.tooLong();
      this.onLine(line);
      if (this.closed) return;
    }
    if (start < b.length) {
      this.chunks.push(b.subarray(start));
      this.buffered += b.length - start;
      if (this.buffered > this.maxAnswerBytes) this.tooLong();
    }
  }

  private tooLong(): void {
    this.chunks = [];
    this.buffered = 0;
    this.fail(`the server sent a line longer than ${this.maxAnswerBytes >> 20} MiB; is it an MTGPU server?`);
  }

  private onLine(line: Buffer): void {
    let answer: unknown;
    try {
      answer = JSON.parse(line.toString("utf-8"));
    } catch {
      return; // not JSON: not an answer
    }
    if (typeof answer !== "object" || answer === null || Array.isArray(answer)) return;
    const id = (answer as Answer).id;
    const p = typeof id === "number" ? this.waiting.get(id) : undefined;
    if (!p) return;
    this.waiting.delete(id as number);
    clearTimeout(p.timer);
    this.answered = true;
    p.resolve(answer as Answer);
  }

  private fail(reason: string): void {
    if (this.closed) return;
    this.closed = reason;
    const err = new ServerUnreachable(reason);
    for (const p of this.waiting.values()) {
      clearTimeout(p.timer);
      p.reject(err);
    }
    this.waiting.clear();
    this.kill();
  }

  private kill(): void {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill("SIGTERM");
    this.child.stdout?.destroy();
    this.child.stderr?.destroy();
    this.child.stdin?.destroy();
  }

  /** Send one request; its result, or ApiError / ServerUnreachable. */
  async call(op: string, args: Record<string, unknown> = {}, timeoutMs: number = this.ssh.timeoutMs): Promise<unknown> {
    return (await this.answer(op, args, timeoutMs)).result;
  }

  /**
   * Every item of a listing given in pages (`job.list`): each page's result in turn,
   * its `next_cursor` sent back as `cursor` until none is given. A server that does
   * not page answers everything at once, which is the one page.
   */
  async callAll(op: string, args: Record<string, unknown> = {}, timeoutMs: number = this.ssh.timeoutMs): Promise<unknown[]> {
    const items: unknown[] = [];
    let cursor: string | undefined;
    for (let page = 0; page < MAX_PAGES; page++) {
      const answer = await this.answer(op, { ...args, cursor }, timeoutMs);
      if (!Array.isArray(answer.result)) throw new ServerUnreachable(`the server's ${op} is not a list; is it an MTGPU server?`);
      for (const item of answer.result) items.push(item);
      cursor = typeof answer.next_cursor === "string" && answer.next_cursor ? answer.next_cursor : undefined;
      if (!cursor) return items;
    }
    throw new ServerUnreachable(`${op} gave more than ${MAX_PAGES} pages; the server is broken`);
  }

  private async answer(op: string, args: Record<string, unknown>, timeoutMs: number): Promise<Answer> {
    const req: Request = { op, args: dropUndefined(args) };
    let answer: Answer;
    try {
      answer = await this.send(req, timeoutMs);
    } catch (e) {
      this.observer?.(req, undefined);
      throw e;
    }
    this.observer?.(req, answer);
    if (answer.ok !== true) throw ApiError.fromAnswer(answer);
    if (typeof answer.notice === "string" && answer.notice) this.notice = answer.notice.slice(0, 2000);
    return answer;
  }

  private send(req: Request, timeoutMs: number): Promise<Answer> {
    if (this.closed) return Promise.reject(new ServerUnreachable(`connection lost: ${this.closed}`));
    const id = this.nextId++;
    return new Promise<Answer>((resolve, reject) => {
      const timer = setTimeout(() => {
        const secs = timeoutMs / 1000;
        const reason = this.answered ? `${req.op} got no answer within ${secs} s` : `no answer within ${secs} s`;
        this.waiting.delete(id);
        reject(new ServerUnreachable(reason));
        this.fail(reason); // a server that stopped answering is not asked again on this connection
      }, timeoutMs);
      this.waiting.set(id, { op: req.op, resolve, reject, timer });
      this.child.stdin?.write(JSON.stringify({ ...req, id }) + "\n");
    });
  }

  get up(): boolean {
    return this.closed === undefined;
  }

  close(): void {
    this.fail("closed");
  }
}

function dropUndefined(args: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(args).filter(([, v]) => v !== undefined && v !== null));
}

/** A random key for a submission, so that sending it again returns the first job. */
export function submissionToken(): string {
  return randomBytes(16).toString("hex");
}

/** The requests the extension sends, by what they are for: the fixture's steps. */
export const requests = {
  whoami: (): Request => ({ op: "whoami", args: {} }),
  members: (): Request => ({ op: "cluster.members", args: {} }),
  policy: (): Request => ({ op: "workspace.policy", args: {} }),
  nodes: (): Request => ({ op: "nodes", args: {} }),
  jobs: (): Request => ({ op: "job.list", args: { all: true } }),
  workspaces: (): Request => ({ op: "workspace.list", args: {} }),
  templates: (): Request => ({ op: "workspace.templates", args: {} }),
  /** The user's own usage this month (the daemon's default period), by GPU type: what `mt-job usage` asks. */
  usage: (): Request => ({ op: "job.usage", args: { by: ["gpu_type"] } }),
  submit: (script: string, token: string): Request => ({ op: "job.submit", args: { script, token } }),
  show: (jobId: string): Request => ({ op: "job.show", args: { job_id: jobId } }),
  cancel: (jobId: string): Request => ({ op: "job.cancel", args: { job_ids: [jobId] } }),
  /** `source` is a template name, or an image (anything with `/` or `:`), as remotegpu-cli reads it. */
  createWorkspace: (name: string, source: string): Request => ({
    op: "workspace.create",
    args: { name, [source.includes("/") || source.includes(":") ? "image" : "template"]: source },
  }),
  workspaceAction: (action: "start" | "stop" | "rm", name: string): Request => ({
    op: `workspace.${action}`,
    args: { name },
  }),
};
