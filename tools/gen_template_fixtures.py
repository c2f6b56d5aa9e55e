#!/usr/bin/env python3
"""Generates the chat-template fixtures hearth's Jinja2 engine is tested against.

Renders, with Python Jinja2 set up exactly as Hugging Face's apply_chat_template
does (ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks, loopcontrols),
tojson = json.dumps(ensure_ascii=False, ...), raise_exception, strftime_now at a
fixed time):

  * llama.cpp's chat templates of published models (LLAMA_CPP_TEMPLATES below,
    from <deps>/llama.cpp/templates, fetched by tools/fetch_test_deps.sh), the chat templates
    of .deps/tokenizers/{qwen3,gemma3,llama3_1,deepseek_v3}/tokenizer_config.json
    and Gemma 4's (tests/fixtures/templates/gemma4/chat_template.jinja: no
    package this project fetches from ships it; see the README beside it for
    where it comes from) over the conversations below (written to
    conversations.json), with add_generation_prompt true and false -> expected.json;
  * a list of small expression / statement cases -> cases.json;
  * seeded random templates (expressions, statements, whitespace control) over a
    fixed context -> random_cases.json.

The templates themselves are not copied (Gemma 4's aside): expected.json names
them and the test reads them from .deps and the fixtures at run time. Outputs are stored as
(base case, kept prefix length in bytes, tail) to keep the file small.

usage: tools/gen_template_fixtures.py [--deps .deps]
"""
import argparse
import datetime
import glob
import json
import os
import sys

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = 1721989800  # 2024-07-26 10:30:00 UTC


