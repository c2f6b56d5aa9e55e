// batches.test.cjs — the OpenAI Batch API end to end through the pinned
// `openai` client, on a server started with --state-dir:
//   - the life cycle: files.create (purpose "batch"), batches.create with
//     metadata, batches.retrieve polled from validating to completed, the
//     output and error files read with files.content (one line per custom_id,
//     a bad JSONL line as an error line), the exact shapes of the file and
//     batch objects, files.list / batches.list with after / limit, delete;
//   - refusals naming the field: a purpose other than "batch", an unknown or
//     wrong-purpose input file, a completion window other than "24h", an
//     endpoint not served, a file over --max-file-size (413), an unknown batch
//     or file (404), and the Batch API without --state-dir;
//   - cancel: a running batch goes cancelling → cancelled, the rows answered
//     so far in its output file, a second cancel refused (409);
//   - priority (a real model, --max-batch 1): an interactive request sent
//     mid-batch goes before the batch rows waiting in the scheduler;
//   - a restart mid-batch: the server killed (SIGKILL) or stopped (SIGTERM:
//     the drain cuts the rows in flight) while rows run, started again on the
//     same state directory, the batch completes with every custom_id once, no
//     row cut short by the stop kept, and (on the fake engine, which counts
//     generations) the second server does not run again the rows the first
//     one had answered.
// Polls wait for states the server reports, never for a clock.
//
// HEARTH_E2E_SERVER  `hearth` (run as `hearth serve --model DIR`) or, with
//                    HEARTH_E2E_FAKE=1, the test server over the fake engine
//                    (whose "[slow]" prompts make 10 ms tokens)
// HEARTH_DEPS_DIR    where tools/fetch_test_deps.sh installed node_modules
// HEARTH_SOURCE_DIR  the repository (models/default is served)
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const H = require('./harness.cjs');

const FAKE = process.env.HEARTH_E2E_FAKE === '1';
const SERVER = process.env.HEARTH_E2E_SERVER;
const MODEL = process.env.HEARTH_E2E_MODEL || path.join(H.SOURCE, 'models/default');

const FILE_KEYS = ['bytes', 'created_at', 'filename', 'id', 'object', 'purpose', 'status', 'status_details'];
const BATCH_KEYS = ['cancelled_at', 'cancelling_at', 'completed_at', 'completion_window', 'created_at', 'endpoint',
  'error_file_id', 'errors', 'expired_at', 'expires_at', 'failed_at', 'finalizing_at', 'id', 'in_progress_at',
  'input_file_id', 'metadata', 'object', 'output_file_id', 'request_counts', 'status'];

const startServer = (extra = []) =>
  H.startServer(SERVER, FAKE ? ['--port', '0', '--served-model-name', 'default', ...extra]
    : ['serve', '--model', MODEL, '--port', '0', '--threads', '2', ...extra]);

let OpenAI, toFile, tmp;
const servers = [];

async function start(extra) {
  const srv = await startServer(extra);
  servers.push(srv);
  return { srv, client: new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'unused', maxRetries: 0 }) };
}

before(async () => {
  ({ OpenAI, toFile } = H.need('openai'));
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'hearth-batches-'));
});

after(async () => {
  for (const s of servers) if (s.proc.exitCode === null && s.proc.signalCode === null) await H.stopServer(s, 'SIGKILL');
  fs.rmSync(tmp, { recursive: true, force: true });
});

// The model name rows give: the server's own.
async function modelName(client) {
  return FAKE ? 'default' : (await client.models.list()).data[0].id;
}

function row(model, id, content, maxTokens = 6, extra = {}) {
  return JSON.stringify({
    custom_id: id, method: 'POST', url: '/v1/chat/completions',
    body: { model, messages: [{ role: 'user', content }], max_tokens: maxTokens, temperature: 0, ...extra },
  });
}

async function upload(client, lines, name = 'input.jsonl') {
  return client.files.create({ file: await toFile(Buffer.from(lines.join('\n') + '\n'), name), purpose: 'batch' });
}

