// Run by pty.test.mjs in a node whose WebSocket is the other kind: it
// drives a terminal of the sandbox AIRLOCK_TEST_SANDBOX and prints what it
// saw as one JSON line.
import { Sandbox, AirlockError } from "../../dist/index.js";
import { webSocketKind } from "../../dist/websocket.js";

const sbx = await Sandbox.connect(process.env.AIRLOCK_TEST_SANDBOX);
let out = "";
const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => (out += new TextDecoder().decode(d)) });
await pty.resize({ cols: 132, rows: 43 });
await pty.sendInput("stty size; echo $((6 * 7)); exit 3\n");
const exit = await pty.wait();
let missing;
try {
  await (await Sandbox.connect(sbx.id)).pty.create({ cwd: "/no/such/dir" });
} catch (e) {
  missing = e instanceof AirlockError ? e.name : String(e);
}
console.log(JSON.stringify({ kind: webSocketKind(), out, exit, missing }));
