// ollama.test.cjs — the Ollama API under /api/ end to end, through the real
// Ollama client (npm "ollama", pinned in package-lock.json) and plain fetch,
// under node's built-in test runner.
//
// HEARTH_E2E_SERVER  `hearth`, run as `hearth serve --model org/tiny`: a Hub id
//                    found in a temporary Hugging Face cache laid out by hand
//                    (refs/main, snapshots/COMMIT/* linking into blobs/), whose
//                    files are the built-in model models/default's (or
//                    $HEARTH_E2E_MODEL's), with a registry of its own in a
//                    temporary HEARTH_HOME holding one scanned golden fixture,
//                    and HF_HUB_OFFLINE=1; or, with HEARTH_E2E_FAKE=1, the test
//                    server over the fake engine (tests/serve/fake_engine.h),
//                    whose registry, pull and delete are fakes too (fake_server.c)
// HEARTH_DEPS_DIR    where tools/fetch_test_deps.sh installed node_modules
// HEARTH_SOURCE_DIR  the repository, to find the model folders
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const FAKE = process.env.HEARTH_E2E_FAKE === '1';
const SERVER = process.env.HEARTH_E2E_SERVER;
const H = require('./harness.cjs');
const { SOURCE, stopServer } = H;
const MODEL = process.env.HEARTH_E2E_MODEL || path.join(SOURCE, 'models/default');
const SCANNED = path.join(SOURCE, 'tests/fixtures/golden/gemma2-f32'); // a second model, in the registry only
const NAME = FAKE ? 'fake-model' : 'org/tiny';
const COMMIT = 'c0ffee'.padEnd(40, '0');

let srv, client, home;

before(async () => {
  if (FAKE) {
    srv = await H.startServer(SERVER, ['--port', '0']);
  } else {
    if (!fs.existsSync(path.join(MODEL, 'config.json'))) throw new Error(`no model to serve: ${MODEL} has no config.json`);
    home = fs.mkdtempSync(path.join(os.tmpdir(), 'hearth-ollama-'));
    process.env.HEARTH_HOME = path.join(home, 'hearth');
    process.env.HF_HUB_CACHE = path.join(home, 'hub');
    process.env.HF_HUB_OFFLINE = '1';
    const repo = path.join(process.env.HF_HUB_CACHE, 'models--org--tiny'), snap = path.join(repo, 'snapshots', COMMIT);
    for (const d of ['blobs', 'refs', snap]) fs.mkdirSync(path.resolve(repo, d), { recursive: true });
    fs.writeFileSync(path.join(repo, 'refs', 'main'), COMMIT);
    for (const f of fs.readdirSync(MODEL)) {
      fs.symlinkSync(path.resolve(MODEL, f), path.join(repo, 'blobs', 'blob-' + f));
      fs.symlinkSync(path.join('..', '..', 'blobs', 'blob-' + f), path.join(snap, f));
    }
    execFileSync(SERVER, ['scan', SCANNED], { encoding: 'utf8' });
    srv = await H.startServer(SERVER, ['serve', '--model', NAME, '--port', '0', '--threads', '2', '--prefill-chunk', '16']);
  }
  const { Ollama } = H.need('ollama');
  client = new Ollama({ host: srv.url });
});

after(async () => {
  const code = await stopServer(srv);
  if (home) fs.rmSync(home, { recursive: true, force: true });
  assert.equal(code, 0, `server exited with ${code}:\n${srv ? srv.log.slice(-4000) : ''}`);
});

async function post(route, body, method = 'POST') {
  const r = await fetch(srv.url + route, { method, headers: { 'Content-Type': 'application/json' }, body: typeof body === 'string' ? body : JSON.stringify(body) });
  const text = await r.text();
  return { status: r.status, type: r.headers.get('content-type'), text, body: text ? JSON.parse(text.split('\n')[0]) : null };
}

// The client's error for a refused request: its HTTP status and Ollama's {"error"} message.
async function refused(promise, status, pattern) {
  await assert.rejects(promise, (e) => {
    assert.equal(e.name, 'ResponseError', e.stack);
    assert.equal(e.status_code, status, e.message);
    assert.match(e.error, pattern);
    return true;
  });
}

async function collect(iter) {
  const parts = [];
  for await (const p of iter) parts.push(p);
  return parts;
}