// Polls until the batch's status is one of `want` (or ended otherwise: then it fails).
async function until(client, id, want, cond = () => true) {
  const endStates = ['completed', 'failed', 'expired', 'cancelled'];
  for (;;) {
    const b = await client.batches.retrieve(id);
    if (want.includes(b.status) && cond(b)) return b;
    if (endStates.includes(b.status)) assert.fail(`batch ${id} ended ${b.status}, waiting for ${want}: ${JSON.stringify(b)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function lines(client, fileId) {
  const text = await (await client.files.content(fileId)).text();
  return text.split('\n').filter((l) => l).map((l) => JSON.parse(l));
}

test('the life cycle: upload, create, poll, output and error files, list, delete', async () => {
  const { client } = await start(['--state-dir', path.join(tmp, 'life')]);
  const model = await modelName(client);
  const input = [];
  for (let i = 0; i < 6; i++) input.push(row(model, `req-${i}`, `Say ${i}`));
  input.splice(3, 0, '{"custom_id": "broken", this is not JSON');
  const file = await upload(client, input);
  assert.deepEqual(Object.keys(file).sort(), FILE_KEYS);
  assert.equal(file.object, 'file');
  assert.equal(file.purpose, 'batch');
  assert.equal(file.filename, 'input.jsonl');
  assert.equal(file.bytes, Buffer.byteLength(input.join('\n') + '\n'));
  assert.match(file.id, /^file-/);

  const created = await client.batches.create({
    input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h',
    metadata: { job: 'life' },
  });
  assert.deepEqual(Object.keys(created).sort(), BATCH_KEYS);
  assert.equal(created.object, 'batch');
  assert.match(created.id, /^batch_/);
  assert.equal(created.status, 'validating');
  assert.equal(created.input_file_id, file.id);
  assert.equal(created.completion_window, '24h');
  assert.equal(created.expires_at, created.created_at + 24 * 3600);
  assert.deepEqual(created.metadata, { job: 'life' });
  assert.equal(created.errors, null);
  assert.equal(created.output_file_id, null);

  const done = await until(client, created.id, ['completed']);
  assert.deepEqual(Object.keys(done).sort(), BATCH_KEYS);
  assert.deepEqual(done.request_counts, { total: 7, completed: 6, failed: 1 });
  for (const k of ['in_progress_at', 'finalizing_at', 'completed_at'])
    assert.ok(Number.isInteger(done[k]) && done[k] >= done.created_at, `${k} is set`);
  for (const k of ['failed_at', 'expired_at', 'cancelling_at', 'cancelled_at']) assert.equal(done[k], null);

  const out = await lines(client, done.output_file_id);
  assert.deepEqual(out.map((l) => l.custom_id).sort(), input.filter((l) => !l.includes('broken')).map((l) => JSON.parse(l).custom_id).sort());
  for (const l of out) {
    assert.deepEqual(Object.keys(l).sort(), ['custom_id', 'error', 'id', 'response']);
    assert.match(l.id, /^batch_req_/);
    assert.equal(l.error, null);
    assert.equal(l.response.status_code, 200);
    assert.equal(l.response.body.object, 'chat.completion');
    assert.equal(l.response.request_id, l.response.body.id);
    assert.ok(l.response.body.choices[0].message.content.length > 0);
  }
  const errs = await lines(client, done.error_file_id);
  assert.equal(errs.length, 1);
  assert.equal(errs[0].custom_id, null);
  assert.equal(errs[0].response, null);
  assert.equal(errs[0].error.code, 'invalid_json_line');
  assert.match(errs[0].error.message, /line 4/);

  const outFile = await client.files.retrieve(done.output_file_id);
  assert.deepEqual(Object.keys(outFile).sort(), FILE_KEYS);
  assert.equal(outFile.purpose, 'batch_output');

  // lists: newest first, paged by after / limit
  const files = (await client.files.list()).data.map((f) => f.id);
  assert.ok(files.includes(file.id) && files.includes(done.output_file_id) && files.includes(done.error_file_id));
  const onlyInputs = (await client.files.list({ purpose: 'batch' })).data.map((f) => f.id);
  assert.deepEqual(onlyInputs, [file.id]);
  const second = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  const page = await client.batches.list({ limit: 1 });
  assert.deepEqual(page.data.map((b) => b.id), [second.id]);
  assert.equal(page.has_more, true);
  const rest = await client.batches.list({ limit: 5, after: second.id });
  assert.deepEqual(rest.data.map((b) => b.id), [created.id]);
  assert.equal(rest.has_more, false);
  await until(client, second.id, ['completed']);

  const del = await client.files.del ? await client.files.del(file.id) : await client.files.delete(file.id);
  assert.deepEqual(del, { id: file.id, object: 'file', deleted: true });
  await assert.rejects(client.files.retrieve(file.id), (e) => e.status === 404 && e.code === 'not_found');
});

test('refusals: purpose, input file, window, endpoint, size, unknown ids, no state directory', async () => {
  const { client } = await start(['--state-dir', path.join(tmp, 'refusals'), '--max-file-size', '2000']);
  const model = await modelName(client);
  await assert.rejects(
    client.files.create({ file: await toFile(Buffer.from(row(model, 'a', 'x') + '\n'), 'a.jsonl'), purpose: 'fine-tune' }),
    (e) => e.status === 400 && e.param === 'purpose' && /batch/.test(e.message));
  await assert.rejects(upload(client, [row(model, 'big', 'x'.repeat(3000))]),
    (e) => e.status === 413 && e.code === 'file_too_large' && /2000/.test(e.message));
  const bad = { endpoint: '/v1/chat/completions', completion_window: '24h' };
  await assert.rejects(client.batches.create({ ...bad, input_file_id: 'file-nope' }),
    (e) => e.status === 400 && e.param === 'input_file_id' && /file-nope/.test(e.message));
  const file = await upload(client, [row(model, 'a', 'hello')]);
  await assert.rejects(client.batches.create({ ...bad, input_file_id: file.id, completion_window: '1h' }),
    (e) => e.status === 400 && e.param === 'completion_window');
  await assert.rejects(client.batches.create({ ...bad, input_file_id: file.id, endpoint: '/v1/moderations' }),
    (e) => e.status === 400 && e.param === 'endpoint');
  // an output file is not an input
  const b = await client.batches.create({ ...bad, input_file_id: file.id });
  const done = await until(client, b.id, ['completed']);
  await assert.rejects(client.batches.create({ ...bad, input_file_id: done.output_file_id }),
    (e) => e.status === 400 && e.param === 'input_file_id' && /batch_output/.test(e.message));
  await assert.rejects(client.batches.retrieve('batch_nope'), (e) => e.status === 404);
  await assert.rejects(client.batches.cancel('batch_nope'), (e) => e.status === 404);
  await assert.rejects(client.files.content('file-nope'), (e) => e.status === 404);
  await assert.rejects(client.batches.cancel(b.id), (e) => e.status === 409 && /completed/.test(e.message));

  const { client: bare } = await start([]);
  await assert.rejects(bare.batches.list(), (e) => e.status === 400 && e.code === 'batch_api_disabled' && /--state-dir/.test(e.message));
});

// Rows long enough to be caught running: the fake engine's "[slow]" tokens
// come 10 ms apart; a real model makes many more of them, past its EOS.
const SLOW_TOKENS = FAKE ? 25 : 400;
function slowRows(model, n) {
  const out = [];
  for (let i = 0; i < n; i++)
    out.push(row(model, `slow-${i}`, FAKE ? `[slow] row ${i}` : `Count from ${i} upwards.`, SLOW_TOKENS, FAKE ? {} : { ignore_eos: true }));
  return out;
}

test('cancel: cancelling, then cancelled with the rows answered so far', async () => {
  const { client } = await start(['--state-dir', path.join(tmp, 'cancel'), '--batch-concurrency', '1']);
  const model = await modelName(client);
  const file = await upload(client, slowRows(model, 40));
  const b = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  await until(client, b.id, ['in_progress'], (x) => x.request_counts.completed >= 1);
  const c = await client.batches.cancel(b.id);
  assert.ok(['cancelling', 'cancelled'].includes(c.status), c.status);
  assert.ok(Number.isInteger(c.cancelling_at));
  const end = await until(client, b.id, ['cancelled']);
  assert.ok(Number.isInteger(end.cancelled_at));
  assert.equal(end.completed_at, null);
  assert.ok(end.request_counts.completed >= 1 && end.request_counts.completed < 40, JSON.stringify(end.request_counts));
  const out = await lines(client, end.output_file_id);
  assert.equal(out.length, end.request_counts.completed);
  assert.equal(new Set(out.map((l) => l.custom_id)).size, out.length);
  await assert.rejects(client.batches.cancel(b.id), (e) => e.status === 409);
});

// With room for one running sequence and three rows in flight, an
// interactive request sent mid-batch is admitted as soon as the running row
// ends, ahead of the two rows waiting before it: while it is answered, at most
// the row running when it came (and one that ended as it was sent) complete.
// In arrival order the two waiting rows would finish first (three or more).
test('an interactive request is admitted before the waiting batch rows', { skip: FAKE }, async () => {
  const { srv, client } = await start(['--state-dir', path.join(tmp, 'priority'), '--max-batch', '1', '--batch-concurrency', '3']);
  const model = await modelName(client);
  const rows = [];
  for (let i = 0; i < 12; i++)
    rows.push(JSON.stringify({ custom_id: `p-${i}`, method: 'POST', url: '/v1/completions',
      body: { model, prompt: `Row ${i}:`, max_tokens: 500, temperature: 0, ignore_eos: true } }));
  const file = await upload(client, rows);
  const b = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/completions', completion_window: '24h' });
  const before = await until(client, b.id, ['in_progress'], (x) => x.request_counts.completed >= 1);
  await client.completions.create({ model, prompt: 'Hello', max_tokens: 4, temperature: 0 });
  const after = await client.batches.retrieve(b.id);
  const during = after.request_counts.completed - before.request_counts.completed;
  assert.ok(during <= 2, `${during} batch rows completed while the interactive request waited and ran:\n${srv.log.slice(-3000)}`);
  await client.batches.cancel(b.id);
  await until(client, b.id, ['cancelled']);
});

for (const signal of ['SIGKILL', 'SIGTERM']) {
  test(`a restart mid-batch (${signal}) resumes it: every custom_id once, answered rows not run again`, async () => {
    const dir = path.join(tmp, `restart-${signal}`);
    const first = await start(['--state-dir', dir, '--batch-concurrency', '2']);
    const model = await modelName(first.client);
    const N = 16;
    const maxTokens = SLOW_TOKENS;
    const file = await upload(first.client, slowRows(model, N));
    const b = await first.client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    const mid = await until(first.client, b.id, ['in_progress'], (x) => x.request_counts.completed >= 4);
    const code = await H.stopServer(first.srv, signal);
    if (signal === 'SIGTERM') assert.equal(code, 0); // the drain cuts the rows in flight and exits
    const answered = mid.request_counts.completed; // at least this many were on disk when it stopped

    const second = await start(['--state-dir', dir, '--batch-concurrency', '2']);
    const again = await second.client.batches.retrieve(b.id);
    assert.equal(again.id, b.id);
    const end = await until(second.client, b.id, ['completed']);
    assert.deepEqual(end.request_counts, { total: N, completed: N, failed: 0 });
    const out = await lines(second.client, end.output_file_id);
    const ids = out.map((l) => l.custom_id).sort();
    const want = [];
    for (let i = 0; i < N; i++) want.push(`slow-${i}`);
    assert.deepEqual(ids, want.sort());
    assert.equal(end.error_file_id, null);
    // no row cut short by the stop was kept: each ran to its max_tokens (or its end)
    for (const l of out) {
      const c = l.response.body.choices[0];
      assert.ok(c.finish_reason === 'stop' || l.response.body.usage.completion_tokens === maxTokens,
        `${l.custom_id}: ${l.response.body.usage.completion_tokens} tokens, ${c.finish_reason}`);
    }
    if (FAKE) { // the fake server reports its generations when it stops
      assert.equal(await H.stopServer(second.srv, 'SIGTERM'), 0);
      const m = second.srv.log.match(/stopped \((\d+) generations/);
      assert.ok(m, second.srv.log);
      console.log(`restart (${signal}): ${answered} answered before the stop, ${m[1]} run after`);
      assert.ok(Number(m[1]) <= N - answered, `the second server ran ${m[1]} rows; ${answered} of ${N} were answered before`);
    }
  });
}
