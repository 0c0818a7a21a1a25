// The code interpreter: sbx.runCode(code, {language}) and code contexts.

import { AirlockError, ConnectionError } from "./errors.js";
import { describe } from "./transport.js";
import { chunks, seg, Transport } from "./transport.js";
import { ndjson } from "./sse.js";
import { base64Decode, date } from "./util.js";
import type { WireCodeContext, WireCodeEvent } from "./wire.js";

/** The languages of the code interpreter. */
export type Language = "python" | "javascript" | "bash";

/** One output of a cell: its last expression's value (isMainResult), a display() or a figure. */
export interface Result {
  /** The value of the cell's last expression (false for display() outputs and figures). */
  isMainResult: boolean;
  /** text/plain. */
  text?: string;
  html?: string;
  markdown?: string;
  svg?: string;
  /** A PNG image's bytes (a matplotlib figure). */
  png?: Uint8Array;
  jpeg?: Uint8Array;
  latex?: string;
  /** application/json, parsed. */
  json?: unknown;
  javascript?: string;
  /** A matplotlib figure's data (type, title, elements, axes), E2B's chart shape. */
  chart?: unknown;
  /** A pandas DataFrame's columns: column name → values. */
  data?: unknown;
}

/** The error a cell raised. */
export interface ExecutionError {
  /** The exception's name, e.g. "ZeroDivisionError" (or KernelDied, TimeoutError, OutputLimitExceeded). */
  name: string;
  value: string;
  traceback: string;
}

/** What a cell did. */
export interface Execution {
  results: Result[];
  logs: { stdout: string[]; stderr: string[] };
  /** The error the cell raised, if it did (a cell's error is a result, not a thrown error). */
  error?: ExecutionError;
  executionCount: number;
  /** The main result's text, if any. */
  readonly text: string | undefined;
  /** All of stdout. */
  readonly stdout: string;
  readonly stderr: string;
}

/** A stateful interpreter context (its own variables and imports). */
export interface CodeContext {
  id: string;
  language: Language;
  cwd: string;
  state?: string;
  createdAt?: Date;
}

/** Options of runCode. */
export interface RunCodeOptions {
  /** Default "python". Ignored with a context (the context's language). */
  language?: Language;
  /** A context made by createCodeContext (default: the sandbox's default context of the language). */
  context?: CodeContext | string;
  /** Seconds; past them the cell is interrupted (the context keeps its state). */
  timeout?: number;
  /** Variables set for this cell only. */
  env?: Record<string, string>;
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  onResult?: (result: Result) => void;
  onError?: (error: ExecutionError) => void;
  signal?: AbortSignal;
}

function result(ev: WireCodeEvent): Result {
  const r: Result = { isMainResult: ev.is_main_result ?? false };
  if (ev.text !== undefined) r.text = ev.text;
  if (ev.html !== undefined) r.html = ev.html;
  if (ev.markdown !== undefined) r.markdown = ev.markdown;
  if (ev.svg !== undefined) r.svg = ev.svg;
  if (ev.png !== undefined) r.png = base64Decode(ev.png);
  if (ev.jpeg !== undefined) r.jpeg = base64Decode(ev.jpeg);
  if (ev.latex !== undefined) r.latex = ev.latex;
  if (ev.json !== undefined) r.json = ev.json;
  if (ev.javascript !== undefined) r.javascript = ev.javascript;
  if (ev.chart !== undefined) r.chart = ev.chart;
  if (ev.data !== undefined) r.data = ev.data;
  return r;
}

class ExecutionImpl implements Execution {
  results: Result[] = [];
  logs = { stdout: [] as string[], stderr: [] as string[] };
  error?: ExecutionError;
  executionCount = 0;
  get text(): string | undefined {
    return this.results.find((r) => r.isMainResult)?.text;
  }
  get stdout(): string {
    return this.logs.stdout.join("");
  }
  get stderr(): string {
    return this.logs.stderr.join("");
  }
  toJSON() {
    return { results: this.results, logs: this.logs, error: this.error, executionCount: this.executionCount };
  }
}

function codeContext(w: WireCodeContext): CodeContext {
  const c: CodeContext = { id: w.id, language: w.language as Language, cwd: w.cwd ?? "" };
  if (w.state) c.state = w.state;
  const d = date(w.created_at);
  if (d) c.createdAt = d;
  return c;
}

/** The code interpreter of one sandbox (sbx.runCode and the context calls use it). */
export class Code {
  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly sandboxId: string,
  ) {}

  private path(...rest: string[]): string {
    return `/v1/sandboxes/${seg(this.sandboxId)}/` + rest.join("/");
  }

  async run(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    const req: Record<string, unknown> = { code };
    if (opts.context !== undefined) {
      req["context_id"] = typeof opts.context === "string" ? opts.context : opts.context.id;
    } else {
      req["language"] = opts.language ?? "python";
    }
    if (opts.timeout !== undefined) req["timeout_s"] = opts.timeout;
    if (opts.env !== undefined) req["env"] = opts.env;
    const res = await this.t.request("POST", this.path("code"), {
      json: req,
      accept: "application/x-ndjson",
      signal: opts.signal,
      stream: true,
    });
    const out = new ExecutionImpl();
    try {
      for await (const raw of ndjson(chunks(res.body))) {
        const ev = raw as WireCodeEvent;
        switch (ev.type) {
          case "stdout":
            out.logs.stdout.push(ev.text ?? "");
            opts.onStdout?.(ev.text ?? "");
            break;
          case "stderr":
            out.logs.stderr.push(ev.text ?? "");
            opts.onStderr?.(ev.text ?? "");
            break;
          case "result": {
            const r = result(ev);
            out.results.push(r);
            opts.onResult?.(r);
            break;
          }
          case "error": {
            const e: ExecutionError = { name: ev.name ?? "", value: ev.value ?? "", traceback: ev.traceback ?? "" };
            out.error ??= e;
            opts.onError?.(e);
            break;
          }
          case "end":
            out.executionCount = ev.execution_count ?? 0;
            return out;
        }
      }
    } catch (e) {
      if (opts.signal?.aborted) throw opts.signal.reason;
      if (e instanceof AirlockError) throw e;
      throw new ConnectionError(`the code stream broke: ${describe(e)}`, { code: "unavailable", sandboxId: this.sandboxId, cause: e });
    }
    throw new ConnectionError("the code stream ended without an end event", { code: "unavailable", sandboxId: this.sandboxId });
  }

  async createContext(opts: { language?: Language; cwd?: string } = {}): Promise<CodeContext> {
    const body: Record<string, unknown> = {};
    if (opts.language !== undefined) body["language"] = opts.language;
    if (opts.cwd !== undefined) body["cwd"] = opts.cwd;
    return codeContext(await this.t.json<WireCodeContext>("POST", this.path("contexts"), { json: body }));
  }

  async listContexts(): Promise<CodeContext[]> {
    const l = await this.t.json<{ contexts: WireCodeContext[] | null }>("GET", this.path("contexts"));
    return (l.contexts ?? []).map(codeContext);
  }

  async restartContext(context: CodeContext | string): Promise<CodeContext> {
    const id = typeof context === "string" ? context : context.id;
    return codeContext(await this.t.json<WireCodeContext>("POST", this.path("contexts", seg(id), "restart")));
  }

  async removeContext(context: CodeContext | string): Promise<void> {
    const id = typeof context === "string" ? context : context.id;
    await this.t.json("DELETE", this.path("contexts", seg(id)));
  }
}
