// Real chat templates from Hugging Face tokenizer_config.json files, rendered for a few
// conversations. The expected strings are what transformers renders (Python jinja2 3.1
// with ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True), HF's tojson
// and raise_exception), produced offline and pasted here.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "text/jinja/jinja.h"

namespace hyperion::text::jinja {
namespace {

// Meta-Llama-3.1-8B-Instruct's template as first published (no tools): kLlama31Simple.
// Its later template with tools, builtin tools and date_string: kLlama31.
// Qwen3 (tools, <think> reasoning, namespace, reverse iteration): kQwen3.
// Gemma 3 (raise_exception, content as a string or a list of parts): kGemma3.
// clang-format off
const char* const kLlama31Simple = R"TPL({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %})TPL";

const char* const kLlama31 = R"TPL({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)TPL";

const char* const kQwen3 = R"TPL({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %})TPL";

const char* const kGemma3 = R"TPL({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
)TPL";
// clang-format on

std::string render(const char* source, const char* context_json) {
  const Template t = Template::parse(source, "chat_template");
  return t.render(from_json(nlohmann::ordered_json::parse(context_json)));
}

void expect_raise(const char* source, const char* context_json, const std::string& message) {
  try {
    render(source, context_json);
    ADD_FAILURE() << "no error; expected " << message;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("chat_template:", 0), 0u) << what;
    EXPECT_NE(what.find(": raise_exception: " + message), std::string::npos) << what;
  }
}

TEST(JinjaChatTemplates, Llama31SimpleSystemUserPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": "You are a helpful assistant.  "}, {"role": "user", "content": "Hello there!\n"}], "add_generation_prompt": true, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kLlama31Simple, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>

Hello there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)OUT");
}

TEST(JinjaChatTemplates, Llama31SimpleSystemUserNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": "You are a helpful assistant.  "}, {"role": "user", "content": "Hello there!\n"}], "add_generation_prompt": false, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kLlama31Simple, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>

Hello there!<|eot_id|>)OUT");
}

TEST(JinjaChatTemplates, Llama31SimpleUserOnlyPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": true, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kLlama31Simple, context),
            R"OUT(<|begin_of_text|><|start_header_id|>user<|end_header_id|>

What is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)OUT");
}

TEST(JinjaChatTemplates, Llama31SimpleUserOnlyNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": false, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kLlama31Simple, context),
            R"OUT(<|begin_of_text|><|start_header_id|>user<|end_header_id|>

What is 2+2?<|eot_id|>)OUT");
}

TEST(JinjaChatTemplates, Llama31SimpleMultiTurnPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke — please ✨."}], "add_generation_prompt": true, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kLlama31Simple, context),
            R"OUT(<|begin_of_text|><|start_header_id|>user<|end_header_id|>

Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>

Hello! How can I help?<|eot_id|><|start_header_id|>user<|end_header_id|>

Tell me a joke — please ✨.<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)OUT");
}

TEST(JinjaChatTemplates, Llama31SimpleMultiTurnNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke — please ✨."}], "add_generation_prompt": false, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kLlama31Simple, context),
            R"OUT(<|begin_of_text|><|start_header_id|>user<|end_header_id|>

Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>

Hello! How can I help?<|eot_id|><|start_header_id|>user<|end_header_id|>

Tell me a joke — please ✨.<|eot_id|>)OUT");
}

TEST(JinjaChatTemplates, Llama31SystemUserPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": "You are a helpful assistant.  "}, {"role": "user", "content": "Hello there!\n"}], "add_generation_prompt": true, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kLlama31, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>

Hello there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)OUT");
}

TEST(JinjaChatTemplates, Llama31SystemUserNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": "You are a helpful assistant.  "}, {"role": "user", "content": "Hello there!\n"}], "add_generation_prompt": false, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kLlama31, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>

Hello there!<|eot_id|>)OUT");
}

TEST(JinjaChatTemplates, Llama31UserOnlyPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": true, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kLlama31, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

<|eot_id|><|start_header_id|>user<|end_header_id|>

What is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)OUT");
}

TEST(JinjaChatTemplates, Llama31UserOnlyNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": false, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kLlama31, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

<|eot_id|><|start_header_id|>user<|end_header_id|>

What is 2+2?<|eot_id|>)OUT");
}

TEST(JinjaChatTemplates, Llama31MultiTurnPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke — please ✨."}], "add_generation_prompt": true, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kLlama31, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

<|eot_id|><|start_header_id|>user<|end_header_id|>

Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>

Hello! How can I help?<|eot_id|><|start_header_id|>user<|end_header_id|>

Tell me a joke — please ✨.<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)OUT");
}

