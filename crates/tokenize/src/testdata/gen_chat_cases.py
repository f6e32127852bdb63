# Regenerate: python3 gateway/tokenize/testdata/gen_chat_cases.py (from the repository root; needs jinja2).
# Reference renders with Jinja2 configured like HF transformers' chat template compiler.
import json
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols

def raise_exception(m): raise TemplateError(m)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def render(model, messages, tools, agp):
    cfg = json.load(open(f"config/tokenizers/{model}/tokenizer_config.json"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    t = env.from_string(cfg["chat_template"])
    kw = {}
    for k in ("bos_token", "eos_token"):
        v = cfg.get(k)
        if isinstance(v, dict): v = v["content"]
        if v is not None: kw[k] = v
    return t.render(messages=messages, tools=tools, add_generation_prompt=agp, **kw)

tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather für a city <now>",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
multi = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello, who are you?"},
    {"role": "assistant", "content": "I am an assistant."},
    {"role": "user", "content": "Tell me a joke about Rust & C++."},
]
qwen_tools = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "<think>\nNeed tools.\n</think>\n\nLet me check.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
    {"role": "tool", "content": "{\"temp\": 21}"},
    {"role": "tool", "content": "{\"temp\": 25}"},
    {"role": "assistant", "content": "Paris 21, Rome 25."},
    {"role": "user", "content": "Thanks!"},
]
ds_tools = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "content": "{\"temp\": 21}"},
    {"role": "assistant", "content": "It is 21."},
    {"role": "user", "content": "Thanks!"},
]
cases = []
for model in ("qwen3", "deepseek_v3"):
    cases.append(dict(name=f"{model}-multi-turn", model=model, messages=multi, tools=None, add_generation_prompt=True))
    cases.append(dict(name=f"{model}-no-generation-prompt", model=model, messages=multi[:3], tools=None, add_generation_prompt=False))
cases.append(dict(name="qwen3-tools", model="qwen3", messages=qwen_tools, tools=tools, add_generation_prompt=True))
cases.append(dict(name="deepseek_v3-tools", model="deepseek_v3", messages=ds_tools, tools=tools, add_generation_prompt=True))
for c in cases:
    c["expected"] = render(c["model"], c["messages"], c["tools"], c["add_generation_prompt"])
json.dump(cases, open("gateway/tokenize/testdata/chat_cases.json", "w"), ensure_ascii=False, indent=1)
print(cases[4]["expected"]); print("----"); print(cases[5]["expected"])
