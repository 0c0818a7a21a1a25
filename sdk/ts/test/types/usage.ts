// Type-checked (never run) by test/sdk's TestTSBuild: a program using the
// SDK's whole surface by its package name, as a user's would, against the
// shipped .d.ts. A line marked @ts-expect-error must fail to compile.
import {
  AirlockError,
  CommandHandle,
  ExecTimeoutError,
  QuotaExceededError,
  Sandbox,
  SandboxNotFoundError,
  type CommandResult,
  type EntryInfo,
  type Execution,
  type FilesystemEvent,
  type PtyResult,
  type SandboxInfo,
  type WriteInfo,
} from "@airlock/sdk";

export async function agent(): Promise<void> {
  await using sbx = await Sandbox.create({
    template: "code-interpreter",
    runtime: "gvisor",
    env: { A: "1" },
    secrets: { TOKEN: "x" },
    network: { mode: "allowlist", allow: ["pypi.org"] },
    ttl: 300,
    resources: { cpu: 1, memoryMb: 512 },
    metadata: { user: "u-42" },
  });
  const runtime: string = sbx.runtime;
  const r: CommandResult = await sbx.commands.run("echo hi", { onStdout: (d: string) => void d, timeout: 10, user: "user" });
  const code: number | null = r.exitCode;
  // @ts-expect-error exitCode may be null
  const n: number = r.exitCode;
  const h: CommandHandle = await sbx.commands.run(["sleep", "1"], { background: true });
  // @ts-expect-error a foreground run is no handle
  const notHandle: CommandHandle = await sbx.commands.run("true");
  await h.sendStdin("x");
  const killed: boolean = await h.kill();
  const waited: CommandResult = await h.wait();
  const w: WriteInfo = await sbx.files.write("a.txt", "text");
  const text: string = await sbx.files.read("a.txt");
  const bytes: Uint8Array = await sbx.files.read("a.txt", { format: "bytes" });
  // @ts-expect-error bytes are not text
  const notText: string = await sbx.files.read("a.txt", { format: "bytes" });
  const entries: EntryInfo[] = await sbx.files.list(".");
  const there: boolean = await sbx.files.exists("a.txt");
  await sbx.files.remove("a.txt");
  const watch = await sbx.files.watch("dir", { recursive: true });
  for await (const ev of watch) {
    const e: FilesystemEvent = ev;
    void e;
    break;
  }
  const ex: Execution = await sbx.runCode("1 + 1", { language: "python" });
  const png: Uint8Array | undefined = ex.results[0]?.png;
  const errName: string | undefined = ex.error?.name;
  // @ts-expect-error not a language the interpreter has
  await sbx.runCode("1", { language: "cobol" });
  const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d: Uint8Array) => void d });
  await pty.sendInput("exit\n");
  const pr: PtyResult = await pty.wait();
  const info: SandboxInfo = await sbx.pause();
  await sbx.resume();
  const all: SandboxInfo[] = await Sandbox.list({ metadata: { user: "u-42" } });
  const again: Sandbox = await Sandbox.connect(sbx.id);
  await again.kill();
  void [runtime, code, n, notHandle, killed, waited, w, text, bytes, notText, entries, there, png, errName, pr, info, all];
}

export function errors(e: unknown): number | undefined {
  if (e instanceof QuotaExceededError) return e.retryAfter;
  if (e instanceof ExecTimeoutError) return e.result.stdout.length;
  if (e instanceof SandboxNotFoundError) return e.status;
  if (e instanceof AirlockError) {
    const c: string = e.code;
    return c.length;
  }
  return undefined;
}
