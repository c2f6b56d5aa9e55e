// kvstore.test.cjs — `hearth serve --kv-store` end to end on the built-in
// model: a long prompt is answered, the server is stopped with SIGTERM (exit
// 0, the cache's blocks written to the folder), a new server on the same
// folder answers the same prompt with the same text and reports the stored
// prefix as cached tokens (usage.prompt_tokens_details.cached_tokens), and
// /stats and /metrics count the blocks written, read back and the tokens
// they saved. Under concurrent requests in a small KV cache, blocks are
// evicted (and written by the store's writer thread) while others are served;
// all of them are answered, and after a restart their prefixes come back with
// the same text. GET /fit answers for the served model, with its KV format
// (--kv-quant) in the bytes.
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

async function complete(url, prompt = PROMPT) {
  const r = await fetch(url + '/v1/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 12, temperature: 0 }),
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
    const st1 = await (await fetch(srv.url + '/stats')).json();
    assert.equal(st1.kv_store.blocks_read, 0);
    assert.equal(st1.kv_store.files_rejected, 0);
    assert.equal(await H.stopServer(srv, 'SIGTERM'), 0);
    const files = fs.readdirSync(dir).filter((f) => f.endsWith('.kvb'));
    assert.ok(files.length >= Math.floor(first.usage.prompt_tokens / 16) - 1, `only ${files.length} blocks stored`);

    srv = await start(['--kv-store', dir]);
    const second = await complete(srv.url);
    assert.equal(second.text, first.text);
    assert.ok(second.usage.prompt_tokens_details.cached_tokens > 0, 'nothing came from the store');
    assert.ok(second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16);
    // every cached token came from the disk: a fresh cache had none
    const st2 = await (await fetch(srv.url + '/stats')).json();
    assert.equal(st2.kv_store.blocks, files.length);
    assert.ok(st2.kv_store.bytes > 0);
    assert.equal(st2.kv_store.blocks_read * 16, st2.kv_store.hit_tokens);
    assert.equal(st2.kv_store.hit_tokens, second.usage.prompt_tokens_details.cached_tokens);
    assert.equal(st2.kv_store.files_rejected, 0);
    const metrics = await (await fetch(srv.url + '/metrics')).text();
    assert.match(metrics, new RegExp(`^hearth_kv_store_blocks_read_total ${st2.kv_store.blocks_read}$`, 'm'));
    assert.match(metrics, new RegExp(`^hearth_kv_store_hit_tokens_total ${st2.kv_store.hit_tokens}$`, 'm'));
    assert.match(metrics, /^hearth_kv_store_blocks_written_total \d+$/m);
    assert.match(metrics, /^hearth_kv_store_files_rejected_total 0$/m);
    assert.equal(await H.stopServer(srv, 'SIGINT'), 0);
    // a file of another version is rejected, counted, left alone
    const now = fs.readdirSync(dir).filter((f) => f.endsWith('.kvb'));
    const one = path.join(dir, now[0]);
    const buf = fs.readFileSync(one);
    buf[8] += 1;
    fs.writeFileSync(one, buf);
    srv = await start(['--kv-store', dir]);
    await complete(srv.url, 'Hello'); // the engine (and its store) starts with the first request
    const st3 = await (await fetch(srv.url + '/stats')).json();
    assert.equal(st3.kv_store.files_rejected, 1);
    assert.equal(st3.kv_store.blocks, now.length - 1);
    assert.equal(await H.stopServer(srv, 'SIGTERM'), 0);
    assert.ok(fs.existsSync(one));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('blocks evicted while serving are written by the store and come back after a restart', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hearth-kvstore-'));
  // 32 blocks of 16 tokens (8 KiB a token): room for about one and a half prompts
  const args = ['--kv-store', dir, '--kv-cache-mem', '4M', '--max-batch', '4'];
  const prompts = Array.from({ length: 12 }, (_, i) => `Prompt number ${i} says: ` + `word${i} `.repeat(120));
  try {
    let srv = await start(args);
    const first = await Promise.all(prompts.map((p) => complete(srv.url, p)));
    const st = await (await fetch(srv.url + '/stats')).json();
    assert.ok(st.kv_store.blocks_written + st.kv_store.write_queue + st.kv_store.writes_dropped > 0, 'nothing was evicted');
    assert.equal(st.kv_store.files_rejected, 0);
    assert.equal(await H.stopServer(srv, 'SIGTERM'), 0);
    srv = await start(args);
    let cached = 0;
    for (let i = 0; i < prompts.length; i++) {
      const again = await complete(srv.url, prompts[i]);
      assert.equal(again.text, first[i].text, `prompt ${i}`);
      cached += again.usage.prompt_tokens_details.cached_tokens;
    }
    assert.ok(cached > 0, 'no prefix came back from the store');
    const st2 = await (await fetch(srv.url + '/stats')).json();
    assert.ok(st2.kv_store.blocks_read > 0);
    assert.equal(await H.stopServer(srv, 'SIGTERM'), 0);
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
  // 8-bit KV: 64 floats in two blocks of 32 bytes and a 4-byte scale
  const q8 = JSON.parse(execFileSync(SERVER, ['fit', '--json', '--ctx', '512', '--kv-quant', '8', '--no-bandwidth'],
    { encoding: 'utf8' }));
  assert.equal(q8.kv.format, 'q8');
  assert.equal(q8.kv.bytes_per_token, 8 * 2 * 2 * (2 * 36));
  const srv8 = await start(['--kv-quant', '8']);
  try {
    const served = await (await fetch(srv8.url + '/fit?ctx=512')).json();
    assert.equal(served.kv.format, 'q8');
    assert.equal(served.kv.bytes_per_token, q8.kv.bytes_per_token);
  } finally {
    assert.equal(await H.stopServer(srv8), 0);
  }
});
