// Package e2btest runs the published E2B SDKs (npm e2b@2.51.0 and @e2b/code-interpreter@2.8.0, pinned by package-lock.json) against airlock's E2B-compatible planes.
//
// The package holds only tests. TestSDK starts airlock's daemon
// (internal/testutil/daemontest: the E2B planes, the runc driver, the code interpreter) on 127.0.0.1:0,
// installs the SDKs with `npm ci` into node_modules/ (gitignored) when they
// are missing, and runs each scenario of scenarios.mjs with the machine's
// Node, E2B_API_URL and E2B_SANDBOX_URL set to that server and E2B_API_KEY
// to an airlock key. Nothing reaches any other host. They need root, runc,
// node and npm, and skip with the reason elsewhere.
//
//	go test -race -run 'TestSDK/runCode' ./test/e2b/
package e2btest
