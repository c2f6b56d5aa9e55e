// chat.js — the chat page's behaviour (src/serve/page/chat.html). Knows only
// the public HTTP API: GET /v1 (the model's capabilities: context length,
// media), GET /v1/models, and /v1/chat/completions streamed over fetch +
// ReadableStream with stream_options.include_usage.
//
// - Conversations are kept in the browser (localStorage "hearth-chats"): a
//   sidebar lists them, to open, rename, delete and export (JSON, Markdown).
//   Each has its own system prompt.
// - Replies are rendered as GitHub-flavoured Markdown with math and
//   highlighted code by the libraries the build bundles (marked, DOMPurify,
//   highlight.js, KaTeX); HTML in model text stays text, links are http(s)
//   only, and everything passes the sanitizer. A build without them uses the
//   plain renderer below, which builds DOM nodes (model text only ever becomes
//   text nodes). Re-rendered as it streams.
// - reasoning_content shows in a collapsible block above the reply; every
//   reply says its time to first token and tokens per second.
// - Messages can be copied; a user message edited (the conversation goes back
//   to it), a reply regenerated.
// - The conversation is fitted to the context: the oldest whole turns are left
//   out so the rest leaves room for the reply (max tokens, or a quarter of the
//   context when "auto"); a context_length_exceeded answer leaves out one more
//   turn and asks again. The page says when turns are left out.
// - A reply cut by the length limit is marked; Stop ends the reply at once;
//   "new chat" during a reply drops that reply from every later request.
'use strict';
const $ = id => document.getElementById(id);

// ---- the server ----
let model = null, context = 0, media = [], busy = null;
function headers() {
  const h = {'Content-Type': 'application/json'};
  const key = localStorage.getItem('hearth-api-key');
  if (key) h.Authorization = 'Bearer ' + key;
  return h;
}
async function api(path, init) {
  let r = await fetch(path, Object.assign({headers: headers()}, init || {}));
  if (r.status === 401) {
    const key = prompt('This server needs an API key:');
    if (key) { localStorage.setItem('hearth-api-key', key); r = await fetch(path, Object.assign({}, init || {}, {headers: headers()})); }
  }
  return r;
}
// The model, its context and the media its messages may hold (GET /v1's
// capabilities; /v1/models when an older server has no such index).
async function loadModel() {
  try {
    const r = await api('/v1');
    const cap = r.ok ? (await r.json()).capabilities : null;
    if (cap) {
      model = cap.model || null;
      context = cap.context_length > 0 ? cap.context_length : 0;
      media = Array.isArray(cap.media) ? cap.media : [];
    } else {
      const j = await (await api('/v1/models')).json();
      const m = j.data && j.data[0];
      model = m ? m.id : null;
      context = m && m.context_length > 0 ? m.context_length : 0;
    }
    $('model').textContent = model ? model + (context ? ' · ' + context + ' tokens' : '') : '(no model)';
  } catch (e) { $('model').textContent = '(server unreachable)'; }
  $('attach').hidden = !media.includes('image');
}

