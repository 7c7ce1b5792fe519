/**
 * What the tests against a real server are given by tests/tui/test_vscode.py, which
 * starts the server with the project's harness (tests/mtgpu_testing.py) and runs
 * `node --test` with HOME set to a laptop-side home whose ~/.ssh/config and
 * servers.yaml point at it. Run alone (`npm test`), those tests are skipped and say so.
 */

import * as fs from "node:fs";
import * as path from "node:path";
import type { SshOptions } from "../src/protocol";

export interface RealServer {
  /** -F: the laptop's ~/.ssh/config (OpenSSH reads the passwd home, not $HOME). */
  sshConfig: string;
  user: string;
  server: string;
  /** An ssh config whose Host `evil` answers the mtgpu-api subsystem with garbage. */
  hostileConfig: string;
  /** An ssh config whose Host `older` is an MTGPU older than usage reporting (tests/tui/conftest.py). */
  olderConfig: string;
  fixture: string;
}

export const real: RealServer | undefined = process.env.MTGPU_TEST_SSH_CONFIG
  ? {
      sshConfig: process.env.MTGPU_TEST_SSH_CONFIG,
      user: process.env.MTGPU_TEST_USER ?? "lena",
      server: process.env.MTGPU_TEST_SERVER ?? "testhost",
      hostileConfig: process.env.MTGPU_TEST_HOSTILE_CONFIG ?? "",
      olderConfig: process.env.MTGPU_TEST_OLDER_CONFIG ?? "",
      fixture: process.env.MTGPU_TEST_FIXTURE ?? path.resolve(__dirname, "../../../protocol/api.jsonl"),
    }
  : undefined;

export const needsServer = real ? {} : { skip: "needs a real MTGPU server: run tests/tui/test_vscode.py" };

export function sshOptions(timeoutMs = 30000, configFile = real?.sshConfig): SshOptions {
  const o: SshOptions = { sshPath: "ssh", timeoutMs };
  if (configFile) o.configFile = configFile;
  return o;
}

/** Poll `check` until it returns something truthy, or fail naming `what`. */
export async function until<T>(check: () => T | Promise<T>, what: string, timeoutMs = 60000): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v) return v as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

export function tmpDir(prefix: string): string {
  return fs.mkdtempSync(path.join(process.env.TMPDIR || "/tmp", prefix));
}