TEST(JinjaChatTemplates, Llama31MultiTurnNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke — please ✨."}], "add_generation_prompt": false, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kLlama31, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

<|eot_id|><|start_header_id|>user<|end_header_id|>

Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>

Hello! How can I help?<|eot_id|><|start_header_id|>user<|end_header_id|>

Tell me a joke — please ✨.<|eot_id|>)OUT");
}

TEST(JinjaChatTemplates, Llama31ToolsAndDatePrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": true, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>", "tools": [{"name": "get_weather", "description": "Get the weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}], "date_string": "05 Mar 2025"})J";
  EXPECT_EQ(render(kLlama31, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Environment: ipython
Cutting Knowledge Date: December 2023
Today Date: 05 Mar 2025

<|eot_id|><|start_header_id|>user<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.

{
    "name": "get_weather",
    "description": "Get the weather in a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {
                "type": "string",
                "description": "City name, e.g. Paris"
            },
            "unit": {
                "type": "string",
                "enum": [
                    "c",
                    "f"
                ]
            }
        },
        "required": [
            "city"
        ]
    }
}

What is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)OUT");
}

TEST(JinjaChatTemplates, Llama31ToolsAndDateNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": false, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>", "tools": [{"name": "get_weather", "description": "Get the weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}], "date_string": "05 Mar 2025"})J";
  EXPECT_EQ(render(kLlama31, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Environment: ipython
Cutting Knowledge Date: December 2023
Today Date: 05 Mar 2025

<|eot_id|><|start_header_id|>user<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.

{
    "name": "get_weather",
    "description": "Get the weather in a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {
                "type": "string",
                "description": "City name, e.g. Paris"
            },
            "unit": {
                "type": "string",
                "enum": [
                    "c",
                    "f"
                ]
            }
        },
        "required": [
            "city"
        ]
    }
}

What is 2+2?<|eot_id|>)OUT");
}

TEST(JinjaChatTemplates, Llama31ToolCallPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]}, {"role": "tool", "content": "{\"temp\": 21}"}], "add_generation_prompt": true, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>", "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}]})J";
  EXPECT_EQ(render(kLlama31, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Environment: ipython
Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

<|eot_id|><|start_header_id|>user<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.

{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {
                    "type": "string",
                    "description": "City name, e.g. Paris"
                },
                "unit": {
                    "type": "string",
                    "enum": [
                        "c",
                        "f"
                    ]
                }
            },
            "required": [
                "city"
            ]
        }
    }
}

Weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>

{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>

"{\"temp\": 21}"<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)OUT");
}

TEST(JinjaChatTemplates, Llama31ToolCallNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]}, {"role": "tool", "content": "{\"temp\": 21}"}], "add_generation_prompt": false, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>", "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}]})J";
  EXPECT_EQ(render(kLlama31, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Environment: ipython
Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

<|eot_id|><|start_header_id|>user<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.

{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {
                    "type": "string",
                    "description": "City name, e.g. Paris"
                },
                "unit": {
                    "type": "string",
                    "enum": [
                        "c",
                        "f"
                    ]
                }
            },
            "required": [
                "city"
            ]
        }
    }
}

Weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>

{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>

"{\"temp\": 21}"<|eot_id|>)OUT");
}

TEST(JinjaChatTemplates, Llama31BuiltinToolsPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Search for hyperion"}, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "brave_search", "arguments": {"query": "hyperion"}}}]}, {"role": "ipython", "content": "results"}], "add_generation_prompt": true, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>", "builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"]})J";
  EXPECT_EQ(render(kLlama31, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Environment: ipython
Tools: brave_search, wolfram_alpha

Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

Sys<|eot_id|><|start_header_id|>user<|end_header_id|>

Search for hyperion<|eot_id|><|start_header_id|>assistant<|end_header_id|>

<|python_tag|>brave_search.call(query="hyperion")<|eom_id|><|start_header_id|>ipython<|end_header_id|>

"results"<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)OUT");
}

