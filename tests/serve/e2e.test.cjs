// e2e.test.cjs — hearth's HTTP server end to end, through the real OpenAI
// client (npm "openai", pinned in package-lock.json) and plain fetch, under
// node's built-in test runner.
//
// HEARTH_E2E_SERVER  the executable: `hearth` (then run as `hearth serve
//                    --model DIR`) or, with HEARTH_E2E_FAKE=1, the test server
//                    over the fake engine (tests/serve/fake_engine.h)
// HEARTH_DEPS_DIR    where tools/fetch_test_deps.sh installed node_modules
// HEARTH_SOURCE_DIR  the repository, to find the model folder
//
// The model: see findModel below.
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const H = require('./harness.cjs');

const FAKE = process.env.HEARTH_E2E_FAKE === '1';
const SERVER = process.env.HEARTH_E2E_SERVER;
const SOURCE = process.env.HEARTH_SOURCE_DIR || path.resolve(__dirname, '../..');
const DEPS = process.env.HEARTH_DEPS_DIR || path.join(SOURCE, '.deps');

function loadOpenAI() {
  const dir = path.join(DEPS, 'node', 'node_modules', 'openai');
  if (!fs.existsSync(dir)) throw new Error(`npm "openai" is not installed at ${dir}: run tools/fetch_test_deps.sh`);
  return require(dir).OpenAI;
}

// The model folder to serve, first found of:
//   $HEARTH_E2E_MODEL;
//   tests/fixtures/golden/llama-f32 when it has its own tokenizer;
//   models/default (the built-in model);
//   the golden llama-f32 weights with tests/fixtures/serve's 512-token
//   tokenizer (tools/gen_serve_tokenizer.py), assembled in a temporary folder.
// With none of them, throws (every test then fails saying so).
let assembled = null;
function findModel() {
  if (process.env.HEARTH_E2E_MODEL) return process.env.HEARTH_E2E_MODEL;
  const golden = path.join(SOURCE, 'tests/fixtures/golden/llama-f32');
  if (fs.existsSync(path.join(golden, 'tokenizer.json'))) return golden;
  const def = path.join(SOURCE, 'models/default');
  if (fs.existsSync(path.join(def, 'config.json'))) return def;
  const tok = path.join(SOURCE, 'tests/fixtures/serve');
  if (fs.existsSync(path.join(golden, 'model.safetensors')) && fs.existsSync(path.join(tok, 'tokenizer.json'))) {
    if (assembled) return assembled;
    const dir = path.join(fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'hearth-e2e-')), 'tiny-llama');
    fs.mkdirSync(dir);
    for (const f of ['config.json', 'generation_config.json', 'model.safetensors'])
      if (fs.existsSync(path.join(golden, f))) fs.symlinkSync(path.join(golden, f), path.join(dir, f));
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(tok, f), path.join(dir, f));
    assembled = dir;
    return dir;
  }
  throw new Error(`no model to serve: neither ${golden} (with tokenizer.json) nor ${def} (with config.json) exists, ` +
    `and the golden weights or tests/fixtures/serve/tokenizer.json are missing`);
}

// Starts a server on an ephemeral loopback port; resolves once it prints its address.
function startServer(extra = []) {
  const args = FAKE ? ['--port', '0', ...extra] : ['serve', '--model', findModel(), '--port', '0', '--threads', '2', ...extra];
  return H.startServer(SERVER, args);
}

const stopServer = H.stopServer;

async function waitFor(cond, what, ms = 60000) {
  const until = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

let OpenAI, main, guarded, client, modelId;
const KEY = 'sk-test-4d1f';

before(async () => {
  OpenAI = loadOpenAI();
  main = await startServer(['--served-model-name', 'my-alias', '--cors', 'https://app.example']);
  guarded = await startServer(['--api-key', KEY, '--max-body', '4096']);
  client = new OpenAI({ baseURL: main.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  if (assembled) fs.rmSync(path.dirname(assembled), { recursive: true, force: true });
  // A clean exit after SIGTERM: every connection ended, nothing leaked (under ASan).
  for (const srv of [main, guarded]) {
    const code = await stopServer(srv);
    assert.equal(code, 0, `server exited with ${code}:\n${srv ? srv.log.slice(-4000) : ''}`);
  }
});

const MSGS = [{ role: 'user', content: 'Tell me a story about a lighthouse.' }];

async function streamChat(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  const deltas = chunks.filter((c) => c.choices.length && c.choices[0].delta.content).map((c) => c.choices[0].delta.content);
  return { chunks, deltas, text: deltas.join('') };
}

test('models list names the served model', async () => {
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m);
  assert.equal(ids.length, 2); // the model's id, then the --served-model-name alias
  assert.equal(ids[1].id, 'my-alias');
  assert.equal(typeof ids[0].id, 'string');
  assert.ok(ids[0].id.length > 0);
  assert.equal(ids[0].object, 'model');
  modelId = ids[0].id;
  const one = await client.models.retrieve(modelId);
  assert.equal(one.id, modelId);
});

test('non-stream chat completion has the OpenAI shape', async () => {
  const r = await client.chat.completions.create({ model: 'my-alias', messages: MSGS, max_tokens: 16, temperature: 0 });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(typeof r.created, 'number');
  assert.equal(r.model, modelId ?? r.model);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].index, 0);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 16);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  if (FAKE) assert.equal(r.choices[0].message.content, 'The quick brown fox jumps over the lazy dog. Pac');
});

test('stream at temperature 0 equals the non-stream answer; usage chunk last', async () => {
  const params = { messages: MSGS, max_tokens: 24, temperature: 0 };
  const whole = await client.chat.completions.create(params);
  const s = await streamChat({ ...params, stream_options: { include_usage: true } });
  assert.equal(s.text, whole.choices[0].message.content);
  const first = s.chunks[0];
  assert.equal(first.object, 'chat.completion.chunk');
  assert.equal(first.choices[0].delta.role, 'assistant');
  const ids = new Set(s.chunks.map((c) => c.id));
  assert.equal(ids.size, 1);
  assert.match(first.id, /^chatcmpl-/);
  const finals = s.chunks.filter((c) => c.choices.length && c.choices[0].finish_reason);
  assert.equal(finals.length, 1);
  assert.equal(finals[0].choices[0].finish_reason, whole.choices[0].finish_reason);
  const last = s.chunks[s.chunks.length - 1];
  assert.deepEqual(last.choices, []);
  assert.deepEqual(last.usage, whole.usage);
});

