/**
 * The only module that touches `vscode`: it shows what the plain modules compute
 * (sources, protocol, fleet, view, commands) and turns their errors into
 * notifications carrying the server's message.
 */

import * as fs from "node:fs";
import * as vscode from "vscode";
import { attachedContainerUri, checkWorkspaceName, errorMessage, follow, jobOutputArgv, remoteSshUri, sourceChoices, terminalCommand } from "./commands";
import { Fleet, type ServerState, type Workspace } from "./fleet";
import type { SshOptions } from "./protocol";
import { addToServerList, discover, loadServerList, parseDestination, serversFile, sshConfigFile, sshConfigHosts } from "./sources";
import { serverTree, statusSummary, type TreeNode } from "./view";

let fleet: Fleet | undefined;

function sshOptions(): SshOptions {
  const cfg = vscode.workspace.getConfiguration("mtgpu");
  return { sshPath: cfg.get<string>("sshPath") || "ssh", timeoutMs: 1000 * (cfg.get<number>("timeoutSeconds") ?? 10) };
}

class ServersView implements vscode.TreeDataProvider<TreeNode> {
  private readonly changed = new vscode.EventEmitter<TreeNode | undefined>();
  readonly onDidChangeTreeData = this.changed.event;
  private roots: TreeNode[] = [];

  update(nodes: TreeNode[]): void {
    this.roots = nodes;
    this.changed.fire(undefined);
  }

  getTreeItem(n: TreeNode): vscode.TreeItem {
    const item = new vscode.TreeItem(
      n.label,
      n.children ? (n.contextValue.startsWith("server") ? vscode.TreeItemCollapsibleState.Expanded : vscode.TreeItemCollapsibleState.Collapsed) : vscode.TreeItemCollapsibleState.None,
    );
    item.id = n.id;
    item.description = n.description;
    item.tooltip = n.tooltip;
    item.contextValue = n.contextValue;
    if (n.icon) item.iconPath = new vscode.ThemeIcon(n.icon);
    return item;
  }

  getChildren(n?: TreeNode): TreeNode[] {
    return n ? n.children ?? [] : this.roots;
  }
}

/** Run a command's work, showing any failure as a notification with the server's words. */
async function guarded(what: string, work: () => Promise<void>): Promise<void> {
  try {
    await work();
  } catch (e) {
    void vscode.window.showErrorMessage(errorMessage(what, e));
  }
}

function serverOf(n: TreeNode | undefined): ServerState | undefined {
  return n?.server && fleet ? fleet.states.get(n.server) : undefined;
}

async function pickServer(n: TreeNode | undefined): Promise<ServerState | undefined> {
  const st = serverOf(n);
  if (st) return st;
  const up = fleet?.visible().filter((s) => s.status === "up") ?? [];
  if (up.length <= 1) return up[0];
  const pick = await vscode.window.showQuickPick(up.map((s) => ({ label: s.target.name, description: s.server ?? "", st: s })), { placeHolder: "Which server?" });
  return pick?.st;
}

function workspaceOf(st: ServerState, n: TreeNode | undefined): Workspace | undefined {
  return st.workspaces?.find((w) => w.name === n?.workspace);
}