// Ollama's final object: done, done_reason, counts, integer nanosecond durations.
function finalShape(o, reason) {
  assert.equal(o.done, true);
  assert.equal(o.done_reason, reason);
  assert.equal(o.model, NAME);
  assert.ok(!Number.isNaN(Date.parse(o.created_at)), o.created_at);
  for (const k of ['total_duration', 'load_duration', 'prompt_eval_duration', 'eval_duration', 'prompt_eval_count', 'eval_count'])
    assert.ok(Number.isInteger(o[k]) && o[k] >= 0, `${k}: ${o[k]}`);
  assert.ok(o.prompt_eval_count > 0);
  assert.ok(o.total_duration >= o.eval_duration && o.total_duration >= o.prompt_eval_duration);
}

function detailsShape(d) {
  for (const k of ['parent_model', 'format', 'family', 'parameter_size', 'quantization_level']) assert.equal(typeof d[k], 'string', k);
}

test('version, tags, ps and show', async () => {
  const v = await client.version();
  assert.match(v.version, /^\d+\.\d+\.\d+$/);
  const tags = await client.list();
  assert.equal(tags.models[0].name, NAME);
  for (const m of tags.models) {
    assert.equal(m.model, m.name);
    assert.ok(Number.isInteger(m.size) && !Number.isNaN(Date.parse(m.modified_at)) && typeof m.digest === 'string');
    detailsShape(m.details);
  }
  const names = tags.models.map((m) => m.name);
  if (FAKE) {
    assert.deepEqual(names, ['fake-model', 'org/tiny', 'scanned-model']);
    const tiny = tags.models[1];
    assert.equal(tiny.size, 1200000000);
    assert.equal(tiny.digest, '0123456789abcdef0123456789abcdef01234567');
    assert.deepEqual(tiny.details, { parent_model: '', format: 'safetensors', family: 'qwen3', families: ['qwen3'], parameter_size: '600M', quantization_level: 'BF16' });
    assert.equal(tags.models[2].details.parameter_size, '8.0B');
  } else {
    // the served Hub id once (it is also the cache's), then the registry's model
    assert.deepEqual(names, ['org/tiny', 'gemma2-f32']);
    assert.equal(tags.models[0].details.format, 'safetensors');
    assert.equal(tags.models[0].details.family, 'llama');
    assert.equal(tags.models[1].details.family, 'gemma2');
    const bytes = fs.readdirSync(MODEL).reduce((n, f) => n + fs.statSync(path.join(MODEL, f)).size, 0);
    assert.equal(tags.models[0].size, bytes);
  }
  const ps = await client.ps();
  assert.equal(ps.models.length, 1);
  assert.equal(ps.models[0].name, NAME);
  assert.ok(Date.parse(ps.models[0].expires_at) > Date.now());
  assert.equal(ps.models[0].context_length, FAKE ? 512 : 1024);
  const show = await client.show({ model: NAME });
  detailsShape(show.details);
  assert.ok(show.capabilities.includes('completion'));
  assert.equal(show.capabilities.includes('embedding'), !FAKE);
  // the fake's template is Hermes; the built-in model's has no call syntax of its own and gets the generic one
  assert.ok(show.capabilities.includes('tools'));
  assert.equal(show.capabilities.includes('vision'), false);
  assert.equal(typeof show.modelfile, 'string');
  if (!FAKE) assert.match(show.template, /\{%|\{\{/); // the model's Jinja chat template
  // a bare name with Ollama's default tag is the same model
  assert.deepEqual((await client.show({ model: NAME + ':latest' })).details, show.details);
  const other = await client.show({ model: names[1] });
  assert.deepEqual(other.capabilities, ['completion']);
  await refused(client.show({ model: 'no/such-model' }), 404, /model 'no\/such-model' not found/);
});

test('chat: whole and streamed, the same greedy text; Ollama\'s final object', async () => {
  const req = { model: NAME, messages: [{ role: 'user', content: 'Tell me a story.' }], options: { temperature: 0, num_predict: 12 } };
  const r = await client.chat(req);
  assert.equal(r.message.role, 'assistant');
  assert.ok(r.message.content.length > 0);
  finalShape(r, FAKE ? 'length' : r.done_reason);
  assert.ok(['stop', 'length'].includes(r.done_reason));
  assert.ok(r.eval_count <= 12);
  const parts = await collect(await client.chat({ ...req, stream: true }));
  assert.ok(parts.length >= 2);
  for (const p of parts.slice(0, -1)) {
    assert.equal(p.done, false);
    assert.equal(p.message.role, 'assistant');
  }
  const last = parts[parts.length - 1];
  finalShape(last, r.done_reason);
  assert.equal(last.message.content, '');
  assert.equal(parts.map((p) => p.message.content).join(''), r.message.content);
  assert.equal(last.eval_count, r.eval_count);
  assert.equal(last.prompt_eval_count, r.prompt_eval_count);
});

test('generate: whole and streamed; raw greedy output equals /v1/completions', async () => {
  const prompt = 'Once upon a time';
  const opts = { temperature: 0, num_predict: 16 };
  const g = await client.generate({ model: NAME, prompt, raw: true, options: opts });
  finalShape(g, g.done_reason);
  const c = await (await fetch(srv.url + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: NAME, prompt, temperature: 0, max_tokens: 16 }) })).json();
  assert.equal(g.response, c.choices[0].text);
  assert.equal(g.eval_count, c.usage.completion_tokens);
  assert.equal(g.prompt_eval_count, c.usage.prompt_tokens);
  assert.equal(g.done_reason, c.choices[0].finish_reason);
  const parts = await collect(await client.generate({ model: NAME, prompt, raw: true, options: opts, stream: true }));
  assert.equal(parts.map((p) => p.response).join(''), g.response);
  finalShape(parts[parts.length - 1], g.done_reason);
  // templated: the prompt as a user turn (and system before it), as /v1/chat/completions renders them
  const t = await client.generate({ model: NAME, prompt, system: 'You are terse.', options: opts });
  const cc = await (await fetch(srv.url + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: NAME, messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: prompt }], temperature: 0, max_tokens: 16 }) })).json();
  assert.equal(t.response, cc.choices[0].message.content);
  // sampled with a seed: the same seed, the same text
  const seeded = { model: NAME, prompt, raw: true, options: { temperature: 0.9, top_k: 40, top_p: 0.95, seed: 7, num_predict: 12 } };
  assert.equal((await client.generate(seeded)).response, (await client.generate(seeded)).response);
  // a stop string ends it before the string
  const cut = g.response.slice(4, 8);
  if (cut.trim()) {
    const s = await client.generate({ model: NAME, prompt, raw: true, options: { ...opts, stop: [cut] } });
    assert.equal(s.done_reason, 'stop');
    assert.equal(s.response, g.response.slice(0, g.response.indexOf(cut)));
  }
  // no prompt: Ollama's load request
  const load = await client.generate({ model: NAME, prompt: '' });
  assert.equal(load.done, true);
  assert.equal(load.done_reason, 'load');
});

