// The Sandbox handle: create, connect, list, kill, and what a sandbox has
// (commands, files, pty, runCode).
import { Code } from "./code.js";
import { Commands, defaultTuning } from "./commands.js";
import { ConnectionError, SandboxNotFoundError, TemplateBuildingError } from "./errors.js";
import { Files } from "./files.js";
import { Pty } from "./pty.js";
import { seg, Transport } from "./transport.js";
import { date, sleep } from "./util.js";
function wireResources(r) {
    const w = {};
    if (r.cpu !== undefined)
        w.cpu = r.cpu;
    if (r.memoryMb !== undefined)
        w.memory_mb = r.memoryMb;
    if (r.diskMb !== undefined)
        w.disk_mb = r.diskMb;
    if (r.pids !== undefined)
        w.pids = r.pids;
    if (r.diskTmpfs !== undefined)
        w.disk_tmpfs = r.diskTmpfs;
    return w;
}
/** networkOption reads the create option's shorthands: a mode, or the hosts of an allowlist. */
function networkOption(n) {
    if (typeof n === "string")
        return { mode: n };
    if (Array.isArray(n))
        return { mode: "allowlist", allow: [...n] };
    return n;
}
function wireNetwork(n) {
    const w = { mode: n.mode };
    if (n.allow !== undefined)
        w.allow = n.allow;
    if (n.registries !== undefined)
        w.registries = n.registries;
    if (n.offline !== undefined)
        w.offline = n.offline;
    if (n.maxDownloadMb !== undefined)
        w.max_download_mb = n.maxDownloadMb;
    return w;
}
function networkPolicy(w) {
    const n = { mode: (w?.mode ?? "none") };
    if (w?.allow)
        n.allow = w.allow;
    if (w?.registries)
        n.registries = w.registries;
    if (w?.offline)
        n.offline = w.offline;
    if (w?.max_download_mb)
        n.maxDownloadMb = w.max_download_mb;
    return n;
}
/** sandboxInfo converts the API's sandbox. */
export function sandboxInfo(w) {
    const r = w.resources ?? {};
    const res = {};
    if (r.cpu !== undefined)
        res.cpu = r.cpu;
    if (r.memory_mb !== undefined)
        res.memoryMb = r.memory_mb;
    if (r.disk_mb !== undefined)
        res.diskMb = r.disk_mb;
    if (r.pids !== undefined)
        res.pids = r.pids;
    if (r.disk_tmpfs !== undefined)
        res.diskTmpfs = r.disk_tmpfs;
    const info = {
        id: w.id,
        tenant: w.tenant,
        template: w.template,
        templateVersion: w.template_version,
        runtime: w.runtime,
        state: w.state,
        createdAt: date(w.created_at) ?? new Date(0),
        resources: res,
        metadata: w.metadata ?? {},
        network: networkPolicy(w.network),
        readyMs: w.ready_ms ?? 0,
    };
    const exp = date(w.expires_at);
    if (exp)
        info.expiresAt = exp;
    if (w.error)
        info.error = w.error;
    if (w.stop_reason)
        info.stopReason = w.stop_reason;
    return info;
}
/** createRequest builds the body of POST /v1/sandboxes. */
function createRequest(o) {
    const req = {};
    if (o.template !== undefined)
        req["template"] = o.template;
    if (o.runtime !== undefined)
        req["runtime"] = o.runtime;
    if (o.resources !== undefined)
        req["resources"] = wireResources(o.resources);
    if (o.ttl !== undefined)
        req["timeout_s"] = o.ttl;
    if (o.env !== undefined)
        req["env"] = o.env;
    if (o.secrets !== undefined)
        req["secrets"] = o.secrets;
    if (o.secretsAsFiles)
        req["secrets_as_files"] = true;
    if (o.metadata !== undefined)
        req["metadata"] = o.metadata;
    if (o.network !== undefined)
        req["network"] = wireNetwork(networkOption(o.network));
    if (o.volumes !== undefined) {
        req["volumes"] = o.volumes.map((v) => (v.readOnly ? { name: v.name, path: v.path, read_only: true } : { name: v.name, path: v.path }));
    }
    if (o.autoPause)
        req["auto_pause"] = true;
    return req;
}
/** The default bound of create's wait for a template's build (seconds): a first build takes minutes. */
const DEFAULT_TEMPLATE_TIMEOUT = 1200;
/** newKey makes an Idempotency-Key. */
function newKey() {
    const b = new Uint8Array(16);
    globalThis.crypto?.getRandomValues(b);
    if (!globalThis.crypto)
        for (let i = 0; i < b.length; i++)
            b[i] = Math.floor(Math.random() * 256);
    return "ts-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}
const connectionKeys = ["url", "apiKey", "headers", "fetch", "requestTimeout"];
function connectionOf(o) {
    const c = {};
    for (const k of connectionKeys)
        if (o[k] !== undefined)
            c[k] = o[k];
    return c;
}
/**
 * A sandbox. Make one with Sandbox.create (or find one with
 * Sandbox.connect), use sbx.commands, sbx.files, sbx.runCode and sbx.pty,
 * and end it with sbx.kill() (or `await using sbx = await Sandbox.create()`).
 */
export class Sandbox {
    /** The sandbox's id (sbx_…). */
    id;
    /** Run commands. */
    commands;
    /** Read and write files; relative paths start from the user's home. */
    files;
    /** Interactive terminals. */
    pty;
    code;
    t;
    _info;
    /** @internal Use Sandbox.create or Sandbox.connect. */
    constructor(info, transport, tuning = defaultTuning) {
        this.id = info.id;
        this._info = info;
        this.t = transport;
        this.files = new Files(transport, info.id, tuning);
        this.commands = new Commands(transport, info.id, tuning, (user) => this.files.home(user));
        this.pty = new Pty(transport, info.id);
        this.code = new Code(transport, info.id);
    }
    /** What the server said of the sandbox when this handle last asked (getInfo asks again). */
    get info() {
        return this._info;
    }
    /** The sandbox's id, as E2B's SDKs name it. */
    get sandboxId() {
        return this.id;
    }
    /** The state when this handle last asked (getInfo asks again). */
    get state() {
        return this._info.state;
    }
    /** The runtime the sandbox got (runc, gvisor, …). */
    get runtime() {
        return this._info.runtime;
    }
    /** The template it runs. */
    get template() {
        return this._info.template;
    }
    /** The server URL this handle talks to. */
    get url() {
        return this.t.baseUrl;
    }
    /**
     * create makes a sandbox and resolves once it is ready to run a command.
     * The server and key come from the options, else AIRLOCK_URL and
     * AIRLOCK_API_KEY.
     */
    static async create(opts = {}) {
        const t = new Transport(connectionOf(opts));
        const body = createRequest(opts);
        const wait = opts.waitForTemplate ?? true;
        const deadline = Date.now() + (opts.templateTimeout ?? DEFAULT_TEMPLATE_TIMEOUT) * 1000;
        let key = opts.idempotencyKey ?? newKey();
        let netRetries = 0;
        for (;;) {
            try {
                const w = await t.json("POST", "/v1/sandboxes", {
                    json: body,
                    headers: { "Idempotency-Key": key },
                    signal: opts.signal,
                });
                return new Sandbox(sandboxInfo(w), t);
            }
            catch (e) {
                if (e instanceof TemplateBuildingError && wait && Date.now() < deadline) {
                    // Waiting here, not in the server: a request held for minutes
                    // meets fetch's own header timeout (300 s in Node).
                    await sleep(Math.min(Math.max(e.retryAfter ?? 5, 1), 30) * 1000, opts.signal);
                    // A refused create made nothing: a fresh key is as safe as the same.
                    if (opts.idempotencyKey === undefined)
                        key = newKey();
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
    static async connect(id, opts = {}) {
        const t = new Transport(connectionOf(opts));
        const w = await t.json("GET", `/v1/sandboxes/${seg(id)}`);
        return new Sandbox(sandboxInfo(w), t);
    }
    /** list returns your sandboxes (a key of an admin: everyone's), newest first. */
    static async list(opts = {}) {
        const t = new Transport(connectionOf(opts));
        const out = [];
        let cursor;
        do {
            const query = { state: opts.state, cursor };
            if (opts.limit !== undefined)
                query["limit"] = Math.min(opts.limit - out.length, 1000);
            for (const [k, v] of Object.entries(opts.metadata ?? {}))
                query[`metadata.${k}`] = v;
            const page = await t.json("GET", "/v1/sandboxes", { query });
            for (const w of page.sandboxes ?? [])
                out.push(sandboxInfo(w));
            cursor = page.next_cursor || undefined;
        } while (cursor && (opts.limit === undefined || out.length < opts.limit));
        return opts.limit === undefined ? out : out.slice(0, opts.limit);
    }
    /** Sandbox.kill deletes a sandbox by id; false if there was none (of yours) to delete. */
    static async kill(id, opts = {}) {
        const t = new Transport(connectionOf(opts));
        try {
            await t.json("DELETE", `/v1/sandboxes/${seg(id)}`);
            return true;
        }
        catch (e) {
            if (e instanceof SandboxNotFoundError)
                return false;
            throw e;
        }
    }
    path(...rest) {
        return [`/v1/sandboxes/${seg(this.id)}`, ...rest].join("/");
    }
    /** kill deletes the sandbox: every process, file and secret of it. Killing it twice is fine. */
    async kill() {
        try {
            await this.t.json("DELETE", this.path());
        }
        catch (e) {
            if (e instanceof SandboxNotFoundError)
                return;
            throw e;
        }
    }
    /** getInfo asks the server for the sandbox's state now. */
    async getInfo() {
        this._info = sandboxInfo(await this.t.json("GET", this.path()));
        return this._info;
    }
    /** isRunning reports whether the sandbox is running (false once it stopped or was deleted). */
    async isRunning() {
        try {
            return (await this.getInfo()).state === "running";
        }
        catch (e) {
            if (e instanceof SandboxNotFoundError)
                return false;
            throw e;
        }
    }
    /** setTtl makes the sandbox expire ttl seconds from now. */
    async setTtl(ttl) {
        this._info = sandboxInfo(await this.t.json("POST", this.path("timeout"), { json: { timeout_s: ttl } }));
        return this._info;
    }
    /** pause freezes every process of the sandbox; time paused does not count against its ttl. */
    async pause() {
        this._info = sandboxInfo(await this.t.json("POST", this.path("pause")));
        return this._info;
    }
    /** resume thaws a paused sandbox. */
    async resume() {
        this._info = sandboxInfo(await this.t.json("POST", this.path("resume")));
        return this._info;
    }
    /** setNetwork replaces the sandbox's egress policy, effective at once. */
    async setNetwork(policy) {
        const w = await this.t.json("PUT", this.path("network"), { json: wireNetwork(policy) });
        return networkPolicy(w);
    }
    /** metrics returns the sandbox's resource use now. */
    async metrics() {
        const w = await this.t.json("GET", this.path("metrics"));
        const n = (k) => (typeof w[k] === "number" ? w[k] : 0);
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
    runCode(code, opts = {}) {
        return this.code.run(code, opts);
    }
    /** createCodeContext makes an interpreter context of its own (separate state). */
    createCodeContext(opts = {}) {
        return this.code.createContext(opts);
    }
    listCodeContexts() {
        return this.code.listContexts();
    }
    /** restartCodeContext restarts a context's kernel (its state is lost). */
    restartCodeContext(context) {
        return this.code.restartContext(context);
    }
    removeCodeContext(context) {
        return this.code.removeContext(context);
    }
}
// Symbol.asyncDispose exists from Node 18.18/20.4 on; older runtimes get
// no disposer (kill() works everywhere).
const asyncDispose = Symbol.asyncDispose;
if (typeof asyncDispose === "symbol") {
    Object.defineProperty(Sandbox.prototype, asyncDispose, {
        value: function () {
            return this.kill();
        },
        writable: true,
        configurable: true,
    });
}
