// embeddings.test.cjs — POST /v1/embeddings and POST /v1/signal end to end,
// through the real OpenAI client (npm "openai", pinned in package-lock.json)
// and plain fetch, under node's built-in test runner.
//
// HEARTH_E2E_SERVER  `hearth` (run as `hearth serve --model DIR`, DIR the
//                    built-in model models/default or $HEARTH_E2E_MODEL) or,
//                    with HEARTH_E2E_FAKE=1, the test server over the fake
//                    engine, which has no embeddings: there the requests are
//                    checked and refused, and GET /v1 says so
// HEARTH_DEPS_DIR    where tools/fetch_test_deps.sh installed node_modules
// HEARTH_SOURCE_DIR  the repository, to find the model folder
//
// The built-in model is a chat model: its embeddings are its last-token
// pooled final hidden states, which is all these tests need of them.
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const FAKE = process.env.HEARTH_E2E_FAKE === '1';
const SERVER = process.env.HEARTH_E2E_SERVER;
const H = require('./harness.cjs');
const { SOURCE, stopServer } = H;
const MODEL = process.env.HEARTH_E2E_MODEL || path.join(SOURCE, 'models/default');
const loadOpenAI = () => H.need('openai').OpenAI;

function startServer() {
  if (!FAKE && !fs.existsSync(path.join(MODEL, 'config.json'))) throw new Error(`no model to serve: ${MODEL} has no config.json`);
  return H.startServer(SERVER, FAKE ? ['--port', '0'] : ['serve', '--model', MODEL, '--port', '0', '--threads', '2', '--prefill-chunk', '16']);
}




// The ids `hearth tokenize` gives for text (with the tokenizer's BOS, as a raw prompt).
function tokenize(text) {
  return JSON.parse(execFileSync(SERVER, ['tokenize', '--model', MODEL, text], { encoding: 'utf8' }));
}

let srv, client;

before(async () => {
  srv = await startServer();
  client = new OpenAI(loadOpenAI());
});

function OpenAI(Cls) {
  return new Cls({ baseURL: srv.url + '/v1', apiKey: 'unused', maxRetries: 0 });
}

after(async () => {
  const code = await stopServer(srv);
  assert.equal(code, 0, `server exited with ${code}:\n${srv ? srv.log.slice(-4000) : ''}`);
});

