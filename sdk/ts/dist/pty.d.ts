/** Options of sbx.pty.create. */
export interface PtyOptions {
    /** The terminal's size; default 80x24. */
    cols?: number;
    rows?: number;
    /** The argv to run; default the user's login shell. */
    cmd?: readonly string[];
    user?: string;
    /** Working directory; default the user's home. */
    cwd?: string;
    /** Called with the terminal's output as it comes. */
    onData?: (data: Uint8Array) => void;
    signal?: AbortSignal;
}
/** How a terminal's process ended. */
export interface PtyResult {
    /** The exec's id (ex_…), when the server said. */
    id?: string;
    exitCode: number | null;
    status: string;
}
/** One terminal: its process runs until it exits or kill() hangs up. */
export declare class PtyHandle {
    private readonly sock;
    private exit;
    private readonly done;
    private killed;
    /** sendInput types into the terminal. */
    sendInput(data: string | Uint8Array): Promise<void>;
    /** resize changes the terminal's size. */
    resize(size: {
        cols: number;
        rows: number;
    }): Promise<void>;
    private send;
    /** kill hangs up: the server sends SIGHUP to the terminal's process tree, as a closed terminal does. */
    kill(): Promise<void>;
    /** wait resolves once the terminal's process ended (its exit code). */
    wait(): Promise<PtyResult>;
}
/** sbx.pty: interactive terminals. */
export declare class Pty {
    private readonly t;
    private readonly sandboxId;
    /** create starts a process on a new terminal and connects to it. */
    create(opts?: PtyOptions): Promise<PtyHandle>;
}
