// media.test.cjs — images in the prompt end to end: `hearth serve` on the tiny
// Gemma 4 with a vision tower (tests/fixtures/mm/gemma4_vision-f32, made by
// tools/gen_mm_golden.py) answers an OpenAI chat request holding an image_url
// data URL (through the openai client), an Anthropic image block (through the
// Anthropic client) and a Responses input_image; the greedy answer to the
// fixture's own prompt is transformers' when the prompts agree token for token;
// a second turn about the same image reports cached tokens covering the image
// and prefills only the rest, while a different image with as many soft tokens
// hits nothing past the text before it; bad media, media the model cannot
// take and remote URLs without --allow-remote-media are 400s naming the part;
// with it, a listener on 127.0.0.1 is reached only under
// --allow-private-media-hosts (every spelling of loopback refused without it,
// with the one message every failed fetch gets).
//
// HEARTH_E2E_SERVER  the `hearth` executable
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const H = require('./harness.cjs');

const SERVER = process.env.HEARTH_E2E_SERVER;
const FX = path.join(H.SOURCE, 'tests/fixtures/mm/gemma4_vision-f32');
const golden = JSON.parse(fs.readFileSync(path.join(FX, 'golden.json'), 'utf8'));
const dataUrl = (file, type) => `data:${type};base64,${fs.readFileSync(path.join(FX, file)).toString('base64')}`;
const PNG = dataUrl('img_a.png', 'image/png');
const JPG = dataUrl('img_a.jpg', 'image/jpeg');
const MODEL = 'gemma4_vision-f32';
const QUESTION = golden.prompts.p_img.texts[0];

let srv;
before(async () => {
  srv = await H.startServer(SERVER, ['serve', '--model', FX, '--port', '0', '--threads', '2']);
});
after(async () => {
  await H.stopServer(srv);
});

async function post(route, body) {
  const r = await fetch(srv.url + route, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
}

const imageTurn = (url) => ({
  role: 'user',
  content: [{ type: 'image_url', image_url: { url } }, { type: 'text', text: QUESTION }],
});

// The fixture's byte-level BPE: ids back to text (GPT-2's byte-to-unicode table inverted).
function decodeIds(ids) {
  const tj = JSON.parse(fs.readFileSync(path.join(FX, 'tokenizer.json'), 'utf8'));
  const byId = new Map(Object.entries(tj.model.vocab).map(([t, i]) => [i, t]));
  for (const a of tj.added_tokens) byId.set(a.id, a.content);
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  for (let b = 0, n = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  const toByte = new Map(cs.map((c, i) => [String.fromCodePoint(c), bs[i]]));
  const out = [];
  for (const id of ids) for (const ch of byId.get(id)) out.push(toByte.get(ch));
  return Buffer.from(out).toString('utf8');
}

test('an OpenAI image_url part is answered (openai client), as transformers answers', async () => {
  const OpenAI = H.need('openai');
  const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'none' });
  const p = golden.prompts.p_img;
  const r = await client.chat.completions.create({
    model: MODEL, messages: [imageTurn(PNG)], max_tokens: p.greedy.length, temperature: 0,
  });
  assert.equal(r.choices[0].finish_reason, 'length');
  const soft = p.ids.filter((t) => t === golden.token_ids.image).length;
  assert.equal(soft, golden['img_a.num_soft_tokens']);
  // transformers' processor may have tokenized the rendered text with a BOS of its own in front
  const doubleBos = p.ids[0] === golden.token_ids.bos && p.ids[1] === golden.token_ids.bos;
  assert.equal(r.usage.prompt_tokens, p.ids.length - (doubleBos ? 1 : 0));
  if (!doubleBos) assert.equal(r.choices[0].message.content, decodeIds(p.greedy));
  else assert.ok(r.choices[0].message.content.length > 0);
});

