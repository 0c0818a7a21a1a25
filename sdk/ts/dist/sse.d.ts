/** One dispatched event. */
export interface SSEEvent {
    /** The `event:` field; "message" when the event named none. */
    event: string;
    /** The `data:` lines joined with "\n". */
    data: string;
    /** The `id:` field, when present. */
    id?: string;
}
/**
 * Bounds one line of an event stream. The server sends output in chunks far
 * below this (base64 of a 64 KiB read is 88 KiB); a longer line means a
 * broken or hostile peer, and buffering it would cost unbounded memory.
 */
export declare const MAX_SSE_LINE: number;
/** The stream stopped inside an event or a line: the connection was cut. */
export declare class StreamCutError extends Error {
    constructor(message?: string);
}
/** SSEParser turns text as it arrives into events. */
export declare class SSEParser {
    private buf;
    private crPending;
    private event;
    private data;
    private hasData;
    private id;
    private partial;
    private readonly maxLine;
    constructor(maxLine?: number);
    /** push feeds text and returns the events it completed. */
    push(text: string): SSEEvent[];
    /** end checks that the stream did not stop inside an event or a line. */
    end(): void;
    private line;
}
/**
 * sseEvents yields the events of a byte stream. onActivity is called for
 * every chunk (heartbeats included), so an idle watchdog can tell a silent
 * connection from a quiet command. A stream cut inside an event throws
 * StreamCutError.
 */
export declare function sseEvents(source: AsyncIterable<Uint8Array>, onActivity?: () => void): AsyncGenerator<SSEEvent>;
/** Bounds one NDJSON line (a result carrying a large image is one line). */
export declare const MAX_NDJSON_LINE: number;
/** ndjson yields the JSON values of a newline-delimited JSON byte stream; blank lines are skipped. */
export declare function ndjson(source: AsyncIterable<Uint8Array>, maxLine?: number): AsyncGenerator<unknown>;
