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
    // Ollama's /api/generate with suffix: the same layout and the same text
    const og = await call('/api/generate', { model: modelId, prompt: 'abc', suffix: 'xyz', stream: false, options: { num_predict: 4 } });
    assert.equal(og.status, 200, og.text);
    assert.equal(JSON.parse(og.text).prompt_eval_count, 1 + 3 + 1 + 3 + 1);
    assert.equal(JSON.parse(og.text).response, JSON.parse(c.text).choices[0].text);
    const stop = await call('/infill', { input_prefix: 'p', stop: ['quick'], n_predict: 20 });
    const so = JSON.parse(stop.text);
    assert.equal(so.stop_type, 'word', stop.text);
    assert.equal(so.stopping_word, 'quick');
  } finally {
    assert.equal(await H.stopServer(fim), 0);
  }
});

// ---- /metrics -----------------------------------------------------------------

// Prometheus text → {name{labels}: value}, and each histogram checked for shape.
async function scrape() {
  const r = await fetch(srv.url + '/metrics');
  assert.equal(r.status, 200);
  const text = await r.text();
  const v = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^(\S+) (\S+)$/);
    assert.ok(m, `not a sample line: ${line}`);
    v[m[1]] = Number(m[2]);
  }
  for (const h of ['time_to_first_token_seconds', 'inter_token_latency_seconds', 'e2e_request_latency_seconds',
    'request_queue_time_seconds']) {
    const name = `hearth_${h}`;
    assert.match(text, new RegExp(`# TYPE ${name} histogram`));
    const buckets = Object.keys(v).filter((k) => k.startsWith(`${name}_bucket{`));
    assert.ok(buckets.length > 5, name);
    let prev = 0, prevLe = -1;
    for (const k of buckets) { // cumulative, bounds rising, +Inf last and equal to the count
      const le = k.match(/le="([^"]+)"/)[1];
      const bound = le === '+Inf' ? Infinity : Number(le);
      assert.ok(bound > prevLe, k);
      assert.ok(v[k] >= prev, k);
      prev = v[k];
      prevLe = bound;
    }
    assert.equal(prevLe, Infinity);
    assert.equal(prev, v[`${name}_count`]);
    assert.ok(v[`${name}_sum`] >= 0);
  }
  return v;
}

const reqs = (v, route, status) => v[`hearth_http_requests_total{route="${route}",status="${status}"}`] || 0;

test('/metrics: histograms and request counters move as requests are answered; one log line each', async () => {
  const before = await scrape();
  const body = { model: modelId, messages: [{ role: 'user', content: 'Count to ten.' }], max_tokens: 6, temperature: 0,
    ignore_eos: true };
  const a = await post('/v1/chat/completions', body);
  assert.equal(a.status, 200, a.text);
  const s = await fetch(srv.url + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }) });
  const st = await s.text();
  assert.equal(s.status, 200);
  const usage = JSON.parse(st.split('\n').filter((l) => l.startsWith('data: {')).pop().slice(6)).usage;
  const c = await post('/v1/completions', { model: modelId, prompt: 'Once', max_tokens: 3, temperature: 0, ignore_eos: true, n: 2 });
  assert.equal(c.status, 200, c.text);
  const bad = await post('/v1/chat/completions', { model: modelId, messages: 'nope' });
  assert.equal(bad.status, 400);
  assert.equal((await fetch(srv.url + '/v1/models')).status, 200);
  assert.equal((await fetch(srv.url + '/no/such/route')).status, 404);
  const after = await scrape();
  const d = (k) => (after[k] || 0) - (before[k] || 0);
  assert.equal(reqs(after, '/v1/chat/completions', 200) - reqs(before, '/v1/chat/completions', 200), 2);
  assert.equal(reqs(after, '/v1/chat/completions', 400) - reqs(before, '/v1/chat/completions', 400), 1);
  assert.equal(reqs(after, '/v1/completions', 200) - reqs(before, '/v1/completions', 200), 1);
  assert.equal(reqs(after, '/v1/models', 200) - reqs(before, '/v1/models', 200), 1);
  assert.equal(reqs(after, 'other', 404) - reqs(before, 'other', 404), 1);
  assert.equal(reqs(after, '/metrics', 200) - reqs(before, '/metrics', 200), 1); // the first scrape, answered
  // one first token per choice (1 + 1 + 2), a gap per later token, a latency per generating request, a wait per choice
  assert.equal(d('hearth_time_to_first_token_seconds_count'), 4);
  const tokens = a.json.usage.completion_tokens + usage.completion_tokens;
  assert.equal(d('hearth_inter_token_latency_seconds_count'), tokens - 2 + c.json.usage.completion_tokens - 2);
  assert.equal(d('hearth_e2e_request_latency_seconds_count'), 3);
  assert.equal(d('hearth_request_queue_time_seconds_count'), 4);
  assert.ok(d('hearth_e2e_request_latency_seconds_sum') >= d('hearth_time_to_first_token_seconds_sum') / 4);
  // the log: a line per request with its route, status, tokens, TTFT and duration
  const lines = srv.log.split('\n').filter((l) => l.includes('request: POST /v1/chat/completions 200'));
  const want = `prompt_tokens=${a.json.usage.prompt_tokens} completion_tokens=${a.json.usage.completion_tokens} ttft=`;
  assert.ok(lines.some((l) => l.includes(want) && /ttft=[\d.]+ms duration=[\d.]+ms$/.test(l)), lines.join('\n'));
  assert.ok(srv.log.split('\n').some((l) => /request: POST \/v1\/chat\/completions 400 .* ttft=- duration=[\d.]+ms$/.test(l)));
  assert.ok(srv.log.split('\n').some((l) => /request: GET - 404 /.test(l)));
});