test('a second turn about the same image comes from the prefix cache; another image does not', async () => {
  const first = await post('/v1/chat/completions', { model: MODEL, messages: [imageTurn(PNG)], max_tokens: 4, temperature: 0 });
  assert.equal(first.status, 200);
  const answer = first.body.choices[0].message.content;
  const second = await post('/v1/chat/completions', {
    model: MODEL, max_tokens: 4, temperature: 0,
    messages: [imageTurn(PNG), { role: 'assistant', content: answer }, { role: 'user', content: 'And the colours?' }],
  });
  assert.equal(second.status, 200);
  const cached = second.body.usage.prompt_tokens_details.cached_tokens;
  const soft = golden['img_a.num_soft_tokens'];
  // every block up to where the turns part (the template writes the first answer's turn its own way):
  // past the image, whose rows are not computed again
  const ids = golden.prompts.p_img.ids;
  const lead = ids[0] === golden.token_ids.bos && ids[1] === golden.token_ids.bos ? 1 : 0;
  const imageEnd = ids.lastIndexOf(golden.token_ids.image) + 1 - lead;
  assert.ok(cached >= imageEnd, `${cached} cached tokens: the image (${soft} soft tokens, ending at ${imageEnd}) was computed again`);
  // the JPEG's pixels differ, its soft tokens are as many: only the text before the image may hit
  const other = await post('/v1/chat/completions', { model: MODEL, messages: [imageTurn(JPG)], max_tokens: 4, temperature: 0 });
  assert.equal(other.status, 200);
  assert.equal(other.body.usage.prompt_tokens, first.body.usage.prompt_tokens);
  assert.ok(other.body.usage.prompt_tokens_details.cached_tokens < 16,
    `${other.body.usage.prompt_tokens_details.cached_tokens} cached tokens for a different image`);
});

test('an Anthropic image block is answered (Anthropic client)', async () => {
  const Anthropic = H.need('@anthropic-ai/sdk');
  const client = new Anthropic({ baseURL: srv.url, apiKey: 'none' });
  const data = fs.readFileSync(path.join(FX, 'img_a.png')).toString('base64');
  const r = await client.messages.create({
    model: MODEL, max_tokens: 6, temperature: 0,
    messages: [{ role: 'user', content: [
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data } },
      { type: 'text', text: QUESTION }] }],
  });
  assert.equal(r.content[0].type, 'text');
  assert.ok(r.content[0].text.length > 0);
  assert.ok(r.usage.input_tokens + (r.usage.cache_read_input_tokens || 0) > golden['img_a.num_soft_tokens']);
});

test('GET /v1 lists the media the model takes', async () => {
  const r = await fetch(srv.url + '/v1');
  assert.deepEqual((await r.json()).capabilities.media, ['image']);
});

test('a Responses input_image is answered', async () => {
  const r = await post('/v1/responses', {
    model: MODEL, max_output_tokens: 4, temperature: 0,
    input: [{ role: 'user', content: [{ type: 'input_image', image_url: PNG }, { type: 'input_text', text: QUESTION }] }],
  });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.ok(r.body.output[0].content[0].text.length > 0);
});

test('bad media are 400s naming the part', async () => {
  let r = await post('/v1/chat/completions', { model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: [
    { type: 'text', text: 'look' }, { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAA' } }] }] });
  assert.equal(r.status, 400);
  assert.equal(r.body.error.param, 'messages[0].content[1]');
  assert.match(r.body.error.message, /^messages\[0\]\.content\[1\]: bad PNG data/);
  r = await post('/v1/chat/completions', { model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: [
    { type: 'image_url', image_url: { url: 'data:image/png;base64,bm90IGFuIGltYWdl' } }] }] });
  assert.equal(r.status, 400);
  assert.match(r.body.error.message, /not an image/);
  r = await post('/v1/chat/completions', { model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: [
    { type: 'input_audio', input_audio: { data: 'UklGRg==', format: 'wav' } }] }] });
  assert.equal(r.status, 400);
  assert.match(r.body.error.message, /has no audio tower/);
  r = await post('/v1/chat/completions', { model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: [
    { type: 'image_url', image_url: { url: 'https://example.com/cat.png' } }] }] });
  assert.equal(r.status, 400);
  assert.match(r.body.error.message, /--allow-remote-media/);
  r = await post('/v1/chat/completions', { model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: [
    { type: 'image_url', image_url: { url: path.join(FX, 'img_a.png') } }] }] });
  assert.equal(r.status, 400, 'a local path without --allow-local-media');
  r = await post('/v1/messages', { model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'QUFB' } }] }] });
  assert.equal(r.status, 400);
  assert.match(r.body.error.message, /^messages\.0\.content\.0: /);
  // the server is still up
  r = await post('/v1/chat/completions', { model: MODEL, messages: [imageTurn(PNG)], max_tokens: 1 });
  assert.equal(r.status, 200);
});

