// Small helpers shared by the modules.

type BufferLike = {
  from(data: string | Uint8Array, enc?: string): Uint8Array & { toString(enc: string): string };
};

const NodeBuffer = (globalThis as { Buffer?: BufferLike }).Buffer;

/** base64Decode decodes standard base64. */
export function base64Decode(s: string): Uint8Array {
  if (NodeBuffer) {
    const b = NodeBuffer.from(s, "base64");
    return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  }
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** base64Encode encodes bytes as standard base64. */
export function base64Encode(b: Uint8Array): string {
  if (NodeBuffer) return NodeBuffer.from(b).toString("base64");
  let bin = "";
  for (let i = 0; i < b.length; i++) bin += String.fromCharCode(b[i]!);
  return btoa(bin);
}

const encoder = new TextEncoder();

/** utf8 encodes a string. */
export const utf8 = (s: string): Uint8Array => encoder.encode(s);

/** text decodes UTF-8 bytes (invalid sequences become U+FFFD). */
export const text = (b: Uint8Array): string => new TextDecoder().decode(b);

/** sleep waits ms milliseconds, or rejects with the signal's reason when it aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** linked returns a controller that aborts when parent does (or when aborted itself), and a release. */
export function linked(parent?: AbortSignal): { ac: AbortController; release: () => void } {
  const ac = new AbortController();
  if (!parent) return { ac, release: () => {} };
  if (parent.aborted) {
    ac.abort(parent.reason);
    return { ac, release: () => {} };
  }
  const onAbort = () => ac.abort(parent.reason);
  parent.addEventListener("abort", onAbort, { once: true });
  return { ac, release: () => parent.removeEventListener("abort", onAbort) };
}

/** isEventStream reports whether a Content-Type is text/event-stream. */
export function isEventStream(contentType: string | null): boolean {
  return (contentType ?? "").split(";")[0]!.trim().toLowerCase() === "text/event-stream";
}

/** Converts snake_case wire dates to Date (undefined stays undefined). */
export const date = (s: unknown): Date | undefined => (typeof s === "string" && s !== "" ? new Date(s) : undefined);
