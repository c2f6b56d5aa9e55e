// structured.test.cjs — structured output on a real model, end to end: chat
// completions with response_format json_schema / json_object and the grammar
// extension, through the pinned OpenAI client; every reply must parse and
// validate under ajv (with ajv-formats), streamed or not, greedy or sampled,
// whatever the model would rather have said. Also: schemas and grammars that
// cannot be followed are 400s naming the field.
//
// HEARTH_E2E_SERVER  the `hearth` executable (run as `hearth serve --model DIR`)
// HEARTH_DEPS_DIR    where tools/fetch_test_deps.sh installed node_modules
// HEARTH_SOURCE_DIR  the repository (models/default is served)
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const H = require('./harness.cjs');

const SERVER = process.env.HEARTH_E2E_SERVER;
const { SOURCE, DEPS, need } = H;
const MODEL = process.env.HEARTH_E2E_MODEL || path.join(SOURCE, 'models/default');



const startServer = (model = MODEL) => H.startServer(SERVER, ['serve', '--model', model, '--port', '0', '--threads', '2']);

let srv, client, ajv;

before(async () => {
  const { OpenAI } = need('openai');
  // JSON Schema 2020-12 (prefixItems, $defs), the draft OpenAI's structured outputs follow
  const Ajv = require(path.join(DEPS, 'node', 'node_modules', 'ajv', 'dist', '2020')).default;
  need('ajv');
  const addFormats = need('ajv-formats').default;
  ajv = new Ajv({ strict: false, allErrors: true });
  addFormats(ajv);
  srv = await startServer();
  client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  if (!srv) return;
  const code = await H.stopServer(srv);
  assert.equal(code, 0, srv.log.slice(-3000));
});

const SCHEMAS = {
  person: {
    type: 'object',
    properties: { name: { type: 'string' }, age: { type: 'integer', minimum: 0, maximum: 150 }, email: { type: 'string', format: 'email' } },
    required: ['name', 'age'],
    additionalProperties: false,
  },
  nested: {
    type: 'object',
    properties: {
      title: { type: 'string', maxLength: 40 },
      author: { type: 'object', properties: { first: { type: 'string' }, last: { type: 'string' } }, required: ['first', 'last'] },
      chapters: { type: 'array', items: { type: 'object', properties: { n: { type: 'integer' }, pages: { type: 'number', minimum: 0 } }, required: ['n', 'pages'] }, minItems: 1, maxItems: 4 },
    },
    required: ['title', 'author', 'chapters'],
  },
  enums: {
    type: 'object',
    properties: {
      color: { enum: ['red', 'green', 'blue'] },
      size: { type: 'string', enum: ['S', 'M', 'L', 'XL'] },
      count: { const: 3 },
      flags: { type: 'array', items: { type: 'boolean' }, maxItems: 5 },
    },
    required: ['color', 'size', 'count'],
  },
  escapes: {
    type: 'object',
    properties: { quote: { type: 'string', minLength: 1, maxLength: 30 }, path: { type: 'string', pattern: '^[a-z]+(/[a-z]+){1,3}$' } },
    required: ['quote', 'path'],
  },
  numbers: {
    type: 'object',
    properties: {
      score: { type: 'number', minimum: -10, maximum: 10 },
      level: { type: 'integer', exclusiveMinimum: 0, exclusiveMaximum: 10 },
      ratio: { type: 'number', minimum: 0, maximum: 1 },
      big: { type: 'integer', minimum: 1000 },
    },
    required: ['score', 'level', 'ratio', 'big'],
  },
  unions: {
    type: 'object',
    properties: {
      id: { anyOf: [{ type: 'integer' }, { type: 'string', format: 'uuid' }] },
      note: { type: ['string', 'null'] },
      when: { type: 'string', format: 'date' },
    },
    required: ['id', 'note', 'when'],
  },
  tree: {
    $defs: {
      node: {
        type: 'object',
        properties: { label: { type: 'string', maxLength: 12 }, kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 } },
        required: ['label', 'kids'],
        additionalProperties: false,
      },
    },
    $ref: '#/$defs/node',
  },
  list: { type: 'array', items: { type: 'string', maxLength: 20 }, minItems: 2, maxItems: 3 },
  tuple: { type: 'array', prefixItems: [{ type: 'string' }, { type: 'integer' }, { type: 'boolean' }], items: false, minItems: 3 },
  free: { type: 'object', additionalProperties: { type: 'integer' } },
};

