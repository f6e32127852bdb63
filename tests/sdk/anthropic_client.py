#!/usr/bin/env python3
"""What a user of the official Anthropic Python SDK tries against kvgate's /v1/messages.

    python3 tests/sdk/anthropic_client.py <base_url> <api_key> <model>

<base_url> is the gateway's root (the SDK appends /v1/messages). Runs, in order, and prints
one JSON line per case ({"case", "ok", ...observations}); exits 1 on the first unexpected
exception:
  1. messages.create, plain
  2. messages.stream: the text as it arrives and the SDK's final message
  3. messages.create(stream=True): the raw event types, in order
  4. the tool loop: a tool defined, tool_choice {"type": "any"} forcing a call, the
     tool_result sent back with the assistant turn the SDK returned, then the final answer
  5. messages.count_tokens
  6. an over-long prompt: anthropic.BadRequestError expected (admission refuses it)
"""

import json
import sys

import anthropic

TOOLS = [
    {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "input_schema": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    }
]


def report(case, **fields):
    print(json.dumps({"case": case, "ok": True, **fields}), flush=True)


def fail(case, why):
    print(json.dumps({"case": case, "ok": False, "error": repr(why)}), flush=True)
    sys.exit(1)


def check_usage(message):
    if message.usage.input_tokens <= 0 or message.usage.output_tokens < 0:
        raise AssertionError(f"bad usage: {message.usage}")


def plain(client, model):
    message = client.messages.create(
        model=model,
        max_tokens=16,
        system="Be brief.",
        messages=[{"role": "user", "content": "What is a KV cache?"}],
    )
    check_usage(message)
    assert message.type == "message" and message.role == "assistant", message
    assert message.id.startswith("msg_"), message.id
    return {
        "id": message.id,
        "stop_reason": message.stop_reason,
        "input_tokens": message.usage.input_tokens,
        "output_tokens": message.usage.output_tokens,
        "blocks": [b.type for b in message.content],
    }


def streamed(client, model):
    pieces = []
    with client.messages.stream(
        model=model,
        max_tokens=16,
        messages=[{"role": "user", "content": "Count to five."}],
    ) as stream:
        for text in stream.text_stream:
            pieces.append(text)
        final = stream.get_final_message()
    check_usage(final)
    text = "".join(b.text for b in final.content if b.type == "text")
    if text != "".join(pieces):
        raise AssertionError(f"streamed text {pieces!r} differs from the final {text!r}")
    return {
        "chunks": len(pieces),
        "stop_reason": final.stop_reason,
        "input_tokens": final.usage.input_tokens,
        "output_tokens": final.usage.output_tokens,
    }


def raw_stream(client, model):
    events = client.messages.create(
        model=model,
        max_tokens=8,
        messages=[{"role": "user", "content": "Hello"}],
        stream=True,
    )
    kinds = [event.type for event in events]
    if kinds[0] != "message_start" or kinds[-1] != "message_stop":
        raise AssertionError(f"unexpected event order: {kinds}")
    return {"events": kinds}


def tool_loop(client, model):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(
        model=model,
        max_tokens=128,
        tools=TOOLS,
        tool_choice={"type": "any"},
        messages=messages,
    )
    calls = [b for b in first.content if b.type == "tool_use"]
    if first.stop_reason != "tool_use" or not calls:
        raise AssertionError(f"no tool call: {first.model_dump_json()}")
    # The SDK's own content blocks, sent back as they are.
    messages.append({"role": "assistant", "content": first.content})
    results = []
    for call in calls:
        city = call.input.get("city", "somewhere") if isinstance(call.input, dict) else "somewhere"
        results.append(
            {
                "type": "tool_result",
                "tool_use_id": call.id,
                "content": json.dumps({"city": city, "temperature": 21, "unit": "celsius"}),
            }
        )
    messages.append({"role": "user", "content": results})
    final = client.messages.create(model=model, max_tokens=32, tools=TOOLS, messages=messages)
    check_usage(final)
    return {
        "calls": [{"id": c.id, "name": c.name, "input": c.input} for c in calls],
        "final_stop_reason": final.stop_reason,
        "final_input_tokens": final.usage.input_tokens,
    }


def count_tokens(client, model):
    counted = client.messages.count_tokens(
        model=model,
        system="Be brief.",
        messages=[{"role": "user", "content": "What is a KV cache?"}],
        tools=TOOLS,
    )
    if counted.input_tokens <= 0:
        raise AssertionError(f"no count: {counted}")
    return {"input_tokens": counted.input_tokens}


def too_long(client, model):
    prompt = "token " * 200_000
    try:
        client.messages.create(
            model=model, max_tokens=8, messages=[{"role": "user", "content": prompt}]
        )
    except anthropic.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        error = body.get("error", {}) if isinstance(body, dict) else {}
        return {"status": e.status_code, "type": error.get("type"), "message": error.get("message")}
    raise AssertionError("an over-long prompt was accepted")


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    base_url, api_key, model = sys.argv[1:]
    client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0)
    cases = [
        ("messages.create", plain),
        ("messages.stream", streamed),
        ("messages.create.stream", raw_stream),
        ("tool_loop", tool_loop),
        ("messages.count_tokens", count_tokens),
        ("too_long", too_long),
    ]
    for name, case in cases:
        try:
            observations = case(client, model)
        except Exception as e:  # noqa: BLE001 - every failure is reported the same way
            fail(name, e)
        report(name, **observations)


if __name__ == "__main__":
    main()
