// surface.test.cjs — the request surface users of vLLM, llama.cpp and
// Anthropic's clients script against, end to end over HTTP under node's test
// runner: assistant prefill (continue_final_message, add_generation_prompt),
// a turn of only tool calls on a template that knows no tools, /v1/models in
// Anthropic's shape (through the real Anthropic client), fill-in-the-middle
// (suffix, POST /infill), the Prometheus histograms and counters of /metrics
// with the per-request log line, and every documented request field of
// OpenAI's chat/completions and Anthropic's messages honoured or refused by
// name.
//
// HEARTH_E2E_SERVER  `hearth` (run as `hearth serve --model models/default`)
//                    or, with HEARTH_E2E_FAKE=1, the test server over the
//                    fake engine (tests/serve/fake_engine.h)
// HEARTH_DEPS_DIR    where tools/fetch_test_deps.sh installed node_modules
// HEARTH_SOURCE_DIR  the repository, to find the model folder
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const H = require('./harness.cjs');

const FAKE = process.env.HEARTH_E2E_FAKE === '1';
const SERVER = process.env.HEARTH_E2E_SERVER;

function findModel() {
  if (process.env.HEARTH_E2E_MODEL) return process.env.HEARTH_E2E_MODEL;
  const def = path.join(H.SOURCE, 'models/default');
  if (fs.existsSync(path.join(def, 'config.json'))) return def;
  throw new Error(`no model to serve: ${def} (the built-in model) has no config.json`);
}

function startServer(extra = []) {
  const args = FAKE ? ['--port', '0', ...extra] : ['serve', '--model', findModel(), '--port', '0', '--threads', '2', ...extra];
  return H.startServer(SERVER, args);
}

let srv, modelId;

before(async () => {
  srv = await startServer(['--served-model-name', 'alpha', '--served-model-name', 'beta']);
  modelId = (await (await fetch(srv.url + '/v1/models')).json()).data[0].id;
});

after(async () => {
  const code = await H.stopServer(srv);
  assert.equal(code, 0, `server exited with ${code}:\n${srv ? srv.log.slice(-4000) : ''}`);
});

async function post(route, body, headers = {}) {
  const r = await fetch(srv.url + route, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text };
}

const greedy = { temperature: 0, max_tokens: 8 };

// ---- assistant prefill -----------------------------------------------------

const PREFILL = [{ role: 'user', content: 'Tell me a story.' }, { role: 'assistant', content: 'Once upon a' }];

test('continue_final_message renders the final message open: its ids are the closed chat cut after its text', async () => {
  const open = await post('/tokenize', { messages: PREFILL, continue_final_message: true, with_pieces: true });
  assert.equal(open.status, 200, open.text);
  const closed = await post('/tokenize', { messages: PREFILL, add_generation_prompt: false, with_pieces: true });
  assert.equal(closed.status, 200, closed.text);
  const withPrompt = await post('/tokenize', { messages: PREFILL, with_pieces: true });
  assert.equal(withPrompt.status, 200, withPrompt.text);
  const text = (r) => r.json.tokens.map((t) => t.piece).join('');
  assert.ok(text(open).endsWith('Once upon a'), text(open));
  // the closed chat starts with the open one and adds only the turn's closing
  assert.ok(text(closed).startsWith(text(open)), `${text(closed)}\n---\n${text(open)}`);
  assert.ok(text(closed).length > text(open).length);
  assert.ok(!text(closed).slice(text(open).length).includes('Once upon a'));
  // add_generation_prompt (the default) writes more after the closed chat
  assert.ok(text(withPrompt).startsWith(text(closed)) && text(withPrompt).length > text(closed).length);
});

test('continue_final_message: the reply continues the final message (the same text as the raw prompt)', async () => {
  const open = await post('/tokenize', { messages: PREFILL, continue_final_message: true });
  const ids = open.json.tokens.map((t) => (typeof t === 'number' ? t : t.id));
  const chat = await post('/v1/chat/completions', { model: modelId, messages: PREFILL, continue_final_message: true,
    add_generation_prompt: false, ...greedy });
  assert.equal(chat.status, 200, chat.text);
  if (!FAKE) { // (the fake engine takes no token-id prompts)
    const raw = await post('/v1/completions', { model: modelId, prompt: ids, ...greedy });
    assert.equal(raw.status, 200, raw.text);
    assert.equal(chat.json.choices[0].message.content, raw.json.choices[0].text);
    assert.equal(chat.json.usage.prompt_tokens, ids.length);
  }
  // without it the model answers after a generation prompt: a longer prompt
  const fresh = await post('/v1/chat/completions', { model: modelId, messages: PREFILL, ...greedy });
  assert.equal(fresh.status, 200, fresh.text);
  assert.ok(fresh.json.usage.prompt_tokens > chat.json.usage.prompt_tokens);
});

