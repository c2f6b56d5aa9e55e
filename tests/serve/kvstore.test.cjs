// kvstore.test.cjs — `hearth serve --kv-store` end to end on the built-in
// model: a long prompt is answered, the server is stopped with SIGTERM (exit
// 0, the cache's blocks written to the folder), a new server on the same
// folder answers the same prompt with the same text and reports the stored
// prefix as cached tokens (usage.prompt_tokens_details.cached_tokens). GET
// /fit answers for the served model.
//
// HEARTH_E2E_SERVER  the `hearth` executable
'use strict';
const { test } = require('node:test');
const { execFileSync } = require('node:child_process');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const H = require('./harness.cjs');

const SERVER = process.env.HEARTH_E2E_SERVER;
// no --model: the built-in model
const start = (extra) => H.startServer(SERVER, ['serve', '--port', '0', '--threads', '2', ...extra]);

const PROMPT = 'In the beginning was a long shared system prompt. '.repeat(24);

async function complete(url) {
  const r = await fetch(url + '/v1/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: PROMPT, max_tokens: 12, temperature: 0 }),
  });
  assert.equal(r.status, 200);
  const body = await r.json();
  return { text: body.choices[0].text, usage: body.usage };
}

test('the prefix cache survives a restart through --kv-store', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hearth-kvstore-'));
  try {
    let srv = await start(['--kv-store', dir]);
    const first = await complete(srv.url);
    assert.ok(first.usage.prompt_tokens > 256);
    assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(await H.stopServer(srv, 'SIGTERM'), 0);
    const files = fs.readdirSync(dir).filter((f) => f.endsWith('.kvb'));
    assert.ok(files.length >= Math.floor(first.usage.prompt_tokens / 16) - 1, `only ${files.length} blocks stored`);

    srv = await start(['--kv-store', dir]);
    const second = await complete(srv.url);
    assert.equal(second.text, first.text);
    assert.ok(second.usage.prompt_tokens_details.cached_tokens > 0, 'nothing came from the store');
    assert.ok(second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16);
    assert.equal(await H.stopServer(srv, 'SIGINT'), 0);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('hearth fit --json and GET /fit answer for the built-in model', async () => {
  const cli = JSON.parse(execFileSync(SERVER, ['fit', '--json', '--ctx', '512', '--batch', '2', '--threads', '1'],
    { encoding: 'utf8' }));
  assert.equal(cli.context, 512);
  assert.equal(cli.batch, 2);
  // the built-in model: 8 layers of 2 KV heads of 64 floats, K and V, f32
  assert.equal(cli.kv.bytes_per_token, 8 * 2 * 2 * 64 * 4);
  assert.equal(cli.kv.bytes, cli.kv.bytes_per_token * 512 * 2);
  assert.equal(cli.need_bytes, cli.weights.bytes + cli.kv.bytes + cli.overhead.bytes);
  assert.equal(typeof cli.fits, 'boolean');
  assert.ok(cli.predicted.decode_tok_s > 0);
  const srv = await start([]);
  try {
    const r = await fetch(srv.url + '/fit?ctx=512&batch=2');
    assert.equal(r.status, 200);
    const served = await r.json();
    assert.equal(served.kv.bytes_per_token, cli.kv.bytes_per_token);
    assert.equal(served.weights.bytes, cli.weights.bytes);
    assert.equal(served.context, 512);
    assert.match(served.memory.source, /held by the model/);
    const bad = await fetch(srv.url + '/fit?batch=0');
    assert.equal(bad.status, 400);
  } finally {
    assert.equal(await H.stopServer(srv), 0);
  }
});
