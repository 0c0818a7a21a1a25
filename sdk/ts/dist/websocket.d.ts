/** Opcodes (RFC 6455 §5.2). */
export declare const Opcode: {
    readonly Continuation: 0;
    readonly Text: 1;
    readonly Binary: 2;
    readonly Close: 8;
    readonly Ping: 9;
    readonly Pong: 10;
};
/** The GUID of the handshake's Sec-WebSocket-Accept (RFC 6455 §1.3). */
export declare const HANDSHAKE_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/**
 * Bounds one message the server sends. The server's terminal frames are
 * reads of the PTY (a few KiB); a larger message is a broken peer.
 */
export declare const MAX_MESSAGE: number;
/** One frame. */
export interface Frame {
    fin: boolean;
    opcode: number;
    payload: Uint8Array;
}
/** A violation of the protocol; code is the close code to send (1002, 1007, 1009). */
export declare class WebSocketProtocolError extends Error {
    readonly code: number;
    constructor(code: number, message: string);
}
/**
 * encodeFrame builds one frame. A client masks every frame it sends with a
 * fresh key (mask); a server sends them unmasked (mask null).
 */
export declare function encodeFrame(opcode: number, payload: Uint8Array, mask: Uint8Array | null, fin?: boolean): Uint8Array;
/**
 * FrameDecoder parses frames from bytes as they arrive. A client's decoder
 * (masked false) refuses masked frames, a server's (masked true) unmasked
 * ones, as §5.1 demands.
 */
export declare class FrameDecoder {
    private readonly masked;
    private readonly maxPayload;
    private buf;
    constructor(masked?: boolean, maxPayload?: number);
    /** push feeds bytes and returns the complete frames; it throws WebSocketProtocolError. */
    push(bytes: Uint8Array): Frame[];
    private next;
}
/** A close frame's payload: code and reason. */
export declare function closePayload(code: number, reason?: string): Uint8Array;
/** The message socket the terminal uses: either implementation. */
export interface MessageSocket {
    send(data: string | Uint8Array): void;
    close(code?: number, reason?: string): void;
    /** Set by the user: each complete message. */
    onmessage: (data: string | Uint8Array) => void;
    /** Set by the user: called once when the connection is over. */
    onclose: (code: number, reason: string, err?: Error) => void;
    /** start delivers messages (none is delivered before, so none is lost while the user sets the handlers). */
    start(): void;
}
/** Which implementation openSocket uses here: "global" or "builtin". */
export declare function webSocketKind(): "global" | "builtin";
/**
 * openSocket connects to url (http(s)://…, turned into ws(s)://) sending
 * headers. diagnose is asked for the reason when the global WebSocket
 * reports a failed handshake, which it does without the status or body.
 */
export declare function openSocket(url: string, headers: Record<string, string>, signal: AbortSignal | undefined, diagnose: () => Promise<Error>): Promise<MessageSocket>;
/** acceptKey is the Sec-WebSocket-Accept a server must answer key with. */
export declare function acceptKey(key: string): Promise<string>;
export declare function connectBuiltin(url: string, headers: Record<string, string>, signal: AbortSignal | undefined): Promise<MessageSocket>;
