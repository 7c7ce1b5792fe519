/**
 * The arguments of the extension's commands, as plain data: the terminal's
 * program and arguments, the remote URIs VS Code opens, the source picker's
 * choices, and a job's output followed over ssh.
 */

import { spawn } from "node:child_process";
import { ApiError, batchOptions, targetArgs, type SshOptions } from "./protocol";
import type { Target } from "./sources";
import type { Template, Workspace } from "./fleet";

/** The SSH terminal: `ssh HOST` with a terminal, so it lands in the user's tmux session. */
export function terminalCommand(t: Target, ssh: SshOptions): { name: string; shellPath: string; shellArgs: string[] } {
  return { name: `MTGPU: ${t.name}`, shellPath: ssh.sshPath, shellArgs: targetArgs(t, ssh) };
}

function hex(s: string): string {
  return Buffer.from(s, "utf-8").toString("hex");
}

/**
 * Remote - SSH's authority for `t`: a Host of ~/.ssh/config (or a bare host) as
 * itself, `user@host` as that, and anything with a port as the hex-encoded JSON
 * form Remote - SSH also reads. An identity file cannot be carried: such a server
 * needs a Host entry in ~/.ssh/config for Remote - SSH.
 */
export function remoteSshAuthority(t: Target): string {
  if (t.port) {
    const spec: Record<string, unknown> = { hostName: t.host, port: t.port };
    if (t.user) spec.user = t.user;
    return hex(JSON.stringify(spec));
  }
  return t.user ? `${t.user}@${t.host}` : t.host;
}

function folder(p: string | undefined, fallback: string): string {
  const path = p && p.startsWith("/") ? p : fallback;
  return path.split("/").map(encodeURIComponent).join("/");
}

/** `vscode-remote://ssh-remote+HOST/HOME`: Remote - SSH in the user's home there. */
export function remoteSshUri(t: Target, home: string | undefined, user: string | undefined): string {
  return `vscode-remote://ssh-remote+${remoteSshAuthority(t)}${folder(home, `/home/${user ?? t.user ?? ""}`)}`;
}

/**
 * Dev Containers attached to a workspace's container through the server: the
 * `attached-container` authority (hex JSON naming the container, which is the
 * workspace's name) nested in Remote - SSH's, so that Dev Containers reaches the
 * container through the server's docker shim over SSH (docs/manual.md,
 * "VS Code: attach to a running workspace").
 */
export function attachedContainerUri(t: Target, ws: Workspace, home: string | undefined): string {
  const spec = hex(JSON.stringify({ containerName: `/${ws.name}` }));
  return `vscode-remote://attached-container+${spec}@ssh-remote+${remoteSshAuthority(t)}${folder(ws.workdir ?? home, "/")}`;
}

/** Workspace names as mt-container takes them: lower-case letters, digits, `.`, `_` and `-`. */
export function checkWorkspaceName(name: string): string | undefined {
  if (!name) return "give the workspace a name";
  if (name.length > 63) return "a workspace name has at most 63 characters";
  if (!/^[a-z0-9][a-z0-9._-]*$/.test(name)) return "use lower-case letters, digits, '.', '_' and '-' (starting with a letter or digit)";
  return undefined;
}

export interface SourceChoice {
  label: string;
  description: string;
  /** What workspace.create gets: a template name, or undefined for "type an image". */
  source: string | undefined;
}

/** The picker of "Create workspace": the admin's templates, then an image typed in. */
export function sourceChoices(templates: Template[]): SourceChoice[] {
  const out: SourceChoice[] = templates.map((t) => ({
    label: String(t.name),
    description: [t.image, t.description].filter(Boolean).map(String).join(" · "),
    source: String(t.name),
  }));
  out.push({ label: "Image…", description: "a pre-pulled image, a saved one, or any image the server allows", source: undefined });
  return out;
}

/** POSIX shell quoting, for the one command line ssh sends. */
export function shellQuote(s: string): string {
  return /^[A-Za-z0-9_./:=@%+-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`;
}

/** `ssh HOST mt-job logs -f ID`: a job's output as it grows, until the job ends. */
export function jobOutputArgv(t: Target, ssh: SshOptions, jobId: string): string[] {
  return [ssh.sshPath, "-T", ...batchOptions(ssh), ...targetArgs(t, ssh), ["mt-job", "logs", "-f", jobId].map(shellQuote).join(" ")];
}

export interface Follower {
  /** Resolves with ssh's exit status once the output ends (null: stopped). */
  done: Promise<number | null>;
  stop(): void;
}

/**
 * Run `argv` and hand its output (standard output and error) to `onText` as it
 * comes, at most `maxBytes` in all: past that the output is cut, with a line saying so.
 */
export function follow(argv: string[], onText: (text: string) => void, maxBytes = 64 << 20): Follower {
  const child = spawn(argv[0], argv.slice(1), { stdio: ["ignore", "pipe", "pipe"], windowsHide: true });
  let seen = 0;
  const take = (b: Buffer): void => {
    if (seen >= maxBytes) return;
    seen += b.length;
    onText(b.toString("utf-8"));
    if (seen >= maxBytes) {
      onText(`\n[MTGPU: output cut at ${maxBytes >> 20} MiB; the whole file is on the server]\n`);
      child.kill("SIGTERM");
    }
  };
  child.stdout?.on("data", take);
  child.stderr?.on("data", take);
  const done = new Promise<number | null>((resolve) => {
    child.on("error", (e) => {
      onText(`cannot run ${argv[0]}: ${e.message}\n`);
      resolve(null);
    });
    child.on("close", (status) => resolve(status));
  });
  return { done, stop: () => void child.kill("SIGTERM") };
}

/** A failed command's notification: what was asked, then the server's own message and code. */
export function errorMessage(what: string, e: unknown): string {
  const msg = e instanceof ApiError ? `${e.message} (${e.code})` : e instanceof Error ? e.message : String(e);
  return `MTGPU: ${what}: ${msg}`;
}
