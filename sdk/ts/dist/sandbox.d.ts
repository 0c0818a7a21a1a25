import { type CodeContext, type Execution, type Language, type RunCodeOptions } from "./code.js";
import { Commands } from "./commands.js";
import { Files } from "./files.js";
import { Pty } from "./pty.js";
import { type ConnectionOptions } from "./transport.js";
import type { WireSandbox } from "./wire.js";
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
    error?: {
        code: string;
        message: string;
    };
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
/** sandboxInfo converts the API's sandbox. */
export declare function sandboxInfo(w: WireSandbox): SandboxInfo;
/**
 * A sandbox. Make one with Sandbox.create (or find one with
 * Sandbox.connect), use sbx.commands, sbx.files, sbx.runCode and sbx.pty,
 * and end it with sbx.kill() (or `await using sbx = await Sandbox.create()`).
 */
export declare class Sandbox {
    /** The sandbox's id (sbx_…). */
    readonly id: string;
    /** Run commands. */
    readonly commands: Commands;
    /** Read and write files; relative paths start from the user's home. */
    readonly files: Files;
    /** Interactive terminals. */
    readonly pty: Pty;
    private readonly code;
    private readonly t;
    private _info;
    /** What the server said of the sandbox when this handle last asked (getInfo asks again). */
    get info(): SandboxInfo;
    /** The sandbox's id, as E2B's SDKs name it. */
    get sandboxId(): string;
    /** The state when this handle last asked (getInfo asks again). */
    get state(): SandboxState;
    /** The runtime the sandbox got (runc, gvisor, …). */
    get runtime(): string;
    /** The template it runs. */
    get template(): string;
    /** The server URL this handle talks to. */
    get url(): string;
    /**
     * create makes a sandbox and resolves once it is ready to run a command.
     * The server and key come from the options, else AIRLOCK_URL and
     * AIRLOCK_API_KEY.
     */
    static create(opts?: SandboxOptions): Promise<Sandbox>;
    /** connect returns a handle to an existing sandbox (SandboxNotFoundError if it is gone or not yours). */
    static connect(id: string, opts?: ConnectionOptions): Promise<Sandbox>;
    /** list returns your sandboxes (a key of an admin: everyone's), newest first. */
    static list(opts?: ListOptions): Promise<SandboxInfo[]>;
    /** Sandbox.kill deletes a sandbox by id; false if there was none (of yours) to delete. */
    static kill(id: string, opts?: ConnectionOptions): Promise<boolean>;
    private path;
    /** kill deletes the sandbox: every process, file and secret of it. Killing it twice is fine. */
    kill(): Promise<void>;
    /** getInfo asks the server for the sandbox's state now. */
    getInfo(): Promise<SandboxInfo>;
    /** isRunning reports whether the sandbox is running (false once it stopped or was deleted). */
    isRunning(): Promise<boolean>;
    /** setTtl makes the sandbox expire ttl seconds from now. */
    setTtl(ttl: number): Promise<SandboxInfo>;
    /** pause freezes every process of the sandbox; time paused does not count against its ttl. */
    pause(): Promise<SandboxInfo>;
    /** resume thaws a paused sandbox. */
    resume(): Promise<SandboxInfo>;
    /** setNetwork replaces the sandbox's egress policy, effective at once. */
    setNetwork(policy: NetworkPolicy): Promise<NetworkPolicy>;
    /** metrics returns the sandbox's resource use now. */
    metrics(): Promise<SandboxMetrics>;
    /**
     * runCode runs code in a stateful interpreter (needs a template with one,
     * e.g. "code-interpreter"): variables and imports persist across calls.
     * An exception in the code is execution.error, not a thrown error.
     */
    runCode(code: string, opts?: RunCodeOptions): Promise<Execution>;
    /** createCodeContext makes an interpreter context of its own (separate state). */
    createCodeContext(opts?: {
        language?: Language;
        cwd?: string;
    }): Promise<CodeContext>;
    listCodeContexts(): Promise<CodeContext[]>;
    /** restartCodeContext restarts a context's kernel (its state is lost). */
    restartCodeContext(context: CodeContext | string): Promise<CodeContext>;
    removeCodeContext(context: CodeContext | string): Promise<void>;
    /** `await using sbx = await Sandbox.create()` kills the sandbox at the end of the block. */
    [Symbol.asyncDispose]: () => Promise<void>;
}