test('logprobs: each token with its log-probability and alternatives, as /v1/chat/completions gives them', { skip: FAKE }, async () => {
  const messages = [{ role: 'user', content: 'Name a colour.' }];
  const r = await client.chat({ model: NAME, messages, logprobs: true, top_logprobs: 3, options: { temperature: 0, num_predict: 6 } });
  assert.equal(r.logprobs.length, r.eval_count);
  for (const e of r.logprobs) {
    assert.equal(e.top_logprobs.length, 3);
    assert.equal(e.logprob, e.top_logprobs[0].logprob); // greedy: the best alternative was taken
    assert.deepEqual(e.bytes, [...Buffer.from(e.token)]);
  }
  const oa = await (await fetch(srv.url + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: NAME, messages, logprobs: true, top_logprobs: 3, temperature: 0, max_tokens: 6 }) })).json();
  assert.deepEqual(r.logprobs.map((e) => e.token), oa.choices[0].logprobs.content.map((e) => e.token));
  r.logprobs.forEach((e, i) => assert.ok(Math.abs(e.logprob - oa.choices[0].logprobs.content[i].logprob) < 1e-5));
  const parts = await collect(await client.chat({ model: NAME, messages, logprobs: true, options: { temperature: 0, num_predict: 6 }, stream: true }));
  assert.deepEqual(parts.flatMap((p) => p.logprobs || []).map((e) => e.token), r.logprobs.map((e) => e.token));
  assert.equal((await client.chat({ model: NAME, messages, options: { num_predict: 2 } })).logprobs, undefined);
});