// ---- every documented request field honoured or refused by name ---------------
//
// The request fields OpenAI documents for POST /v1/chat/completions and POST
// /v1/completions, and Anthropic for POST /v1/messages (their API references),
// each sent with a valid value: 'honoured' fields must change the reply as
// documented (check) or, where the reply cannot show it, be read (a value of
// the wrong type is refused naming the field: a field nobody reads would be
// accepted); 'accepted' fields have a documented meaning here that changes
// nothing in the reply (README, "Request fields"), and are read too; 'refused'
// fields answer 400 naming the field; 'either' fields (samplers being added)
// answer 200 or a 400 naming them.

const CHAT_FIELDS = {
  messages: { how: 'honoured', bad: 'hi' },
  model: { how: 'honoured', bad: 5 },
  audio: { how: 'refused', value: { voice: 'alloy', format: 'wav' } },
  frequency_penalty: { how: 'accepted', value: 0.5, bad: 3 },
  function_call: { how: 'refused', value: 'auto' },
  functions: { how: 'refused', value: [{ name: 'f', parameters: { type: 'object' } }] },
  logit_bias: { how: 'accepted', value: { 5: 1 }, bad: { 5: 101 } },
  logprobs: { how: 'honoured', value: true, bad: 'yes', check: (r) => r.choices[0].logprobs.content.length === r.usage.completion_tokens },
  max_completion_tokens: { how: 'honoured', value: 2, bad: 0, check: (r) => r.usage.completion_tokens === 2 && r.choices[0].finish_reason === 'length' },
  max_tokens: { how: 'honoured', value: 3, bad: 'x', check: (r) => r.usage.completion_tokens === 3 },
  metadata: { how: 'accepted', value: { project: 'x' }, bad: { project: 5 } },
  modalities: { how: 'accepted', value: ['text'], bad: ['audio'] },
  n: { how: 'honoured', value: 2, bad: 0, check: (r) => r.choices.length === 2 },
  parallel_tool_calls: { how: 'accepted', value: false, bad: 'no' },
  prediction: { how: 'refused', value: { type: 'content', content: 'abc' } },
  presence_penalty: { how: 'accepted', value: 0.5, bad: -3 },
  prompt_cache_key: { how: 'accepted', value: 'session-1', bad: 5 },
  reasoning_effort: { how: 'accepted', value: 'low', bad: 'extreme' },
  response_format: { how: 'accepted', value: { type: 'text' }, bad: { type: 'xml' } },
  safety_identifier: { how: 'accepted', value: 'user-1', bad: 5 },
  seed: { how: 'honoured', value: 7, bad: 'x' },
  service_tier: { how: 'accepted', value: 'auto', bad: 'priority' },
  stop: { how: 'honoured', bad: 5 },
  store: { how: 'accepted', value: false, bad: true },
  stream: { how: 'honoured', value: true, bad: 'yes' },
  stream_options: { how: 'honoured', bad: 'x' },
  temperature: { how: 'accepted', value: 0.5, bad: 3 },
  tool_choice: { how: 'accepted', value: 'none', bad: 'sometimes' },
  tools: { how: 'accepted', value: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }], bad: [{ type: 'web' }] },
  top_logprobs: { how: 'honoured', bad: 21 },
  top_p: { how: 'accepted', value: 0.9, bad: 2 },
  user: { how: 'accepted', value: 'user-1', bad: 5 },
  verbosity: { how: 'refused', value: 'low' },
  web_search_options: { how: 'refused', value: {} },
};

