"""The asyncio client: :class:`AsyncSandbox`, the same surface as
:class:`Sandbox` with coroutines.

Calls run the synchronous client in worker threads (the standard library
has no asyncio HTTP client), so the event loop is never blocked. Callbacks
(``on_stdout``, …) run on the event loop and may be plain functions or
coroutine functions; the stream waits for each before reading on. When the
awaiting task is cancelled, the sockets of its call are shut down, so the
worker thread ends at once (a command started by it keeps running until
its timeout; use ``background=True`` and ``kill()`` to stop one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import threading
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, TypeVar, Union

from ._models import CodeContext, CommandResult, EntryInfo, Execution, FilesystemEvent, SandboxInfo, WriteInfo
from ._sandbox import _END, DEFAULT_COMMAND_TIMEOUT, CommandHandle, PtySession, Sandbox, WatchHandle
from ._transport import Cancel, current_cancel

__all__ = ["AsyncSandbox", "AsyncCommands", "AsyncCommandHandle", "AsyncFiles", "AsyncWatchHandle", "AsyncPty", "AsyncPtySession"]

T = TypeVar("T")

#: worker threads for the calls of every AsyncSandbox. Threads are made as
#: needed; the bound is high because a streamed command holds its thread
#: for as long as it runs (the default executor's few would let six
#: long-running commands stall every other call).
_MAX_WORKERS = 64
_executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
_executor_lock = threading.Lock()


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(max_workers=_MAX_WORKERS, thread_name_prefix="airlock")
        return _executor


async def _call(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    """Runs fn in a worker thread; cancelling the awaiting task shuts down
    the sockets the call uses."""
    loop = asyncio.get_running_loop()
    tok = Cancel()
    ctx = contextvars.copy_context()

    def work() -> T:
        current_cancel.set(tok)
        return fn(*args, **kw)

    fut: "asyncio.Future[T]" = loop.run_in_executor(_pool(), ctx.run, work)
    try:
        return await fut
    except asyncio.CancelledError:
        tok.cancel()
        raise


def _bridge(loop: asyncio.AbstractEventLoop, cb: Optional[Callable[[Any], Any]]) -> Optional[Callable[[Any], None]]:
    """A callback for a worker thread that runs cb on the loop (awaiting it
    if it is a coroutine function) and waits for it."""
    if cb is None:
        return None
    f = cb

    async def run(arg: Any) -> None:
        r = f(arg)
        if inspect.isawaitable(r):
            await r

    def call(arg: Any) -> None:
        asyncio.run_coroutine_threadsafe(run(arg), loop).result()

    return call


AsyncCallback = Optional[Callable[[Any], Union[None, Awaitable[None], Any]]]


class AsyncSandbox:
    """A sandbox, for asyncio::

        async with await AsyncSandbox.create(template="base") as sbx:
            r = await sbx.commands.run("echo hi")
    """

    def __init__(self, sandbox: Sandbox) -> None:
        #: the synchronous handle this one drives
        self.sync = sandbox
        self.id = sandbox.id
        self.commands = AsyncCommands(sandbox)
        self.files = AsyncFiles(sandbox)
        self.pty = AsyncPty(sandbox)

    @classmethod
    async def create(cls, template: Optional[str] = None, **kw: Any) -> "AsyncSandbox":
        """As :meth:`Sandbox.create`."""
        return cls(await _call(functools.partial(Sandbox.create, template, **kw)))

    @classmethod
    async def connect(cls, sandbox_id: str, **kw: Any) -> "AsyncSandbox":
        """As :meth:`Sandbox.connect`."""
        return cls(await _call(functools.partial(Sandbox.connect, sandbox_id, **kw)))

    @classmethod
    async def list(cls, **kw: Any) -> List[SandboxInfo]:
        """As :meth:`Sandbox.list`."""
        return await _call(functools.partial(Sandbox.list, **kw))

    @property
    def sandbox_id(self) -> str:
        return self.id

    @property
    def info(self) -> SandboxInfo:
        return self.sync.info

    @property
    def template(self) -> str:
        return self.sync.template

    @property
    def runtime(self) -> str:
        return self.sync.runtime

    @property
    def state(self) -> str:
        return self.sync.state

    async def get_info(self) -> SandboxInfo:
        return await _call(self.sync.get_info)

    async def is_running(self) -> bool:
        return await _call(self.sync.is_running)

    async def kill(self) -> None:
        await _call(self.sync.kill)

    async def set_ttl(self, seconds: int) -> SandboxInfo:
        return await _call(self.sync.set_ttl, seconds)

    async def pause(self) -> SandboxInfo:
        return await _call(self.sync.pause)

    async def resume(self) -> SandboxInfo:
        return await _call(self.sync.resume)

    async def metrics(self) -> Dict[str, Any]:
        return await _call(self.sync.metrics)

    async def close(self) -> None:
        self.sync.close()

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            # The delete runs to its end even when the block was cancelled.
            await asyncio.shield(_call(self.sync.kill))
        finally:
            self.sync.close()

    def __repr__(self) -> str:
        return "AsyncSandbox(id=%r, template=%r, runtime=%r)" % (self.id, self.template, self.runtime)

    async def run_code(
        self,
        code: str,
        *,
        on_stdout: AsyncCallback = None,
        on_stderr: AsyncCallback = None,
        on_result: AsyncCallback = None,
        on_error: AsyncCallback = None,
        **kw: Any,
    ) -> Execution:
        """As :meth:`Sandbox.run_code`; callbacks run on the event loop."""
        loop = asyncio.get_running_loop()
        return await _call(functools.partial(
            self.sync.run_code, code,
            on_stdout=_bridge(loop, on_stdout), on_stderr=_bridge(loop, on_stderr),
            on_result=_bridge(loop, on_result), on_error=_bridge(loop, on_error), **kw,
        ))

    async def create_code_context(self, language: str = "python", *, cwd: Optional[str] = None) -> CodeContext:
        return await _call(functools.partial(self.sync.create_code_context, language, cwd=cwd))

    async def list_code_contexts(self) -> List[CodeContext]:
        return await _call(self.sync.list_code_contexts)

    async def restart_code_context(self, context: Union[CodeContext, str]) -> CodeContext:
        return await _call(self.sync.restart_code_context, context)

    async def remove_code_context(self, context: Union[CodeContext, str]) -> None:
        await _call(self.sync.remove_code_context, context)


class AsyncCommands:
    """``sbx.commands`` of an AsyncSandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sync = sandbox.commands
        self._sbx = sandbox

    async def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        background: bool = False,
        on_stdout: AsyncCallback = None,
        on_stderr: AsyncCallback = None,
        timeout: Optional[float] = DEFAULT_COMMAND_TIMEOUT,
        **kw: Any,
    ) -> Any:
        """As :meth:`Commands.run`: a CommandResult, or with background=True
        an :class:`AsyncCommandHandle`. Callbacks run on the event loop."""
        loop = asyncio.get_running_loop()
        r = await _call(functools.partial(
            self._sync.run, cmd, background=background,
            on_stdout=_bridge(loop, on_stdout), on_stderr=_bridge(loop, on_stderr), timeout=timeout, **kw,
        ))
        return AsyncCommandHandle(r) if isinstance(r, CommandHandle) else r

    async def connect(self, exec_id: str, *, on_stdout: AsyncCallback = None, on_stderr: AsyncCallback = None) -> "AsyncCommandHandle":
        loop = asyncio.get_running_loop()
        return AsyncCommandHandle(self._sync.connect(exec_id, on_stdout=_bridge(loop, on_stdout), on_stderr=_bridge(loop, on_stderr)))

    async def list(self, *, limit: Optional[int] = None) -> List[CommandResult]:
        return await _call(functools.partial(self._sync.list, limit=limit))

    async def kill(self, exec_id: str, signal: str = "SIGKILL") -> bool:
        return await _call(self._sync.kill, exec_id, signal)

    async def send_stdin(self, exec_id: str, data: Union[str, bytes], *, eof: bool = False) -> None:
        await _call(functools.partial(self._sync.send_stdin, exec_id, data, eof=eof))