export function activate(context: vscode.ExtensionContext): void {
  const view = new ServersView();
  const bar = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Left, 50);
  bar.command = "mtgpu.servers.focus";
  const log = vscode.window.createOutputChannel("MTGPU");
  context.subscriptions.push(vscode.window.registerTreeDataProvider("mtgpu.servers", view), bar, log);

  const load = (): void => {
    fleet?.stop();
    let targets;
    try {
      const list = loadServerList();
      targets = discover(list, list.sshConfig ? sshConfigHosts() : []);
    } catch (e) {
      void vscode.window.showErrorMessage(`MTGPU: ${(e as Error).message}`);
      targets = discover({ targets: [], sshConfig: true, path: serversFile() }, sshConfigHosts());
    }
    void vscode.commands.executeCommand("setContext", "mtgpu.noServers", targets.length === 0);
    const cfg = vscode.workspace.getConfiguration("mtgpu");
    const f = new Fleet(targets, {
      ssh: sshOptions(),
      intervalMs: 1000 * (cfg.get<number>("refreshSeconds") ?? 5),
      observer: (req, answer) => {
        if (answer && answer.ok !== true) log.appendLine(`${req.op}: ${String(answer.error)} (${String(answer.code)})`);
      },
    });
    let pending = false;
    f.onChange = () => {
      if (pending) return;
      pending = true;
      setTimeout(() => {
        pending = false;
        view.update(serverTree(f));
        const s = statusSummary(f);
        bar.text = s.text;
        bar.tooltip = s.tooltip;
        bar.show();
        void vscode.commands.executeCommand("setContext", "mtgpu.noServers", f.visible().length === 0);
      }, 100);
    };
    fleet = f;
    f.start();
    f.onChange();
  };
  load();
  context.subscriptions.push({ dispose: () => fleet?.stop() });
  context.subscriptions.push(
    vscode.workspace.onDidChangeConfiguration((e) => e.affectsConfiguration("mtgpu") && load()),
  );

  const reg = (id: string, fn: (n?: TreeNode) => unknown): void => {
    context.subscriptions.push(vscode.commands.registerCommand(id, fn));
  };

  reg("mtgpu.refresh", () => load());
  reg("mtgpu.openSshConfig", async () => {
    const file = sshConfigFile();
    if (!fs.existsSync(file)) fs.writeFileSync(file, "", { mode: 0o600 });
    await vscode.window.showTextDocument(vscode.Uri.file(file));
  });
  reg("mtgpu.addServer", () =>
    guarded("add a server", async () => {
      const text = await vscode.window.showInputBox({ prompt: "A server: [user@]host[:port], or a Host of ~/.ssh/config", placeHolder: "alice@gpu01:2222" });
      if (!text) return;
      const file = addToServerList(loadServerList(), parseDestination(text));
      void vscode.window.showInformationMessage(`MTGPU: added ${text} to ${file}`);
      load();
    }),
  );
  reg("mtgpu.openTerminal", (n) =>
    guarded("open a terminal", async () => {
      const st = await pickServer(n);
      if (!st) return;
      vscode.window.createTerminal(terminalCommand(st.target, sshOptions())).show();
    }),
  );
  reg("mtgpu.connectRemoteSsh", (n) =>
    guarded("connect with Remote - SSH", async () => {
      const st = await pickServer(n);
      if (!st) return;
      const uri = vscode.Uri.parse(remoteSshUri(st.target, st.home, st.user));
      await vscode.commands.executeCommand("vscode.openFolder", uri, { forceNewWindow: true });
    }),
  );
  reg("mtgpu.attachDevContainer", (n) =>
    guarded("attach Dev Containers", async () => {
      const st = serverOf(n);
      const ws = st && workspaceOf(st, n);
      if (!st || !ws) return;
      const uri = vscode.Uri.parse(attachedContainerUri(st.target, ws, st.home));
      await vscode.commands.executeCommand("vscode.openFolder", uri, { forceNewWindow: true });
    }),
  );
  reg("mtgpu.createWorkspace", (n) =>
    guarded("create a workspace", async () => {
      const st = await pickServer(n);
      if (!st || !fleet) return;
      const f = fleet;
      const pick = await vscode.window.showQuickPick(sourceChoices(await f.templates(st)), { placeHolder: "Create the workspace from" });
      if (!pick) return;
      const source = pick.source ?? (await vscode.window.showInputBox({ prompt: "Image", placeHolder: "localhost/team/cuda:12" }));
      if (!source) return;
      const name = await vscode.window.showInputBox({ prompt: "Workspace name", validateInput: (v) => checkWorkspaceName(v) ?? null });
      if (!name) return;
      const ws = await vscode.window.withProgress(
        { location: vscode.ProgressLocation.Notification, title: `MTGPU: creating ${name} on ${st.target.name}` },
        () => f.createWorkspace(st, name, source),
      );
      void vscode.window.showInformationMessage(`MTGPU: workspace ${name}: ${ws.state}${ws.reason ? ` (${ws.reason})` : ""}`);
    }),
  );
  for (const [id, action, verb] of [
    ["mtgpu.startWorkspace", "start", "start"],
    ["mtgpu.stopWorkspace", "stop", "stop"],
    ["mtgpu.deleteWorkspace", "rm", "delete"],
  ] as const) {
    reg(id, (n) =>
      guarded(`${verb} the workspace`, async () => {
        const st = serverOf(n);
        if (!st || !n?.workspace || !fleet) return;
        if (action === "rm") {
          const ok = await vscode.window.showWarningMessage(`Delete workspace ${n.workspace} on ${st.target.name}? Its container goes; your home stays.`, { modal: true }, "Delete");
          if (ok !== "Delete") return;
        }
        await fleet.workspaceAction(st, action, n.workspace);
      }),
    );
  }
  reg("mtgpu.submitFile", (n) =>
    guarded("submit the job", async () => {
      const editor = vscode.window.activeTextEditor;
      if (!editor) throw new Error("open the job file in an editor first");
      const st = await pickServer(n);
      if (!st || !fleet) return;
      const r = await fleet.submitJob(st, editor.document.getText());
      void vscode.window.showInformationMessage(`MTGPU: submitted job ${r.job_id} on ${st.target.name}${r.warnings.length ? `; ${r.warnings.join("; ")}` : ""}`);
    }),
  );
  reg("mtgpu.cancelJob", (n) =>
    guarded("cancel the job", async () => {
      const st = serverOf(n);
      if (!st || !n?.job || !fleet) return;
      await fleet.cancelJob(st, n.job);
    }),
  );
  reg("mtgpu.openJobOutput", (n) =>
    guarded("open the job's output", async () => {
      const st = serverOf(n);
      if (!st || !n?.job) return;
      const out = vscode.window.createOutputChannel(`MTGPU job ${n.job} (${st.target.name})`);
      out.show(true);
      const f = follow(jobOutputArgv(st.target, sshOptions(), n.job), (t) => out.append(t));
      context.subscriptions.push({ dispose: () => f.stop() }, out);
    }),
  );
}

export function deactivate(): void {
  fleet?.stop();
}
