// multi.test.cjs — several models in one server: `hearth serve --model A
// --model B` with A the built-in model (models/default) and B the tiny Gemma 4
// with a vision tower (tests/fixtures/mm/gemma4_vision-f32). Each model is
// first served alone for its reference replies; then both at once, where
// requests to each — OpenAI shapes over plain fetch and the real Ollama
// client (npm "ollama"), streamed and whole — go out interleaved and
// concurrently and must equal the replies of the model served alone. Then
// models loaded on first use: under --model-memory (B twice, under two
// names, where only one fits beside A: the least recently used unloads; a
// model that never fits is refused with the numbers) and --model-ttl (an
// idle model unloads and loads again on its next request).
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
  // an Anthropic client (anthropic-version) gets Anthropic's shapes, both models in them
  const anth = { headers: { 'anthropic-version': '2023-06-01' } };
  const am = await (await fetch(srv.url + '/v1/models', anth)).json();
  assert.deepEqual(am.data.map((x) => [x.type, x.id]), [['model', NA], ['model', NB]]);
  assert.equal(am.has_more, false);
  assert.equal(am.last_id, NB);
  for (const id of [NA, NB]) {
    const one = await (await fetch(srv.url + '/v1/models/' + id, anth)).json();
    assert.deepEqual([one.type, one.id], ['model', id]);
  }
  assert.equal((await fetch(srv.url + '/v1/models/no-such-model', anth)).status, 404);
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

// ---- models loaded on first use: --model-memory and --model-ttl ----

const bytesOf = (dir) => fs.readdirSync(dir).reduce((n, f) => n + fs.statSync(path.join(dir, f)).size, 0);

async function states(url) {
  const m = await (await fetch(url + '/v1/models')).json();
  return Object.fromEntries(m.data.map((x) => [x.id, x.state]));
}

test('--model-memory: models after the first load on first use, the least recently used idle one unloaded to fit', async () => {
  // B twice, under two names (a second folder linking to it): both cannot be loaded beside A at once
  const tmp = fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'hearth-multi-'));
  const B2 = path.join(tmp, 'gemma-copy');
  fs.symlinkSync(B, B2);
  const budget = bytesOf(A) + bytesOf(B) + 1000;
  const lazy = await H.startServer(SERVER, ['serve', '--model', A, '--model', B, '--model', B2, '--model-memory', String(budget), ...ARGS]);
  try {
    const ollama = new (H.need('ollama').Ollama)({ host: lazy.url });
    assert.deepEqual(await states(lazy.url), { default: 'loaded', [NB]: 'unloaded', 'gemma-copy': 'unloaded' });
    assert.deepEqual((await ollama.ps()).models.map((x) => x.name), [NA]);
    const bJobs = jobs.map((j, i) => [j, i]).filter(([j]) => j.name === NB);
    const as = (j, name) => ({ ...j, name, body: { ...j.body, model: name } });
    // B loads; then the copy, which unloads B (idle, least recently used); then B again
    for (const [name, other] of [[NB, 'gemma-copy'], ['gemma-copy', NB], [NB, 'gemma-copy']]) {
      const [j, i] = bJobs[0];
      assert.equal(await run(lazy.url, as(j, name), ollama), solo.get(i), name);
      const st = await states(lazy.url);
      assert.equal(st[name], 'loaded');
      assert.equal(st[other], 'unloaded');
      assert.equal(st.default, 'loaded'); // the first stays
    }
    // both at once: one waits for the other to go idle; every reply still equals B served alone
    const all = bJobs.flatMap(([j, i]) => [[as(j, NB), i], [as(j, 'gemma-copy'), i]]);
    const texts = await Promise.all(all.map(([j]) => run(lazy.url, j, ollama)));
    all.forEach(([j, i], k) => assert.equal(texts[k], solo.get(i), `${j.name} ${j.kind}`));
    // Ollama's load request loads the model it names
    await ollama.generate({ model: NB, prompt: '' });
    assert.equal((await states(lazy.url))[NB], 'loaded');
    // a load waits inside the request: Ollama's load_duration says how long
    const g = await ollama.generate({ model: 'gemma-copy', prompt: 'Hi', options: { num_predict: 2 } });
    assert.ok(g.load_duration > 0 && g.total_duration >= g.load_duration, `load_duration ${g.load_duration}`);
    // keep_alive 0: unloaded once the request is done; with no prompt, Ollama's unload request
    await ollama.generate({ model: 'gemma-copy', prompt: 'Hi', keep_alive: 0, options: { num_predict: 2 } });
    assert.equal((await states(lazy.url))['gemma-copy'], 'unloaded');
    await ollama.generate({ model: NB, prompt: 'Hi', options: { num_predict: 2 } });
    assert.equal((await states(lazy.url))[NB], 'loaded');
    const u = await ollama.generate({ model: NB, keep_alive: 0 });
    assert.equal(u.done_reason, 'unload');
    assert.equal((await states(lazy.url))[NB], 'unloaded');
    // the load and unload endpoints
    const call = async (route, model) => {
      const r = await fetch(lazy.url + route, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ model }) });
      return { status: r.status, body: await r.json() };
    };
    let r = await call('/v1/models/load', NB);
    assert.equal(r.status, 200);
    assert.deepEqual([r.body.id, r.body.state], [NB, 'loaded']);
    assert.equal((await states(lazy.url))[NB], 'loaded');
    r = await call('/v1/models/unload', NB);
    assert.deepEqual([r.status, r.body.state], [200, 'unloaded']);
    r = await call('/v1/models/unload', NA);
    assert.equal(r.status, 400);
    assert.match(r.body.error.message, /stays loaded/);
    assert.equal((await call('/v1/models/load', 'nobody')).status, 404);
        // a keep_alive that runs out unloads it (polled, with a generous limit)
    await ollama.chat({ model: NB, messages: [{ role: 'user', content: 'Hi' }], keep_alive: '300ms', options: { num_predict: 2 } });
    let st;
    for (let k = 0; k < 200 && (st = await states(lazy.url))[NB] === 'loaded'; k++) await new Promise((r) => setTimeout(r, 100));
    assert.equal(st[NB], 'unloaded');
  } finally {
    assert.equal(await H.stopServer(lazy), 0, lazy.log.slice(-3000));
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  assert.match(lazy.log, /unloading gemma4_vision-f32 \(least recently used, to make room\)/);
  assert.match(lazy.log, /unloading gemma-copy \(keep_alive 0\)/);
  assert.match(lazy.log, /unloading gemma4_vision-f32 \(asked to\)/);
  assert.match(lazy.log, /unloading gemma4_vision-f32 \(idle past its keep_alive\)/);
});

