// Scenarios of the published SDK's Template() builder against airlock's
// templates API (docs/e2b-templates.md). templates_test.go runs
// `node templates.mjs <name>` with E2B_API_URL / E2B_SANDBOX_URL pointing at
// an in-process airlock, E2B_API_KEY set to a tenant's key and
// OTHER_API_KEY to another tenant's. A scenario throws on any mismatch.
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Sandbox, Template, waitForFile, waitForTimeout } from 'e2b'

const other = { apiKey: process.env.OTHER_API_KEY }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// context makes a file context: folder/test.txt, a relative symlink to it
// and an executable script.
function context() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'airlock-tmpl-'))
  fs.mkdirSync(path.join(dir, 'folder'))
  fs.writeFileSync(path.join(dir, 'folder', 'test.txt'), 'This is a test file.')
  fs.symlinkSync('test.txt', path.join(dir, 'folder', 'link.txt'))
  fs.writeFileSync(path.join(dir, 'hello.sh'), 'echo hello from the script\n')
  return dir
}

async function withSandbox(template, fn, opts) {
  const sbx = await Sandbox.create(template, opts)
  try {
    await fn(sbx)
  } finally {
    await sbx.kill().catch(() => {})
  }
}

const scenarios = {
  // Template.build from E2B's base image with files, commands, env, a
  // workdir and a start command; the sandbox has all of it. exists,
  // tags, and a build from the built template.
  async build() {
    const dir = context()
    const logs = []
    const template = Template({ fileContextPath: dir })
      .fromBaseImage()
      .copy('folder/*', 'folder', { forceUpload: true })
      .copy('hello.sh', '/opt/tools/', { mode: 0o755 })
      .runCmd('cat folder/test.txt')
      .runCmd('test "$(whoami)" = root && touch /made-by-root', { user: 'root' })
      .setEnvs({ GREETING: 'hi "there" $HOME' })
      .setWorkdir('/app')
      .setStartCmd('touch /tmp/started && sleep infinity', waitForFile('/tmp/started'))

    // skipCache: the shared layer cache of the test daemons holds this
    // build's layers from an earlier run; the RUN runs again all the same.
    const info = await Template.build(template, 'sdk-app:v1', {
      skipCache: true,
      onBuildLogs: (e) => logs.push(e.message),
    })
    assert.equal(info.templateId, 'sdk-app')
    assert.ok(info.buildId)
    assert.ok(logs.some((l) => l.includes('This is a test file.')), `the RUN's output is in the log:\n${logs.join('\n')}`)

    assert.equal(await Template.exists('sdk-app'), true)
    assert.equal(await Template.exists('base'), true)
    assert.equal(await Template.exists(`nonexistent-${Date.now()}`), false)
    assert.equal(await Template.exists('sdk-app', other), false, "another tenant's template does not exist for it")

    for (const id of ['sdk-app', 'sdk-app:v1']) {
      await withSandbox(id, async (sbx) => {
        const r = await sbx.commands.run(
          'pwd; whoami; echo "$GREETING"; cat /home/user/folder/test.txt; echo; readlink /home/user/folder/link.txt; ' +
            'stat -c %U /home/user/folder/test.txt; stat -c %a /opt/tools/hello.sh; /opt/tools/hello.sh; ls /made-by-root /tmp/started'
        )
        assert.equal(
          r.stdout,
          '/app\nuser\nhi "there" $HOME\nThis is a test file.\ntest.txt\nuser\n755\nhello from the script\n/made-by-root\n/tmp/started\n'
        )
      })
    }
    await assert.rejects(Sandbox.create('sdk-app', other), /not found/i)

    // Tags name versions.
    const tagged = await Template.assignTags('sdk-app:v1', ['production', 'stable'])
    assert.equal(tagged.buildId, info.buildId)
    assert.deepEqual(tagged.tags, ['production', 'stable'])
    await assert.rejects(Template.assignTags('sdk-app:v1', ':invalid-tag'))
    let tags = await Template.getTags('sdk-app')
    assert.deepEqual(tags.map((t) => t.tag), ['production', 'stable', 'v1'])
    assert.ok(tags.every((t) => t.buildId === info.buildId && t.createdAt instanceof Date))
    await Template.removeTags('sdk-app', 'stable')
    tags = await Template.getTags('sdk-app')
    assert.deepEqual(tags.map((t) => t.tag), ['production', 'v1'])
    await withSandbox('sdk-app:production', async (sbx) => {
      assert.equal((await sbx.commands.run('cat /home/user/folder/test.txt')).stdout, 'This is a test file.')
    })

    // A template from the template: its files, user and workdir carry over.
    await Template.build(
      Template().fromTemplate('sdk-app:v1').runCmd('test "$(pwd)" = /app && test -f /home/user/folder/test.txt && whoami > whoami.txt'),
      'sdk-child'
    )
    await withSandbox('sdk-child', async (sbx) => {
      assert.equal((await sbx.commands.run('cat /app/whoami.txt')).stdout, 'user\n')
    })
  },

  // fromTemplate('base'), in the background, with the status polled until
  // ready.
  // Its start command ends before its ready command passes, which is
  // fine on E2B (and so here).
  async background() {
    const info = await Template.buildInBackground(
      Template()
        .fromTemplate('base')
        .runCmd('echo built in the $((1+1))nd background')
        .setStartCmd('echo started > /tmp/started', waitForTimeout(1000)),
      'sdk-bg',
      { skipCache: true }
    )
    let offset = 0
    const logs = []
    for (let i = 0; ; i++) {
      const st = await Template.getBuildStatus(info, { logsOffset: offset })
      offset += st.logEntries.length
      logs.push(...st.logEntries.map((e) => e.message))
      if (st.status === 'ready') break
      assert.equal(st.status, 'building')
      assert.ok(i < 600, 'the build ends')
      await sleep(200)
    }
    assert.ok(logs.some((l) => l.includes('built in the 2nd background')), logs.join('\n'))
    await withSandbox('sdk-bg', async (sbx) => {
      assert.equal((await sbx.commands.run('whoami; pwd; cat /tmp/started')).stdout, 'user\n/home/user\nstarted\n')
    })
  },

  // What cannot build says why: a failing step, an image from a registry.
  async errors() {
    await assert.rejects(
      Template.build(Template().fromTemplate('base').runCmd('echo failing; exit 3'), 'sdk-fail'),
      (e) => e.name === 'BuildError' && /exit/.test(e.message)
    )
    await assert.rejects(
      Template.build(Template().fromImage('ubuntu:22.04').runCmd('true'), 'sdk-ubuntu'),
      /images from registries are not available on this server/
    )
    await assert.rejects(Template.build(Template().fromTemplate('base'), 'Bad Name'), /must match/)
  },
}

const name = process.argv[2]
if (!scenarios[name]) {
  console.error(`unknown scenario ${name}; have: ${Object.keys(scenarios).join(', ')}`)
  process.exit(2)
}
await scenarios[name]()
