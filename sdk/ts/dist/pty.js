// Interactive terminals: sbx.pty.create(…) over the API's WebSocket.
import { AirlockError, ConnectionError, InvalidStateError } from "./errors.js";
import { seg, Transport } from "./transport.js";
import { utf8 } from "./util.js";
import { openSocket } from "./websocket.js";
/** One terminal: its process runs until it exits or kill() hangs up. */
export class PtyHandle {
    sock;
    exit;
    done;
    killed = false;
    /** @internal */
    constructor(sock, onData) {
        this.sock = sock;
        this.done = new Promise((resolve, reject) => {
            sock.onmessage = (m) => {
                if (typeof m === "string") {
                    // Text frames are control messages; the server's is {"exit": …}.
                    try {
                        const ctl = JSON.parse(m);
                        if (ctl.exit)
                            this.exit = ctl.exit;
                    }
                    catch {
                        // Not ours: ignored, as unknown controls are.
                    }
                    return;
                }
                onData?.(m);
            };
            sock.onclose = (_code, _reason, err) => {
                const e = this.exit;
                if (e) {
                    const r = { exitCode: e.exit_code ?? null, status: e.status };
                    if (e.id)
                        r.id = e.id;
                    resolve(r);
                }
                else if (this.killed) {
                    resolve({ exitCode: null, status: "killed" });
                }
                else {
                    reject(err ?? new ConnectionError("the terminal closed without its process's exit", { code: "unavailable" }));
                }
            };
        });
        this.done.catch(() => { });
        sock.start();
    }
    /** sendInput types into the terminal. */
    async sendInput(data) {
        this.send(typeof data === "string" ? utf8(data) : data);
    }
    /** resize changes the terminal's size. */
    async resize(size) {
        this.send(JSON.stringify({ resize: { cols: size.cols, rows: size.rows } }));
    }
    send(m) {
        try {
            this.sock.send(m);
        }
        catch (e) {
            if (e instanceof AirlockError)
                throw e;
            throw new ConnectionError("the terminal's connection is closed", { code: "unavailable", cause: e });
        }
    }
    /** kill hangs up: the server sends SIGHUP to the terminal's process tree, as a closed terminal does. */
    async kill() {
        this.killed = true;
        this.sock.close(1000, "");
        await this.done.catch(() => { });
    }
    /** wait resolves once the terminal's process ended (its exit code). */
    wait() {
        return this.done;
    }
}
/** sbx.pty: interactive terminals. */
export class Pty {
    t;
    sandboxId;
    /** @internal */
    constructor(t, sandboxId) {
        this.t = t;
        this.sandboxId = sandboxId;
    }
    /** create starts a process on a new terminal and connects to it. */
    async create(opts = {}) {
        const path = `/v1/sandboxes/${seg(this.sandboxId)}/pty`;
        const query = {
            cols: opts.cols,
            rows: opts.rows,
            cmd: opts.cmd ? [...opts.cmd] : undefined,
            user: opts.user,
            cwd: opts.cwd,
        };
        const url = this.t.url(path, query);
        // The global WebSocket says nothing of a refused handshake; a plain GET
        // of the same URL gets the API's answer (a missing sandbox, a bad key).
        const diagnose = async () => {
            try {
                await this.t.request("GET", path, { query });
            }
            catch (e) {
                if (e instanceof AirlockError && !/websocket/i.test(e.message))
                    return e;
            }
            try {
                const sb = await this.t.json("GET", `/v1/sandboxes/${seg(this.sandboxId)}`);
                if (sb.state !== "running") {
                    return new InvalidStateError(`sandbox is ${sb.state}`, { code: "invalid_state", status: 409, sandboxId: this.sandboxId });
                }
            }
            catch (e) {
                if (e instanceof AirlockError)
                    return e;
            }
            return new ConnectionError("the terminal's WebSocket handshake failed (this runtime's WebSocket does not say why: a user or cwd the sandbox lacks?)", { code: "unavailable", sandboxId: this.sandboxId });
        };
        const sock = await openSocket(url, { "User-Agent": "airlock-ts", ...this.t.authHeaders() }, opts.signal, diagnose);
        return new PtyHandle(sock, opts.onData);
    }
}