async function post(route, body) {
  const r = await fetch(srv.url + route, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const maxDiff = (a, b) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);

async function refused(promise, param, what) {
  await assert.rejects(promise, (e) => {
    assert.equal(e.status, 400, `${what}: status ${e.status}: ${e.message}`);
    if (param) assert.equal(e.param, param, `${what}: param ${e.param}: ${e.message}`);
    return true;
  });
}

test('GET /v1 says whether embeddings and the signal are served', async () => {
  const r = await fetch(srv.url + '/v1');
  const j = await r.json();
  const paths = j.data.map((e) => e.path);
  assert.ok(paths.includes('/v1/embeddings') && paths.includes('/v1/signal'));
  assert.equal(j.capabilities.embeddings, !FAKE);
  assert.equal(j.capabilities.signal, !FAKE);
  if (!FAKE) assert.equal(j.capabilities.embedding_dimensions, 256);
});

test('bad requests are refused naming the field', async () => {
  await refused(client.embeddings.create({ model: 'm', input: '' }), 'input', 'empty string');
  await refused(client.embeddings.create({ model: 'm', input: [] }), 'input', 'empty array');
  await refused(client.embeddings.create({ model: 'm', input: ['a', ''] }), 'input[1]', 'empty string in an array');
  await refused(client.embeddings.create({ model: 'm', input: [[1, 2], []] }), 'input[1]', 'empty id array');
  await refused(client.embeddings.create({ model: 'm', input: ['a', [1]] }), 'input[1]', 'mixed array');
  await refused(client.embeddings.create({ model: 'm', input: 'a', encoding_format: 'int8' }), 'encoding_format', 'bad encoding_format');
  await refused(client.embeddings.create({ model: 'm', input: 'a', dimensions: 0 }), 'dimensions', 'dimensions 0');
  let r = await post('/v1/embeddings', { input: 'a', encoding_format: 'float', dimensions: 1.5 });
  assert.equal(r.status, 400);
  r = await post('/v1/signal', { prompt: 'a', bins: 0 });
  assert.equal(r.status, 400);
  assert.equal(r.body.error.param, 'bins');
  r = await post('/v1/signal', { prompt: 'a', messages: [{ role: 'user', content: 'b' }] });
  assert.equal(r.status, 400);
  r = await post('/v1/signal', { prompt: '' });
  assert.equal(r.status, 400);
  assert.equal(r.body.error.param, 'prompt');
  r = await post('/v1/signal', { top: 3 });
  assert.equal(r.status, 400);
  if (FAKE) {
    r = await post('/v1/embeddings', { input: 'a' });
    assert.equal(r.status, 400);
    assert.equal(r.body.error.code, 'embeddings_unsupported');
  }
});

test('a text embeds to a unit vector, as floats and as base64 alike', { skip: FAKE }, async () => {
  const b64 = await client.embeddings.create({ model: 'default', input: 'In the beginning God created the heaven' });
  assert.equal(b64.object, 'list');
  assert.equal(b64.data.length, 1);
  assert.equal(b64.data[0].index, 0);
  const v = b64.data[0].embedding; // the client asked for base64 and decoded it
  assert.equal(v.length, 256);
  assert.ok(Math.abs(norm(v) - 1) < 1e-5, `norm ${norm(v)}`);
  assert.equal(b64.usage.prompt_tokens, tokenize('In the beginning God created the heaven').length);
  assert.equal(b64.usage.total_tokens, b64.usage.prompt_tokens);
  const fl = await client.embeddings.create({ model: 'default', input: 'In the beginning God created the heaven', encoding_format: 'float' });
  assert.ok(maxDiff(fl.data[0].embedding, v) < 1e-6);
  // the raw base64 is little-endian float32
  const raw = await post('/v1/embeddings', { input: 'In the beginning God created the heaven', encoding_format: 'base64' });
  const buf = Buffer.from(raw.body.data[0].embedding, 'base64');
  assert.equal(buf.length, 256 * 4);
  assert.ok(Math.abs(buf.readFloatLE(0) - v[0]) < 1e-7);
});

test('arrays of texts and of ids give the same vectors as one at a time', { skip: FAKE }, async () => {
  const texts = ['And the earth was without form', 'Let there be light', 'and there was light, and it was good'];
  const one = [];
  for (const t of texts) one.push((await client.embeddings.create({ model: 'default', input: t, encoding_format: 'float' })).data[0].embedding);
  const all = await client.embeddings.create({ model: 'default', input: texts, encoding_format: 'float' });
  assert.deepEqual(all.data.map((d) => d.index), [0, 1, 2]);
  for (let i = 0; i < 3; i++) assert.ok(maxDiff(all.data[i].embedding, one[i]) < 1e-5, `input ${i}`);
  const ids = texts.map(tokenize);
  assert.equal(all.usage.prompt_tokens, ids.reduce((s, a) => s + a.length, 0));
  const byIds = await client.embeddings.create({ model: 'default', input: ids, encoding_format: 'float' });
  for (let i = 0; i < 3; i++) assert.ok(maxDiff(byIds.data[i].embedding, one[i]) < 1e-5, `ids ${i}`);
  const single = await client.embeddings.create({ model: 'default', input: ids[1], encoding_format: 'float' });
  assert.equal(single.data.length, 1);
  assert.ok(maxDiff(single.data[0].embedding, one[1]) < 1e-5);
  // different texts, different vectors
  assert.ok(maxDiff(one[0], one[1]) > 1e-3);
});

test('dimensions truncates and renormalises; too many is refused', { skip: FAKE }, async () => {
  const full = (await client.embeddings.create({ model: 'default', input: 'Let there be light', encoding_format: 'float' })).data[0].embedding;
  const r = await client.embeddings.create({ model: 'default', input: 'Let there be light', encoding_format: 'float', dimensions: 32 });
  const v = r.data[0].embedding;
  assert.equal(v.length, 32);
  assert.ok(Math.abs(norm(v) - 1) < 1e-5);
  const n = norm(full.slice(0, 32));
  assert.ok(maxDiff(v, full.slice(0, 32).map((x) => x / n)) < 1e-5);
  await refused(client.embeddings.create({ model: 'default', input: 'a', dimensions: 257 }), 'dimensions', 'dimensions 257');
});

test('an instruction puts texts in the query form', { skip: FAKE }, async () => {
  const task = 'Given a verse, find the next one';
  const a = await post('/v1/embeddings', { input: 'Let there be light', instruction: task, encoding_format: 'float' });
  const b = await post('/v1/embeddings', { input: `Instruct: ${task}\nQuery:Let there be light`, encoding_format: 'float' });
  assert.equal(a.status, 200);
  assert.ok(maxDiff(a.body.data[0].embedding, b.body.data[0].embedding) < 1e-6);
  assert.equal(a.body.usage.prompt_tokens, b.body.usage.prompt_tokens);
});

test('too long and out-of-vocabulary inputs are refused naming them', { skip: FAKE }, async () => {
  const long = 'and it was so '.repeat(400); // well over the built-in model's 1024-token context
  await assert.rejects(client.embeddings.create({ model: 'default', input: ['short', long] }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.code, 'context_length_exceeded');
    assert.match(e.message, /input 1/);
    return true;
  });
  await refused(client.embeddings.create({ model: 'default', input: [[1, 2, 999999]] }), 'input[0]', 'id outside the vocabulary');
  const r = await post('/v1/embeddings', { model: 'no-such-model', input: 'a' });
  assert.equal(r.status, 404);
});

