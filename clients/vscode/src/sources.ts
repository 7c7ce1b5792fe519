/**
 * Where the extension finds servers: the same places as remotegpu-cli
 * (mtgpu/tui/sources.py). Its own list, `~/.config/remotegpu/servers.yaml`
 * (`$XDG_CONFIG_HOME/remotegpu`, `%APPDATA%\remotegpu` on Windows, or
 * `$REMOTEGPU_SERVERS`), and the plain `Host` names of `~/.ssh/config`
 * (following `Include`) unless the list says `ssh_config: false`.
 *
 * Only file reading and pure functions here: no network, no `vscode`.
 */

import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { parse as parseYaml, stringify as toYaml } from "yaml";

/** Where a server came from, as remotegpu-cli names it. */
export type Source = "list" | "ssh_config" | "cluster";

/** One server to connect to; `host` may be a Host alias of ~/.ssh/config. */
export interface Target {
  name: string;
  host: string;
  port?: number;
  user?: string;
  identity?: string;
  source: Source;
}

export class ServerListError extends Error {}

/** The longest servers.yaml or ssh config file read (a bigger one is someone else's). */
const MAX_FILE_BYTES = 1 << 20;

const DEST = /^(?:([^@\s]+)@)?(?:\[([^\]]+)\]|([^:@\s[\]]+))(?::(\d{1,5}))?$/;

/** `[user@]host[:port]` (IPv6 in brackets) as a Target, or a ServerListError. */
export function parseDestination(text: string, name?: string, source: Source = "list"): Target {
  const m = DEST.exec(text.trim());
  const port = m && m[4] ? Number(m[4]) : undefined;
  if (!m || (port !== undefined && (port < 1 || port > 65535))) {
    throw new ServerListError(
      `'${text}' is not a server: write [user@]host[:port], such as alice@gpu01:2222, or a Host of ~/.ssh/config`,
    );
  }
  const host = (m[2] ?? m[3]) as string;
  const t: Target = { name: name ?? host, host, source };
  if (port !== undefined) t.port = port;
  if (m[1]) t.user = m[1];
  return t;
}

/** `[user@]host[:port]`, as written in servers.yaml. */
export function destination(t: Target): string {
  const host = t.host.includes(":") && t.port ? `[${t.host}]` : t.host;
  return (t.user ? `${t.user}@` : "") + host + (t.port ? `:${t.port}` : "");
}

export interface Env {
  home: string;
  vars: Record<string, string | undefined>;
  windows: boolean;
}

export function currentEnv(): Env {
  return { home: os.homedir(), vars: process.env, windows: process.platform === "win32" };
}

export function serversFile(env: Env = currentEnv()): string {
  if (env.vars.REMOTEGPU_SERVERS) return env.vars.REMOTEGPU_SERVERS;
  const base = env.vars.XDG_CONFIG_HOME || (env.windows ? env.vars.APPDATA : undefined);
  const dir = base ? path.join(expandHome(base, env.home), "remotegpu") : path.join(env.home, ".config", "remotegpu");
  return path.join(dir, "servers.yaml");
}

export function sshConfigFile(env: Env = currentEnv()): string {
  return path.join(env.home, ".ssh", "config");
}

function expandHome(p: string, home: string): string {
  return p === "~" || p.startsWith("~/") ? path.join(home, p.slice(1)) : p;
}

function readBounded(file: string): string | undefined {
  let fd: number;
  try {
    fd = fs.openSync(file, "r");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new ServerListError(`${file}: cannot be read (${(e as Error).message})`);
  }
  try {
    const buf = Buffer.alloc(MAX_FILE_BYTES + 1);
    const n = fs.readSync(fd, buf, 0, buf.length, 0);
    if (n > MAX_FILE_BYTES) throw new ServerListError(`${file}: larger than 1 MiB; is it the right file?`);
    return buf.subarray(0, n).toString("utf-8");
  } finally {
    fs.closeSync(fd);
  }
}

export interface ServerList {
  targets: Target[];
  sshConfig: boolean;
  path: string;
}

/** Read servers.yaml (a missing file is an empty list); errors name the entry. */
export function loadServerList(file: string = serversFile()): ServerList {
  const text = readBounded(file);
  if (text === undefined) return { targets: [], sshConfig: true, path: file };
  let data: unknown;
  try {
    data = parseYaml(text) ?? {};
  } catch (e) {
    throw new ServerListError(`${file}: not valid YAML (${(e as Error).message.split("\n")[0]}); fix or remove the file`);
  }
  if (typeof data !== "object" || data === null || Array.isArray(data)) {
    throw new ServerListError(`${file}: expected a mapping with a \`servers:\` list`);
  }
  const d = data as Record<string, unknown>;
  const unknown = Object.keys(d).filter((k) => k !== "servers" && k !== "ssh_config").sort();
  if (unknown.length) {
    throw new ServerListError(`${file}: unknown key '${unknown[0]}'; the keys are \`servers\` and \`ssh_config\``);
  }
  const raw = d.servers ?? [];
  if (!Array.isArray(raw)) throw new ServerListError(`${file}: \`servers\` must be a list`);
  const targets = raw.map((entry: unknown, i: number) => listEntry(entry, `${file}: servers entry ${i + 1}`));
  const flag = d.ssh_config ?? true;
  if (typeof flag !== "boolean") throw new ServerListError(`${file}: ssh_config must be true or false`);
  return { targets, sshConfig: flag, path: file };
}

