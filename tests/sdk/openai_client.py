#!/usr/bin/env python3
"""What a new user tries with the official OpenAI Python SDK, against kvgate.

    python3 tests/sdk/openai_client.py --base-url http://127.0.0.1:8080/v1 --api-key KEY [--model qwen3]

Runs, in order, and prints one JSON line per step ({"step", "ok", ...}); exits 1 on the
first failure:
  1. models.retrieve(model)                       the SDK's GET /v1/models/{id}
  2. a chat whose content is a list of text parts (what agent frameworks send)
  3. a chat with chat_template_kwargs {"enable_thinking": false} (extra_body, as the SDK does)
  4. the SDK's tool loop: a forced tool call (tool_choice names the function), the tool's
     result sent back as a `tool` message after the assistant turn the SDK returned
     (`content: None` + `tool_calls`), then the final answer
  5. the same tool loop streamed
  6. (with --embeddings) embeddings.create for two inputs, as the SDK sends it (base64
     vectors, decoded by the SDK)
  7. (with --responses) responses.create, the same streamed, and a continuation by
     previous_response_id
  8. (with --image-model MODEL) a chat with an image (a PNG made here, as a data: URL) on a
     vision model, plain and streamed: counted by kvgate as the engine's processor sizes it

--loop-from-history skips asking the model for the tool call (an engine with random
weights cannot be relied on to call one) and sends an SDK-shaped history instead.
Every answer must be a success with usage; kvgate's guard turns a prompt count that
disagrees with the engine's into an error, so a 200 here also means the count was exact.
"""

import argparse
import base64
import json
import struct
import sys
import zlib

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]


def report(step, **fields):
    print(json.dumps({"step": step, "ok": True, **fields}), flush=True)


def fail(step, why):
    print(json.dumps({"step": step, "ok": False, "error": str(why)}), flush=True)
    sys.exit(1)


def weather(arguments):
    city = json.loads(arguments or "{}").get("city", "somewhere")
    return json.dumps({"city": city, "temperature": 21, "unit": "celsius"})


def tool_loop(client, model, stream, from_history):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    if from_history:
        call = {
            "id": "call_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        calls = [call]
    else:
        first = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=128,
        )
        choice = first.choices[0]
        if choice.finish_reason != "tool_calls" or not choice.message.tool_calls:
            raise AssertionError(f"no tool call: {first.model_dump_json()}")
        # The SDK's own assistant message, sent back as it is (content None).
        messages.append(choice.message.model_dump(exclude_none=False))
        calls = [c.model_dump() for c in choice.message.tool_calls]
    for call in calls:
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": weather(call["function"]["arguments"]),
            }
        )
    if not stream:
        final = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=16
        )
        if final.usage is None or final.usage.prompt_tokens <= 0:
            raise AssertionError(f"no usage: {final.model_dump_json()}")
        return final.usage.prompt_tokens, final.choices[0].finish_reason
    chunks = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=TOOLS,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage, finish = None, None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            finish = c.finish_reason or finish
    if usage is None or finish is None:
        raise AssertionError("the stream ended without usage or a finish reason")
    return usage.prompt_tokens, finish


def png(width, height):
    """A grey RGB PNG of width x height (standard library only)."""

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + b"\x80" * (3 * width) for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def image_chat(client, model, stream):
    url = "data:image/png;base64," + base64.b64encode(png(640, 480)).decode()
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]
    if not stream:
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
        return reply.usage.prompt_tokens
    usage = None
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None, "no usage in the stream"
    return usage.prompt_tokens


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default="qwen3")
    parser.add_argument("--loop-from-history", action="store_true")
    parser.add_argument("--embeddings", action="store_true")
    parser.add_argument("--responses", action="store_true")
    parser.add_argument("--image-model")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)

    try:
        model = client.models.retrieve(args.model)
        assert model.id == args.model, model
        report("models.retrieve", id=model.id)
    except Exception as e:  # noqa: BLE001 - every failure is reported the same way
        fail("models.retrieve", e)

    try:
        reply = client.chat.completions.create(
            model=args.model,
            messages=[
                {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Two parts:"},
                        {"type": "text", "text": "what is a KV cache?"},
                    ],
                },
            ],
            max_tokens=8,
        )
        report("content_parts", prompt_tokens=reply.usage.prompt_tokens)
    except Exception as e:  # noqa: BLE001
        fail("content_parts", e)

    try:
        reply = client.chat.completions.create(
            model=args.model,
            messages=[{"role": "user", "content": "Answer without thinking."}],
            max_tokens=8,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        report("enable_thinking_false", prompt_tokens=reply.usage.prompt_tokens)
    except Exception as e:  # noqa: BLE001
        fail("enable_thinking_false", e)

    for stream in (False, True):
        step = "tool_loop_streamed" if stream else "tool_loop"
        try:
            prompt_tokens, finish = tool_loop(client, args.model, stream, args.loop_from_history)
            report(step, prompt_tokens=prompt_tokens, finish_reason=finish)
        except Exception as e:  # noqa: BLE001
            fail(step, e)

    if args.embeddings:
        try:
            reply = client.embeddings.create(model=args.model, input=["a KV cache", "holds pages"])
            assert len(reply.data) == 2, reply
            assert all(len(d.embedding) > 0 for d in reply.data), reply
            assert reply.usage.prompt_tokens > 0, reply
            report("embeddings", prompt_tokens=reply.usage.prompt_tokens, dims=len(reply.data[0].embedding))
        except Exception as e:  # noqa: BLE001
            fail("embeddings", e)

    if args.responses:
        try:
            first = client.responses.create(
                model=args.model, input="Name a colour.", instructions="Be brief.", max_output_tokens=16
            )
            assert first.id.startswith("resp_") and first.usage.input_tokens > 0, first
            streamed = []
            with client.responses.stream(model=args.model, input="Count to three.", max_output_tokens=64) as stream:
                for event in stream:
                    streamed.append(event.type)
                final = stream.get_final_response()
            assert final.usage is not None and final.usage.input_tokens > 0, final
            follow = client.responses.create(
                model=args.model, input="And another?", previous_response_id=first.id, max_output_tokens=16
            )
            assert follow.previous_response_id == first.id, follow
            report("responses", id=first.id, events=len(streamed), follow_input_tokens=follow.usage.input_tokens)
        except Exception as e:  # noqa: BLE001
            fail("responses", e)

    if args.image_model:
        try:
            plain = image_chat(client, args.image_model, False)
            streamed = image_chat(client, args.image_model, True)
            # 640x480 on Qwen2.5-VL is 391 image tokens: far more than the text around it.
            assert plain == streamed and plain > 391, (plain, streamed)
            report("image_chat", prompt_tokens=plain)
        except Exception as e:  # noqa: BLE001
            fail("image_chat", e)


if __name__ == "__main__":
    main()
