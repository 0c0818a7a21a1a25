// The Sandbox handle: create, connect, list, kill, and what a sandbox has
// (commands, files, pty, runCode).

import { Code, type CodeContext, type Execution, type Language, type RunCodeOptions } from "./code.js";
import { Commands, defaultTuning, type StreamTuning } from "./commands.js";
import { ConnectionError, SandboxNotFoundError, TemplateBuildingError } from "./errors.js";
import { Files } from "./files.js";
import { Pty } from "./pty.js";
import { seg, Transport, type ConnectionOptions } from "./transport.js";
import { date, sleep } from "./util.js";
import type { WireNetwork, WireResources, WireSandbox, WireSandboxList } from "./wire.js";

/** Isolation runtimes; asking for one the host lacks is RuntimeUnavailableError, never a fallback. */
export type Runtime = "runc" | "gvisor" | "microvm" | "kubernetes";

/** A sandbox's state. */
export type SandboxState = "starting" | "running" | "paused" | "stopping" | "stopped" | "error";

/** Resource limits. */
export interface Resources {
  cpu?: number;
  memoryMb?: number;
  diskMb?: number;
  pids?: number;
  /** The writable layer on tmpfs (counted against memory). */
  diskTmpfs?: boolean;
}

/** A sandbox's egress policy (docs/network.md); default mode "none". */
export interface NetworkPolicy {
  mode: "none" | "allowlist" | "open";
  /** Domains, IPs and CIDRs (with an optional :port) allowed in allowlist mode. */
  allow?: string[];
  /** Package registry sets (debian, pypi, npm, goproxy) whose hosts are allowed too. */
  registries?: string[];
  /** Every registry host fails at once (NXDOMAIN). */
  offline?: boolean;
  /** Lowers the per-sandbox cap on bytes fetched through the registry mirror and the egress proxy. */
  maxDownloadMb?: number;
}

/** A volume to mount at create. */
export interface VolumeMount {
  name: string;
  path: string;
  readOnly?: boolean;
}

/** Options of Sandbox.create. Everything is optional: the server's configuration has the defaults. */
export interface SandboxOptions extends ConnectionOptions {
  /** The template, default "base"; "code-interpreter" for runCode; "name@2" pins a version. */
  template?: string;
  runtime?: Runtime | (string & {});
  resources?: Resources;
  /** Seconds the sandbox lives (the server enforces it); default the server's (300). */
  ttl?: number;
  /** Environment of every command. */
  env?: Record<string, string>;
  /** Secrets: environment variables masked in every output and file download. */
  secrets?: Record<string, string>;
  /** Give the secrets as files /run/secrets/NAME instead of variables. */
  secretsAsFiles?: boolean;
  metadata?: Record<string, string>;
  /** "none" (the default), "open", the hosts to allow, or a whole policy. */
  network?: NetworkPolicy | "none" | "open" | string[];
  volumes?: VolumeMount[];
  autoPause?: boolean;
  /**
   * A template's first use starts its build (minutes); create waits for it
   * (default). false throws TemplateBuildingError at once instead.
   */
  waitForTemplate?: boolean;
  /** How long create waits for a template build, in seconds; default 1200. */
  templateTimeout?: number;
  /** A retry with the same key returns the same sandbox instead of a new one. */
  idempotencyKey?: string;
  signal?: AbortSignal;
}

/** What the server says of a sandbox. */
export interface SandboxInfo {
  id: string;
  tenant: string;
  template: string;
  templateVersion: number;
  runtime: string;
  state: SandboxState;
  createdAt: Date;
  expiresAt?: Date;
  resources: Resources;
  metadata: Record<string, string>;
  network: NetworkPolicy;
  /** Milliseconds the sandbox took to become ready. */
  readyMs: number;
  /** Why the sandbox is in state "error". */
  error?: { code: string; message: string };
  /** Why a stopped sandbox stopped (deleted, expired, oom, crashed, …). */
  stopReason?: string;
}

/** Filters of Sandbox.list. */
export interface ListOptions extends ConnectionOptions {
  state?: SandboxState;
  /** Only sandboxes whose metadata has all of these. */
  metadata?: Record<string, string>;
  /** At most this many (default: every one, page after page). */
  limit?: number;
}

/** Resource use of a sandbox now. */
export interface SandboxMetrics {
  cpuSeconds: number;
  memoryBytes: number;
  memoryPeakBytes: number;
  pids: number;
  diskBytes: number;
  diskWrittenBytes: number;
  netRxBytes: number;
  netTxBytes: number;
  uptimeS: number;
}

