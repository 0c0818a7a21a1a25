/** base64Decode decodes standard base64. */
export declare function base64Decode(s: string): Uint8Array;
/** base64Encode encodes bytes as standard base64. */
export declare function base64Encode(b: Uint8Array): string;
/** utf8 encodes a string. */
export declare const utf8: (s: string) => Uint8Array;
/** text decodes UTF-8 bytes (invalid sequences become U+FFFD). */
export declare const text: (b: Uint8Array) => string;
/** sleep waits ms milliseconds, or rejects with the signal's reason when it aborts. */
export declare function sleep(ms: number, signal?: AbortSignal): Promise<void>;
/** linked returns a controller that aborts when parent does (or when aborted itself), and a release. */
export declare function linked(parent?: AbortSignal): {
    ac: AbortController;
    release: () => void;
};
/** isEventStream reports whether a Content-Type is text/event-stream. */
export declare function isEventStream(contentType: string | null): boolean;
/** Converts snake_case wire dates to Date (undefined stays undefined). */
export declare const date: (s: unknown) => Date | undefined;