test('--model-memory: a model that can never fit is refused with the numbers', async () => {
  const budget = bytesOf(A) + 1000;
  const lazy = await H.startServer(SERVER, ['serve', '--model', A, '--model', B, '--model-memory', String(budget), ...ARGS]);
  try {
    const r = await fetch(lazy.url + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: NB, messages: [{ role: 'user', content: 'x' }], max_tokens: 2 }) });
    assert.equal(r.status, 400);
    const e = (await r.json()).error;
    assert.equal(e.type, 'memory_admission');
    assert.match(e.message, new RegExp(`model '${NB}' takes ${bytesOf(B)} bytes, but the model memory budget is ${budget} bytes \\(${bytesOf(A)} of them`));
    // the first model is served all the same
    assert.equal(await run(lazy.url, jobs[1], new (H.need('ollama').Ollama)({ host: lazy.url })), solo.get(1));
  } finally {
    assert.equal(await H.stopServer(lazy), 0);
  }
  const small = spawnSync(SERVER, ['serve', '--model', A, '--model', B, '--model-memory', '1000', '--port', '0'], { encoding: 'utf8', timeout: 60000 });
  assert.equal(small.status, 1);
  assert.match(small.stderr, /the models that stay loaded take \d+ bytes, more than the model memory budget of 1000/);
  const one = spawnSync(SERVER, ['serve', '--model', A, '--model-ttl', '5', '--port', '0'], { encoding: 'utf8', timeout: 60000 });
  assert.equal(one.status, 2);
  assert.match(one.stderr, /--model-ttl goes with several --model/);
});

test('--model-ttl: an idle model unloads, and loads again on its next request', async () => {
  const lazy = await H.startServer(SERVER, ['serve', '--model', A, '--model', B, '--model-ttl', '1', ...ARGS]);
  try {
    const ollama = new (H.need('ollama').Ollama)({ host: lazy.url });
    const i = jobs.findIndex((j) => j.name === NB && j.kind === 'chat');
    assert.equal(await run(lazy.url, jobs[i], ollama), solo.get(i));
    // it goes once idle past the time to live (polled, with a generous limit)
    let st;
    for (let k = 0; k < 200 && (st = await states(lazy.url))[NB] === 'loaded'; k++) await new Promise((r) => setTimeout(r, 100));
    assert.equal(st[NB], 'unloaded');
    assert.equal(st.default, 'loaded');
    assert.equal(await run(lazy.url, jobs[i], ollama), solo.get(i));
  } finally {
    assert.equal(await H.stopServer(lazy), 0);
  }
  assert.match(lazy.log, /unloading gemma4_vision-f32 \(idle past --model-ttl\)/);
});

test('--models-dir: every model under a folder, named after its folder, loaded on first use', async () => {
  const tmp = fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'hearth-models-'));
  fs.mkdirSync(path.join(tmp, 'nested'));
  fs.symlinkSync(B, path.join(tmp, 'nested', 'gemma-x'));
  fs.symlinkSync(A, path.join(tmp, 'default')); // the name of the --model one: left out
  fs.writeFileSync(path.join(tmp, 'notes.txt'), 'not a model');
  const srv2 = await H.startServer(SERVER, ['serve', '--model', A, '--models-dir', tmp, ...ARGS]);
  try {
    assert.deepEqual(await states(srv2.url), { default: 'loaded', 'gemma-x': 'unloaded' });
    const i = jobs.findIndex((j) => j.name === NB && j.kind === 'completion');
    const j = { ...jobs[i], name: 'gemma-x', body: { ...jobs[i].body, model: 'gemma-x' } };
    assert.equal(await run(srv2.url, j, new (H.need('ollama').Ollama)({ host: srv2.url })), solo.get(i));
    assert.equal((await states(srv2.url))['gemma-x'], 'loaded');
  } finally {
    assert.equal(await H.stopServer(srv2), 0);
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  assert.match(srv2.log, /--models-dir .*: .*default is called 'default', as .* is: left out/);
  const none = spawnSync(SERVER, ['serve', '--models-dir', path.join(H.SOURCE, 'docs'), '--port', '0'], { encoding: 'utf8', timeout: 60000 });
  assert.equal(none.status, 1);
  assert.match(none.stderr, /--models-dir: no model found in/);
});