function wireResources(r: Resources): WireResources {
  const w: WireResources = {};
  if (r.cpu !== undefined) w.cpu = r.cpu;
  if (r.memoryMb !== undefined) w.memory_mb = r.memoryMb;
  if (r.diskMb !== undefined) w.disk_mb = r.diskMb;
  if (r.pids !== undefined) w.pids = r.pids;
  if (r.diskTmpfs !== undefined) w.disk_tmpfs = r.diskTmpfs;
  return w;
}

/** networkOption reads the create option's shorthands: a mode, or the hosts of an allowlist. */
function networkOption(n: SandboxOptions["network"] & {}): NetworkPolicy {
  if (typeof n === "string") return { mode: n };
  if (Array.isArray(n)) return { mode: "allowlist", allow: [...n] };
  return n as NetworkPolicy;
}

function wireNetwork(n: NetworkPolicy): WireNetwork {
  const w: WireNetwork = { mode: n.mode };
  if (n.allow !== undefined) w.allow = n.allow;
  if (n.registries !== undefined) w.registries = n.registries;
  if (n.offline !== undefined) w.offline = n.offline;
  if (n.maxDownloadMb !== undefined) w.max_download_mb = n.maxDownloadMb;
  return w;
}

function networkPolicy(w: WireNetwork | undefined): NetworkPolicy {
  const n: NetworkPolicy = { mode: (w?.mode ?? "none") as NetworkPolicy["mode"] };
  if (w?.allow) n.allow = w.allow;
  if (w?.registries) n.registries = w.registries;
  if (w?.offline) n.offline = w.offline;
  if (w?.max_download_mb) n.maxDownloadMb = w.max_download_mb;
  return n;
}

/** sandboxInfo converts the API's sandbox. */
export function sandboxInfo(w: WireSandbox): SandboxInfo {
  const r = w.resources ?? {};
  const res: Resources = {};
  if (r.cpu !== undefined) res.cpu = r.cpu;
  if (r.memory_mb !== undefined) res.memoryMb = r.memory_mb;
  if (r.disk_mb !== undefined) res.diskMb = r.disk_mb;
  if (r.pids !== undefined) res.pids = r.pids;
  if (r.disk_tmpfs !== undefined) res.diskTmpfs = r.disk_tmpfs;
  const info: SandboxInfo = {
    id: w.id,
    tenant: w.tenant,
    template: w.template,
    templateVersion: w.template_version,
    runtime: w.runtime,
    state: w.state as SandboxState,
    createdAt: date(w.created_at) ?? new Date(0),
    resources: res,
    metadata: w.metadata ?? {},
    network: networkPolicy(w.network),
    readyMs: w.ready_ms ?? 0,
  };
  const exp = date(w.expires_at);
  if (exp) info.expiresAt = exp;
  if (w.error) info.error = w.error;
  if (w.stop_reason) info.stopReason = w.stop_reason;
  return info;
}

/** createRequest builds the body of POST /v1/sandboxes. */
function createRequest(o: SandboxOptions): Record<string, unknown> {
  const req: Record<string, unknown> = {};
  if (o.template !== undefined) req["template"] = o.template;
  if (o.runtime !== undefined) req["runtime"] = o.runtime;
  if (o.resources !== undefined) req["resources"] = wireResources(o.resources);
  if (o.ttl !== undefined) req["timeout_s"] = o.ttl;
  if (o.env !== undefined) req["env"] = o.env;
  if (o.secrets !== undefined) req["secrets"] = o.secrets;
  if (o.secretsAsFiles) req["secrets_as_files"] = true;
  if (o.metadata !== undefined) req["metadata"] = o.metadata;
  if (o.network !== undefined) req["network"] = wireNetwork(networkOption(o.network));
  if (o.volumes !== undefined) {
    req["volumes"] = o.volumes.map((v) => (v.readOnly ? { name: v.name, path: v.path, read_only: true } : { name: v.name, path: v.path }));
  }
  if (o.autoPause) req["auto_pause"] = true;
  return req;
}

/** The default bound of create's wait for a template's build (seconds): a first build takes minutes. */
const DEFAULT_TEMPLATE_TIMEOUT = 1200;