class AsyncCommandHandle:
    """A background command of an AsyncSandbox."""

    def __init__(self, handle: CommandHandle) -> None:
        self.sync = handle
        self.exec_id = handle.exec_id

    @property
    def id(self) -> str:
        return self.exec_id

    async def wait(self, *, on_stdout: AsyncCallback = None, on_stderr: AsyncCallback = None) -> CommandResult:
        loop = asyncio.get_running_loop()
        return await _call(functools.partial(self.sync.wait, on_stdout=_bridge(loop, on_stdout), on_stderr=_bridge(loop, on_stderr)))

    async def kill(self) -> bool:
        return await _call(self.sync.kill)

    async def signal(self, signal: str) -> bool:
        return await _call(self.sync.signal, signal)

    async def send_stdin(self, data: Union[str, bytes], *, eof: bool = False) -> None:
        await _call(functools.partial(self.sync.send_stdin, data, eof=eof))

    async def close_stdin(self) -> None:
        await _call(self.sync.close_stdin)


class AsyncFiles:
    """``sbx.files`` of an AsyncSandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sync = sandbox.files

    async def read(self, path: str, **kw: Any) -> Any:
        return await _call(functools.partial(self._sync.read, path, **kw))

    async def write(self, path: str, data: Any, **kw: Any) -> WriteInfo:
        return await _call(functools.partial(self._sync.write, path, data, **kw))

    async def list(self, path: str = "", **kw: Any) -> List[EntryInfo]:
        return await _call(functools.partial(self._sync.list, path, **kw))

    async def get_info(self, path: str, **kw: Any) -> EntryInfo:
        return await _call(functools.partial(self._sync.get_info, path, **kw))

    async def exists(self, path: str, **kw: Any) -> bool:
        return await _call(functools.partial(self._sync.exists, path, **kw))

    async def remove(self, path: str, **kw: Any) -> None:
        await _call(functools.partial(self._sync.remove, path, **kw))

    async def make_dir(self, path: str, **kw: Any) -> EntryInfo:
        return await _call(functools.partial(self._sync.make_dir, path, **kw))

    async def rename(self, old: str, new: str, **kw: Any) -> EntryInfo:
        return await _call(functools.partial(self._sync.rename, old, new, **kw))

    async def watch(self, path: str = "", *, recursive: bool = False, user: Optional[str] = None) -> "AsyncWatchHandle":
        """As :meth:`Files.watch`; iterate with ``async for``."""
        loop = asyncio.get_running_loop()
        q: "asyncio.Queue[Any]" = asyncio.Queue()

        def sink(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(q.put_nowait, item)
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more

        h = await _call(functools.partial(self._sync.watch, path, recursive=recursive, user=user, _sink=sink))
        return AsyncWatchHandle(h, q)


class AsyncWatchHandle:
    """A directory watch of an AsyncSandbox."""

    def __init__(self, handle: WatchHandle, q: "asyncio.Queue[Any]") -> None:
        self.sync = handle
        self._q = q
        self._done = False

    async def next(self, timeout: Optional[float] = None) -> Optional[FilesystemEvent]:
        """The next change; None once the watch ended. A timeout raises
        TimeoutError (the watch goes on)."""
        if self._done:
            return None
        try:
            item = await asyncio.wait_for(self._q.get(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError("no filesystem event within %gs" % (timeout or 0)) from None
        if item is _END:
            self._done = True
            return None
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item  # type: ignore[no-any-return]

    def __aiter__(self) -> "AsyncWatchHandle":
        return self

    async def __anext__(self) -> FilesystemEvent:
        ev = await self.next()
        if ev is None:
            raise StopAsyncIteration
        return ev

    async def close(self) -> None:
        self.sync.close()

    async def __aenter__(self) -> "AsyncWatchHandle":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.sync.close()


class AsyncPty:
    """``sbx.pty`` of an AsyncSandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sync = sandbox.pty

    async def create(self, **kw: Any) -> "AsyncPtySession":
        """As :meth:`Pty.create`."""
        s = await _call(functools.partial(self._sync.create, **kw))
        return AsyncPtySession(s, asyncio.get_running_loop())


