#!/usr/bin/env python3
"""Golden renders of chat templates for lua/nibble/chat.lua (tests/lua/chat_spec.lua): the chat templates of
the common instruct model families (SmolLM2 / ChatML, Llama 2, Llama 3, Qwen2, Qwen2.5 with its tool branches, Mistral,
Gemma, Phi-3, copied from their tokenizer_config.json) and a few templates that exercise the rest of the Jinja
subset, each rendered over several message lists, with and without add_generation_prompt, by transformers' own
renderer (render_jinja_template: the one apply_chat_template calls; Jinja with trim_blocks and lstrip_blocks).
A render that raises (raise_exception, a Jinja error) records the error message instead.

Run by hand with the project venv (transformers + jinja2, no torch needed):
    /root/nbvenv/bin/python tests/golden/gen_chat_golden.py
Writes tests/golden/data/chat_golden.json.
"""
import json
import os

import jinja2
import transformers
from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "chat_golden.json")

TEMPLATES = {
    # HuggingFaceTB/SmolLM2-*-Instruct
    "smollm2": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
        "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    # meta-llama/Llama-2-7b-chat-hf (as in ../shared/data/tokenizers/llama2-32k/tokenizer_config.json)
    "llama2": "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% elif USE_DEFAULT_PROMPT == true and not '<<SYS>>' in messages[0]['content'] %}{% set loop_messages = messages %}{% set system_message = 'DEFAULT_SYSTEM_MESSAGE' %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'system' %}{{ '<<SYS>>\n' + content.strip() + '\n<</SYS>>\n\n' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
    # meta-llama/Meta-Llama-3-8B-Instruct
    "llama3": (
        "{% set loop_messages = messages %}{% for message in loop_messages %}"
        "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
        " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    ),
    # Qwen/Qwen2-*-Instruct
    "qwen2": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    # Qwen/Qwen2.5-*-Instruct (multi-line, {%- -%} whitespace control, tools and tool calls)
    "qwen2.5": """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
""",
    # mistralai/Mistral-7B-Instruct-v0.1
    "mistral": (
        "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
        "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
        "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
    ),
    # google/gemma-2b-it
    "gemma": (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
        "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
    ),
    # microsoft/Phi-3-mini-4k-instruct
    "phi3": (
        "{% for message in messages %}{% if message['role'] == 'system' %}"
        "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
        "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
        "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
    ),
    # Mistral-7B-Instruct-v0.2 style: the system prompt folded into the first user turn with a slice,
    # namespace(), loop.last, string methods, `is not none`, `not in`, `~` and `length`
    "features": """{%- set ns = namespace(n=0, sys='') %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.sys = messages[0]['content'].strip() ~ '\\n\\n' %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages if message.role != 'tool' %}
    {%- set ns.n = ns.n + 1 %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first %}
{{- '[INST] ' + ns.sys + message['content'] + ' [/INST]' }}
        {%- else %}
{{- '[INST] ' + message['content'] | trim + ' [/INST]' }}
        {%- endif %}
    {%- elif message.role not in ['user', 'system'] %}
        {{- ' ' + message['content'].rstrip() + eos_token if message.content is not none else '' }}
    {%- endif %}
    {%- if loop.last %}
        {{- '\\n#' ~ ns.n ~ '/' ~ loop_messages | length ~ (' last=' ~ loop.index ~ ',' ~ loop.revindex0) }}
    {%- endif %}
{%- endfor %}
""",
    # plain lstrip_blocks / trim_blocks behaviour (block tags on lines of their own), comments, else in for,
    # elif chains, `in` on strings, filters with arguments, ternaries, slices with steps, loop.previtem
    "blocks": """{# a comment that renders nothing #}
{% for message in messages %}
  {% if message.role == 'system' %}
SYSTEM: {{ message.content | upper }}
  {% elif 'assist' in message.role %}
    ASSISTANT({{ loop.index }}/{{ loop.length }}): {{ message.content | replace('Paris', 'PARIS') }}
  {% else %}
    {{ message.role | capitalize }}{{ ' (again)' if loop.previtem is defined and loop.previtem.role == message.role else '' }}: {{ message.content }}
  {% endif %}
{% else %}
(no messages)
{% endfor %}
{% if add_generation_prompt +%}
ASSISTANT:
{%- endif %}
{{ messages | length }} {{ messages[::2] | length }} {{ messages[-1].role if messages else 'none' }}
{{ 'abc'[1:] ~ 'x' * 3 ~ (7 // 2) ~ (7 % 3) ~ (2 ** 3) ~ (1 + 2 * 3) ~ [1, 2] | join('-') ~ none ~ true }}
""",
}

TOKENS = {
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "llama2": ("<s>", "</s>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2": (None, "<|im_end|>"),
    "qwen2.5": (None, "<|im_end|>"),
    "mistral": ("<s>", "</s>"),
    "gemma": ("<bos>", "<eos>"),
    "phi3": ("<s>", "<|endoftext|>"),
    "features": ("<s>", "</s>"),
    "blocks": ("<s>", "</s>"),
}

MESSAGES = {
    "user": [{"role": "user", "content": "What is the capital of France?"}],
    "system_user": [
        {"role": "system", "content": "  You are terse.  "},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "multi_turn": [
        {"role": "user", "content": "Hi there! "},
        {"role": "assistant", "content": "Hello. How can I help?\n"},
        {"role": "user", "content": "  Name a city in France: Paris?\tOr Lyon.\n\n"},
    ],
    "system_multi_turn": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "Théâtre — “quoted” 日本語 \u00a0"},
    ],
    "tool_calls": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "22 C"},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is 22 C and sunny."},
    ],
    "empty": [],
}

