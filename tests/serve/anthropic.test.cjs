// anthropic.test.cjs — hearth's Anthropic Messages API (src/serve/anthropic.c)
// end to end, through the real Anthropic client (npm "@anthropic-ai/sdk",
// pinned in package-lock.json, used unchanged) and plain fetch, under node's
// built-in test runner.
//
// HEARTH_E2E_SERVER  the executable: `hearth` (run as `hearth serve --model
//                    DIR`, DIR the built-in model models/default or
//                    $HEARTH_E2E_MODEL) or, with HEARTH_E2E_FAKE=1, the test
//                    server over the fake engine (tests/serve/fake_engine.h),
//                    where the exact shapes, errors and event order are checked
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
const SOURCE = process.env.HEARTH_SOURCE_DIR || path.resolve(__dirname, '../..');
const DEPS = process.env.HEARTH_DEPS_DIR || path.join(SOURCE, '.deps');

function loadSDK() {
  const dir = path.join(DEPS, 'node', 'node_modules', '@anthropic-ai', 'sdk');
  if (!fs.existsSync(dir)) throw new Error(`npm "@anthropic-ai/sdk" is not installed at ${dir}: run tools/fetch_test_deps.sh`);
  return require(dir);
}

function findModel() {
  if (process.env.HEARTH_E2E_MODEL) return process.env.HEARTH_E2E_MODEL;
  const def = path.join(SOURCE, 'models/default');
  if (fs.existsSync(path.join(def, 'config.json'))) return def;
  throw new Error(`no model to serve: ${def} (the built-in model) has no config.json`);
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

let SDK, Anthropic, main, guarded, client, modelId;
const KEY = 'sk-ant-test-7c2e';
// The servers accept any model name (--served-model-name '*', as for clients
// that hard-code one); the answer names the served model.
const MODEL = 'claude-sonnet-4-5';
const MSGS = [{ role: 'user', content: 'Tell me a story about a lighthouse.' }];
const TOOLS = [
  { name: 'get_weather', description: 'Weather for a city',
    input_schema: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } },
  { name: 'get_time', input_schema: { type: 'object', properties: { zone: { type: 'string' } } } },
];

before(async () => {
  SDK = loadSDK();
  Anthropic = SDK.Anthropic;
  main = await startServer(['--served-model-name', '*']);
  guarded = await startServer(['--api-key', KEY, '--max-body', '4096', '--served-model-name', '*']);
  client = new Anthropic({ baseURL: main.url, apiKey: 'unused', maxRetries: 0 });
  modelId = (await (await fetch(main.url + '/v1/models')).json()).data[0].id;
});

after(async () => {
  for (const srv of [main, guarded]) {
    const code = await stopServer(srv);
    assert.equal(code, 0, `server exited with ${code}:\n${srv ? srv.log.slice(-4000) : ''}`);
  }
});

function checkUsage(u) {
  for (const k of ['input_tokens', 'output_tokens', 'cache_read_input_tokens', 'cache_creation_input_tokens'])
    assert.ok(Number.isInteger(u[k]) && u[k] >= 0, `usage.${k} = ${u[k]}`);
  assert.equal(u.cache_creation_input_tokens, 0);
}

function checkMessage(m) {
  assert.match(m.id, /^msg_[0-9A-Za-z]{20,}$/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, modelId);
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.equal(typeof m.content[0].text, 'string');
  assert.ok(['end_turn', 'max_tokens', 'stop_sequence'].includes(m.stop_reason), m.stop_reason);
  if (m.stop_reason !== 'stop_sequence') assert.equal(m.stop_sequence, null);
  checkUsage(m.usage);
}

// Streams with the SDK's MessageStream helper: its events, text deltas and final message.
async function streamMessage(params) {
  const stream = client.messages.stream(params);
  const events = [];
  const deltas = [];
  let connected = false;
  stream.on('connect', () => { connected = true; });
  stream.on('streamEvent', (e) => events.push(e.type));
  stream.on('text', (d) => deltas.push(d));
  const final = await stream.finalMessage();
  assert.ok(connected, 'connect event');
  return { final, events, deltas, text: deltas.join('') };
}

