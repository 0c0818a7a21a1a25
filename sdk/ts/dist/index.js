// @airlock/sdk: the TypeScript SDK of airlock.
//
//   import { Sandbox } from "@airlock/sdk";
//   await using sbx = await Sandbox.create({ template: "base" });
//   const r = await sbx.commands.run("echo hello");
//   console.log(r.stdout, r.exitCode);
export { Sandbox } from "./sandbox.js";
export { CommandHandle, Commands } from "./commands.js";
export { Files, WatchHandle } from "./files.js";
export { Pty, PtyHandle } from "./pty.js";
export { DEFAULT_URL, VERSION } from "./transport.js";
export { AgentUnavailableError, AirlockError, CapacityExhaustedError, ConflictError, ConnectionError, errorClasses, ExecNotFoundError, ExecTimeoutError, InternalError, InvalidRequestError, InvalidStateError, NotFoundError, NotImplementedError, PayloadTooLargeError, PermissionDeniedError, QuotaExceededError, RateLimitedError, RuntimeUnavailableError, SandboxNotFoundError, TemplateBuildFailedError, TemplateBuildingError, TemplateNotFoundError, TemplateUnsupportedError, CapabilityUnsupportedError, UnauthorizedError, UnavailableError, } from "./errors.js";