function listEntry(entry: unknown, where: string): Target {
  if (typeof entry === "string") {
    try {
      return parseDestination(entry);
    } catch (e) {
      throw new ServerListError(`${where}: ${(e as Error).message}`);
    }
  }
  if (typeof entry !== "object" || entry === null || typeof (entry as { host?: unknown }).host !== "string") {
    throw new ServerListError(
      `${where}: write a destination such as alice@gpu01:2222, or a mapping with at least \`host:\``,
    );
  }
  const e = entry as Record<string, unknown>;
  const bad = Object.keys(e).filter((k) => !["name", "host", "port", "user", "identity"].includes(k)).sort();
  if (bad.length) throw new ServerListError(`${where}: unknown key '${bad[0]}'; use name, host, port, user, identity`);
  const t: Target = { name: String(e.name ?? e.host), host: e.host as string, source: "list" };
  if (e.port !== undefined && e.port !== null) {
    if (typeof e.port !== "number" || !Number.isInteger(e.port) || e.port < 1 || e.port > 65535) {
      throw new ServerListError(`${where}: port must be a number from 1 to 65535`);
    }
    t.port = e.port;
  }
  for (const key of ["user", "identity"] as const) {
    const v = e[key];
    if (v === undefined || v === null) continue;
    if (typeof v !== "string") throw new ServerListError(`${where}: ${key} must be text`);
    t[key] = v;
  }
  return t;
}

/** The plain Host names of an OpenSSH client config (no patterns), following Include. */
export function sshConfigHosts(file: string = sshConfigFile(), env: Env = currentEnv()): string[] {
  const seen: string[] = [];
  readHosts(file, seen, 0, env);
  return seen;
}

function readHosts(file: string, seen: string[], depth: number, env: Env): void {
  if (depth > 8) return;
  let text: string | undefined;
  try {
    text = readBounded(file);
  } catch {
    return;
  }
  for (const line of (text ?? "").split(/\r?\n/)) {
    const parts = line.trim().replace("=", " ").split(/\s+/);
    if (parts.length < 2 || parts[0].startsWith("#")) continue;
    const word = parts[0].toLowerCase();
    if (word === "host") {
      for (const h of parts.slice(1)) {
        if (!/[*?!]/.test(h) && !seen.includes(h)) seen.push(h);
      }
    } else if (word === "include") {
      for (const pattern of parts.slice(1)) {
        let p = expandHome(pattern, env.home);
        if (!path.isAbsolute(p)) p = path.join(env.home, ".ssh", p);
        for (const inc of globOne(p)) readHosts(inc, seen, depth + 1, env);
      }
    }
  }
}

/** The files matching a path whose last part may hold `*` and `?`, sorted. */
function globOne(p: string): string[] {
  const dir = path.dirname(p);
  const base = path.basename(p);
  if (!/[*?]/.test(base)) return fs.existsSync(p) ? [p] : [];
  const re = new RegExp("^" + base.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".") + "$");
  try {
    return fs.readdirSync(dir).filter((f) => re.test(f)).sort().map((f) => path.join(dir, f));
  } catch {
    return [];
  }
}

/**
 * Every target, as remotegpu-cli's Fleet builds them: the list first, then the
 * ~/.ssh/config hosts not already in it; a repeated name gets `~2`, `~3`.
 */
export function discover(list: ServerList, sshHosts: string[]): Target[] {
  const out: Target[] = [];
  const names = new Set<string>();
  const add = (t: Target): void => {
    let name = t.name;
    for (let n = 2; names.has(name); n++) name = `${t.name}~${n}`;
    names.add(name);
    out.push({ ...t, name });
  };
  list.targets.forEach(add);
  if (list.sshConfig) {
    const known = new Set(list.targets.map((t) => t.host.toLowerCase()));
    for (const alias of sshHosts) {
      if (!known.has(alias.toLowerCase()) && !names.has(alias)) add({ name: alias, host: alias, source: "ssh_config" });
    }
  }
  return out;
}

/** A cluster member (`{name, address: "HOST:PORT"}`) reached like `origin`, as `user`. */
export function memberTarget(origin: Target, member: { name?: unknown; address?: unknown }, user?: string): Target | undefined {
  const addr = String(member.address ?? "");
  const i = addr.lastIndexOf(":");
  const host = addr.slice(0, Math.max(i, 0)).replace(/^\[|\]$/g, "");
  const port = addr.slice(i + 1);
  if (i < 0 || !host || !/^\d+$/.test(port) || host === "0.0.0.0" || host === "::") return undefined;
  const t: Target = { name: String(member.name), host, port: Number(port), source: "cluster" };
  const u = user ?? origin.user;
  if (u) t.user = u;
  if (origin.identity) t.identity = origin.identity;
  return t;
}

/** servers.yaml with `t` added (for "Add a server"); the file is written whole. */
export function addToServerList(list: ServerList, t: Target): string {
  if (list.targets.some((o) => o.name === t.name || (o.host.toLowerCase() === t.host.toLowerCase() && o.port === t.port && o.user === t.user))) {
    throw new ServerListError(`${destination(t)} is already in the list`);
  }
  const entries = [...list.targets, t].map((o) =>
    o.identity === undefined && o.name === o.host
      ? destination(o)
      : Object.fromEntries(
          (["name", "host", "port", "user", "identity"] as const).filter((k) => o[k] !== undefined).map((k) => [k, o[k]]),
        ),
  );
  fs.mkdirSync(path.dirname(list.path), { recursive: true });
  const tmp = `${list.path}.tmp`;
  fs.writeFileSync(tmp, toYaml({ servers: entries, ssh_config: list.sshConfig }));
  fs.renameSync(tmp, list.path);
  return list.path;
}