test('messages.create answers a Message', async () => {
  const r = await client.messages.create({ model: MODEL, max_tokens: 16, messages: MSGS, temperature: 0 });
  checkMessage(r);
  assert.ok(r.content[0].text.length > 0);
  assert.ok(r.usage.output_tokens > 0 && r.usage.output_tokens <= 16);
  assert.ok(r.usage.input_tokens + r.usage.cache_read_input_tokens > 0);
  // metadata, top_k, top_p are accepted; the same request again is served (in part) from the prefix cache
  const again = await client.messages.create({ model: MODEL, max_tokens: 16, messages: MSGS, temperature: 0,
    top_k: 40, top_p: 1, metadata: { user_id: 'u-1' } });
  assert.equal(again.content[0].text, r.content[0].text);
  const total = r.usage.input_tokens + r.usage.cache_read_input_tokens;
  assert.equal(again.usage.input_tokens + again.usage.cache_read_input_tokens, total);
  // hearth's prefix cache keeps whole 16-token blocks: a repeated prompt of more than one block reads them back
  if (!FAKE && total > 16) assert.ok(again.usage.cache_read_input_tokens >= 16, JSON.stringify(again.usage));
});

test('messages.stream: events in order, text deltas, finalMessage equals the whole answer', async () => {
  const params = { model: MODEL, max_tokens: 12, messages: MSGS, temperature: 0 };
  const whole = await client.messages.create(params);
  const s = await streamMessage(params);
  checkMessage(s.final);
  assert.equal(s.text, whole.content[0].text);
  assert.equal(s.final.content[0].text, whole.content[0].text);
  assert.equal(s.final.stop_reason, whole.stop_reason);
  assert.equal(s.final.usage.output_tokens, whole.usage.output_tokens);
  assert.equal(s.final.usage.input_tokens + s.final.usage.cache_read_input_tokens,
    whole.usage.input_tokens + whole.usage.cache_read_input_tokens);
  assert.ok(s.deltas.length >= 1);
  assert.equal(s.events[0], 'message_start');
  assert.equal(s.events[1], 'content_block_start');
  assert.deepEqual(s.events.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  assert.ok(s.events.slice(2, -3).every((e) => e === 'content_block_delta'));
  // the async iterator of messages.create({stream: true}) sees the same events
  const raw = await client.messages.create({ ...params, stream: true });
  const types = [];
  let text = '';
  for await (const e of raw) {
    types.push(e.type);
    if (e.type === 'content_block_delta') text += e.delta.text;
  }
  assert.deepEqual(types, s.events);
  assert.equal(text, s.text);
});

test('system as a string or as text blocks renders the same prompt', async () => {
  const sys = 'You are a careful storyteller.';
  const count = async (extra) => (await client.messages.countTokens({ model: MODEL, messages: MSGS, ...extra })).input_tokens;
  const none = await count({});
  const str = await count({ system: sys });
  const blocks = await count({ system: [{ type: 'text', text: 'You are a careful ' }, { type: 'text', text: 'storyteller.' }] });
  assert.ok(none > 0);
  assert.ok(str > none, `${str} > ${none}`);
  assert.equal(blocks, str);
  const a = await client.messages.create({ model: MODEL, max_tokens: 8, system: sys, messages: MSGS, temperature: 0 });
  const b = await client.messages.create({ model: MODEL, max_tokens: 8, messages: MSGS, temperature: 0,
    system: [{ type: 'text', text: sys, cache_control: { type: 'ephemeral' } }] });
  checkMessage(a);
  assert.equal(b.content[0].text, a.content[0].text);
  assert.equal(a.usage.input_tokens + a.usage.cache_read_input_tokens, str);
  assert.equal(b.usage.input_tokens + b.usage.cache_read_input_tokens, str);
});

test('count_tokens counts the rendered prompt', async () => {
  const r = await client.messages.countTokens({ model: MODEL, messages: MSGS });
  assert.deepEqual(Object.keys(r), ['input_tokens']);
  const m = await client.messages.create({ model: MODEL, max_tokens: 2, messages: MSGS });
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, r.input_tokens);
  const longer = await client.messages.countTokens({ model: MODEL,
    messages: [...MSGS, { role: 'assistant', content: 'Once upon a time' }, { role: 'user', content: 'Go on.' }] });
  assert.ok(longer.input_tokens > r.input_tokens);
});