class AsyncPtySession:
    """A terminal session of an AsyncSandbox. A reader thread takes the
    output off the connection as it comes."""

    def __init__(self, session: PtySession, loop: asyncio.AbstractEventLoop) -> None:
        self.sync = session
        self._q: "asyncio.Queue[Any]" = asyncio.Queue()
        self._loop = loop
        self._eof = False
        threading.Thread(target=self._read, daemon=True, name="airlock-pty").start()

    def _put(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._q.put_nowait, item)
        except RuntimeError:
            pass

    def _read(self) -> None:
        try:
            while True:
                b = self.sync.read()
                self._put(b)
                if not b:
                    return
        except BaseException as e:
            self._put(e)

    @property
    def exit(self) -> Optional[CommandResult]:
        return self.sync.exit

    async def read(self, timeout: Optional[float] = None) -> bytes:
        """The next terminal output, b"" once the session ended."""
        if self._eof:
            return b""
        try:
            item = await asyncio.wait_for(self._q.get(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError("no terminal output within %gs" % (timeout or 0)) from None
        if isinstance(item, BaseException):
            self._eof = True
            raise item
        if not item:
            self._eof = True
        return item  # type: ignore[no-any-return]

    async def write(self, data: Union[str, bytes]) -> None:
        await _call(self.sync.write, data)

    async def resize(self, cols: int, rows: int) -> None:
        await _call(self.sync.resize, cols, rows)

    async def wait(self, on_data: AsyncCallback = None) -> Optional[CommandResult]:
        while True:
            b = await self.read()
            if not b:
                return self.sync.exit
            if on_data is not None:
                r = on_data(b)
                if inspect.isawaitable(r):
                    await r

    async def close(self) -> None:
        await _call(self.sync.close)

    async def __aenter__(self) -> "AsyncPtySession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
