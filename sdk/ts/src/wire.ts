// The API's JSON shapes as they travel (snake_case, api/openapi.yaml).
// Internal: the SDK's public types are camelCase.

export interface WireResources {
  cpu?: number;
  memory_mb?: number;
  disk_mb?: number;
  pids?: number;
  disk_tmpfs?: boolean;
}

export interface WireNetwork {
  mode?: string;
  allow?: string[];
  registries?: string[];
  offline?: boolean;
  max_download_mb?: number;
}

export interface WireSandbox {
  id: string;
  tenant: string;
  template: string;
  template_version: number;
  runtime: string;
  state: string;
  created_at: string;
  expires_at?: string;
  resources?: WireResources;
  metadata?: Record<string, string>;
  network?: WireNetwork;
  ready_ms?: number;
  error?: { code: string; message: string };
  stop_reason?: string;
}

export interface WireSandboxList {
  sandboxes: WireSandbox[] | null;
  next_cursor?: string;
}

export interface WireExecResult {
  id: string;
  sandbox_id?: string;
  cmd?: string[];
  shell?: string;
  user?: string;
  cwd?: string;
  exit_code: number | null;
  signal?: string;
  status: string;
  stdout?: string;
  stderr?: string;
  encoding?: string;
  truncated?: boolean;
  duration_ms?: number;
  started_at?: string;
  ended_at?: string;
  error?: string;
  error_code?: string;
  stdout_dropped_bytes?: number;
  stderr_dropped_bytes?: number;
}

export interface WireOutputEvent {
  data: string;
  offset: number;
  encoding?: string;
}

export interface WireFileInfo {
  name: string;
  path: string;
  type: string;
  size: number;
  mode: string;
  uid: number;
  gid: number;
  modified_at: string;
  link_target?: string;
}

export interface WireCodeEvent {
  type: string;
  text?: string;
  is_main_result?: boolean;
  html?: string;
  markdown?: string;
  svg?: string;
  png?: string;
  jpeg?: string;
  latex?: string;
  json?: unknown;
  javascript?: string;
  chart?: unknown;
  data?: unknown;
  name?: string;
  value?: string;
  traceback?: string;
  execution_count?: number;
}

export interface WireCodeContext {
  id: string;
  language: string;
  cwd?: string;
  state?: string;
  created_at?: string;
}