test('stop_sequences end with stop_reason stop_sequence, whole and streamed', async () => {
  const base = { model: MODEL, max_tokens: 24, messages: MSGS, temperature: 0 };
  const free = (await client.messages.create(base)).content[0].text;
  // a piece of the greedy answer, past its start, is where it must stop
  const at = Math.min(4, free.length - 3);
  assert.ok(at >= 1, `answer too short to cut: ${JSON.stringify(free)}`);
  const stop = free.slice(at, at + 3);
  const want = free.slice(0, free.indexOf(stop));
  const r = await client.messages.create({ ...base, stop_sequences: ['@@never@@', stop] });
  checkMessage(r);
  assert.equal(r.stop_reason, 'stop_sequence');
  assert.equal(r.stop_sequence, stop);
  assert.equal(r.content[0].text, want);
  const s = await streamMessage({ ...base, stop_sequences: [stop] });
  assert.equal(s.final.stop_reason, 'stop_sequence');
  assert.equal(s.final.stop_sequence, stop);
  assert.equal(s.text, want);
  assert.ok(!s.text.includes(stop));
});

test('max_tokens ends with stop_reason max_tokens', async () => {
  const r = await client.messages.create({ model: MODEL, max_tokens: 3, messages: MSGS, temperature: 0 });
  assert.equal(r.stop_reason, 'max_tokens');
  assert.equal(r.usage.output_tokens, 3);
  const s = await streamMessage({ model: MODEL, max_tokens: 3, messages: MSGS, temperature: 0 });
  assert.equal(s.final.stop_reason, 'max_tokens');
  assert.equal(s.final.usage.output_tokens, 3);
});

test('a conversation with several turns (consecutive turns of one role combined)', async () => {
  const r = await client.messages.create({ model: MODEL, max_tokens: 6, temperature: 0, messages: [
    { role: 'user', content: 'Hello.' },
    { role: 'user', content: [{ type: 'text', text: 'Tell me a story.' }] },
    { role: 'assistant', content: [{ type: 'text', text: 'Once upon a time' }] },
    { role: 'user', content: 'Go on.' },
  ] });
  checkMessage(r);
});

test('x-api-key and Authorization: Bearer are both accepted; a wrong key is an AuthenticationError', async () => {
  const ok = new Anthropic({ baseURL: guarded.url, apiKey: KEY, maxRetries: 0 });
  checkMessage(await ok.messages.create({ model: MODEL, max_tokens: 2, messages: MSGS }));
  assert.ok((await ok.messages.countTokens({ model: MODEL, messages: MSGS })).input_tokens > 0);
  const bearer = new Anthropic({ baseURL: guarded.url, authToken: KEY, apiKey: null, maxRetries: 0 });
  checkMessage(await bearer.messages.create({ model: MODEL, max_tokens: 2, messages: MSGS }));
  const wrong = new Anthropic({ baseURL: guarded.url, apiKey: 'sk-ant-wrong', maxRetries: 0 });
  await assert.rejects(wrong.messages.create({ model: MODEL, max_tokens: 2, messages: MSGS }), (e) => {
    assert.ok(e instanceof SDK.AuthenticationError, String(e));
    assert.equal(e.status, 401);
    assert.equal(e.type, 'authentication_error');
    return true;
  });
  await assert.rejects(wrong.messages.stream({ model: MODEL, max_tokens: 2, messages: MSGS }).finalMessage(),
    (e) => e instanceof SDK.AuthenticationError);
  // every route takes x-api-key
  assert.equal((await fetch(guarded.url + '/v1/models', { headers: { 'x-api-key': KEY } })).status, 200);
  assert.equal((await fetch(guarded.url + '/v1/models', { headers: { 'x-api-key': 'nope' } })).status, 401);
  // the body limit, as Anthropic's request_too_large
  await assert.rejects(ok.messages.create({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: 'y'.repeat(5000) }] }),
    (e) => e instanceof SDK.ContentTooLargeError && e.status === 413 && e.type === 'request_too_large');
});

