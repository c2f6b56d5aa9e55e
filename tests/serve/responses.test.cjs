// responses.test.cjs — the OpenAI Responses API end to end through the pinned
// `openai` client: create (string and item input, instructions), stream (the
// event chain with sequence numbers, text / reasoning / function-call argument
// deltas, the SDK's own stream helper), retrieve, delete, previous_response_id
// (stored conversations, the prefix cache reused, 404 once gone), the store's
// limits, tools and tool_choice, text.format with a JSON schema, and errors
// naming the field.
//
// HEARTH_E2E_SERVER  `hearth` (run as `hearth serve --model DIR`) or, with
//                    HEARTH_E2E_FAKE=1, the test server over the fake engine
// HEARTH_DEPS_DIR    where tools/fetch_test_deps.sh installed node_modules
// HEARTH_SOURCE_DIR  the repository (models/default is served)
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const H = require('./harness.cjs');

const FAKE = process.env.HEARTH_E2E_FAKE === '1';
const SERVER = process.env.HEARTH_E2E_SERVER;
const { SOURCE, stopServer } = H;
const MODEL = process.env.HEARTH_E2E_MODEL || path.join(SOURCE, 'models/default');




const startServer = (extra = []) =>
  H.startServer(SERVER, FAKE ? ['--port', '0', '--served-model-name', 'default', ...extra]
    : ['serve', '--model', MODEL, '--port', '0', '--threads', '2', ...extra]);

let OpenAI, main, small, client, smallClient;

before(async () => {
  OpenAI = H.need('openai').OpenAI;
  main = await startServer();
  small = await startServer(['--responses-max', '2']);
  client = new OpenAI({ baseURL: main.url + '/v1', apiKey: 'unused', maxRetries: 0 });
  smallClient = new OpenAI({ baseURL: small.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  for (const srv of [main, small]) {
    const code = await stopServer(srv);
    assert.equal(code, 0, `server exited with ${code}:\n${srv ? srv.log.slice(-3000) : ''}`);
  }
});

const TOOLS = [
  {
    type: 'function',
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
  },
];

test('create: a response object with a message item, usage and the request echoed', async () => {
  const r = await client.responses.create({
    model: 'default',
    input: 'Tell me a story.',
    instructions: 'Be brief.',
    max_output_tokens: 16,
    temperature: 0,
    metadata: { run: 'a' },
  });
  assert.match(r.id, /^resp_[0-9a-f]+$/);
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status));
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.instructions, 'Be brief.');
  assert.equal(r.max_output_tokens, 16);
  assert.deepEqual(r.metadata, { run: 'a' });
  assert.equal(r.output.length, 1);
  const m = r.output[0];
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.status, r.status); // a message the budget cut is incomplete too
  assert.match(m.id, /^msg_/);
  assert.equal(m.content[0].type, 'output_text');
  assert.ok(m.content[0].text.length > 0);
  assert.equal(r.output_text, m.content[0].text); /* the SDK's convenience */
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
  // item input: message items with parts, developer role
  const r2 = await client.responses.create({
    model: 'default',
    input: [
      { role: 'developer', content: 'Answer plainly.' },
      { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Hello' }, { type: 'input_text', text: ' there' }] },
    ],
    max_output_tokens: 8,
  });
  assert.equal(r2.output[0].type, 'message');
});

test('stream: the full event chain, in order, with sequence numbers; the SDK helper agrees', async () => {
  const stream = await client.responses.create({ model: 'default', input: 'Tell me a story.', max_output_tokens: 12, temperature: 0, stream: true });
  const events = [];
  for await (const ev of stream) events.push(ev);
  const types = events.map((e) => e.type);
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)));
  events.forEach((e, i) => assert.equal(e.sequence_number, i));
  const want = ['response.output_item.added', 'response.content_part.added', 'response.output_text.delta',
    'response.output_text.done', 'response.content_part.done', 'response.output_item.done'];
  let at = 0;
  for (const t of types) if (t === want[at]) at++;
  assert.equal(at, want.length, types.join(','));
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  assert.equal(events.find((e) => e.type === 'response.output_text.done').text, text);
  const final = events.at(-1).response;
  assert.equal(final.output[0].content[0].text, text);
  // the same request whole gives the same text (greedy)
  const whole = await client.responses.create({ model: 'default', input: 'Tell me a story.', max_output_tokens: 12, temperature: 0 });
  assert.equal(whole.output_text, text);
  // the SDK's stream helper builds the same response from the events
  const helper = client.responses.stream({ model: 'default', input: 'Tell me a story.', max_output_tokens: 12, temperature: 0 });
  const done = await helper.finalResponse();
  assert.equal(done.output[0].content[0].text, text);
});

