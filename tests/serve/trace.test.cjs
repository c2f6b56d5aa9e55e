// trace.test.cjs — `hearth serve --trace-file` end to end: the real server on
// the built-in model, two concurrent chat requests (one streamed), a stop by
// SIGTERM, then the trace read back as JSON: each request on its own track
// named by its response id, with queue, cache lookup, prefill, decode and
// detokenize spans nested in its request span, in time order, the engine's
// steps on their own track; and a trace whose server was killed still loads
// once its closing bracket is added. Only presence and order are checked,
// never durations against a clock.
//
// HEARTH_E2E_SERVER  the `hearth` executable
'use strict';
const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const SERVER = process.env.HEARTH_E2E_SERVER;
const H = require('./harness.cjs');
const { stopServer } = H;
// no --model: the built-in model
const startServer = (extra) => H.startServer(SERVER, ['serve', '--port', '0', '--threads', '2', ...extra]);



function tempTrace(name) {
  return path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'hearth-trace-')), name);
}

async function chatWhole(url, content, maxTokens) {
  const r = await fetch(url + '/v1/chat/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content }], max_tokens: maxTokens, temperature: 0 }),
  });
  assert.equal(r.status, 200);
  const body = await r.json();
  return { id: body.id, usage: body.usage, finish: body.choices[0].finish_reason };
}

async function chatStream(url, content, maxTokens) {
  const r = await fetch(url + '/v1/chat/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      messages: [{ role: 'user', content }], max_tokens: maxTokens, temperature: 0, stream: true,
      stream_options: { include_usage: true },
    }),
  });
  assert.equal(r.status, 200);
  const text = await r.text();
  let id = null, usage = null, finish = null;
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const c = JSON.parse(line.slice(6));
    id = id || c.id;
    if (c.usage) usage = c.usage;
    if (c.choices && c.choices.length && c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  return { id, usage, finish };
}

// Times as whole nanoseconds (the file writes microseconds with three decimals).
const ns = (us) => Math.round(us * 1000);
const span = (e) => ({ ...e, from: ns(e.ts), to: ns(e.ts) + ns(e.dur) });

