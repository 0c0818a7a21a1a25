/** The languages of the code interpreter. */
export type Language = "python" | "javascript" | "bash";
/** One output of a cell: its last expression's value (isMainResult), a display() or a figure. */
export interface Result {
    /** The value of the cell's last expression (false for display() outputs and figures). */
    isMainResult: boolean;
    /** text/plain. */
    text?: string;
    html?: string;
    markdown?: string;
    svg?: string;
    /** A PNG image's bytes (a matplotlib figure). */
    png?: Uint8Array;
    jpeg?: Uint8Array;
    latex?: string;
    /** application/json, parsed. */
    json?: unknown;
    javascript?: string;
    /** A matplotlib figure's data (type, title, elements, axes), E2B's chart shape. */
    chart?: unknown;
    /** A pandas DataFrame's columns: column name → values. */
    data?: unknown;
}
/** The error a cell raised. */
export interface ExecutionError {
    /** The exception's name, e.g. "ZeroDivisionError" (or KernelDied, TimeoutError, OutputLimitExceeded). */
    name: string;
    value: string;
    traceback: string;
}
/** What a cell did. */
export interface Execution {
    results: Result[];
    logs: {
        stdout: string[];
        stderr: string[];
    };
    /** The error the cell raised, if it did (a cell's error is a result, not a thrown error). */
    error?: ExecutionError;
    executionCount: number;
    /** The main result's text, if any. */
    readonly text: string | undefined;
    /** All of stdout. */
    readonly stdout: string;
    readonly stderr: string;
}
/** A stateful interpreter context (its own variables and imports). */
export interface CodeContext {
    id: string;
    language: Language;
    cwd: string;
    state?: string;
    createdAt?: Date;
}
/** Options of runCode. */
export interface RunCodeOptions {
    /** Default "python". Ignored with a context (the context's language). */
    language?: Language;
    /** A context made by createCodeContext (default: the sandbox's default context of the language). */
    context?: CodeContext | string;
    /** Seconds; past them the cell is interrupted (the context keeps its state). */
    timeout?: number;
    /** Variables set for this cell only. */
    env?: Record<string, string>;
    onStdout?: (text: string) => void;
    onStderr?: (text: string) => void;
    onResult?: (result: Result) => void;
    onError?: (error: ExecutionError) => void;
    signal?: AbortSignal;
}
/** The code interpreter of one sandbox (sbx.runCode and the context calls use it). */
export declare class Code {
    private readonly t;
    private readonly sandboxId;
    private path;
    run(code: string, opts?: RunCodeOptions): Promise<Execution>;
    createContext(opts?: {
        language?: Language;
        cwd?: string;
    }): Promise<CodeContext>;
    listContexts(): Promise<CodeContext[]>;
    restartContext(context: CodeContext | string): Promise<CodeContext>;
    removeContext(context: CodeContext | string): Promise<void>;
}