/** newKey makes an Idempotency-Key. */
function newKey(): string {
  const b = new Uint8Array(16);
  globalThis.crypto?.getRandomValues(b);
  if (!globalThis.crypto) for (let i = 0; i < b.length; i++) b[i] = Math.floor(Math.random() * 256);
  return "ts-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

const connectionKeys = ["url", "apiKey", "headers", "fetch", "requestTimeout"] as const;

function connectionOf(o: ConnectionOptions): ConnectionOptions {
  const c: ConnectionOptions = {};
  for (const k of connectionKeys) if (o[k] !== undefined) (c as Record<string, unknown>)[k] = o[k];
  return c;
}

/**
 * A sandbox. Make one with Sandbox.create (or find one with
 * Sandbox.connect), use sbx.commands, sbx.files, sbx.runCode and sbx.pty,
 * and end it with sbx.kill() (or `await using sbx = await Sandbox.create()`).
 */
export class Sandbox {
  /** The sandbox's id (sbx_…). */
  readonly id: string;
  /** Run commands. */
  readonly commands: Commands;
  /** Read and write files; relative paths start from the user's home. */
  readonly files: Files;
  /** Interactive terminals. */
  readonly pty: Pty;
  private readonly code: Code;
  private readonly t: Transport;
  private _info: SandboxInfo;

  /** @internal Use Sandbox.create or Sandbox.connect. */
  constructor(info: SandboxInfo, transport: Transport, tuning: StreamTuning = defaultTuning) {
    this.id = info.id;
    this._info = info;
    this.t = transport;
    this.files = new Files(transport, info.id, tuning);
    this.commands = new Commands(transport, info.id, tuning, (user) => this.files.home(user));
    this.pty = new Pty(transport, info.id);
    this.code = new Code(transport, info.id);
  }

  /** What the server said of the sandbox when this handle last asked (getInfo asks again). */
  get info(): SandboxInfo {
    return this._info;
  }

  /** The sandbox's id, as E2B's SDKs name it. */
  get sandboxId(): string {
    return this.id;
  }

  /** The state when this handle last asked (getInfo asks again). */
  get state(): SandboxState {
    return this._info.state;
  }

  /** The runtime the sandbox got (runc, gvisor, …). */
  get runtime(): string {
    return this._info.runtime;
  }

  /** The template it runs. */
  get template(): string {
    return this._info.template;
  }

  /** The server URL this handle talks to. */
  get url(): string {
    return this.t.baseUrl;
  }

  /**
   * create makes a sandbox and resolves once it is ready to run a command.
   * The server and key come from the options, else AIRLOCK_URL and
   * AIRLOCK_API_KEY.
   */
  static async create(opts: SandboxOptions = {}): Promise<Sandbox> {
    const t = new Transport(connectionOf(opts));
    const body = createRequest(opts);
    const wait = opts.waitForTemplate ?? true;
    const deadline = Date.now() + (opts.templateTimeout ?? DEFAULT_TEMPLATE_TIMEOUT) * 1000;
    let key = opts.idempotencyKey ?? newKey();
    let netRetries = 0;
    for (;;) {
      try {
        const w = await t.json<WireSandbox>("POST", "/v1/sandboxes", {
          json: body,
          headers: { "Idempotency-Key": key },
          signal: opts.signal,
        });
        return new Sandbox(sandboxInfo(w), t);
      } catch (e) {
        if (e instanceof TemplateBuildingError && wait && Date.now() < deadline) {
          // Waiting here, not in the server: a request held for minutes
          // meets fetch's own header timeout (300 s in Node).
          await sleep(Math.min(Math.max(e.retryAfter ?? 5, 1), 30) * 1000, opts.signal);
          // A refused create made nothing: a fresh key is as safe as the same.
          if (opts.idempotencyKey === undefined) key = newKey();
          continue;
        }
        if (e instanceof ConnectionError && !opts.signal?.aborted && netRetries < 2) {
          // The create may have happened: the same key returns that sandbox.
          netRetries++;
          await sleep(500 * netRetries, opts.signal);
          continue;
        }
        throw e;
      }
    }
  }

  /** connect returns a handle to an existing sandbox (SandboxNotFoundError if it is gone or not yours). */
  static async connect(id: string, opts: ConnectionOptions = {}): Promise<Sandbox> {
    const t = new Transport(connectionOf(opts));
    const w = await t.json<WireSandbox>("GET", `/v1/sandboxes/${seg(id)}`);
    return new Sandbox(sandboxInfo(w), t);
  }

  /** list returns your sandboxes (a key of an admin: everyone's), newest first. */
  static async list(opts: ListOptions = {}): Promise<SandboxInfo[]> {
    const t = new Transport(connectionOf(opts));
    const out: SandboxInfo[] = [];
    let cursor: string | undefined;
    do {
      const query: Record<string, string | number | undefined> = { state: opts.state, cursor };
      if (opts.limit !== undefined) query["limit"] = Math.min(opts.limit - out.length, 1000);
      for (const [k, v] of Object.entries(opts.metadata ?? {})) query[`metadata.${k}`] = v;
      const page = await t.json<WireSandboxList>("GET", "/v1/sandboxes", { query });
      for (const w of page.sandboxes ?? []) out.push(sandboxInfo(w));
      cursor = page.next_cursor || undefined;
    } while (cursor && (opts.limit === undefined || out.length < opts.limit));
    return opts.limit === undefined ? out : out.slice(0, opts.limit);
  }

  /** Sandbox.kill deletes a sandbox by id; false if there was none (of yours) to delete. */
  static async kill(id: string, opts: ConnectionOptions = {}): Promise<boolean> {
    const t = new Transport(connectionOf(opts));
    try {
      await t.json("DELETE", `/v1/sandboxes/${seg(id)}`);
      return true;
    } catch (e) {
      if (e instanceof SandboxNotFoundError) return false;
      throw e;
    }
  }

  private path(...rest: string[]): string {
    return [`/v1/sandboxes/${seg(this.id)}`, ...rest].join("/");
  }

  /** kill deletes the sandbox: every process, file and secret of it. Killing it twice is fine. */
  async kill(): Promise<void> {
    try {
      await this.t.json("DELETE", this.path());
    } catch (e) {
      if (e instanceof SandboxNotFoundError) return;
      throw e;
    }
  }

  /** getInfo asks the server for the sandbox's state now. */
  async getInfo(): Promise<SandboxInfo> {
    this._info = sandboxInfo(await this.t.json<WireSandbox>("GET", this.path()));
    return this._info;
  }

  /** isRunning reports whether the sandbox is running (false once it stopped or was deleted). */
  async isRunning(): Promise<boolean> {
    try {
      return (await this.getInfo()).state === "running";
    } catch (e) {
      if (e instanceof SandboxNotFoundError) return false;
      throw e;
    }
  }

  /** setTtl makes the sandbox expire ttl seconds from now. */
  async setTtl(ttl: number): Promise<SandboxInfo> {
    this._info = sandboxInfo(await this.t.json<WireSandbox>("POST", this.path("timeout"), { json: { timeout_s: ttl } }));
    return this._info;
  }

  /** pause freezes every process of the sandbox; time paused does not count against its ttl. */
  async pause(): Promise<SandboxInfo> {
    this._info = sandboxInfo(await this.t.json<WireSandbox>("POST", this.path("pause")));
    return this._info;
  }

  /** resume thaws a paused sandbox. */
  async resume(): Promise<SandboxInfo> {
    this._info = sandboxInfo(await this.t.json<WireSandbox>("POST", this.path("resume")));
    return this._info;
  }

  /** setNetwork replaces the sandbox's egress policy, effective at once. */
  async setNetwork(policy: NetworkPolicy): Promise<NetworkPolicy> {
    const w = await this.t.json<WireNetwork>("PUT", this.path("network"), { json: wireNetwork(policy) });
    return networkPolicy(w);
  }

  /** metrics returns the sandbox's resource use now. */
  async metrics(): Promise<SandboxMetrics> {
    const w = await this.t.json<Record<string, unknown>>("GET", this.path("metrics"));
    const n = (k: string) => (typeof w[k] === "number" ? (w[k] as number) : 0);
    return {
      cpuSeconds: n("cpu_seconds"),
      memoryBytes: n("memory_bytes"),
      memoryPeakBytes: n("memory_peak_bytes"),
      pids: n("pids"),
      diskBytes: n("disk_bytes"),
      diskWrittenBytes: n("disk_written_bytes"),
      netRxBytes: n("net_rx_bytes"),
      netTxBytes: n("net_tx_bytes"),
      uptimeS: n("uptime_s"),
    };
  }

  /**
   * runCode runs code in a stateful interpreter (needs a template with one,
   * e.g. "code-interpreter"): variables and imports persist across calls.
   * An exception in the code is execution.error, not a thrown error.
   */
  runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    return this.code.run(code, opts);
  }

  /** createCodeContext makes an interpreter context of its own (separate state). */
  createCodeContext(opts: { language?: Language; cwd?: string } = {}): Promise<CodeContext> {
    return this.code.createContext(opts);
  }

  listCodeContexts(): Promise<CodeContext[]> {
    return this.code.listContexts();
  }

  /** restartCodeContext restarts a context's kernel (its state is lost). */
  restartCodeContext(context: CodeContext | string): Promise<CodeContext> {
    return this.code.restartContext(context);
  }

  removeCodeContext(context: CodeContext | string): Promise<void> {
    return this.code.removeContext(context);
  }

  /** `await using sbx = await Sandbox.create()` kills the sandbox at the end of the block. */
  declare [Symbol.asyncDispose]: () => Promise<void>;
}

// Symbol.asyncDispose exists from Node 18.18/20.4 on; older runtimes get
// no disposer (kill() works everywhere).
const asyncDispose = (Symbol as { asyncDispose?: symbol }).asyncDispose;
if (typeof asyncDispose === "symbol") {
  Object.defineProperty(Sandbox.prototype, asyncDispose, {
    value: function (this: Sandbox) {
      return this.kill();
    },
    writable: true,
    configurable: true,
  });
}
