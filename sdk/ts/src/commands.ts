// Commands: sbx.commands.run(…) and background command handles.

import {
  AirlockError,
  ConflictError,
  ConnectionError,
  errorFromEvent,
  ExecTimeoutError,
  UnavailableError,
} from "./errors.js";
import { chunks, concat, seg, Transport } from "./transport.js";
import { sseEvents, StreamCutError } from "./sse.js";
import { base64Decode, date, isEventStream, linked, sleep, text, utf8 } from "./util.js";
import type { WireExecResult, WireOutputEvent } from "./wire.js";
import { joinPath } from "./paths.js";

/** How a command ended. */
export type CommandStatus = "exited" | "timeout" | "killed" | "oom" | "error";

/** The outcome of a command: also what a streamed run returns. */
export interface CommandResult {
  /** The exec's id (ex_…). */
  id: string;
  /** Everything the command wrote to stdout (UTF-8; invalid bytes become U+FFFD). */
  stdout: string;
  stderr: string;
  /**
   * The exit status: 128+n when signal n ended it, as a shell reports it
   * (137 for SIGKILL); null when the server has none.
   */
  exitCode: number | null;
  status: CommandStatus;
  /** The signal that ended it, e.g. "SIGKILL". */
  signal?: string;
  /** Why it did not run or end on its own (status "error", "oom", …). */
  error?: string;
  /** A machine-readable reason: exec_failed, exec_timeout, out_of_memory, killed_by_user, … */
  errorCode?: string;
  /** Output past maxOutputBytes was dropped (the head and tail of each stream are kept). */
  truncated: boolean;
  durationMs: number;
  startedAt?: Date;
  endedAt?: Date;
}

/** Options of sbx.commands.run. */
export interface RunOptions {
  /** Called with each piece of stdout as it happens (whole UTF-8 characters). */
  onStdout?: (data: string) => void;
  onStderr?: (data: string) => void;
  /** Seconds after which the server kills the command's whole tree (ExecTimeoutError). */
  timeout?: number;
  /** The user inside the sandbox: "user" (default, uid 1000) or "root". */
  user?: string;
  /** Working directory; relative to the user's home; default the home (or the template's WORKDIR). */
  cwd?: string;
  env?: Record<string, string>;
  /**
   * Text for stdin. A foreground run without it reads EOF; a background
   * command without it keeps stdin open for sendStdin.
   */
  stdin?: string;
  /** Cap on each stream's captured bytes (default 1 MiB on the server). */
  maxOutputBytes?: number;
  /** Return a CommandHandle once the command started instead of waiting for it. */
  background?: boolean;
  /**
   * Aborting stops waiting. A foreground command is then killed; a
   * background one keeps running (kill it with its handle).
   */
  signal?: AbortSignal;
}

/** Options of commands.connect. */
export interface ConnectOptions {
  onStdout?: (data: string) => void;
  onStderr?: (data: string) => void;
  signal?: AbortSignal;
}

/** A summary of one exec record (commands.list). */
export interface CommandInfo {
  id: string;
  cmd?: string[];
  shell?: string;
  user?: string;
  cwd?: string;
  status: string;
  exitCode: number | null;
  startedAt?: Date;
  endedAt?: Date;
}

/** Tuning of streams; the defaults suit every real server. */
export interface StreamTuning {
  /** A stream silent this long (no output, no heartbeat) is called dead and re-attached (ms). */
  idleMs: number;
  /** Consecutive re-attach attempts without progress before giving up. */
  resumeAttempts: number;
  /** Pause before the first re-attach (doubled at each further attempt, at most 5 s). */
  backoffMs: number;
}

/**
 * The server sends a heartbeat at least every 15 s, so three missed
 * heartbeats mean the connection is gone (a half-open TCP connection would
 * otherwise hang a reader forever).
 */
export const defaultTuning: StreamTuning = { idleMs: 45_000, resumeAttempts: 5, backoffMs: 200 };

const IDLE = Symbol("idle");

/** Builds the exec request of run(). */
function execRequest(cmd: string | readonly string[], o: RunOptions, foreground: boolean): Record<string, unknown> {
  const req: Record<string, unknown> = {};
  if (typeof cmd === "string") req["shell"] = cmd;
  else req["cmd"] = [...cmd];
  if (o.cwd !== undefined) req["cwd"] = o.cwd;
  if (o.env !== undefined) req["env"] = o.env;
  if (o.user !== undefined) req["user"] = o.user;
  if (o.timeout !== undefined) req["timeout_s"] = o.timeout;
  if (o.maxOutputBytes !== undefined) req["max_output_bytes"] = o.maxOutputBytes;
  if (o.stdin !== undefined) req["stdin"] = o.stdin;
  else if (foreground) req["stdin"] = ""; // nobody can write to it: EOF, never a hang
  return req;
}