const PROMPTS = ['Describe a person.', 'Write JSON for a book.', 'Answer in JSON.'];

async function complete(schema, opts) {
  const r = await client.chat.completions.create({
    model: 'default',
    messages: [{ role: 'user', content: opts.prompt }],
    max_tokens: opts.max_tokens,
    temperature: opts.temperature,
    seed: opts.seed,
    response_format: schema ? { type: 'json_schema', json_schema: { name: 'out', schema, strict: true } } : { type: 'json_object' },
  });
  return r.choices[0];
}

function checkValid(name, schema, text, finish) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    assert.fail(`${name}: not JSON (${e.message}), finish ${finish}: ${JSON.stringify(text)}`);
  }
  if (schema) {
    const ok = ajv.validate(schema, value);
    assert.ok(ok, `${name}: invalid under its schema: ${ajv.errorsText()}\n${text}`);
  } else {
    assert.ok(value && typeof value === 'object' && !Array.isArray(value), `${name}: not a JSON object: ${text}`);
  }
}

test('every schema: greedy and sampled replies parse and validate (ajv)', { timeout: 300000 }, async () => {
  let n = 0;
  for (const [name, schema] of Object.entries(SCHEMAS)) {
    for (const [k, opts] of [
      { prompt: PROMPTS[0], temperature: 0, max_tokens: 120 },
      { prompt: PROMPTS[1], temperature: 1.0, seed: 11, max_tokens: 200 },
      { prompt: PROMPTS[2], temperature: 0.7, seed: 5, max_tokens: 90 },
    ].entries()) {
      const c = await complete(schema, opts);
      assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
      checkValid(`${name}#${k}`, schema, c.message.content, c.finish_reason);
      n++;
    }
  }
  assert.equal(n, Object.keys(SCHEMAS).length * 3);
});

test('json_object: an object every time, also when the budget is small', async () => {
  for (const [i, max_tokens] of [8, 40, 150].entries()) {
    const c = await complete(null, { prompt: PROMPTS[i], temperature: 0.9, seed: i, max_tokens });
    checkValid(`json_object/${max_tokens}`, null, c.message.content, c.finish_reason);
  }
});

test('streamed: the deltas join into a valid document', async () => {
  const schema = SCHEMAS.nested;
  const stream = await client.chat.completions.create({
    model: 'default',
    messages: [{ role: 'user', content: PROMPTS[1] }],
    max_tokens: 160,
    temperature: 0.8,
    seed: 3,
    stream: true,
    response_format: { type: 'json_schema', json_schema: { name: 'book', schema } },
  });
  let text = '';
  let finish = null;
  for await (const ch of stream) {
    if (ch.choices[0]?.delta?.content) text += ch.choices[0].delta.content;
    if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
  }
  assert.ok(finish);
  checkValid('stream', schema, text, finish);
});

test('the grammar extension (GBNF) is followed', async () => {
  const res = await fetch(srv.url + '/v1/chat/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      messages: [{ role: 'user', content: 'Yes or no?' }],
      max_tokens: 30,
      temperature: 1,
      seed: 9,
      grammar: 'root ::= answer "!" ( " " [0-9]{1,3} )?\nanswer ::= "yes" | "no" | "maybe"',
    }),
  });
  assert.equal(res.status, 200);
  const j = await res.json();
  assert.match(j.choices[0].message.content, /^(yes|no|maybe)!( [0-9]{1,3})?$/);
  /* completions (raw prompt) take it too */
  const r2 = await fetch(srv.url + '/v1/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'The number is', max_tokens: 10, grammar: 'root ::= " " [1-9] [0-9]*' }),
  });
  assert.equal(r2.status, 200);
  assert.match((await r2.json()).choices[0].text, /^ [1-9][0-9]*$/);
});

