/**
 * The extension replays the clients' shared protocol description against a real
 * server: for each step its own Fleet action runs, the requests it writes must be
 * the step's and the answers must match the step's patterns. remotegpu-cli replays
 * the same file (tests/tui/test_protocol_fixture.py).
 */

import { strict as assert } from "node:assert";
import { test } from "node:test";
import { Fleet, type ServerState } from "../src/fleet";
import { ApiConnection, ApiError, requests, type Answer, type Request } from "../src/protocol";
import { match, readSteps, subst, type Step } from "./fixture";
import { needsServer, real, sshOptions, until } from "./support";

test("every request the extension can send is described in the fixture", needsServer, () => {
  const described = new Set(readSteps(real!.fixture).flatMap((s) => s.requests.map((r) => r.op)));
  const built = [
    ...Object.entries(requests)
      .filter(([k]) => !["submit", "cancel", "createWorkspace", "workspaceAction", "show"].includes(k))
      .map(([, f]) => (f as () => Request)().op),
    requests.submit("s", "t").op,
    requests.cancel("1").op,
    requests.createWorkspace("a", "b").op,
    ...(["start", "stop", "rm"] as const).map((a) => requests.workspaceAction(a, "a").op),
  ];
  assert.deepEqual(built.filter((op) => !described.has(op)), []);
});

test("the extension replays the protocol fixture against a real server", needsServer, async () => {
  const seen: { req: Request; answer: Answer | undefined }[] = [];
  const ssh = sshOptions(30000);
  const fleet = new Fleet([{ name: "gpu", host: "gpu", source: "ssh_config" }], {
    ssh,
    intervalMs: 1000,
    observer: (req, answer) => seen.push({ req, answer }),
  });
  const st = fleet.state("gpu");
  const env: Record<string, unknown> = { user: real!.user, server: real!.server, client: "vscode" };
  const side = new ApiConnection(st.target, ssh); // for waiting between steps: not compared

  const act = async (s: Step, p: Record<string, string>): Promise<void> => {
    if (!s.clients.includes("vscode")) {
      const c = new ApiConnection(st.target, ssh);
      c.observer = (req, answer) => seen.push({ req, answer });
      try {
        for (const r of s.requests) await c.call(r.op, JSON.parse(subst(JSON.stringify(r.args), env)) as Record<string, unknown>);
      } finally {
        c.close();
      }
      return;
    }
    const ws = (a: "start" | "stop" | "rm"): Promise<unknown> => fleet.workspaceAction(st, a, p.name);
    const actions: Record<string, () => Promise<unknown>> = {
      connect: () => fleet.connect(st),
      refresh: () => fleet.refresh(st, true),
      templates: () => fleet.templates(st),
      submit: () => fleet.submitJob(st, p.script),
      cancel: () => fleet.cancelJob(st, p.job),
      usage: async () => {
        await fleet.readUsage(st);
        assert.ok(st.usage, st.usageError);
      },
      create_workspace: () => fleet.createWorkspace(st, p.name, p.source),
      stop_workspace: () => ws("stop"),
      start_workspace: () => ws("start"),
      remove_workspace: () => ws("rm"),
    };
    const run = actions[s.step];
    assert.ok(run, `no extension action for step ${s.step}`);
    await run();
  };

  try {
    for (const [i, s] of readSteps(real!.fixture).entries()) {
      const p = Object.fromEntries(Object.entries(s.params ?? {}).map(([k, v]) => [k, subst(v, env)]));
      Object.assign(env, p);
      seen.length = 0;
      try {
        await act(s, p);
      } catch (e) {
        if (!(e instanceof ApiError)) throw e; // a refusal the step expects: compared below
      }
      const where = `step ${i + 1} (${s.step})`;
      assert.equal(seen.length, s.requests.length, `${where}: sent ${JSON.stringify(seen.map((x) => x.req))}`);
      seen.forEach(({ req, answer }, n) => {
        match(s.requests[n], req, env, true, `${where} request ${n + 1}`);
        const { id, ...rest } = answer ?? {};
        assert.equal(typeof id, "number");
        match(s.answers[n], rest, env, false, `${where} answer ${n + 1}`);
      });
      if ((s.step === "create_workspace" || s.step === "start_workspace") && seen[0].answer?.ok) {
        await until(async () => ((await side.call("workspace.show", { name: p.name })) as { state: string }).state === "RUNNING", `${p.name} RUNNING`, 120000);
      }
    }
    assertWorkspaceSeen(st);
  } finally {
    await side.call("workspace.rm", { name: "proto-vscode" }).catch(() => undefined);
    side.close();
    fleet.stop();
  }
});

function assertWorkspaceSeen(st: ServerState): void {
  // The model kept what the steps read: the user, the server and a home.
  assert.equal(st.user, real!.user);
  assert.equal(st.server, real!.server);
  assert.match(st.home ?? "", new RegExp(`/${real!.user}$`));
}
