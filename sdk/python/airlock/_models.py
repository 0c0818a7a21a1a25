"""The values the SDK returns: plain dataclasses built from the API's JSON
(each keeps the server's whole object in ``raw``, so fields a newer server
adds are not lost)."""

from __future__ import annotations

import base64
import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional


def parse_time(v: Any) -> Optional[_dt.datetime]:
    """An RFC 3339 time of the API as an aware datetime (None if absent)."""
    if not isinstance(v, str) or not v:
        return None
    s = v.strip()
    if s.endswith("Z") or s.endswith("z"):
        s = s[:-1] + "+00:00"
    # fromisoformat (3.9, 3.10) takes at most 6 fractional digits; Go
    # writes up to 9.
    if "." in s:
        head, _, frac = s.partition(".")
        digits = ""
        i = 0
        while i < len(frac) and frac[i].isdigit():
            digits += frac[i]
            i += 1
        s = head + "." + (digits + "000000")[:6] + frac[i:]
    try:
        return _dt.datetime.fromisoformat(s)
    except ValueError:
        return None


@dataclass
class SandboxInfo:
    """A sandbox as the server describes it (``GET /v1/sandboxes/{id}``)."""

    id: str
    template: str
    runtime: str
    state: str
    tenant: str = ""
    template_version: int = 0
    created_at: Optional[_dt.datetime] = None
    expires_at: Optional[_dt.datetime] = None
    metadata: Dict[str, str] = field(default_factory=dict)
    resources: Dict[str, Any] = field(default_factory=dict)
    network: Dict[str, Any] = field(default_factory=dict)
    ready_ms: int = 0
    #: ``{"code", "message"}`` when state is ``error``
    error: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SandboxInfo":
        return cls(
            id=str(d.get("id", "")),
            template=str(d.get("template", "")),
            runtime=str(d.get("runtime", "")),
            state=str(d.get("state", "")),
            tenant=str(d.get("tenant", "")),
            template_version=int(d.get("template_version") or 0),
            created_at=parse_time(d.get("created_at")),
            expires_at=parse_time(d.get("expires_at")),
            metadata=dict(d.get("metadata") or {}),
            resources=dict(d.get("resources") or {}),
            network=dict(d.get("network") or {}),
            ready_ms=int(d.get("ready_ms") or 0),
            error=d.get("error") or None,
            raw=dict(d),
        )


def _decode(v: Any, encoding: str) -> bytes:
    if not isinstance(v, str):
        return b""
    if encoding == "base64":
        return base64.b64decode(v)
    return v.encode("utf-8")


@dataclass
class CommandResult:
    """The outcome of a command. A non-zero exit is a result, not an
    error: check ``exit_code`` (and ``status``)."""

    #: the exec's id (``ex_…``)
    exec_id: str
    #: the process's exit code; None when it did not exit by itself
    exit_code: Optional[int]
    #: ``exited`` | ``timeout`` | ``killed`` | ``oom`` | ``error``
    status: str
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    #: output was over ``max_output_bytes``: the middle of a stream was dropped
    truncated: bool = False
    duration_ms: int = 0
    #: why the exec did not exit on its own (``exec_timeout``, ``exec_failed``, …)
    error_code: str = ""
    #: the reason, for ``status == "error"`` (e.g. the executable is missing)
    error: str = ""
    signal: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def stdout(self) -> str:
        """stdout as text (UTF-8; bytes that are not are replaced)."""
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """stderr as text (UTF-8; bytes that are not are replaced)."""
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """The command exited with status 0."""
        return self.status == "exited" and self.exit_code == 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any], stdout: Optional[bytes] = None, stderr: Optional[bytes] = None) -> "CommandResult":
        enc = str(d.get("encoding") or "")
        ec = d.get("exit_code")
        return cls(
            exec_id=str(d.get("id", "")),
            exit_code=int(ec) if isinstance(ec, int) else None,
            status=str(d.get("status", "")),
            stdout_bytes=stdout if stdout is not None else _decode(d.get("stdout"), enc),
            stderr_bytes=stderr if stderr is not None else _decode(d.get("stderr"), enc),
            truncated=bool(d.get("truncated")),
            duration_ms=int(d.get("duration_ms") or 0),
            error_code=str(d.get("error_code") or ""),
            error=str(d.get("error") or ""),
            signal=str(d.get("signal") or ""),
            raw=dict(d),
        )


