"""Request shapes for the zoo fixtures (tests/zoo/reference.py generate).

Every shape is a chat-completions body without `model`. shapes_for(family) returns the same
list for every family, plus a few family-specific ones (Qwen3 thinking switches). Order and
content are fixed: the fixtures are byte-identical on every run.
"""

from __future__ import annotations

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string"}},
            "required": ["tz"],
        },
    },
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]

SYSTEM = "You are a helpful assistant. Answer briefly."
Q = "What's the weather in Paris?"

# The OpenAI SDK tool loop: the assistant turn comes back with content null and the
# arguments as a JSON *string*; the client appends a tool message with tool_call_id.
SDK_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_abc123",
            "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"unit\":\"celsius\"}"},
        }
    ],
}
SDK_RESULT = {"role": "tool", "tool_call_id": "call_abc123", "content": "{\"temp\": 18, \"sky\": \"cloudy\"}"}


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


def s(text):
    return {"role": "system", "content": text}


def parts(*texts):
    return [{"type": "text", "text": t} for t in texts]


def common_shapes():
    out = []

    def add(name, **body):
        out.append((name, body))

    # --- plain chats --------------------------------------------------------------------
    add("plain_user", messages=[u("Hello! How are you today?")])
    add("system_user", messages=[s(SYSTEM), u(Q)])
    add("multi_turn", messages=[s(SYSTEM), u("Hi"), a("Hello! How can I help?"), u("Tell me a joke.")])
    add("multi_turn_three_rounds", messages=[
        u("Count to two."), a("One, two."), u("Now to three."), a("One, two, three."), u("And back?"),
    ])
    add("system_only", messages=[s(SYSTEM)])
    add("two_system_messages", messages=[s(SYSTEM), s("Always answer in French."), u(Q)])
    add("system_mid_conversation", messages=[u("Hi"), a("Hello!"), s("Be terse."), u(Q)])
    add("developer_role", messages=[{"role": "developer", "content": "Prefer metric units."}, u(Q)])
    add("system_role_uppercase", messages=[{"role": "System", "content": SYSTEM}, u(Q)])
    add("user_with_name", messages=[{"role": "user", "content": "Hi, I'm Ann.", "name": "ann"}])
    add("system_content_null", messages=[{"role": "system", "content": None}, u(Q)])
    add("empty_content_user", messages=[u("")])
    add("max_tokens_and_max_completion_tokens", messages=[u(Q)], max_tokens=10, max_completion_tokens=20)

    # --- trailing assistant / continue_final_message ---------------------------------------
    add("trailing_assistant", messages=[u("Write a haiku about rain."), a("Soft rain on the roof")])
    add("trailing_assistant_continue", messages=[u("Write a haiku about rain."), a("Soft rain on the roof")],
        continue_final_message=True)
    add("trailing_assistant_continue_space", messages=[u("Complete: The capital of France is"), a(" Paris,")],
        continue_final_message=True)
    add("trailing_assistant_continue_empty", messages=[u("Say hi."), a("")], continue_final_message=True)
    add("trailing_assistant_continue_false", messages=[u("Say hi."), a("Hi")], continue_final_message=False)
    add("only_assistant_continue", messages=[a("Once upon a time")], continue_final_message=True)
    add("only_assistant", messages=[a("Once upon a time")])
    add("continue_prefix_starts_with_bos_text",
        messages=[u("Go on."), a("<|begin_of_text|><bos><｜begin▁of▁sentence｜>Then")],
        continue_final_message=True)

    # --- content as a list of parts ---------------------------------------------------------
    add("content_parts_one", messages=[{"role": "user", "content": parts("What is 2+2?")}])
    add("content_parts_several", messages=[{"role": "user", "content": parts("First part.", "Second part.", "Third.")}])
    add("content_parts_empty_list", messages=[{"role": "user", "content": []}])
    add("content_parts_system", messages=[{"role": "system", "content": parts(SYSTEM, "Use short sentences.")}, u(Q)])
    add("content_parts_assistant_history", messages=[
        u("Hi"), {"role": "assistant", "content": parts("Hello!", "How can I help?")}, u(Q),
    ])
    add("content_parts_trailing_assistant", messages=[
        u("Start a story."), {"role": "assistant", "content": parts("Once upon", "a time")},
    ])
    add("content_parts_trailing_assistant_continue", messages=[
        u("Start a story."), {"role": "assistant", "content": parts("Once upon", "a time")},
    ], continue_final_message=True)
    add("content_parts_extra_keys", messages=[
        {"role": "user", "content": [{"type": "text", "text": "Cache me.", "cache_control": {"type": "ephemeral"}}]},
    ])
    add("content_parts_thinking_in_assistant", messages=[
        u("2+2?"),
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Add them."}, {"type": "text", "text": "4"}]},
        u("And 3+3?"),
    ])
    add("content_parts_image_on_text_model", messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]},
    ])

    # --- the tool loop ------------------------------------------------------------------------
    add("tool_loop_sdk", messages=[s(SYSTEM), u(Q), SDK_CALL, SDK_RESULT], tools=TOOLS)
    add("tool_loop_sdk_answered", messages=[
        s(SYSTEM), u(Q), SDK_CALL, SDK_RESULT, a("It is 18 °C and cloudy in Paris."), u("And tomorrow?"),
    ], tools=TOOLS)
    add("tool_loop_sdk_no_tools_field", messages=[u(Q), SDK_CALL, SDK_RESULT])
    add("tool_loop_parallel_calls", messages=[
        u("Weather in Paris and the time in Tokyo?"),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_time", "arguments": "{\"tz\": \"Asia/Tokyo\"}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21:04"},
    ], tools=TOOLS)
    add("tool_loop_content_and_calls", messages=[
        u(Q),
        {"role": "assistant", "content": "Let me check.", "tool_calls": SDK_CALL["tool_calls"]},
        SDK_RESULT,
    ], tools=TOOLS)
    add("tool_call_arguments_object", messages=[
        u(Q),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        ]},
        {"role": "tool", "tool_call_id": "call_9", "content": "18 C"},
    ], tools=TOOLS)
    add("tool_call_arguments_odd_values", messages=[
        u(Q),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_5", "type": "function", "function": {
                "name": "get_weather",
                "arguments": "{\"city\":\"東京\",\"n\":1.0,\"big\":1e20,\"tiny\":1.5e-7,\"x\":1,\"x\":2,"
                             "\"huge\":123456789012345678901234,\"ok\":true,\"none\":null,\"esc\":\"a\\u00e9\\n\"}",
            }},
        ]},
        {"role": "tool", "tool_call_id": "call_5", "content": "ok"},
    ], tools=TOOLS)
    add("tool_call_no_id", messages=[
        u(Q),
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
        ]},
        {"role": "tool", "content": "18 C"},
    ], tools=TOOLS)
    add("tool_call_arguments_invalid_json", messages=[
        u(Q),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": "}},
        ]},
        {"role": "tool", "tool_call_id": "c", "content": "?"},
    ], tools=TOOLS)
    add("tool_call_arguments_empty_string", messages=[
        u(Q),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": ""}},
        ]},
        {"role": "tool", "tool_call_id": "c", "content": "?"},
    ], tools=TOOLS)
    add("tool_call_arguments_not_object", messages=[
        u(Q),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "[\"Paris\"]"}},
        ]},
        {"role": "tool", "tool_call_id": "c", "content": "?"},
    ], tools=TOOLS)
    add("trailing_assistant_tool_calls", messages=[u(Q), SDK_CALL], tools=TOOLS)
    add("tool_message_content_parts", messages=[
        u(Q), SDK_CALL,
        {"role": "tool", "tool_call_id": "call_abc123", "content": parts("18 C", "cloudy")},
    ], tools=TOOLS)
    add("tool_message_with_name", messages=[
        u(Q), SDK_CALL, {"role": "tool", "tool_call_id": "call_abc123", "name": "get_weather", "content": "18 C"},
    ], tools=TOOLS)
    add("function_role_message", messages=[
        u(Q), SDK_CALL, {"role": "function", "name": "get_weather", "content": "18 C"},
    ])

    # --- tools and tool_choice ------------------------------------------------------------------
    add("tools_auto", messages=[s(SYSTEM), u(Q)], tools=TOOLS, tool_choice="auto")
    add("tools_default_choice", messages=[u(Q)], tools=TOOLS)
    add("tools_choice_none", messages=[u(Q)], tools=TOOLS, tool_choice="none")
    add("tools_choice_required", messages=[u(Q)], tools=TOOLS, tool_choice="required")
    add("tools_choice_named", messages=[u(Q)], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    add("tools_choice_named_missing", messages=[u(Q)], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_stock"}})
    add("tools_choice_required_without_tools", messages=[u(Q)], tool_choice="required")
    add("tools_empty_list", messages=[u(Q)], tools=[])
    add("tools_minimal_function", messages=[u("What time is it?")],
        tools=[{"type": "function", "function": {"name": "get_time"}}])
    add("tools_no_description", messages=[u(Q)], tools=[{"type": "function", "function": {
        "name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]}}])
    add("tools_strict_true_and_false", messages=[u(Q)], tools=[
        {"type": "function", "function": {**WEATHER_TOOL["function"], "strict": True}},
        {"type": "function", "function": {**TIME_TOOL["function"], "strict": False}},
    ])
    add("tools_strict_null", messages=[u(Q)], tools=[
        {"type": "function", "function": {**WEATHER_TOOL["function"], "strict": None}},
    ])
    add("tools_client_key_order", messages=[u(Q)], tools=[{"function": {
        "parameters": {"type": "object", "properties": {}}, "name": "ping", "description": "Ping."},
        "type": "function"}])
    add("tools_unknown_keys", messages=[u(Q)], tools=[{"type": "function", "x_extra": 1, "function": {
        "name": "ping", "description": "Ping.", "examples": ["a"]}}])
    add("tools_db_type_names", messages=[u("Find a user.")], tools=[{"type": "function", "function": {
        "name": "find_user", "description": "Look a user up.",
        "parameters": {"type": "object", "properties": {
            "name": {"type": "VARCHAR(255)"}, "age": {"type": "int32"}, "score": {"type": ["float64", "null", "double"]},
            "tags": {"type": "list[str]", "items": {"type": "text"}}, "meta": {"type": "dict"},
            "interval": {"type": "INTEGER"}, "ratio": {"type": "numeric(10,2)"},
        }}}}])
    add("tools_invalid_parameters_schema", messages=[u(Q)], tools=[{"type": "function", "function": {
        "name": "bad", "parameters": {"type": "object", "required": "city"}}}])
    add("tools_defer_loading", messages=[u(Q)], tools=[{**TIME_TOOL, "defer_loading": True}])
    add("tools_message_level", messages=[
        {"role": "system", "content": SYSTEM, "tools": [TIME_TOOL]}, u("What time is it in Oslo?"),
    ])

    # --- template kwargs / reasoning --------------------------------------------------------------
    add("chat_template_kwargs_unknown", messages=[u(Q)], chat_template_kwargs={"foo": "bar", "n": 3})
    add("chat_template_kwargs_enable_thinking_false", messages=[u(Q)], chat_template_kwargs={"enable_thinking": False})
    add("chat_template_kwargs_enable_thinking_true", messages=[u(Q)], chat_template_kwargs={"enable_thinking": True})
    add("chat_template_kwargs_override_bos_token", messages=[u(Q)], chat_template_kwargs={"bos_token": "<BOS>"})
    add("chat_template_kwargs_chat_template", messages=[u(Q)], chat_template_kwargs={"chat_template": "{{ 1 }}"})
    add("reasoning_effort_low", messages=[u(Q)], reasoning_effort="low")
    add("reasoning_effort_none", messages=[u(Q)], reasoning_effort="none")
    add("reasoning_effort_none_enable_thinking_true", messages=[u(Q)], reasoning_effort="none",
        chat_template_kwargs={"enable_thinking": True})
    add("reasoning_effort_float", messages=[u(Q)], reasoning_effort=0.5)
    add("reasoning_effort_in_chat_template_kwargs", messages=[u(Q)], chat_template_kwargs={"reasoning_effort": "high"})
    add("reasoning_object_effort_none", messages=[u(Q)], reasoning={"effort": "none"})
    add("reasoning_content_in_history", messages=[
        u("2+2?"), {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."}, u("3+3?"),
    ])
    add("reasoning_content_in_last_turn", messages=[
        u("2+2?"), {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
    ])

    # --- text content ----------------------------------------------------------------------------
    add("cjk", messages=[s("你是一个乐于助人的助手。"), u("请用中文介绍一下东京和大阪的区别。日本語でもお願いします。한국어도.")])
    add("emoji", messages=[u("Rate this 🍕🍕🍕 party 🎉👨‍👩‍👧‍👦 from 1️⃣ to 🔟 🏳️‍🌈")])
    add("code", messages=[u("Fix this:\n```python\ndef add(a, b):\n\treturn a +  b  # sum\n\n\nprint(add(1, 2))\n```")])
    add("crlf_line_ends", messages=[s("Line one.\r\nLine two.\r\n"), u("A\r\nB\r\n\r\nC")])
    add("special_token_literals", messages=[u(
        "Literals: <|im_start|>user <|im_end|> <|eot_id|> <|begin_of_text|> <|start_header_id|> "
        "<start_of_turn>model <end_of_turn> <bos> <｜User｜> <｜Assistant｜> <｜end▁of▁sentence｜> <think></think>")])
    add("long_whitespace", messages=[u("  leading\n\n\n\n" + " " * 64 + "gap" + "\t" * 12 + "tabs   \n  ")])
    add("trim_sensitive_whitespace", messages=[s("  padded system  "), u("\n\n  padded user  \n"), a("  padded  "), u("ok")])

    # --- errors from validation or the template ---------------------------------------------------
    add("empty_messages", messages=[])
    add("roles_not_alternating", messages=[u("One."), u("Two.")])
    add("assistant_first", messages=[a("I speak first."), u("Hi")])
    add("unknown_role", messages=[{"role": "bot", "content": "beep"}, u("Hi")])
    add("user_role_uppercase", messages=[{"role": "User", "content": "Hi"}])
    add("user_content_null", messages=[{"role": "user", "content": None}])
    return out


QWEN3_EXTRA = [
    ("qwen3_tools_enable_thinking_false", {
        "messages": [s(SYSTEM), u(Q)], "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}}),
    ("qwen3_tool_loop_thinking_history", {
        "messages": [u(Q), {**SDK_CALL, "reasoning_content": "I should call get_weather."}, SDK_RESULT],
        "tools": TOOLS}),
    ("qwen3_think_tags_in_content", {
        "messages": [u("2+2?"), a("<think>\nadd\n</think>\n\n4"), u("3+3?")]}),
]


def shapes_for(family: str):
    shapes = common_shapes()
    if family == "qwen3":
        shapes += QWEN3_EXTRA
    return shapes
