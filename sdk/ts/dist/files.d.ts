import { homeFromPasswd, joinPath } from "./paths.js";
export { homeFromPasswd, joinPath };
/** What a path names. */
export type EntryType = "file" | "dir" | "symlink" | "other";
/** One file, directory or link (list, getInfo, makeDir, rename). */
export interface EntryInfo {
    name: string;
    /** Its absolute path inside the sandbox. */
    path: string;
    type: EntryType;
    size: number;
    /** Permission bits, e.g. 0o644. */
    mode: number;
    uid: number;
    gid: number;
    modifiedAt: Date;
    /** Where a symlink points. */
    linkTarget?: string;
}
/** The result of a write. */
export interface WriteInfo {
    /** The absolute path written. */
    path: string;
    /** Bytes written. */
    size: number;
}
/** Options every file call takes. */
export interface FileOptions {
    /** The user whose permissions apply (and whose home relative paths start from); default "user". */
    user?: string;
    signal?: AbortSignal;
}
/** What files.write takes: text (written as UTF-8), bytes, or a stream of bytes. */
export type WriteData = string | Uint8Array | ArrayBuffer | AsyncIterable<Uint8Array>;
/** A change files.watch reports. */
export interface FilesystemEvent {
    type: "create" | "write" | "remove" | "rename" | "chmod" | "overflow";
    /** The absolute path concerned (the new one for a rename). */
    path: string;
    /** The old path of a rename. */
    from?: string;
    /** The path is a directory. */
    dir: boolean;
    time?: Date;
}
/** Options of files.watch. */
export interface WatchOptions extends FileOptions {
    /** Watch the whole tree under the directory. */
    recursive?: boolean;
    /** Called for each change (besides the handle's async iteration). */
    onEvent?: (ev: FilesystemEvent) => void;
    /** Called once when the watch ends: undefined when the directory went away or stop() was called. */
    onExit?: (err?: Error) => void;
}
/** A running watch: async-iterate it for changes, stop() ends it. */
export declare class WatchHandle implements AsyncIterable<FilesystemEvent> {
    private readonly ac;
    private readonly opts;
    private readonly idleMs;
    private readonly queue;
    private waiters;
    private ended;
    private failure;
    /** Resolves when the watch ended (the directory went, stop(), or an error: then it rejects). */
    readonly done: Promise<void>;
    private idled;
    private timer;
    private pump;
    private push;
    private finish;
    /** stop ends the watch. */
    stop(): void;
    [Symbol.asyncIterator](): AsyncIterator<FilesystemEvent>;
}
/** sbx.files: the sandbox's filesystem. */
export declare class Files {
    private readonly t;
    private readonly sandboxId;
    private readonly tuning;
    private readonly homes;
    private path;
    /**
     * home is the home directory of user (default "user") as the sandbox's
     * /etc/passwd says, looked up once per handle; /home/<user> (/root for
     * root) when it says nothing usable.
     */
    home(user?: string): Promise<string>;
    /** resolve makes a path absolute: relative paths (and "~/…") start from the user's home. */
    resolve(p: string, user?: string): Promise<string>;
    /** read returns a file's content: text (default), bytes, or a stream of bytes. */
    read(path: string, opts?: FileOptions & {
        format?: "text";
    }): Promise<string>;
    read(path: string, opts: FileOptions & {
        format: "bytes";
    }): Promise<Uint8Array>;
    read(path: string, opts: FileOptions & {
        format: "stream";
    }): Promise<AsyncIterable<Uint8Array>>;
    /** write writes a file (parents are made); text is written as UTF-8. */
    write(path: string, data: WriteData, opts?: FileOptions & {
        mode?: number;
    }): Promise<WriteInfo>;
    /** list lists a directory (default the home); depth > 1 descends. */
    list(path?: string, opts?: FileOptions & {
        depth?: number;
    }): Promise<EntryInfo[]>;
    /** getInfo describes a path (a symlink itself, not its target). */
    getInfo(path: string, opts?: FileOptions): Promise<EntryInfo>;
    /** exists reports whether a path exists. */
    exists(path: string, opts?: FileOptions): Promise<boolean>;
    /** makeDir makes a directory and its parents. */
    makeDir(path: string, opts?: FileOptions): Promise<EntryInfo>;
    /** rename moves a file or directory. */
    rename(from: string, to: string, opts?: FileOptions): Promise<EntryInfo>;
    /** remove removes a file or an empty directory; recursive: true removes a directory with everything in it. */
    remove(path: string, opts?: FileOptions & {
        recursive?: boolean;
    }): Promise<void>;
    /**
     * watch watches a directory for changes. It resolves once the watch is
     * in place: a change made after that is reported.
     */
    watch(path: string, opts?: WatchOptions): Promise<WatchHandle>;
}