/** Converts a wire result and the collected output into a CommandResult. */
function commandResult(w: WireExecResult, stdout: string, stderr: string): CommandResult {
  const r: CommandResult = {
    id: w.id,
    stdout,
    stderr,
    exitCode: w.exit_code ?? null,
    status: w.status as CommandStatus,
    truncated: w.truncated ?? false,
    durationMs: w.duration_ms ?? 0,
  };
  if (w.signal) r.signal = w.signal;
  if (w.error) r.error = w.error;
  if (w.error_code) r.errorCode = w.error_code;
  const s = date(w.started_at);
  if (s) r.startedAt = s;
  const e = date(w.ended_at);
  if (e) r.endedAt = e;
  return r;
}

/** Decodes a wire result's own stdout/stderr (base64 when it says so). */
function wireOutput(w: WireExecResult): { stdout: string; stderr: string } {
  const dec = (s: string | undefined) => (s === undefined ? "" : w.encoding === "base64" ? text(base64Decode(s)) : s);
  return { stdout: dec(w.stdout), stderr: dec(w.stderr) };
}

/** The error a timed-out command throws. */
function timeoutError(r: CommandResult, sandboxId: string, timeout?: number): ExecTimeoutError {
  const after = timeout !== undefined ? ` after ${timeout}s` : "";
  return new ExecTimeoutError(
    `command ${r.id} timed out${after}: the server killed it`,
    { code: "exec_timeout", sandboxId },
    { id: r.id, stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode },
  );
}

/** One stream of one exec's output: collects it, delivers it, re-attaches after drops. */
class Follower {
  execId: string | undefined;
  /** The offset of the next byte not yet delivered. */
  next = 0;
  private started: boolean;
  private progressed = false;
  readonly out: Uint8Array[] = [];
  readonly err: Uint8Array[] = [];
  private readonly outDec = new TextDecoder();
  private readonly errDec = new TextDecoder();
  /** Resolves with the exec id once the command started (or the attach opened). */
  readonly startedP: Promise<string>;
  private resolveStarted!: (id: string) => void;
  private rejectStarted!: (e: unknown) => void;

  constructor(
    private readonly t: Transport,
    private readonly sandboxId: string,
    private readonly handlers: { onStdout?: ((s: string) => void) | undefined; onStderr?: ((s: string) => void) | undefined },
    private readonly tuning: StreamTuning,
    execId?: string,
  ) {
    this.execId = execId;
    this.started = execId !== undefined;
    this.startedP = new Promise<string>((res, rej) => {
      this.resolveStarted = res;
      this.rejectStarted = rej;
    });
    this.startedP.catch(() => {}); // observed by run() or not at all
  }

  /** follow reads attempts until the exit event and returns the result. */
  async follow(open: (signal: AbortSignal) => Promise<Response>, signal?: AbortSignal): Promise<WireExecResult> {
    try {
      let failures = 0;
      for (;;) {
        const r = await this.attempt(open, signal);
        if ("result" in r) return r.result;
        if (signal?.aborted) throw signal.reason;
        if (this.execId === undefined) {
          // Without an id there is nothing to re-attach to, and sending the
          // exec again could run the command twice.
          throw new ConnectionError(`the command's stream ended before it started: ${String(r.dropped)}`, {
            code: "unavailable",
            sandboxId: this.sandboxId,
            cause: r.dropped,
          });
        }
        if (this.progressed) {
          failures = 0;
          this.progressed = false;
        }
        failures++;
        if (failures > this.tuning.resumeAttempts) {
          throw new ConnectionError(`exec ${this.execId}: the stream was lost after ${failures} attempts`, {
            code: "unavailable",
            sandboxId: this.sandboxId,
            cause: r.dropped,
          });
        }
        await sleep(Math.min(this.tuning.backoffMs * 2 ** (failures - 1), 5000), signal);
        open = (s) => this.openEvents(s);
      }
    } catch (e) {
      this.rejectStarted(e);
      throw e;
    } finally {
      this.flush();
    }
  }

  /** openEvents re-attaches: GET …/execs/{eid}/events?from_offset=next. */
  openEvents(signal: AbortSignal): Promise<Response> {
    return this.t.request("GET", `/v1/sandboxes/${seg(this.sandboxId)}/execs/${seg(this.execId!)}/events`, {
      query: { from_offset: this.next },
      accept: "text/event-stream",
      signal,
      stream: true,
    });
  }