test('omitted sampling fields take the model defaults', async () => {
  // HF: greedy unless generation_config.json sets do_sample (the fake is greedy too).
  let sampled = false;
  if (!FAKE) {
    const gc = path.join(findModel(), 'generation_config.json');
    if (fs.existsSync(gc)) sampled = JSON.parse(fs.readFileSync(gc, 'utf8')).do_sample === true;
  }
  const greedy = await client.chat.completions.create({ messages: MSGS, max_tokens: 12, temperature: 0 });
  const plain = await client.chat.completions.create({ messages: MSGS, max_tokens: 12 });
  if (!sampled) assert.equal(plain.choices[0].message.content, greedy.choices[0].message.content);
  else assert.equal(plain.usage.prompt_tokens, greedy.usage.prompt_tokens);
});

test('content parts equal a string content', async () => {
  const a = await client.chat.completions.create({ messages: MSGS, max_tokens: 8, temperature: 0 });
  const parts = [{ role: 'user', content: [{ type: 'text', text: 'Tell me a story ' }, { type: 'text', text: 'about a lighthouse.' }] }];
  const b = await client.chat.completions.create({ messages: parts, max_tokens: 8, temperature: 0 });
  assert.equal(b.choices[0].message.content, a.choices[0].message.content);
  assert.equal(b.usage.prompt_tokens, a.usage.prompt_tokens);
});

test('a stop string split across tokens never appears, stream or not', async () => {
  const params = { messages: MSGS, max_tokens: 32, temperature: 0 };
  const probe = await streamChat(params);
  const full = probe.text;
  // A stop string made of the end of one streamed piece and the start of the
  // next, whose first occurrence in the text is at that boundary.
  let stop = null, expected = null, at = 0;
  for (let i = 0; i + 1 < probe.deltas.length && !stop; i++) {
    at += probe.deltas[i].length;
    const a = probe.deltas[i], b = probe.deltas[i + 1];
    if (i < 2 || a.length < 2 || b.length < 1) continue;
    const cand = a.slice(-2) + b.slice(0, Math.min(2, b.length));
    if (full.indexOf(cand) === at - 2) {
      stop = cand;
      expected = full.slice(0, at - 2);
    }
  }
  assert.ok(stop, `no stop string spanning a token boundary in ${JSON.stringify(probe.deltas)}`);
  const whole = await client.chat.completions.create({ ...params, stop: [stop] });
  assert.equal(whole.choices[0].message.content, expected);
  assert.ok(!whole.choices[0].message.content.includes(stop));
  assert.equal(whole.choices[0].finish_reason, 'stop');
  const s = await streamChat({ ...params, stop });
  assert.equal(s.text, expected);
  assert.ok(s.deltas.every((d) => !d.includes(stop)));
  const finals = s.chunks.filter((c) => c.choices.length && c.choices[0].finish_reason);
  assert.equal(finals[0].choices[0].finish_reason, 'stop');
});

test('max_tokens ends with finish_reason length', async () => {
  const r = await client.chat.completions.create({ messages: MSGS, max_tokens: 3, temperature: 0 });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 3);
  const r2 = await client.chat.completions.create({ messages: MSGS, max_completion_tokens: 2, temperature: 0 });
  assert.equal(r2.choices[0].finish_reason, 'length');
  assert.equal(r2.usage.completion_tokens, 2);
  const s = await streamChat({ messages: MSGS, max_tokens: 3, temperature: 0 });
  assert.equal(s.chunks.filter((c) => c.choices.length && c.choices[0].finish_reason)[0].choices[0].finish_reason, 'length');
});

test('the same seed at temperature 1 reproduces the text', async () => {
  const p = { messages: MSGS, max_tokens: 16, temperature: 1, seed: 1234 };
  const a = await client.chat.completions.create(p);
  const b = await client.chat.completions.create(p);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const s = await streamChat(p);
  assert.equal(s.text, a.choices[0].message.content);
  if (FAKE) {
    const c = await client.chat.completions.create({ ...p, seed: 99 });
    assert.notEqual(c.choices[0].message.content, a.choices[0].message.content);
  }
});

test('logprobs come back per token', async () => {
  const r = await client.chat.completions.create({ messages: MSGS, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2 });
  const lp = r.choices[0].logprobs.content;
  assert.ok(lp.length >= 1 && lp.length <= 4);
  for (const e of lp) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0);
    assert.ok(Array.isArray(e.bytes));
    assert.equal(e.top_logprobs.length, 2);
  }
});

test('text completions, whole and streamed', async () => {
  const p = { prompt: 'Once upon a time', max_tokens: 12, temperature: 0 };
  const r = await client.completions.create(p);
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  const stream = await client.completions.create({ ...p, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null;
  for await (const c of stream) {
    if (c.choices.length) {
      text += c.choices[0].text;
      if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
    if (c.usage) usage = c.usage;
  }
  assert.equal(text, r.choices[0].text);
  assert.equal(finish, r.choices[0].finish_reason);
  assert.deepEqual(usage, r.usage);
  if (FAKE) assert.equal(r.choices[0].text, 'The quick brown fox jumps over the l');
});

test('a completion prompt of token ids; ignore_eos runs to max_tokens', async () => {
  const ids = [5, 17, 230, 41, 99, 8];
  const post = (body) => fetch(main.url + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body) });
  if (FAKE) { /* an engine without token-id prompts says so */
    await expectError(await post({ prompt: ids, max_tokens: 4 }), 400, { param: 'prompt' });
    return;
  }
  const p = { prompt: ids, max_tokens: 24, temperature: 0, ignore_eos: true };
  const a = await client.completions.create(p);
  assert.equal(a.usage.prompt_tokens, ids.length);
  assert.equal(a.usage.completion_tokens, 24);
  assert.equal(a.choices[0].finish_reason, 'length');
  const b = await client.completions.create({ ...p, prompt: [ids] });
  assert.equal(b.choices[0].text, a.choices[0].text);
  await expectError(await post({ prompt: [1, 99999999], max_tokens: 4 }), 400, { param: 'prompt' });
  await expectError(await post({ prompt: [], max_tokens: 4 }), 400, { param: 'prompt' });
});

test('concurrent requests each get their own answer', async () => {
  const sizes = [3, 5, 8, 13];
  const alone = [];
  for (const n of sizes) alone.push((await client.chat.completions.create({ messages: MSGS, max_tokens: n, temperature: 0 })).choices[0].message.content);
  const together = await Promise.all(
    sizes.map((n, i) => (i % 2 ? streamChat({ messages: MSGS, max_tokens: n, temperature: 0 }).then((s) => s.text)
      : client.chat.completions.create({ messages: MSGS, max_tokens: n, temperature: 0 }).then((r) => r.choices[0].message.content))));
  assert.deepEqual(together, alone);
});

// Streams a completion or chat request and gathers each choice's text and finish by index.
async function streamChoices(create, params) {
  const stream = await create({ ...params, stream: true, stream_options: { include_usage: true } });
  const text = {}, finish = {}, order = [];
  let usage = null, finals = 0;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      const piece = ch.delta ? ch.delta.content || '' : ch.text || '';
      text[ch.index] = (text[ch.index] || '') + piece;
      if (piece) order.push(ch.index);
      if (ch.finish_reason) finish[ch.index] = ch.finish_reason, finals++;
    }
  }
  return { text, finish, order, usage, finals };
}