const COMPLETION_FIELDS = {
  model: { how: 'honoured', bad: 5 },
  prompt: { how: 'honoured', bad: 5 },
  best_of: { how: 'honoured', value: 3, bad: 0, check: (r, b) => r.choices.length === 1 && r.usage.completion_tokens === 3 * b.usage.completion_tokens },
  echo: { how: 'honoured', value: true, bad: 'yes', check: (r) => r.choices[0].text.startsWith('Once upon') },
  frequency_penalty: { how: 'accepted', value: 0.5, bad: 3 },
  logit_bias: { how: 'accepted', value: { 5: 1 }, bad: [] },
  logprobs: { how: 'honoured', value: 2, bad: 6, check: (r) => r.choices[0].logprobs.tokens.length === r.usage.completion_tokens },
  max_tokens: { how: 'honoured', value: 2, bad: 0, check: (r) => r.usage.completion_tokens === 2 },
  n: { how: 'honoured', value: 2, bad: 0, check: (r) => r.choices.length === 2 },
  presence_penalty: { how: 'accepted', value: 0.5, bad: 3 },
  seed: { how: 'honoured', value: 7, bad: 'x' },
  stop: { how: 'honoured', bad: 5 },
  stream: { how: 'honoured', value: true, bad: 'yes' },
  stream_options: { how: 'honoured', bad: 'x' },
  suffix: { how: 'refused', value: '\n' }, // (models with FIM tokens fill the middle; neither server here has them)
  temperature: { how: 'accepted', value: 0.5, bad: 3 },
  top_p: { how: 'accepted', value: 0.9, bad: 2 },
  user: { how: 'accepted', value: 'user-1', bad: 5 },
};

const MESSAGES_FIELDS = {
  model: { how: 'honoured', bad: 5 },
  messages: { how: 'honoured', bad: 'hi' },
  max_tokens: { how: 'honoured', value: 2, bad: 0, check: (r) => r.usage.output_tokens === 2 && r.stop_reason === 'max_tokens' },
  container: { how: 'refused', value: 'container_1' },
  context_management: { how: 'refused', value: { edits: [] } },
  mcp_servers: { how: 'refused', value: [{ type: 'url', url: 'https://example.com/mcp', name: 'x' }] },
  metadata: { how: 'accepted', value: { user_id: 'u-1' }, bad: { user_id: 5 } },
  service_tier: { how: 'accepted', value: 'auto', bad: 'priority' },
  stop_sequences: { how: 'honoured', bad: 'x' },
  stream: { how: 'honoured', value: true, bad: 'yes' },
  system: { how: 'honoured', value: 'Be brief.', bad: 5, check: (r, base) => r.usage.input_tokens > base.usage.input_tokens },
  temperature: { how: 'accepted', value: 0.5, bad: 1.5 },
  thinking: { how: 'accepted', value: { type: 'disabled' }, bad: { type: 'sometimes' } },
  tool_choice: { how: 'accepted', value: { type: 'auto' }, bad: { type: 'sometimes' } },
  tools: { how: 'accepted', value: [{ name: 'f', input_schema: { type: 'object' } }], bad: [{ name: 5 }] },
  top_k: { how: 'accepted', value: 5, bad: -1 },
  top_p: { how: 'accepted', value: 0.9, bad: 2 },
};