TEST(JinjaChatTemplates, Llama31BuiltinToolsNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Search for hyperion"}, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "brave_search", "arguments": {"query": "hyperion"}}}]}, {"role": "ipython", "content": "results"}], "add_generation_prompt": false, "bos_token": "<|begin_of_text|>", "eos_token": "<eos>", "builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"]})J";
  EXPECT_EQ(render(kLlama31, context),
            R"OUT(<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Environment: ipython
Tools: brave_search, wolfram_alpha

Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

Sys<|eot_id|><|start_header_id|>user<|end_header_id|>

Search for hyperion<|eot_id|><|start_header_id|>assistant<|end_header_id|>

<|python_tag|>brave_search.call(query="hyperion")<|eom_id|><|start_header_id|>ipython<|end_header_id|>

"results"<|eot_id|>)OUT");
}

TEST(JinjaChatTemplates, Qwen3SystemUserPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": "You are a helpful assistant.  "}, {"role": "user", "content": "Hello there!\n"}], "add_generation_prompt": true, "bos_token": "", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kQwen3, context), R"OUT(<|im_start|>system
You are a helpful assistant.  <|im_end|>
<|im_start|>user
Hello there!
<|im_end|>
<|im_start|>assistant
)OUT");
}

TEST(JinjaChatTemplates, Qwen3SystemUserNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": "You are a helpful assistant.  "}, {"role": "user", "content": "Hello there!\n"}], "add_generation_prompt": false, "bos_token": "", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kQwen3, context), R"OUT(<|im_start|>system
You are a helpful assistant.  <|im_end|>
<|im_start|>user
Hello there!
<|im_end|>
)OUT");
}

TEST(JinjaChatTemplates, Qwen3UserOnlyPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": true, "bos_token": "", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kQwen3, context), R"OUT(<|im_start|>user
What is 2+2?<|im_end|>
<|im_start|>assistant
)OUT");
}

TEST(JinjaChatTemplates, Qwen3UserOnlyNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": false, "bos_token": "", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kQwen3, context), R"OUT(<|im_start|>user
What is 2+2?<|im_end|>
)OUT");
}

TEST(JinjaChatTemplates, Qwen3MultiTurnPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke — please ✨."}], "add_generation_prompt": true, "bos_token": "", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kQwen3, context), R"OUT(<|im_start|>user
Hi<|im_end|>
<|im_start|>assistant
Hello! How can I help?<|im_end|>
<|im_start|>user
Tell me a joke — please ✨.<|im_end|>
<|im_start|>assistant
)OUT");
}

TEST(JinjaChatTemplates, Qwen3MultiTurnNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke — please ✨."}], "add_generation_prompt": false, "bos_token": "", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kQwen3, context), R"OUT(<|im_start|>user
Hi<|im_end|>
<|im_start|>assistant
Hello! How can I help?<|im_end|>
<|im_start|>user
Tell me a joke — please ✨.<|im_end|>
)OUT");
}

TEST(JinjaChatTemplates, Qwen3ThinkingPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "<think>\nreasoning here\n</think>\n\nAnswer 1"}, {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "<think>\nr2\n</think>\n\nA2"}], "add_generation_prompt": true, "bos_token": "", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kQwen3, context), R"OUT(<|im_start|>system
S<|im_end|>
<|im_start|>user
Q1<|im_end|>
<|im_start|>assistant
Answer 1<|im_end|>
<|im_start|>user
Q2<|im_end|>
<|im_start|>assistant
<think>
r2
</think>

A2<|im_end|>
<|im_start|>assistant
)OUT");
}

TEST(JinjaChatTemplates, Qwen3ThinkingNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "<think>\nreasoning here\n</think>\n\nAnswer 1"}, {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "<think>\nr2\n</think>\n\nA2"}], "add_generation_prompt": false, "bos_token": "", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kQwen3, context), R"OUT(<|im_start|>system
S<|im_end|>
<|im_start|>user
Q1<|im_end|>
<|im_start|>assistant
Answer 1<|im_end|>
<|im_start|>user
Q2<|im_end|>
<|im_start|>assistant
<think>
r2
</think>

A2<|im_end|>
)OUT");
}

TEST(JinjaChatTemplates, Qwen3ToolsAndCallPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]}, {"role": "tool", "content": "{\"temp\": 21}"}], "add_generation_prompt": true, "bos_token": "", "eos_token": "<eos>", "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}]})J";
  EXPECT_EQ(render(kQwen3, context), R"OUT(<|im_start|>system
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Weather in Paris?<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"temp": 21}
</tool_response><|im_end|>
<|im_start|>assistant
)OUT");
}

TEST(JinjaChatTemplates, Qwen3ToolsAndCallNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]}, {"role": "tool", "content": "{\"temp\": 21}"}], "add_generation_prompt": false, "bos_token": "", "eos_token": "<eos>", "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}]})J";
  EXPECT_EQ(render(kQwen3, context), R"OUT(<|im_start|>system
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Weather in Paris?<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"temp": 21}
</tool_response><|im_end|>
)OUT");
}