// ---- rendering ----
const RICH = typeof marked !== 'undefined' && typeof DOMPurify !== 'undefined';
function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'})[c]);
}
function tex(text, display) {
  if (typeof katex === 'undefined') return escapeHtml(display ? '$$' + text + '$$' : '$' + text + '$');
  return katex.renderToString(text, {displayMode: display, throwOnError: false, output: 'htmlAndMathml'});
}
// marked, set up for model text: raw HTML is shown as text, links go only to
// http(s), fenced code is highlighted, $…$ / $$…$$ / \(…\) / \[…\] are math.
const md = RICH ? new marked.Marked({gfm: true}).use({
  renderer: {
    html(t) { return escapeHtml(t.text); },
    link(t) {
      if (!/^https?:\/\//i.test(t.href)) return escapeHtml(t.raw);
      return '<a href="' + escapeHtml(t.href) + '" target="_blank" rel="noopener noreferrer">' +
        this.parser.parseInline(t.tokens) + '</a>';
    },
    image(t) { return escapeHtml(t.raw); },  // no requests to places the model names
    code(t) {
      const lang = ((t.lang || '').match(/^[\w+#.-]*/) || [''])[0];
      const known = typeof hljs !== 'undefined' && lang && hljs.getLanguage(lang);
      const body = known ? hljs.highlight(t.text, {language: lang, ignoreIllegals: true}).value : escapeHtml(t.text);
      return '<pre><code class="hljs' + (lang ? ' language-' + escapeHtml(lang) : '') + '">' + body + '</code></pre>\n';
    },
  },
  extensions: [{
    name: 'mathBlock', level: 'block',
    start(src) { const i = src.search(/\$\$|\\\[/); return i < 0 ? undefined : i; },
    tokenizer(src) {
      const m = /^ {0,3}(?:\$\$([\s\S]+?)\$\$|\\\[([\s\S]+?)\\\]) *(?:\n|$)/.exec(src);
      if (m) return {type: 'mathBlock', raw: m[0], text: (m[1] !== undefined ? m[1] : m[2]).trim()};
    },
    renderer(t) { return '<div class="math">' + tex(t.text, true) + '</div>\n'; },
  }, {
    name: 'mathInline', level: 'inline',
    start(src) { const i = src.search(/\$|\\\(/); return i < 0 ? undefined : i; },
    tokenizer(src) {
      const m = /^(?:\$\$([^$]+?)\$\$|\$(?=[^\s$])([^$\n]*?[^\s$])\$(?!\d)|\\\(([\s\S]+?)\\\))/.exec(src);
      if (m) return {type: 'mathInline', raw: m[0], text: m[1] !== undefined ? m[1] : m[2] !== undefined ? m[2] : m[3],
                     display: m[1] !== undefined};
    },
    renderer(t) { return tex(t.text, t.display); },
  }],
}) : null;
function markdown(target, text) {
  if (!RICH) return plainMarkdown(target, text);
  target.innerHTML = DOMPurify.sanitize(md.parse(text), {ADD_ATTR: ['target']}).trim();
}

// ---- the plain renderer (a build without the libraries): DOM nodes, model text only ever becomes text nodes ----
function el(tag, parent) { const e = document.createElement(tag); if (parent) parent.appendChild(e); return e; }
const INLINE = [
  ['code', /`([^`\n]+)`/],
  ['link', /\[([^\]\n]+)\]\(([^()\s]+)\)/],
  ['strong', /\*\*(?=\S)([^\n]*?\S)\*\*|(?<!\w)__(?=\S)([^\n]*?\S)__(?!\w)/],
  ['em', /\*(?=[^\s*])([^*\n]*?[^\s*])\*|(?<![\w])_(?=[^\s_])([^_\n]*?[^\s_])_(?![\w])/],
];
function inline(parent, text) {
  while (text) {
    let best = null;
    for (const [kind, re] of INLINE) {
      const m = re.exec(text);
      if (m && (!best || m.index < best.m.index)) best = {kind, m};
    }
    if (!best) { parent.appendChild(document.createTextNode(text)); return; }
    const m = best.m;
    if (m.index) parent.appendChild(document.createTextNode(text.slice(0, m.index)));
    if (best.kind === 'code') el('code', parent).textContent = m[1];
    else if (best.kind === 'link') {
      if (/^https?:\/\//i.test(m[2])) {
        const a = el('a', parent);
        a.href = m[2]; a.target = '_blank'; a.rel = 'noopener noreferrer';
        inline(a, m[1]);
      } else parent.appendChild(document.createTextNode(m[0]));
    } else inline(el(best.kind, parent), m[1] !== undefined ? m[1] : m[2]);
    text = text.slice(m.index + m[0].length);
  }
}
function lines(parent, rows) {  // a paragraph's lines, kept as line breaks
  rows.forEach((row, i) => { if (i) el('br', parent); inline(parent, row); });
}
const BULLET = /^\s*[-*+]\s+(.*)$/, NUMBER = /^\s*(\d{1,9})[.)]\s+(.*)$/;
function plainMarkdown(target, text) {
  const frag = document.createDocumentFragment();
  const rows = text.split('\n');
  let para = [];
  const flush = () => { if (para.length) lines(el('p', frag), para); para = []; };
  for (let i = 0; i < rows.length; i++) {
    const row = rows[i];
    let m;
    if ((m = /^\s*(```+|~~~+)\s*([\w+#.-]*)/.exec(row))) {  // a fence; an unclosed one runs to the end (still streaming)
      flush();
      const body = [];
      for (i++; i < rows.length && !rows[i].trim().startsWith(m[1]); i++) body.push(rows[i]);
      const code = el('code', el('pre', frag));
      if (m[2]) code.className = 'language-' + m[2];
      code.textContent = body.join('\n');
    } else if (!row.trim()) flush();
    else if ((m = /^(#{1,6})\s+(.*)$/.exec(row))) { flush(); inline(el('h' + m[1].length, frag), m[2]); }
    else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(row)) { flush(); el('hr', frag); }
    else if (/^>/.test(row)) {
      flush();
      const q = [];
      for (; i < rows.length && /^>/.test(rows[i]); i++) q.push(rows[i].replace(/^>\s?/, ''));
      i--;
      lines(el('blockquote', frag), q);
    } else if (BULLET.test(row) || NUMBER.test(row)) {
      flush();
      const ordered = !BULLET.test(row), re = ordered ? NUMBER : BULLET;
      const list = el(ordered ? 'ol' : 'ul', frag);
      if (ordered && +NUMBER.exec(row)[1] !== 1) list.start = +NUMBER.exec(row)[1];
      let item = null;
      for (; i < rows.length; i++) {
        const r = rows[i], mm = re.exec(r);
        if (mm) { item = el('li', list); inline(item, ordered ? mm[2] : mm[1]); }
        else if (r.trim() && /^\s+/.test(r)) { el('br', item); inline(item, r.trim()); }  // a continuation line
        else break;
      }
      i--;
    } else para.push(row);
  }
  flush();
  target.replaceChildren(frag);
}

// ---- saved conversations ----
// A chat: {id, title, system, updated, messages: [{role, content, reasoning,
// stats, mark}]}; content is a string, or content parts when it holds images.
// In memory a message also has el (its element) and tokens (what the server
// counted for it, from streamed usage, else null).
let chats = [];
let chat = null;        // the open one; "new chat" makes a new object, so a reply still finishing belongs to the old one
let charsPerToken = 3;  // learned from usage; 3 over-counts most text, which is the safe side
let omitted = 0;        // leading messages of the open chat no longer sent
function loadChats() {
  try { chats = JSON.parse(localStorage.getItem('hearth-chats') || '[]'); } catch (e) { chats = []; }
  if (!Array.isArray(chats)) chats = [];
}
function stored(m) {
  const s = {role: m.role, content: m.content};
  for (const k of ['reasoning', 'stats', 'mark', 'maxTokens']) if (m[k]) s[k] = m[k];
  return s;
}
function saveChats() {
  if (chat && chat.messages.length && !chats.includes(chat)) chats.unshift(chat);
  chats.sort((a, b) => (b.updated || 0) - (a.updated || 0));  // the latest first
  const all = chats.map(c => ({id: c.id, title: c.title, system: c.system, updated: c.updated, messages: c.messages.map(stored)}));
  try { localStorage.setItem('hearth-chats', JSON.stringify(all)); }
  catch (e) { add('error', 'This conversation could not be saved in the browser: ' + e.message); }
  showChats();
}
function titleOf(c) {
  if (c.title) return c.title;
  const first = c.messages.find(m => m.role === 'user');
  return (first ? textOf(first).trim().slice(0, 60) : '') || 'new chat';
}
function iconButton(parent, text, title, onclick) {
  const b = el('button', parent);
  b.type = 'button'; b.className = 'icon'; b.textContent = text; b.title = title;
  b.addEventListener('click', ev => { ev.stopPropagation(); onclick(b); });
  return b;
}
function showChats() {
  const list = $('chats');
  list.textContent = '';
  for (const c of chats) {
    const li = el('li', list);
    li.dataset.id = c.id;
    if (c === chat) li.classList.add('current');
    const t = el('span', li);
    t.className = 'title'; t.textContent = titleOf(c); t.title = titleOf(c);
    li.addEventListener('click', () => openChat(c));
    iconButton(li, '✎', 'rename', () => rename(c, li, t)).className += ' rename';
    iconButton(li, 'JSON', 'export as JSON', () => download(c, 'json')).className += ' export-json';
    iconButton(li, 'MD', 'export as Markdown', () => download(c, 'md')).className += ' export-md';
    iconButton(li, '×', 'delete', () => remove(c)).className += ' delete';
  }
}
function rename(c, li, t) {
  const input = el('input');
  input.value = titleOf(c);
  input.className = 'title';
  t.replaceWith(input);
  input.focus();
  input.select();
  let finished = false;
  const done = keep => {
    if (finished) return;
    finished = true;
    if (keep && input.value.trim()) c.title = input.value.trim();
    saveChats();
  };
  input.addEventListener('click', ev => ev.stopPropagation());
  input.addEventListener('keydown', ev => {
    if (ev.key === 'Enter') done(true);
    else if (ev.key === 'Escape') done(false);
  });
  input.addEventListener('blur', () => { if (input.isConnected) done(true); });
}
function remove(c) {
  if (!confirm('Delete "' + titleOf(c) + '"?')) return;
  chats = chats.filter(x => x !== c);
  if (c === chat) newChat();
  saveChats();
}
function exportText(c, kind) {
  if (kind === 'json') return JSON.stringify({title: titleOf(c), system: c.system || '', messages: c.messages.map(stored)}, null, 2);
  const parts = ['# ' + titleOf(c)];
  if (c.system) parts.push('**system**\n\n' + c.system);
  for (const m of c.messages) {
    const images = typeof m.content === 'string' ? 0 : m.content.length - 1;
    parts.push('**' + m.role + '**' + (images ? ' (' + images + (images === 1 ? ' image)' : ' images)') : '') + '\n\n' + textOf(m));
  }
  return parts.join('\n\n') + '\n';
}
function download(c, kind) {
  const blob = new Blob([exportText(c, kind)], {type: kind === 'json' ? 'application/json' : 'text/markdown'});
  const a = el('a');
  a.href = URL.createObjectURL(blob);
  a.download = (titleOf(c).replace(/[^\w -]+/g, '').trim().slice(0, 40) || 'chat') + (kind === 'json' ? '.json' : '.md');
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}
function newChat() {
  if (busy) { busy.abort(); setBusy(null); }
  chat = {id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8), title: '', system: '', updated: 0, messages: []};
  omitted = 0;
  pending = [];
  showPending();
  $('log').textContent = '';
  $('system').value = '';
  showChats();
}
function openChat(c) {
  if (c === chat) return;
  if (busy) { busy.abort(); setBusy(null); }
  chat = c;
  omitted = 0;
  $('log').textContent = '';
  $('system').value = c.system || '';
  $('system-box').open = !!c.system;
  for (const m of c.messages) { m.tokens = null; m.role === 'user' ? showUser(m) : showReply(m); }
  showChats();
}

// ---- messages on the page ----
function scroll() { $('log').scrollTop = $('log').scrollHeight; }
function add(role, text) {
  const d = el('div');
  d.className = role === 'note' ? 'note' : 'msg ' + role;
  d.textContent = text;
  $('log').appendChild(d);
  scroll();
  return d;
}
function tag(out, cls, text) { const t = el('span'); t.className = 'tag ' + cls; t.textContent = text; out.appendChild(t); }
// A message's text (its content, or the text parts of a turn holding images).
function textOf(m) { return typeof m.content === 'string' ? m.content : m.content.filter(p => p.type === 'text').map(p => p.text).join(''); }
function copyButton(tools, m) {
  iconButton(tools, 'copy', 'copy this message', async b => {
    const text = textOf(m);
    try { await navigator.clipboard.writeText(text); }
    catch (e) {  // no clipboard API (a page not served from localhost or https)
      const t = el('textarea', document.body);
      t.value = text; t.select(); document.execCommand('copy'); t.remove();
    }
    b.textContent = 'copied';
    setTimeout(() => { b.textContent = 'copy'; }, 1500);
  }).className += ' copy';
}
function showUser(m) {
  m.el = add('user', textOf(m));
  if (typeof m.content !== 'string')
    for (const p of m.content.filter(p => p.type === 'image_url').reverse()) { const i = el('img'); i.src = p.image_url.url; m.el.prepend(i); }
  const tools = el('div', m.el);
  tools.className = 'tools tag';
  copyButton(tools, m);
  iconButton(tools, 'edit', 'edit: the conversation goes back to this message', () => edit(m)).className += ' edit';
}
// A reply's element: reasoning (collapsible, once there is some), the
// rendered text, then its marks and tools once finished.
function replyElement() {
  const out = add('assistant', '');
  el('div', out).className = 'body';
  return out;
}
function showReasoning(out, text, streaming) {
  if (!text) return;
  let think = out.querySelector('details.reasoning');
  if (!think) {
    think = el('details');
    think.className = 'reasoning';
    el('summary', think);
    el('div', think).className = 'text';
    out.prepend(think);
  }
  think.querySelector('summary').textContent = streaming ? 'thinking…' : 'reasoning (' + text.length + ' characters)';
  think.querySelector('.text').textContent = text;
}
function finishReply(m) {
  const out = m.el;
  showReasoning(out, m.reasoning || '', false);
  if (m.mark === 'stopped') tag(out, 'stopped', '(stopped)');
  else if (m.mark === 'length') tag(out, 'cut', '✂ cut off: the reply reached the length limit' + (m.maxTokens ? ' (max tokens)' : ' (the model\'s context)'));
  const tools = el('div', out);
  tools.className = 'tools tag';
  const s = m.stats;
  if (s) {
    const parts = [];
    if (s.ttft != null) parts.push('TTFT ' + s.ttft + ' ms');
    if (s.tps != null) parts.push((s.tps >= 100 ? Math.round(s.tps) : s.tps.toFixed(1)) + ' tokens/s');
    if (s.tokens != null) parts.push(s.tokens + ' tokens');
    const stats = el('span', tools);
    stats.className = 'stats';
    stats.textContent = parts.join(' · ');
  }
  copyButton(tools, m);
  iconButton(tools, 'regenerate', 'ask again for this reply', () => regenerate(m)).className += ' regenerate';
}
function showReply(m) {
  m.el = replyElement();
  markdown(m.el.querySelector('.body'), textOf(m));
  finishReply(m);
}
// Cuts the open conversation at message m (m and everything after it go).
function cutAt(m) {
  const i = chat.messages.indexOf(m);
  if (i < 0) return false;
  if (busy) { busy.abort(); setBusy(null); }
  for (const old of chat.messages.splice(i)) old.el.remove();
  for (const n of $('log').querySelectorAll('.error')) n.remove();
  if (omitted > i) omitted = 0;
  return true;
}
function edit(m) {
  if (!cutAt(m)) return;
  $('input').value = textOf(m);
  pending = typeof m.content === 'string' ? [] : m.content.filter(p => p.type === 'image_url').map(p => p.image_url.url);
  showPending();
  $('input').focus();
  saveChats();
}
function regenerate(m) {
  if (!cutAt(m)) return;
  saveChats();
  complete(chat);
}

// ---- what fits in the context ----
function estimate(m) {  // images: a few hundred soft tokens each
  if (m.tokens != null) return m.tokens;
  const images = typeof m.content === 'string' ? 0 : m.content.length - 1;
  return Math.ceil(textOf(m).length / charsPerToken) + 4 + 300 * images;
}
function reserve() {  // tokens kept free for the reply
  const maxtok = parseInt($('maxtok').value, 10);
  return maxtok > 0 ? maxtok : Math.min(512, Math.max(16, Math.floor(context / 4)));
}
// The first message to send, at least `from`, so that the rest (whole turns,
// starting with a user message, always the last one) and the system prompt
// fit the context with room for the reply.
function firstToSend(conv, system, from) {
  const last = conv.length - 1;
  let first = last, total = estimate(conv[last]) + (system ? estimate(system) : 0);
  const budget = context - reserve();
  for (let i = last - 1; i >= from; i--) {
    total += estimate(conv[i]);
    if (context && total > budget) break;
    if (conv[i].role === 'user') first = i;
  }
  return first;
}
function learn(sent, usage, out) {  // what the server counted, for the next estimates
  if (!usage || !(usage.prompt_tokens > 0)) return;
  const last = sent[sent.length - 1];
  let known = 0, chars = 0;
  for (const m of sent) { chars += textOf(m).length; if (m !== last) known += estimate(m); }
  last.tokens = Math.max(1, usage.prompt_tokens - known);
  if (out && usage.completion_tokens >= 0) out.tokens = usage.completion_tokens + 2;
  if (chars > 0) charsPerToken = Math.max(1, Math.min(6, chars / usage.prompt_tokens));
}
function leaveOut(conv, first) {  // grey out and say what is no longer sent
  if (first <= omitted) return;
  for (const old of document.querySelectorAll('.note.context')) old.remove();
  for (let i = 0; i < first; i++) conv[i].el.classList.add('omitted');
  omitted = first;
  const note = add('note', first + (first === 1 ? ' earlier message is' : ' earlier messages are') +
    ' left out: the conversation no longer fits the model\'s context of ' + context + ' tokens.');
  note.classList.add('context');
  conv[first].el.before(note);
}

// ---- asking for a reply ----
async function send(text, images) {
  // with images, the turn is content parts: the images (data URLs), then the text
  const content = images && images.length ? images.map(url => ({type: 'image_url', image_url: {url}})).concat([{type: 'text', text}]) : text;
  const user = {role: 'user', content, tokens: null};
  showUser(user);
  chat.messages.push(user);
  chat.updated = Date.now();
  saveChats();
  await complete(chat);
}
// Streams the reply to the chat's last (user) message.
async function complete(c) {
  const conv = c.messages;
  const user = conv[conv.length - 1];
  const out = replyElement();
  const body = out.querySelector('.body');
  const ctrl = new AbortController();
  setBusy(ctrl);
  let reply = '', reasoning = '', finish = null, usage = null, sent = [], shown = '', shownThink = '', first = omitted;
  let started = 0, firstAt = 0, lastAt = 0, chunks = 0;  // performance.now() times, and content chunks
  const maxTokens = parseInt($('maxtok').value, 10) > 0;
  const render = () => {
    if (reasoning !== shownThink) { showReasoning(out, reasoning, true); shownThink = reasoning; scroll(); }
    if (reply !== shown) { markdown(body, reply); shown = reply; scroll(); }
  };
  const system = c.system ? {role: 'system', content: c.system, tokens: null} : null;
  try {
    let r;
    for (;;) {
      first = firstToSend(conv, system, first);
      sent = conv.slice(first);
      const req = {model: model || undefined, stream: true, stream_options: {include_usage: true},
                   messages: (system ? [system] : []).concat(sent).map(m => ({role: m.role, content: m.content}))};
      const temp = parseFloat($('temp').value), maxtok = parseInt($('maxtok').value, 10);
      if (!isNaN(temp)) req.temperature = temp;
      if (maxtok > 0) req.max_tokens = maxtok;
      started = performance.now();
      r = await api('/v1/chat/completions', {method: 'POST', body: JSON.stringify(req), signal: ctrl.signal});
      if (r.ok) break;
      const j = await r.json().catch(() => ({}));
      const e = j.error || {};
      const next = conv.findIndex((m, i) => i > first && m.role === 'user');
      // The estimate was short: leave out one more turn and ask again.
      if (e.code === 'context_length_exceeded' && next > first && next < conv.length) { first = next; continue; }
      throw new Error(e.message || r.statusText);
    }
    if (c === chat) leaveOut(conv, first);
    const reader = r.body.getReader();
    ctrl.signal.addEventListener('abort', () => reader.cancel().catch(() => {}));
    const dec = new TextDecoder();
    let buf = '';
    read: for (;;) {
      const {value, done} = await reader.read();
      if (done || ctrl.signal.aborted) break;
      buf += dec.decode(value, {stream: true});
      let cut;
      while ((cut = buf.indexOf('\n\n')) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split('\n')) {
          if (!line.startsWith('data: ')) continue;
          const data = line.slice(6);
          if (data === '[DONE]') break read;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message);
          if (j.usage) usage = j.usage;
          const ch = j.choices && j.choices[0];
          const d = ch && ch.delta;
          if (d && (d.content || d.reasoning_content)) {
            lastAt = performance.now();
            if (!firstAt) firstAt = lastAt;
            chunks++;
            if (d.reasoning_content) reasoning += d.reasoning_content;
            if (d.content) reply += d.content;
          }
          if (ch && ch.finish_reason) finish = ch.finish_reason;
        }
      }
      if (ctrl.signal.aborted) break;
      render();
    }
  } catch (e) {
    if (e.name !== 'AbortError' && !ctrl.signal.aborted && c === chat) add('error', e.message);
  }
  if (busy === ctrl) setBusy(null);
  if (c !== chat || !c.messages.includes(user)) { out.remove(); return; }  // another chat is open, or this one was cut
  render();
  if (reply || reasoning) {
    // tokens/s over the stream after the first token (the first one's wait is
    // TTFT); none when the whole reply came at once
    const tokens = usage && usage.completion_tokens >= 0 ? usage.completion_tokens : chunks;
    const stats = {ttft: firstAt ? Math.round(firstAt - started) : null, tokens,
                   tps: tokens > 1 && lastAt > firstAt ? (tokens - 1) / ((lastAt - firstAt) / 1000) : null};
    const a = {role: 'assistant', content: reply, reasoning, el: out, tokens: null, stats, maxTokens,
               mark: ctrl.signal.aborted ? 'stopped' : finish === 'length' ? 'length' : null};
    conv.push(a);
    learn(sent, usage, a);
    finishReply(a);
    c.updated = Date.now();
    saveChats();
  } else {
    out.remove();
    if (ctrl.signal.aborted && conv[conv.length - 1] === user) { conv.pop(); user.el.remove(); saveChats(); }
  }
}
function setBusy(ctrl) {
  busy = ctrl;
  $('send').textContent = ctrl ? 'Stop' : 'Send';
  $('send').className = ctrl ? 'stop' : '';
}
$('form').addEventListener('submit', ev => {
  ev.preventDefault();
  if (busy) { busy.abort(); return; }
  const text = $('input').value.trim();
  if (!text && !pending.length) return;
  $('input').value = '';
  const images = pending;
  pending = [];
  showPending();
  send(text, images);
});
$('system').addEventListener('change', () => { chat.system = $('system').value.trim(); if (chat.messages.length) saveChats(); });

// ---- images: the file picker, or dropped on the page (models that take them) ----
let pending = [];  // data URLs of the images the next message holds
function showPending() {
  $('pending').textContent = '';
  pending.forEach((url, k) => {
    const t = el('span', $('pending')); t.className = 'thumb';
    const i = el('img', t); i.src = url;
    const x = el('button', t); x.type = 'button'; x.textContent = '×'; x.title = 'remove';
    x.onclick = () => { pending.splice(k, 1); showPending(); };
  });
}
function attach(files) {
  if (!media.includes('image')) { add('error', 'This model takes no images.'); return; }
  for (const f of files) {
    if (!f.type.startsWith('image/')) { add('error', f.name + ': not an image'); continue; }
    const r = new FileReader();
    r.onload = () => { pending.push(r.result); showPending(); };
    r.readAsDataURL(f);
  }
}
$('attach').addEventListener('click', () => $('file').click());
$('file').addEventListener('change', () => { attach($('file').files); $('file').value = ''; });
document.addEventListener('dragover', ev => { ev.preventDefault(); if (media.includes('image')) document.body.classList.add('drop'); });
document.addEventListener('dragleave', ev => { if (!ev.relatedTarget) document.body.classList.remove('drop'); });
document.addEventListener('drop', ev => {
  ev.preventDefault();
  document.body.classList.remove('drop');
  if (ev.dataTransfer && ev.dataTransfer.files.length) attach(ev.dataTransfer.files);
});
$('input').addEventListener('keydown', ev => {
  if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); $('form').requestSubmit(); }
});
$('clear').addEventListener('click', newChat);

loadChats();
newChat();  // the saved ones are in the sidebar
loadModel().then(() => {
  if (media.includes('image')) $('input').placeholder = 'Message (Enter to send, Shift+Enter for a new line; drop an image here)';
});