// samplers and surfaces another change adds: until then accepted or refused by name
const EITHER = ['echo', 'dry_multiplier', 'dry_base', 'dry_allowed_length', 'dry_sequence_breakers', 'xtc_probability',
  'xtc_threshold', 'typical_p', 'mirostat', 'mirostat_tau', 'mirostat_eta', 'return_token_ids'];
const EITHER_VALUES = { dry_sequence_breakers: ['\n'], return_token_ids: true, mirostat: 2, dry_allowed_length: 2, echo: true };

const namesField = (r, field, anthropic) => anthropic
  ? r.json?.type === 'error' && r.json.error.message.startsWith(field)
  : r.json?.error?.param === field || (r.json?.error?.param || '').startsWith(field + '.') || (r.json?.error?.param || '').startsWith(field + '[');

async function walk(route, base, fields, anthropic) {
  const headers = anthropic ? { 'anthropic-version': '2023-06-01' } : {};
  const baseline = await post(route, base, headers);
  assert.equal(baseline.status, 200, baseline.text);
  for (const [field, spec] of Object.entries(fields)) {
    if ('value' in spec) {
      const r = await post(route, { ...base, [field]: spec.value }, headers);
      if (spec.how === 'refused') {
        assert.equal(r.status, 400, `${route} ${field}: ${r.text}`);
        assert.ok(namesField(r, field, anthropic), `${route} ${field} refused without naming it: ${r.text}`);
      } else {
        assert.equal(r.status, 200, `${route} ${field}: ${r.text}`);
        if (spec.check) assert.ok(spec.check(r.json || r.text, baseline.json), `${route} ${field} not honoured: ${r.text}`);
      }
    }
    if ('bad' in spec) { // read, not ignored: a wrong value is refused naming the field
      const body = { ...base, [field]: spec.bad };
      if (field === 'top_logprobs') body.logprobs = true;
      const r = await post(route, body, headers);
      assert.ok(r.status === 400 || (field === 'model' && r.status === 404), `${route} ${field}=${JSON.stringify(spec.bad)}: ${r.status} ${r.text}`);
      if (field !== 'model') assert.ok(namesField(r, field, anthropic), `${route} ${field}: ${r.text}`);
    }
  }
  for (const field of EITHER.filter((k) => !(k in fields))) {
    const r = await post(route, { ...base, [field]: EITHER_VALUES[field] ?? 0.5 }, headers);
    assert.ok(r.status === 200 || (r.status === 400 && namesField(r, field, anthropic)), `${route} ${field}: ${r.text}`);
  }
  return baseline;
}

const sse = (text) => text.split('\n').filter((l) => l.startsWith('data: {')).map((l) => JSON.parse(l.slice(6)));

test('every documented chat/completions field is honoured or refused by name', async () => {
  const base = { model: modelId, messages: [{ role: 'user', content: 'Say something.' }], max_tokens: 8, temperature: 0, ignore_eos: true };
  const baseline = await walk('/v1/chat/completions', base, CHAT_FIELDS, false);
  const text = baseline.json.choices[0].message.content;
  // stop: the reply ends before the first place the stop string would begin
  const at = Math.floor(text.length / 2);
  const stop = text.slice(at, at + 2);
  if (stop.trim().length === 2) {
    const r = await post('/v1/chat/completions', { ...base, stop: [stop] });
    assert.equal(r.json.choices[0].message.content, text.slice(0, text.indexOf(stop)));
    assert.equal(r.json.choices[0].finish_reason, 'stop');
  }
  // seed: the same seed samples the same reply
  const s1 = await post('/v1/chat/completions', { ...base, temperature: 1, seed: 11 });
  const s2 = await post('/v1/chat/completions', { ...base, temperature: 1, seed: 11 });
  assert.equal(s1.json.choices[0].message.content, s2.json.choices[0].message.content);
  // stream and stream_options
  const st = await post('/v1/chat/completions', { ...base, stream: true, stream_options: { include_usage: true } });
  assert.equal(st.status, 200);
  const chunks = sse(st.text);
  assert.equal(chunks.map((c) => c.choices[0]?.delta?.content || '').join(''), text);
  assert.equal(chunks[chunks.length - 1].usage.completion_tokens, baseline.json.usage.completion_tokens);
  // top_logprobs
  const lp = await post('/v1/chat/completions', { ...base, logprobs: true, top_logprobs: 2 });
  assert.ok(lp.json.choices[0].logprobs.content.every((e) => e.top_logprobs.length === 2), lp.text);
});