test('retrieve, delete, and 404 once gone', async () => {
  const r = await client.responses.create({ model: 'default', input: 'Hi', max_output_tokens: 4 });
  const got = await client.responses.retrieve(r.id);
  assert.equal(got.id, r.id);
  assert.deepEqual(got.output, r.output);
  const del = await client.responses.delete(r.id);
  assert.ok(del === undefined || del === null || del.deleted === true || typeof del === 'object');
  await assert.rejects(client.responses.retrieve(r.id), (e) => e.status === 404);
  await assert.rejects(client.responses.delete(r.id), (e) => e.status === 404);
  // store: false keeps nothing
  const n = await client.responses.create({ model: 'default', input: 'Hi', max_output_tokens: 4, store: false });
  assert.equal(n.store, false);
  await assert.rejects(client.responses.retrieve(n.id), (e) => e.status === 404);
});

test('previous_response_id: the conversation goes on, its prefix comes from the cache', async () => {
  const first = await client.responses.create({
    model: 'default', instructions: 'Be brief.', input: 'Tell me a story about the sea and the sky and the stars.',
    max_output_tokens: 24, temperature: 0,
  });
  const next = await client.responses.create({
    model: 'default', instructions: 'Be brief.', input: 'And then?', previous_response_id: first.id, max_output_tokens: 8,
  });
  assert.equal(next.previous_response_id, first.id);
  assert.ok(next.usage.input_tokens > first.usage.input_tokens, 'the earlier turns are in the prompt');
  if (!FAKE) assert.ok(next.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(next.usage));
  // a chain of three
  const third = await client.responses.create({ model: 'default', input: 'Why?', previous_response_id: next.id, max_output_tokens: 4 });
  assert.ok(third.usage.input_tokens > next.usage.input_tokens);
  await assert.rejects(
    client.responses.create({ model: 'default', input: 'x', previous_response_id: 'resp_nope' }),
    (e) => e.status === 404 && e.param === 'previous_response_id' && e.code === 'previous_response_not_found');
});

test('the store keeps at most --responses-max responses, oldest out first', async () => {
  const ids = [];
  for (let i = 0; i < 3; i++) ids.push((await smallClient.responses.create({ model: 'default', input: `n${i}`, max_output_tokens: 2 })).id);
  await assert.rejects(smallClient.responses.retrieve(ids[0]), (e) => e.status === 404);
  assert.equal((await smallClient.responses.retrieve(ids[1])).id, ids[1]);
  assert.equal((await smallClient.responses.retrieve(ids[2])).id, ids[2]);
});