test('format: "json" and a JSON schema constrain the output', async () => {
  const schema = { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] };
  const r = await client.chat({ model: NAME, messages: [{ role: 'user', content: 'A number as JSON.' }], format: schema, options: { temperature: 0, num_predict: 40 } });
  if (r.done_reason === 'stop') assert.ok(Number.isInteger(JSON.parse(r.message.content).n), r.message.content);
  const j = await client.generate({ model: NAME, prompt: 'JSON please', format: 'json', options: { temperature: 0, num_predict: 40 } });
  if (j.done_reason === 'stop') assert.equal(typeof JSON.parse(j.response), 'object');
  if (!FAKE) assert.match(j.response, /^\s*\{/); // the fake engine follows no grammar
});

test('tool calls and thinking, whole and streamed', { skip: !FAKE }, async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather', parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } } } } }];
  const req = { model: NAME, messages: [{ role: 'user', content: 'Weather in Paris? [toolcall]' }], tools, options: { temperature: 0 } };
  const r = await client.chat(req);
  assert.equal(r.message.content.trim(), 'Let me check.');
  assert.equal(r.message.thinking.trim(), 'The user wants the weather.');
  assert.deepEqual(r.message.tool_calls, [{ function: { name: 'get_weather', arguments: { city: 'Paris "Ville"', days: 3 } } }]);
  const parts = await collect(await client.chat({ ...req, stream: true }));
  const calls = parts.flatMap((p) => p.message.tool_calls || []);
  assert.deepEqual(calls, r.message.tool_calls);
  assert.equal(parts.map((p) => p.message.content).join(''), r.message.content);
  assert.equal(parts.map((p) => p.message.thinking || '').join(''), r.message.thinking);
  // the call and its result go back in the next turn
  const next = await client.chat({ model: NAME, tools, options: { temperature: 0, num_predict: 4 }, messages: [
    req.messages[0], { role: 'assistant', content: '', tool_calls: r.message.tool_calls }, { role: 'tool', content: '{"temp": 21}', tool_name: 'get_weather' }] });
  assert.equal(next.done, true);
  const think = await client.generate({ model: NAME, prompt: 'Sum? [think]', options: { temperature: 0 } });
  assert.equal(think.thinking.trim(), 'First, 2 + 2.\nThat is 4.');
  assert.equal(think.response.trim(), 'The answer is 4.');
});

test('embed and the legacy embeddings', async () => {
  if (FAKE) {
    await refused(client.embed({ model: NAME, input: 'hello' }), 400, /does not serve embeddings/);
    return;
  }
  const e = await client.embed({ model: NAME, input: ['The cat sat.', 'A dog ran.'] });
  assert.equal(e.model, NAME);
  assert.equal(e.embeddings.length, 2);
  assert.ok(e.prompt_eval_count > 0 && Number.isInteger(e.total_duration));
  const oa = await (await fetch(srv.url + '/v1/embeddings', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: NAME, input: ['The cat sat.', 'A dog ran.'] }) })).json();
  for (let i = 0; i < 2; i++) {
    assert.equal(e.embeddings[i].length, oa.data[i].embedding.length);
    assert.ok(e.embeddings[i].every((x, k) => Math.abs(x - oa.data[i].embedding[k]) < 1e-6));
  }
  const one = await client.embed({ model: NAME, input: 'The cat sat.', dimensions: 8 });
  assert.equal(one.embeddings[0].length, 8);
  const legacy = await client.embeddings({ model: NAME, prompt: 'The cat sat.' });
  assert.ok(legacy.embedding.every((x, k) => Math.abs(x - e.embeddings[0][k]) < 1e-6));
});