test('every documented completions field is honoured or refused by name', async () => {
  const base = { model: modelId, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, ignore_eos: true };
  const baseline = await walk('/v1/completions', base, COMPLETION_FIELDS, false);
  const text = baseline.json.choices[0].text;
  const at = Math.floor(text.length / 2);
  const stop = text.slice(at, at + 2);
  if (stop.trim().length === 2) {
    const r = await post('/v1/completions', { ...base, stop: [stop] });
    assert.equal(r.json.choices[0].text, text.slice(0, text.indexOf(stop)));
  }
  const st = await post('/v1/completions', { ...base, stream: true, stream_options: { include_usage: true } });
  const chunks = sse(st.text);
  assert.equal(chunks.map((c) => c.choices[0]?.text || '').join(''), text);
  assert.ok(chunks[chunks.length - 1].usage);
  const s1 = await post('/v1/completions', { ...base, temperature: 1, seed: 11 });
  const s2 = await post('/v1/completions', { ...base, temperature: 1, seed: 11 });
  assert.equal(s1.json.choices[0].text, s2.json.choices[0].text);
});

test('every documented Anthropic messages field is honoured or refused by name', async () => {
  const base = { model: modelId, messages: [{ role: 'user', content: 'Say something.' }], max_tokens: 8, temperature: 0 };
  const baseline = await walk('/v1/messages', base, MESSAGES_FIELDS, true);
  const text = baseline.json.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  const at = Math.floor(text.length / 2);
  const stop = text.slice(at, at + 2);
  if (stop.trim().length === 2 && baseline.json.stop_reason === 'max_tokens') {
    const r = await post('/v1/messages', { ...base, stop_sequences: [stop] }, { 'anthropic-version': '2023-06-01' });
    assert.equal(r.json.stop_reason, 'stop_sequence', r.text);
    assert.equal(r.json.stop_sequence, stop);
  }
  const st = await post('/v1/messages', { ...base, stream: true }, { 'anthropic-version': '2023-06-01' });
  assert.equal(st.status, 200);
  assert.match(st.text, /event: message_start/);
  assert.match(st.text, /event: message_stop/);
});

test('parallel_tool_calls false keeps a reply\'s first call, whole and streamed', { skip: !FAKE }, async () => {
  // the fake answers "[twocalls]" with two calls in Hermes syntax
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object' } } }];
  const base = { model: modelId, messages: [{ role: 'user', content: 'Both, please. [twocalls]' }], tools, max_tokens: 200 };
  const two = await post('/v1/chat/completions', base);
  assert.equal(two.json.choices[0].message.tool_calls.length, 2, two.text);
  const one = await post('/v1/chat/completions', { ...base, parallel_tool_calls: false });
  assert.deepEqual(one.json.choices[0].message.tool_calls.map((c) => c.function.name), ['get_weather']);
  assert.equal(one.json.choices[0].finish_reason, 'tool_calls');
  const st = await post('/v1/chat/completions', { ...base, parallel_tool_calls: false, stream: true });
  const calls = sse(st.text).flatMap((c) => c.choices[0]?.delta?.tool_calls || []);
  assert.ok(calls.length > 0 && calls.every((c) => c.index === 0), st.text);
  const cap = await (await fetch(srv.url + '/v1')).json();
  assert.equal(cap.capabilities.fill_in_the_middle, false);
});