@dataclass
class WriteInfo:
    """A file written (``PUT …/files``)."""

    path: str
    size: int


@dataclass
class EntryInfo:
    """A file or directory in the sandbox."""

    name: str
    #: absolute path in the sandbox
    path: str
    #: ``file`` | ``dir`` | ``symlink`` | ``other``
    type: str
    size: int = 0
    #: octal permission bits, e.g. ``"0644"``
    mode: str = ""
    uid: int = 0
    gid: int = 0
    modified_at: Optional[_dt.datetime] = None
    link_target: str = ""

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "EntryInfo":
        return cls(
            name=str(d.get("name", "")),
            path=str(d.get("path", "")),
            type=str(d.get("type", "")),
            size=int(d.get("size") or 0),
            mode=str(d.get("mode") or ""),
            uid=int(d.get("uid") or 0),
            gid=int(d.get("gid") or 0),
            modified_at=parse_time(d.get("modified_at")),
            link_target=str(d.get("link_target") or ""),
        )


@dataclass
class FilesystemEvent:
    """One change below a watched directory."""

    #: ``create`` | ``write`` | ``remove`` | ``rename`` | ``chmod`` | ``overflow``
    #: (overflow: events were lost, list the directory again)
    type: str
    #: absolute sandbox path ("" for overflow)
    path: str = ""
    #: a rename's old path
    from_path: str = ""
    is_dir: bool = False
    time: Optional[_dt.datetime] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "FilesystemEvent":
        return cls(
            type=str(d.get("type", "")),
            path=str(d.get("path") or ""),
            from_path=str(d.get("from") or ""),
            is_dir=bool(d.get("dir")),
            time=parse_time(d.get("time")),
        )


def _b64(v: Any) -> Optional[bytes]:
    if not isinstance(v, str) or not v:
        return None
    return base64.b64decode(v)


@dataclass
class Result:
    """One result of a code cell: the value of its last expression
    (``is_main_result``), a ``display()`` output or a figure, in each
    representation it has."""

    is_main_result: bool = False
    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    #: PNG bytes (decoded from the API's base64)
    png: Optional[bytes] = None
    #: JPEG bytes
    jpeg: Optional[bytes] = None
    latex: Optional[str] = None
    #: an application/json representation, parsed
    json: Any = None
    javascript: Optional[str] = None
    #: a matplotlib figure's data (E2B's chart shape), parsed
    chart: Any = None
    #: a pandas DataFrame's columns, parsed
    data: Any = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    def formats(self) -> List[str]:
        """The representations present, e.g. ``["text", "png"]``."""
        names = ["text", "html", "markdown", "svg", "png", "jpeg", "latex", "json", "javascript", "chart", "data"]
        return [n for n in names if getattr(self, n) is not None]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Result":
        return cls(
            is_main_result=bool(d.get("is_main_result")),
            text=d.get("text"),
            html=d.get("html"),
            markdown=d.get("markdown"),
            svg=d.get("svg"),
            png=_b64(d.get("png")),
            jpeg=_b64(d.get("jpeg")),
            latex=d.get("latex"),
            json=d.get("json"),
            javascript=d.get("javascript"),
            chart=d.get("chart"),
            data=d.get("data"),
            raw=dict(d),
        )


@dataclass
class ExecutionError:
    """An exception the cell raised (its ``name``, ``value`` and
    ``traceback``); the daemon's own: ``TimeoutError``, ``KernelDied``,
    ``OutputLimitExceeded``."""

    name: str
    value: str
    traceback: str = ""

    def __str__(self) -> str:
        return "%s: %s" % (self.name, self.value)


@dataclass
class Execution:
    """The collected outcome of a code cell (``run_code``). An exception in
    the cell is not an error of the call: it is ``error``."""

    results: List[Result] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    error: Optional[ExecutionError] = None
    execution_count: int = 0

    @property
    def text(self) -> Optional[str]:
        """The main result's text, or None."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


@dataclass
class CodeContext:
    """A stateful interpreter context (a Jupyter kernel for python, node
    for javascript, bash)."""

    id: str
    language: str
    cwd: str = ""
    state: str = ""
    default: bool = False
    execution_count: int = 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CodeContext":
        return cls(
            id=str(d.get("id", "")),
            language=str(d.get("language", "")),
            cwd=str(d.get("cwd") or ""),
            state=str(d.get("state") or ""),
            default=bool(d.get("default")),
            execution_count=int(d.get("execution_count") or 0),
        )