test('continue_final_message and add_generation_prompt both true are refused by name', async () => {
  const r = await post('/v1/chat/completions', { model: modelId, messages: PREFILL, continue_final_message: true,
    add_generation_prompt: true, ...greedy });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, 'continue_final_message');
  for (const [k, v] of [['continue_final_message', 'yes'], ['add_generation_prompt', 1]]) {
    const bad = await post('/v1/chat/completions', { model: modelId, messages: PREFILL, [k]: v });
    assert.equal(bad.status, 400, bad.text);
    assert.equal(bad.json.error.param, k);
  }
});

test('continue_final_message with a final message without text is refused by name', async () => {
  const r = await post('/v1/chat/completions', { model: modelId, continue_final_message: true, ...greedy,
    messages: [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: '  ' }] });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, 'continue_final_message');
});

test('an assistant turn of only tool calls (content null or absent) is accepted', async () => {
  const call = { id: 'a1b2c3d4e', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } };
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
    properties: { city: { type: 'string' } } } } }];
  for (const content of [null, undefined, '']) {
    const a = { role: 'assistant', tool_calls: [call] };
    if (content !== undefined) a.content = content;
    const messages = [{ role: 'user', content: 'Weather in Paris?' }, a,
      { role: 'tool', tool_call_id: 'a1b2c3d4e', content: 'sunny' }, { role: 'user', content: 'Thanks. And now?' }];
    for (const withTools of [true, false]) {
      const r = await post('/v1/chat/completions', { model: modelId, messages, ...(withTools ? { tools } : {}), ...greedy });
      assert.equal(r.status, 200, `content ${content}, tools ${withTools}: ${r.text}`);
    }
  }
  // the model sees the call it made
  const seen = await post('/tokenize', { with_pieces: true, messages: [{ role: 'user', content: 'Weather?' },
    { role: 'assistant', content: null, tool_calls: [call] }] });
  assert.equal(seen.status, 200, seen.text);
  const text = seen.json.tokens.map((t) => t.piece).join('');
  assert.ok(text.includes('get_weather') && text.includes('Paris'), text);
});

// ---- /v1/models in Anthropic's shape ----------------------------------------