  /** attempt reads one connection: the result, or why the connection dropped (to re-attach). */
  private async attempt(
    open: (signal: AbortSignal) => Promise<Response>,
    signal?: AbortSignal,
  ): Promise<{ result: WireExecResult } | { dropped: unknown }> {
    const { ac, release } = linked(signal);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const touch = () => {
      clearTimeout(timer);
      if (this.tuning.idleMs > 0) timer = setTimeout(() => ac.abort(IDLE), this.tuning.idleMs);
    };
    touch();
    try {
      let res: Response;
      try {
        res = await open(ac.signal);
      } catch (e) {
        if (signal?.aborted) throw signal.reason;
        if (ac.signal.reason === IDLE) return { dropped: new Error("no answer (stream idle)") };
        if (resumable(e)) return { dropped: e };
        throw e;
      }
      if (!isEventStream(res.headers.get("content-type"))) {
        await res.body?.cancel();
        throw new AirlockError(`exec stream: the server answered ${res.headers.get("content-type")}, not text/event-stream`, {
          code: "internal",
          sandboxId: this.sandboxId,
        });
      }
      if (this.started && this.execId !== undefined) this.resolveStarted(this.execId);
      try {
        for await (const ev of sseEvents(chunks(res.body), touch)) {
          const result = this.handle(ev.event, ev.data);
          if (result) return { result };
        }
        return { dropped: new StreamCutError("the stream ended without an exit event") };
      } catch (e) {
        if (signal?.aborted) throw signal.reason;
        if (e instanceof AirlockError) throw e; // an error event
        if (ac.signal.reason === IDLE) return { dropped: new Error("the stream was idle: no event or heartbeat") };
        return { dropped: e };
      }
    } finally {
      clearTimeout(timer);
      release();
      ac.abort(); // ends a body nobody reads any more
    }
  }

  /** handle processes one event; it returns the result on exit. */
  private handle(event: string, data: string): WireExecResult | undefined {
    try {
      return this.handleEvent(event, data);
    } catch (e) {
      if (e instanceof AirlockError) throw e;
      // A malformed event: re-attaching would read it again.
      throw new AirlockError(`exec stream: a malformed ${event} event: ${e instanceof Error ? e.message : String(e)}`, {
        code: "internal",
        sandboxId: this.sandboxId,
      });
    }
  }

  private handleEvent(event: string, data: string): WireExecResult | undefined {
    switch (event) {
      case "start": {
        const s = JSON.parse(data) as { id?: string };
        if (this.execId === undefined && s.id) this.execId = s.id;
        if (!this.started && this.execId !== undefined) {
          this.started = true;
          this.resolveStarted(this.execId);
        }
        return undefined;
      }
      case "stdout":
      case "stderr": {
        const o = JSON.parse(data) as WireOutputEvent;
        let bytes = o.encoding === "base64" ? base64Decode(o.data) : utf8(o.data);
        let off = o.offset;
        // After a re-attach the server may replay from the start of a chunk
        // already delivered in part: skip what the caller has seen.
        if (off < this.next) {
          const skip = this.next - off;
          if (skip >= bytes.length) return undefined;
          bytes = bytes.subarray(skip);
          off = this.next;
        }
        if (bytes.length === 0) return undefined;
        this.next = off + bytes.length;
        this.progressed = true;
        this.deliver(event, bytes);
        return undefined;
      }
      case "exit": {
        const r = JSON.parse(data) as WireExecResult;
        if (!r.id && this.execId) r.id = this.execId;
        return r;
      }
      case "error":
        throw errorFromEvent(data);
      default:
        return undefined; // events of a newer server
    }
  }

  private deliver(stream: string, bytes: Uint8Array): void {
    const isOut = stream === "stdout";
    (isOut ? this.out : this.err).push(bytes);
    const cb = isOut ? this.handlers.onStdout : this.handlers.onStderr;
    if (cb) {
      const s = (isOut ? this.outDec : this.errDec).decode(bytes, { stream: true });
      if (s) cb(s);
    }
  }

  /** flush delivers what the decoders hold back (a character cut at the end). */
  private flush(): void {
    const o = this.outDec.decode();
    if (o && this.handlers.onStdout) this.handlers.onStdout(o);
    const e = this.errDec.decode();
    if (e && this.handlers.onStderr) this.handlers.onStderr(e);
  }

