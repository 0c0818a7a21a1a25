/** How a command ended. */
export type CommandStatus = "exited" | "timeout" | "killed" | "oom" | "error";
/** The outcome of a command: also what a streamed run returns. */
export interface CommandResult {
    /** The exec's id (ex_…). */
    id: string;
    /** Everything the command wrote to stdout (UTF-8; invalid bytes become U+FFFD). */
    stdout: string;
    stderr: string;
    /**
     * The exit status: 128+n when signal n ended it, as a shell reports it
     * (137 for SIGKILL); null when the server has none.
     */
    exitCode: number | null;
    status: CommandStatus;
    /** The signal that ended it, e.g. "SIGKILL". */
    signal?: string;
    /** Why it did not run or end on its own (status "error", "oom", …). */
    error?: string;
    /** A machine-readable reason: exec_failed, exec_timeout, out_of_memory, killed_by_user, … */
    errorCode?: string;
    /** Output past maxOutputBytes was dropped (the head and tail of each stream are kept). */
    truncated: boolean;
    durationMs: number;
    startedAt?: Date;
    endedAt?: Date;
}
/** Options of sbx.commands.run. */
export interface RunOptions {
    /** Called with each piece of stdout as it happens (whole UTF-8 characters). */
    onStdout?: (data: string) => void;
    onStderr?: (data: string) => void;
    /** Seconds after which the server kills the command's whole tree (ExecTimeoutError). */
    timeout?: number;
    /** The user inside the sandbox: "user" (default, uid 1000) or "root". */
    user?: string;
    /** Working directory; relative to the user's home; default the home (or the template's WORKDIR). */
    cwd?: string;
    env?: Record<string, string>;
    /**
     * Text for stdin. A foreground run without it reads EOF; a background
     * command without it keeps stdin open for sendStdin.
     */
    stdin?: string;
    /** Cap on each stream's captured bytes (default 1 MiB on the server). */
    maxOutputBytes?: number;
    /** Return a CommandHandle once the command started instead of waiting for it. */
    background?: boolean;
    /**
     * Aborting stops waiting. A foreground command is then killed; a
     * background one keeps running (kill it with its handle).
     */
    signal?: AbortSignal;
}
/** Options of commands.connect. */
export interface ConnectOptions {
    onStdout?: (data: string) => void;
    onStderr?: (data: string) => void;
    signal?: AbortSignal;
}
/** A summary of one exec record (commands.list). */
export interface CommandInfo {
    id: string;
    cmd?: string[];
    shell?: string;
    user?: string;
    cwd?: string;
    status: string;
    exitCode: number | null;
    startedAt?: Date;
    endedAt?: Date;
}
/** Tuning of streams; the defaults suit every real server. */
export interface StreamTuning {
    /** A stream silent this long (no output, no heartbeat) is called dead and re-attached (ms). */
    idleMs: number;
    /** Consecutive re-attach attempts without progress before giving up. */
    resumeAttempts: number;
    /** Pause before the first re-attach (doubled at each further attempt, at most 5 s). */
    backoffMs: number;
}
/**
 * The server sends a heartbeat at least every 15 s, so three missed
 * heartbeats mean the connection is gone (a half-open TCP connection would
 * otherwise hang a reader forever).
 */
export declare const defaultTuning: StreamTuning;
/** A command started with `background: true` (or found with commands.connect). */
export declare class CommandHandle {
    private readonly commands;
    private readonly follower;
    /** The exec's id (ex_…). */
    readonly id: string;
    private result;
    private readonly done;
    private readonly stop;
    /** The stdout received so far (all of it once the command ended). */
    get stdout(): string;
    get stderr(): string;
    /** The exit code once the command ended (undefined while it runs). */
    get exitCode(): number | null | undefined;
    /** wait resolves with the result once the command ends (ExecTimeoutError past its timeout). */
    wait(): Promise<CommandResult>;
    /**
     * kill sends signal (default SIGKILL) to the command's whole process
     * tree. It returns false when the command had ended already.
     */
    kill(signal?: string): Promise<boolean>;
    /** signal sends a signal ("SIGTERM", "SIGINT", …) to the command's whole process tree; false when it had ended. */
    signal(signal: string): Promise<boolean>;
    /** sendStdin writes data to the command's stdin; eof: true closes it afterwards. */
    sendStdin(data: string | Uint8Array, opts?: {
        eof?: boolean;
    }): Promise<void>;
    /** closeStdin closes its stdin: the command reads EOF. */
    closeStdin(): Promise<void>;
    /**
     * disconnect stops receiving the output; the command keeps running
     * (commands.connect(id) follows it again). wait() then rejects.
     */
    disconnect(): void;
}
/** sbx.commands: run commands in the sandbox. */
export declare class Commands {
    private readonly t;
    private readonly sandboxId;
    private readonly tuning;
    private readonly home;
    private path;
    /**
     * run runs a command and returns its output once it ends. A string runs
     * in /bin/sh -c; an array is an argv (no shell). A non-zero exit is a
     * result, not an error; a command past its timeout throws
     * ExecTimeoutError. Output streams to onStdout/onStderr as it happens.
     */
    run(cmd: string | readonly string[], opts: RunOptions & {
        background: true;
    }): Promise<CommandHandle>;
    run(cmd: string | readonly string[], opts?: RunOptions & {
        background?: false | undefined;
    }): Promise<CommandResult>;
    run(cmd: string | readonly string[], opts?: RunOptions): Promise<CommandResult | CommandHandle>;
    /** finish turns a followed exec into its CommandResult (or ExecTimeoutError). */
    private finish;
    /**
     * connect follows a command that runs (or ran) in the sandbox, replaying
     * its output from the start. It throws ExecNotFoundError for an unknown id.
     */
    connect(id: string, opts?: ConnectOptions): Promise<CommandHandle>;
    /** kill signals a command's whole process tree; false when it had ended already. */
    kill(id: string, signal?: string): Promise<boolean>;
    /** sendStdin writes to a command's stdin (one started in the background without `stdin`); eof: true closes it afterwards. */
    sendStdin(id: string, data: string | Uint8Array, opts?: {
        eof?: boolean;
    }): Promise<void>;
    /** closeStdin closes a command's stdin. */
    closeStdin(id: string): Promise<void>;
    /** list returns the sandbox's commands, newest first. */
    list(opts?: {
        limit?: number;
    }): Promise<CommandInfo[]>;
}