test('--allow-remote-media fetches http(s) images (loopback only with --allow-private-media-hosts); --allow-local-media reads files', async () => {
  const http = require('node:http');
  const png = fs.readFileSync(path.join(FX, 'img_a.png'));
  let hits = 0;
  const files = http.createServer((req, res) => {
    hits++;
    if (req.url === '/img_a.png') { res.writeHead(200, { 'content-type': 'image/png' }); res.end(png); }
    else if (req.url === '/to-loopback') { res.writeHead(302, { location: base + '/img_a.png' }); res.end(); }
    else { res.writeHead(404); res.end(); }
  });
  await new Promise((r) => files.listen(0, '127.0.0.1', r));
  const base = `http://127.0.0.1:${files.address().port}`;
  const askOn = (srv) => async (url) => {
    const r = await fetch(srv.url + '/v1/chat/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, messages: [imageTurn(url)], max_tokens: 2, temperature: 0 }),
    });
    return { status: r.status, body: await r.json() };
  };
  // public addresses only: the listener on 127.0.0.1 is never reached, and the refusal reads as any failure
  const pub = await H.startServer(SERVER, ['serve', '--model', FX, '--port', '0', '--threads', '2', '--allow-remote-media']);
  try {
    const ask = askOn(pub);
    for (const u of [base + '/img_a.png', `http://localhost:${files.address().port}/img_a.png`,
      `http://[::ffff:127.0.0.1]:${files.address().port}/img_a.png`, 'http://169.254.169.254/latest/meta-data/']) {
      const r = await ask(u);
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assert.match(r.body.error.message, /^messages\[0\]\.content\[0\]: cannot fetch .*\(refused, unreachable, an HTTP error or over/);
    }
    assert.equal(hits, 0, 'a loopback listener was reached without --allow-private-media-hosts');
  } finally {
    await H.stopServer(pub);
  }
  const open = await H.startServer(SERVER, ['serve', '--model', FX, '--port', '0', '--threads', '2',
    '--allow-remote-media', '--allow-private-media-hosts', '--allow-local-media', '--max-media-bytes', '64K']);
  try {
    const ask = askOn(open);
    let r = await ask(base + '/img_a.png');
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.usage.prompt_tokens, golden.prompts.p_img.ids.length - (golden.prompts.p_img.ids[1] === golden.token_ids.bos ? 1 : 0));
    r = await ask(base + '/to-loopback'); // a redirect, checked and followed
    assert.equal(r.status, 200, JSON.stringify(r.body));
    r = await ask(base + '/missing.png');
    assert.equal(r.status, 400);
    assert.match(r.body.error.message, /^messages\[0\]\.content\[0\]: cannot fetch/);
    r = await ask(path.join(FX, 'img_a.png'));
    assert.equal(r.status, 200, JSON.stringify(r.body));
    r = await ask('file://' + path.join(FX, 'img_b.png')); // 46 KB: within 64K
    assert.equal(r.status, 200, JSON.stringify(r.body));
    r = await ask(path.join(FX, 'model.safetensors')); // beyond --max-media-bytes
    assert.equal(r.status, 400);
    assert.match(r.body.error.message, /larger than the limit/);
  } finally {
    await H.stopServer(open);
    files.close();
  }
});