test('refusals through the client name the field; unknown models are 404', async () => {
  await refused(client.generate({ model: NAME, prompt: 'x', options: { mirostat: 2 } }), 400, /options\.mirostat/);
  await refused(client.generate({ model: NAME, prompt: 'x', options: { not_an_option: 1 } }), 400, /options\.not_an_option/);
  await refused(client.chat({ model: NAME, messages: [{ role: 'user', content: 'x' }], options: { temperature: 'warm' } }), 400, /options\.temperature/);
  await refused(client.generate({ model: NAME, prompt: 'x', suffix: 'y' }), 400, /suffix/);
  await refused(client.generate({ model: 'not-served', prompt: 'x' }), 404, /model 'not-served' not found/);
  await refused(client.chat({ model: 'not-served', messages: [{ role: 'user', content: 'x' }], stream: true }), 404, /not found/);
  // images, by name, when the model has no vision
  await refused(client.chat({ model: NAME, messages: [{ role: 'user', content: 'what is this?', images: ['iVBORw0KGgo='] }] }), 400,
    /messages\[0\]\.images\[0\]: model .* cannot take images/);
  await refused(client.generate({ model: NAME, prompt: 'what?', images: ['iVBORw0KGgo='] }), 400, /images\[0\]/);
  await refused(client.generate({ model: NAME, prompt: 'x', options: { num_ctx: 2 } }), 400, /options\.num_ctx/);
});

test('pull and delete', async () => {
  if (FAKE) {
    const parts = await collect(await client.pull({ model: 'org/tiny', stream: true }));
    assert.equal(parts[0].status, 'pulling manifest');
    assert.deepEqual(parts.slice(1, 4).map((p) => p.status), [1, 2, 3].map((i) => `hearth: file${i}.safetensors ok, ${i}/3 files`));
    assert.equal(parts[parts.length - 1].status, 'success');
    assert.deepEqual(await client.pull({ model: 'org/tiny' }), { status: 'success' });
    await refused(client.pull({ model: 'org/missing' }), 400, /no such repository/);
    await assert.rejects(collect(await client.pull({ model: 'org/missing', stream: true })), /org\/missing: no such repository/);
    await client.delete({ model: 'scanned-model' });
    assert.ok(!(await client.list()).models.some((m) => m.name === 'scanned-model'));
    await refused(client.delete({ model: 'scanned-model' }), 404, /neither a registry name nor a Hub id/);
  } else {
    // offline: refused with the command that fetches it
    await assert.rejects(collect(await client.pull({ model: 'org/none', stream: true })), /HF_HUB_OFFLINE/);
    await refused(client.pull({ model: 'org/none' }), 400, /HF_HUB_OFFLINE=1 forbids fetching it/);
    await refused(client.delete({ model: NAME }), 400, /being served/);
    await client.delete({ model: 'gemma2-f32' }); // forgets the registry entry; the folder stays
    assert.ok(fs.existsSync(path.join(SCANNED, 'config.json')));
    assert.deepEqual((await client.list()).models.map((m) => m.name), ['org/tiny']);
    await refused(client.delete({ model: 'gemma2-f32' }), 404, /neither a registry name nor a Hub id|not in the registry/);
  }
});

test('HTTP shapes: NDJSON streams, Ollama errors on every /api/ refusal', async () => {
  const s = await post('/api/generate', { model: NAME, prompt: 'Hi', raw: true, options: { num_predict: 3, temperature: 0 } });
  assert.equal(s.status, 200);
  assert.equal(s.type, 'application/x-ndjson');
  const lines = s.text.split('\n');
  assert.equal(lines.pop(), '');
  for (const l of lines) assert.equal(typeof JSON.parse(l).done, 'boolean');
  assert.equal(JSON.parse(lines[lines.length - 1]).done, true);
  const whole = await post('/api/generate', { model: NAME, prompt: 'Hi', raw: true, stream: false, options: { num_predict: 3 } });
  assert.equal(whole.type, 'application/json');
  for (const [route, body, status, pattern, method] of [
    ['/api/chat', '{"model": "x", "messages": [', 400, /not valid JSON/],
    ['/api/generate', { model: NAME, prompt: 'x', options: { bogus: true } }, 400, /options\.bogus/],
    ['/api/generate', { model: 'nope', prompt: 'x' }, 404, /model 'nope' not found/],
    ['/api/embed', { model: 'nope', input: 'x' }, 404, /not found/],
    ['/api/show', {}, 400, /model is required/],
    ['/api/nothing-here', {}, 404, /Unknown route/],
    ['/api/tags', {}, 405, /not allowed/],
  ]) {
    const r = await post(route, body, method);
    assert.equal(r.status, status, `${route}: ${r.text}`);
    assert.deepEqual(Object.keys(r.body), ['error'], r.text);
    assert.match(r.body.error, pattern);
  }
});