test('what cannot be followed is a 400 naming the field', async () => {
  const cases = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'integer', multipleOf: 3 } } } }, 'response_format', /multipleOf/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { $ref: 'https://example.com/x.json' } } } }, 'response_format', /\$ref/],
    [{ grammar: 'root ::= missing' }, 'grammar', /'missing' is used but never defined/],
    [{ grammar: 'root ::= root "x"' }, 'grammar', /left-recursive/],
    [{ grammar: 'root ::= "a"', response_format: { type: 'json_object' } }, 'grammar', /cannot both/],
  ];
  for (const [extra, param, msg] of cases) {
    const res = await fetch(srv.url + '/v1/chat/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 5, ...extra }),
    });
    assert.equal(res.status, 400, JSON.stringify(extra));
    const j = await res.json();
    assert.equal(j.error.param, param);
    assert.match(j.error.message, msg);
  }
});

// The built-in weights under Qwen2.5's chat template (tools in the Hermes
// syntax; llama.cpp's template, fetched into .deps by tools/fetch_test_deps.sh): a forced
// call's arguments must follow the tool's parameters schema.
test('tool_choice required / named: the arguments follow the tool schema', { timeout: 120000 }, async () => {
  const tpl = path.join(DEPS, 'llama.cpp', 'templates', 'Qwen-Qwen2.5-7B-Instruct.jinja');
  assert.ok(fs.existsSync(tpl), `${tpl} is missing`);
  const top = fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'hearth-tools-'));
  const dir = path.join(top, 'default');
  fs.mkdirSync(dir);
  for (const f of ['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json'])
    fs.symlinkSync(path.join(MODEL, f), path.join(dir, f));
  const cfg = JSON.parse(fs.readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8'));
  cfg.chat_template = fs.readFileSync(tpl, 'utf8');
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg));
  const tsrv = await startServer(dir);
  try {
    const { OpenAI } = need('openai');
    const c = new OpenAI({ baseURL: tsrv.url + '/v1', apiKey: 'unused', maxRetries: 0 });
    const tools = [
      { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 20 }, unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'], additionalProperties: false } } },
      { type: 'function', function: { name: 'add', parameters: { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } }, required: ['a', 'b'] } } },
    ];
    const byName = Object.fromEntries(tools.map((t) => [t.function.name, t.function.parameters]));
    for (const [k, tool_choice] of ['required', { type: 'function', function: { name: 'add' } }, 'required'].entries()) {
      const r = await c.chat.completions.create({
        model: 'default',
        messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
        tools,
        tool_choice,
        max_tokens: 120,
        temperature: 1.0,
        seed: 20 + k,
      });
      const ch = r.choices[0];
      assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify(ch));
      assert.equal(ch.message.tool_calls.length, 1);
      const call = ch.message.tool_calls[0].function;
      if (typeof tool_choice === 'object') assert.equal(call.name, 'add');
      assert.ok(byName[call.name], call.name);
      const args = JSON.parse(call.arguments);
      assert.ok(ajv.validate(byName[call.name], args), `${call.name} ${call.arguments}: ${ajv.errorsText()}`);
    }
  } finally {
    await H.stopServer(tsrv);
    fs.rmSync(top, { recursive: true, force: true });
  }
});

