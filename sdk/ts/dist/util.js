// Small helpers shared by the modules.
const NodeBuffer = globalThis.Buffer;
/** base64Decode decodes standard base64. */
export function base64Decode(s) {
    if (NodeBuffer) {
        const b = NodeBuffer.from(s, "base64");
        return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    }
    const bin = atob(s);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++)
        out[i] = bin.charCodeAt(i);
    return out;
}
/** base64Encode encodes bytes as standard base64. */
export function base64Encode(b) {
    if (NodeBuffer)
        return NodeBuffer.from(b).toString("base64");
    let bin = "";
    for (let i = 0; i < b.length; i++)
        bin += String.fromCharCode(b[i]);
    return btoa(bin);
}
const encoder = new TextEncoder();
/** utf8 encodes a string. */
export const utf8 = (s) => encoder.encode(s);
/** text decodes UTF-8 bytes (invalid sequences become U+FFFD). */
export const text = (b) => new TextDecoder().decode(b);
/** sleep waits ms milliseconds, or rejects with the signal's reason when it aborts. */
export function sleep(ms, signal) {
    return new Promise((resolve, reject) => {
        if (signal?.aborted) {
            reject(signal.reason);
            return;
        }
        const onAbort = () => {
            clearTimeout(t);
            reject(signal.reason);
        };
        const t = setTimeout(() => {
            signal?.removeEventListener("abort", onAbort);
            resolve();
        }, ms);
        signal?.addEventListener("abort", onAbort, { once: true });
    });
}
/** linked returns a controller that aborts when parent does (or when aborted itself), and a release. */
export function linked(parent) {
    const ac = new AbortController();
    if (!parent)
        return { ac, release: () => { } };
    if (parent.aborted) {
        ac.abort(parent.reason);
        return { ac, release: () => { } };
    }
    const onAbort = () => ac.abort(parent.reason);
    parent.addEventListener("abort", onAbort, { once: true });
    return { ac, release: () => parent.removeEventListener("abort", onAbort) };
}
/** isEventStream reports whether a Content-Type is text/event-stream. */
export function isEventStream(contentType) {
    return (contentType ?? "").split(";")[0].trim().toLowerCase() === "text/event-stream";
}
/** Converts snake_case wire dates to Date (undefined stays undefined). */
export const date = (s) => (typeof s === "string" && s !== "" ? new Date(s) : undefined);