test('bad requests are BadRequestErrors that name the field', async () => {
  const bad = async (params, field) => {
    await assert.rejects(client.messages.create(params), (e) => {
      assert.ok(e instanceof SDK.BadRequestError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.type, 'invalid_request_error');
      assert.ok(e.apiMessage.includes(field), `${e.apiMessage} names ${field}`);
      return true;
    });
  };
  await bad({ model: MODEL, messages: MSGS }, 'max_tokens');
  await bad({ model: MODEL, max_tokens: 0, messages: MSGS }, 'max_tokens');
  await bad({ model: MODEL, max_tokens: 4, messages: MSGS, temperature: 1.5 }, 'temperature');
  await bad({ model: MODEL, max_tokens: 4, messages: MSGS, top_k: 'many' }, 'top_k');
  await bad({ model: MODEL, max_tokens: 4, messages: MSGS, stop_sequences: 'END' }, 'stop_sequences');
  await bad({ model: MODEL, max_tokens: 4, messages: [] }, 'messages');
  await bad({ model: MODEL, max_tokens: 4, messages: [{ role: 'system', content: 'x' }] }, 'messages.0.role');
  await bad({ max_tokens: 4, messages: MSGS }, 'model');
  await bad({ model: MODEL, max_tokens: 4, messages: MSGS, system: 5 }, 'system');
  await bad({ model: MODEL, max_tokens: 4, messages: MSGS, tools: [{ name: 't' }] }, 'input_schema');
  await bad({ model: MODEL, max_tokens: 4, messages: MSGS, tools: [{ type: 'web_search_20250305', name: 'web_search' }] }, 'tools.0');
  await bad({ model: MODEL, max_tokens: 4, messages: MSGS, tools: TOOLS, tool_choice: { type: 'tool', name: 'nope' } }, 'tool_choice');
  await bad({ model: MODEL, max_tokens: 4, messages: MSGS, tool_choice: { type: 'any' } }, 'tool_choice');
  await bad({ model: MODEL, max_tokens: 4, messages: MSGS, thinking: { type: 'enabled' } }, 'budget_tokens');
  // streamed requests are refused before the stream starts
  await assert.rejects(client.messages.stream({ model: MODEL, max_tokens: 4, messages: MSGS, top_p: 3 }).finalMessage(),
    (e) => e instanceof SDK.BadRequestError && e.apiMessage.includes('top_p'));
  // more than the context holds
  await bad({ model: MODEL, max_tokens: 20000, messages: MSGS }, 'context length');
});

test('image and document blocks are refused with a 400 naming the block', async () => {
  const img = { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } };
  const cases = [
    [[{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, img] }], 'messages.0.content.1', 'image'],
    [[{ role: 'user', content: [{ type: 'document', source: { type: 'text', media_type: 'text/plain', data: 'x' } }] }],
      'messages.0.content.0', 'document'],
    [[{ role: 'user', content: [{ type: 'tool_use', id: 'toolu_1', name: 'f', input: {} }] }], 'messages.0.content.0', 'tool_use'],
  ];
  for (const [messages, field, kind] of cases) {
    for (const call of [() => client.messages.create({ model: MODEL, max_tokens: 4, messages }),
      () => client.messages.countTokens({ model: MODEL, messages })]) {
      await assert.rejects(call(), (e) => {
        assert.ok(e instanceof SDK.BadRequestError, String(e));
        assert.equal(e.type, 'invalid_request_error');
        assert.ok(e.apiMessage.startsWith(field + ':'), e.apiMessage);
        assert.ok(e.apiMessage.includes(kind), e.apiMessage);
        return true;
      });
    }
  }
});

// ---- exact shapes and event grammar, over the fake engine's fixed text ----

const post = (srv, p, body, headers = {}) =>
  fetch(srv.url + p, { method: 'POST', headers: { 'Content-Type': 'application/json', 'anthropic-version': '2023-06-01', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body) });

// Parses an SSE body into [{event, data}] (comments skipped).
function parseSSE(text) {
  const out = [];
  for (const block of text.split('\n\n')) {
    if (!block.trim()) continue;
    const ev = { event: null, data: '' };
    for (const line of block.split('\n')) {
      if (line.startsWith(':')) continue;
      if (line.startsWith('event: ')) ev.event = line.slice(7);
      else if (line.startsWith('data: ')) ev.data += line.slice(6);
    }
    if (ev.event === null && !ev.data) continue;
    ev.json = JSON.parse(ev.data);
    out.push(ev);
  }
  return out;
}

async function expectError(res, status, type) {
  assert.equal(res.status, status);
  assert.match(res.headers.get('content-type'), /application\/json/);
  const body = await res.json();
  assert.deepEqual(Object.keys(body), ['type', 'error']);
  assert.equal(body.type, 'error');
  assert.deepEqual(Object.keys(body.error), ['type', 'message']);
  assert.equal(body.error.type, type);
  assert.ok(body.error.message.length > 0);
  return body.error;
}

