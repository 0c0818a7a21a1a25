"""Exceptions of the airlock SDK: one class per API error code.

Every error derives from :class:`AirlockError`. The server's error body is
``{"error": {"code", "message", "request_id", "sandbox_id", "build_id"}}``
with a stable ``code`` (docs/api.md); :func:`from_response` maps the code to
its class here. A code this SDK does not know (a newer server may add codes;
it never renames them) is an :class:`AirlockError` with that ``.code`` and
``.status``; a body that is not the API's (a proxy in between) gets a class
by its HTTP status.
"""

from __future__ import annotations

import email.message
import email.utils
import json
import time
from typing import Any, Dict, Mapping, Optional, Tuple, Type, Union


class AirlockError(Exception):
    """Base class of every error the SDK raises.

    Attributes:
        code: the API's stable error code (``"sandbox_not_found"``, …).
        status: the HTTP status (0 for an error inside a stream or a
            failure to reach the server).
        message: the server's client-safe message.
        request_id: ``req_…``; quote it when reporting a problem.
        sandbox_id: the sandbox concerned, when there is one.
        build_id: the template build a create was refused for.
        retry_after: seconds the server asked to wait (429, 503), or None.
    """

    #: the code of errors of this class when the server names none
    default_code = "internal"

    def __init__(
        self,
        message: str = "",
        *,
        code: Optional[str] = None,
        status: int = 0,
        request_id: Optional[str] = None,
        sandbox_id: Optional[str] = None,
        build_id: Optional[str] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        self.code: str = code or self.default_code
        self.status = status
        self.message = message or self.code.replace("_", " ")
        self.request_id = request_id
        self.sandbox_id = sandbox_id
        self.build_id = build_id
        self.retry_after = retry_after
        super().__init__(self.message)

    def __str__(self) -> str:
        return "%s (%s)" % (self.message, self.code)

    def __repr__(self) -> str:
        return "%s(%r, code=%r, status=%r)" % (type(self).__name__, self.message, self.code, self.status)

    @property
    def retryable(self) -> bool:
        """True when the same request may succeed later: a 429 or 503
        answer (the server sends ``Retry-After`` with them), a gateway's
        502 or 504, or a server that could not be reached."""
        return self.status in (429, 503) or isinstance(self, Unavailable)


class InvalidRequest(AirlockError):
    """400 ``invalid_argument``: the request is wrong; the message says what."""

    default_code = "invalid_argument"


class TemplateUnsupported(InvalidRequest):
    """400 ``template_unsupported``: the sandbox's template lacks what the
    request needs (code on ``base``: use ``code-interpreter``)."""

    default_code = "template_unsupported"


class CapabilityUnsupported(InvalidRequest):
    """400 ``capability_unsupported``: the sandbox's runtime cannot do what
    was asked (a memory snapshot where it has none); ``/v1/info`` says what
    each runtime can."""

    default_code = "capability_unsupported"


class TemplateBuildFailed(InvalidRequest):
    """424 ``template_build_failed``: the template's build failed; its log
    (``build_id``) says why. Asking again does not help."""

    default_code = "template_build_failed"


class Unauthorized(AirlockError):
    """401 ``unauthenticated``: no API key, or not a valid one
    (``AIRLOCK_API_KEY``)."""

    default_code = "unauthenticated"


class PermissionDenied(AirlockError):
    """403 ``permission_denied``: the key may not do this."""

    default_code = "permission_denied"


class NotFound(AirlockError):
    """404: what the request names does not exist (or is another tenant's)."""

    default_code = "not_found"


class SandboxNotFound(NotFound):
    """404 ``sandbox_not_found``."""

    default_code = "sandbox_not_found"


class ExecNotFound(NotFound):
    """404 ``exec_not_found``."""

    default_code = "exec_not_found"


class TemplateNotFound(NotFound):
    """404 ``template_not_found``."""

    default_code = "template_not_found"


class Conflict(AirlockError):
    """409 ``conflict``: e.g. an Idempotency-Key reused with another body."""

    default_code = "conflict"


class InvalidState(Conflict):
    """409 ``invalid_state``: not possible in the sandbox's state (e.g. exec
    in a paused sandbox)."""

    default_code = "invalid_state"


class PayloadTooLarge(AirlockError):
    """413 ``payload_too_large``."""

    default_code = "payload_too_large"


class QuotaExceeded(AirlockError):
    """429 ``quota_exceeded``: a tenant limit, or a full sandbox disk;
    ``retry_after`` says when to try again."""

    default_code = "quota_exceeded"


class RateLimited(AirlockError):
    """429 ``rate_limited``: the key's request rate; wait ``retry_after``."""

    default_code = "rate_limited"


class InternalError(AirlockError):
    """500 ``internal``: a bug or fault of the server (quote ``request_id``)."""

    default_code = "internal"


class NotSupported(AirlockError):
    """501 ``not_implemented``: this server does not implement it."""

    default_code = "not_implemented"


class Unavailable(AirlockError):
    """503 ``unavailable`` and its kinds: transient, retry after
    ``retry_after``."""

    default_code = "unavailable"


class CapacityExhausted(Unavailable):
    """503 ``capacity_exhausted``: the host is full."""

    default_code = "capacity_exhausted"


class AgentUnavailable(Unavailable):
    """503 ``agent_unavailable``: the sandbox runs but its agent does not
    answer."""

    default_code = "agent_unavailable"


class TemplateBuilding(Unavailable):
    """503 ``template_building``: the template is being built (``build_id``);
    create with ``wait_for_template=True`` (the default) to wait instead."""

    default_code = "template_building"


class RuntimeUnavailable(AirlockError):
    """``runtime_unavailable``: 400 when the host lacks the runtime (change
    the request), 503 when it has it but it is unhealthy now (retry)."""

    default_code = "runtime_unavailable"


class TransportError(Unavailable):
    """The server could not be reached, or the connection broke before an
    answer (status 0)."""

    default_code = "unavailable"


class ExecTimeout(AirlockError):
    """A command ran past its ``timeout`` and was killed with its whole
    process tree (exec status ``timeout``). ``result`` holds what it
    printed until then."""

    default_code = "exec_timeout"

    def __init__(self, message: str = "", *, result: Any = None, **kw: Any) -> None:
        super().__init__(message or "command timed out", **kw)
        #: the CommandResult of the timed-out command
        self.result = result


#: API error code → class. The inverse of the server's one table
#: (internal/errdefs/edge); test/sdk/python_test.go fails when a code the
#: server sends is missing here or lands in a class of another kind.
CODE_CLASSES: Dict[str, Type[AirlockError]] = {
    "invalid_argument": InvalidRequest,
    "method_not_allowed": InvalidRequest,
    "template_unsupported": TemplateUnsupported,
    "capability_unsupported": CapabilityUnsupported,
    "template_build_failed": TemplateBuildFailed,
    "unauthenticated": Unauthorized,
    "permission_denied": PermissionDenied,
    "not_found": NotFound,
    "sandbox_not_found": SandboxNotFound,
    "exec_not_found": ExecNotFound,
    "template_not_found": TemplateNotFound,
    "conflict": Conflict,
    "already_exists": Conflict,
    "invalid_state": InvalidState,
    "payload_too_large": PayloadTooLarge,
    "quota_exceeded": QuotaExceeded,
    "rate_limited": RateLimited,
    "internal": InternalError,
    "not_implemented": NotSupported,
    "unavailable": Unavailable,
    "capacity_exhausted": CapacityExhausted,
    "agent_unavailable": AgentUnavailable,
    "template_building": TemplateBuilding,
    "runtime_unavailable": RuntimeUnavailable,
}

#: HTTP status → (class, code) for an answer without the API's error body.
_STATUS_CLASSES: Dict[int, Tuple[Type[AirlockError], str]] = {
    400: (InvalidRequest, "invalid_argument"),
    401: (Unauthorized, "unauthenticated"),
    403: (PermissionDenied, "permission_denied"),
    404: (NotFound, "not_found"),
    405: (InvalidRequest, "method_not_allowed"),
    409: (Conflict, "conflict"),
    413: (PayloadTooLarge, "payload_too_large"),
    429: (RateLimited, "rate_limited"),
    500: (InternalError, "internal"),
    501: (NotSupported, "not_implemented"),
    502: (Unavailable, "unavailable"),
    503: (Unavailable, "unavailable"),
    504: (Unavailable, "unavailable"),
}

#: response headers: http.client's (case-insensitive get) or a mapping
HeaderMap = Union[Mapping[str, str], email.message.Message]


#: how much of a foreign error body is kept in the message
_EXCERPT = 200


def parse_retry_after(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Reads a Retry-After header (delay-seconds or an HTTP date) as
    seconds from now; None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if value.isdigit():
        return float(int(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    delta = when.timestamp() - (time.time() if now is None else now)
    return max(delta, 0.0)


def error_for(code: str, status: int = 0, **kw: Any) -> AirlockError:
    """Builds the exception of an API error code (unknown codes: the base
    class, keeping the code)."""
    cls = CODE_CLASSES.get(code, AirlockError)
    return cls(code=code, status=status, **kw)


def from_response(status: int, headers: HeaderMap, body: bytes) -> AirlockError:
    """The exception of a non-2xx answer: status, its headers (a mapping
    with case-insensitive ``get``, as http.client's) and body."""
    retry_after = parse_retry_after(headers.get("Retry-After"))
    request_id = headers.get("X-Request-Id")
    detail: Any = None
    try:
        doc = json.loads(body.decode("utf-8")) if body else None
        if isinstance(doc, dict):
            detail = doc.get("error")
    except (ValueError, UnicodeDecodeError):
        detail = None
    if isinstance(detail, dict) and isinstance(detail.get("code"), str) and detail["code"]:
        return error_for(
            detail["code"],
            status,
            message=str(detail.get("message") or ""),
            request_id=detail.get("request_id") or request_id,
            sandbox_id=detail.get("sandbox_id") or None,
            build_id=detail.get("build_id") or None,
            retry_after=retry_after,
        )
    # Not the API's body: keep a short single line of it so the caller
    # still learns something, and classify by status.
    if status in _STATUS_CLASSES:
        cls, code = _STATUS_CLASSES[status]
    elif 400 <= status < 500:
        cls, code = InvalidRequest, "invalid_argument"
    else:
        cls, code = InternalError, "internal"
    text = body.decode("utf-8", "replace").strip().splitlines()
    msg = text[0][:_EXCERPT] if text else ""
    return cls(msg or "HTTP %d" % status, code=code, status=status, request_id=request_id, retry_after=retry_after)


def from_stream_error(data: str) -> AirlockError:
    """The exception of an ``error`` event inside a stream (its data is the
    API's error body or its inner object)."""
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        doc = doc["error"]
    if not isinstance(doc, dict) or not doc.get("code"):
        return InternalError("stream failed", code="internal")
    return error_for(
        str(doc["code"]),
        0,
        message=str(doc.get("message") or ""),
        request_id=doc.get("request_id") or None,
        sandbox_id=doc.get("sandbox_id") or None,
    )
