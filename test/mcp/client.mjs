// The official TypeScript MCP client against `airlock mcp` (run by
// mcp_test.go with node --test). AIRLOCK_BIN is the airlock binary,
// AIRLOCK_URL and AIRLOCK_API_KEY the daemon and a tenant's key,
// AIRLOCK_MCP_HTTP the URL of a running `airlock mcp --http`.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const TOOLS = ['create_sandbox', 'kill_sandbox', 'list_files', 'read_file', 'run_code', 'run_command', 'write_file'];

// flow lists the tools, then creates a sandbox, runs commands in it and
// kills it, checking each structured result (the client validates it
// against the tool's output schema).
async function flow(client) {
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), TOOLS);
  for (const t of tools) {
    assert.equal(t.inputSchema.type, 'object', t.name);
    assert.ok(t.description, t.name);
  }

  const created = await client.callTool({ name: 'create_sandbox', arguments: {} });
  assert.ok(!created.isError, JSON.stringify(created.content));
  const id = created.structuredContent.sandbox_id;
  assert.match(id, /^sbx_/);
  assert.equal(created.structuredContent.state, 'running');
  try {
    const ran = await client.callTool({
      name: 'run_command',
      arguments: { sandbox_id: id, command: 'echo "hello from $(id -un)"; echo warn >&2; exit 4' },
    });
    assert.ok(!ran.isError, JSON.stringify(ran.content));
    assert.equal(ran.structuredContent.exit_code, 4);
    assert.equal(ran.structuredContent.status, 'exited');
    assert.equal(ran.structuredContent.stdout, 'hello from user\n');
    assert.equal(ran.structuredContent.stderr, 'warn\n');
    // The text content is the same result, for a model to read.
    assert.equal(JSON.parse(ran.content[0].text).exit_code, 4);

    // Bad input is a tool error with the API's code, not a protocol error.
    const bad = await client.callTool({ name: 'run_command', arguments: { sandbox_id: id } });
    assert.ok(bad.isError);
    assert.match(bad.content[0].text, /^invalid_argument: /);
  } finally {
    const killed = await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: id } });
    assert.ok(!killed.isError, JSON.stringify(killed.content));
    assert.equal(killed.structuredContent.killed, true);
  }
  const after = await client.callTool({ name: 'run_command', arguments: { sandbox_id: id, command: 'true' } });
  assert.ok(after.isError);
  assert.match(after.content[0].text, /^invalid_state: /);
}

test('airlock mcp over stdio', async () => {
  const transport = new StdioClientTransport({
    command: process.env.AIRLOCK_BIN,
    args: ['mcp'],
    env: {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      AIRLOCK_URL: process.env.AIRLOCK_URL,
      AIRLOCK_API_KEY: process.env.AIRLOCK_API_KEY,
    },
    stderr: 'inherit',
  });
  const client = new Client({ name: 'airlock-ts-test', version: '1.0.0' });
  await client.connect(transport);
  try {
    assert.equal(client.getServerVersion().name, 'airlock');
    await flow(client);
  } finally {
    await client.close();
  }
});

test('airlock mcp --http with a bearer key', async () => {
  const url = new URL(process.env.AIRLOCK_MCP_HTTP);
  // Without a key: refused before any MCP.
  const anon = new Client({ name: 'airlock-ts-test', version: '1.0.0' });
  await assert.rejects(anon.connect(new StreamableHTTPClientTransport(url)), /unauthenticated/);

  const transport = new StreamableHTTPClientTransport(url, {
    requestInit: { headers: { Authorization: `Bearer ${process.env.AIRLOCK_API_KEY}` } },
  });
  const client = new Client({ name: 'airlock-ts-test', version: '1.0.0' });
  await client.connect(transport);
  try {
    await flow(client);
  } finally {
    await client.close();
  }
});