test('embeddings run beside a streaming generation without changing it', { skip: FAKE }, async () => {
  const params = { model: 'default', messages: [{ role: 'user', content: 'Tell of the flood.' }], max_tokens: 48, temperature: 0 };
  const alone = (await client.chat.completions.create(params)).choices[0].message.content;
  const stream = await client.chat.completions.create({ ...params, stream: true });
  let text = '', embedded = null;
  for await (const c of stream) {
    if (c.choices.length && c.choices[0].delta.content) {
      text += c.choices[0].delta.content;
      if (!embedded) embedded = client.embeddings.create({ model: 'default', input: ['Noah', 'the ark', 'forty days'], encoding_format: 'float' });
    }
  }
  const e = await embedded;
  assert.equal(e.data.length, 3);
  for (const d of e.data) assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5);
  assert.equal(text, alone);
});

test('the signal: histogram, entropy and best tokens of the next token', { skip: FAKE }, async () => {
  const r = await post('/v1/signal', { prompt: 'In the beginning God', bins: 10, top: 3 });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const s = r.body;
  assert.equal(s.object, 'signal');
  assert.deepEqual(s.range, [-30, 0]);
  assert.equal(s.bins.length, 10);
  assert.equal(s.bins[0].lo, -30);
  assert.equal(s.bins[9].hi, 0);
  assert.equal(s.bins.reduce((n, b) => n + b.count, 0), s.tokens);
  assert.ok(Math.abs(s.bins.reduce((m, b) => m + b.mass, 0) - 1) < 1e-6);
  assert.ok(s.entropy > 0);
  assert.equal(s.top.length, 3);
  assert.ok(s.top[0].logprob >= s.top[1].logprob && s.top[1].logprob >= s.top[2].logprob);
  assert.equal(s.top[0].logprob, s.max_logprob);
  assert.equal(typeof s.top[0].token, 'string');
  assert.equal(s.usage.prompt_tokens, tokenize('In the beginning God').length);
  // the same prompt as ids: the same distribution
  const byIds = await post('/v1/signal', { prompt: tokenize('In the beginning God'), bins: 10, top: 3 });
  assert.deepEqual(byIds.body.top.map((t) => t.id), s.top.map((t) => t.id));
  assert.deepEqual(byIds.body.bins.map((b) => b.count), s.bins.map((b) => b.count));
  // chat messages are rendered with the template; defaults: 20 bins, 5 tokens
  const chat = await post('/v1/signal', { messages: [{ role: 'user', content: 'Who made the light?' }] });
  assert.equal(chat.status, 200, JSON.stringify(chat.body));
  assert.equal(chat.body.bins.length, 20);
  assert.equal(chat.body.top.length, 5);
  // the greedy next token of a completion is the signal's best token
  const comp = await client.completions.create({ model: 'default', prompt: 'In the beginning God', max_tokens: 1, temperature: 0, logprobs: 1 });
  assert.equal(comp.choices[0].text, s.top[0].token);
});
