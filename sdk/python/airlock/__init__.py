"""airlock: run untrusted code in sandboxes on an airlock server.

    from airlock import Sandbox

    with Sandbox.create(template="base") as sbx:
        sbx.files.write("task.py", "print(6 * 7)")
        r = sbx.commands.run(["python3", "task.py"], timeout=30)
        print(r.stdout, r.exit_code)

The server and key come from ``AIRLOCK_URL`` and ``AIRLOCK_API_KEY`` (as
the CLI's), or the ``url=`` and ``api_key=`` arguments. :class:`AsyncSandbox`
is the same for asyncio. Every error derives from :class:`AirlockError`.
"""

from typing import TYPE_CHECKING, Any

from ._errors import (
    AgentUnavailable,
    AirlockError,
    CapacityExhausted,
    Conflict,
    ExecNotFound,
    ExecTimeout,
    InternalError,
    InvalidRequest,
    InvalidState,
    NotFound,
    NotSupported,
    PayloadTooLarge,
    PermissionDenied,
    QuotaExceeded,
    RateLimited,
    RuntimeUnavailable,
    SandboxNotFound,
    TemplateBuildFailed,
    TemplateBuilding,
    TemplateNotFound,
    TemplateUnsupported,
    CapabilityUnsupported,
    TransportError,
    Unauthorized,
    Unavailable,
)
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
from ._sandbox import CommandHandle, Commands, Files, Pty, PtySession, Sandbox, WatchHandle

if TYPE_CHECKING:
    from ._async import AsyncCommandHandle, AsyncCommands, AsyncFiles, AsyncPty, AsyncPtySession, AsyncSandbox, AsyncWatchHandle

__version__ = "0.1.0"

_ASYNC = {"AsyncSandbox", "AsyncCommands", "AsyncCommandHandle", "AsyncFiles", "AsyncWatchHandle", "AsyncPty", "AsyncPtySession"}


def __getattr__(name: str) -> Any:
    # The asyncio client is imported on first use: a synchronous program
    # does not pay for importing asyncio.
    if name in _ASYNC:
        from . import _async

        return getattr(_async, name)
    raise AttributeError("module 'airlock' has no attribute %r" % name)

__all__ = [
    "Sandbox", "AsyncSandbox",
    "Commands", "CommandHandle", "Files", "WatchHandle", "Pty", "PtySession",
    "AsyncCommands", "AsyncCommandHandle", "AsyncFiles", "AsyncWatchHandle", "AsyncPty", "AsyncPtySession",
    "SandboxInfo", "CommandResult", "EntryInfo", "WriteInfo", "FilesystemEvent",
    "Execution", "Result", "ExecutionError", "CodeContext",
    "AirlockError", "InvalidRequest", "TemplateUnsupported", "CapabilityUnsupported", "TemplateBuildFailed", "Unauthorized",
    "PermissionDenied", "NotFound", "SandboxNotFound", "ExecNotFound", "TemplateNotFound", "Conflict",
    "InvalidState", "PayloadTooLarge", "QuotaExceeded", "RateLimited", "InternalError", "NotSupported",
    "Unavailable", "CapacityExhausted", "AgentUnavailable", "TemplateBuilding", "RuntimeUnavailable",
    "TransportError", "ExecTimeout",
]