test('n > 1: greedy copies equal a lone answer, whole and streamed; usage counts the prompt once', async () => {
  const p = { messages: MSGS, max_tokens: 12, temperature: 0 };
  const lone = await client.chat.completions.create(p);
  const r = await client.chat.completions.create({ ...p, n: 3 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  for (const c of r.choices) {
    assert.equal(c.message.content, lone.choices[0].message.content);
    assert.equal(c.finish_reason, lone.choices[0].finish_reason);
  }
  assert.equal(r.usage.prompt_tokens, lone.usage.prompt_tokens);
  assert.equal(r.usage.completion_tokens, 3 * lone.usage.completion_tokens);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  const s = await streamChoices((x) => client.chat.completions.create(x), { ...p, n: 3 });
  assert.deepEqual(Object.keys(s.text).map(Number).sort(), [0, 1, 2]);
  for (let i = 0; i < 3; i++) {
    assert.equal(s.text[i], lone.choices[0].message.content);
    assert.equal(s.finish[i], lone.choices[0].finish_reason);
  }
  assert.equal(s.finals, 3);
  assert.deepEqual(s.usage, r.usage);
});

test('a prompt array: one choice per prompt, each equal to its lone answer; prompts × n', async () => {
  const prompts = ['Once upon a time', 'The lighthouse keeper', 'In the morning'];
  const p = { max_tokens: 10, temperature: 0 };
  const lone = [];
  for (const prompt of prompts) lone.push(await client.completions.create({ ...p, prompt }));
  const r = await client.completions.create({ ...p, prompt: prompts });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.deepEqual(r.choices.map((c) => c.text), lone.map((l) => l.choices[0].text));
  assert.equal(r.usage.prompt_tokens, lone.reduce((a, l) => a + l.usage.prompt_tokens, 0));
  assert.equal(r.usage.completion_tokens, lone.reduce((a, l) => a + l.usage.completion_tokens, 0));
  const s = await streamChoices((x) => client.completions.create(x), { ...p, prompt: prompts });
  assert.deepEqual([0, 1, 2].map((i) => s.text[i]), lone.map((l) => l.choices[0].text));
  assert.equal(s.finals, 3);
  assert.deepEqual(s.usage, r.usage);
  // index = prompt * n + copy
  const rn = await client.completions.create({ ...p, prompt: prompts.slice(0, 2), n: 2 });
  assert.deepEqual(rn.choices.map((c) => c.index), [0, 1, 2, 3]);
  assert.deepEqual(rn.choices.map((c) => c.text), [0, 0, 1, 1].map((i) => lone[i].choices[0].text));
  if (!FAKE) { /* prompts of token ids in an array */
    const ids = [[5, 17, 230, 41], [99, 8, 12]];
    const a = await client.completions.create({ ...p, prompt: ids[0] });
    const b = await client.completions.create({ ...p, prompt: ids[1] });
    const both = await client.completions.create({ ...p, prompt: ids });
    assert.deepEqual(both.choices.map((c) => c.text), [a.choices[0].text, b.choices[0].text]);
  }
});

test('n > 1 with a seed: the copies differ, and the same seed repeats them', async () => {
  const p = { prompt: 'Once upon a time', max_tokens: 16, temperature: 1, seed: 7, n: 3 };
  const a = await client.completions.create(p);
  const b = await client.completions.create(p);
  assert.deepEqual(a.choices.map((c) => c.text), b.choices.map((c) => c.text));
  assert.ok(new Set(a.choices.map((c) => c.text)).size > 1, 'the copies all came out the same');
  const lone = await client.completions.create({ ...p, n: 1 });
  assert.equal(a.choices[0].text, lone.choices[0].text);
});

// best_of draws its continuations as n = best_of would (the same seeds), and
// returns the n of them with the highest cumulative logprob, best first.
test('best_of with n returns the n continuations of highest cumulative logprob', { skip: FAKE }, async () => {
  const p = { prompt: 'Once upon a time', max_tokens: 8, temperature: 1, seed: 11, logprobs: 1 };
  const all = await client.completions.create({ ...p, n: 4 });
  const sum = (c) => c.logprobs.token_logprobs.reduce((a, b) => a + b, 0);
  const ranked = all.choices.map((c) => ({ text: c.text, lp: sum(c) })).sort((a, b) => b.lp - a.lp);
  const best = await client.completions.create({ ...p, n: 2, best_of: 4 });
  assert.deepEqual(best.choices.map((c) => c.index), [0, 1]);
  assert.deepEqual(best.choices.map((c) => c.text), ranked.slice(0, 2).map((c) => c.text));
  assert.equal(best.usage.completion_tokens, all.usage.completion_tokens); // every continuation counts
});

test('the copies of n > 1 share the prompt through the prefix cache', { skip: FAKE }, async () => {
  const stats = async () => (await (await fetch(main.url + '/stats')).json());
  const prompt = 'A long prompt about lighthouses, ' + 'the sea, the rocks and the keepers who watched them, '.repeat(6);
  const before = await stats();
  const r = await client.completions.create({ prompt, max_tokens: 4, temperature: 0, n: 4 });
  const after = await stats();
  const misses = after.prefix_cache.miss_tokens - before.prefix_cache.miss_tokens;
  const hits = after.prefix_cache.hit_tokens - before.prefix_cache.hit_tokens;
  // the first copy computes the prompt; the others only its last, partial block
  assert.ok(misses <= r.usage.prompt_tokens + 3 * after.kv_cache.block_tokens, `the prompt was computed again: ${misses} missed`);
  assert.ok(hits >= 3 * (r.usage.prompt_tokens - after.kv_cache.block_tokens), `the copies hit ${hits} tokens`);
});

test("llama.cpp's sampler fields change the output as defined, on every route", { skip: FAKE }, async () => {
  const base = { prompt: 'And God said, Let there be', max_tokens: 24 };
  // XTC with probability 1 and threshold 0 over the top 2 (no nucleus from the model's defaults): every token
  // is the less likely of the two
  const x = await client.completions.create({ ...base, temperature: 1, seed: 7, top_k: 2, top_p: 1, min_p: 0, logprobs: 2,
    xtc_probability: 1, xtc_threshold: 0 });
  const lp = x.choices[0].logprobs;
  assert.equal(lp.tokens.length, 24);
  for (let i = 0; i < lp.tokens.length; i++) {
    const alts = Object.values(lp.top_logprobs[i]);
    assert.equal(alts.length, 2);
    assert.equal(lp.token_logprobs[i], Math.min(...alts), `token ${i} is the second choice`);
  }
  // DRY at temperature 0: the greedy text repeats itself; DRY turns it elsewhere, streamed alike
  const greedy = await client.completions.create({ ...base, temperature: 0 });
  const dryp = { ...base, temperature: 0, dry_multiplier: 2, dry_allowed_length: 1 };
  const dry = await client.completions.create(dryp);
  assert.notEqual(dry.choices[0].text, greedy.choices[0].text);
  let streamed = '';
  for await (const c of await client.completions.create({ ...dryp, stream: true })) if (c.choices.length) streamed += c.choices[0].text;
  assert.equal(streamed, dry.choices[0].text);
  // typical_p 0 (the one most typical token) and mirostat 2: seeded, reproducible, and not the plain draw
  const seeded = { ...base, temperature: 1, seed: 11 };
  const plain = await client.completions.create(seeded);
  for (const extra of [{ typical_p: 0 }, { mirostat: 2, mirostat_tau: 2 }]) {
    const a = await client.completions.create({ ...seeded, ...extra });
    const b = await client.completions.create({ ...seeded, ...extra });
    assert.equal(a.choices[0].text, b.choices[0].text, JSON.stringify(extra));
    assert.notEqual(a.choices[0].text, plain.choices[0].text, JSON.stringify(extra));
  }
  // the same fields on chat, Anthropic and Responses
  const chatp = { messages: MSGS, max_tokens: 24, temperature: 0 };
  const c0 = await client.chat.completions.create(chatp);
  const c1 = await client.chat.completions.create({ ...chatp, dry_multiplier: 3, dry_allowed_length: 0, dry_penalty_last_n: -1 });
  assert.notEqual(c1.choices[0].message.content, c0.choices[0].message.content);
  const anth = await post(main, '/v1/messages', JSON.stringify({ model: 'my-alias', max_tokens: 8, messages: MSGS, xtc_probability: 1,
    xtc_threshold: 0, top_k: 3, temperature: 1 }), { 'anthropic-version': '2023-06-01' });
  assert.equal(anth.status, 200);
  const resp = await post(main, '/v1/responses', JSON.stringify({ input: 'Hello', max_output_tokens: 8, typical_p: 0.5,
    dry_multiplier: 1, dry_sequence_breakers: ['\n', ';'] }));
  assert.equal(resp.status, 200);
});

test('echo with logprobs scores the prompt; token-id prompts echo; return_token_ids, whole and streamed', { skip: FAKE }, async () => {
  const prompt = 'And God said, Let there be';
  const p = { prompt, max_tokens: 6, temperature: 0, logprobs: 2, return_token_ids: true };
  const plain = await client.completions.create(p);
  const ids = plain.choices[0].prompt_token_ids;
  const out = plain.choices[0].token_ids;
  assert.ok(Array.isArray(ids) && ids.length > 3);
  assert.equal(out.length, 6);
  const r = await client.completions.create({ ...p, echo: true });
  const c = r.choices[0], lp = c.logprobs;
  assert.equal(c.text, prompt + plain.choices[0].text);
  assert.deepEqual(c.prompt_token_ids, ids);
  assert.deepEqual(c.token_ids, out);
  assert.equal(lp.tokens.length, ids.length + 6);
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  for (let i = 1; i < ids.length; i++) {
    const alts = Object.values(lp.top_logprobs[i]);
    assert.equal(alts.length, 2);
    assert.ok(lp.token_logprobs[i] < 0 && lp.token_logprobs[i] <= Math.max(...alts) + 1e-6, `prompt token ${i}`);
  }
  // the generated part is the plain answer's, its offsets after the echoed prompt
  assert.deepEqual(lp.token_logprobs.slice(ids.length), plain.choices[0].logprobs.token_logprobs);
  assert.deepEqual(lp.tokens.slice(ids.length), plain.choices[0].logprobs.tokens);
  assert.equal(lp.text_offset[ids.length], prompt.length);
  // streamed: the prompt and its logprobs first, then the tokens, ids on the way
  let text = '', toks = [], sids = [], first = null;
  for await (const ch of await client.completions.create({ ...p, echo: true, stream: true })) {
    if (!ch.choices.length) continue;
    if (first === null) first = ch.choices[0];
    text += ch.choices[0].text;
    if (ch.choices[0].logprobs) toks.push(...ch.choices[0].logprobs.tokens);
    sids.push(...(ch.choices[0].token_ids || []));
  }
  assert.equal(text, c.text);
  assert.deepEqual(toks, lp.tokens);
  assert.deepEqual(first.prompt_token_ids, ids);
  assert.deepEqual(sids, out);
  // a prompt of token ids echoes its text
  const r2 = await client.completions.create({ prompt: ids, max_tokens: 6, temperature: 0, echo: true, return_token_ids: true });
  assert.deepEqual(r2.choices[0].prompt_token_ids, ids);
  assert.deepEqual(r2.choices[0].token_ids, out);
  assert.ok(r2.choices[0].text.endsWith(prompt + plain.choices[0].text), r2.choices[0].text);
  // chat: prompt_token_ids at the top level, token_ids per choice; the stream's first chunk has the prompt's
  const cp = { messages: MSGS, max_tokens: 8, temperature: 0, return_token_ids: true };
  const w = await client.chat.completions.create(cp);
  assert.ok(Array.isArray(w.prompt_token_ids) && w.prompt_token_ids.length > 0);
  assert.ok(Array.isArray(w.choices[0].token_ids) && w.choices[0].token_ids.length === w.usage.completion_tokens);
  let cids = [], firstChunk = null;
  for await (const ch of await client.chat.completions.create({ ...cp, stream: true })) {
    if (firstChunk === null) firstChunk = ch;
    else assert.equal(ch.prompt_token_ids, undefined);
    if (ch.choices.length) cids.push(...(ch.choices[0].token_ids || []));
  }
  assert.deepEqual(firstChunk.prompt_token_ids, w.prompt_token_ids);
  assert.deepEqual(cids, w.choices[0].token_ids);
  // without it, none of these fields
  const none = await client.completions.create({ prompt, max_tokens: 2 });
  assert.equal(none.choices[0].token_ids, undefined);
  assert.equal(none.choices[0].prompt_token_ids, undefined);
});

test("llama.cpp's sampler fields are checked by name", async () => {
  const postj = (p, body) => post(main, p, JSON.stringify(body));
  const bad = [[{ mirostat: 1 }, 'mirostat'], [{ mirostat: 3 }, 'mirostat'], [{ dry_base: 0.5 }, 'dry_base'],
    [{ dry_multiplier: -1 }, 'dry_multiplier'], [{ dry_allowed_length: -1 }, 'dry_allowed_length'],
    [{ dry_penalty_last_n: -2 }, 'dry_penalty_last_n'], [{ dry_sequence_breakers: [] }, 'dry_sequence_breakers'],
    [{ dry_sequence_breakers: [''] }, 'dry_sequence_breakers'], [{ dry_sequence_breakers: 5 }, 'dry_sequence_breakers'],
    [{ typical_p: 1.5 }, 'typical_p'], [{ xtc_probability: 2 }, 'xtc_probability'], [{ xtc_threshold: -1 }, 'xtc_threshold'],
    [{ mirostat_tau: 'x' }, 'mirostat_tau'], [{ mirostat_eta: -0.1 }, 'mirostat_eta']];
  for (const [fields, param] of bad) {
    await expectError(await postj('/v1/completions', { prompt: 'x', ...fields }), 400, { param });
    await expectError(await postj('/v1/chat/completions', { messages: MSGS, ...fields }), 400, { param });
  }
  const anth = await post(main, '/v1/messages', JSON.stringify({ model: 'my-alias', max_tokens: 8, messages: MSGS, mirostat: 1 }),
    { 'anthropic-version': '2023-06-01' });
  assert.equal(anth.status, 400);
  assert.match((await anth.json()).error.message, /mirostat/);
  await expectError(await postj('/v1/responses', { input: 'x', dry_base: 0 }), 400, { param: 'dry_base' });
  await expectError(await postj('/v1/responses', { input: 'x', return_token_ids: true }), 400, { param: 'return_token_ids' });
  const anth2 = await post(main, '/v1/messages', JSON.stringify({ model: 'my-alias', max_tokens: 8, messages: MSGS,
    return_token_ids: true }), { 'anthropic-version': '2023-06-01' });
  assert.equal(anth2.status, 400);
  if (FAKE) /* an engine that cannot score prompts says so */
    await expectError(await postj('/v1/completions', { prompt: 'x', echo: true, logprobs: 1 }), 400, { param: 'echo' });
});

test('n and prompt arrays are checked by name', async () => {
  const postj = (p, body) => post(main, p, JSON.stringify(body));
  await expectError(await postj('/v1/completions', { prompt: 'x', n: 3, best_of: 2 }), 400, { param: 'best_of' });
  await expectError(await postj('/v1/completions', { prompt: 'x', n: 1, best_of: 2, stream: true }), 400, { param: 'best_of' });
  await expectError(await postj('/v1/chat/completions', { messages: MSGS, n: 1, best_of: 2 }), 400, { param: 'best_of' });
  await expectError(await postj('/v1/completions', { prompt: 'x', n: 0 }), 400, { param: 'n' });
  await expectError(await postj('/v1/completions', { prompt: 'x', n: 1000 }), 400, { param: 'n' });
  await expectError(await postj('/v1/completions', { prompt: ['x', 5] }), 400, { param: 'prompt[1]' });
  await expectError(await postj('/v1/chat/completions', { messages: MSGS, n: 200 }), 400, { param: 'n' });
});

async function expectError(res, status, fields = {}) {
  assert.equal(res.status, status);
  const body = await res.json();
  assert.ok(body.error, 'error object');
  assert.equal(typeof body.error.message, 'string');
  assert.ok(body.error.message.length > 0);
  assert.ok('type' in body.error && 'param' in body.error && 'code' in body.error);
  for (const [k, v] of Object.entries(fields)) assert.equal(body.error[k], v, `error.${k}`);
  return body.error;
}

const post = (srv, p, body, headers = {}) =>
  fetch(srv.url + p, { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body });

test('errors have the OpenAI shape and status', async () => {
  await expectError(await fetch(main.url + '/v1/nope'), 404);
  await expectError(await fetch(main.url + '/v1/chat/completions'), 405);
  await expectError(await post(main, '/v1/models', '{}'), 405);
  await expectError(await post(main, '/v1/chat/completions', '{"messages": ['), 400, { type: 'invalid_request_error' });
  await expectError(await post(main, '/v1/chat/completions', '{"model":"m"}'), 400, { param: 'messages' });
  await expectError(await post(main, '/v1/chat/completions', JSON.stringify({ messages: MSGS, temperature: 'hot' })), 400, { param: 'temperature' });
  await expectError(await post(main, '/v1/chat/completions', JSON.stringify({ messages: MSGS, n: 0 })), 400, { param: 'n' });
  await expectError(await post(main, '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 5 }] })), 400, { param: 'messages[0].content' });
  await expectError(await post(main, '/v1/completions', JSON.stringify({ prompt: 7 })), 400, { param: 'prompt' });
  await expectError(await post(main, '/v1/chat/completions', JSON.stringify({ messages: MSGS, max_tokens: 10000000 })), 400,
    { code: 'context_length_exceeded', param: 'messages' });
  // The client raises these as APIError with the same fields.
  await assert.rejects(client.chat.completions.create({ messages: MSGS, top_p: 7 }), (e) => e.status === 400 && e.param === 'top_p');
  await assert.rejects(client.chat.completions.create({ messages: MSGS, max_tokens: 10000000, stream: true }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded');
});

test('API key and body limit', async () => {
  const c = new OpenAI({ baseURL: guarded.url + '/v1', apiKey: KEY, maxRetries: 0 });
  const ok = await c.chat.completions.create({ messages: MSGS, max_tokens: 2 });
  assert.equal(ok.choices.length, 1);
  const wrong = new OpenAI({ baseURL: guarded.url + '/v1', apiKey: 'sk-wrong', maxRetries: 0 });
  await assert.rejects(wrong.models.list(), (e) => e.status === 401);
  await expectError(await fetch(guarded.url + '/v1/models'), 401, { type: 'authentication_error' });
  await expectError(await post(guarded, '/v1/chat/completions', JSON.stringify({ messages: MSGS })), 401);
  assert.equal((await fetch(guarded.url + '/health')).status, 200);
  const big = JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(8192) }] });
  await expectError(await post(guarded, '/v1/chat/completions', big, { Authorization: 'Bearer ' + KEY }), 413);
  await assert.rejects(c.chat.completions.create({ messages: [{ role: 'user', content: 'y'.repeat(5000) }] }), (e) => e.status === 413);
});

// Raw HTTP: what the server's handler refuses is answered in the OpenAI error
// shape, one header block, JSON; what libmicrohttpd refuses before the handler
// sees the request keeps its status (README: "HTTP errors libmicrohttpd answers").
function rawHttp(srv, bytes) {
  const net = require('node:net');
  const u = new URL(srv.url);
  return new Promise((resolve, reject) => {
    const sock = net.connect(Number(u.port), u.hostname, () => sock.write(bytes));
    const chunks = [];
    sock.on('data', (d) => chunks.push(d));
    sock.on('error', reject);
    sock.on('close', () => resolve(Buffer.concat(chunks).toString('latin1')));
    sock.setTimeout(10000, () => sock.destroy());
  });
}

test('raw HTTP: the handler\'s 4xx are JSON with one header block', async () => {
  const host = 'Host: x\r\nConnection: close\r\n';
  const cases = [
    [main, `GET /nope HTTP/1.1\r\n${host}\r\n`, 404, 'not_found'],
    [main, `PATCH /v1/chat/completions HTTP/1.1\r\n${host}\r\n`, 405, 'method_not_allowed'],
    [main, `FOO /v1/models HTTP/1.1\r\n${host}\r\n`, 405, 'method_not_allowed'],
    [guarded, `POST /v1/chat/completions HTTP/1.1\r\n${host}Authorization: Bearer ${KEY}\r\nContent-Length: 99999999\r\n\r\n`, 413, 'request_too_large'],
    [guarded, `POST /v1/chat/completions HTTP/1.1\r\n${host}Authorization: Bearer ${KEY}\r\nContent-Length: 99999999\r\nExpect: 100-continue\r\n\r\n`, 413, 'request_too_large'],
    [guarded, `GET /v1/models HTTP/1.1\r\n${host}\r\n`, 401, 'invalid_api_key'],
    [main, `POST /v1/chat/completions HTTP/1.1\r\n${host}Content-Length: 3\r\n\r\n{x}`, 400, null],
  ];
  for (const [srv, req, status, code] of cases) {
    const res = await rawHttp(srv, req);
    const label = JSON.stringify(req.slice(0, 60));
    const [head, ...rest] = res.split('\r\n\r\n');
    const body = rest.join('\r\n\r\n');
    assert.match(head, new RegExp(`^HTTP/1\\.1 ${status} `), `${label}: ${res.slice(0, 200)}`);
    assert.equal((res.match(/^HTTP\/1\.1 /gm) || []).length, 1, `${label}: one status line: ${res}`);
    assert.match(head, /\r\nContent-Type: application\/json/i, label);
    const len = Number(/\r\nContent-Length: (\d+)/i.exec(head)?.[1]);
    assert.equal(Buffer.byteLength(body, 'latin1'), len, `${label}: the body is Content-Length bytes`);
    const j = JSON.parse(body);
    assert.equal(typeof j.error.message, 'string', label);
    assert.ok(j.error.type, label);
    if (code) assert.equal(j.error.code, code, label);
  }
  // refused by libmicrohttpd before the handler: its status, then the connection closes
  for (const [req, status] of [
    ['GET /v1/models HTTP/2.5\r\nHost: x\r\n\r\n', 505],
    [`GET /v1/models HTTP/1.1\r\nHost: x\r\nX: ${'a'.repeat(40000)}\r\n\r\n`, 431],
    ['GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n', 400],
  ]) {
    const res = await rawHttp(main, req);
    assert.match(res, new RegExp(`^HTTP/1\\.1 ${status} `), res.slice(0, 200));
  }
});

// The connection limits as flags: a client address past its share is
// refused at once, an idle connection and a stalled body are closed.
test('--max-connections-per-address, --idle-timeout, --body-timeout', { timeout: 120000 }, async () => {
  const net = require('node:net');
  const srv = await startServer(['--max-connections-per-address', '2', '--idle-timeout', '2', '--body-timeout', '2']);
  try {
    const u = new URL(srv.url);
    const open = () => new Promise((resolve, reject) => {
      const s = net.connect(Number(u.port), u.hostname, () => resolve(s));
      s.on('error', reject);
      s.ended = new Promise((r) => s.on('close', r));
      s.got = '';
      s.on('data', (d) => { s.got += d.toString('latin1'); });
    });
    const a = await open(), b = await open();
    await new Promise((r) => setTimeout(r, 200)); // both accepted by the server
    const c = await open();
    // the third from this address is closed without an answer while the first two stay open
    await c.ended;
    assert.equal(c.got, '');
    assert.equal(a.destroyed, false);
    // the first two, idle, are closed by --idle-timeout (2 s), before the default 10 s
    const t0 = Date.now();
    await Promise.all([a.ended, b.ended]);
    assert.equal(a.got, '');
    assert.ok(Date.now() - t0 < 9500, `idle connections closed after ${Date.now() - t0} ms`);
    // a body that stalls is dropped by --body-timeout (2 s)
    const d = await open();
    d.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"mess');
    const t1 = Date.now();
    await d.ended;
    assert.ok(!/^HTTP\/1\.1 200/.test(d.got), d.got);
    assert.ok(Date.now() - t1 < 30000, `a stalled body dropped after ${Date.now() - t1} ms (default 60 s)`);
    // and the server answers the next client
    const h = await fetch(srv.url + '/health');
    assert.equal(h.status, 200);
  } finally {
    await stopServer(srv);
  }
});

test('health, index and chat page', async () => {
  const h = await (await fetch(main.url + '/health')).json();
  assert.equal(h.status, 'ok');
  const idx = await (await fetch(main.url + '/v1')).json();
  const paths = idx.data.map((e) => e.path);
  for (const p of ['/v1/chat/completions', '/v1/completions', '/v1/models', '/health']) assert.ok(paths.includes(p), p);
  assert.equal(idx.capabilities.model, modelId);
  assert.equal(typeof idx.capabilities.tools, 'boolean');
  assert.equal(typeof idx.capabilities.reasoning, 'boolean');
  if (FAKE) assert.deepEqual([idx.capabilities.tools, idx.capabilities.tool_call_format, idx.capabilities.reasoning],
    [true, 'hermes', true]);
  assert.deepEqual(idx.capabilities.methods, ['autoregressive']);
  if (!FAKE) { /* loaded with speculative decoding: the method and its draft source are listed */
    const spec = await startServer(['--spec-tokens', '4']);
    try {
      const j = await (await fetch(spec.url + '/v1')).json();
      assert.deepEqual(j.capabilities.methods, ['autoregressive', { method: 'speculative', source: 'ngram' }]);
    } finally {
      await stopServer(spec);
    }
  }
  const page = await fetch(main.url + '/');
  assert.equal(page.status, 200);
  assert.match(page.headers.get('content-type'), /text\/html/);
  const html = await page.text();
  assert.match(html, /<title>hearth<\/title>/);
  assert.match(html, /\/v1\/chat\/completions/);
  assert.match(html, /AbortController/);
  assert.doesNotMatch(html, /(src|href)=["']?https?:/); // nothing fetched from elsewhere
  // Every script parses (the bundled libraries', then the page's own), and
  // the page's declares no global that a browser already owns (a top-level
  // `const history` throws in a page).
  const scripts = [...html.matchAll(/<script>([\s\S]*?)<\/script>/g)].map((m) => m[1]);
  assert.ok(scripts.length >= 1);
  for (const s of scripts) assert.doesNotThrow(() => new (require('node:vm').Script)(s));
  const script = scripts[scripts.length - 1];
  assert.match(script, /AbortController/);
  for (const name of ['history', 'name', 'status', 'location', 'top', 'parent', 'self', 'event'])
    assert.doesNotMatch(script, new RegExp(`^(const|let|var|function) ${name}\\b`, 'm'), name);
});

test('a client that disconnects mid-stream is cancelled; the server keeps serving', async () => {
  const ac = new AbortController();
  const content = FAKE ? 'Tell me everything [slow]' : 'Tell me everything.';
  const stream = await client.chat.completions.create(
    { messages: [{ role: 'user', content }], temperature: 0, stream: true }, // as long as the context allows
    { signal: ac.signal });
  let got = 0;
  const logBefore = main.log.length;
  try {
    for await (const c of stream) {
      if (c.choices.length && c.choices[0].delta.content && ++got === 3) {
        ac.abort(); // closes the connection
        break;
      }
    }
  } catch (e) {
    if (e.name !== 'AbortError' && !(e instanceof OpenAI.APIUserAbortError)) throw e;
  }
  assert.equal(got, 3);
  if (FAKE) {
    await waitFor(() => main.log.slice(logBefore).includes('generation cancelled'), 'the fake engine to see the cancel');
    await waitFor(() => main.log.slice(logBefore).includes('client went away'), 'the server to log the cancel');
  }
  const r = await client.chat.completions.create({ messages: MSGS, max_tokens: 4, temperature: 0 });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(main.proc.exitCode, null);
});

// ---- tools and reasoning (the fake model's template is Hermes-style with <think> blocks) ----

const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string' } } } } },
];

// Gathers a streamed chat into content, reasoning and tool calls the way clients do (by index).
async function streamTools(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  let content = '', reasoning = '', finish = null;
  const calls = [];
  for await (const c of stream) {
    if (!c.choices.length) continue;
    const d = c.choices[0].delta;
    if (d.content) content += d.content;
    if (d.reasoning_content) reasoning += d.reasoning_content;
    for (const tc of d.tool_calls || []) {
      if (!calls[tc.index]) {
        assert.match(tc.id, /^call_/);
        assert.equal(tc.type, 'function');
        calls[tc.index] = { id: tc.id, name: tc.function.name, arguments: '' };
      }
      calls[tc.index].arguments += tc.function.arguments || '';
    }
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  return { content, reasoning, calls, finish };
}

test('a tool call comes back as tool_calls, whole and streamed', { skip: !FAKE }, async () => {
  const params = { messages: [{ role: 'user', content: 'Weather in Paris? [toolcall]' }], tools: TOOLS, temperature: 0 };
  const r = await client.chat.completions.create(params);
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.content.trim(), 'Let me check.');
  assert.equal(m.reasoning_content.trim(), 'The user wants the weather.');
  assert.equal(m.tool_calls.length, 1);
  assert.match(m.tool_calls[0].id, /^call_[A-Za-z0-9]{24}$/);
  assert.equal(m.tool_calls[0].type, 'function');
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris "Ville"', days: 3 });
  const s = await streamTools(params);
  assert.equal(s.finish, 'tool_calls');
  assert.equal(s.content, m.content);
  assert.equal(s.reasoning, m.reasoning_content);
  assert.equal(s.calls.length, 1);
  assert.equal(s.calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(s.calls[0].arguments), { city: 'Paris "Ville"', days: 3 });
});

test('two calls in one reply; content is null; no marker leaks into the stream', { skip: !FAKE }, async () => {
  const params = { messages: [{ role: 'user', content: 'Oslo weather and time [twocalls]' }], tools: TOOLS, temperature: 0 };
  const r = await client.chat.completions.create(params);
  const m = r.choices[0].message;
  assert.equal(m.content, null);
  assert.deepEqual(m.tool_calls.map((c) => c.function.name), ['get_weather', 'get_time']);
  assert.deepEqual(JSON.parse(m.tool_calls[1].function.arguments), { zone: 'CET', list: [1, 2] });
  assert.notEqual(m.tool_calls[0].id, m.tool_calls[1].id);
  const s = await streamTools(params);
  assert.equal(s.content.trim(), '');
  assert.doesNotMatch(s.content, /tool_call|</);
  assert.deepEqual(s.calls.map((c) => JSON.parse(c.arguments)), m.tool_calls.map((c) => JSON.parse(c.function.arguments)));
});

test('without tools (or with tool_choice none) the call syntax is plain text; reasoning is split', { skip: !FAKE }, async () => {
  const msgs = [{ role: 'user', content: 'Weather? [toolcall]' }];
  for (const extra of [{}, { tools: TOOLS, tool_choice: 'none' }]) {
    const r = await client.chat.completions.create({ messages: msgs, temperature: 0, ...extra });
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].message.tool_calls, undefined);
    assert.match(r.choices[0].message.content, /^\s*Let me check\.\n<tool_call>\n\{"name": "get_weather"/);
    assert.equal(r.choices[0].message.reasoning_content.trim(), 'The user wants the weather.');
  }
  const t = await client.chat.completions.create({ messages: [{ role: 'user', content: 'Sum? [think]' }], temperature: 0 });
  assert.equal(t.choices[0].message.reasoning_content.trim(), 'First, 2 + 2.\nThat is 4.');
  assert.equal(t.choices[0].message.content.trim(), 'The answer is 4.');
  const s = await streamTools({ messages: [{ role: 'user', content: 'Sum? [think]' }], temperature: 0 });
  assert.equal(s.reasoning, t.choices[0].message.reasoning_content);
  assert.equal(s.content, t.choices[0].message.content);
});

test('tools, tool calls and tool results reach the template', { skip: !FAKE }, async () => {
  const messages = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
    { role: 'user', content: 'Thanks. [echo-prompt]' },
  ];
  const n = await fetch(main.url + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages, tools: TOOLS, max_tokens: 1 }) });
  assert.equal(n.status, 200);
  // The prompt (counted by the fake as bytes/4) grows with the tools and the structured turns.
  const plain = await client.chat.completions.create({ messages: [messages[0], messages[3]], max_tokens: 1 });
  assert.ok((await n.json()).usage.prompt_tokens > plain.usage.prompt_tokens);
});

