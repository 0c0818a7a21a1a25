// The code interpreter against the real daemon (the code-interpreter template).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";

import { Sandbox, TemplateUnsupportedError, NotFoundError } from "../../dist/index.js";
import { daemon, withSandbox } from "./helpers.mjs";

let sbx;
before(async () => {
  if (!daemon.skip) sbx = await Sandbox.create({ template: "code-interpreter", ttl: 900 });
});
after(async () => {
  await sbx?.kill();
});

test("state persists across cells; the main result's text; stdout", daemon, async () => {
  const printed = [];
  const a = await sbx.runCode("x = 20\nprint('set', x)", { onStdout: (t) => printed.push(t) });
  assert.equal(a.error, undefined);
  assert.equal(a.stdout, "set 20\n");
  assert.deepEqual(a.logs.stdout, printed);
  assert.equal(a.text, undefined, "a cell ending in a statement has no main result");
  const b = await sbx.runCode("x * 2 + 2");
  assert.equal(b.text, "42");
  assert.equal(b.results.length, 1);
  assert.equal(b.results[0].isMainResult, true);
  assert.ok(b.executionCount > a.executionCount);
});

test("an exception is execution.error, not a thrown error", daemon, async () => {
  const errors = [];
  const e = await sbx.runCode("def f():\n    return 1 / 0\nf()", { onError: (x) => errors.push(x) });
  assert.equal(e.error.name, "ZeroDivisionError");
  assert.equal(e.error.value, "division by zero");
  assert.match(e.error.traceback, /1 \/ 0/);
  assert.doesNotMatch(e.error.traceback, /\x1b\[/, "no ANSI colour codes");
  assert.deepEqual(errors, [e.error]);
  assert.equal((await sbx.runCode("print('still alive')")).stdout, "still alive\n");
});

test("a figure comes as PNG bytes with its chart; html and json come typed", daemon, async () => {
  const fig = await sbx.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('t')\nplt.show()");
  assert.equal(fig.error, undefined, fig.error?.traceback);
  const img = fig.results.find((r) => r.png);
  assert.ok(img, JSON.stringify(fig.results.map((r) => Object.keys(r))));
  assert.ok(img.png instanceof Uint8Array);
  assert.deepEqual([...img.png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  assert.equal(img.chart?.title, "t");

  const html = await sbx.runCode("from IPython.display import HTML, JSON, display\ndisplay(HTML('<b>bold</b>'))\nJSON({'a': [1, 2]})");
  assert.equal(html.results.length, 2);
  assert.equal(html.results[0].html, "<b>bold</b>");
  assert.equal(html.results[0].isMainResult, false);
  assert.deepEqual(html.results[1].json, { a: [1, 2] });
  assert.equal(html.results[1].isMainResult, true);
});

test("javascript and bash, and contexts of their own", daemon, async () => {
  const js = await sbx.runCode("const y = 6; console.log('js says', y); y * 7", { language: "javascript" });
  assert.equal(js.text, "42");
  assert.equal(js.stdout, "js says 6\n");
  const sh = await sbx.runCode("echo $((40 + 2))", { language: "bash" });
  assert.equal(sh.stdout, "42\n");

  const ctx = await sbx.createCodeContext({ language: "python" });
  assert.equal(ctx.language, "python");
  assert.match(ctx.id, /\S/);
  await sbx.runCode("x = 'private'", { context: ctx });
  assert.equal((await sbx.runCode("x", { context: ctx })).text, "'private'");
  assert.equal((await sbx.runCode("x")).text, "20", "the default context keeps its own x");
  assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
  await sbx.restartCodeContext(ctx);
  assert.equal((await sbx.runCode("x", { context: ctx.id })).error?.name, "NameError");
  await sbx.removeCodeContext(ctx);
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
  await assert.rejects(sbx.runCode("1", { context: ctx }), NotFoundError);
});

test("a cell past its timeout is interrupted and the context lives on", daemon, async () => {
  const e = await sbx.runCode("import time\ntime.sleep(60)", { timeout: 1 });
  assert.ok(e.error, "the cell reports its interruption");
  assert.equal((await sbx.runCode("x")).text, "20");
});

test("env is the cell's only", daemon, async () => {
  const e = await sbx.runCode("import os\nos.environ.get('CELL_VAR')", { env: { CELL_VAR: "only here" } });
  assert.equal(e.text, "'only here'");
  assert.equal((await sbx.runCode("import os\nos.environ.get('CELL_VAR')")).text, undefined);
});

test("code on a template without an interpreter: TemplateUnsupportedError", daemon, async () => {
  await withSandbox({}, async (base) => {
    await assert.rejects(base.runCode("1"), TemplateUnsupportedError);
  });
});