// The built-in model's own template has no tool-call syntax: forced calls use
// the generic format ({"tool_calls": [{"name", "arguments"}]} under a grammar
// of the tools' schemas), parsed into each protocol's calls, streamed or not.
test('generic tool calls: forced calls on a template without a call syntax, every protocol', { timeout: 300000 }, async () => {
  const idx = await (await fetch(srv.url + '/v1')).json();
  assert.equal(idx.capabilities.tool_call_format, 'generic');
  assert.equal(idx.capabilities.tools, true);
  // every object schema above as a tool's parameters
  const objects = Object.entries(SCHEMAS).filter(([n, s]) => s.type === 'object' || n === 'tree');
  assert.ok(objects.length >= 6);
  // a tool whose call fits any budget here: its calls must end as calls (finish tool_calls)
  objects.push(['weather', { type: 'object', properties: { city: { type: 'string', maxLength: 20 }, unit: { enum: ['c', 'f'] } },
    required: ['city', 'unit'], additionalProperties: false }]);
  const tools = objects.map(([name, parameters]) => ({ type: 'function', function: { name: `make_${name}`, description: `Makes a ${name}.`, parameters } }));
  const byName = Object.fromEntries(tools.map((t) => [t.function.name, t.function.parameters]));
  const valid = (name, args, label) => {
    assert.ok(byName[name], `${label}: unknown tool ${name}`);
    assert.ok(ajv.validate(byName[name], args), `${label}: ${name} ${JSON.stringify(args)}: ${ajv.errorsText()}`);
  };
  const messages = [{ role: 'user', content: 'Do it.' }];
  // OpenAI chat: each tool alone (the model's context is short), named and
  // required, whole and streamed; then two tools, the model picking
  const pair = tools.filter((t) => ['make_weather', 'make_enums'].includes(t.function.name));
  let ended = 0;
  const cases = tools.flatMap((t) => [[t.function.name, [t]], ['required', [t]]]).concat([['required', pair], ['make_enums', pair]]);
  for (const [k, [choice, ctools]] of cases.entries()) {
    const tool_choice = choice === 'required' ? 'required' : { type: 'function', function: { name: choice } };
    for (const stream of [false, true]) {
      const label = `chat ${JSON.stringify(tool_choice)} of ${ctools.length} stream=${stream}`;
      const req = { model: 'default', messages, tools: ctools, tool_choice, max_tokens: 250, temperature: 1.0, seed: 40 + k };
      let calls, finish, content;
      if (!stream) {
        const r = await client.chat.completions.create(req);
        ({ finish_reason: finish } = r.choices[0]);
        calls = r.choices[0].message.tool_calls.map((c) => ({ id: c.id, name: c.function.name, arguments: c.function.arguments }));
        content = r.choices[0].message.content;
      } else {
        const s = await client.chat.completions.create({ ...req, stream: true });
        calls = [];
        content = '';
        for await (const ch of s) {
          const d = ch.choices[0]?.delta;
          if (d?.content) content += d.content;
          for (const tc of d?.tool_calls || []) {
            if (!calls[tc.index]) calls[tc.index] = { id: tc.id, name: tc.function.name, arguments: '' };
            calls[tc.index].arguments += tc.function?.arguments || '';
          }
          if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
        }
      }
      // a call the budget cuts is closed by the grammar (finish length), its arguments still valid
      if (calls[0]?.name === 'make_weather') assert.equal(finish, 'tool_calls', label);
      else assert.ok(['tool_calls', 'length'].includes(finish), `${label}: ${finish}`);
      ended += finish === 'tool_calls';
      assert.ok(!content, `${label}: content ${JSON.stringify(content)}`);
      assert.equal(calls.length, 1, label);
      assert.match(calls[0].id, /^call_/);
      if (typeof tool_choice === 'object') assert.equal(calls[0].name, tool_choice.function.name, label);
      valid(calls[0].name, JSON.parse(calls[0].arguments), label);
    }
  }
  assert.ok(ended >= 4, `${ended} calls ended as calls`);
  // Anthropic: tool_choice tool and any, whole and streamed
  const { Anthropic } = need('@anthropic-ai/sdk');
  const anth = new Anthropic({ baseURL: srv.url, apiKey: 'unused', maxRetries: 0 });
  const atools = pair.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters }));
  for (const [k, tool_choice] of [{ type: 'tool', name: 'make_weather' }, { type: 'any' }, { type: 'tool', name: 'make_weather' }].entries()) {
    const req = { model: 'default', max_tokens: 300, temperature: 1.0, messages, tools: atools, tool_choice };
    const whole = await anth.messages.create({ ...req, temperature: 0.8 + k * 0.1 });
    const streamed = await anth.messages.stream(req).finalMessage();
    for (const [label, m] of [['anthropic', whole], ['anthropic stream', streamed]]) {
      if (m.content.some((b) => b.name === 'make_weather')) assert.equal(m.stop_reason, 'tool_use', `${label}: ${JSON.stringify(m)}`);
      else assert.ok(['tool_use', 'max_tokens'].includes(m.stop_reason), `${label}: ${JSON.stringify(m)}`);
      const uses = m.content.filter((b) => b.type === 'tool_use');
      assert.equal(uses.length, 1, label);
      assert.match(uses[0].id, /^toolu_/);
      if (tool_choice.name) assert.equal(uses[0].name, tool_choice.name);
      valid(uses[0].name, uses[0].input, label);
    }
  }
  // Responses: a function_call item
  const r = await client.responses.create({ model: 'default', input: 'Do it.', max_output_tokens: 300,
    tools: pair.map((t) => ({ type: 'function', name: t.function.name, parameters: t.function.parameters })),
    tool_choice: { type: 'function', name: 'make_weather' } });
  const fc = r.output.filter((o) => o.type === 'function_call');
  assert.equal(fc.length, 1, JSON.stringify(r.output));
  assert.equal(fc[0].name, 'make_weather');
  assert.equal(r.status, 'completed');
  // streamed: the completed response's function_call item, its arguments the deltas joined
  const rs = await client.responses.create({ model: 'default', input: 'Do it.', max_output_tokens: 300, stream: true,
    tools: pair.map((t) => ({ type: 'function', name: t.function.name, parameters: t.function.parameters })), tool_choice: 'required' });
  let deltas = '', done = null;
  for await (const ev of rs) {
    if (ev.type === 'response.function_call_arguments.delta') deltas += ev.delta;
    if (ev.type === 'response.completed') done = ev.response;
  }
  const sfc = done.output.filter((o) => o.type === 'function_call');
  assert.equal(sfc.length, 1, JSON.stringify(done.output));
  assert.equal(sfc[0].arguments, deltas);
  valid(sfc[0].name, JSON.parse(sfc[0].arguments), 'responses stream');
  valid(fc[0].name, JSON.parse(fc[0].arguments), 'responses');
  // a template that refuses a system role (Gemma 2's raises): the tools are told in the first user turn
  const tpl = path.join(DEPS, 'llama.cpp', 'templates', 'google-gemma-2-2b-it.jinja');
  assert.ok(fs.existsSync(tpl), `${tpl} is missing`);
  const top = fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'hearth-generic-'));
  const dir = path.join(top, 'default');
  fs.mkdirSync(dir);
  for (const f of ['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json'])
    fs.symlinkSync(path.join(MODEL, f), path.join(dir, f));
  const cfg = JSON.parse(fs.readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8'));
  cfg.chat_template = fs.readFileSync(tpl, 'utf8');
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg));
  const gsrv = await startServer(dir);
  try {
    const { OpenAI } = need('openai');
    const g = new OpenAI({ baseURL: gsrv.url + '/v1', apiKey: 'unused', maxRetries: 0 });
    const r2 = await g.chat.completions.create({ model: 'default', messages, tools: pair, tool_choice: 'required', max_tokens: 200, temperature: 1, seed: 3 });
    assert.equal(r2.choices[0].finish_reason, 'tool_calls', JSON.stringify(r2.choices[0]));
    const call = r2.choices[0].message.tool_calls[0].function;
    valid(call.name, JSON.parse(call.arguments), 'gemma 2 template');
    assert.ok(r2.usage.prompt_tokens > 100, `the tools are in the prompt (${r2.usage.prompt_tokens} tokens)`);
    // a system message of the request's own is still the template's to refuse
    await assert.rejects(g.chat.completions.create({ model: 'default', messages: [{ role: 'system', content: 's' }, ...messages], max_tokens: 2 }),
      (e) => e.status === 400 && /System role/.test(e.message));
  } finally {
    await H.stopServer(gsrv);
    fs.rmSync(top, { recursive: true, force: true });
  }
  // auto: no grammar; whatever the model writes is content or a generic call, never an error
  const auto = await client.chat.completions.create({ model: 'default', messages, tools: pair, max_tokens: 8, temperature: 0 });
  assert.ok(['stop', 'length', 'tool_calls'].includes(auto.choices[0].finish_reason));
});