test('a trace of two concurrent requests, one streamed, stopped by SIGTERM', async () => {
  const file = tempTrace('serve.json');
  // 16-token prefill chunks: the longer prompt is fed in several
  const srv = await startServer(['--trace-file', file, '--prefill-chunk', '16']);
  let results;
  try {
    results = await Promise.all([
      chatWhole(srv.url, 'In the beginning God created the heaven and the earth. '.repeat(6), 6),
      chatStream(srv.url, 'And the earth was without form, and void.', 5),
    ]);
  } finally {
    const code = await stopServer(srv, 'SIGTERM');
    assert.equal(code, 0, `server exited with ${code}:\n${srv.log.slice(-4000)}`);
  }
  const text = fs.readFileSync(file, 'utf8');
  assert.ok(text.trimEnd().endsWith(']'), 'a clean stop closes the array');
  const events = JSON.parse(text);
  assert.ok(Array.isArray(events));
  for (const e of events) {
    assert.ok(['X', 'i', 'M'].includes(e.ph), `phase ${e.ph}`);
    assert.equal(typeof e.name, 'string');
    assert.equal(typeof e.pid, 'number');
    assert.equal(typeof e.tid, 'number');
    if (e.ph === 'X') assert.ok(typeof e.ts === 'number' && typeof e.dur === 'number' && e.dur >= 0 && e.ts >= 0);
  }
  const trackName = new Map();
  for (const e of events) if (e.ph === 'M' && e.name === 'thread_name') trackName.set(e.tid, e.args.name);
  const tidOf = (name) => [...trackName].filter(([, n]) => n === name).map(([t]) => t);

  // the engine's own track: steps with their forward inside
  const engineTids = tidOf('engine');
  assert.equal(engineTids.length, 1);
  const engine = events.filter((e) => e.ph === 'X' && e.tid === engineTids[0]).map(span);
  const steps = engine.filter((e) => e.name === 'step'), forwards = engine.filter((e) => e.name === 'forward');
  assert.ok(steps.length > 0 && forwards.length === steps.length);
  for (const f of forwards) {
    const st = steps.filter((s) => s.from <= f.from && f.to <= s.to);
    assert.equal(st.length, 1, 'each forward lies in one step');
    assert.ok(st[0].args.n_seqs >= 1 && st[0].args.tokens >= st[0].args.n_seqs);
    assert.equal(st[0].args.tokens, st[0].args.prefill_tokens + st[0].args.decode_tokens);
  }

  const tids = new Set();
  for (const res of results) {
    assert.ok(res.id && res.usage, 'the response has an id and usage');
    const own = tidOf(`req ${res.id}`);
    assert.equal(own.length, 1, `one track named "req ${res.id}"; tracks: ${[...trackName.values()].join(', ')}`);
    const tid = own[0];
    tids.add(tid);
    const mine = events.filter((e) => e.tid === tid && e.ph === 'X').map(span);
    const reqs = mine.filter((e) => e.name === 'request');
    assert.equal(reqs.length, 1, 'one request span');
    const req = reqs[0];
    assert.equal(req.args.prompt_tokens, res.usage.prompt_tokens);
    assert.equal(req.args.completion_tokens, res.usage.completion_tokens);
    assert.equal(req.args.cached_tokens, res.usage.prompt_tokens_details.cached_tokens);
    assert.equal(req.args.finish, res.finish);
    // everything else on the track lies inside the request span, one after another
    const inner = mine.filter((e) => e !== req).sort((a, b) => a.from - b.from);
    for (const e of inner) assert.ok(req.from < e.from && e.to <= req.to, `${e.name} [${e.ts}, +${e.dur}] inside the request`);
    for (let i = 1; i < inner.length; i++)
      assert.ok(inner[i].from >= inner[i - 1].to, `${inner[i].name} starts after ${inner[i - 1].name} ends`);
    const names = inner.map((e) => e.name);
    const first = (n) => names.indexOf(n), last = (n) => names.lastIndexOf(n);
    for (const n of ['queue', 'cache lookup', 'prefill', 'decode', 'detokenize'])
      assert.ok(names.includes(n), `a ${n} span (have: ${[...new Set(names)].join(', ')})`);
    assert.equal(names.filter((n) => n === 'queue').length, 1);
    assert.ok(first('queue') < first('cache lookup') && last('cache lookup') < first('prefill'));
    assert.ok(last('prefill') < first('decode'), 'prefill chunks come before decode steps');
    const lookup = inner[first('cache lookup')];
    assert.equal(lookup.args.hit_tokens + lookup.args.miss_tokens, res.usage.prompt_tokens);
    // the prefill chunks cover the prompt's uncached tokens, in order
    const chunks = inner.filter((e) => e.name === 'prefill');
    let pos = lookup.args.hit_tokens;
    for (const c of chunks) {
      assert.equal(c.args.position, pos);
      pos += c.args.tokens;
    }
    assert.equal(pos, res.usage.prompt_tokens);
    // one detokenize per sampled token: the first after prefill, then one per decode step
    const detok = inner.filter((e) => e.name === 'detokenize' && e.args.token !== undefined);
    const decodes = inner.filter((e) => e.name === 'decode');
    assert.equal(detok.length, res.usage.completion_tokens);
    assert.equal(decodes.length, res.usage.completion_tokens - 1);
    decodes.forEach((d, i) => assert.equal(d.args.position, res.usage.prompt_tokens + i));
    // each prefill chunk and decode step is one of the engine's forwards
    for (const e of [...chunks, ...decodes])
      assert.ok(forwards.some((f) => f.from === e.from && f.to === e.to), `${e.name} at ${e.ts} matches a forward`);
  }
  assert.equal(tids.size, 2, 'the two requests have their own tracks');
  fs.rmSync(path.dirname(file), { recursive: true, force: true });
});

test('a trace whose server was killed loads once closed', async () => {
  const file = tempTrace('killed.json');
  const srv = await startServer(['--trace-file', file]);
  try {
    await chatWhole(srv.url, 'And God said, Let there be light.', 3);
  } finally {
    await stopServer(srv, 'SIGKILL');
  }
  const text = fs.readFileSync(file, 'utf8');
  assert.ok(!text.trimEnd().endsWith(']'), 'killed: no closing bracket');
  const events = JSON.parse(text + '\n]');
  assert.ok(events.some((e) => e.ph === 'X' && e.name === 'request'));
  assert.ok(events.some((e) => e.ph === 'M' && e.name === 'thread_name' && /^req chatcmpl-/.test(e.args.name)));
  fs.rmSync(path.dirname(file), { recursive: true, force: true });
});

test('--trace-max-bytes caps the file, which stays valid JSON', async () => {
  const file = tempTrace('capped.json');
  const cap = 4096;
  const srv = await startServer(['--trace-file', file, '--trace-max-bytes', String(cap)]);
  try {
    await chatWhole(srv.url, 'And God saw the light, that it was good.', 40);
  } finally {
    const code = await stopServer(srv, 'SIGTERM');
    assert.equal(code, 0, `server exited with ${code}:\n${srv.log.slice(-4000)}`);
  }
  assert.match(srv.log, /size limit of 4096 bytes/, 'the cap is logged');
  const text = fs.readFileSync(file, 'utf8');
  assert.ok(Buffer.byteLength(text) <= cap + 5, `${Buffer.byteLength(text)} bytes`);
  const events = JSON.parse(text);
  assert.ok(events.length > 5);
  fs.rmSync(path.dirname(file), { recursive: true, force: true });
});