test('fake: the whole message, field by field', { skip: !FAKE }, async () => {
  const res = await post(main, '/v1/messages', { model: 'anything', max_tokens: 5, messages: MSGS, stop_sequences: ['zzz'] });
  assert.equal(res.status, 200);
  const m = await res.json();
  assert.deepEqual(Object.keys(m), ['id', 'type', 'role', 'model', 'content', 'stop_reason', 'stop_sequence', 'usage']);
  assert.equal(m.model, 'fake-model');
  assert.deepEqual(m.content, [{ type: 'text', text: 'The quick brown' }]); // five 3-byte tokens
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.stop_sequence, null);
  assert.deepEqual(m.usage, { input_tokens: m.usage.input_tokens, output_tokens: 5, cache_read_input_tokens: 0,
    cache_creation_input_tokens: 0 });
  // the fake's "EOS" after 40 tokens is end_turn; a stop sequence names itself
  const end = await (await post(main, '/v1/messages', { model: 'm', max_tokens: 100, messages: MSGS })).json();
  assert.equal(end.stop_reason, 'end_turn');
  assert.equal(end.usage.output_tokens, 40);
  const stop = await (await post(main, '/v1/messages', { model: 'm', max_tokens: 100, messages: MSGS, stop_sequences: ['x', 'fox'] })).json();
  assert.equal(stop.stop_reason, 'stop_sequence');
  assert.equal(stop.stop_sequence, 'fox');
  assert.equal(stop.content[0].text, 'The quick brown ');
  const count = await (await post(main, '/v1/messages/count_tokens', { model: 'm', messages: MSGS })).json();
  assert.deepEqual(count, { input_tokens: m.usage.input_tokens });
});

test('fake: the stream follows Anthropic\'s event grammar exactly', { skip: !FAKE }, async () => {
  const res = await post(main, '/v1/messages', { model: 'm', max_tokens: 4, messages: MSGS, stream: true });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^text\/event-stream/);
  const evs = parseSSE(await res.text());
  assert.deepEqual(evs.map((e) => e.event), ['message_start', 'content_block_start', 'ping', 'content_block_delta',
    'content_block_delta', 'content_block_delta', 'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop']);
  for (const e of evs) assert.equal(e.json.type, e.event, 'data.type names the event');
  const start = evs[0].json.message;
  assert.match(start.id, /^msg_/);
  assert.deepEqual(start, { id: start.id, type: 'message', role: 'assistant', model: 'fake-model', content: [],
    stop_reason: null, stop_sequence: null,
    usage: { input_tokens: start.usage.input_tokens, output_tokens: 0, cache_read_input_tokens: 0, cache_creation_input_tokens: 0 } });
  assert.ok(start.usage.input_tokens > 0);
  assert.deepEqual(evs[1].json, { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } });
  assert.deepEqual(evs[2].json, { type: 'ping' });
  assert.deepEqual(evs.slice(3, 7).map((e) => e.json),
    ['The', ' qu', 'ick', ' br'].map((t) => ({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: t } })));
  assert.deepEqual(evs[7].json, { type: 'content_block_stop', index: 0 });
  assert.deepEqual(evs[8].json, { type: 'message_delta', delta: { stop_reason: 'max_tokens', stop_sequence: null },
    usage: { input_tokens: start.usage.input_tokens, output_tokens: 4, cache_read_input_tokens: 0, cache_creation_input_tokens: 0 } });
  assert.deepEqual(evs[9].json, { type: 'message_stop' });
  // a stop string held back across tokens never reaches the stream
  const s = parseSSE(await (await post(main, '/v1/messages',
    { model: 'm', max_tokens: 100, messages: MSGS, stream: true, stop_sequences: ['k brown f'] })).text());
  const text = s.filter((e) => e.event === 'content_block_delta').map((e) => e.json.delta.text).join('');
  assert.equal(text, 'The quic');
  assert.deepEqual(s.at(-2).json.delta, { stop_reason: 'stop_sequence', stop_sequence: 'k brown f' });
});