test('tool_choice required or a named function opens the reply with a call', { skip: !FAKE }, async () => {
  const named = { messages: [{ role: 'user', content: 'What time is it? [args]' }], tools: TOOLS,
    tool_choice: { type: 'function', function: { name: 'get_time' } }, temperature: 0 };
  const r = await client.chat.completions.create(named);
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(r.choices[0].message.tool_calls.length, 1);
  assert.equal(r.choices[0].message.tool_calls[0].function.name, 'get_time');
  assert.deepEqual(JSON.parse(r.choices[0].message.tool_calls[0].function.arguments), { zone: 'UTC' });
  const s = await streamTools(named);
  assert.equal(s.finish, 'tool_calls');
  assert.deepEqual(s.calls.map((c) => [c.name, JSON.parse(c.arguments)]), [['get_time', { zone: 'UTC' }]]);
  const any = { messages: [{ role: 'user', content: 'Weather? [anyargs]' }], tools: TOOLS, tool_choice: 'required', temperature: 0 };
  const a = await client.chat.completions.create(any);
  assert.equal(a.choices[0].message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(a.choices[0].message.tool_calls[0].function.arguments), { city: 'Rome' });
  const sa = await streamTools(any);
  assert.deepEqual(sa.calls.map((c) => c.name), ['get_weather']);
});