TEST(JinjaChatTemplates, Qwen3NoThinkingPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": true, "bos_token": "", "eos_token": "<eos>", "enable_thinking": false})J";
  EXPECT_EQ(render(kQwen3, context), R"OUT(<|im_start|>user
What is 2+2?<|im_end|>
<|im_start|>assistant
<think>

</think>

)OUT");
}

TEST(JinjaChatTemplates, Qwen3NoThinkingNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": false, "bos_token": "", "eos_token": "<eos>", "enable_thinking": false})J";
  EXPECT_EQ(render(kQwen3, context), R"OUT(<|im_start|>user
What is 2+2?<|im_end|>
)OUT");
}

TEST(JinjaChatTemplates, Gemma3SystemUserPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": "You are a helpful assistant.  "}, {"role": "user", "content": "Hello there!\n"}], "add_generation_prompt": true, "bos_token": "<bos>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kGemma3, context), R"OUT(<bos><start_of_turn>user
You are a helpful assistant.  

Hello there!<end_of_turn>
<start_of_turn>model
)OUT");
}

TEST(JinjaChatTemplates, Gemma3SystemUserNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": "You are a helpful assistant.  "}, {"role": "user", "content": "Hello there!\n"}], "add_generation_prompt": false, "bos_token": "<bos>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kGemma3, context), R"OUT(<bos><start_of_turn>user
You are a helpful assistant.  

Hello there!<end_of_turn>
)OUT");
}

TEST(JinjaChatTemplates, Gemma3UserOnlyPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": true, "bos_token": "<bos>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kGemma3, context), R"OUT(<bos><start_of_turn>user
What is 2+2?<end_of_turn>
<start_of_turn>model
)OUT");
}

TEST(JinjaChatTemplates, Gemma3UserOnlyNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": false, "bos_token": "<bos>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kGemma3, context), R"OUT(<bos><start_of_turn>user
What is 2+2?<end_of_turn>
)OUT");
}

TEST(JinjaChatTemplates, Gemma3MultiTurnPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke — please ✨."}], "add_generation_prompt": true, "bos_token": "<bos>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kGemma3, context), R"OUT(<bos><start_of_turn>user
Hi<end_of_turn>
<start_of_turn>model
Hello! How can I help?<end_of_turn>
<start_of_turn>user
Tell me a joke — please ✨.<end_of_turn>
<start_of_turn>model
)OUT");
}

TEST(JinjaChatTemplates, Gemma3MultiTurnNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke — please ✨."}], "add_generation_prompt": false, "bos_token": "<bos>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kGemma3, context), R"OUT(<bos><start_of_turn>user
Hi<end_of_turn>
<start_of_turn>model
Hello! How can I help?<end_of_turn>
<start_of_turn>user
Tell me a joke — please ✨.<end_of_turn>
)OUT");
}

TEST(JinjaChatTemplates, Gemma3ContentPartsPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief. "}]}, {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Describe it "}]}], "add_generation_prompt": true, "bos_token": "<bos>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kGemma3, context), R"OUT(<bos><start_of_turn>user
Be brief. 

<start_of_image>Describe it<end_of_turn>
<start_of_turn>model
)OUT");
}

TEST(JinjaChatTemplates, Gemma3ContentPartsNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief. "}]}, {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Describe it "}]}], "add_generation_prompt": false, "bos_token": "<bos>", "eos_token": "<eos>"})J";
  EXPECT_EQ(render(kGemma3, context), R"OUT(<bos><start_of_turn>user
Be brief. 

<start_of_image>Describe it<end_of_turn>
)OUT");
}

TEST(JinjaChatTemplates, Gemma3RolesMustAlternatePrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "add_generation_prompt": true, "bos_token": "<bos>", "eos_token": "<eos>"})J";
  expect_raise(kGemma3, context,
               "Conversation roles must alternate user/assistant/user/assistant/...");
}

TEST(JinjaChatTemplates, Gemma3RolesMustAlternateNoPrompt) {
  const char* context =
      R"J({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "add_generation_prompt": false, "bos_token": "<bos>", "eos_token": "<eos>"})J";
  expect_raise(kGemma3, context,
               "Conversation roles must alternate user/assistant/user/assistant/...");
}

}  // namespace
}  // namespace hyperion::text::jinja