test('Anthropic: a final assistant turn is a prefill the model continues, as the OpenAI continue_final_message', async () => {
  const h = { 'anthropic-version': '2023-06-01' };
  const a = await post('/v1/messages', { model: modelId, max_tokens: 8, temperature: 0, messages: PREFILL }, h);
  assert.equal(a.status, 200, a.text);
  const o = await post('/v1/chat/completions', { model: modelId, max_tokens: 8, temperature: 0, messages: PREFILL,
    continue_final_message: true });
  assert.equal(o.status, 200, o.text);
  assert.equal(a.json.content.map((b) => b.text).join(''), o.json.choices[0].message.content);
  assert.equal(a.json.usage.input_tokens + (a.json.usage.cache_read_input_tokens || 0), o.json.usage.prompt_tokens);
  const ws = await post('/v1/messages', { model: modelId, max_tokens: 8, messages: [PREFILL[0], { role: 'assistant', content: 'Once upon ' }] }, h);
  assert.equal(ws.status, 400, ws.text);
  assert.match(ws.json.error.message, /^messages: final assistant content cannot end with trailing whitespace/);
  // a conversation that ends with the user's turn still gets the generation prompt
  const q = await post('/v1/messages', { model: modelId, max_tokens: 8, temperature: 0, messages: [PREFILL[0]] }, h);
  const oq = await post('/v1/chat/completions', { model: modelId, max_tokens: 8, temperature: 0, messages: [PREFILL[0]] });
  assert.equal(q.json.usage.input_tokens + (q.json.usage.cache_read_input_tokens || 0), oq.json.usage.prompt_tokens);
});

test('fill-in-the-middle through `hearth serve`: the prompt is laid out token for token as llama.cpp\'s', { skip: FAKE }, async () => {
  // models/default with three tokens of its vocabulary named <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>
  const os = require('node:os');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hearth-fim-'));
  const model = findModel();
  for (const f of ['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer_config.json'])
    fs.symlinkSync(path.join(model, f), path.join(dir, f));
  const tok = JSON.parse(fs.readFileSync(path.join(model, 'tokenizer.json'), 'utf8'));
  const FIM = { pre: 4093, suf: 4094, mid: 4095 };
  for (const [id, content] of [[FIM.pre, '<|fim_prefix|>'], [FIM.suf, '<|fim_suffix|>'], [FIM.mid, '<|fim_middle|>']])
    tok.added_tokens.push({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: false });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tok));
  const fim = await H.startServer(SERVER, ['serve', '--model', dir, '--port', '0', '--threads', '2']);
  try {
    const call = async (route, body) => {
      const r = await fetch(fim.url + route, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
      const text = await r.text();
      return { status: r.status, text, json: JSON.parse(text) };
    };
    assert.equal((await (await fetch(fim.url + '/v1')).json()).capabilities.fill_in_the_middle, true);
    const ids = async (text) => (await call('/tokenize', { content: text })).json.tokens;
    const bos = (await call('/tokenize', { content: '', add_special: true })).json.tokens; // [BOS]: the tokenizer adds one
    assert.equal(bos.length, 1);
    const prefix = 'def add(a, b):\n    ', suffix = '\n\nprint(add(1, 2))\n', middle = 'return';
    // [BOS] <|fim_prefix|> prefix middle <|fim_suffix|> suffix <|fim_middle|>, each text tokenized alone
    const want = [...bos, FIM.pre, ...await ids(prefix), ...await ids(middle), FIM.suf, ...await ids(suffix), FIM.mid];
    const greedy = { temperature: 0, n_predict: 6, ignore_eos: true };
    const inf = await call('/infill', { input_prefix: prefix, input_suffix: suffix, prompt: middle, ...greedy });
    assert.equal(inf.status, 200, inf.text);
    assert.equal(inf.json.tokens_evaluated, want.length);
    const raw = await call('/v1/completions', { prompt: want, max_tokens: 6, temperature: 0, ignore_eos: true });
    assert.equal(raw.status, 200, raw.text);
    assert.equal(inf.json.content, raw.json.choices[0].text);
    assert.equal(inf.json.tokens_predicted, 6);
    // suffix on /v1/completions: the prompt is the prefix, nothing in the middle yet
    const want2 = [...bos, FIM.pre, ...await ids(prefix), FIM.suf, ...await ids(suffix), FIM.mid];
    const sfx = await call('/v1/completions', { prompt: prefix, suffix, max_tokens: 6, temperature: 0, ignore_eos: true });
    assert.equal(sfx.status, 200, sfx.text);
    assert.equal(sfx.json.usage.prompt_tokens, want2.length);
    const raw2 = await call('/v1/completions', { prompt: want2, max_tokens: 6, temperature: 0, ignore_eos: true });
    assert.equal(sfx.json.choices[0].text, raw2.json.choices[0].text);
  } finally {
    assert.equal(await H.stopServer(fim), 0);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
