// @airlock/sdk: the TypeScript SDK of airlock.
//
//   import { Sandbox } from "@airlock/sdk";
//   await using sbx = await Sandbox.create({ template: "base" });
//   const r = await sbx.commands.run("echo hello");
//   console.log(r.stdout, r.exitCode);

export { Sandbox } from "./sandbox.js";
export type {
  ListOptions,
  NetworkPolicy,
  Resources,
  Runtime,
  SandboxInfo,
  SandboxMetrics,
  SandboxOptions,
  SandboxState,
  VolumeMount,
} from "./sandbox.js";
export { CommandHandle, Commands } from "./commands.js";
export type { CommandInfo, CommandResult, CommandStatus, ConnectOptions, RunOptions } from "./commands.js";
export { Files, WatchHandle } from "./files.js";
export type { EntryInfo, EntryType, FileOptions, FilesystemEvent, WatchOptions, WriteData, WriteInfo } from "./files.js";
export type { CodeContext, Execution, ExecutionError, Language, Result, RunCodeOptions } from "./code.js";
export { Pty, PtyHandle } from "./pty.js";
export type { PtyOptions, PtyResult } from "./pty.js";
export { DEFAULT_URL, VERSION } from "./transport.js";
export type { ConnectionOptions } from "./transport.js";
export {
  AgentUnavailableError,
  AirlockError,
  CapacityExhaustedError,
  ConflictError,
  ConnectionError,
  errorClasses,
  ExecNotFoundError,
  ExecTimeoutError,
  InternalError,
  InvalidRequestError,
  InvalidStateError,
  NotFoundError,
  NotImplementedError,
  PayloadTooLargeError,
  PermissionDeniedError,
  QuotaExceededError,
  RateLimitedError,
  RuntimeUnavailableError,
  SandboxNotFoundError,
  TemplateBuildFailedError,
  TemplateBuildingError,
  TemplateNotFoundError,
  TemplateUnsupportedError,
  CapabilityUnsupportedError,
  UnauthorizedError,
  UnavailableError,
} from "./errors.js";
export type { AirlockErrorDetails, TimedOutCommand } from "./errors.js";