test('fake: an engine failure mid-stream is an error event; whole, an api_error', { skip: !FAKE }, async () => {
  const body = { model: 'm', max_tokens: 8, messages: [{ role: 'user', content: 'break [fail]' }] };
  const evs = parseSSE(await (await post(main, '/v1/messages', { ...body, stream: true })).text());
  // (the fake model's replies are parsed for tool calls and thinking, so a
  // block starts only once the output says what it is: none came here)
  assert.deepEqual(evs.map((e) => e.event), ['message_start', 'error']);
  assert.equal(evs[1].json.type, 'error');
  assert.equal(evs[1].json.error.type, 'api_error');
  await expectError(await post(main, '/v1/messages', body), 500, 'api_error');
  // the SDK raises the error event as an APIError
  await assert.rejects(client.messages.stream(body).finalMessage(), (e) => e instanceof SDK.APIError && e.type === 'api_error');
  await assert.rejects(client.messages.create(body), (e) => e instanceof SDK.InternalServerError && e.type === 'api_error');
});

test('errors on the Messages routes are Anthropic error objects', async () => {
  await expectError(await post(main, '/v1/messages', '{"model": '), 400, 'invalid_request_error');
  await expectError(await post(main, '/v1/messages', '[1]'), 400, 'invalid_request_error');
  const e = await expectError(await post(main, '/v1/messages', { model: 'm', max_tokens: 4, messages: [{ role: 'user', content: 5 }] }),
    400, 'invalid_request_error');
  assert.match(e.message, /^messages\.0\.content: /);
  await expectError(await post(main, '/v1/messages/count_tokens', { model: 'm' }), 400, 'invalid_request_error');
  await expectError(await post(main, '/v1/messages/batches', {}), 404, 'not_found_error');
  await expectError(await fetch(main.url + '/v1/messages'), 405, 'invalid_request_error');
  await expectError(await post(guarded, '/v1/messages', { model: 'm', max_tokens: 4, messages: MSGS }), 401, 'authentication_error');
  await expectError(await post(guarded, '/v1/messages', { model: 'm', max_tokens: 4, messages: MSGS }, { 'x-api-key': 'wrong' }),
    401, 'authentication_error');
  await expectError(await post(guarded, '/v1/messages', 'x'.repeat(5000), { 'x-api-key': KEY }), 413, 'request_too_large');
  // the OpenAI routes keep their own shape
  const o = await (await post(main, '/v1/chat/completions', '{"messages": 1}')).json();
  assert.equal(o.error.param, 'messages');
});

test('the /v1 index lists the Messages routes', async () => {
  const idx = await (await fetch(main.url + '/v1')).json();
  const paths = idx.data.map((e) => `${e.method} ${e.path}`);
  for (const p of ['POST /v1/messages', 'POST /v1/messages/count_tokens']) assert.ok(paths.includes(p), p);
});

test('a streamed message whose client goes away is cancelled; the server keeps serving', async () => {
  const content = FAKE ? 'Tell me everything [slow]' : 'Tell me everything.';
  const logBefore = main.log.length;
  const stream = client.messages.stream({ model: MODEL, max_tokens: 400, temperature: 0,
    messages: [{ role: 'user', content }] });
  let got = 0;
  await new Promise((resolve) => {
    stream.on('text', () => {
      if (++got === 3) {
        stream.abort();
        resolve();
      }
    });
    stream.on('end', resolve);
    stream.on('error', resolve);
    stream.on('abort', resolve);
  });
  assert.equal(got, 3);
  if (FAKE) await waitFor(() => main.log.slice(logBefore).includes('generation cancelled'), 'the fake engine to see the cancel');
  const r = await client.messages.create({ model: MODEL, max_tokens: 2, messages: MSGS });
  assert.equal(r.stop_reason, 'max_tokens');
  assert.equal(main.proc.exitCode, null);
});

// ---- tools and thinking (the fake model's template is Hermes-style with <think> blocks) ----

