// server_tools.test.cjs — the tools the server runs itself (`hearth serve
// --memory`: memory_search; src/serve/tools.c and each protocol's
// round_calls / round_next) end to end, through the real clients (npm
// "openai", "@anthropic-ai/sdk", "ollama", pinned in package-lock.json, used
// unchanged), against the test server over the fake engine with its own
// memory_search (`--memory-tool 1`: the fake calls it on "[memsearch]", and
// answers once the result is in its prompt). Each protocol, whole and
// streamed: the call runs on the server, the client gets the final answer and
// the exchange in its protocol's shape, and the SDKs' stream helpers take the
// events as they take their own servers'.
//
// HEARTH_E2E_SERVER  the test server (tests/serve/fake_server.c)
// HEARTH_DEPS_DIR    where tools/fetch_test_deps.sh installed node_modules
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const H = require('./harness.cjs');

const ANSWER = 'The sheep graze in the north field.';
const RESULT = 'memory-result-for-sheep';
let srv, openai, anthropic, ollama;

before(async () => {
  srv = await H.startServer(process.env.HEARTH_E2E_SERVER, ['--port', '0', '--memory-tool', '1']);
  openai = new (H.need('openai').OpenAI)({ baseURL: srv.url + '/v1', apiKey: 'unused', maxRetries: 0 });
  anthropic = new (H.need('@anthropic-ai/sdk').default)({ baseURL: srv.url, apiKey: 'unused', maxRetries: 0 });
  ollama = new (H.need('ollama').Ollama)({ host: srv.url });
});

after(async () => {
  assert.equal(await H.stopServer(srv), 0);
});

test('OpenAI chat: the answer, the exchange in tool_exchange, both rounds in one stream', async () => {
  const msgs = [{ role: 'user', content: 'Where are the sheep? [memsearch]' }];
  const r = await openai.chat.completions.create({ model: 'fake-model', messages: msgs });
  assert.equal(r.choices[0].message.content, ANSWER);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.tool_exchange.length, 2);
  assert.equal(r.tool_exchange[0].tool_calls[0].function.name, 'memory_search');
  assert.equal(r.tool_exchange[1].content, RESULT);
  assert.equal(r.tool_exchange[1].tool_call_id, r.tool_exchange[0].tool_calls[0].id);

  const stream = openai.chat.completions.stream({ model: 'fake-model', messages: msgs, stream_options: { include_usage: true } });
  const done = await stream.finalChatCompletion();
  assert.equal(done.choices[0].message.content, 'Let me look.' + ANSWER);
  assert.equal(done.choices[0].message.tool_calls, undefined);
  assert.equal(done.choices[0].finish_reason, 'stop');
});

test('Anthropic Messages: server_tool_use and memory_search_tool_result blocks, whole and through the stream helper', async () => {
  const params = { model: 'fake-model', max_tokens: 200, messages: [{ role: 'user', content: 'Where are the sheep? [memsearch]' }] };
  const m = await anthropic.messages.create(params);
  assert.deepEqual(m.content.map((b) => b.type), ['text', 'server_tool_use', 'memory_search_tool_result', 'text']);
  assert.equal(m.content[1].name, 'memory_search');
  assert.deepEqual(m.content[1].input, { query: 'sheep' });
  assert.equal(m.content[2].tool_use_id, m.content[1].id);
  assert.equal(m.content[2].content[0].text, RESULT);
  assert.equal(m.content[3].text, ANSWER);
  assert.equal(m.stop_reason, 'end_turn');
  assert.equal(m.usage.server_tool_use.memory_search_requests, 1);

  const stream = anthropic.messages.stream(params);
  const texts = [];
  stream.on('text', (t) => texts.push(t));
  const f = await stream.finalMessage();
  assert.deepEqual(f.content.map((b) => b.type), ['text', 'server_tool_use', 'memory_search_tool_result', 'text']);
  assert.deepEqual(f.content[1].input, { query: 'sheep' }); // gathered from its input_json_delta events
  assert.equal(f.content[2].content[0].text, RESULT);
  assert.equal(texts.join(''), 'Let me look.' + ANSWER);
  assert.equal(f.stop_reason, 'end_turn');

  // the message sent back as it came: the conversation goes on
  const next = await anthropic.messages.create({ ...params, messages: [...params.messages, { role: 'assistant', content: m.content },
    { role: 'user', content: 'Thanks.' }] });
  assert.equal(next.type, 'message');
});

test('Responses: a memory_search_call item done with its output, whole, streamed and continued', async () => {
  const r = await openai.responses.create({ model: 'fake-model', input: 'Where are the sheep? [memsearch]' });
  assert.deepEqual(r.output.map((o) => o.type), ['message', 'memory_search_call', 'message']);
  const call = r.output[1];
  assert.equal(call.status, 'completed');
  assert.equal(call.name, 'memory_search');
  assert.equal(call.output, RESULT);
  assert.deepEqual(JSON.parse(call.arguments), { query: 'sheep' });
  assert.equal(r.output_text, 'Let me look.' + ANSWER);

  const stream = openai.responses.stream({ model: 'fake-model', input: 'Where are the sheep? [memsearch]' });
  const kinds = [];
  stream.on('response.output_item.done', (e) => kinds.push(`${e.item.type}:${e.item.status}`));
  const f = await stream.finalResponse();
  assert.deepEqual(kinds, ['message:completed', 'memory_search_call:completed', 'message:completed']);
  assert.equal(f.output[1].output, RESULT);

  const next = await openai.responses.create({ model: 'fake-model', input: 'Thanks.', previous_response_id: r.id });
  assert.equal(next.status, 'completed');
});

test('Ollama /api/chat: the final message, the exchange in tool_exchange, no server calls in the stream', async () => {
  const messages = [{ role: 'user', content: 'Where are the sheep? [memsearch]' }];
  const r = await ollama.chat({ model: 'fake-model', messages });
  assert.equal(r.message.content, ANSWER);
  assert.equal(r.message.tool_calls, undefined);
  assert.equal(r.tool_exchange.length, 2);
  assert.deepEqual(r.tool_exchange[0].tool_calls[0].function, { name: 'memory_search', arguments: { query: 'sheep' } });
  assert.deepEqual(r.tool_exchange[1], { role: 'tool', content: RESULT, tool_name: 'memory_search' });

  let text = '';
  let last;
  for await (const part of await ollama.chat({ model: 'fake-model', messages, stream: true })) {
    assert.equal(part.message.tool_calls, undefined);
    text += part.message.content;
    last = part;
  }
  assert.equal(text, 'Let me look.' + ANSWER);
  assert.equal(last.done, true);
  assert.equal(last.tool_exchange.length, 2);
});