  stdout(): string {
    return text(concat(this.out));
  }

  stderr(): string {
    return text(concat(this.err));
  }
}

/** Whether opening a stream failed in a way a later attempt may fix. */
function resumable(e: unknown): boolean {
  if (e instanceof UnavailableError) return true; // no answer, 503 without a specific code
  return !(e instanceof AirlockError);
}

/** A command started with `background: true` (or found with commands.connect). */
export class CommandHandle {
  /** The exec's id (ex_…). */
  readonly id: string;
  private result: CommandResult | undefined;
  private readonly done: Promise<CommandResult>;
  private readonly stop: AbortController;

  /** @internal */
  constructor(
    private readonly commands: Commands,
    id: string,
    private readonly follower: Follower,
    done: Promise<CommandResult>,
    stop: AbortController,
  ) {
    this.id = id;
    this.stop = stop;
    this.done = done.then((r) => (this.result = r));
    this.done.catch(() => {}); // a rejection nobody waits for is not an unhandled one
  }

  /** The stdout received so far (all of it once the command ended). */
  get stdout(): string {
    return this.result?.stdout ?? this.follower.stdout();
  }

  get stderr(): string {
    return this.result?.stderr ?? this.follower.stderr();
  }

  /** The exit code once the command ended (undefined while it runs). */
  get exitCode(): number | null | undefined {
    return this.result?.exitCode;
  }

  /** wait resolves with the result once the command ends (ExecTimeoutError past its timeout). */
  wait(): Promise<CommandResult> {
    return this.done;
  }

  /**
   * kill sends signal (default SIGKILL) to the command's whole process
   * tree. It returns false when the command had ended already.
   */
  kill(signal = "SIGKILL"): Promise<boolean> {
    return this.commands.kill(this.id, signal);
  }

  /** signal sends a signal ("SIGTERM", "SIGINT", …) to the command's whole process tree; false when it had ended. */
  signal(signal: string): Promise<boolean> {
    return this.commands.kill(this.id, signal);
  }

  /** sendStdin writes data to the command's stdin; eof: true closes it afterwards. */
  sendStdin(data: string | Uint8Array, opts: { eof?: boolean } = {}): Promise<void> {
    return this.commands.sendStdin(this.id, data, opts);
  }

  /** closeStdin closes its stdin: the command reads EOF. */
  closeStdin(): Promise<void> {
    return this.commands.closeStdin(this.id);
  }

  /**
   * disconnect stops receiving the output; the command keeps running
   * (commands.connect(id) follows it again). wait() then rejects.
   */
  disconnect(): void {
    this.stop.abort(new AirlockError(`stopped following command ${this.id}`, { code: "cancelled" }));
  }
}

