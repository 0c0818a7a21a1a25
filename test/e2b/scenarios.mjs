// Scenarios that drive airlock with the published E2B SDKs, unchanged.
// e2b_test.go runs `node scenarios.mjs <name>` once per scenario with
// E2B_API_URL / E2B_SANDBOX_URL pointing at an in-process airlock and
// E2B_API_KEY set to an airlock key. A scenario throws on any mismatch.
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, TimeoutError, FileType } from 'e2b'
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter'

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// waitFor polls cond until it holds or ms pass.
async function waitFor(what, cond, ms = 15000) {
  const end = Date.now() + ms
  for (;;) {
    if (await cond()) return
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await sleep(100)
  }
}

// withSandbox runs fn on a new sandbox and kills it afterwards.
async function withSandbox(fn, Cls = Sandbox) {
  const sbx = await Cls.create()
  try {
    await fn(sbx)
  } finally {
    await sbx.kill().catch(() => {})
  }
}

const scenarios = {
  // create, list, connect, info, kill.
  async lifecycle() {
    const sbx = await Sandbox.create({ metadata: { suite: 'e2b-lifecycle' } })
    assert.match(sbx.sandboxId, /^sbx_/)
    assert.equal(await sbx.isRunning(), true)

    const paginator = Sandbox.list({ query: { metadata: { suite: 'e2b-lifecycle' } } })
    const listed = await paginator.nextItems()
    assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
    assert.equal(listed[0].state, 'running')

    const again = await Sandbox.connect(sbx.sandboxId)
    const r = await again.commands.run('echo connected')
    assert.equal(r.stdout, 'connected\n')

    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.templateId, 'base')
    assert.equal(info.state, 'running')

    assert.equal(await sbx.kill(), true)
    assert.equal(await Sandbox.kill(sbx.sandboxId), false, 'killing twice finds nothing')
    assert.equal(await sbx.isRunning(), false)
    const after = await Sandbox.list({ query: { metadata: { suite: 'e2b-lifecycle' } } }).nextItems()
    assert.equal(after.length, 0)
  },

  // Two sandboxes at once through the same URL: routing by header keeps
  // them apart.
  async twoSandboxes() {
    const [a, b] = await Promise.all([Sandbox.create(), Sandbox.create()])
    try {
      await Promise.all([a.files.write('/home/user/who', 'a'), b.files.write('/home/user/who', 'b')])
      const [ra, rb] = await Promise.all([a.commands.run('cat /home/user/who'), b.commands.run('cat /home/user/who')])
      assert.equal(ra.stdout, 'a')
      assert.equal(rb.stdout, 'b')
    } finally {
      await Promise.all([a.kill(), b.kill()])
    }
  },

  async commandsForeground() {
    await withSandbox(async (sbx) => {
      const r = await sbx.commands.run('echo "hi $WHO"; echo oops >&2; pwd', { envs: { WHO: 'e2b' } })
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout, 'hi e2b\n/home/user\n')
      assert.equal(r.stderr, 'oops\n')
      const chunks = []
      await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 0.1; done', { onStdout: (d) => chunks.push(d) })
      assert.equal(chunks.join(''), '1\n2\n3\n')
      await assert.rejects(sbx.commands.run('exit 7'), (e) => e instanceof CommandExitError && e.exitCode === 7)
      const root = await sbx.commands.run('id -un; pwd', { user: 'root', cwd: '/tmp' })
      assert.equal(root.stdout, 'root\n/tmp\n')
    })
  },

  async commandsBackground() {
    await withSandbox(async (sbx) => {
      const h = await sbx.commands.run('sleep 1; echo done', { background: true })
      assert.ok(h.pid > 0)
      const procs = await sbx.commands.list()
      assert.ok(procs.some((p) => p.pid === h.pid), `pid ${h.pid} not listed`)
      await h.disconnect()
      const again = await sbx.commands.connect(h.pid)
      const r = await again.wait()
      assert.equal(r.stdout, 'done\n')
      await waitFor('the ended command to leave the list', async () =>
        !(await sbx.commands.list()).some((p) => p.pid === h.pid))
    })
  },

  async commandsStdin() {
    await withSandbox(async (sbx) => {
      const h = await sbx.commands.run('cat', { background: true, stdin: true })
      await sbx.commands.sendStdin(h.pid, 'hello ')
      await h.sendStdin('stdin')
      await h.closeStdin()
      const r = await h.wait()
      assert.equal(r.stdout, 'hello stdin')
    })
  },

  async commandsTimeout() {
    await withSandbox(async (sbx) => {
      const start = Date.now()
      await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 1000 }), (e) => e instanceof TimeoutError)
      assert.ok(Date.now() - start < 15000)
      await waitFor('the timed-out command to be killed', async () => (await sbx.commands.list()).length === 0)
    })
  },

  // kill() ends the whole tree: a backgrounded grandchild dies too.
  async commandsKill() {
    await withSandbox(async (sbx) => {
      let out = ''
      const h = await sbx.commands.run('sleep 1000 & echo $!; wait', { background: true, onStdout: (d) => { out += d } })
      await waitFor('the child pid', async () => out.includes('\n'))
      const child = parseInt(out, 10)
      assert.equal((await sbx.commands.run(`kill -0 ${child}`)).exitCode, 0)
      assert.equal(await h.kill(), true)
      await assert.rejects(h.wait(), (e) => e instanceof CommandExitError)
      await waitFor('the grandchild to die', async () => {
        try {
          await sbx.commands.run(`kill -0 ${child}`)
          return false
        } catch (e) {
          if (e instanceof CommandExitError) return true
          throw e
        }
      })
      assert.equal(await sbx.commands.kill(h.pid), false, 'killing twice finds nothing')
    })
  },

  async files() {
    await withSandbox(async (sbx) => {
      const info = await sbx.files.write('/home/user/dir/a.txt', 'hello files')
      assert.equal(info.path, '/home/user/dir/a.txt')
      assert.equal(await sbx.files.read('/home/user/dir/a.txt'), 'hello files')
      const bytes = await sbx.files.read('/home/user/dir/a.txt', { format: 'bytes' })
      assert.equal(Buffer.from(bytes).toString(), 'hello files')
      await sbx.files.write([
        { path: 'dir/b.txt', data: 'b' },
        { path: '/home/user/dir/c.txt', data: new Blob(['c']) },
      ])
      const entries = await sbx.files.list('/home/user/dir')
      assert.deepEqual(entries.map((e) => e.name).sort(), ['a.txt', 'b.txt', 'c.txt'])
      assert.ok(entries.every((e) => e.type === FileType.FILE))
      assert.equal(await sbx.files.exists('/home/user/dir/b.txt'), true)
      assert.equal(await sbx.files.exists('/home/user/dir/none'), false)
      assert.equal(await sbx.files.makeDir('/home/user/dir/sub'), true)
      assert.equal(await sbx.files.makeDir('/home/user/dir/sub'), false)
      await sbx.files.rename('/home/user/dir/a.txt', '/home/user/dir/sub/a.txt')
      assert.equal((await sbx.commands.run('cat /home/user/dir/sub/a.txt')).stdout, 'hello files')
      await sbx.files.remove('/home/user/dir/sub')
      assert.equal(await sbx.files.exists('/home/user/dir/sub'), false)
      await assert.rejects(sbx.files.read('/home/user/dir/none'))
      const fi = await sbx.files.getInfo('/home/user/dir/b.txt')
      assert.equal(fi.size, 1)
      assert.equal(fi.type, FileType.FILE)
      // Streams and gzip go as application/octet-stream.
      const stream = new ReadableStream({ start(c) { c.enqueue(new TextEncoder().encode('streamed')); c.close() } })
      await sbx.files.write('/home/user/dir/s.txt', stream)
      await sbx.files.write('/home/user/dir/g.txt', 'gzipped', { gzip: true })
      assert.equal(await sbx.files.read('/home/user/dir/s.txt'), 'streamed')
      assert.equal(await sbx.files.read('/home/user/dir/g.txt'), 'gzipped')
      const blob = await sbx.files.read('/home/user/dir/g.txt', { format: 'blob' })
      assert.equal(await blob.text(), 'gzipped')
      const rs = await sbx.files.read('/home/user/dir/s.txt', { format: 'stream' })
      assert.equal(await new Response(rs).text(), 'streamed')
    })
  },

  async pty() {
    await withSandbox(async (sbx) => {
      let out = ''
      const dec = new TextDecoder()
      const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d, { stream: true }) } })
      await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; echo "pty $TERM"\n'))
      await waitFor('the first answer', async () => out.includes('24 80') && out.includes('pty xterm-256color'))
      await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
      await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'))
      await waitFor('the resized answer', async () => out.includes('30 100'))
      await sbx.pty.sendInput(term.pid, new TextEncoder().encode('exit 0\n'))
      const r = await term.wait()
      assert.equal(r.exitCode, 0)
    })
  },

  async filesWatch() {
    await withSandbox(async (sbx) => {
      await sbx.files.makeDir('/home/user/watched')
      const events = []
      const w = await sbx.files.watchDir('/home/user/watched', (e) => events.push(e))
      await sbx.files.write('/home/user/watched/new.txt', 'x')
      await sbx.commands.run('echo more >> /home/user/watched/new.txt')
      await waitFor('a create event', async () => events.some((e) => e.name === 'new.txt' && e.type === 'create'))
      await sbx.files.remove('/home/user/watched/new.txt')
      await waitFor('a remove event', async () => events.some((e) => e.name === 'new.txt' && e.type === 'remove'))
      await w.stop()
    })
  },

  async setTimeout() {
    await withSandbox(async (sbx) => {
      await sbx.setTimeout(600_000)
      const info = await sbx.getInfo()
      const left = new Date(info.endAt).getTime() - Date.now()
      assert.ok(left > 540_000 && left <= 601_000, `endAt is ${left} ms away`)
      const metrics = await sbx.getMetrics()
      assert.equal(metrics.length, 1)
      assert.ok(metrics[0].cpuCount >= 1 && metrics[0].memTotal > 0 && metrics[0].memUsed > 0, JSON.stringify(metrics))
    })
  },

  async pauseResume() {
    await withSandbox(async (sbx) => {
      await sbx.files.write('/home/user/keep.txt', 'kept')
      assert.equal(await sbx.pause(), true)
      assert.equal((await sbx.getInfo()).state, 'paused')
      const again = await Sandbox.connect(sbx.sandboxId)
      assert.equal((await again.getInfo()).state, 'running')
      assert.equal(await again.files.read('/home/user/keep.txt'), 'kept')
    })
  },

  // Snapshots: create, list (all and the sandbox's), a sandbox from one
  // with the files, two copies that do not share writes, delete.
  async snapshots() {
    await withSandbox(async (sbx) => {
      await sbx.files.write('/home/user/snap.txt', 'before')
      const snap = await sbx.createSnapshot({ name: 'e2b-scenario' })
      assert.ok(snap.snapshotId.startsWith('snap_'), snap.snapshotId)
      assert.ok(snap.names.includes('e2b-scenario'), JSON.stringify(snap.names))
      await sbx.files.write('/home/user/snap.txt', 'after')
      const all = await Sandbox.listSnapshots().nextItems()
      assert.ok(all.some((s) => s.snapshotId === snap.snapshotId))
      const mine = await sbx.listSnapshots().nextItems()
      assert.ok(mine.some((s) => s.snapshotId === snap.snapshotId))
      const named = await Sandbox.listSnapshots({ name: 'e2b-scenario-nope' }).nextItems()
      assert.equal(named.length, 0)
      const a = await Sandbox.create(snap.snapshotId)
      const b = await Sandbox.create(snap.snapshotId)
      try {
        assert.equal(await a.files.read('/home/user/snap.txt'), 'before')
        await a.files.write('/home/user/snap.txt', 'changed in a')
        assert.equal(await b.files.read('/home/user/snap.txt'), 'before')
      } finally {
        await a.kill()
        await b.kill()
      }
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
      const gone = await Sandbox.listSnapshots().nextItems()
      assert.ok(!gone.some((s) => s.snapshotId === snap.snapshotId))
    })
  },

  // Fork: copies with the parent's files, the parent untouched.
  async fork() {
    await withSandbox(async (sbx) => {
      await sbx.files.write('/home/user/fork.txt', 'parent')
      const copies = await Sandbox.fork(sbx.sandboxId, { count: 2 })
      assert.equal(copies.length, 2)
      for (const copy of copies) {
        assert.ok(!(copy instanceof Error), String(copy))
        assert.notEqual(copy.sandboxId, sbx.sandboxId)
        try {
          assert.equal(await copy.files.read('/home/user/fork.txt'), 'parent')
          await copy.files.write('/home/user/fork.txt', 'child')
        } finally {
          await copy.kill()
        }
      }
      assert.equal(await sbx.files.read('/home/user/fork.txt'), 'parent')
    })
  },

  // lifecycle onTimeout pause: the timeout pauses, connect resumes, the
  // files stay; getInfo shows the rules.
  async autoPause() {
    const sbx = await Sandbox.create({ timeoutMs: 3_000, lifecycle: { onTimeout: 'pause', autoResume: false } })
    try {
      await sbx.files.write('/home/user/auto.txt', 'kept')
      const info = await sbx.getInfo()
      assert.equal(info.lifecycle?.onTimeout, 'pause', JSON.stringify(info.lifecycle))
      await waitFor('the timeout pause', async () => (await sbx.getInfo()).state === 'paused')
      await sbx.connect()
      assert.equal((await sbx.getInfo()).state, 'running')
      assert.equal(await sbx.files.read('/home/user/auto.txt'), 'kept')
    } finally {
      await sbx.kill().catch(() => {})
    }
  },

  // Signed download and upload URLs (no routing header), file metadata.
  async signedURLsAndMetadata() {
    await withSandbox(async (sbx) => {
      const info = await sbx.files.write('/home/user/m.txt', 'hello', { metadata: { author: 'scenario' } })
      assert.deepEqual(info.metadata, { author: 'scenario' })
      assert.deepEqual((await sbx.files.getInfo('/home/user/m.txt')).metadata, { author: 'scenario' })
      const down = await sbx.downloadUrl('/home/user/m.txt', { useSignatureExpiration: 10_000 })
      const res = await fetch(down)
      assert.equal(res.status, 200)
      assert.equal(await res.text(), 'hello')
      const expired = await fetch(await sbx.downloadUrl('/home/user/m.txt', { useSignatureExpiration: -10_000 }))
      assert.equal(expired.status, 401)
      const form = new FormData()
      form.append('file', 'uploaded')
      const up = await fetch(await sbx.uploadUrl('/home/user/up.txt', { useSignatureExpiration: 10_000 }), { method: 'POST', body: form })
      assert.equal(up.status, 200)
      assert.equal(await sbx.files.read('/home/user/up.txt'), 'uploaded')
    })
  },

  // Traffic to a port in the sandbox, routed by header like envd's (the
  // SDK's getHost(port) builds a hostname instead, so this uses fetch).
  async ports() {
    await withSandbox(async (sbx) => {
      await sbx.files.write('/home/user/www/hello.txt', 'from the sandbox')
      await sbx.commands.run('cd /home/user/www && exec python3 -m http.server 8000 --bind 127.0.0.1', { background: true, timeoutMs: 0 })
      const headers = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000', 'X-Access-Token': sbx.envdAccessToken }
      let body
      await waitFor('the web server', async () => {
        const res = await fetch(`${process.env.E2B_SANDBOX_URL}/hello.txt`, { headers })
        if (res.status !== 200) return false
        body = await res.text()
        return true
      })
      assert.equal(body, 'from the sandbox')
      const denied = await fetch(`${process.env.E2B_SANDBOX_URL}/hello.txt`, { headers: { ...headers, 'X-Access-Token': 'x' } })
      assert.equal(denied.status, 401)
      const closed = await fetch(`${process.env.E2B_SANDBOX_URL}/`, { headers: { ...headers, 'E2b-Sandbox-Port': '8001' } })
      assert.equal(closed.status, 502)
    }, CodeSandbox)
  },

  async runCode() {
    await withSandbox(async (sbx) => {
      await sbx.runCode('x = 1')
      const r = await sbx.runCode('x + 1')
      assert.equal(r.text, '2')
      const out = await sbx.runCode('print("to stdout")')
      assert.deepEqual(out.logs.stdout, ['to stdout\n'])
      const err = await sbx.runCode('1/0')
      assert.equal(err.error.name, 'ZeroDivisionError')
      const chart = await sbx.runCode(
        'import matplotlib.pyplot as plt\n' +
          'plt.plot([1, 2, 3], [4, 1, 9])\nplt.title("airlock")\nplt.show()',
        { timeoutMs: 120_000 },
      )
      const png = chart.results.find((res) => res.png)
      assert.ok(png, `no png result in ${JSON.stringify(chart.results.map((x) => x.formats()))}`)
      assert.equal(Buffer.from(png.png, 'base64').subarray(1, 4).toString(), 'PNG')
      // The figure's data comes with its PNG, in E2B's chart shape.
      assert.equal(png.chart?.type, 'line', JSON.stringify(png.chart))
      assert.equal(png.chart.title, 'airlock')
      assert.deepEqual(png.chart.elements.map((e) => e.points), [[[1, 4], [2, 1], [3, 9]]])
      assert.equal(png.chart.x_scale, 'linear')
      const bars = await sbx.runCode(
        'plt.figure(); plt.bar(["a", "b"], [3, 5], label="sales"); plt.ylabel("amount [EUR]"); plt.show()',
      )
      const bar = bars.results.find((res) => res.chart)?.chart
      assert.equal(bar?.type, 'bar', JSON.stringify(bars.results.map((x) => x.formats())))
      assert.deepEqual(bar.elements, [{ label: 'a', group: 'sales', value: 3 }, { label: 'b', group: 'sales', value: 5 }])
      assert.equal(bar.y_unit, 'EUR')
      const pie = await sbx.runCode('fig, axs = plt.subplots(1, 2); fig.suptitle("two"); axs[0].pie([1, 3], labels=["x", "y"]); axs[1].scatter([1, 2], [3, 4]); plt.show()')
      const sup = pie.results.find((res) => res.chart)?.chart
      assert.equal(sup?.type, 'superchart', JSON.stringify(sup))
      assert.equal(sup.title, 'two')
      assert.deepEqual(sup.elements.map((e) => e.type), ['pie', 'scatter'])
      assert.deepEqual(sup.elements[0].elements.map((e) => [e.label, e.angle]), [['x', 90], ['y', 270]])
      assert.deepEqual(sup.elements[1].elements[0].points, [[1, 3], [2, 4]])
      const df = await sbx.runCode(
        'import pandas as pd, numpy as np\npd.DataFrame({"n": [1, 2], "f": [0.5, np.nan], "s": ["a", "b"], "t": pd.to_datetime(["2024-01-02", "2024-03-04"])})',
      )
      assert.ok(df.results[0].html, 'the frame has no html')
      assert.deepEqual(df.results[0].data, { n: [1, 2], f: [0.5, null], s: ['a', 'b'], t: ['2024-01-02T00:00:00', '2024-03-04T00:00:00'] })
      const ctx = await sbx.createCodeContext()
      await sbx.runCode('y = 5', { context: ctx })
      assert.equal((await sbx.runCode('y * 2', { context: ctx })).text, '10')

      // The context calls carry only the SDK's trafficAccessToken (no
      // X-Access-Token): airlock takes it, and refuses them without it.
      assert.ok(sbx.trafficAccessToken, 'create gave no trafficAccessToken')
      assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id), 'the new context is not listed')
      const again = await CodeSandbox.connect(sbx.sandboxId)
      assert.ok((await again.listCodeContexts()).some((c) => c.id === ctx.id), 'a connected sandbox does not list it')
      await again.restartCodeContext(ctx)
      assert.equal((await sbx.runCode('"y" in dir()', { context: ctx })).text, 'False')
      const anonymous = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49999', 'Content-Type': 'application/json' }
      for (const [method, path] of [['GET', '/contexts'], ['POST', '/contexts'], ['POST', `/contexts/${ctx.id}/restart`], ['DELETE', `/contexts/${ctx.id}`]]) {
        const res = await fetch(`${process.env.E2B_SANDBOX_URL}${path}`, { method, headers: anonymous, body: method === 'POST' ? '{}' : undefined })
        assert.equal(res.status, 401, `${method} ${path} without a token`)
      }
      const wrong = await fetch(`${process.env.E2B_SANDBOX_URL}/contexts`, { headers: { ...anonymous, 'E2B-Traffic-Access-Token': 'x' } })
      assert.equal(wrong.status, 401)
      await sbx.removeCodeContext(ctx)
      assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id), 'the removed context is still listed')

      // envs: the cell's own, in each language; the context's variables,
      // its state and its execution count come through untouched.
      const before = await sbx.runCode('import os, subprocess; os.environ["KEEP"] = "ctx"')
      const withEnv = await sbx.runCode(
        'print(os.environ["KEEP"], os.environ["CELL_VAR"]); ' +
          'print(subprocess.run(["printenv", "CELL_VAR"], capture_output=True, text=True).stdout, end=""); x + 10',
        { envs: { KEEP: 'cell', CELL_VAR: "it's a value" } },
      )
      assert.equal(withEnv.logs.stdout.join(''), "cell it's a value\nit's a value\n")
      assert.equal(withEnv.text, '11')
      const after = await sbx.runCode('(os.environ["KEEP"], os.environ.get("CELL_VAR"), x)')
      assert.equal(after.text, "('ctx', None, 1)")
      assert.equal(withEnv.executionCount, before.executionCount + 1)
      assert.equal(after.executionCount, before.executionCount + 2)
      const js = await sbx.runCode('process.env.CELL_VAR', { language: 'javascript', envs: { CELL_VAR: 'js' } })
      assert.equal(js.text, "'js'")
      assert.equal((await sbx.runCode("'CELL_VAR' in process.env", { language: 'javascript' })).text, 'false')
      const sh = await sbx.runCode('echo "$CELL_VAR"', { language: 'bash', envs: { CELL_VAR: 'sh' } })
      assert.equal(sh.logs.stdout.join(''), 'sh\n')
      const shAfter = await sbx.runCode('echo "${CELL_VAR-unset}"', { language: 'bash' })
      assert.equal(shAfter.logs.stdout.join(''), 'unset\n')
      // A refused call leaves the SDK's request timer running (2.8.0 clears
      // it only on success): a short one keeps node from idling for 60 s.
      await assert.rejects(sbx.runCode('1', { envs: { 'BAD-NAME': 'x' }, requestTimeoutMs: 2000 }), /valid variable name|400/)
    }, CodeSandbox)
  },
}

const name = process.argv[2]
if (!scenarios[name]) {
  console.error(`unknown scenario ${name}; have: ${Object.keys(scenarios).join(' ')}`)
  process.exit(2)
}
try {
  await scenarios[name]()
} catch (e) {
  console.error(e && e.stack ? e.stack : e)
  process.exit(1)
}