test('tool fields are checked', async () => {
  const bad = (body) => post(main, '/v1/chat/completions', JSON.stringify({ messages: MSGS, ...body }));
  await expectError(await bad({ tools: {} }), 400, { param: 'tools' });
  await expectError(await bad({ tools: [{ type: 'code_interpreter' }] }), 400, { param: 'tools[0]' });
  await expectError(await bad({ tools: [{ type: 'function', function: { name: 'bad name!' } }] }), 400, { param: 'tools[0]' });
  await expectError(await bad({ tools: TOOLS, tool_choice: 'sometimes' }), 400, { param: 'tool_choice' });
  await expectError(await bad({ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }), 400, { param: 'tool_choice' });
  await expectError(await bad({ tool_choice: 'required' }), 400, { param: 'tool_choice' });
  await expectError(await bad({ functions: [] }), 400, { param: 'functions' });
  await expectError(await bad({ modalities: ['text', 'audio'] }), 400, { param: 'modalities' });
  await expectError(await bad({ response_format: { type: 'yaml' } }), 400, { param: 'response_format' });
  await expectError(await bad({ reasoning_effort: 'extreme' }), 400, { param: 'reasoning_effort' });
  // constrained output that cannot be followed is refused by name, never ignored (the output
  // itself is checked on a real model in structured.test.cjs)
  await expectError(await bad({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { not: {} } } } }), 400,
    { param: 'response_format' });
  await expectError(await bad({ grammar: 'root ::= undefined-rule' }), 400, { param: 'grammar' });
  assert.equal((await bad({ response_format: { type: 'json_object' }, max_tokens: 4 })).status, 200);
  assert.equal((await bad({ response_format: { type: 'text' }, max_tokens: 1 })).status, 200);
  const ok = await bad({ tools: TOOLS, tool_choice: 'auto', parallel_tool_calls: true, user: 'u', metadata: { a: 'b' },
    store: false, service_tier: 'auto', max_tokens: 2 });
  assert.equal(ok.status, 200);
});

