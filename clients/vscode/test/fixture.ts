/**
 * The pattern language of clients/protocol/api.jsonl (its README says it): the same
 * rules tests/tui/test_protocol_fixture.py applies for remotegpu-cli.
 */

import * as fs from "node:fs";

export interface Step {
  step: string;
  clients: string[];
  params?: Record<string, string>;
  requests: { op: string; args: Record<string, unknown> }[];
  answers: unknown[];
}

export function readSteps(file: string): Step[] {
  return fs.readFileSync(file, "utf-8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l) as Step);
}

const VAR = /\{(=?)([a-z_]+)\}/g;

export function subst(text: string, env: Record<string, unknown>): string {
  return text.replace(VAR, (all, cap: string, name: string) => {
    if (cap) return all;
    if (!(name in env)) throw new Error(`the fixture uses {${name}} before it is known`);
    return String(env[name]);
  });
}

const TYPES: Record<string, (v: unknown) => boolean> = {
  string: (v) => typeof v === "string",
  int: (v) => typeof v === "number" && Number.isInteger(v),
  number: (v) => typeof v === "number",
  bool: (v) => typeof v === "boolean",
  null: (v) => v === null,
  any: () => true,
};

const show = (v: unknown): string => JSON.stringify(v)?.slice(0, 300) ?? String(v);

/** Throw naming the first place `value` does not match `pattern`. */
export function match(pattern: unknown, value: unknown, env: Record<string, unknown>, exact: boolean, where = "$"): void {
  const fail = (why: string): never => {
    throw new Error(`${where}: ${why}`);
  };
  if (typeof pattern === "string") {
    const t = /^<([a-z|]+)>$/.exec(pattern);
    if (t) {
      if (!t[1].split("|").some((k) => TYPES[k](value))) fail(`${show(value)} is not ${pattern}`);
      return;
    }
    const cap = /^\{=([a-z_]+)\}$/.exec(pattern);
    if (cap) {
      env[cap[1]] = value;
      return;
    }
    if (value !== subst(pattern, env)) fail(`${show(value)} != ${show(subst(pattern, env))}`);
  } else if (typeof pattern === "object" && pattern !== null && !Array.isArray(pattern) && "$each" in pattern) {
    if (!Array.isArray(value)) fail(`${show(value)} is not a list`);
    (value as unknown[]).forEach((item, i) => match((pattern as { $each: unknown }).$each, item, env, exact, `${where}[${i}]`));
  } else if (typeof pattern === "object" && pattern !== null && !Array.isArray(pattern)) {
    if (typeof value !== "object" || value === null || Array.isArray(value)) fail(`${show(value)} is not an object`);
    const v = value as Record<string, unknown>;
    const p = pattern as Record<string, unknown>;
    if (exact && Object.keys(v).sort().join() !== Object.keys(p).sort().join()) {
      fail(`keys ${Object.keys(v).sort().join(",")} != ${Object.keys(p).sort().join(",")}`);
    }
    for (const [k, sub] of Object.entries(p)) {
      if (!(k in v)) fail(`no '${k}' in ${show(v)}`);
      match(sub, v[k], env, exact, `${where}.${k}`);
    }
  } else if (Array.isArray(pattern)) {
    if (!Array.isArray(value) || value.length !== pattern.length) fail(`${show(value)} != ${show(pattern)}`);
    pattern.forEach((p, i) => match(p, (value as unknown[])[i], env, exact, `${where}[${i}]`));
  } else if (value !== pattern) {
    fail(`${show(value)} != ${show(pattern)}`);
  }
}