test('fake: a tool call is a tool_use block, whole and streamed (input_json_delta)', { skip: !FAKE }, async () => {
  const params = { model: MODEL, max_tokens: 200, tools: TOOLS, messages: [{ role: 'user', content: 'Weather in Paris? [toolcall]' }] };
  const m = await client.messages.create(params);
  assert.equal(m.stop_reason, 'tool_use');
  assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text', 'tool_use']);
  assert.equal(m.content[0].thinking, 'The user wants the weather.');
  assert.equal(m.content[1].text.trim(), 'Let me check.');
  assert.match(m.content[2].id, /^toolu_01[0-9A-Za-z]{22}$/);
  assert.equal(m.content[2].name, 'get_weather');
  assert.deepEqual(m.content[2].input, { city: 'Paris "Ville"', days: 3 });
  const stream = client.messages.stream(params);
  const types = [];
  let json = '';
  stream.on('streamEvent', (e) => {
    types.push(e.type === 'content_block_delta' ? e.delta.type : e.type);
    if (e.type === 'content_block_delta' && e.delta.type === 'input_json_delta') json += e.delta.partial_json;
  });
  const f = await stream.finalMessage();
  assert.equal(f.stop_reason, 'tool_use');
  assert.deepEqual(f.content.map((b) => b.type), ['thinking', 'text', 'tool_use']);
  assert.deepEqual(f.content[2].input, m.content[2].input);
  assert.equal(f.content[0].thinking, m.content[0].thinking);
  assert.deepEqual(JSON.parse(json), m.content[2].input);
  assert.equal(types[0], 'message_start');
  assert.equal(types[1], 'content_block_start');
  assert.ok(types.includes('thinking_delta') && types.includes('text_delta') && types.includes('input_json_delta'));
  assert.deepEqual(types.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  assert.equal(types.filter((t) => t === 'content_block_start').length, 3);
  assert.equal(types.filter((t) => t === 'content_block_stop').length, 3);
});

test('fake: two calls; tool_use and tool_result turns are accepted and reach the template', { skip: !FAKE }, async () => {
  const m = await client.messages.create({ model: MODEL, max_tokens: 200, tools: TOOLS,
    messages: [{ role: 'user', content: 'Oslo weather and time [twocalls]' }] });
  assert.equal(m.stop_reason, 'tool_use');
  assert.deepEqual(m.content.map((b) => [b.type, b.name]), [['tool_use', 'get_weather'], ['tool_use', 'get_time']]);
  assert.deepEqual(m.content[1].input, { zone: 'CET', list: [1, 2] });
  const followUp = [
    { role: 'user', content: 'Oslo weather and time' },
    { role: 'assistant', content: m.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: m.content[0].id, content: '21 C' },
      { type: 'tool_result', tool_use_id: m.content[1].id, content: [{ type: 'text', text: '14:00' }] },
      { type: 'text', text: 'Summarise.' }] },
  ];
  const n = await client.messages.countTokens({ model: MODEL, tools: TOOLS, messages: followUp });
  const plain = await client.messages.countTokens({ model: MODEL, messages: [followUp[0], { role: 'user', content: 'Summarise.' }] });
  assert.ok(n.input_tokens > plain.input_tokens);
  const r = await client.messages.create({ model: MODEL, max_tokens: 8, tools: TOOLS, messages: followUp });
  assert.equal(r.content[0].type, 'text');
  // tool_choice none: the call syntax stays text
  const none = await client.messages.create({ model: MODEL, max_tokens: 200, tools: TOOLS, tool_choice: { type: 'none' },
    messages: [{ role: 'user', content: 'Weather? [toolcall]' }] });
  assert.equal(none.stop_reason, 'end_turn');
  assert.ok(none.content.every((b) => b.type !== 'tool_use'));
  assert.ok(none.content.some((b) => b.type === 'text' && b.text.includes('<tool_call>')));
});

test('fake: tool_choice any / tool opens the reply with a tool_use block', { skip: !FAKE }, async () => {
  const named = { model: MODEL, max_tokens: 200, tools: TOOLS, tool_choice: { type: 'tool', name: 'get_time' },
    messages: [{ role: 'user', content: 'Time? [args]' }] };
  const m = await client.messages.create(named);
  assert.equal(m.stop_reason, 'tool_use');
  assert.deepEqual(m.content.map((b) => [b.type, b.name, b.input]), [['tool_use', 'get_time', { zone: 'UTC' }]]);
  const f = await client.messages.stream(named).finalMessage();
  assert.deepEqual(f.content.map((b) => [b.type, b.name, b.input]), [['tool_use', 'get_time', { zone: 'UTC' }]]);
  const any = await client.messages.create({ ...named, tool_choice: { type: 'any' }, messages: [{ role: 'user', content: 'Weather? [anyargs]' }] });
  assert.deepEqual(any.content.map((b) => [b.type, b.name, b.input]), [['tool_use', 'get_weather', { city: 'Rome' }]]);
});
