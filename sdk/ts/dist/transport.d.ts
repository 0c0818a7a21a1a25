/** The address `airlock serve` listens on unless told otherwise. */
export declare const DEFAULT_URL = "http://127.0.0.1:7070";
/** The SDK's version (sent as User-Agent). */
export declare const VERSION = "0.1.0";
/** Where the SDK finds the server and its API key; every option falls back on the environment. */
export interface ConnectionOptions {
    /** The server's base URL; default `AIRLOCK_URL`, else http://127.0.0.1:7070. */
    url?: string;
    /** The API key; default `AIRLOCK_API_KEY`. */
    apiKey?: string;
    /** Extra headers sent with every request. */
    headers?: Record<string, string>;
    /** A fetch implementation; default the global one (Node ≥ 18). */
    fetch?: typeof fetch;
    /**
     * Bounds each ordinary call (not a stream: a running command, a watch,
     * code or a terminal), in seconds; default 120. 0 disables it.
     */
    requestTimeout?: number;
}
/** A query value: repeated for an array, omitted when undefined. */
export type QueryValue = string | number | boolean | undefined | readonly string[];
/** One request's options. */
export interface RequestOptions {
    query?: Record<string, QueryValue>;
    /** A JSON body (sent with Content-Type: application/json). */
    json?: unknown;
    /** A raw body. */
    body?: Uint8Array | string | AsyncIterable<Uint8Array>;
    contentType?: string;
    accept?: string;
    headers?: Record<string, string>;
    signal?: AbortSignal;
    /** A stream: no request timeout applies (the caller bounds it). */
    stream?: boolean;
}
/** Transport sends the API's requests; one per Sandbox handle (cheap: fetch pools connections). */
export declare class Transport {
    readonly baseUrl: string;
    readonly apiKey: string | undefined;
    private readonly extraHeaders;
    private readonly fetchFn;
    private readonly timeoutMs;
    /** The options it was made from, to derive a Transport for another handle. */
    readonly options: ConnectionOptions;
    constructor(opts?: ConnectionOptions);
    /** url builds the absolute URL of path (already escaped) and query. */
    url(path: string, query?: Record<string, QueryValue>): string;
    /** The headers that authenticate a request (also for the WebSocket handshake). */
    authHeaders(): Record<string, string>;
    /** Where a request went, for error messages: scheme and host only (queries may hold private paths). */
    redacted(): string;
    /**
     * request sends one request and returns the 2xx response (the caller
     * reads its body); any other answer throws its AirlockError.
     */
    request(method: string, path: string, o?: RequestOptions): Promise<Response>;
    /** json sends a request and decodes its JSON answer (undefined for 204). */
    json<T>(method: string, path: string, o?: RequestOptions): Promise<T>;
}
/** A short description of a network error (undici puts the real reason in cause). */
export declare function describe(err: unknown): string;
/** concat joins byte chunks. */
export declare function concat(parts: readonly Uint8Array[]): Uint8Array;
/** chunks yields the bytes of a response body as they arrive. */
export declare function chunks(body: ReadableStream<Uint8Array> | null): AsyncGenerator<Uint8Array>;
/** seg escapes one path segment. */
export declare const seg: (s: string) => string;