test('an unknown model is 404 model_not_found on every route; aliases and the id are served', async () => {
  const body = (model) => JSON.stringify({ model, messages: MSGS, max_tokens: 1 });
  const e = await expectError(await post(main, '/v1/chat/completions', body('gpt-4o')), 404,
    { code: 'model_not_found', param: 'model' });
  assert.match(e.message, /gpt-4o/);
  await expectError(await post(main, '/v1/completions', JSON.stringify({ model: 'nope', prompt: 'a' })), 404,
    { code: 'model_not_found' });
  await expectError(await fetch(main.url + '/v1/models/nope'), 404, { code: 'model_not_found' });
  assert.equal((await fetch(main.url + '/v1/models/my-alias')).status, 200);
  for (const m of [modelId, 'my-alias']) assert.equal((await post(main, '/v1/chat/completions', body(m))).status, 200);
  const a = await post(main, '/v1/messages', JSON.stringify({ model: 'claude-x', max_tokens: 1, messages: MSGS }));
  assert.equal(a.status, 404);
  assert.equal((await a.json()).error.type, 'not_found_error');
  await assert.rejects(client.chat.completions.create({ model: 'gpt-4o', messages: MSGS }),
    (err) => err.status === 404 && err.code === 'model_not_found');
});

test('--cors: a preflight is answered and every response carries the origin', async () => {
  const pre = await fetch(main.url + '/v1/chat/completions', { method: 'OPTIONS',
    headers: { Origin: 'https://app.example', 'Access-Control-Request-Method': 'POST',
      'Access-Control-Request-Headers': 'authorization, content-type' } });
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get('access-control-allow-origin'), 'https://app.example');
  assert.match(pre.headers.get('access-control-allow-methods'), /POST/);
  assert.match(pre.headers.get('access-control-allow-headers'), /Authorization/);
  const r = await post(main, '/v1/chat/completions', JSON.stringify({ messages: MSGS, max_tokens: 1 }));
  assert.equal(r.headers.get('access-control-allow-origin'), 'https://app.example');
  const s = await post(main, '/v1/chat/completions', JSON.stringify({ messages: MSGS, max_tokens: 1, stream: true }));
  assert.equal(s.headers.get('access-control-allow-origin'), 'https://app.example');
  await s.text();
  const bad = await post(main, '/v1/chat/completions', '{');
  assert.equal(bad.headers.get('access-control-allow-origin'), 'https://app.example');
  // without --cors: no CORS headers
  const g = await fetch(guarded.url + '/health');
  assert.equal(g.headers.get('access-control-allow-origin'), null);
});
