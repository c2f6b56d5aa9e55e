// browser.test.cjs — the chat page served at GET / (src/serve/page.c), driven
// in a real headless Chromium through npm "puppeteer-core" (pinned in
// package-lock.json; it never downloads a browser), under node's test runner.
//
// HEARTH_FAKE_SERVER    the test server over the fake engine (tests/serve/fake_engine.h),
//                       for deterministic replies: Markdown, HTML, slow, context-filling
// HEARTH_CLI            `hearth`, run as `hearth serve` on the built-in model
//                       (models/default, or $HEARTH_E2E_MODEL) for a real stream
// HEARTH_CHROMIUM       the browser (default: chromium on PATH); Debian's
//                       `chromium`, installed by tools/setup.sh --test
// HEARTH_DEPS_DIR       where tools/fetch_test_deps.sh installed node_modules
// HEARTH_BROWSER_SHOTS  where screenshots go (printed in the output)
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const SOURCE = process.env.HEARTH_SOURCE_DIR || path.resolve(__dirname, '../..');
const DEPS = process.env.HEARTH_DEPS_DIR || path.join(SOURCE, '.deps');
const SHOTS = process.env.HEARTH_BROWSER_SHOTS || path.join(os.tmpdir(), 'hearth-browser-shots');

function loadPuppeteer() {
  const dir = path.join(DEPS, 'node', 'node_modules', 'puppeteer-core');
  if (!fs.existsSync(dir))
    throw new Error(`npm "puppeteer-core" is not installed at ${dir}: run tools/fetch_test_deps.sh`);
  return require(dir);
}

function findChromium() {
  const named = process.env.HEARTH_CHROMIUM;
  if (named) {
    if (fs.existsSync(named)) return named;
    throw new Error(`HEARTH_CHROMIUM=${named} does not exist: run tools/setup.sh --test (it installs chromium)`);
  }
  for (const name of ['chromium', 'chromium-browser']) {
    try {
      const p = execFileSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' }).trim();
      if (p) return p;
    } catch (e) { /* not on PATH */ }
  }
  throw new Error('chromium is not installed: run tools/setup.sh --test (it installs Debian\'s chromium)');
}

function findModel() {
  if (process.env.HEARTH_E2E_MODEL) return process.env.HEARTH_E2E_MODEL;
  const def = path.join(SOURCE, 'models/default');
  if (fs.existsSync(path.join(def, 'config.json'))) return def;
  throw new Error(`no model to serve: ${def} (the built-in model) has no config.json`);
}

const { startServer, stopServer } = require('./harness.cjs');

async function waitFor(cond, what, ms = 60000) {
  const until = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const SMALL_CONTEXT = 160;
let puppeteer, browser, fake, small, real, vision;
// the tiny Gemma 4 with a vision tower (tools/gen_mm_golden.py): images from the page
const VISION = path.join(SOURCE, 'tests/fixtures/mm/gemma4_vision-f32');

before(async () => {
  puppeteer = loadPuppeteer();
  const chromium = findChromium();
  fs.mkdirSync(SHOTS, { recursive: true });
  fake = await startServer(process.env.HEARTH_FAKE_SERVER, ['--port', '0']);
  small = await startServer(process.env.HEARTH_FAKE_SERVER, ['--port', '0', '--context', String(SMALL_CONTEXT)]);
  real = await startServer(process.env.HEARTH_CLI, ['serve', '--model', findModel(), '--port', '0', '--threads', '2']);
  vision = await startServer(process.env.HEARTH_CLI, ['serve', '--model', VISION, '--port', '0', '--threads', '2']);
  browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    // CI runs as root, where Chromium's sandbox cannot start.
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
  });
});

after(async () => {
  if (browser) await browser.close();
  for (const srv of [fake, small, real, vision]) {
    const code = await stopServer(srv);
    assert.equal(code, 0, `server exited with ${code}:\n${srv ? srv.log.slice(-4000) : ''}`);
  }
});

