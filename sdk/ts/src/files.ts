// Files: sbx.files.read/write/list/exists/remove/watch, paths relative to
// the sandbox user's home.

import { AirlockError, ConnectionError, InvalidRequestError, NotFoundError, errorFromEvent } from "./errors.js";
import { chunks, concat, seg, Transport } from "./transport.js";
import { sseEvents } from "./sse.js";
import { date, isEventStream, linked, text, utf8 } from "./util.js";
import type { WireFileInfo } from "./wire.js";
import { homeFromPasswd, joinPath } from "./paths.js";

export { homeFromPasswd, joinPath };
import { defaultTuning, type StreamTuning } from "./commands.js";

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

const WATCH_EVENTS = new Set(["create", "write", "remove", "rename", "chmod", "overflow"]);

function entryInfo(w: WireFileInfo): EntryInfo {
  const e: EntryInfo = {
    name: w.name,
    path: w.path,
    type: w.type as EntryType,
    size: w.size,
    mode: parseInt(w.mode, 8) || 0,
    uid: w.uid,
    gid: w.gid,
    modifiedAt: date(w.modified_at) ?? new Date(0),
  };
  if (w.link_target) e.linkTarget = w.link_target;
  return e;
}

/** A running watch: async-iterate it for changes, stop() ends it. */
export class WatchHandle implements AsyncIterable<FilesystemEvent> {
  private readonly queue: FilesystemEvent[] = [];
  private waiters: Array<{ resolve: (r: IteratorResult<FilesystemEvent>) => void; reject: (e: unknown) => void }> = [];
  private ended = false;
  private failure: Error | undefined;
  /** Resolves when the watch ended (the directory went, stop(), or an error: then it rejects). */
  readonly done: Promise<void>;

  private idled = false;
  private timer: ReturnType<typeof setTimeout> | undefined;

  /** @internal */
  constructor(
    private readonly ac: AbortController,
    reader: AsyncGenerator<{ event: string; data: string }>,
    private readonly opts: WatchOptions,
    private readonly idleMs: number,
  ) {
    this.touch();
    this.done = this.pump(reader);
    this.done.catch(() => {});
  }

  /** @internal touch restarts the idle watchdog (every chunk, heartbeats included). */
  touch(): void {
    clearTimeout(this.timer);
    if (this.ended || this.idleMs <= 0) return;
    this.timer = setTimeout(() => {
      this.idled = true;
      this.ac.abort();
    }, this.idleMs);
  }

  private async pump(reader: AsyncGenerator<{ event: string; data: string }>): Promise<void> {
    try {
      let ended = false;
      for await (const ev of reader) {
        if (ev.event === "end") {
          ended = true;
          break;
        }
        if (ev.event === "error") throw errorFromEvent(ev.data);
        if (!WATCH_EVENTS.has(ev.event)) continue;
        const w = JSON.parse(ev.data) as { type?: string; path?: string; from?: string; dir?: boolean; time?: string };
        const out: FilesystemEvent = { type: ev.event as FilesystemEvent["type"], path: w.path ?? "", dir: w.dir ?? false };
        if (w.from) out.from = w.from;
        const t = date(w.time);
        if (t) out.time = t;
        this.opts.onEvent?.(out);
        this.push(out);
      }
      if (!ended && !this.ac.signal.aborted) {
        // The server ends a watch with `end` (or `error`); a stream that
        // just stops is a lost connection, or a sandbox that went away.
        throw new ConnectionError("watch: the stream ended without an end event", { code: "unavailable" });
      }
      this.finish(undefined);
    } catch (e) {
      if (this.ac.signal.aborted && !this.idled) {
        this.finish(undefined);
        return;
      }
      const err = this.idled
        ? new ConnectionError("watch: the stream was idle (no event or heartbeat): the connection is gone", { code: "unavailable" })
        : e instanceof AirlockError
          ? e
          : new ConnectionError(`watch: the stream broke: ${e instanceof Error ? e.message : String(e)}`, {
              code: "unavailable",
              cause: e,
            });
      this.finish(err);
      throw err;
    }
  }

  private push(ev: FilesystemEvent): void {
    const w = this.waiters.shift();
    if (w) w.resolve({ value: ev, done: false });
    else this.queue.push(ev);
  }

