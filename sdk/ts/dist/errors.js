// Errors of the SDK. Every error the SDK throws is an AirlockError; a
// non-2xx answer of the server becomes the subclass of its stable API
// error code (docs/api.md), so callers catch by class:
//
//   try { await Sandbox.connect(id) } catch (e) {
//     if (e instanceof SandboxNotFoundError) …
//   }
/** The base class of every error of the SDK. */
export class AirlockError extends Error {
    /** The API's stable error code ("sandbox_not_found", "quota_exceeded", …). */
    code;
    /** HTTP status; 0 when the error did not come as an HTTP answer. */
    status;
    requestId;
    sandboxId;
    buildId;
    /** Seconds to wait before retrying (the server's Retry-After), when it said. */
    retryAfter;
    constructor(message, details) {
        super(message, details.cause === undefined ? undefined : { cause: details.cause });
        this.name = new.target.name;
        this.code = details.code;
        this.status = details.status ?? 0;
        this.requestId = details.requestId;
        this.sandboxId = details.sandboxId;
        this.buildId = details.buildId;
        this.retryAfter = details.retryAfter;
    }
}
/** 400 invalid_argument (and method_not_allowed): the request must change. */
export class InvalidRequestError extends AirlockError {
}
/** 400 template_unsupported: the sandbox's template cannot serve the request (e.g. code on `base`). */
export class TemplateUnsupportedError extends InvalidRequestError {
}
/** 400 capability_unsupported: the sandbox's runtime cannot do what was asked (a memory snapshot where it has none). */
export class CapabilityUnsupportedError extends InvalidRequestError {
}
/** 424 template_build_failed: the template's build failed; its log (buildId) says why. */
export class TemplateBuildFailedError extends InvalidRequestError {
}
/** 401 unauthenticated: a missing, wrong or revoked API key. */
export class UnauthorizedError extends AirlockError {
}
/** 403 permission_denied. */
export class PermissionDeniedError extends AirlockError {
}
/** 404 not_found (a file, a context, …) and the base of the specific 404s. */
export class NotFoundError extends AirlockError {
}
/** 404 sandbox_not_found: never existed, deleted, or another tenant's. */
export class SandboxNotFoundError extends NotFoundError {
}
/** 404 exec_not_found. */
export class ExecNotFoundError extends NotFoundError {
}
/** 404 template_not_found. */
export class TemplateNotFoundError extends NotFoundError {
}
/** 409 conflict. */
export class ConflictError extends AirlockError {
}
/** 409 invalid_state: the sandbox is not in a state that allows this (e.g. paused). */
export class InvalidStateError extends ConflictError {
}
/** 413 payload_too_large. */
export class PayloadTooLargeError extends AirlockError {
}
/** 429 quota_exceeded: a tenant limit, or a full sandbox disk; see retryAfter. */
export class QuotaExceededError extends AirlockError {
}
/** 429 rate_limited: the key's request rate; see retryAfter. */
export class RateLimitedError extends AirlockError {
}
/** 500 internal. */
export class InternalError extends AirlockError {
}
/** 501 not_implemented. */
export class NotImplementedError extends AirlockError {
}
/** 503 and other transient failures: retry after retryAfter. */
export class UnavailableError extends AirlockError {
}
/** 503 capacity_exhausted: the host is full. */
export class CapacityExhaustedError extends UnavailableError {
}
/** 503 agent_unavailable: the sandbox runs but its agent did not answer. */
export class AgentUnavailableError extends UnavailableError {
}
/** 503 template_building: the template's first build runs (buildId); Sandbox.create waits for it unless told not to. */
export class TemplateBuildingError extends UnavailableError {
}
/** The server could not be reached (connection refused, reset, DNS…). */
export class ConnectionError extends UnavailableError {
}
/**
 * runtime_unavailable: 400 when the host lacks the runtime (retrying does
 * not help), 503 when it has it but it is unhealthy now (retryAfter).
 */
export class RuntimeUnavailableError extends AirlockError {
}
/**
 * exec_timeout: a command ran past its `timeout`; the server killed its
 * whole process tree. `result` holds the output it printed until then.
 */
