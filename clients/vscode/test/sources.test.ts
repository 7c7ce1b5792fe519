import { strict as assert } from "node:assert";
import * as fs from "node:fs";
import * as path from "node:path";
import { test } from "node:test";
import { addToServerList, discover, loadServerList, memberTarget, parseDestination, ServerListError, serversFile, sshConfigHosts, type Env } from "../src/sources";
import { tmpDir } from "./support";

test("destinations are read as remotegpu-cli reads them", () => {
  assert.deepEqual(parseDestination("alice@gpu01:2222"), { name: "gpu01", host: "gpu01", port: 2222, user: "alice", source: "list" });
  assert.deepEqual(parseDestination("[::1]:22"), { name: "::1", host: "::1", port: 22, source: "list" });
  assert.throws(() => parseDestination("gpu 01"), /'gpu 01' is not a server: write \[user@\]host\[:port\]/);
  assert.throws(() => parseDestination("gpu01:70000"), ServerListError);
});

test("servers.yaml: entries, ssh_config, and errors naming the entry", () => {
  const dir = tmpDir("mtgpu-vscode-list-");
  const file = path.join(dir, "servers.yaml");
  assert.deepEqual(loadServerList(file), { targets: [], sshConfig: true, path: file });
  fs.writeFileSync(file, "servers:\n  - gpu01\n  - name: lab\n    host: lab.example.org\n    port: 2222\n    user: alice\n    identity: ~/.ssh/id_lab\nssh_config: false\n");
  const l = loadServerList(file);
  assert.equal(l.sshConfig, false);
  assert.deepEqual(l.targets[1], { name: "lab", host: "lab.example.org", port: 2222, user: "alice", identity: "~/.ssh/id_lab", source: "list" });
  fs.writeFileSync(file, "servers:\n  - name: x\n    host: h\n    port: 0\n");
  assert.throws(() => loadServerList(file), new RegExp(`${file}: servers entry 1: port must be a number from 1 to 65535`));
  fs.writeFileSync(file, "servers: [a]\nextra: 1\n");
  assert.throws(() => loadServerList(file), /unknown key 'extra'/);
  fs.writeFileSync(file, "servers: [\n");
  assert.throws(() => loadServerList(file), /not valid YAML/);
  // Written back with a new entry, and read again the same.
  fs.writeFileSync(file, "servers:\n  - gpu01\n");
  addToServerList(loadServerList(file), parseDestination("bob@gpu02:2200"));
  assert.deepEqual(loadServerList(file).targets.map((t) => [t.host, t.port, t.user]), [["gpu01", undefined, undefined], ["gpu02", 2200, "bob"]]);
  assert.throws(() => addToServerList(loadServerList(file), parseDestination("gpu01")), /already in the list/);
});

test("the list's place follows XDG_CONFIG_HOME, APPDATA and REMOTEGPU_SERVERS", () => {
  const env = (vars: Env["vars"], windows = false): Env => ({ home: "/home/u", vars, windows });
  assert.equal(serversFile(env({})), "/home/u/.config/remotegpu/servers.yaml");
  assert.equal(serversFile(env({ XDG_CONFIG_HOME: "/x" })), "/x/remotegpu/servers.yaml");
  assert.equal(serversFile(env({ APPDATA: "/appdata" }, true)), "/appdata/remotegpu/servers.yaml");
  assert.equal(serversFile(env({ REMOTEGPU_SERVERS: "/s.yaml" })), "/s.yaml");
});

test("~/.ssh/config: plain Host names, following Include, no patterns", () => {
  const home = tmpDir("mtgpu-vscode-home-");
  fs.mkdirSync(path.join(home, ".ssh", "conf.d"), { recursive: true });
  fs.writeFileSync(path.join(home, ".ssh", "config"), "Host gpu01 gpu02\n  Port 2222\nHost *.lab !x\nInclude conf.d/*.conf\nHost gpu01\n");
  fs.writeFileSync(path.join(home, ".ssh", "conf.d", "a.conf"), "Host=lab3\n");
  const env: Env = { home, vars: {}, windows: false };
  assert.deepEqual(sshConfigHosts(path.join(home, ".ssh", "config"), env), ["gpu01", "gpu02", "lab3"]);
  // The list first; a config host already listed (by host) is not added twice.
  const targets = discover({ targets: [parseDestination("gpu02")], sshConfig: true, path: "" }, ["gpu01", "gpu02", "lab3"]);
  assert.deepEqual(targets.map((t) => [t.name, t.source]), [["gpu02", "list"], ["gpu01", "ssh_config"], ["lab3", "ssh_config"]]);
  assert.deepEqual(discover({ targets: [], sshConfig: false, path: "" }, ["gpu01"]), []);
});

test("cluster members are reached like the server that named them", () => {
  const origin = { name: "a", host: "gpu01", user: "alice", identity: "~/.ssh/k", source: "list" as const };
  assert.deepEqual(memberTarget(origin, { name: "gpu02", address: "10.0.0.2:2222" }, "alice"), {
    name: "gpu02", host: "10.0.0.2", port: 2222, user: "alice", identity: "~/.ssh/k", source: "cluster",
  });
  assert.equal(memberTarget(origin, { name: "x", address: "0.0.0.0:2222" }), undefined);
  assert.equal(memberTarget(origin, { name: "x", address: "nonsense" }), undefined);
});

test("only the adapter, extension.ts, touches vscode", () => {
  const src = path.resolve(__dirname, "../../src");
  const users = fs.readdirSync(src).filter((f) => f.endsWith(".ts") && /from "vscode"|require\("vscode"\)/.test(fs.readFileSync(path.join(src, f), "utf-8")));
  assert.deepEqual(users, ["extension.ts"]);
});