class GenerationTag(Extension):
    """HF's AssistantTracker: {% generation %}...{% endgeneration %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(FIXED_NOW, tz=datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, context):
    """Returns {"output": str} or {"error": {"type": name, "message": str}}."""
    try:
        tpl = env.from_string(source)
        return {"output": tpl.render(**context)}
    except Exception as e:  # noqa: BLE001 - any exception is the expected outcome
        return {"error": {"type": type(e).__name__, "message": str(e)}}


# ---------------------------------------------------------------- conversations

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
            },
            "required": ["location"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_web",
        "description": "Search the web and return the top results.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "The search query"},
                "max_results": {"type": "integer", "description": "How many results", "default": 5,
                                "minimum": 1, "maximum": 20},
                "safe": {"type": "boolean"},
                "filters": {"type": "array", "items": {"type": "string"}, "description": "Domain filters"},
            },
            "required": ["query"],
        },
    },
}
CALC = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string"},
                "precision": {"type": "number", "description": "Decimal places"},
                "options": {"type": "object", "properties": {"radians": {"type": "boolean"}},
                            "description": "Extra options"},
            },
            "required": ["expression"],
        },
    },
}


BOOK = {  # nested objects, arrays of objects, enums, nullable: what Gemma 4's declaration format spells out
    "type": "function",
    "function": {
        "name": "book_trip",
        "description": "Book a trip for some travellers.",
        "parameters": {
            "type": "object",
            "properties": {
                "travellers": {"type": "array", "description": "Who travels",
                               "items": {"type": "object", "properties": {
                                   "name": {"type": "string", "description": "Full name"},
                                   "age": {"type": "integer"}}, "required": ["name"]}},
                "cabin": {"type": "string", "enum": ["economy", "business"], "nullable": True},
                "dates": {"type": "object", "description": "Travel dates", "properties": {
                    "depart": {"type": "string"}, "return": {"type": "string", "description": "optional"}},
                          "required": ["depart"]},
                "tags": {"type": ["array", "null"], "items": {"type": "string"}},
            },
            "required": ["travellers", "dates"],
        },
        "response": {"type": "object", "description": "The booking"},
    },
}


def call(cid, name, args, string_args=False):
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if string_args else args}}


def sys_(t):
    return {"role": "system", "content": t}


def user(t):
    return {"role": "user", "content": t}


def asst(t):
    return {"role": "assistant", "content": t}


def tool_result(cid, name, content):
    return {"role": "tool", "tool_call_id": cid, "name": name, "content": content}


def conversations():
    c = []

    def add(name, messages, tools=None, kwargs=None):
        item = {"name": name, "messages": messages}
        if tools is not None:
            item["tools"] = tools
        if kwargs is not None:
            item["kwargs"] = kwargs
        c.append(item)

    add("single_user", [user("Hello!")])
    add("system_user", [sys_("You are a helpful assistant."), user("What is 2+2?")])
    add("two_turns", [user("Hi"), asst("Hello! How can I help?"), user("Tell me a joke.")])
    add("system_three_turns", [sys_("Be terse."), user("Capital of France?"), asst("Paris."),
                               user("And of Italy?"), asst("Rome."), user("Spain?")])
    add("ends_with_assistant", [user("Say hi"), asst("Hi!")])
    add("ten_turns", sum([[user(f"Question number {i}: what is {i} squared?"), asst(f"{i} squared is {i*i}.")]
                          for i in range(1, 6)], []))
    add("unicode", [sys_("Tu es un assistant. 日本語も話せます。"),
                    user("¿Qué tal? Ünïcödé — “quotes” ‘single’ emoji 🎉🚀 and tab\tend"),
                    asst("Très bien ! 很好。"), user("Ελληνικά; עברית; العربية")])
    add("whitespace_content", [user("  leading and trailing spaces  \n\n"), asst("\nreply with newlines\n"),
                               user("\ttabbed\t")])
    add("empty_content", [user(""), asst(""), user("after empties")])
    add("multiline", [sys_("Line one.\nLine two.\n\nLine four."), user("```python\nprint('hi')\n```\nExplain."),
                      asst("It prints:\n\n    hi\n"), user("Thanks!\n")])
    add("quotes_and_braces", [user("Use {{ braces }} and {% tags %} and {# comments #} literally; 'single' \"double\" \\backslash")])
    add("content_parts", [{"role": "user", "content": [{"type": "text", "text": "Describe this:"},
                                                       {"type": "text", "text": " two parts."}]}])
    add("content_parts_system", [{"role": "system", "content": [{"type": "text", "text": "System as parts."}]},
                                 {"role": "user", "content": [{"type": "text", "text": "Hi in parts"}]},
                                 {"role": "assistant", "content": [{"type": "text", "text": "Reply in parts"}]},
                                 {"role": "user", "content": [{"type": "text", "text": "Again"}]}])
    add("content_image_part", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the image?"}]}])
    add("tools_no_call", [user("What's the weather in Paris?")], tools=[WEATHER])
    add("tools_system", [sys_("You are a weather bot."), user("Weather in Tokyo in fahrenheit?")], tools=[WEATHER, SEARCH])
    add("tool_call_dict_args", [user("Weather in Paris?"),
                                {"role": "assistant", "content": None, "tool_calls": [call("call_1", "get_weather", {"location": "Paris, France"})]},
                                tool_result("call_1", "get_weather", "{\"temperature\": 21, \"condition\": \"sunny\"}"),
                                ], tools=[WEATHER])
    add("tool_call_dict_args_answer", [sys_("Use tools when needed."), user("Weather in Paris?"),
                                       {"role": "assistant", "content": "", "tool_calls": [call("call_1", "get_weather", {"location": "Paris, France", "unit": "celsius"})]},
                                       tool_result("call_1", "get_weather", "21 degrees and sunny"),
                                       asst("It is 21°C and sunny in Paris."), user("Thanks")], tools=[WEATHER])
    add("tool_call_string_args", [user("Search for hearth runtime"),
                                  {"role": "assistant", "content": None, "tool_calls": [call("call_9", "search_web", {"query": "hearth runtime", "max_results": 3}, string_args=True)]},
                                  tool_result("call_9", "search_web", "[\"result one\", \"result two\"]")], tools=[SEARCH])
    add("two_tool_calls", [user("Weather in Paris and Rome?"),
                           {"role": "assistant", "content": None, "tool_calls": [
                               call("call_a", "get_weather", {"location": "Paris"}),
                               call("call_b", "get_weather", {"location": "Rome"})]},
                           tool_result("call_a", "get_weather", "18C"),
                           tool_result("call_b", "get_weather", "25C"),
                           ], tools=[WEATHER])
    add("two_tool_calls_string", [user("Compute 2*3 and search it"),
                                  {"role": "assistant", "content": None, "tool_calls": [
                                      call("c1", "calculate", {"expression": "2*3"}, string_args=True),
                                      call("c2", "search_web", {"query": "6"}, string_args=True)]},
                                  tool_result("c1", "calculate", "6"), tool_result("c2", "search_web", "six")],
        tools=[CALC, SEARCH])
    add("tool_call_with_content", [user("Weather?"),
                                   {"role": "assistant", "content": "Let me check that for you.",
                                    "tool_calls": [call("call_x", "get_weather", {"location": "Oslo", "unit": "celsius"})]},
                                   tool_result("call_x", "get_weather", "-3C, snow"),
                                   asst("It's -3°C with snow in Oslo.")], tools=[WEATHER])
    add("tool_call_nested_args", [user("calc"),
                                  {"role": "assistant", "content": None, "tool_calls": [
                                      call("n1", "calculate", {"expression": "sin(1)", "precision": 2.5,
                                                               "options": {"radians": True, "list": [1, 2.0, None, "x"]}})]},
                                  tool_result("n1", "calculate", "0.84")], tools=[CALC])
    add("three_tools_listed", [sys_("You can use tools."), user("hi")], tools=[WEATHER, SEARCH, CALC])
    add("tool_result_then_user", [user("Weather in Paris?"),
                                  {"role": "assistant", "content": None, "tool_calls": [call("call_1", "get_weather", {"location": "Paris"})]},
                                  tool_result("call_1", "get_weather", "sunny"),
                                  asst("Sunny."), user("And tomorrow?")], tools=[WEATHER])
    add("thinking_on", [user("Solve 12*13")], kwargs={"enable_thinking": True})
    add("thinking_off", [user("Solve 12*13")], kwargs={"enable_thinking": False})
    add("thinking_off_multi", [user("Hi"), asst("Hello"), user("Again")], kwargs={"enable_thinking": False})
    add("reasoning_content", [user("What is 7*8?"),
                              {"role": "assistant", "content": "56", "reasoning_content": "7 times 8 is 56."},
                              user("And 9*9?")])
    add("reasoning_content_last", [user("What is 7*8?"),
                                   {"role": "assistant", "content": "56", "reasoning_content": "Multiply: 56."}])
    add("think_tags_in_content", [user("Think first"), asst("<think>\nLet me think.\n</think>\n\nThe answer is 4."),
                                  user("ok")])
    add("reasoning_effort", [sys_("Be helpful."), user("Hi")], kwargs={"reasoning_effort": "low"})
    add("system_only", [sys_("Only a system prompt.")])
    add("odd_user_user", [user("first"), user("second")])
    add("odd_assistant_first", [asst("I speak first."), user("ok")])
    add("odd_system_middle", [user("hi"), sys_("late system"), user("hello")])
    add("odd_tool_without_call", [user("hi"), tool_result("zzz", "get_weather", "orphan result")])
    add("numbers_in_content", [user("42"), asst("3.14"), user("1e10")])
    add("long_system", [sys_("Rules:\n" + "\n".join(f"{i}. Rule number {i} with some text." for i in range(1, 21))),
                        user("Follow the rules.")])
    add("extra_fields", [{"role": "user", "content": "hi", "name": "alice"}, asst("hello alice")])
    add("documents_kwarg", [user("Summarize the documents.")],
        kwargs={"documents": [{"title": "Doc A", "text": "Alpha text."}, {"title": "Doc B", "text": "Beta text."}]})
    add("tools_and_thinking", [user("Weather in Paris?")], tools=[WEATHER], kwargs={"enable_thinking": False})
    add("custom_date", [sys_("sys"), user("What is today's date?")], kwargs={"date_string": "01 Jan 2025"})
    add("builtin_tools", [sys_("Environment test"), user("Search for cats")], tools=[SEARCH],
        kwargs={"builtin_tools": ["brave_search", "wolfram_alpha"]})
    add("assistant_prefill_thinking", [user("Hello"), asst("<think>\n\n</think>\n\nHi there")],
        kwargs={"enable_thinking": True})
    add("tool_with_no_params", [user("ping")], tools=[{"type": "function", "function": {
        "name": "ping", "description": "Ping the server", "parameters": {"type": "object", "properties": {}}}}])
    add("many_turns_with_tools", [sys_("sys"), user("u1"), asst("a1"), user("u2"),
                                  {"role": "assistant", "content": None, "tool_calls": [call("t1", "get_weather", {"location": "Berlin"})]},
                                  tool_result("t1", "get_weather", "cloudy"), asst("Cloudy in Berlin."), user("u3")],
        tools=[WEATHER])
    # Gemma 4's own conventions: tool results as the model turn's tool_responses, reasoning in a
    # <|channel>thought ... <channel|> block of an earlier answer, thinking switched on
    add("g4_tool_responses", [sys_("You plan trips."), user("Weather in Paris, then book it for Ann."),
                              {"role": "assistant", "content": None, "tool_calls": [
                                  call("c1", "get_weather", {"location": "Paris, France", "unit": "celsius"})]},
                              {"role": "assistant", "tool_responses": [
                                  {"name": "get_weather", "response": {"temperature": 21, "condition": "sunny",
                                                                       "wind": {"kph": 12.5, "gusts": None}}}]},
                              {"role": "assistant", "content": "<|channel>thought\nIt is sunny; book it.<channel|>Sunny, booking now.",
                               "tool_calls": [call("c2", "book_trip", {"travellers": [{"name": "Ann", "age": 31}],
                                                                       "dates": {"depart": "2025-05-01"}, "cabin": None,
                                                                       "tags": ["spring", "city"], "flexible": True})]},
                              {"role": "assistant", "tool_responses": [{"name": "book_trip", "response": "booked: #42"}]},
                              ], tools=[WEATHER, BOOK], kwargs={"enable_thinking": True})
    add("g4_reasoning_history", [user("What is 7*8?"),
                                 asst("<|channel>thought\n7 times 8 is 56.<channel|>56"),
                                 user("And 9*9?")], kwargs={"enable_thinking": True})
    add("g4_tool_response_answer", [user("Weather?"),
                                    {"role": "assistant", "content": "", "tool_calls": [call("c1", "get_weather", {"location": "Oslo"})]},
                                    {"role": "assistant", "tool_responses": [{"name": "get_weather", "response": "-3C, snow"}],
                                     "content": "It is -3°C with snow."},
                                    user("Thanks")], tools=[WEATHER, BOOK, CALC], kwargs={"enable_thinking": False})
    add("g4_developer_parts", [{"role": "developer", "content": "  Be brief.  "},
                               {"role": "user", "content": [{"type": "text", "text": " Look: "}, {"type": "image"},
                                                            {"type": "audio"}, {"type": "video"}]}])
    return c


# ---------------------------------------------------------------- small cases

CASES = [
    # literals and printing
    ("{{ 1 }}|{{ 1.0 }}|{{ 1.5e3 }}|{{ 1e20 }}|{{ 1e-5 }}|{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 1e15 }}|{{ -0.0 }}", {}),
    ("{{ 'a' }}{{ \"b\" }}{{ 'c' 'd' }}|{{ 'tab\\there' }}|{{ 'nl\\nx' }}|{{ '\\u00e9\\x41' }}", {}),
    ("{{ True }}{{ true }}{{ False }}{{ none }}{{ None }}", {}),
    ("{{ [1, 'a', none, true, 2.5] }}|{{ {'a': 1, 'b': [1, 2], 'c': {'d': none}} }}|{{ (1,) }}|{{ (1, 2) }}|{{ () }}", {}),
    ("{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'back\\\\slash', 'nl\\n'] }}", {}),
    ("{{ x }}|{{ x.y if x is defined else 'u' }}", {}),
    ("{{ d }}|{{ d.a }}|{{ d['b'] }}|{{ d.missing }}|{{ l }}|{{ l[0] }}|{{ l[-1] }}|{{ l[9] }}", {"d": {"a": 1, "b": "two"}, "l": [1, 2, 3]}),
    # arithmetic
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }}", {}),
    ("{{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ 10 - 2 - 3 }} {{ -3 + 1 }} {{ +3 }} {{ 1.5 * 2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", {}),
    ("{{ 'ab' * 3 }}{{ 3 * 'x' }}{{ [1] * 2 }}{{ 'a' + 'b' }}{{ [1] + [2] }}{{ 'a' ~ 1 ~ none ~ true ~ [1] }}", {}),
    ("{{ true + 1 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ 'B' < 'a' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}", {}),
    ("{{ 1 + 'a' }}", {}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ 1 < 'a' }}", {}),
    # logic
    ("{{ 1 and 2 }} {{ 0 and 2 }} {{ 0 or 'x' }} {{ '' or [] }} {{ not 0 }} {{ not 'a' }} {{ none or 5 }} {{ 'a' if 0 else 'b' }} {{ 'y' if 1 }}|{{ 'y' if 0 }}|", {}),
    ("{{ 'a' in 'cat' }} {{ 'z' not in 'cat' }} {{ 1 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ '' in 'x' }}", {}),
    ("{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 1 is number }} {{ 1.0 is float }} {{ 1 is integer }} {{ true is integer }} {{ true is number }}", {}),
    ("{{ 'a' is string }} {{ [] is iterable }} {{ 'a' is iterable }} {{ {} is mapping }} {{ [] is mapping }} {{ true is boolean }} {{ true is true }} {{ 1 is true }} {{ false is false }}", {}),
    ("{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 'a' is equalto 'a' }} {{ 2 is eq 2 }} {{ 2 is ne 3 }} {{ 1 is lt 2 }} {{ 2 is gt 1 }} {{ 2 is le 2 }} {{ 2 is ge 3 }}", {}),
    ("{{ 'x' is in 'xyz' }} {{ none is sameas none }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aB' is lower }} {{ range is callable }} {{ 'a' is callable }} {{ x is not defined }} {{ 1 is not string }}", {}),
    # strings and methods
    ("{{ '  hi  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  hi'.lstrip() }}|{{ 'hi  '.rstrip() }}|{{ '\\n\\nhi\\n'.strip('\\n') }}", {}),
    ("{{ 'a,b,,c'.split(',') }}{{ ' a  b c '.split() }}{{ 'a b c'.split(' ', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ 'x'.split('x') }}", {}),
    ("{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'Hello World'.upper() }} {{ 'Hello World'.lower() }}", {}),
    ("{{ 'hello wORLD it\\'s'.title() }}|{{ 'hELLO world'.capitalize() }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'abc'.replace('', '-') }}", {}),
    ("{{ '{} and {}'.format(1, 'two') }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{name}!'.format(name='x') }}|{{ ', '.join(['a', 'b']) }}", {}),
    ("{{ 'banana'.count('a') }} {{ 'banana'.find('n') }} {{ 'banana'.find('z') }} {{ 'banana'.rfind('a') }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }}", {}),
    ("{{ 'héllo wörld'.upper() }} {{ 'ÉCOLE'.lower() }} {{ 'héllo'[1] }} {{ 'héllo'[1:3] }} {{ 'héllo'|length }} {{ 'abcdef'[::2] }} {{ 'abc'[::-1] }} {{ 'abcdef'[-2:] }} {{ 'abcdef'[:-2] }}", {}),
    ("{{ [1, 2, 3, 4, 5][1:3] }} {{ [1, 2, 3, 4, 5][::-1] }} {{ [1, 2, 3, 4, 5][::2] }} {{ [1, 2, 3][5:] }} {{ [1, 2, 3][-5:2] }} {{ [1, 2, 3, 4][3:0:-1] }}", {}),
    ("{{ d.items() }} {{ d.keys() }} {{ d.values() }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 9) }}", {"d": {"a": 1, "b": 2}}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"z": 1, "a": 2, "m": 3}}),
    ("{{ l.append(4) }}", {"l": [1]}),
    ("{{ d.update({'a': 2}) }}", {"d": {}}),
    ("{{ l.index(2) }} {{ l.count(1) }}", {"l": [1, 2, 1]}),
    # filters
    ("{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ [3, 1, 2]|sort(reverse=true) }}", {}),
    ("{{ users|sort(attribute='age')|map(attribute='name')|join(', ') }}|{{ users|map(attribute='name')|list }}|{{ users|selectattr('age', 'gt', 30)|list|length }}", {"users": [{"name": "Ann", "age": 40}, {"name": "Bob", "age": 25}, {"name": "Cy", "age": 33}]}),
    ("{{ users|selectattr('admin')|map(attribute='name')|list }} {{ users|rejectattr('admin')|map(attribute='name')|list }} {{ users|selectattr('name', 'equalto', 'Bob')|first }}", {"users": [{"name": "Ann", "admin": True}, {"name": "Bob"}, {"name": "Cy", "admin": False}]}),
    ("{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} {{ [0, 1, '', 'a', none]|select|list }} {{ ['a', 1, 'b']|select('string')|list }}", {}),
    ("{{ ['a', 'b']|map('upper')|list }} {{ [1.5, 2.5]|map('int')|list }} {{ [[1, 2], [3]]|map('length')|list }} {{ [1, 'a']|map('string')|join('-') }}", {}),
    ("{{ [1, 2, 2, 3, 1]|unique|list }} {{ ['a', 'A', 'b']|unique|list }} {{ [1, 2, 3]|sum }} {{ [1, 2, 3]|min }} {{ [1, 2, 3]|max }} {{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }} {{ 'abc'|last }}", {}),
    ("{{ [1, 2, 3]|reverse|list }} {{ 'abc'|reverse }} {{ [1, 2, 3]|length }} {{ {'a': 1}|length }} {{ 'abc'|count }} {{ [3, 1]|list }} {{ 'ab'|list }} {{ {'a': 1, 'b': 2}|list }}", {}),
    ("{{ '  x  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'hello'|upper }}|{{ 'HeLLo'|lower }}|{{ 'hello world'|capitalize }}|{{ 'hello world-foo (bar)'|title }}|{{ 'a-b'|replace('-', '+') }}", {}),
    ("{{ x|default('dflt') }}|{{ none|default('n') }}|{{ ''|default('e', true) }}|{{ 0|d(5) }}|{{ x|d }}|{{ 'set'|default('no') }}", {}),
    ("{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '0x1A'|int(0, 16) }} {{ '3.5'|float }} {{ 'y'|float }} {{ 2|float }} {{ -3|abs }} {{ -2.5|abs }}", {}),
    ("{{ 42|string }}{{ [1]|string }}{{ none|string }}|{{ 3.14159|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.1|round(method='ceil') }} {{ 2.9|round(0, 'floor') }}", {}),
    ("{{ d|items|list }} {{ d|dictsort }} {{ d|dictsort(reverse=true) }} {{ d|dictsort(by='value') }}", {"d": {"b": 2, "a": 3, "C": 1}}),
    ("{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x\\ny'|indent('> ') }}", {}),
    ("{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape }} {{ '<i>'|safe }} {{ 'one two  three'|wordcount }}", {}),
    ("{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 'x')|list }} {{ [{'v': 1}, {'v': 2}]|sum(attribute='v') }} {{ ['b', 'a']|join }}", {}),
    ("{{ {'a': 'é', 'n': [1, 2.5, none, true], 'q': 'say \"hi\"\\n'}|tojson }}", {}),
    ("{{ {'a': {'b': [1, {}], 'c': []}}|tojson(indent=2) }}", {}),
    ("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }} {{ [1, 2]|tojson(separators=(',', ':')) }} {{ 'é'|tojson(ensure_ascii=true) }} {{ 1.0|tojson }} {{ 'x'|tojson }}", {}),
    ("{{ x|tojson }}", {}),
    ("{{ users|map(attribute='name')|join(', ') }} {{ users|join(', ', attribute='age') }}", {"users": [{"name": "A", "age": 1}, {"name": "B", "age": 2}]}),
    ("{{ ['x', 'y']|join(', ') }}{{ [1, 2]|join }}{{ x|join }}", {}),
    ("{{ 'hello %s, you are %d'|format('Ann', 30) }}|{{ '%s' % 'x' }}|{{ '%.2f' % 3.14159 }}", {}),
    ("{{ [{'a': {'b': 5}}]|map(attribute='a.b')|list }} {{ [[1, 2], [3, 4]]|map(attribute='0')|list }} {{ [{'x': 1}, {}]|map(attribute='x', default=0)|list }}", {}),
    ("{{ [1, 2, 3]|select('gt', 1)|list }} {{ [1, 2, 3]|select('in', [1, 3])|list }} {{ ['a', 'b']|select('equalto', 'b')|list }}", {}),
    # statements
    ("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", {}),
    ("{% for x in 'abc' %}{{ loop.previtem|default('-') }}{{ x }}{{ loop.nextitem|default('-') }} {% endfor %}", {}),
    ("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.index }}{{ loop.length }} {% else %}empty{% endfor %}", {}),
    ("{% for x in [] %}{{ x }}{% else %}nothing{% endfor %}|{% for x in none %}{% else %}none-iter{% endfor %}", {}),
    ("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %}{% for a, b in [(1, 2), (3, 4)] %}[{{ a }}{{ b }}]{% endfor %}", {}),
    ("{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }}", {}),
    ("{% for outer in [1, 2] %}{% for inner in 'ab' %}{{ outer }}{{ inner }}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("{% set x = 0 %}{% for i in [1, 2, 3] %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}", {}),
    ("{% set ns = namespace(total=0, items=[]) %}{% for i in [1, 2, 3] %}{% set ns.total = ns.total + i %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.total }} {{ ns.items }} {{ ns }}", {}),
    ("{% if true %}{% set y = 5 %}{% endif %}{{ y }}|{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set c = [1, 2] %}{{ c }}", {}),
    ("{% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]{% set up | upper %}shout{% endset %}{{ up }}", {}),
    ("{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', 'Hi') }} {{ greet(greeting='Yo', name='Cy') }} {{ greet() }}", {}),
    ("{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}", {}),
    ("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 }}{% endcall %}", {}),
    ("{% macro row(x) %}[{{ caller(x * 2) }}]{% endmacro %}{% call(v) row(4) %}got {{ v }}{% endcall %}", {}),
    ("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}),
    ("{% filter upper %}hello {{ 'world' }}{% endfilter %}|{% filter replace('a', 'o') | upper %}banana{% endfilter %}", {}),
    ("{% raw %}{{ not rendered }} {% if %}{% endraw %}|{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}", {}),
    ("{# a comment #}x{#- trimmed -#}  y {{- ' z ' -}} w", {}),
    ("{% generation %}gen {{ 1 }}{% endgeneration %}", {}),
    ("{{ raise_exception('custom failure: ' ~ 3) }}", {}),
    ("{{ undefined_fn() }}", {}),
    ("{{ x.y }}", {}),
    ("{{ d.a.b }}", {"d": {}}),
    ("{{ x + 1 }}", {}),
    ("{% for %}", {}),
    ("{% if x %}unclosed", {}),
    ("{{ 1 + }}", {}),
    ("{% foo %}", {}),
    ("{{ 'unterminated }}", {}),
    ("{{ strftime_now('%Y-%m-%d %d %b %Y') }}", {}),
    ("{% set x = 1 %}{% macro m() %}{{ x }}{{ y }}{% endmacro %}{% set x = 2 %}{% set y = 3 %}{{ m() }}", {}),
    ("{% for i in [1] %}{% set z = 5 %}{% macro m() %}{{ z }}{% endmacro %}{{ m() }}{% endfor %}", {}),
    ("{% if false %}{{ x|no_such_filter }}{% endif %}", {}),
    ("{{ x is no_such_test }}", {}),
    ("{% for x in [1, 2] %}{{ x }}{% else %}{{ x }}{% endfor %}|{{ [1, 2, 3]|map('int')|first }}|{% set l = [1, 2] %}{% for x in l|reverse %}{{ x }}{% endfor %}{{ l|reverse|list }}", {}),
    ("{{ (1, 2, 3)[1:] }} {{ 1 is none }}{{ [] is sequence }}{{ 'x' is sequence }} {{ 2 ** 0.5 }} {{ 1.0 / 3 }} {{ 5 // 0 }}", {}),
    ("{{ [1]|map('string')|length }}", {}),
    ("{% set g = [1, 2, 3]|select %}{{ g|first }}{{ g|list }}{{ g|list }}|{% set h = [1, 2, 3]|map('string') %}{{ '2' in h }}{{ h|list }}|{% set r = [1, 2]|reverse %}{% for x in r %}{{ x }}{% endfor %}{% for x in r %}{{ x }}{% else %}used{% endfor %}", {}),
    ("{{ [1]|select|tojson }}", {}),
    ("{{ {'a': 1}.items()[0] }}", {}),
    ("{% if [0]|select %}generators are true{% endif %}{% if {}.items() %}x{% else %}empty view is false{% endif %}", {}),
    ("{{ 'a'|safe + '<b>' }} {{ '<'|e ~ '<' }} {{ ('<'|safe) * 2 }} {{ '<x>'|e|e }} {{ '<x>'|forceescape }} {{ ('<'|safe + '>')|upper }}", {}),
    ("{{ range(100001)|length }}", {}),
    ("{% set r = joiner(', ') %}{% for x in 'abc' %}{{ r() }}{{ x }}{% endfor %}", {}),
    ("{{ dict(a=1, b=2) }} {{ namespace(a=1).a }} {{ dict({'x': 1}, y=2) }}", {}),
    ("{{ ['a', 'b']|map('upper')|join(',') if true else '' }}|{{ (1, 2)|list }}|{{ [1, [2, [3]]]|tojson }}", {}),
    ("{{ messages[0].content.split(' ')|length }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages[-1]['role'] }}", {"messages": [{"role": "user", "content": "a b c"}, {"role": "assistant", "content": "x"}]}),
    ("{{ 'x' if none is none else 'y' }} {{ 1 if [] else 2 }} {{ ('a' ~ 'b')|upper }} {{ -2|abs }} {{ -(2) }} {{ not true == false }}", {}),
    ("{{ foo.bar|default('fb') }}", {"foo": {}}),
    ("{{ loop }}", {}),
    ("{% for a in [[1, 2]] %}{% for b in a %}{{ loop.depth }}{% endfor %}{{ loop.depth0 }}{% endfor %}", {}),
    ("{{ 10**18 * 9 }} {{ -2**63 }}", {}),
    ("{{ '%s' }}|{{ 1 if 1 else 2 if 2 else 3 }}|{{ [1, 2][0:1] + [3] }}", {}),
    ("{{ 'abc' == 'abc' }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ none == none }} {{ x == x }} {{ 1 != 1.0 }}", {}),
    ("{{ 1e300 * 1e10 }} {{ 123456789012345678 }} {{ 0.000123 }} {{ 1/3 }} {{ 2/3 }} {{ 100.0 }} {{ 1.23e-10 }} {{ 12345678901234567.0 }}", {}),
    # whitespace control
    ("  {% if true %}\n  yes\n  {% endif %}\nend", {}),
    ("a\n    {% for x in [1, 2] %}\n    {{ x }}\n    {% endfor %}\nb", {}),
    ("a {%- if true -%} b {%- endif -%} c\n{{- 'd' }}\n{{ 'e' -}}\n  f", {}),
    ("line1\n{%+ if true %}kept{% endif %}\n  {%+ if true %}x{% endif %}\n{% if true +%}\ny{% endif %}", {}),
    ("x  {# c #}\n  {# c2 #}  \ny\n\t{% set a = 1 %}\nz", {}),
    ("{% raw -%}  raw  {%- endraw %}|\n  {% raw %}\nr\n  {% endraw %}\nend", {}),
    ("trailing newline kept? \n", {}),
    ("crlf\r\nline\r{{ 1 }}\r\n", {}),
    ("{% if true %}\n\n{% endif %}\n\n{{ 'x' }}\n{%- if true %}\n{% endif -%}\n\nq", {}),
]


# ---------------------------------------------------------------- random differential cases
# Seeded random templates over Jinja2's expression language, statements and whitespace
# control. Outputs that print a Python object address (generators) are left out.

R_ATOMS = ["0", "1", "2", "3", "-1", "7", "10", "0.5", "2.0", "1e20", "-1.5", "3.75", "'a'", "'Hello World'", "'  x '",
           "'é'", "''", "'a,b,c'", "'<t>'", "none", "true", "false", "[]", "[1, 2, 3]", "['b', 'a', 'C']", "{}",
           "{'k': 1, 'j': 'v'}", "(1, 2)", "s", "n", "f", "l", "d", "u", "m", "m[0]", "m[1].content", "d.k", "l[0]",
           "s[1:]", "l[::-1]", "ns.v"]
R_FILTERS = ["length", "upper", "lower", "trim", "first", "last", "list", "string", "int", "float", "abs", "sort",
             "unique", "reverse", "join", "join(', ')", "tojson", "tojson(indent=2)", "default('z')", "d(0, true)",
             "capitalize", "title", "items", "dictsort", "sum", "min", "max", "round", "round(1)", "replace('a', 'b')",
             "indent(2)", "map('string')", "select", "reject", "selectattr('role', 'equalto', 'user')",
             "map(attribute='role')", "batch(2)", "wordcount", "e", "safe", "count", "center(9)"]
R_TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence",
           "boolean", "true", "false", "odd", "even", "lower", "upper", "callable", "eq 1", "in [1, 'a']",
           "divisibleby 2", "sameas none", "gt 1", "ne 'a'"]
R_METHODS = ["upper()", "lower()", "strip()", "split()", "split(',')", "startswith('a')", "endswith('x')", "title()",
             "replace('l', 'L')", "count('a')", "find('o')", "items()", "keys()", "values()", "get('k')",
             "get('z', 5)", "splitlines()", "index(1)", "rstrip('x ')", "lstrip()", "format(1)", "isdigit()",
             "capitalize()"]
R_BIN = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or"]
R_CONTEXT = {"s": "hello", "n": 3, "f": 2.5, "l": [3, 1, 2], "d": {"k": 1, "j": "v"},
             "m": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi there"}],
             "msgs": [{"role": "user", "content": "c"}], "dd": {"a": 1, "b": [2]}, "mm": {"role": "r"}}


def random_expression(R, d=0):
    k = R.random()
    if d > 3 or k < 0.3:
        return R.choice(R_ATOMS)
    if k < 0.55:
        return f"({random_expression(R, d + 1)} {R.choice(R_BIN)} {random_expression(R, d + 1)})"
    if k < 0.7:
        return f"({random_expression(R, d + 1)}|{R.choice(R_FILTERS)})"
    if k < 0.78:
        return f"({random_expression(R, d + 1)} is {R.choice(['', 'not '])}{R.choice(R_TESTS)})"
    if k < 0.86:
        return f"({random_expression(R, d + 1)}).{R.choice(R_METHODS)}"
    if k < 0.9:
        return f"(not {random_expression(R, d + 1)})"
    if k < 0.95:
        return f"({random_expression(R, d + 1)} if {random_expression(R, d + 1)} else {random_expression(R, d + 1)})"
    idx = R.choice(["0", "-1", "1:", ":2", "::-1", "'k'", "5"])
    return f"({random_expression(R, d + 1)})[{idx}]"


def random_expression_template(R):
    def stmt():
        k = R.random()
        if k < 0.5:
            return "{{ " + random_expression(R) + " }}"
        if k < 0.7:
            return ("{% for x in " + random_expression(R) +
                    " %}[{{ x }}{{ loop.index }}{% if loop.last %}L{% endif %}]{% else %}E{% endfor %}")
        if k < 0.85:
            return "{% if " + random_expression(R) + " %}T{% else %}F{% endif %}"
        return "{% set ns.v = " + random_expression(R) + " %}{{ ns.v }}"
    return "{% set ns = namespace(v=1) %}" + "|".join(stmt() for _ in range(R.randint(1, 3)))


def random_statement_template(R):
    vals = ["1", "'a'", "x", "i", "ns.c", "loop.index", "[1, 2]", "none", "q", "mm.role", "k"]

    def e():
        return R.choice(vals) + R.choice(["", " ~ 'z'", " + 1", " * 2", "|string", "|length", " is defined", " == 1"])

    def st(d):
        k = R.random()
        if d > 2 or k < 0.2:
            return "{{ " + e() + " }}"
        if k < 0.35:
            return ("{% for i in " + R.choice(["[1, 2, 3]", "range(3)", "'ab'", "[]", "msgs", "dd.items()", "dd"]) +
                    (" if i != 2" if R.random() < 0.3 else "") + " %}" + blk(d + 1) +
                    R.choice(["{% if i == 1 %}{% continue %}{% endif %}", "{% if loop.index > 1 %}{% break %}{% endif %}", ""]) +
                    blk(d + 1) + ("{% else %}E" if R.random() < 0.3 else "") + "{% endfor %}")
        if k < 0.45:
            return ("{% if " + e() + " %}" + blk(d + 1) + "{% elif " + e() + " %}" + blk(d + 1) + "{% else %}" +
                    blk(d + 1) + "{% endif %}")
        if k < 0.55:
            return "{% set x = " + e() + " %}"
        if k < 0.62:
            return "{% set ns.c = ns.c + 1 %}"
        if k < 0.7:
            return "{% set q %}" + blk(d + 1) + "{% endset %}"
        if k < 0.78:
            return ("{% macro mac(a, b=2) %}[" + blk(d + 1) +
                    "{{ a }}{{ b }}{{ caller() if caller is defined else '' }}]{% endmacro %}{{ mac(" +
                    R.choice(["1", "'s'", "b=5, a=3", "x"]) + ") }}")
        if k < 0.85:
            return ("{% macro w(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}{% call w('p') %}" + blk(d + 1) +
                    "{% endcall %}")
        if k < 0.92:
            return "{% filter upper %}" + blk(d + 1) + "{% endfilter %}"
        return "{% with k = " + e() + " %}" + blk(d + 1) + "{% endwith %}"

    def blk(d):
        return "".join(st(d) for _ in range(R.randint(0, 3)))
    return "{% set ns = namespace(c=0) %}{% set x = 0 %}" + blk(0) + "|{{ x }}|{{ ns.c }}|{{ q }}"


def random_whitespace_template(R):
    text = ["", " ", "  ", "\n", "\n\n", " \n", "\n  ", "\t", "a", "b c", "x\n", "\n y", "\r\n", " \t \n"]

    def sign():
        return R.choice(["", "-", "+"])

    def tag(d):
        l, r = sign(), sign()
        k = R.random()
        if k < 0.25:
            return "{%" + l + " if true " + r + "%}" + body(d + 1) + "{%" + sign() + " endif " + sign() + "%}"
        if k < 0.45:
            return "{%" + l + " for i in [1, 2] " + r + "%}" + body(d + 1) + "{%" + sign() + " endfor " + sign() + "%}"
        if k < 0.6:
            return "{{" + R.choice(["", "-"]) + " 'v' " + R.choice(["", "-"]) + "}}"
        if k < 0.75:
            return "{#" + l + " c " + r + "#}"
        if k < 0.85:
            return "{%" + l + " set q = 1 " + r + "%}"
        if k < 0.93:
            return ("{%" + l + " raw " + r + "%}" + R.choice(text) + "{{x}}" + R.choice(text) + "{%" + sign() +
                    " endraw " + sign() + "%}")
        return "{%" + l + " macro mm() " + r + "%}" + body(d + 1) + "{%" + sign() + " endmacro " + sign() + "%}{{ mm() }}"

    def body(d=0):
        out = R.choice(text)
        for _ in range(R.randint(0, 4 if d == 0 else 2)):
            out += (tag(d) if d < 2 else "{{ 1 }}") + R.choice(text)
        return out
    return body()


def write_random_cases(env, out_dir, count):
    import random
    R = random.Random(20240726)
    cases = []
    makers = [random_expression_template, random_statement_template, random_whitespace_template]
    for maker in makers:
        for _ in range(count):
            src = maker(R)
            res = render(env, src, json.loads(json.dumps(R_CONTEXT)))
            if "0x" in res.get("output", ""):
                continue
            res["template"] = src
            cases.append(res)
    with open(os.path.join(out_dir, "random_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"now": FIXED_NOW, "context": R_CONTEXT, "cases": cases}, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"{len(cases)} random cases", file=sys.stderr)


# llama.cpp's templates (models/templates) rendered into expected.json: tool use
# in several syntaxes, reasoning, system-prompt handling.
LLAMA_CPP_TEMPLATES = [
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja", "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "fireworks-ai-llama-3-firefunction-v2.jinja",
    "google-gemma-2-2b-it.jinja", "llama-cpp-deepseek-r1.jinja", "meetkai-functionary-medium-v3.1.jinja",
    "meetkai-functionary-medium-v3.2.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja", "meta-llama-Llama-3.3-70B-Instruct.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
]


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap.add_argument("--deps", default=os.path.join(root, ".deps"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "templates"))
    ap.add_argument("--cases-only", action="store_true", help="only rewrite cases.json and random_cases.json")
    ap.add_argument("--random", type=int, default=800, help="random templates of each kind")
    args = ap.parse_args()
    env = make_env()
    os.makedirs(args.out, exist_ok=True)

    if args.cases_only:
        write_cases(env, args.out)
        write_random_cases(env, args.out, args.random)
        return
    convs = conversations()
    with open(os.path.join(args.out, "conversations.json"), "w", encoding="utf-8") as f:
        json.dump(convs, f, ensure_ascii=False, indent=1)
        f.write("\n")

    templates = []  # (name, where, source, bos, eos)
    for name in LLAMA_CPP_TEMPLATES:
        with open(os.path.join(args.deps, "llama.cpp", "templates", name), encoding="utf-8") as f:
            src = f.read()
        templates.append({"name": name, "file": "llama.cpp:templates/" + name,
                          "bos": "<s>", "eos": "</s>", "source": src})
    for tok in ["qwen3", "gemma3", "llama3_1", "deepseek_v3"]:
        path = os.path.join(args.deps, "tokenizers", tok, "tokenizer_config.json")
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)

        def tokstr(v):
            if isinstance(v, dict):
                return v.get("content", "")
            return v or ""

        templates.append({"name": tok, "file": f"deps:tokenizers/{tok}/tokenizer_config.json",
                          "bos": tokstr(cfg.get("bos_token")), "eos": tokstr(cfg.get("eos_token")),
                          "source": cfg["chat_template"]})

    with open(os.path.join(args.out, "gemma4", "chat_template.jinja"), encoding="utf-8") as f:
        templates.append({"name": "gemma4", "file": "fixture:gemma4/chat_template.jinja", "bos": "<bos>", "eos": "<eos>",
                          "source": f.read()})

    cases = []
    outputs = []  # per template: list of (case index, output)
    raised = 0
    for ti, t in enumerate(templates):
        prior = []
        for ci, conv in enumerate(convs):
            for agp in (False, True):
                ctx = {"messages": conv["messages"], "tools": conv.get("tools"), "documents": None,
                       "add_generation_prompt": agp, "bos_token": t["bos"], "eos_token": t["eos"]}
                ctx.update(conv.get("kwargs", {}))
                res = render(env, t["source"], ctx)
                case = {"t": ti, "c": ci, "g": agp}
                if "error" in res:
                    case["error"] = res["error"]
                    raised += 1
                else:
                    out = res["output"]
                    # store relative to the earlier output of this template sharing the longest prefix
                    best, keep = -1, 0
                    for idx, prev in prior:
                        n = os.path.commonprefix([prev.encode("utf-8"), out.encode("utf-8")])
                        if len(n) > keep:
                            best, keep = idx, len(n)
                    tail = out.encode("utf-8")[keep:]
                    # keep must fall on a UTF-8 boundary (prefix bytes are shared, so the tail decodes)
                    while tail and (tail[0] & 0xC0) == 0x80:
                        keep -= 1
                        tail = out.encode("utf-8")[keep:]
                    if best >= 0 and keep > 0:
                        case["base"] = best
                        case["keep"] = keep
                    case["tail"] = tail.decode("utf-8")
                    prior.append((len(cases), out))
                cases.append(case)

    expected = {
        "generator": "tools/gen_template_fixtures.py",
        "jinja2": jinja2.__version__,
        "now": FIXED_NOW,
        "templates": [{"name": t["name"], "file": t["file"], "bos": t["bos"], "eos": t["eos"]} for t in templates],
        "cases": cases,
    }
    with open(os.path.join(args.out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")

    write_cases(env, args.out)
    write_random_cases(env, args.out, args.random)
    print(f"{len(templates)} templates x {len(convs)} conversations x 2: {len(cases)} renders, {raised} raised",
          file=sys.stderr)


def write_cases(env, out_dir):
    small = []
    for src, ctx in CASES:
        res = render(env, src, ctx)
        item = {"template": src, "context": ctx}
        item.update(res)
        small.append(item)
    with open(os.path.join(out_dir, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"now": FIXED_NOW, "cases": small}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(small)} small cases", file=sys.stderr)


if __name__ == "__main__":
    main()
