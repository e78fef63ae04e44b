"""Small tokenizer folders with real-world-shaped chat templates, built locally (nothing downloaded).

Each folder holds a byte-level BPE `tokenizer.json` trained with the `tokenizers` library on
a tiny corpus, and a `tokenizer_config.json` whose `chat_template` follows a real family:
Llama 3.1 (tools, BOS written by the template), Qwen3 (tool calls, `<think>` stripped
before the last user turn), a Mistral-style one (system prompt folded into the first user
turn, BOS from `bos_token`) and a Gemma-3-style one that loops over content parts (vLLM's
"openai" content format). The same conversations are rendered through vLLM and through
`boomerang_gateway.local_tokenize` by tests/vllm/test_local_tokenize.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS = [
    "The weather in Paris is sunny today, with a high of 24 degrees.",
    "You are a helpful assistant. Answer briefly and cite your sources.",
    "def get_weather(city: str) -> dict: return {'city': city, 'unit': 'celsius'}",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "Let me think about caches, prefill and decode engines, and KV blocks.",
    "Tools: search, calculator, get_weather. Results: 42, 3.14, 0.5%.",
]
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
            "<|python_tag|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
            "<tool_response>", "</tool_response>", "<think>", "</think>", "<s>", "</s>", "[INST]", "[/INST]",
            "<bos>", "<start_of_turn>", "<end_of_turn>"]

LLAMA3 = (
    "{{- bos_token }}\n"
    "{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" %}{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = \"\" %}{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{%- if tools is not none %}{{- \"Environment: ipython\\n\" }}{%- endif %}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{%- if tools is not none %}\n"
    "    {{- \"You have access to the following functions.\\n\\n\" }}\n"
    "    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- \"\\n\\n\" }}{%- endfor %}\n"
    "{%- endif %}\n"
    "{{- system_message }}{{- \"<|eot_id|>\" }}\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}\n"
    "    {%- elif 'tool_calls' in message %}\n"
    "        {%- set tool_call = message.tool_calls[0].function %}\n"
    "        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "        {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n"
    "        {{- '\"parameters\": ' }}{{- tool_call.arguments | tojson }}{{- \"}\" }}{{- \"<|eot_id|>\" }}\n"
    "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
    "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n"
    "        {%- if message.content is mapping or message.content is iterable %}"
    "{{- message.content | tojson }}{%- else %}{{- message.content }}{%- endif %}\n"
    "        {{- \"<|eot_id|>\" }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}\n"
)

QWEN3 = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}{{- \"\\n\" }}{{- tool | tojson }}{%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object within <tool_call></tool_call>"
    " XML tags.<|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and message.content is string and "
    "not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.content is string %}{%- set content = message.content %}"
    "{%- else %}{%- set content = '' %}{%- endif %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- else %}{%- if '</think>' in content %}\n"
    "            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')"
    ".split('<think>')[-1].lstrip('\\n') %}\n"
    "            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "        {%- endif %}{%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n')"
    " + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "            {%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}\n"
    "        {%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}\n"
    "                {%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}{{- '<|im_start|>user' }}{%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}{{- content }}{{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}{{- '<|im_end|>\\n' }}{%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}\n"
    "{%- endif %}\n"
)

MISTRAL = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}\n"
    "{{- bos_token }}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
    "        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\n"
    "    {%- endif %}\n"
    "    {%- if message['role'] == 'user' %}\n"
    "        {%- if loop.first and system_message is defined %}"
    "{{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
    "        {%- else %}{{- ' [INST] ' + message['content'] + ' [/INST]' }}{%- endif %}\n"
    "    {%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}\n"
    "    {%- else %}{{- raise_exception('Only user and assistant roles are supported, with the exception of an "
    "initial optional system message!') }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
)

GEMMA3 = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}{%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}{%- set first_user_prefix = \"\" -%}{%- set loop_messages = messages -%}{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}{{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}{{ raise_exception(\"Invalid content type\") }}{%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{'<start_of_turn>model\\n'}}{%- endif -%}\n"
)

# name: (chat template, bos_token, eos_token, BOS added by add_special_tokens)
TEMPLATES: dict[str, tuple[str, str | None, str, str | None]] = {
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>", "<|begin_of_text|>"),
    "qwen3": (QWEN3, None, "<|im_end|>", None),
    "mistral": (MISTRAL, "<s>", "</s>", "<s>"),
    "gemma3": (GEMMA3, "<bos>", "<end_of_turn>", "<bos>"),
}


def build_tokenizer(bos: str | None) -> Tokenizer:
    """A byte-level BPE (GPT-2/Llama-3/Qwen style) trained on `CORPUS`, with `SPECIALS` added."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    if bos is not None:
        bos_id = tok.token_to_id(bos)
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, bos_id)])
    return tok


def write_model(folder: Path, name: str, config_json: dict[str, Any] | None = None) -> Path:
    """A tokenizer folder for `name` in TEMPLATES (and a weightless config.json, for vLLM)."""
    template, bos, eos, bos_added = TEMPLATES[name]
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer(bos_added).save(str(folder / "tokenizer.json"))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
                              "eos_token": eos, "model_max_length": 16384, "clean_up_tokenization_spaces": False}
    if bos is not None:
        config["bos_token"] = bos
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    if config_json is not None:
        (folder / "config.json").write_text(json.dumps(config_json))
    return folder


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}

# name: (the templates it applies to, the chat request body)
CONVERSATIONS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "plain": (("llama3", "qwen3", "mistral", "gemma3"),
              {"messages": [{"role": "user", "content": "What is the weather in Paris?"}]}),
    "system": (("llama3", "qwen3", "mistral", "gemma3"),
               {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                             {"role": "user", "content": "Answer briefly: what is 3.14?"},
                             {"role": "assistant", "content": "It is pi, roughly."},
                             {"role": "user", "content": "And 42?"}]}),
    "multipart": (("llama3", "qwen3", "mistral", "gemma3"),
                  {"messages": [{"role": "system", "content": [{"type": "text", "text": "Cite your sources."}]},
                                {"role": "user", "content": [{"type": "text", "text": "The weather in Paris"},
                                                             {"type": "text", "text": "is sunny today?"}]}]}),
    "tools": (("llama3", "qwen3"),
              {"messages": [{"role": "system", "content": "Use tools."},
                            {"role": "user", "content": "Weather in Paris?"},
                            {"role": "assistant", "content": None, "tool_calls": [CALL]},
                            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 24, "unit": "celsius"}'}],
               "tools": [WEATHER_TOOL]}),
    "reasoning": (("qwen3",),
                  {"messages": [{"role": "user", "content": "Think about caches."},
                                {"role": "assistant", "content": "<think>\nKV blocks.\n</think>\n\nPrefill once."},
                                {"role": "user", "content": "And decode?"},
                                {"role": "assistant", "content": "Decode engines", "reasoning": "Let me think."},
                                {"role": "tool", "content": "42"}],
                   "chat_template_kwargs": {"enable_thinking": False}}),
    "continue": (("llama3", "qwen3", "gemma3"),
                 {"messages": [{"role": "user", "content": "Say hello."},
                               {"role": "assistant", "content": "Hello, the weather"}],
                  "add_generation_prompt": False, "continue_final_message": True}),
    "special_tokens": (("llama3", "mistral"),
                       {"messages": [{"role": "user", "content": "Hi"}], "add_special_tokens": True}),
}


def write_config(folder: Path, config_json: dict[str, Any]) -> None:
    """The weightless `config.json` vLLM needs to build a model config from a folder."""
    (folder / "config.json").write_text(json.dumps(config_json))