test('GET /v1/models with anthropic-version answers in Anthropic\'s shape, through the Anthropic client', async () => {
  const plain = await (await fetch(srv.url + '/v1/models')).json();
  assert.equal(plain.object, 'list');
  const ids = plain.data.map((m) => m.id);
  assert.deepEqual(ids.slice(1), ['alpha', 'beta']);
  const r = await fetch(srv.url + '/v1/models', { headers: { 'anthropic-version': '2023-06-01' } });
  assert.equal(r.status, 200);
  const a = await r.json();
  assert.deepEqual(Object.keys(a).sort(), ['data', 'first_id', 'has_more', 'last_id']);
  assert.deepEqual(a.data.map((m) => m.id), ids);
  assert.equal(a.has_more, false);
  assert.equal(a.first_id, ids[0]);
  assert.equal(a.last_id, ids[ids.length - 1]);
  for (const m of a.data) {
    assert.deepEqual(Object.keys(m).sort(), ['created_at', 'display_name', 'id', 'type']);
    assert.equal(m.type, 'model');
    assert.match(m.created_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    assert.ok(Math.abs(Date.parse(m.created_at) / 1000 - plain.data[0].created) < 1);
  }
  // paged as Anthropic pages
  const page = await (await fetch(srv.url + '/v1/models?limit=1&after_id=' + ids[0],
    { headers: { 'anthropic-version': '2023-06-01' } })).json();
  assert.deepEqual(page.data.map((m) => m.id), ['alpha']);
  assert.equal(page.has_more, true);
  const back = await (await fetch(srv.url + '/v1/models?limit=1&before_id=beta',
    { headers: { 'anthropic-version': '2023-06-01' } })).json();
  assert.deepEqual(back.data.map((m) => m.id), ['alpha']);
  assert.equal(back.has_more, true);
  const badLimit = await fetch(srv.url + '/v1/models?limit=0', { headers: { 'anthropic-version': '2023-06-01' } });
  assert.equal(badLimit.status, 400);
  assert.equal((await badLimit.json()).type, 'error');

  const { Anthropic } = H.need('@anthropic-ai/sdk');
  const client = new Anthropic({ baseURL: srv.url, apiKey: 'unused', maxRetries: 0 });
  const listed = [];
  for await (const m of client.models.list({ limit: 2 })) listed.push(m.id);
  assert.deepEqual(listed, ids);
  const one = await client.models.retrieve('alpha');
  assert.equal(one.id, 'alpha');
  assert.equal(one.type, 'model');
  await assert.rejects(client.models.retrieve('nope'), (e) => e.status === 404 && e.error?.error?.type === 'not_found_error');
});

// ---- fill-in-the-middle -----------------------------------------------------

test('suffix and /infill on a model without FIM tokens are refused by name', async () => {
  // (models/default's vocabulary has none; the fake has none unless started with --fim)
  const a = await post('/v1/completions', { model: modelId, prompt: 'def f(', suffix: '\n', max_tokens: 4 });
  assert.equal(a.status, 400, a.text);
  assert.equal(a.json.error.param, 'suffix');
  assert.match(a.json.error.message, /fill-in-the-middle/);
  const b = await post('/infill', { input_prefix: 'def f(', input_suffix: '\n', n_predict: 4 });
  assert.equal(b.status, 400, b.text);
  assert.equal(b.json.error.param, 'input_suffix');
});

test('/infill refuses fields it does not take by name, and bad ones', async () => {
  for (const [body, param] of [[{ input_prefix: 'a', typical_p: 0.5 }, 'typical_p'],
    [{ input_prefix: 'a', input_extra: 'x' }, 'input_extra'], [{ input_prefix: 'a', input_extra: [{ text: 1 }] }, 'input_extra[0]'],
    [{ input_prefix: 'a', input_extra: [{ path: 'x' }] }, 'input_extra[0]'], [{ input_prefix: 5 }, 'input_prefix'],
    [{ prompt: ['a'] }, 'prompt'], [{ n_predict: 0 }, 'n_predict'], [{ stop: 'x' }, 'stop']]) {
    const r = await post('/infill', body);
    assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
    assert.equal(r.json.error.param, param, r.text);
  }
  const e = await post('/v1/completions', { model: modelId, prompt: 'a', suffix: 'b', echo: true });
  assert.equal(e.status, 400, e.text);
  assert.equal(e.json.error.param, 'suffix');
});

test('fill-in-the-middle on an engine with FIM tokens: the prompt it lays out, llama.cpp\'s shapes', { skip: !FAKE }, async () => {
  // the fake lays a FIM prompt out as ids ([263] filename "\n" text)... [260] prefix middle [261] suffix [262]
  const fim = await startServer(['--fim', '1']);
  try {
    const call = async (route, body) => {
      const r = await fetch(fim.url + route, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
      return { status: r.status, text: await r.text() };
    };
    const body = { input_prefix: 'def f():\n', input_suffix: '\nreturn', prompt: '  x', n_predict: 5, cache_prompt: true,
      input_extra: [{ filename: 'a.py', text: 'A' }, { text: 'BB' }] };
    const r = await call('/infill', body);
    assert.equal(r.status, 200, r.text);
    const o = JSON.parse(r.text);
    const extra = (1 + 'a.py\n'.length + 1) + (1 + 'tmp\n'.length + 2);
    assert.equal(o.tokens_evaluated, extra + 1 + 'def f():\n'.length + 3 + 1 + '\nreturn'.length + 1);
    assert.equal(o.tokens_predicted, 5);
    assert.equal(o.stop, true);
    assert.equal(o.stop_type, 'limit');
    assert.equal(typeof o.content, 'string');
    assert.ok(o.content.length > 0);
    // streamed: pieces, then the final object; together the same text
    const s = await call('/infill', { ...body, stream: true });
    assert.equal(s.status, 200, s.text);
    const events = s.text.split('\n\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)));
    assert.ok(events.length >= 2);
    assert.ok(events.slice(0, -1).every((ev) => ev.stop === false));
    assert.equal(events[events.length - 1].stop, true);
    assert.equal(events.map((ev) => ev.content).join(''), o.content);
    // suffix on /v1/completions: the prompt is the prefix
    const c = await call('/v1/completions', { prompt: 'abc', suffix: 'xyz', max_tokens: 4 });
    assert.equal(c.status, 200, c.text);
    assert.equal(JSON.parse(c.text).usage.prompt_tokens, 1 + 3 + 1 + 3 + 1);
    const stop = await call('/infill', { input_prefix: 'p', stop: ['quick'], n_predict: 20 });
    const so = JSON.parse(stop.text);
    assert.equal(so.stop_type, 'word', stop.text);
    assert.equal(so.stopping_word, 'quick');
  } finally {
    assert.equal(await H.stopServer(fim), 0);
  }
});
