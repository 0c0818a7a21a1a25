// Package mcptest drives `airlock mcp` with the official TypeScript MCP
// client (npm @modelcontextprotocol/sdk@1.32.2, pinned by
// package-lock.json) against a real daemon.
//
// The package holds only tests. TestTypeScriptClient starts the daemon
// (internal/testutil/daemontest), builds bin/airlock into a temp dir,
// installs the client with `npm ci` into node_modules/ (gitignored) when it
// is missing, and runs client.mjs with node's test runner: one test spawns
// `airlock mcp` over stdio with AIRLOCK_URL and AIRLOCK_API_KEY, the other
// talks to `airlock mcp --http 127.0.0.1:0` with a bearer key. Nothing
// reaches any other host. It needs root, runc, node and npm, and skips with
// the reason elsewhere (a failure in CI).
//
//	go test -race -run TestTypeScriptClient ./test/mcp/
package mcptest