# Conversations tokenized by a real tokenizer's apply_chat_template(tokenize=True) (the ids nibble's
# chat_template = "model" data path must give), when ../shared/data is present.
SHARED = os.environ.get("NIBBLE_SHARED_DATA", os.path.join(HERE, "..", "..", "..", "shared", "data"))
TOKENIZED = {
    "tokenizers/llama2-32k": {
        "answered": [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Hi there! "},
            {"role": "assistant", "content": "Hello. How can I help?\n"},
            {"role": "user", "content": "Name a city in France"},
            {"role": "assistant", "content": "Paris"},
        ],
        "asked": [
            {"role": "user", "content": "Théâtre — “quoted” 日本語"},
            {"role": "assistant", "content": "Oui."},
            {"role": "user", "content": "And then?"},
        ],
    },
}

CASES = [
    (t, m, g)
    for t in TEMPLATES
    for m in MESSAGES
    for g in (False, True)
    if not (m == "tool_calls" and t not in ("qwen2.5",))
    and not (m == "empty" and t not in ("blocks", "phi3", "smollm2"))
]


def main():
    cases = []
    for t, m, g in CASES:
        bos, eos = TOKENS[t]
        kw = {}
        if bos is not None:
            kw["bos_token"] = bos
        if eos is not None:
            kw["eos_token"] = eos
        case = {"template": t, "messages": m, "add_generation_prompt": g}
        case.update(kw)
        try:
            out, _ = render_jinja_template([MESSAGES[m]], chat_template=TEMPLATES[t], add_generation_prompt=g, **kw)
            case["output"] = out[0]
        except jinja2.exceptions.TemplateError as e:
            case["error"] = str(e)
        cases.append(case)
    tokenized = []
    for rel, convs in TOKENIZED.items():
        d = os.path.join(SHARED, rel)
        if not os.path.isdir(d):
            raise SystemExit(f"{d} is missing: the tokenized cases need ../shared/data")
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(d)
        for name, msgs in convs.items():
            ids = tok.apply_chat_template(msgs, tokenize=True)
            ids = ids["input_ids"] if not isinstance(ids, list) else ids
            tokenized.append({"tokenizer": rel, "name": name, "messages": msgs, "input_ids": ids,
                              "text": tok.apply_chat_template(msgs, tokenize=False)})
    doc = {
        "generator": f"tests/golden/gen_chat_golden.py (transformers {transformers.__version__}, jinja2 {jinja2.__version__})",
        "templates": TEMPLATES,
        "messages": MESSAGES,
        "cases": cases,
        "tokenized": tokenized,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {OUT}: {len(cases)} renders, {sum('error' in c for c in cases)} of them errors")


if __name__ == "__main__":
    main()
