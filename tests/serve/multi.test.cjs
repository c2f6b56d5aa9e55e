// multi.test.cjs — several models in one server: `hearth serve --model A
// --model B` with A the built-in model (models/default) and B the tiny Gemma 4
// with a vision tower (tests/fixtures/mm/gemma4_vision-f32). Each model is
// first served alone for its reference replies; then both at once, where
// requests to each — OpenAI, Anthropic-free plain fetch and the real Ollama
// client (npm "ollama"), streamed and whole — go out interleaved and
// concurrently and must equal the replies of the model served alone.
//
// HEARTH_E2E_SERVER  `hearth`
// HEARTH_DEPS_DIR    where tools/fetch_test_deps.sh installed node_modules
// HEARTH_SOURCE_DIR  the repository, to find the model folders
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const SERVER = process.env.HEARTH_E2E_SERVER;
const H = require('./harness.cjs');
const A = path.join(H.SOURCE, 'models/default');
const B = path.join(H.SOURCE, 'tests/fixtures/mm/gemma4_vision-f32');
const NA = 'default', NB = 'gemma4_vision-f32';
const ARGS = ['--port', '0', '--threads', '2', '--prefill-chunk', '16'];

// The requests each model answers, every one greedy so a model's reply is one text.
const PROMPTS = ['Once upon a time', 'The LORD said', 'In the beginning', 'Hello there'];
const jobs = [];
for (const [name] of [[NA], [NB]])
  PROMPTS.forEach((p, i) => {
    jobs.push({ name, kind: 'chat', body: { model: name, messages: [{ role: 'user', content: p }], max_tokens: 8 + i, temperature: 0 } });
    jobs.push({ name, kind: 'completion', body: { model: name, prompt: p, max_tokens: 8 + i, temperature: 0 } });
    jobs.push({ name, kind: 'ollama', body: { model: name, prompt: p, raw: true, stream: true, options: { num_predict: 8 + i, temperature: 0 } } });
  });

let srv, client;
const solo = new Map(); // job index → the text the model gave served alone

async function run(url, j, ollama) {
  if (j.kind === 'ollama') {
    const parts = [];
    for await (const p of await ollama.generate(j.body)) parts.push(p);
    assert.equal(parts[parts.length - 1].model, j.name);
    return parts.map((p) => p.response).join('');
  }
  const route = j.kind === 'chat' ? '/v1/chat/completions' : '/v1/completions';
  const r = await fetch(url + route, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(j.body) });
  const o = await r.json();
  assert.equal(r.status, 200, JSON.stringify(o));
  assert.equal(o.model, j.name);
  return j.kind === 'chat' ? o.choices[0].message.content : o.choices[0].text;
}

before(async () => {
  for (const d of [A, B]) if (!fs.existsSync(path.join(d, 'config.json'))) throw new Error(`no model at ${d}`);
  const { Ollama } = H.need('ollama');
  for (const [dir, name] of [[A, NA], [B, NB]]) {
    const alone = await H.startServer(SERVER, ['serve', '--model', dir, ...ARGS]);
    try {
      const ollama = new Ollama({ host: alone.url });
      for (let i = 0; i < jobs.length; i++) if (jobs[i].name === name) solo.set(i, await run(alone.url, jobs[i], ollama));
    } finally {
      assert.equal(await H.stopServer(alone), 0);
    }
  }
  srv = await H.startServer(SERVER, ['serve', '--model', A, '--model', B, ...ARGS]);
  client = new Ollama({ host: srv.url });
});

after(async () => {
  const code = await H.stopServer(srv);
  assert.equal(code, 0, `server exited with ${code}:\n${srv ? srv.log.slice(-4000) : ''}`);
});

test('both models are listed: /v1/models, /api/tags, /api/ps; /api/show tells them apart', async () => {
  const m = await (await fetch(srv.url + '/v1/models')).json();
  assert.deepEqual(m.data.map((x) => x.id), [NA, NB]);
  assert.deepEqual(m.data.map((x) => x.context_length), [1024, 512]);
  assert.deepEqual(m.data.map((x) => x.state), ['loaded', 'loaded']);
  assert.deepEqual(m.data.map((x) => x.capabilities.includes('vision')), [false, true]);
  assert.ok(m.data.every((x) => x.capabilities.includes('chat') && x.capabilities.includes('completion')));
  for (const id of [NA, NB]) assert.equal((await (await fetch(srv.url + '/v1/models/' + id)).json()).id, id);
  assert.deepEqual((await client.list()).models.slice(0, 2).map((x) => [x.name, x.details.family]), [[NA, 'llama'], [NB, 'gemma4']]);
  assert.deepEqual((await client.ps()).models.map((x) => x.name), [NA, NB]);
  assert.equal((await client.show({ model: NB })).capabilities.includes('vision'), true);
  assert.equal((await client.show({ model: NA })).capabilities.includes('vision'), false);
});

test('requests to both, interleaved and concurrent, equal each model served alone', async () => {
  // interleave: A's first, B's first, A's second, ...
  const half = jobs.length / 2;
  const order = [];
  for (let i = 0; i < half; i++) order.push(i, i + half);
  const texts = await Promise.all(order.map((i) => run(srv.url, jobs[i], client)));
  order.forEach((i, k) => assert.equal(texts[k], solo.get(i), `${jobs[i].name} ${jobs[i].kind} ${JSON.stringify(jobs[i].body)}`));
  // the two models do answer differently (else the check above could not tell them apart)
  assert.notEqual(solo.get(0), solo.get(half));
});

test('a request naming no model gets the first; an unknown one is refused naming both', async () => {
  const body = { ...jobs[1].body };
  delete body.model;
  const r = await (await fetch(srv.url + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) })).json();
  assert.equal(r.choices[0].text, solo.get(1));
  const u = await fetch(srv.url + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'nobody', messages: [{ role: 'user', content: 'x' }] }) });
  assert.equal(u.status, 404);
  assert.match((await u.json()).error.message, /this server serves 'default', 'gemma4_vision-f32'/);
  await assert.rejects(client.chat({ model: 'nobody', messages: [{ role: 'user', content: 'x' }] }), (e) => e.status_code === 404);
});

test('an image goes to the model with a vision tower, and is refused by name for the other', async () => {
  const png = fs.readFileSync(path.join(B, 'img_a.png')).toString('base64');
  const ok = await client.chat({ model: NB, messages: [{ role: 'user', content: 'What is this?', images: [png] }], options: { num_predict: 3, temperature: 0 } });
  assert.equal(ok.done, true);
  assert.ok(ok.prompt_eval_count > 10, `the image's soft tokens count: ${ok.prompt_eval_count}`);
  await assert.rejects(client.chat({ model: NA, messages: [{ role: 'user', content: 'What is this?', images: [png] }] }),
    (e) => e.status_code === 400 && /messages\[0\]\.images\[0\]: model default has no vision tower/.test(e.error));
});

test('two models of one name, or --kv-store with two, are refused at start', () => {
  const dup = spawnSync(SERVER, ['serve', '--model', A, '--model', A, '--port', '0'], { encoding: 'utf8', timeout: 60000 });
  assert.notEqual(dup.status, 0);
  assert.match(dup.stderr, /two models are called 'default'/);
  const kv = spawnSync(SERVER, ['serve', '--model', A, '--model', B, '--kv-store', '/tmp/x', '--port', '0'], { encoding: 'utf8', timeout: 60000 });
  assert.equal(kv.status, 2);
  assert.match(kv.stderr, /--kv-store serves one model/);
});