/** sbx.commands: run commands in the sandbox. */
export class Commands {
  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly sandboxId: string,
    private readonly tuning: StreamTuning = defaultTuning,
    private readonly home: (user?: string) => Promise<string> = async (u) => (u === "root" ? "/root" : `/home/${u ?? "user"}`),
  ) {}

  private path(...rest: string[]): string {
    return `/v1/sandboxes/${seg(this.sandboxId)}/` + rest.join("/");
  }

  /**
   * run runs a command and returns its output once it ends. A string runs
   * in /bin/sh -c; an array is an argv (no shell). A non-zero exit is a
   * result, not an error; a command past its timeout throws
   * ExecTimeoutError. Output streams to onStdout/onStderr as it happens.
   */
  run(cmd: string | readonly string[], opts: RunOptions & { background: true }): Promise<CommandHandle>;
  run(cmd: string | readonly string[], opts?: RunOptions & { background?: false | undefined }): Promise<CommandResult>;
  run(cmd: string | readonly string[], opts?: RunOptions): Promise<CommandResult | CommandHandle>;
  async run(cmd: string | readonly string[], opts: RunOptions = {}): Promise<CommandResult | CommandHandle> {
    const req = execRequest(cmd, opts, !opts.background);
    if (typeof opts.cwd === "string" && !opts.cwd.startsWith("/")) req["cwd"] = joinPath(await this.home(opts.user), opts.cwd);
    const f = new Follower(this.t, this.sandboxId, { onStdout: opts.onStdout, onStderr: opts.onStderr }, this.tuning);
    const open = (signal: AbortSignal) =>
      this.t.request("POST", this.path("exec"), { json: req, accept: "text/event-stream", signal, stream: true });
    if (opts.background) {
      const stop = new AbortController();
      const { ac, release } = linked(opts.signal);
      stop.signal.addEventListener("abort", () => ac.abort(stop.signal.reason), { once: true });
      const done = this.finish(f.follow(open, ac.signal), f, opts.timeout).finally(release);
      done.catch(() => {});
      const id = await f.startedP;
      return new CommandHandle(this, id, f, done, stop);
    }
    try {
      return await this.finish(f.follow(open, opts.signal), f, opts.timeout);
    } catch (e) {
      if (opts.signal?.aborted && f.execId !== undefined) {
        // Nobody holds a handle to a foreground command: stopping to wait
        // for it ends it.
        await this.kill(f.execId).catch(() => {});
      }
      throw e;
    }
  }

  /** finish turns a followed exec into its CommandResult (or ExecTimeoutError). */
  private async finish(p: Promise<WireExecResult>, f: Follower, timeout?: number): Promise<CommandResult> {
    const w = await p;
    let out = { stdout: f.stdout(), stderr: f.stderr() };
    if (w.truncated) {
      // Past the cap the stream carried samples; the record holds exactly
      // the kept head and tail of each stream. Without it (the sandbox went
      // meanwhile) the samples are what there is.
      try {
        out = wireOutput(await this.t.json<WireExecResult>("GET", this.path("execs", seg(w.id))));
      } catch {
        // keep the streamed output
      }
    }
    const r = commandResult(w, out.stdout, out.stderr);
    if (r.status === "timeout") throw timeoutError(r, this.sandboxId, timeout);
    return r;
  }

  /**
   * connect follows a command that runs (or ran) in the sandbox, replaying
   * its output from the start. It throws ExecNotFoundError for an unknown id.
   */
  async connect(id: string, opts: ConnectOptions = {}): Promise<CommandHandle> {
    const f = new Follower(this.t, this.sandboxId, { onStdout: opts.onStdout, onStderr: opts.onStderr }, this.tuning, id);
    const stop = new AbortController();
    const { ac, release } = linked(opts.signal);
    stop.signal.addEventListener("abort", () => ac.abort(stop.signal.reason), { once: true });
    const done = this.finish(f.follow((s) => f.openEvents(s), ac.signal), f).finally(release);
    done.catch(() => {});
    await Promise.race([f.startedP, done]);
    return new CommandHandle(this, id, f, done, stop);
  }

  /** kill signals a command's whole process tree; false when it had ended already. */
  async kill(id: string, signal = "SIGKILL"): Promise<boolean> {
    try {
      await this.t.json("POST", this.path("execs", seg(id), "signal"), { json: { signal } });
      return true;
    } catch (e) {
      if (e instanceof ConflictError) return false; // it ended already
      throw e;
    }
  }

  /** sendStdin writes to a command's stdin (one started in the background without `stdin`); eof: true closes it afterwards. */
  async sendStdin(id: string, data: string | Uint8Array, opts: { eof?: boolean } = {}): Promise<void> {
    await this.t.json("POST", this.path("execs", seg(id), "stdin"), {
      query: { eof: opts.eof || undefined },
      body: typeof data === "string" ? utf8(data) : data,
      contentType: "application/octet-stream",
    });
  }

  /** closeStdin closes a command's stdin. */
  async closeStdin(id: string): Promise<void> {
    await this.t.json("POST", this.path("execs", seg(id), "stdin"), {
      query: { eof: true },
      body: new Uint8Array(0),
      contentType: "application/octet-stream",
    });
  }

  /** list returns the sandbox's commands, newest first. */
  async list(opts: { limit?: number } = {}): Promise<CommandInfo[]> {
    const out: CommandInfo[] = [];
    let cursor: string | undefined;
    do {
      const page = await this.t.json<{ execs: WireExecResult[] | null; next_cursor?: string }>("GET", this.path("execs"), {
        query: { limit: opts.limit, cursor },
      });
      for (const w of page.execs ?? []) {
        const c: CommandInfo = { id: w.id, status: w.status, exitCode: w.exit_code ?? null };
        if (w.cmd) c.cmd = w.cmd;
        if (w.shell !== undefined) c.shell = w.shell;
        if (w.user) c.user = w.user;
        if (w.cwd) c.cwd = w.cwd;
        const s = date(w.started_at);
        if (s) c.startedAt = s;
        const e = date(w.ended_at);
        if (e) c.endedAt = e;
        out.push(c);
      }
      cursor = page.next_cursor || undefined;
      if (opts.limit !== undefined && out.length >= opts.limit) break;
    } while (cursor);
    return opts.limit !== undefined ? out.slice(0, opts.limit) : out;
  }
}

