// drain.test.cjs — the graceful stop on SIGTERM, against the server over the
// fake engine (whose "[slow]" prompts generate 5000 tokens 10 ms apart):
//   - a request already in (here: its body still arriving) when SIGTERM comes
//     is answered in full, while every new request gets 503 shutting_down
//     (OpenAI and Anthropic error shapes), and the server exits 0;
//   - streams still running when the drain timeout ends are cut with a proper
//     end: an OpenAI stream with finish_reason "length", its usage and
//     [DONE]; an Anthropic stream with stop_reason "max_tokens" and
//     message_stop.
// The order of events is awaited (the server's own log lines), never a clock.
//
// HEARTH_E2E_SERVER  the fake server (serve_fake_server)
'use strict';
const { test } = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const H = require('./harness.cjs');

const SERVER = process.env.HEARTH_E2E_SERVER;

function waitLog(srv, re) {
  return new Promise((resolve) => {
    const check = () => {
      if (re.test(srv.log)) return resolve();
      setTimeout(check, 20);
    };
    check();
  });
}

function exitCode(srv) {
  return new Promise((resolve) => {
    if (srv.proc.exitCode !== null) return resolve(srv.proc.exitCode);
    srv.proc.on('exit', (code, sig) => resolve(sig || code));
  });
}

// Opens a stream and resolves once its first bytes are in: {reader, first, rest()}.
async function openStream(url, pathName, body, headers = {}) {
  const r = await fetch(url + pathName, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  assert.equal(r.status, 200);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let text = '';
  while (!text.includes('\n\n')) {
    const { value, done } = await reader.read();
    if (done) break;
    text += dec.decode(value, { stream: true });
  }
  return {
    first: text,
    async rest() {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return text;
        text += dec.decode(value, { stream: true });
      }
    },
  };
}

test('a request in flight at SIGTERM is answered, new ones get 503, the server exits 0', async () => {
  const srv = await H.startServer(SERVER, ['--port', '0', '--drain-timeout', '60']);
  const { port } = new URL(srv.url);
  // a request whose headers are in and whose body is still coming
  const body = JSON.stringify({ model: 'fake-model', messages: [{ role: 'user', content: 'hello' }], max_tokens: 5 });
  const sock = net.connect(port, '127.0.0.1');
  await new Promise((resolve) => sock.on('connect', resolve));
  let answer = '';
  sock.on('data', (d) => { answer += d.toString(); });
  const closed = new Promise((resolve) => sock.on('close', resolve));
  sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
             `Content-Length: ${Buffer.byteLength(body)}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n`);
  // "100 Continue": the server has taken the request in (it refuses before that)
  await new Promise((resolve) => {
    const check = () => (/^HTTP\/1\.1 100/.test(answer) ? resolve() : setTimeout(check, 10));
    check();
  });
  srv.proc.kill('SIGTERM');
  await waitLog(srv, /fake_server: draining/);
  const refused = await fetch(srv.url + '/v1/models');
  assert.equal(refused.status, 503);
  const err = await refused.json();
  assert.equal(err.error.code, 'shutting_down');
  const anth = await fetch(srv.url + '/v1/messages', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model: 'fake-model', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }),
  });
  assert.equal(anth.status, 503);
  assert.equal((await anth.json()).type, 'error');
  // the held request still gets its whole answer
  sock.write(body);
  await closed;
  answer = answer.slice(answer.lastIndexOf('HTTP/1.1 '));
  assert.match(answer, /^HTTP\/1\.1 200/);
  const reply = JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4));
  assert.equal(reply.choices[0].finish_reason, 'length');
  assert.equal(reply.usage.completion_tokens, 5);
  assert.equal(await exitCode(srv), 0);
  assert.match(srv.log, /drained \(0 cut\)/);
});

test('streams running at the drain timeout end with a finish reason and [DONE] / message_stop', async () => {
  const srv = await H.startServer(SERVER, ['--port', '0', '--drain-timeout', '1', '--context', '100000']);
  const openai = await openStream(srv.url, '/v1/chat/completions', {
    model: 'fake-model', messages: [{ role: 'user', content: '[slow] tell me' }], stream: true,
    stream_options: { include_usage: true },
  });
  const anthropic = await openStream(srv.url, '/v1/messages', {
    model: 'fake-model', max_tokens: 4000, messages: [{ role: 'user', content: '[slow] tell me' }], stream: true,
  }, { 'anthropic-version': '2023-06-01' });
  srv.proc.kill('SIGTERM');
  const [a, b] = await Promise.all([openai.rest(), anthropic.rest()]);
  // OpenAI: chunks, one with finish_reason "length", the usage, then [DONE] last
  const data = a.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));
  assert.equal(data[data.length - 1], '[DONE]');
  const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
  const finish = chunks.filter((c) => c.choices && c.choices.length && c.choices[0].finish_reason);
  assert.equal(finish.length, 1);
  assert.equal(finish[0].choices[0].finish_reason, 'length');
  const usage = chunks.find((c) => c.usage);
  assert.ok(usage.usage.completion_tokens < 4000); // cut, not finished
  // Anthropic: message_delta with stop_reason max_tokens, then message_stop
  const events = b.split('\n').filter((l) => l.startsWith('event: ')).map((l) => l.slice(7));
  assert.equal(events[events.length - 1], 'message_stop');
  const delta = b.split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)))
    .find((e) => e.type === 'message_delta');
  assert.equal(delta.delta.stop_reason, 'max_tokens');
  assert.equal(await exitCode(srv), 0);
  // the fake engine runs one generation at a time: the other was cut as it started
  assert.match(srv.log, /drained \([12] cut\)/);
});
