// The code interpreter: sbx.runCode(code, {language}) and code contexts.
import { AirlockError, ConnectionError } from "./errors.js";
import { describe } from "./transport.js";
import { chunks, seg, Transport } from "./transport.js";
import { ndjson } from "./sse.js";
import { base64Decode, date } from "./util.js";
function result(ev) {
    const r = { isMainResult: ev.is_main_result ?? false };
    if (ev.text !== undefined)
        r.text = ev.text;
    if (ev.html !== undefined)
        r.html = ev.html;
    if (ev.markdown !== undefined)
        r.markdown = ev.markdown;
    if (ev.svg !== undefined)
        r.svg = ev.svg;
    if (ev.png !== undefined)
        r.png = base64Decode(ev.png);
    if (ev.jpeg !== undefined)
        r.jpeg = base64Decode(ev.jpeg);
    if (ev.latex !== undefined)
        r.latex = ev.latex;
    if (ev.json !== undefined)
        r.json = ev.json;
    if (ev.javascript !== undefined)
        r.javascript = ev.javascript;
    if (ev.chart !== undefined)
        r.chart = ev.chart;
    if (ev.data !== undefined)
        r.data = ev.data;
    return r;
}
class ExecutionImpl {
    results = [];
    logs = { stdout: [], stderr: [] };
    error;
    executionCount = 0;
    get text() {
        return this.results.find((r) => r.isMainResult)?.text;
    }
    get stdout() {
        return this.logs.stdout.join("");
    }
    get stderr() {
        return this.logs.stderr.join("");
    }
    toJSON() {
        return { results: this.results, logs: this.logs, error: this.error, executionCount: this.executionCount };
    }
}
function codeContext(w) {
    const c = { id: w.id, language: w.language, cwd: w.cwd ?? "" };
    if (w.state)
        c.state = w.state;
    const d = date(w.created_at);
    if (d)
        c.createdAt = d;
    return c;
}
/** The code interpreter of one sandbox (sbx.runCode and the context calls use it). */
export class Code {
    t;
    sandboxId;
    /** @internal */
    constructor(t, sandboxId) {
        this.t = t;
        this.sandboxId = sandboxId;
    }
    path(...rest) {
        return `/v1/sandboxes/${seg(this.sandboxId)}/` + rest.join("/");
    }
    async run(code, opts = {}) {
        const req = { code };
        if (opts.context !== undefined) {
            req["context_id"] = typeof opts.context === "string" ? opts.context : opts.context.id;
        }
        else {
            req["language"] = opts.language ?? "python";
        }
        if (opts.timeout !== undefined)
            req["timeout_s"] = opts.timeout;
        if (opts.env !== undefined)
            req["env"] = opts.env;
        const res = await this.t.request("POST", this.path("code"), {
            json: req,
            accept: "application/x-ndjson",
            signal: opts.signal,
            stream: true,
        });
        const out = new ExecutionImpl();
        try {
            for await (const raw of ndjson(chunks(res.body))) {
                const ev = raw;
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
                        const e = { name: ev.name ?? "", value: ev.value ?? "", traceback: ev.traceback ?? "" };
                        out.error ??= e;
                        opts.onError?.(e);
                        break;
                    }
                    case "end":
                        out.executionCount = ev.execution_count ?? 0;
                        return out;
                }
            }
        }
        catch (e) {
            if (opts.signal?.aborted)
                throw opts.signal.reason;
            if (e instanceof AirlockError)
                throw e;
            throw new ConnectionError(`the code stream broke: ${describe(e)}`, { code: "unavailable", sandboxId: this.sandboxId, cause: e });
        }
        throw new ConnectionError("the code stream ended without an end event", { code: "unavailable", sandboxId: this.sandboxId });
    }
    async createContext(opts = {}) {
        const body = {};
        if (opts.language !== undefined)
            body["language"] = opts.language;
        if (opts.cwd !== undefined)
            body["cwd"] = opts.cwd;
        return codeContext(await this.t.json("POST", this.path("contexts"), { json: body }));
    }
    async listContexts() {
        const l = await this.t.json("GET", this.path("contexts"));
        return (l.contexts ?? []).map(codeContext);
    }
    async restartContext(context) {
        const id = typeof context === "string" ? context : context.id;
        return codeContext(await this.t.json("POST", this.path("contexts", seg(id), "restart")));
    }
    async removeContext(context) {
        const id = typeof context === "string" ? context : context.id;
        await this.t.json("DELETE", this.path("contexts", seg(id)));
    }
}