test('a function call comes back as a function_call item, whole and streamed', { skip: !FAKE }, async () => {
  const r = await client.responses.create({ model: 'default', input: 'Weather in Paris? [toolcall]', tools: TOOLS, temperature: 0 });
  const kinds = r.output.map((o) => o.type);
  assert.deepEqual(kinds, ['reasoning', 'message', 'function_call']);
  assert.equal(r.output[0].content[0].type, 'reasoning_text');
  assert.equal(r.output[0].content[0].text.trim(), 'The user wants the weather.');
  assert.equal(r.output[1].content[0].text.trim(), 'Let me check.');
  const call = r.output[2];
  assert.equal(call.name, 'get_weather');
  assert.match(call.call_id, /^call_/);
  assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris "Ville"', days: 3 });
  assert.equal(call.status, 'completed');
  // streamed: argument deltas join into the arguments; the events name the item
  const stream = await client.responses.create({ model: 'default', input: 'Weather in Paris? [toolcall]', tools: TOOLS, temperature: 0, stream: true });
  const events = [];
  for await (const ev of stream) events.push(ev);
  const deltas = events.filter((e) => e.type === 'response.function_call_arguments.delta');
  assert.ok(deltas.length > 0);
  const done = events.find((e) => e.type === 'response.function_call_arguments.done');
  assert.equal(deltas.map((d) => d.delta).join(''), done.arguments);
  assert.equal(done.name, 'get_weather');
  assert.ok(events.some((e) => e.type === 'response.reasoning_text.delta'));
  const final = events.at(-1).response;
  assert.deepEqual(final.output.map((o) => o.type), kinds);
  // the SDK helper accumulates the same
  const helper = client.responses.stream({ model: 'default', input: 'Weather in Paris? [toolcall]', tools: TOOLS, temperature: 0 });
  const fr = await helper.finalResponse();
  assert.deepEqual(JSON.parse(fr.output.find((o) => o.type === 'function_call').arguments), { city: 'Paris "Ville"', days: 3 });
  // the call's result goes back as a function_call_output item
  const back = await client.responses.create({
    model: 'default', tools: TOOLS, previous_response_id: r.id,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: '{"temp": 21}' }],
  });
  assert.equal(back.status, 'completed');
  // and as explicit items, without a stored conversation
  const explicit = await client.responses.create({
    model: 'default', tools: TOOLS,
    input: [
      { role: 'user', content: 'Weather in Paris?' },
      { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
      { type: 'function_call_output', call_id: 'call_1', output: 'sunny' },
    ],
  });
  assert.equal(explicit.status, 'completed');
});

test('text.format json_schema: the output validates', { skip: FAKE }, async () => {
  const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 20 }, n: { type: 'integer' } }, required: ['name', 'n'], additionalProperties: false };
  const r = await client.responses.create({
    model: 'default', input: 'A JSON record.', max_output_tokens: 60, temperature: 0.7, seed: 3,
    text: { format: { type: 'json_schema', name: 'rec', schema, strict: true } },
  });
  const v = JSON.parse(r.output_text);
  assert.equal(typeof v.name, 'string');
  assert.ok(Number.isInteger(v.n));
  assert.deepEqual(Object.keys(v).sort(), ['n', 'name']);
});

test('what cannot be honoured is a 400 naming the field', async () => {
  const cases = [
    [{ input: 'x', tools: [{ type: 'web_search' }] }, 'tools[0]'],
    [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'data:,' }] }] }, 'input[0].content[0]'],
    [{ input: [{ type: 'item_reference', id: 'x' }] }, 'input[0]'],
    [{ input: 'x', background: true }, 'background'],
    [{ input: 'x', max_output_tokens: 0 }, 'max_output_tokens'],
    [{ input: 'x', tool_choice: { type: 'function', name: 'nope' }, tools: TOOLS }, 'tool_choice'],
    [{ input: 'x', reasoning: { effort: 'extreme' } }, 'reasoning.effort'],
    [{ input: 'x', text: { format: { type: 'json_schema', name: 'x', schema: { type: 'integer', multipleOf: 2 } } } }, 'text.format'],
    [{}, 'input'],
  ];
  for (const [body, param] of cases) {
    await assert.rejects(client.responses.create({ model: 'default', ...body }), (e) => {
      assert.equal(e.status, 400, JSON.stringify(body));
      assert.equal(e.param, param, `${JSON.stringify(body)}: ${e.message}`);
      return true;
    });
  }
  // the route: methods
  const res = await fetch(main.url + '/v1/responses/resp_x', { method: 'PUT' });
  assert.equal(res.status, 405);
  const idx = await (await fetch(main.url + '/v1')).json();
  assert.ok(idx.data.some((d) => d.path === '/v1/responses' && d.method === 'POST'));
});
