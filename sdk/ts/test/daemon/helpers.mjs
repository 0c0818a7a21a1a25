// Shared by the tests that need a real daemon. test/sdk's TestTSSDK starts
// one (internal/testutil/daemontest) and sets AIRLOCK_URL, AIRLOCK_API_KEY
// and the AIRLOCK_TEST_* keys; without it these tests skip, saying so.
import { Sandbox } from "../../dist/index.js";

/** daemon is the options of node:test's test() for a test that needs the daemon. */
export const daemon = {
  skip: process.env.AIRLOCK_TEST_DAEMON ? false : "needs a daemon: run `go test ./test/sdk -run TSSDK` (root), which starts one",
};

/** key returns a test key the Go test made (OTHER: another tenant's, QUOTA: a tenant allowed one sandbox, RATE: a rate-limited key). */
export function key(name) {
  const k = process.env[`AIRLOCK_TEST_${name}_KEY`];
  if (!k) throw new Error(`AIRLOCK_TEST_${name}_KEY is not set`);
  return k;
}

/** withSandbox runs fn with a new sandbox and always kills it. */
export async function withSandbox(opts, fn) {
  const sbx = await Sandbox.create(opts);
  try {
    return await fn(sbx);
  } finally {
    await sbx.kill();
  }
}

/** eventually polls f until it returns a truthy value (bounded: 100 tries, 100 ms apart). */
export async function eventually(f, what) {
  for (let i = 0; i < 100; i++) {
    const v = await f();
    if (v) return v;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`never: ${what}`);
}
