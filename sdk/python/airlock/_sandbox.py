"""The synchronous client: :class:`Sandbox` and its parts (commands, files,
terminals, code)."""

from __future__ import annotations

import base64
import codecs
import json
import os
import posixpath
import queue
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from . import _errors
from ._errors import AirlockError, ExecTimeout, InternalError, NotFound, TransportError
from ._models import (
    CodeContext,
    CommandResult,
    EntryInfo,
    Execution,
    ExecutionError,
    FilesystemEvent,
    Result,
    SandboxInfo,
    WriteInfo,
)
from ._transport import STREAM_IDLE, UNSET, Response, Transport, current_cancel, iter_ndjson, iter_sse, quote
from ._ws import OP_TEXT, WebSocket

__all__ = ["Sandbox", "Commands", "CommandHandle", "Files", "WatchHandle", "Pty", "PtySession"]

#: a command's timeout when run() is given none (seconds), as E2B's
DEFAULT_COMMAND_TIMEOUT = 60.0
#: how much longer than a command's own timeout the client waits for its
#: result: the server kills the process tree at the timeout and answers
_RESULT_GRACE = 30.0
#: a create may wait for the template's build (the server waits up to 10
#: minutes with wait_for_template)
_CREATE_TIMEOUT = 11 * 60.0
#: a code cell's timeout when none is given (the server's default)
_CELL_TIMEOUT = 300.0
#: how often a lost exec stream is re-attached before the call fails
#: (counted since the last attempt that delivered something)
_RESUME_ATTEMPTS = 5

Callback = Optional[Callable[[str], Any]]
Command = Union[str, Sequence[str]]
Data = Union[str, bytes, bytearray, memoryview, Any]


def home_of(user: Optional[str]) -> str:
    """The home directory of a sandbox user: ``/root`` for root, else
    ``/home/<user>`` (``/home/user`` for the default user)."""
    if user == "root":
        return "/root"
    return "/home/" + (user or "user")


def resolve(path: str, user: Optional[str] = None) -> str:
    """A sandbox path: absolute paths as they are, others relative to the
    user's home (``""`` and ``"."`` are the home itself)."""
    if path.startswith("/"):
        return path
    home = home_of(user)
    if path in ("", "."):
        return home
    return posixpath.join(home, path)


def _sbx_path(sandbox_id: str, *parts: str) -> str:
    return "/v1/sandboxes/" + quote(sandbox_id) + "".join("/" + p for p in parts)


def _network(v: Any) -> Optional[Dict[str, Any]]:
    if v is None:
        return None
    if isinstance(v, str):
        return {"mode": v}
    if isinstance(v, (list, tuple)):
        return {"mode": "allowlist", "allow": list(v)}
    if isinstance(v, Mapping):
        return dict(v)
    raise TypeError("network is a mode ('none', 'open'), a list of allowed hosts, or the API's network object")


