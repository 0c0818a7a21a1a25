// airlock code-interpreter bridge for JavaScript (runs in the sandbox).
// argv: FIFO. Same line protocol as bridge.py: requests on stdin, events on
// FIFO. State lives in one vm context; a cell's completion value (the last
// expression) is its result, a returned Promise is awaited first. A
// request's env is set in process.env for its cell only.
'use strict';
const fs = require('fs');
const vm = require('vm');
const util = require('util');
const { Writable } = require('stream');
const readline = require('readline');

const FIFO = process.argv[process.argv.length - 1];
const OUT = fs.openSync(FIFO, fs.constants.O_RDWR);
const MAX_STREAM = 8 << 20;
process.on('SIGINT', () => {}); // an interrupt between cells does nothing

function emit(ev) {
  const b = Buffer.from(JSON.stringify(ev) + '\n');
  let off = 0;
  while (off < b.length) {
    try {
      off += fs.writeSync(OUT, b, off);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
    }
  }
}

let cell = null; // {id, bytes, cut}
function stream(name, text) {
  if (cell === null || cell.cut) return; // output after its cell ended
  cell.bytes += text.length;
  if (cell.bytes > MAX_STREAM) {
    cell.cut = true;
    emit({ id: cell.id, t: 'error', name: 'OutputLimitExceeded', value: 'output limit passed; the rest is dropped', traceback: '' });
    return;
  }
  emit({ id: cell.id, t: name, text });
}
function sink(name) {
  return new Writable({ write(chunk, _enc, cb) { stream(name, chunk.toString()); cb(); } });
}
const cons = new console.Console({ stdout: sink('stdout'), stderr: sink('stderr'), colorMode: false });

function repr(v) {
  return util.inspect(v, { depth: 4, colors: false, maxArrayLength: 100, breakLength: 100 });
}
function display(v) {
  if (cell === null) return;
  const data = { 'text/plain': repr(v) };
  if (v !== null && typeof v === 'object') {
    try { data['application/json'] = JSON.parse(JSON.stringify(v)); } catch (_) { /* not JSON */ }
  }
  emit({ id: cell.id, t: 'result', main: false, data });
}

const sandbox = {
  console: cons, display, require, process, Buffer, URL, URLSearchParams, TextEncoder, TextDecoder,
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate, queueMicrotask,
};
sandbox.globalThis = sandbox;
const ctx = vm.createContext(sandbox);
let count = 0;

function errorEvent(id, e) {
  const isErr = e !== null && typeof e === 'object' && 'message' in e;
  return {
    id, t: 'error',
    name: isErr && e.name ? String(e.name) : 'Error',
    value: isErr ? String(e.message) : repr(e),
    traceback: isErr && e.stack ? String(e.stack) : '',
  };
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,255}$/;

// setEnv puts env in process.env and returns what it replaced (undefined
// for names that were unset).
function setEnv(env) {
  const saved = new Map();
  if (env === null || typeof env !== 'object' || Array.isArray(env)) return saved;
  for (const [k, v] of Object.entries(env)) {
    if (!ENV_NAME.test(k) || typeof v !== 'string' || v.includes('\0')) continue;
    saved.set(k, Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined);
    process.env[k] = v;
  }
  return saved;
}

function restoreEnv(saved) {
  for (const [k, v] of saved) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
}

async function run(id, code, env) {
  count++;
  cell = { id, bytes: 0, cut: false };
  // Restored when the cell's value is settled: callbacks the cell leaves
  // behind (timers) run later and see the context's own env.
  const saved = setEnv(env);
  try {
    let v = new vm.Script(code, { filename: 'cell' + count }).runInContext(ctx, { breakOnSigint: true, displayErrors: false });
    if (v !== null && typeof v === 'object' && typeof v.then === 'function') v = await v;
    if (v !== undefined) {
      const data = { 'text/plain': repr(v) };
      emit({ id, t: 'result', main: true, data });
    }
  } catch (e) {
    emit(errorEvent(id, e));
  } finally {
    restoreEnv(saved);
  }
  cell = null;
  emit({ id, t: 'end', n: count });
}

let chain = Promise.resolve();
const rl = readline.createInterface({ input: process.stdin, terminal: false });
rl.on('line', (line) => {
  let req;
  try { req = JSON.parse(line); } catch (_) { return; }
  if (req === null || req.op !== 'run') return;
  chain = chain.then(() => run(String(req.id), String(req.code), req.env));
});
rl.on('close', () => process.exit(0));
process.stdout.write('AIRLOCK-CODE-READY\n');