export class ExecTimeoutError extends AirlockError {
    result;
    constructor(message, details, result) {
        super(message, details);
        this.result = result;
    }
}
/** The API's error codes and their classes (the inverse of the server's one table). */
export const errorClasses = Object.freeze({
    invalid_argument: InvalidRequestError,
    method_not_allowed: InvalidRequestError,
    template_unsupported: TemplateUnsupportedError,
    capability_unsupported: CapabilityUnsupportedError,
    template_build_failed: TemplateBuildFailedError,
    unauthenticated: UnauthorizedError,
    permission_denied: PermissionDeniedError,
    sandbox_not_found: SandboxNotFoundError,
    exec_not_found: ExecNotFoundError,
    template_not_found: TemplateNotFoundError,
    not_found: NotFoundError,
    conflict: ConflictError,
    already_exists: ConflictError,
    invalid_state: InvalidStateError,
    payload_too_large: PayloadTooLargeError,
    quota_exceeded: QuotaExceededError,
    rate_limited: RateLimitedError,
    internal: InternalError,
    not_implemented: NotImplementedError,
    capacity_exhausted: CapacityExhaustedError,
    runtime_unavailable: RuntimeUnavailableError,
    agent_unavailable: AgentUnavailableError,
    template_building: TemplateBuildingError,
    unavailable: UnavailableError,
});
/** The class of a status for a code this SDK does not know (a newer server may add codes). */
function statusClass(status) {
    switch (status) {
        case 400:
            return { cls: InvalidRequestError, code: "invalid_argument" };
        case 401:
            return { cls: UnauthorizedError, code: "unauthenticated" };
        case 403:
            return { cls: PermissionDeniedError, code: "permission_denied" };
        case 404:
            return { cls: NotFoundError, code: "not_found" };
        case 409:
            return { cls: ConflictError, code: "conflict" };
        case 413:
            return { cls: PayloadTooLargeError, code: "payload_too_large" };
        case 429:
            return { cls: RateLimitedError, code: "rate_limited" };
        case 501:
            return { cls: NotImplementedError, code: "not_implemented" };
        case 502:
        case 503:
        case 504:
            return { cls: UnavailableError, code: "unavailable" };
    }
    if (status >= 400 && status < 500)
        return { cls: InvalidRequestError, code: "invalid_argument" };
    return { cls: InternalError, code: "internal" };
}
/** Parses Retry-After (delay-seconds or an HTTP date) into seconds. */
export function parseRetryAfter(value, now = Date.now()) {
    const v = (value ?? "").trim();
    if (v === "")
        return undefined;
    if (/^\d+$/.test(v))
        return Number(v);
    const t = Date.parse(v);
    if (Number.isNaN(t))
        return undefined;
    return Math.max(0, Math.ceil((t - now) / 1000));
}
const str = (v) => (typeof v === "string" && v !== "" ? v : undefined);
/** The first line of text, at most 200 characters: what a foreign error body may say. */
function excerpt(text) {
    let s = text.trim();
    const nl = s.search(/[\r\n]/);
    if (nl >= 0)
        s = s.slice(0, nl);
    return s.length > 200 ? s.slice(0, 200) + "…" : s;
}
/**
 * errorFromBody builds the error of a non-2xx answer from its status, its
 * body text and its headers (X-Request-Id, Retry-After).
 */
export function errorFromBody(status, bodyText, headers) {
    let detail;
    try {
        const parsed = JSON.parse(bodyText);
        if (parsed && typeof parsed === "object" && "error" in parsed) {
            const e = parsed.error;
            if (e && typeof e === "object" && typeof e.code === "string")
                detail = e;
        }
    }
    catch {
        // Not our error body (a proxy in between): fall back on the status.
    }
    const retryAfter = parseRetryAfter(headers?.get("retry-after"));
    const requestId = str(detail?.request_id) ?? str(headers?.get("x-request-id"));
    const fallback = statusClass(status);
    const code = str(detail?.code) ?? fallback.code;
    const cls = errorClasses[code] ?? fallback.cls;
    const message = str(detail?.message) ?? (excerpt(bodyText) || `request failed with status ${status}`);
    return new cls(message, {
        code,
        status,
        requestId,
        sandboxId: str(detail?.sandbox_id),
        buildId: str(detail?.build_id),
        retryAfter,
    });
}
/** errorFromEvent builds the error of an `error` event inside a stream (SSE data: the error body). */
export function errorFromEvent(data) {
    let body;
    try {
        body = JSON.parse(data);
    }
    catch {
        body = undefined;
    }
    // The event carries the error body {"error": {…}} or the detail itself.
    const detail = body && typeof body === "object" && "error" in body ? body.error : body;
    if (!detail || typeof detail !== "object" || typeof detail.code !== "string") {
        return new InternalError("the stream failed", { code: "internal" });
    }
    return errorFromBody(0, JSON.stringify({ error: detail }));
}