  private finish(err: Error | undefined): void {
    if (this.ended) return;
    this.ended = true;
    clearTimeout(this.timer);
    this.failure = err;
    this.ac.abort();
    for (const w of this.waiters.splice(0)) {
      if (err) w.reject(err);
      else w.resolve({ value: undefined, done: true });
    }
    this.opts.onExit?.(err);
  }

  /** stop ends the watch. */
  stop(): void {
    if (this.ended) return;
    this.ac.abort();
    this.finish(undefined);
  }

  [Symbol.asyncIterator](): AsyncIterator<FilesystemEvent> {
    return {
      next: () => {
        const ev = this.queue.shift();
        if (ev) return Promise.resolve({ value: ev, done: false });
        if (this.ended) {
          return this.failure ? Promise.reject(this.failure) : Promise.resolve({ value: undefined, done: true });
        }
        return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
      },
      return: () => {
        this.stop();
        return Promise.resolve({ value: undefined, done: true });
      },
    };
  }
}

/** sbx.files: the sandbox's filesystem. */
export class Files {
  private readonly homes = new Map<string, Promise<string>>();

  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly sandboxId: string,
    private readonly tuning: StreamTuning = defaultTuning,
  ) {}

  private path(...rest: string[]): string {
    return `/v1/sandboxes/${seg(this.sandboxId)}/` + rest.join("/");
  }

  /**
   * home is the home directory of user (default "user") as the sandbox's
   * /etc/passwd says, looked up once per handle; /home/<user> (/root for
   * root) when it says nothing usable.
   */
  home(user?: string): Promise<string> {
    const name = user ?? "user";
    let p = this.homes.get(name);
    if (!p) {
      const fallback = name === "root" ? "/root" : `/home/${name}`;
      p = (async () => {
        if (name === "root") return fallback;
        try {
          const res = await this.t.request("GET", this.path("files"), {
            query: { path: "/etc/passwd", user },
            accept: "application/octet-stream",
          });
          return homeFromPasswd(await res.text(), name) ?? fallback;
        } catch {
          // The sandbox or the user is wrong (the call itself will say so),
          // or the server is away now: ask again next time.
          this.homes.delete(name);
          return fallback;
        }
      })();
      this.homes.set(name, p);
    }
    return p;
  }

  /** resolve makes a path absolute: relative paths (and "~/…") start from the user's home. */
  async resolve(p: string, user?: string): Promise<string> {
    if (typeof p !== "string") throw new InvalidRequestError("path must be a string", { code: "invalid_argument" });
    if (p.startsWith("/")) return p;
    return joinPath(await this.home(user), p);
  }

  /** read returns a file's content: text (default), bytes, or a stream of bytes. */
  read(path: string, opts?: FileOptions & { format?: "text" }): Promise<string>;
  read(path: string, opts: FileOptions & { format: "bytes" }): Promise<Uint8Array>;
  read(path: string, opts: FileOptions & { format: "stream" }): Promise<AsyncIterable<Uint8Array>>;
  async read(
    path: string,
    opts: FileOptions & { format?: "text" | "bytes" | "stream" } = {},
  ): Promise<string | Uint8Array | AsyncIterable<Uint8Array>> {
    const res = await this.t.request("GET", this.path("files"), {
      query: { path: await this.resolve(path, opts.user), user: opts.user },
      accept: "application/octet-stream",
      signal: opts.signal,
      stream: true,
    });
    if (opts.format === "stream") return chunks(res.body);
    const parts: Uint8Array[] = [];
    for await (const c of chunks(res.body)) parts.push(c);
    const b = concat(parts);
    return opts.format === "bytes" ? b : text(b);
  }

  /** write writes a file (parents are made); text is written as UTF-8. */
  async write(path: string, data: WriteData, opts: FileOptions & { mode?: number } = {}): Promise<WriteInfo> {
    let body: Uint8Array | AsyncIterable<Uint8Array>;
    if (typeof data === "string") body = utf8(data);
    else if (data instanceof Uint8Array) body = data;
    else if (data instanceof ArrayBuffer) body = new Uint8Array(data);
    else if (data && typeof (data as AsyncIterable<Uint8Array>)[Symbol.asyncIterator] === "function") body = data;
    else throw new InvalidRequestError("write takes a string, a Uint8Array, an ArrayBuffer or an async iterable of bytes", { code: "invalid_argument" });
    const mode = opts.mode !== undefined ? opts.mode.toString(8).padStart(4, "0") : undefined;
    const w = await this.t.json<{ path: string; size: number }>("PUT", this.path("files"), {
      query: { path: await this.resolve(path, opts.user), user: opts.user, mode },
      body,
      contentType: "application/octet-stream",
      signal: opts.signal,
      stream: true,
    });
    return { path: w.path, size: w.size };
  }

  /** list lists a directory (default the home); depth > 1 descends. */
  async list(path = "", opts: FileOptions & { depth?: number } = {}): Promise<EntryInfo[]> {
    const l = await this.t.json<{ entries: WireFileInfo[] | null }>("GET", this.path("fs", "list"), {
      query: { path: await this.resolve(path, opts.user), user: opts.user, depth: opts.depth },
      signal: opts.signal,
    });
    return (l.entries ?? []).map(entryInfo);
  }

  /** getInfo describes a path (a symlink itself, not its target). */
  async getInfo(path: string, opts: FileOptions = {}): Promise<EntryInfo> {
    return entryInfo(
      await this.t.json<WireFileInfo>("GET", this.path("fs", "stat"), {
        query: { path: await this.resolve(path, opts.user), user: opts.user },
        signal: opts.signal,
      }),
    );
  }

  /** exists reports whether a path exists. */
  async exists(path: string, opts: FileOptions = {}): Promise<boolean> {
    try {
      await this.getInfo(path, opts);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError && !(e.code === "sandbox_not_found")) return false;
      throw e;
    }
  }

  /** makeDir makes a directory and its parents. */
  async makeDir(path: string, opts: FileOptions = {}): Promise<EntryInfo> {
    const body: Record<string, unknown> = { path: await this.resolve(path, opts.user) };
    if (opts.user !== undefined) body["user"] = opts.user;
    return entryInfo(await this.t.json<WireFileInfo>("POST", this.path("fs", "mkdir"), { json: body, signal: opts.signal }));
  }

  /** rename moves a file or directory. */
  async rename(from: string, to: string, opts: FileOptions = {}): Promise<EntryInfo> {
    const body: Record<string, unknown> = {
      from: await this.resolve(from, opts.user),
      to: await this.resolve(to, opts.user),
    };
    if (opts.user !== undefined) body["user"] = opts.user;
    return entryInfo(await this.t.json<WireFileInfo>("POST", this.path("fs", "move"), { json: body, signal: opts.signal }));
  }

  /** remove removes a file or an empty directory; recursive: true removes a directory with everything in it. */
  async remove(path: string, opts: FileOptions & { recursive?: boolean } = {}): Promise<void> {
    await this.t.json("DELETE", this.path("fs"), {
      query: { path: await this.resolve(path, opts.user), user: opts.user, recursive: opts.recursive || undefined },
      signal: opts.signal,
    });
  }

  /**
   * watch watches a directory for changes. It resolves once the watch is
   * in place: a change made after that is reported.
   */
  async watch(path: string, opts: WatchOptions = {}): Promise<WatchHandle> {
    const { ac, release } = linked(opts.signal);
    let res: Response;
    try {
      res = await this.t.request("GET", this.path("fs", "watch"), {
        query: { path: await this.resolve(path, opts.user), user: opts.user, recursive: opts.recursive || undefined },
        accept: "text/event-stream",
        signal: ac.signal,
        stream: true,
      });
    } catch (e) {
      release();
      throw e;
    }
    if (!isEventStream(res.headers.get("content-type"))) {
      release();
      ac.abort();
      throw new AirlockError(`watch: the server answered ${res.headers.get("content-type")}, not text/event-stream`, {
        code: "internal",
      });
    }
    let onChunk = () => {};
    const events = sseEvents(chunks(res.body), () => onChunk());
    let first: IteratorResult<{ event: string; data: string }>;
    try {
      first = await events.next();
    } catch (e) {
      release();
      ac.abort();
      throw e;
    }
    if (first.done || first.value.event !== "start") {
      release();
      ac.abort();
      if (!first.done && first.value.event === "error") throw errorFromEvent(first.value.data);
      throw new AirlockError("watch: the stream did not start", { code: "internal" });
    }
    ac.signal.addEventListener("abort", release, { once: true });
    const h = new WatchHandle(ac, events, opts, this.tuning.idleMs);
    onChunk = () => h.touch();
    return h;
  }
}