class Sandbox:
    """A sandbox on an airlock server.

    Make one with :meth:`create` (or :meth:`connect` to an existing one).
    Used as a context manager it is deleted when the block ends, also when
    the block raised::

        with Sandbox.create(template="base") as sbx:
            print(sbx.commands.run("echo hi").stdout)
    """

    def __init__(self, info: SandboxInfo, transport: Transport) -> None:
        self._info = info
        self._transport = transport
        #: the sandbox's id (``sbx_…``)
        self.id = info.id
        self.commands = Commands(self)
        self.files = Files(self)
        self.pty = Pty(self)

    # -- making and finding sandboxes ------------------------------------

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        *,
        runtime: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        network: Any = None,
        ttl: Optional[int] = None,
        cpu: Optional[float] = None,
        memory_mb: Optional[int] = None,
        disk_mb: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        wait_for_template: bool = True,
        idempotency_key: Optional[str] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: float = 60.0,
        **extra: Any,
    ) -> "Sandbox":
        """Creates a sandbox and returns once it is ready to run commands.

        template: ``base`` (the server's default), ``python``, ``node``,
        ``code-interpreter`` or one of the tenant's; ``name@N`` pins a
        version. runtime: ``runc`` | ``gvisor`` | …: one the host lacks is
        :class:`RuntimeUnavailable`, never a silent fallback. env: the
        sandbox's environment; secrets: environment variables whose values
        are masked in output and logs. network: ``"none"`` (default),
        ``"open"``, a list of allowed hosts (``["pypi.org",
        "10.0.0.0/8:443"]``) or the API's ``{"mode", "allow", …}``. ttl:
        seconds until the server deletes the sandbox (its ``timeout_s``).
        wait_for_template: when the template is still being built, wait
        for the build (else :class:`TemplateBuilding`). Other keyword
        arguments are sent as fields of the API's create request
        (``volumes``, ``lifecycle``, ``pool``, …). url and api_key default
        to ``AIRLOCK_URL`` and ``AIRLOCK_API_KEY``.
        """
        body: Dict[str, Any] = {}
        if template:
            body["template"] = template
        if runtime:
            body["runtime"] = runtime
        if env:
            body["env"] = dict(env)
        if secrets:
            body["secrets"] = dict(secrets)
        net = _network(network)
        if net is not None:
            body["network"] = net
        if ttl is not None:
            body["timeout_s"] = int(ttl)
        res = {k: v for k, v in (("cpu", cpu), ("memory_mb", memory_mb), ("disk_mb", disk_mb)) if v is not None}
        if res:
            body["resources"] = res
        if metadata:
            body["metadata"] = dict(metadata)
        if wait_for_template:
            body["wait_for_template"] = True
        body.update(extra)
        tr = Transport(url, api_key, timeout=request_timeout)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        try:
            d = tr.call(
                "POST", "/v1/sandboxes", json_body=body, headers=headers,
                timeout=_CREATE_TIMEOUT if wait_for_template else request_timeout,
            )
        except BaseException:
            tr.close()
            raise
        return cls(SandboxInfo.from_json(d), tr)

    @classmethod
    def connect(cls, sandbox_id: str, *, url: Optional[str] = None, api_key: Optional[str] = None, request_timeout: float = 60.0) -> "Sandbox":
        """A handle on an existing sandbox (:class:`SandboxNotFound` if it
        is not there, or is another tenant's)."""
        tr = Transport(url, api_key, timeout=request_timeout)
        try:
            d = tr.call("GET", _sbx_path(sandbox_id))
        except BaseException:
            tr.close()
            raise
        return cls(SandboxInfo.from_json(d), tr)

    @classmethod
    def list(
        cls,
        *,
        state: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        limit: Optional[int] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> List[SandboxInfo]:
        """The key's sandboxes (every page), optionally only those in a
        state or whose metadata has the given values; at most limit."""
        tr = Transport(url, api_key)
        out: List[SandboxInfo] = []
        cursor: Optional[str] = None
        try:
            while True:
                q: Dict[str, Any] = {"state": state, "cursor": cursor}
                if limit is not None:
                    q["limit"] = min(limit - len(out), 1000)
                for k, v in (metadata or {}).items():
                    q["metadata." + k] = v
                page = tr.call("GET", "/v1/sandboxes", query=q) or {}
                for d in page.get("sandboxes") or []:
                    out.append(SandboxInfo.from_json(d))
                cursor = page.get("next_cursor")
                if not cursor or (limit is not None and len(out) >= limit):
                    return out[:limit] if limit is not None else out
        finally:
            tr.close()

    # -- this sandbox ----------------------------------------------------

    @property
    def sandbox_id(self) -> str:
        return self.id

    @property
    def info(self) -> SandboxInfo:
        """What the server said last (see :meth:`get_info`)."""
        return self._info

    @property
    def template(self) -> str:
        return self._info.template

    @property
    def runtime(self) -> str:
        """The runtime the sandbox got (``runc``, ``gvisor``, …)."""
        return self._info.runtime

    @property
    def state(self) -> str:
        return self._info.state

    def get_info(self) -> SandboxInfo:
        """Asks the server for the sandbox's current description."""
        self._info = SandboxInfo.from_json(self._transport.call("GET", _sbx_path(self.id)))
        return self._info

    def is_running(self) -> bool:
        try:
            return self.get_info().state == "running"
        except NotFound:
            return False

    def kill(self) -> None:
        """Deletes the sandbox: every process, file and secret of it.
        Deleting one already gone is not an error."""
        try:
            self._transport.call("DELETE", _sbx_path(self.id))
        except NotFound:
            pass

    def set_ttl(self, seconds: int) -> SandboxInfo:
        """Makes the sandbox expire that many seconds from now."""
        self._info = SandboxInfo.from_json(self._transport.call("POST", _sbx_path(self.id, "timeout"), json_body={"timeout_s": int(seconds)}))
        return self._info

    def pause(self) -> SandboxInfo:
        """Freezes every process; paused time does not count against the
        ttl. Commands and files answer :class:`InvalidState` until resume."""
        self._info = SandboxInfo.from_json(self._transport.call("POST", _sbx_path(self.id, "pause")))
        return self._info

    def resume(self) -> SandboxInfo:
        """Thaws a paused sandbox."""
        self._info = SandboxInfo.from_json(self._transport.call("POST", _sbx_path(self.id, "resume")))
        return self._info

    def metrics(self) -> Dict[str, Any]:
        """Resource use now (cpu_seconds, memory_bytes, …)."""
        return self._transport.call("GET", _sbx_path(self.id, "metrics")) or {}

    def close(self) -> None:
        """Closes the handle's connections (the sandbox goes on)."""
        self._transport.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.kill()
        finally:
            self.close()

    def __repr__(self) -> str:
        return "Sandbox(id=%r, template=%r, runtime=%r)" % (self.id, self.template, self.runtime)

    # -- code interpreter ------------------------------------------------

    def run_code(
        self,
        code: str,
        *,
        language: Optional[str] = None,
        context: Union[CodeContext, str, None] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        on_stdout: Callback = None,
        on_stderr: Callback = None,
        on_result: Optional[Callable[[Result], Any]] = None,
        on_error: Optional[Callable[[ExecutionError], Any]] = None,
    ) -> Execution:
        """Runs a cell in a stateful context (needs a template with a
        kernel: ``code-interpreter``) and returns its outcome. language:
        ``python`` (default), ``javascript`` or ``bash``, in that
        language's default context unless context names one. Callbacks get
        each event as it comes. An exception in the cell is
        ``Execution.error``, not an exception of the call."""
        body: Dict[str, Any] = {"code": code}
        if language:
            body["language"] = language
        if context is not None:
            body["context_id"] = context.id if isinstance(context, CodeContext) else context
        if timeout is not None:
            body["timeout_s"] = timeout
        if env:
            body["env"] = dict(env)
        wait = (timeout if timeout else _CELL_TIMEOUT) + _RESULT_GRACE
        resp = self._transport.open(
            "POST", _sbx_path(self.id, "code"),
            body=json.dumps(body).encode("utf-8"),
            headers={"Content-Type": "application/json", "Accept": "application/x-ndjson"},
            timeout=wait,
        )
        out = Execution()
        stdout: List[str] = []
        stderr: List[str] = []
        with resp:
            ended = False
            for ev in iter_ndjson(resp):
                if not isinstance(ev, dict):
                    continue
                t = ev.get("type")
                if t == "stdout":
                    s = str(ev.get("text") or "")
                    stdout.append(s)
                    if on_stdout is not None:
                        on_stdout(s)
                elif t == "stderr":
                    s = str(ev.get("text") or "")
                    stderr.append(s)
                    if on_stderr is not None:
                        on_stderr(s)
                elif t == "result":
                    r = Result.from_json(ev)
                    out.results.append(r)
                    if on_result is not None:
                        on_result(r)
                elif t == "error":
                    e = ExecutionError(str(ev.get("name") or ""), str(ev.get("value") or ""), str(ev.get("traceback") or ""))
                    if out.error is None:
                        out.error = e
                    if on_error is not None:
                        on_error(e)
                elif t == "end":
                    out.execution_count = int(ev.get("execution_count") or 0)
                    ended = True
                    break
            if ended:
                resp.read()  # the body's end: the connection is reused
        if not ended:
            raise TransportError("code stream ended without an end event")
        out.stdout, out.stderr = "".join(stdout), "".join(stderr)
        return out

    def create_code_context(self, language: str = "python", *, cwd: Optional[str] = None) -> CodeContext:
        """A new context (its own kernel and state); cwd relative to the
        user's home."""
        body: Dict[str, Any] = {"language": language}
        if cwd:
            body["cwd"] = resolve(cwd)
        return CodeContext.from_json(self._transport.call("POST", _sbx_path(self.id, "contexts"), json_body=body))

    def list_code_contexts(self) -> List[CodeContext]:
        d = self._transport.call("GET", _sbx_path(self.id, "contexts")) or {}
        return [CodeContext.from_json(c) for c in d.get("contexts") or []]

    def restart_code_context(self, context: Union[CodeContext, str]) -> CodeContext:
        """A fresh kernel for the context (its state is lost)."""
        cid = context.id if isinstance(context, CodeContext) else context
        return CodeContext.from_json(self._transport.call("POST", _sbx_path(self.id, "contexts", quote(cid), "restart")))

    def remove_code_context(self, context: Union[CodeContext, str]) -> None:
        cid = context.id if isinstance(context, CodeContext) else context
        self._transport.call("DELETE", _sbx_path(self.id, "contexts", quote(cid)))


# -- commands ---------------------------------------------------------------


class _Stream:
    """What an exec stream knows to deliver output once and re-attach: the
    exec, the offset of the next byte not delivered, and the output so far."""

    def __init__(self, sbx: Sandbox, on_stdout: Callback, on_stderr: Callback, exec_id: str = "") -> None:
        self.sbx = sbx
        self.exec_id = exec_id
        self.next = 0
        self.progressed = False
        self.out = {"stdout": bytearray(), "stderr": bytearray()}
        self.cb = {"stdout": on_stdout, "stderr": on_stderr}
        self.dec = {
            "stdout": codecs.getincrementaldecoder("utf-8")("replace"),
            "stderr": codecs.getincrementaldecoder("utf-8")("replace"),
        }

    def handle(self, event: str, data: str) -> Optional[CommandResult]:
        if event == "start":
            d = json.loads(data)
            if not self.exec_id:
                self.exec_id = str(d.get("id") or "")
            return None
        if event in ("stdout", "stderr"):
            d = json.loads(data)
            chunk = d.get("data") or ""
            b = base64.b64decode(chunk) if d.get("encoding") == "base64" else chunk.encode("utf-8")
            off = int(d.get("offset") or 0)
            # After a re-attach the server may replay from the start of a
            # chunk already delivered in part: skip what was seen.
            if off < self.next:
                skip = self.next - off
                if skip >= len(b):
                    return None
                b, off = b[skip:], self.next
            if not b:
                return None
            self.next = off + len(b)
            self.progressed = True
            self.out[event] += b
            cb = self.cb[event]
            if cb is not None:
                text = self.dec[event].decode(b)
                if text:
                    cb(text)
            return None
        if event == "exit":
            d = json.loads(data)
            if not d.get("id"):
                d["id"] = self.exec_id
            for name in ("stdout", "stderr"):
                cb = self.cb[name]
                rest = self.dec[name].decode(b"", final=True)
                if cb is not None and rest:
                    cb(rest)
            if d.get("truncated"):
                # What streamed past the cap were samples; the record
                # holds the kept head and tail, as the JSON result does.
                rec = self.sbx._transport.call("GET", _sbx_path(self.sbx.id, "execs", quote(self.exec_id)))
                return CommandResult.from_json(rec)
            return CommandResult.from_json(d, bytes(self.out["stdout"]), bytes(self.out["stderr"]))
        if event == "error":
            raise _errors.from_stream_error(data)
        return None  # unknown events are for newer clients

    def open_events(self) -> Response:
        return self.sbx._transport.open(
            "GET", _sbx_path(self.sbx.id, "execs", quote(self.exec_id), "events"),
            query={"from_offset": self.next}, headers={"Accept": "text/event-stream"}, timeout=STREAM_IDLE,
        )

    def follow(self, first: Optional[Callable[[], Response]]) -> CommandResult:
        """Reads the stream to the exit event, re-attaching after a drop."""
        opener = first or self.open_events
        failures = 0
        cancel = current_cancel.get()
        while True:
            err: AirlockError
            try:
                resp = opener()
            except TransportError as e:
                err = e
            else:
                with resp:
                    if resp.content_type != "text/event-stream":
                        raise InternalError("exec stream: server answered %r, not text/event-stream" % resp.content_type)
                    resp.settimeout(STREAM_IDLE)
                    try:
                        for ev in iter_sse(resp):
                            res = self.handle(ev.event, ev.data)
                            if res is not None:
                                resp.read()  # the body's end: the connection is reused
                                return res
                        err = TransportError("exec stream ended without an exit event")
                    except TransportError as e:
                        err = e
            if cancel is not None and cancel.cancelled:
                raise err
            if not self.exec_id:
                # Without an id there is nothing to re-attach to, and
                # sending the exec again could run the command twice.
                raise TransportError("exec stream ended before the exec started: %s" % err.message) from err
            if self.progressed:
                failures, self.progressed = 0, False
            failures += 1
            if failures > _RESUME_ATTEMPTS:
                raise TransportError("exec %s: stream lost after %d attempts: %s" % (self.exec_id, failures, err.message)) from err
            time.sleep(min(0.1 * (2 ** (failures - 1)), 5.0))
            opener = self.open_events


def _timed_out(res: CommandResult, timeout: Optional[float], sandbox_id: str) -> ExecTimeout:
    what = "command timed out" if not timeout else "command timed out after %gs" % timeout
    return ExecTimeout(what, result=res, sandbox_id=sandbox_id)


class Commands:
    """Runs commands in the sandbox (``sbx.commands``)."""

    def __init__(self, sbx: Sandbox) -> None:
        self._sbx = sbx

    def _request(
        self,
        cmd: Command,
        timeout: Optional[float],
        user: Optional[str],
        cwd: Optional[str],
        env: Optional[Mapping[str, str]],
        stdin: Optional[str],
        max_output_bytes: Optional[int],
    ) -> Dict[str, Any]:
        body: Dict[str, Any] = {}
        if isinstance(cmd, str):
            body["shell"] = cmd
        else:
            argv = list(cmd)
            if not argv or not all(isinstance(a, str) for a in argv):
                raise TypeError("cmd is a shell string or a non-empty list of strings (argv)")
            body["cmd"] = argv
        if timeout:
            body["timeout_s"] = timeout
        if user:
            body["user"] = user
        if cwd:
            body["cwd"] = resolve(cwd, user)
        if env:
            body["env"] = dict(env)
        if stdin is not None:
            body["stdin"] = stdin
        if max_output_bytes is not None:
            body["max_output_bytes"] = int(max_output_bytes)
        return body

    def run(
        self,
        cmd: Command,
        *,
        background: bool = False,
        on_stdout: Callback = None,
        on_stderr: Callback = None,
        timeout: Optional[float] = DEFAULT_COMMAND_TIMEOUT,
        user: Optional[str] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Optional[str] = None,
        max_output_bytes: Optional[int] = None,
    ) -> Any:
        """Runs cmd: a string is run by ``/bin/sh -c``, a list is argv (no
        shell). Waits for it and returns a :class:`CommandResult`
        (``stdout``, ``stderr``, ``exit_code``), also when on_stdout /
        on_stderr stream the output as it comes (as text). timeout (seconds,
        default 60; None: no limit) is enforced by the server, which kills
        the whole process tree: then :class:`ExecTimeout` is raised, with
        the output so far in its ``result``. user defaults to the
        template's (``user``); cwd (relative: to the user's home) to its
        workdir. background=True returns a :class:`CommandHandle` at once.
        """
        body = self._request(cmd, timeout, user, cwd, env, stdin, max_output_bytes)
        sbx = self._sbx
        if background:
            d = sbx._transport.call("POST", _sbx_path(sbx.id, "exec"), query={"async": True}, json_body=body)
            eid = str((d or {}).get("id") or "")
            if not eid:
                raise InternalError("server returned no exec id")
            return CommandHandle(sbx, eid, on_stdout, on_stderr, timeout)
        if on_stdout is None and on_stderr is None and timeout:
            # One JSON round trip; the socket waits a little past the
            # command's own timeout.
            d = sbx._transport.call("POST", _sbx_path(sbx.id, "exec"), json_body=body, timeout=timeout + _RESULT_GRACE)
            res = CommandResult.from_json(d)
        else:
            # Streamed: output as it happens, heartbeats keep a long
            # command's connection checked.
            payload = json.dumps(body).encode("utf-8")

            def first() -> Response:
                return sbx._transport.open(
                    "POST", _sbx_path(sbx.id, "exec"), body=payload,
                    headers={"Content-Type": "application/json", "Accept": "text/event-stream"}, timeout=STREAM_IDLE,
                )

            res = _Stream(sbx, on_stdout, on_stderr).follow(first)
        if res.status == "timeout":
            raise _timed_out(res, timeout, sbx.id)
        return res

    def connect(self, exec_id: str, *, on_stdout: Callback = None, on_stderr: Callback = None) -> "CommandHandle":
        """A handle on a command already running (or ended): its output is
        replayed from the start."""
        return CommandHandle(self._sbx, exec_id, on_stdout, on_stderr, None)

    def list(self, *, limit: Optional[int] = None) -> List[CommandResult]:
        """The sandbox's exec records, newest first."""
        d = self._sbx._transport.call("GET", _sbx_path(self._sbx.id, "execs"), query={"limit": limit}) or {}
        return [CommandResult.from_json(e) for e in d.get("execs") or []]

    def kill(self, exec_id: str, signal: str = "SIGKILL") -> bool:
        """Sends signal to the command's whole process tree; False when the
        command is gone already."""
        try:
            self._sbx._transport.call("POST", _sbx_path(self._sbx.id, "execs", quote(exec_id), "signal"), json_body={"signal": signal})
            return True
        except (NotFound, _errors.InvalidState):
            return False

    def send_stdin(self, exec_id: str, data: Union[str, bytes], *, eof: bool = False) -> None:
        """Writes to the command's stdin (open for background commands that
        were given no stdin); eof closes it after."""
        b = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self._sbx._transport.call(
            "POST", _sbx_path(self._sbx.id, "execs", quote(exec_id), "stdin"),
            query={"eof": True} if eof else None, body=b, headers={"Content-Type": "application/octet-stream"},
        )


class CommandHandle:
    """A command running in the background (``run(…, background=True)``).
    With on_stdout / on_stderr its output is delivered from a thread as it
    comes; :meth:`wait` returns its result."""

    def __init__(self, sbx: Sandbox, exec_id: str, on_stdout: Callback, on_stderr: Callback, timeout: Optional[float]) -> None:
        self._sbx = sbx
        #: the exec's id (``ex_…``)
        self.exec_id = exec_id
        self._timeout = timeout
        self._result: Optional[CommandResult] = None
        self._exc: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        if on_stdout is not None or on_stderr is not None:
            self._thread = threading.Thread(target=self._follow, args=(on_stdout, on_stderr), daemon=True, name="airlock-" + exec_id)
            self._thread.start()

    @property
    def id(self) -> str:
        return self.exec_id

    def _follow(self, on_stdout: Callback, on_stderr: Callback) -> None:
        try:
            self._result = _Stream(self._sbx, on_stdout, on_stderr, self.exec_id).follow(None)
        except BaseException as e:  # delivered by wait()
            self._exc = e

    def wait(self, *, on_stdout: Callback = None, on_stderr: Callback = None) -> CommandResult:
        """Waits for the command to end and returns its result (raising
        :class:`ExecTimeout` if it ran past its timeout). Callbacks given
        here get the output from the start, unless the handle streams
        already."""
        if self._thread is not None:
            self._thread.join()
            if self._exc is not None:
                raise self._exc
        elif self._result is None:
            self._result = _Stream(self._sbx, on_stdout, on_stderr, self.exec_id).follow(None)
        assert self._result is not None
        if self._result.status == "timeout":
            raise _timed_out(self._result, self._timeout, self._sbx.id)
        return self._result

    def kill(self) -> bool:
        """SIGKILL to the command's whole process tree; False when it had
        ended already."""
        return self._sbx.commands.kill(self.exec_id)

    def signal(self, signal: str) -> bool:
        """Sends a signal (``"SIGTERM"``, …) to the command's process tree."""
        return self._sbx.commands.kill(self.exec_id, signal)

    def send_stdin(self, data: Union[str, bytes], *, eof: bool = False) -> None:
        """Writes to the command's stdin; eof closes it after."""
        self._sbx.commands.send_stdin(self.exec_id, data, eof=eof)

    def close_stdin(self) -> None:
        """Closes the command's stdin: it reads EOF."""
        self._sbx.commands.send_stdin(self.exec_id, b"", eof=True)


# -- files --------------------------------------------------------------------


class Files:
    """The sandbox's files (``sbx.files``). Relative paths are relative to
    the user's home (``/home/user``; ``/root`` for ``user="root"``)."""

    def __init__(self, sbx: Sandbox) -> None:
        self._sbx = sbx

    def _path(self, *parts: str) -> str:
        return _sbx_path(self._sbx.id, *parts)

    def read(self, path: str, *, format: str = "text", user: Optional[str] = None) -> Any:
        """The file's content: ``format="text"`` (UTF-8, the default) or
        ``"bytes"``. A directory comes as a tar archive (bytes)."""
        if format not in ("text", "bytes"):
            raise ValueError("format is 'text' or 'bytes'")
        with self._sbx._transport.open(
            "GET", self._path("files"), query={"path": resolve(path, user), "user": user},
            headers={"Accept": "application/octet-stream"},
        ) as resp:
            data = resp.read()
        return data.decode("utf-8", "replace") if format == "text" else data

    def write(self, path: str, data: Data, *, mode: Optional[int] = None, user: Optional[str] = None) -> WriteInfo:
        """Writes data (str as UTF-8, bytes, or a binary file object) to
        path, creating its parent directories. mode: permission bits
        (default 0o644)."""
        if isinstance(data, str):
            body: Any = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            body = bytes(data)
        elif hasattr(data, "read"):
            body = data
        else:
            raise TypeError("data is str, bytes or a binary file object")
        headers = {"Content-Type": "application/octet-stream"}
        if not isinstance(body, bytes):
            try:
                size = os.fstat(body.fileno()).st_size - body.tell()
                headers["Content-Length"] = str(size)
            except (AttributeError, OSError, ValueError):
                pass  # sent chunked
        q: Dict[str, Any] = {"path": resolve(path, user), "user": user}
        if mode is not None:
            q["mode"] = "%04o" % (mode & 0o7777)
        d = self._sbx._transport.call("PUT", self._path("files"), query=q, body=body, headers=headers) or {}
        return WriteInfo(path=str(d.get("path") or q["path"]), size=int(d.get("size") or 0))

    def list(self, path: str = "", *, depth: int = 1, user: Optional[str] = None) -> List[EntryInfo]:
        """The entries of a directory, depth levels deep."""
        d = self._sbx._transport.call(
            "GET", self._path("fs", "list"), query={"path": resolve(path, user), "depth": depth, "user": user},
        ) or {}
        return [EntryInfo.from_json(e) for e in d.get("entries") or []]

    def get_info(self, path: str, *, user: Optional[str] = None) -> EntryInfo:
        """Describes path (a symlink itself, not its target)."""
        return EntryInfo.from_json(self._sbx._transport.call("GET", self._path("fs", "stat"), query={"path": resolve(path, user), "user": user}))

    def exists(self, path: str, *, user: Optional[str] = None) -> bool:
        try:
            self.get_info(path, user=user)
            return True
        except NotFound:
            return False

    def remove(self, path: str, *, recursive: bool = False, user: Optional[str] = None) -> None:
        """Removes a file, or a directory (a non-empty one with recursive)."""
        self._sbx._transport.call(
            "DELETE", self._path("fs"), query={"path": resolve(path, user), "recursive": True if recursive else None, "user": user},
        )

    def make_dir(self, path: str, *, user: Optional[str] = None) -> EntryInfo:
        """Creates a directory with its parents."""
        body: Dict[str, Any] = {"path": resolve(path, user)}
        if user:
            body["user"] = user
        return EntryInfo.from_json(self._sbx._transport.call("POST", self._path("fs", "mkdir"), json_body=body))

    def rename(self, old: str, new: str, *, user: Optional[str] = None) -> EntryInfo:
        body: Dict[str, Any] = {"from": resolve(old, user), "to": resolve(new, user)}
        if user:
            body["user"] = user
        return EntryInfo.from_json(self._sbx._transport.call("POST", self._path("fs", "move"), json_body=body))

    def watch(
        self, path: str = "", *, recursive: bool = False, user: Optional[str] = None, _sink: Optional[Callable[[Any], None]] = None,
    ) -> "WatchHandle":
        """Watches a directory; returns once the watch is in place, so every
        later change is reported. Iterate the handle, or call
        :meth:`WatchHandle.next` with a timeout; close it when done."""
        resp = self._sbx._transport.open(
            "GET", self._path("fs", "watch"),
            query={"path": resolve(path, user), "recursive": True if recursive else None, "user": user},
            headers={"Accept": "text/event-stream"}, timeout=STREAM_IDLE,
        )
        try:
            if resp.content_type != "text/event-stream":
                raise InternalError("watch: server answered %r, not text/event-stream" % resp.content_type)
            events = iter_sse(resp)
            first = next(events, None)
            if first is None or first.event != "start":
                if first is not None and first.event == "error":
                    raise _errors.from_stream_error(first.data)
                raise TransportError("watch: the stream did not start")
        except BaseException:
            resp.close()
            raise
        return WatchHandle(resp, events, _sink)


_END = object()


class WatchHandle:
    """A running directory watch. A reader thread takes the events off the
    connection as they come; iterate, or call :meth:`next`."""

    def __init__(self, resp: Response, events: Iterator[Any], sink: Optional[Callable[[Any], None]] = None) -> None:
        self._resp = resp
        self._q: "queue.Queue[Any]" = queue.Queue()
        # sink (the asyncio client's) takes the items instead of the queue
        self._put: Callable[[Any], None] = sink or self._q.put
        self._closed = False
        self._done = False
        self._thread = threading.Thread(target=self._read, args=(events,), daemon=True, name="airlock-watch")
        self._thread.start()

    def _read(self, events: Iterator[Any]) -> None:
        try:
            for ev in events:
                if ev.event == "end":
                    break
                if ev.event == "error":
                    self._put(_errors.from_stream_error(ev.data))
                    return
                if ev.event in ("create", "write", "remove", "rename", "chmod", "overflow"):
                    self._put(FilesystemEvent.from_json(json.loads(ev.data)))
            else:
                if not self._closed:
                    self._put(TransportError("watch stream ended without its end event"))
                    return
            self._put(_END)
        except BaseException as e:
            self._put(_END if self._closed else e)
        finally:
            self._resp.close()

    def next(self, timeout: Optional[float] = None) -> Optional[FilesystemEvent]:
        """The next change; None once the watch ended (the directory was
        removed or moved away, or close was called). A timeout raises
        TimeoutError (the watch goes on)."""
        if self._done:
            return None
        try:
            item = self._q.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("no filesystem event within %gs" % (timeout or 0)) from None
        if item is _END:
            self._done = True
            return None
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[FilesystemEvent]:
        while True:
            ev = self.next()
            if ev is None:
                return
            yield ev

    def close(self) -> None:
        """Ends the watch."""
        if not self._closed:
            self._closed = True
            self._resp.abort()
            self._put(_END)

    def __enter__(self) -> "WatchHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- terminals ----------------------------------------------------------------


class Pty:
    """Interactive terminals in the sandbox (``sbx.pty``)."""

    def __init__(self, sbx: Sandbox) -> None:
        self._sbx = sbx

    def create(
        self,
        *,
        cols: int = 80,
        rows: int = 24,
        cmd: Optional[Command] = None,
        user: Optional[str] = None,
        cwd: Optional[str] = None,
        timeout: float = 30.0,
    ) -> "PtySession":
        """Opens a terminal of cols x rows running cmd (a list is argv, a
        string is run by ``/bin/sh -c``; default: the user's login shell)."""
        tr = self._sbx._transport
        q: Dict[str, Any] = {"cols": cols, "rows": rows, "user": user}
        if cmd is not None:
            q["cmd"] = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if cwd:
            q["cwd"] = resolve(cwd, user)
        target = tr.target(_sbx_path(self._sbx.id, "pty"), q)
        ws = WebSocket.connect(tr.host, tr.port, target, tr.auth_headers(), timeout=timeout, ssl_context=tr.ssl_context())
        return PtySession(ws)


class PtySession:
    """A terminal session: bytes in with :meth:`write`, out with
    :meth:`read`; when its process ends the server reports the outcome
    (:attr:`exit`) and closes. Closing the session hangs up the terminal
    (its process gets SIGHUP)."""

    def __init__(self, ws: WebSocket) -> None:
        self._ws = ws
        #: the terminal process's outcome, once it ended
        self.exit: Optional[CommandResult] = None

    def read(self, timeout: Optional[float] = None) -> bytes:
        """The next terminal output, b"" once the session ended. A timeout
        raises TimeoutError (nothing is lost)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            msg = self._ws.recv(left)
            if msg is None:
                return b""
            op, payload = msg
            if op == OP_TEXT:
                try:
                    d = json.loads(payload)
                except ValueError:
                    continue
                if isinstance(d, dict) and isinstance(d.get("exit"), dict):
                    self.exit = CommandResult.from_json(d["exit"])
                continue
            if payload:
                return payload

    def write(self, data: Union[str, bytes]) -> None:
        """Sends keystrokes (str as UTF-8)."""
        self._ws.send_binary(data.encode("utf-8") if isinstance(data, str) else bytes(data))

    def resize(self, cols: int, rows: int) -> None:
        self._ws.send_text(json.dumps({"resize": {"cols": int(cols), "rows": int(rows)}}))

    def wait(self, on_data: Optional[Callable[[bytes], Any]] = None, timeout: Optional[float] = None) -> Optional[CommandResult]:
        """Reads until the session ends (passing output to on_data) and
        returns the process's outcome."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            b = self.read(left)
            if not b:
                return self.exit
            if on_data is not None:
                on_data(b)

    def __iter__(self) -> Iterator[bytes]:
        while True:
            b = self.read()
            if not b:
                return
            yield b

    @property
    def closed(self) -> bool:
        return self._ws.closed

    def close(self) -> None:
        """Ends the session (the closing handshake)."""
        self._ws.close()

    def __enter__(self) -> "PtySession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
