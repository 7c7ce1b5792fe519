/**
 * A hostile or broken server: an OpenSSH sshd whose `mtgpu-api` subsystem answers
 * with an endless line, garbage, a flood, a deep nesting or nothing at all. The
 * client must neither hang nor crash: bounded lines, deadlines, garbage dropped.
 */

import { strict as assert } from "node:assert";
import { test } from "node:test";
import { Fleet } from "../src/fleet";
import { ApiConnection, ApiError, ServerUnreachable } from "../src/protocol";
import type { Target } from "../src/sources";
import { serverTree } from "../src/view";
import { needsServer, real, sshOptions } from "./support";

const evil: Target = { name: "evil", host: "evil", source: "list" };
const conn = (timeoutMs = 20000): ApiConnection => new ApiConnection(evil, sshOptions(timeoutMs, real?.hostileConfig));

async function refused(p: Promise<unknown>): Promise<Error> {
  try {
    await p;
  } catch (e) {
    return e as Error;
  }
  throw new Error("the call did not fail");
}

test("a line past the bound ends the connection with the reason", needsServer, async () => {
  const c = conn();
  const e = await refused(c.call("whoami"));
  assert.ok(e instanceof ServerUnreachable);
  assert.equal(e.message, "the server sent a line longer than 8 MiB; is it an MTGPU server?");
  assert.equal(c.up, false);
  // Later calls fail at once with the same reason.
  assert.match((await refused(c.call("nodes"))).message, /^connection lost: the server sent a line longer than 8 MiB/);
});

test("garbage lines and answers to other ids are dropped; the real answer is taken", needsServer, async () => {
  const c = conn();
  try {
    assert.deepEqual(await c.call("job.list", { all: true }), []);
    // A refusal's message is bounded too.
    const e = await refused(c.call("refuse"));
    assert.ok(e instanceof ApiError);
    assert.equal(e.code, "nope");
    assert.equal(e.message.length, 4000);
  } finally {
    c.close();
  }
});

test("a server that never answers, or floods, meets the deadline", needsServer, async () => {
  for (const op of ["nodes", "flood"]) {
    const c = conn(2000);
    const e = await refused(c.call(op));
    assert.ok(e instanceof ServerUnreachable, `${op}: ${String(e)}`);
    assert.equal(e.message, "no answer within 2 s");
    assert.equal(c.up, false);
  }
});

test("a deeply nested answer neither crashes nor hangs the client", needsServer, async () => {
  const c = conn(5000);
  try {
    await c.call("deep").catch((e: Error) => assert.ok(e instanceof ServerUnreachable, String(e)));
  } finally {
    c.close();
  }
});

test("in the tree the hostile server is unreachable, with the reason", needsServer, async () => {
  const f = new Fleet([evil], { ssh: sshOptions(20000, real?.hostileConfig), intervalMs: 1000 });
  await f.once();
  assert.equal(f.state("evil").status, "unreachable");
  assert.equal(serverTree(f)[0].description, "unreachable: the server sent a line longer than 8 MiB; is it an MTGPU server?");
});

test("a server older than usage reporting: usage not available, and why; the rest as ever", needsServer, async () => {
  const f = new Fleet([{ name: "older", host: "older", source: "list" }], { ssh: sshOptions(20000, real?.olderConfig), intervalMs: 1000 });
  await f.once();
  const st = f.state("older");
  assert.deepEqual([st.status, st.server, st.usage], ["up", "oldhost", undefined], st.reason);
  assert.equal(st.usageError, "this server runs an MTGPU older than usage reporting");
  const [node] = serverTree(f);
  assert.equal(node.description, "no GPUs · RAM 0.0/1.0 GiB");
  assert.deepEqual(node.children?.map((c) => [c.label, c.description]), [
    ["GPUs", "0"],
    ["Jobs", "0 active"],
    ["Usage this month", "not available (this server runs an MTGPU older than usage reporting)"],
  ]);
});
