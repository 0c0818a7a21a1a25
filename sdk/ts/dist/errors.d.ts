/** Fields every AirlockError carries (all optional but `code`). */
export interface AirlockErrorDetails {
    /** The API's stable error code, e.g. "sandbox_not_found". */
    code: string;
    /** HTTP status of the answer; 0 for an error inside a stream or without an answer. */
    status?: number;
    /** req_…: quote it when reporting a problem. */
    requestId?: string;
    /** The sandbox concerned, when there is one. */
    sandboxId?: string;
    /** The template build a create was refused for (template_building, template_build_failed). */
    buildId?: string;
    /** Seconds the server asked to wait before a retry (Retry-After), when it said. */
    retryAfter?: number;
    /** The underlying error (a network failure). */
    cause?: unknown;
}
/** The base class of every error of the SDK. */
export declare class AirlockError extends Error {
    /** The API's stable error code ("sandbox_not_found", "quota_exceeded", …). */
    readonly code: string;
    /** HTTP status; 0 when the error did not come as an HTTP answer. */
    readonly status: number;
    readonly requestId: string | undefined;
    readonly sandboxId: string | undefined;
    readonly buildId: string | undefined;
    /** Seconds to wait before retrying (the server's Retry-After), when it said. */
    readonly retryAfter: number | undefined;
    constructor(message: string, details: AirlockErrorDetails);
}
/** 400 invalid_argument (and method_not_allowed): the request must change. */
export declare class InvalidRequestError extends AirlockError {
}
/** 400 template_unsupported: the sandbox's template cannot serve the request (e.g. code on `base`). */
export declare class TemplateUnsupportedError extends InvalidRequestError {
}
/** 400 capability_unsupported: the sandbox's runtime cannot do what was asked (a memory snapshot where it has none). */
export declare class CapabilityUnsupportedError extends InvalidRequestError {
}
/** 424 template_build_failed: the template's build failed; its log (buildId) says why. */
export declare class TemplateBuildFailedError extends InvalidRequestError {
}
/** 401 unauthenticated: a missing, wrong or revoked API key. */
export declare class UnauthorizedError extends AirlockError {
}
/** 403 permission_denied. */
export declare class PermissionDeniedError extends AirlockError {
}
/** 404 not_found (a file, a context, …) and the base of the specific 404s. */
export declare class NotFoundError extends AirlockError {
}
/** 404 sandbox_not_found: never existed, deleted, or another tenant's. */
export declare class SandboxNotFoundError extends NotFoundError {
}
/** 404 exec_not_found. */
export declare class ExecNotFoundError extends NotFoundError {
}
/** 404 template_not_found. */
export declare class TemplateNotFoundError extends NotFoundError {
}
/** 409 conflict. */
export declare class ConflictError extends AirlockError {
}
/** 409 invalid_state: the sandbox is not in a state that allows this (e.g. paused). */
export declare class InvalidStateError extends ConflictError {
}
/** 413 payload_too_large. */
export declare class PayloadTooLargeError extends AirlockError {
}
/** 429 quota_exceeded: a tenant limit, or a full sandbox disk; see retryAfter. */
export declare class QuotaExceededError extends AirlockError {
}
/** 429 rate_limited: the key's request rate; see retryAfter. */
export declare class RateLimitedError extends AirlockError {
}
/** 500 internal. */
export declare class InternalError extends AirlockError {
}
/** 501 not_implemented. */
export declare class NotImplementedError extends AirlockError {
}
/** 503 and other transient failures: retry after retryAfter. */
export declare class UnavailableError extends AirlockError {
}
/** 503 capacity_exhausted: the host is full. */
export declare class CapacityExhaustedError extends UnavailableError {
}
/** 503 agent_unavailable: the sandbox runs but its agent did not answer. */
export declare class AgentUnavailableError extends UnavailableError {
}
/** 503 template_building: the template's first build runs (buildId); Sandbox.create waits for it unless told not to. */
export declare class TemplateBuildingError extends UnavailableError {
}
/** The server could not be reached (connection refused, reset, DNS…). */
export declare class ConnectionError extends UnavailableError {
}
/**
 * runtime_unavailable: 400 when the host lacks the runtime (retrying does
 * not help), 503 when it has it but it is unhealthy now (retryAfter).
 */
export declare class RuntimeUnavailableError extends AirlockError {
}
/** What a finished command reports; ExecTimeoutError carries it. */
export interface TimedOutCommand {
    id: string;
    stdout: string;
    stderr: string;
    exitCode: number | null;
}
/**
 * exec_timeout: a command ran past its `timeout`; the server killed its
 * whole process tree. `result` holds the output it printed until then.
 */
export declare class ExecTimeoutError extends AirlockError {
    readonly result: TimedOutCommand;
    constructor(message: string, details: AirlockErrorDetails, result: TimedOutCommand);
}
type ErrorClass = new (message: string, details: AirlockErrorDetails) => AirlockError;
/** The API's error codes and their classes (the inverse of the server's one table). */
export declare const errorClasses: Readonly<Record<string, ErrorClass>>;
/** Parses Retry-After (delay-seconds or an HTTP date) into seconds. */
export declare function parseRetryAfter(value: string | null | undefined, now?: number): number | undefined;
/**
 * errorFromBody builds the error of a non-2xx answer from its status, its
 * body text and its headers (X-Request-Id, Retry-After).
 */
export declare function errorFromBody(status: number, bodyText: string, headers?: {
    get(name: string): string | null;
}): AirlockError;
/** errorFromEvent builds the error of an `error` event inside a stream (SSE data: the error body). */
export declare function errorFromEvent(data: string): AirlockError;
export {};