// A fresh tab on the server's page, recording the chat requests' bodies, the
// responses' statuses and script errors.
async function openPage(srv) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1000, height: 800 });
  const rec = { requests: [], responses: [], errors: [] };
  page.on('request', (r) => {
    if (r.method() === 'POST' && new URL(r.url()).pathname === '/v1/chat/completions')
      rec.requests.push(JSON.parse(r.postData()));
  });
  page.on('response', (r) => rec.responses.push({ url: r.url(), status: r.status() }));
  page.on('pageerror', (e) => rec.errors.push(String(e)));
  // (Failed loads are judged by their statuses: a context_length_exceeded 400 may be expected.)
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) rec.errors.push(m.text());
  });
  await page.goto(srv.url + '/', { waitUntil: 'networkidle0' });
  await page.waitForFunction(() => document.getElementById('model').textContent !== '…');
  return { page, rec };
}

// Saves a screenshot and checks it is not blank: decoded in the page, it
// holds more than a couple of colours.
async function shot(t, page, name) {
  const file = path.join(SHOTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  t.diagnostic(`screenshot: ${file}`);
  const colours = await page.evaluate(async (b64) => {
    const img = new Image();
    img.src = 'data:image/png;base64,' + b64;
    await img.decode();
    const c = document.createElement('canvas');
    c.width = img.width; c.height = img.height;
    const g = c.getContext('2d');
    g.drawImage(img, 0, 0);
    const px = g.getImageData(0, 0, c.width, c.height).data, seen = new Set();
    for (let i = 0; i < px.length && seen.size < 16; i += 4 * 7) seen.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
    return seen.size;
  }, fs.readFileSync(file).toString('base64'));
  assert.ok(colours > 4, `screenshot ${file} is blank (${colours} colours)`);
}

async function type(page, text) {
  await page.click('#input');
  await page.type('#input', text);
  await page.keyboard.press('Enter');
}

const idle = (page) => page.waitForFunction(() => document.getElementById('send').textContent === 'Send', { timeout: 60000 });
const busy = (page) => page.waitForFunction(() => document.getElementById('send').textContent === 'Stop', { timeout: 60000 });

// The text of the last reply, without its marks (stopped, cut), tools and reasoning.
function lastReply(page) {
  return page.evaluate(() => {
    const all = document.querySelectorAll('#log .msg.assistant');
    if (!all.length) return null;
    const m = all[all.length - 1].cloneNode(true);
    for (const t of m.querySelectorAll('.tag, .reasoning')) t.remove();
    return m.textContent;
  });
}

async function waitReplyLength(page, n) {
  await waitFor(async () => ((await lastReply(page)) || '').length >= n, `a reply of ${n} characters`);
}

// Records, on every change of the log, the last reply's length and whether it
// already holds some elements, so a test can see a reply grow.
function observe(page) {
  return page.evaluate(() => {
    window.__seen = [];
    new MutationObserver(() => {
      const all = document.querySelectorAll('#log .msg.assistant');
      if (!all.length) return;
      const m = all[all.length - 1];
      window.__seen.push({ len: m.textContent.length, strong: !!m.querySelector('strong'),
                           busy: document.getElementById('send').textContent === 'Stop' });
    }).observe(document.getElementById('log'), { subtree: true, childList: true, characterData: true });
  });
}

function noErrors(rec) {
  assert.deepEqual(rec.errors, [], 'the page logged errors');
  assert.deepEqual(rec.responses.filter((r) => r.status === 404), [], 'a request got 404');
}

test('the page loads with its own icon: no favicon request, no 404', async (t) => {
  const { page, rec } = await openPage(fake);
  const icon = await page.$eval('link[rel=icon]', (l) => l.href);
  assert.match(icon, /^data:image\/svg\+xml,/);
  assert.match(await page.$eval('#model', (e) => e.textContent), /fake-model/);
  // the fake model takes no media (GET /v1's capabilities): no image button
  assert.equal(await page.$eval('#attach', (e) => e.offsetParent === null), true, 'the image button shows');
  // the sidebar of saved conversations and the system prompt are there
  assert.ok(await page.$('#side #chats'));
  assert.ok(await page.$('#system'));
  // an image dropped on the page is refused, saying why
  await page.evaluate(() => {
    const dt = new DataTransfer();
    dt.items.add(new File([new Uint8Array([137, 80, 78, 71])], 'x.png', { type: 'image/png' }));
    document.getElementById('log').dispatchEvent(new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
  });
  assert.equal(await page.$eval('#log .error', (e) => e.textContent), 'This model takes no images.');
  assert.equal(await page.$$eval('#pending .thumb', (e) => e.length), 0);
  assert.deepEqual(rec.responses.filter((r) => new URL(r.url).pathname === '/favicon.ico'), []);
  noErrors(rec);
  await shot(t, page, 'load');
  await page.close();
});

test('a reply from the built-in model streams in (hearth serve)', async (t) => {
  const { page, rec } = await openPage(real);
  await page.$eval('#temp', (e) => { e.value = '0'; });
  await observe(page);
  await type(page, 'Tell me a story about a lighthouse.');
  await idle(page);
  const text = await lastReply(page);
  assert.ok(text && text.length > 0, 'no reply');
  const lens = await page.evaluate(() => window.__seen.filter((s) => s.busy && s.len > 0).map((s) => s.len));
  // How many frames see the reply grow depends on the model's speed (the
  // built-in model can finish within two); the paced fake replies below check
  // growth while streaming. Here: what was seen while busy never shrank.
  const distinct = [...new Set(lens)];
  for (let i = 1; i < distinct.length; i++) assert.ok(distinct[i] > distinct[i - 1], `the reply shrank: ${distinct}`);
  assert.equal(rec.requests.length, 1);
  assert.equal(rec.requests[0].stream, true);
  assert.deepEqual(rec.requests[0].stream_options, { include_usage: true });
  assert.deepEqual(rec.requests[0].messages, [{ role: 'user', content: 'Tell me a story about a lighthouse.' }]);
  // A second turn carries the first.
  await type(page, 'And then?');
  await idle(page);
  assert.ok((await lastReply(page)).length > 0);
  const msgs = rec.requests[1].messages;
  assert.equal(msgs.length, 3);
  assert.equal(msgs[1].role, 'assistant');
  assert.equal(msgs[1].content.trim(), text.trim());
  assert.equal(await page.$$eval('#log .error', (e) => e.length), 0);
  noErrors(rec);
  await shot(t, page, 'stream-real');
  await page.close();
});

test('Stop ends the reply: nothing is appended after it', async (t) => {
  const { page, rec } = await openPage(fake);
  const cancelled = (fake.log.match(/generation cancelled/g) || []).length;
  await type(page, '[slow] count for me');
  await waitReplyLength(page, 30);
  // Click Stop and read the reply in the same turn of the page's event loop.
  const atStop = await page.evaluate(() => {
    document.getElementById('send').click();
    const all = document.querySelectorAll('#log .msg.assistant');
    return all[all.length - 1].textContent;
  });
  await idle(page);
  await waitFor(() => (fake.log.match(/generation cancelled/g) || []).length > cancelled, 'the server to cancel');
  await sleep(500); // the fake would have sent ~50 more tokens by now
  assert.equal(await lastReply(page), atStop);
  assert.equal(await page.$$eval('#log .msg.assistant .tag.stopped', (e) => e.length), 1);
  assert.equal(await page.$$eval('#log .error', (e) => e.length), 0);
  // The stopped reply stays part of the conversation.
  await type(page, 'go on');
  await idle(page);
  const msgs = rec.requests[1].messages;
  assert.deepEqual(msgs.map((m) => m.role), ['user', 'assistant', 'user']);
  assert.equal(msgs[1].content, atStop);
  noErrors(rec);
  await shot(t, page, 'stop');
  await page.close();
});

test('"new chat" during a reply: the partial reply is in no later request', async (t) => {
  const { page, rec } = await openPage(fake);
  await type(page, '[slow] first conversation');
  await waitReplyLength(page, 30);
  const partial = await lastReply(page);
  await page.click('#clear');
  await idle(page);
  await sleep(300); // let the aborted request finish unwinding
  assert.equal(await page.$eval('#log', (e) => e.children.length), 0);
  await type(page, 'second conversation');
  await idle(page);
  await type(page, 'and more');
  await idle(page);
  assert.equal(rec.requests.length, 3);
  assert.deepEqual(rec.requests[1].messages, [{ role: 'user', content: 'second conversation' }]);
  const third = rec.requests[2].messages;
  assert.deepEqual(third.map((m) => m.role), ['user', 'assistant', 'user']);
  assert.equal(third[0].content, 'second conversation');
  assert.equal(third[2].content, 'and more');
  for (const body of rec.requests.slice(1)) {
    const s = JSON.stringify(body);
    assert.ok(!s.includes(partial.trim()), 'the partial reply leaked into the next conversation');
    assert.ok(!s.includes('first conversation'));
  }
  const log = await page.$eval('#log', (e) => e.textContent);
  assert.ok(!log.includes(partial.trim()) && !log.includes('first conversation'),
    `the first conversation shows after "new chat": page ${JSON.stringify(log)}, partial ${JSON.stringify(partial)}`);
  noErrors(rec);
  await shot(t, page, 'new-chat');
  await page.close();
});

test('a reply cut by the length limit is marked', async (t) => {
  const { page, rec } = await openPage(fake);
  await page.$eval('#maxtok', (e) => { e.value = '5'; });
  await type(page, 'hello');
  await idle(page);
  assert.equal(rec.requests[0].max_tokens, 5);
  const cut = await page.$$eval('#log .msg.assistant .tag.cut', (e) => e.map((x) => x.textContent));
  assert.equal(cut.length, 1);
  assert.match(cut[0], /length limit/);
  assert.ok(await page.$eval('#log .msg.assistant .tag.cut', (e) => e.offsetHeight > 0), 'the mark is not visible');
  // A reply that ends by itself is not marked.
  await page.$eval('#maxtok', (e) => { e.value = ''; });
  await type(page, 'hello again');
  await idle(page);
  assert.equal(rec.requests[1].max_tokens, undefined);
  const marks = await page.$$eval('#log .msg.assistant', (ms) => ms.map((m) => m.querySelectorAll('.tag.cut').length));
  assert.deepEqual(marks, [1, 0]);
  noErrors(rec);
  await shot(t, page, 'length-cut');
  await page.close();
});

test('replies render as Markdown while streaming; HTML in them stays text', async (t) => {
  const { page, rec } = await openPage(fake);
  await observe(page);
  await type(page, '[markdown] [slow] show me');
  await idle(page);
  const md = await page.evaluate(() => {
    const m = document.querySelector('#log .msg.assistant');
    const q = (s) => [...m.querySelectorAll(s)].map((e) => e.textContent);
    return {
      pre: q('pre > code'), lang: m.querySelector('pre > code') && m.querySelector('pre > code').className,
      code: q('p code'), strong: q('strong'), em: q('em'), ul: q('ul > li'), ol: q('ol > li'),
      links: [...m.querySelectorAll('a')].map((a) => [a.textContent, a.getAttribute('href')]),
      text: m.textContent,
    };
  });
  assert.deepEqual(md.pre, ['int main(void) { return 0; }']);
  assert.match(md.lang, /(^| )language-c( |$)/);
  // highlighted (highlight.js) where the build bundled it
  if (await page.evaluate(() => typeof hljs !== 'undefined'))
    assert.ok(await page.$('#log .msg.assistant pre > code span[class^=hljs-]'), 'the code is not highlighted');
  assert.deepEqual(md.code, ['inline code']);
  assert.deepEqual(md.strong, ['bold']);
  assert.deepEqual(md.em, ['italic']);
  assert.deepEqual(md.ul, ['first item', 'second item']);
  assert.deepEqual(md.ol, ['one', 'two']);
  assert.deepEqual(md.links, [['the docs', 'https://example.com/docs']]);
  assert.ok(md.text.includes('[not a link](javascript:alert(1))'), 'a javascript: link must stay text');
  // Rendered as it streamed, not only at the end.
  const seen = await page.evaluate(() => window.__seen);
  const streaming = seen.filter((s) => s.busy && s.len > 0);
  assert.ok(new Set(streaming.map((s) => s.len)).size >= 3, `the reply did not grow: ${JSON.stringify(streaming)}`);
  assert.ok(streaming.some((s) => s.strong && s.len < md.text.length), 'no Markdown was rendered before the end');
  await shot(t, page, 'markdown');

  await type(page, '[html] and now');
  await idle(page);
  const html = await page.evaluate(() => {
    const all = document.querySelectorAll('#log .msg.assistant');
    const m = all[all.length - 1];
    return {
      text: m.textContent, pwned: window.__pwned === undefined ? null : window.__pwned,
      elements: document.querySelectorAll('#log img, #log script, #log b, #injected').length,
      links: m.querySelectorAll('a').length,
    };
  });
  assert.equal(html.elements, 0, 'model output injected elements');
  assert.equal(html.pwned, null, 'model output ran script');
  assert.equal(html.links, 0);
  assert.ok(html.text.includes('<img src=x onerror="window.__pwned=1">'), html.text);
  assert.ok(html.text.includes('<b id="injected">not bold</b>'), html.text);
  assert.ok(html.text.includes('<script>window.__pwned=2</script>'), html.text);
  noErrors(rec);
  await shot(t, page, 'html-as-text');
  await page.close();
});

test('a full context: older turns are left out, every turn still gets a reply, the page says so', async (t) => {
  const { page, rec } = await openPage(small);
  // "auto" max tokens: this reply runs until the context is full.
  await type(page, '[long] fill the context');
  await idle(page);
  assert.ok(await page.$('#log .msg.assistant .tag.cut'), 'the context-filling reply is not marked as cut');
  const turns = 8;
  for (let i = 2; i <= turns; i++) {
    await type(page, `turn ${i}: tell me more`);
    await idle(page);
    assert.equal(await page.$$eval('#log .error', (e) => e.map((x) => x.textContent).join('; ')), '');
    assert.ok((await lastReply(page)).length > 0, `turn ${i} got no reply`);
  }
  assert.equal(await page.$$eval('#log .msg.assistant', (e) => e.length), turns);
  const note = await page.$eval('#log .note', (e) => ({ text: e.textContent, shown: e.offsetHeight > 0 }));
  assert.ok(note.shown, 'the note is not visible');
  assert.match(note.text, /left out/);
  assert.match(note.text, new RegExp(`${SMALL_CONTEXT} tokens`));
  const omitted = await page.$$eval('#log .omitted', (e) => e.length);
  assert.ok(omitted > 0, 'left-out turns are not shown as such');
  assert.equal(parseInt(note.text, 10), omitted, `the note counts ${parseInt(note.text, 10)} left-out messages; ${omitted} are greyed out`);
  const last = rec.requests[rec.requests.length - 1].messages;
  assert.equal(last[0].role, 'user');
  assert.equal(last[last.length - 1].content, `turn ${turns}: tell me more`);
  assert.ok(!JSON.stringify(last).includes('[long]'), 'the oldest turn is still sent');
  // Every answered request fitted: the page left room for the reply.
  const chats = rec.responses.filter((r) => new URL(r.url).pathname === '/v1/chat/completions');
  assert.equal(chats.filter((r) => r.status === 200).length, turns);
  noErrors(rec);
  await shot(t, page, 'context-full');
  await page.close();
});

test('images by the file picker and by drag and drop go with the message (hearth serve, a vision model)', async (t) => {
  const { page, rec } = await openPage(vision);
  assert.equal(await page.$eval('#attach', (e) => e.offsetParent !== null), true, 'no image button for a vision model');
  await page.$eval('#temp', (e) => { e.value = '0'; });
  await page.$eval('#maxtok', (e) => { e.value = '4'; });
  // the picker
  const input = await page.$('#file');
  await input.uploadFile(path.join(VISION, 'img_a.png'));
  await page.waitForFunction(() => document.querySelectorAll('#pending .thumb img').length === 1);
  // a file dropped on the page
  const jpg = fs.readFileSync(path.join(VISION, 'img_a.jpg')).toString('base64');
  await page.evaluate((b64) => {
    const bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const dt = new DataTransfer();
    dt.items.add(new File([bytes], 'photo.jpg', { type: 'image/jpeg' }));
    document.getElementById('log').dispatchEvent(new DragEvent('dragover', { dataTransfer: dt, bubbles: true, cancelable: true }));
    document.getElementById('log').dispatchEvent(new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
  }, jpg);
  await page.waitForFunction(() => document.querySelectorAll('#pending .thumb img').length === 2);
  await shot(t, page, 'images-pending');
  await type(page, 'What is in these pictures?');
  await idle(page);
  assert.equal(rec.requests.length, 1);
  const content = rec.requests[0].messages[0].content;
  assert.deepEqual(content.map((p) => p.type), ['image_url', 'image_url', 'text']);
  assert.match(content[0].image_url.url, /^data:image\/png;base64,iVBOR/);
  assert.match(content[1].image_url.url, /^data:image\/jpeg;base64,\/9j\//);
  assert.equal(content[2].text, 'What is in these pictures?');
  assert.ok(((await lastReply(page)) || '').length > 0, 'no reply');
  assert.equal(await page.$$eval('#log .msg.user img', (e) => e.length), 2);
  assert.equal(await page.$$eval('#pending .thumb', (e) => e.length), 0);
  // the next turn sends the images again, as the conversation's history
  await type(page, 'And now?');
  await idle(page);
  assert.equal(rec.requests[1].messages[0].content.length, 3);
  assert.equal(await page.$$eval('#log .error', (e) => e.length), 0);
  noErrors(rec);
  await shot(t, page, 'images-sent');
  await page.close();
});

// Whether the page bundles its libraries (a build without them, offline, has the plain renderer).
const rich = (page) => page.evaluate(() => typeof marked !== 'undefined' && typeof DOMPurify !== 'undefined');

test('GitHub-flavoured Markdown: tables, nested and task lists, strikethrough, math', async (t) => {
  const { page, rec } = await openPage(fake);
  if (!(await rich(page))) { t.skip('the page was built without its libraries (tools/fetch_page_deps.sh)'); await page.close(); return; }
  await type(page, '[gfm] show me');
  await idle(page);
  const g = await page.evaluate(() => {
    const m = document.querySelector('#log .msg.assistant .body');
    const q = (s) => [...m.querySelectorAll(s)].map((e) => e.textContent.trim());
    return {
      th: q('table th'), td: q('table td'), nested: q('li > ul > li'),
      boxes: [...m.querySelectorAll('li > input[type=checkbox]')].map((e) => e.checked),
      del: q('del'), katex: m.querySelectorAll('.katex').length, display: m.querySelectorAll('.katex-display').length,
      math: q('.katex .katex-html'),
    };
  });
  assert.deepEqual(g.th, ['name', 'value']);
  assert.deepEqual(g.td, ['alpha', '1', 'beta', '2']);
  assert.deepEqual(g.nested, ['inner one', 'inner two']);
  assert.deepEqual(g.boxes, [true, false]);
  assert.deepEqual(g.del, ['old']);
  assert.equal(g.katex, 2);
  assert.equal(g.display, 1);
  assert.equal(g.math.length, 2);
  assert.match(g.math[0], /π/);
  assert.match(g.math[1], /∫/);
  noErrors(rec);
  await shot(t, page, 'gfm');
  await page.emulateMediaFeatures([{ name: 'prefers-color-scheme', value: 'dark' }]);
  await shot(t, page, 'gfm-dark');
  await page.close();
});

test('reasoning shows collapsed above the reply; each reply says its TTFT and tokens/s', async (t) => {
  const { page, rec } = await openPage(fake);
  await type(page, '[think] [slow] what is 2 + 2?');  // paced, so the reply has a rate
  await idle(page);
  const r = await page.evaluate(() => {
    const m = document.querySelector('#log .msg.assistant');
    const d = m.querySelector('details.reasoning');
    return { has: !!d, open: d && d.open, text: d && d.querySelector('.text').textContent,
             first: m.firstElementChild === d, stats: m.querySelector('.tools .stats').textContent };
  });
  assert.ok(r.has, 'no reasoning block');
  assert.equal(r.open, false);
  assert.equal(r.first, true);
  assert.match(r.text, /First, 2 \+ 2\.\s+That is 4\./);
  assert.equal((await lastReply(page)).trim(), 'The answer is 4.');
  assert.match(r.stats, /^TTFT \d+ ms · [\d.]+ tokens\/s · \d+ tokens$/);
  // the reasoning is not sent back as the reply
  await page.click('#log details.reasoning summary');
  await shot(t, page, 'reasoning');
  await type(page, 'thanks');
  await idle(page);
  assert.equal(rec.requests[1].messages[1].content.trim(), 'The answer is 4.');
  noErrors(rec);
  await page.close();
});

test('a system prompt; copy, regenerate and edit a message', async (t) => {
  const { page, rec } = await openPage(fake);
  await page.click('#system-box summary');
  await page.type('#system', 'Be brief.');
  await page.$eval('#system', (e) => e.dispatchEvent(new Event('change')));
  await type(page, 'hello');
  await idle(page);
  assert.deepEqual(rec.requests[0].messages, [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'hello' }]);
  // copy
  await page.evaluate(() => { navigator.clipboard.writeText = (s) => { window.__copied = s; return Promise.resolve(); }; });
  await page.click('#log .msg.assistant .copy');
  await page.waitForFunction(() => window.__copied !== undefined);
  assert.equal((await page.evaluate(() => window.__copied)).trim(), (await lastReply(page)).trim());
  assert.equal(await page.$eval('#log .msg.assistant .copy', (b) => b.textContent), 'copied');
  // regenerate: the same request again, one reply on the page
  await page.click('#log .msg.assistant .regenerate');
  await idle(page);
  assert.equal(rec.requests.length, 2);
  assert.deepEqual(rec.requests[1].messages, rec.requests[0].messages);
  assert.equal(await page.$$eval('#log .msg.assistant', (e) => e.length), 1);
  await shot(t, page, 'regenerate');
  // edit: back to that message, its text in the input
  await page.click('#log .msg.user .edit');
  assert.equal(await page.$eval('#input', (e) => e.value), 'hello');
  assert.equal(await page.$$eval('#log .msg', (e) => e.length), 0);
  await page.click('#input');
  await page.keyboard.press('End');
  await page.type('#input', ' there');
  await page.keyboard.press('Enter');
  await idle(page);
  assert.deepEqual(rec.requests[2].messages.map((m) => m.content), ['Be brief.', 'hello there']);
  assert.equal(await page.$$eval('#log .msg.user', (e) => e.length), 1);
  noErrors(rec);
  await page.close();
});

test('conversations are saved in the browser: listed, reopened, renamed, exported, deleted', async (t) => {
  const { page, rec } = await openPage(fake);
  await page.evaluate(() => localStorage.removeItem('hearth-chats'));
  await page.reload({ waitUntil: 'networkidle0' });
  await type(page, 'first saved chat');
  await idle(page);
  await type(page, 'and its second turn');
  await idle(page);
  await page.click('#clear');
  await type(page, 'another chat');
  await idle(page);
  const titles = () => page.$$eval('#chats li .title', (e) => e.map((x) => x.textContent));
  assert.deepEqual(await titles(), ['another chat', 'first saved chat']);
  // a fresh page lists both; opening one shows its messages
  await page.reload({ waitUntil: 'networkidle0' });
  assert.deepEqual(await titles(), ['another chat', 'first saved chat']);
  assert.equal(await page.$$eval('#log .msg', (e) => e.length), 0);
  await page.click('#chats li:nth-child(2) .title');
  assert.equal(await page.$$eval('#log .msg.user', (e) => e.length), 2);
  assert.equal(await page.$$eval('#log .msg.assistant', (e) => e.length), 2);
  assert.match(await page.$eval('#log .msg.assistant .stats', (e) => e.textContent), /TTFT/);
  // the next turn carries the reopened conversation
  await type(page, 'third turn');
  await idle(page);
  const last = rec.requests[rec.requests.length - 1].messages;
  assert.deepEqual(last.filter((m) => m.role === 'user').map((m) => m.content), ['first saved chat', 'and its second turn', 'third turn']);
  await shot(t, page, 'saved-chats');
  // rename
  await page.click('#chats li.current .rename');
  await page.$eval('#chats li.current input.title', (e) => { e.value = ''; });
  await page.type('#chats li.current input.title', 'Renamed');
  await page.keyboard.press('Enter');
  assert.deepEqual(await titles(), ['Renamed', 'another chat']);
  assert.equal(JSON.parse(await page.evaluate(() => localStorage.getItem('hearth-chats')))[0].title, 'Renamed');
  // export, as JSON and as Markdown
  await page.evaluate(() => {
    window.__exports = [];
    URL.createObjectURL = (blob) => { blob.text().then((s) => window.__exports.push({ type: blob.type, text: s })); return 'blob:x'; };
    HTMLAnchorElement.prototype.click = function () {};
  });
  await page.click('#chats li.current .export-json');
  await page.click('#chats li.current .export-md');
  await page.waitForFunction(() => window.__exports.length === 2);
  const [json, mdx] = await page.evaluate(() => window.__exports);
  const j = JSON.parse(json.text);
  assert.equal(j.title, 'Renamed');
  assert.deepEqual(j.messages.map((m) => m.role), ['user', 'assistant', 'user', 'assistant', 'user', 'assistant']);
  assert.equal(j.messages[0].content, 'first saved chat');
  assert.match(mdx.text, /^# Renamed\n/);
  assert.match(mdx.text, /\*\*user\*\*\n\nand its second turn/);
  // delete (after confirming)
  page.once('dialog', (d) => d.accept());
  await page.click('#chats li.current .delete');
  assert.deepEqual(await titles(), ['another chat']);
  assert.equal(await page.$$eval('#log .msg', (e) => e.length), 0);
  assert.equal(JSON.parse(await page.evaluate(() => localStorage.getItem('hearth-chats'))).length, 1);
  noErrors(rec);
  await page.close();
});
