//! HF-compatible chat template rendering with minijinja.
//!
//! HF transformers compiles chat templates in a sandboxed Jinja2 environment with
//! `trim_blocks=True, lstrip_blocks=True` (and Jinja2's default of dropping one trailing
//! newline), and adds `raise_exception`, `strftime_now` and its own `tojson` filter. This file
//! reproduces that environment so a rendered prompt is byte-identical to Python's, which
//! is what makes the gateway's token count exact.

use minijinja::value::Serde;
use minijinja::{Environment, Error, ErrorKind, Value};

use super::error::TokenizeError;
use super::prepare::llama_cpp::Caps;
use super::prepare::{content_format, cut_at_tag, Continuation, Formats, Normalize, Prepared};
use super::pyjson::tojson;
use super::strftime::strftime_now;
#[cfg(test)]
use super::strftime::strftime_utc;

/// Which Jinja engine's behaviour a render follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// Python's jinja2 under transformers (SGLang, vLLM).
    Jinja2,
    /// llama.cpp's own engine (`common/jinja`): attributes of undefined values are undefined.
    LlamaCpp,
}

/// transformers' message for an empty conversation.
const EMPTY_CONVERSATION: &str =
    "Cannot apply chat template to an empty conversation. Provide at least one message.";

/// Name under which the single chat template is stored in its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// A compiled chat template with the special tokens it may refer to.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    /// The same template for llama.cpp's Jinja (undefined values chain).
    chainable: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// The template calls `strftime_now`: its output changes with the date.
    reads_clock: bool,
    /// The content format each engine detects in it.
    formats: Formats,
}

/// Carried as the source of the minijinja error raised by `raise_exception`, so the
/// template's own message can be told apart from ordinary render failures.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RaisedException(String);

impl ChatTemplate {
    /// Compiles `source` the way HF transformers does.
    pub(crate) fn new(
        source: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, TokenizeError> {
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            // Jinja2 (and so HF) drops a single trailing newline of the template.
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        let environment = |undefined: minijinja::UndefinedBehavior| {
            let mut env = Environment::new();
            env.set_syntax(syntax.clone());
            env.set_undefined_behavior(undefined);
            env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
            env.add_function("raise_exception", raise_exception);
            env.add_function("strftime_now", strftime_now);
            env.add_filter("tojson", tojson);
            env.add_template_owned(TEMPLATE_NAME, source.clone())
                .map_err(|e| TokenizeError::Template(describe(&e)))?;
            Ok::<_, TokenizeError>(env)
        };
        let env = environment(minijinja::UndefinedBehavior::Lenient)?;
        // llama.cpp's own Jinja engine reads attributes of undefined values as undefined.
        let chainable = environment(minijinja::UndefinedBehavior::Chainable)?;
        let reads_clock = source.contains("strftime_now");
        let formats = Formats {
            sglang: content_format::detect_sglang(&source, syntax.clone()),
            vllm: content_format::detect_vllm(&source, syntax.clone()),
            mentions_developer: source.contains("\"developer\"") || source.contains("'developer'"),
            llama_cpp: Caps::default(),
        };
        let mut template = Self {
            env,
            chainable,
            bos_token,
            eos_token,
            reads_clock,
            formats,
        };
        template.formats.llama_cpp = Caps::probe(&source, |messages, agp| {
            template.render_as_given(Dialect::LlamaCpp, messages, None, agp, None)
        });
        Ok(template)
    }

    /// Whether the same arguments always render the same text (no clock in the template).
    pub(crate) fn is_pure(&self) -> bool {
        !self.reads_clock
    }

    /// The content format each engine detects in this template.
    pub(crate) fn formats(&self) -> &Formats {
        &self.formats
    }

    /// Renders the template like `apply_chat_template(..., tokenize=False)`.
    pub(crate) fn render(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Value>,
    ) -> Result<String, TokenizeError> {
        let messages = normalize_messages(messages)?;
        self.render_as_given(
            Dialect::Jinja2,
            &messages,
            tools,
            add_generation_prompt,
            kwargs,
        )
    }

    /// Renders a prepared chat (`prepare`): SGLang's render with a retry on other tools,
    /// then the engine's handling of a continued final message.
    pub(crate) fn render_prepared(&self, prepared: &Prepared) -> Result<String, TokenizeError> {
        let messages = match prepared.normalize {
            Normalize::AliasReasoning => {
                std::borrow::Cow::Owned(alias_reasoning(&prepared.messages))
            }
            Normalize::AsGiven => std::borrow::Cow::Borrowed(&prepared.messages),
        };
        // transformers refuses an empty conversation; llama.cpp renders it.
        if messages.as_array().is_some_and(Vec::is_empty) && prepared.dialect == Dialect::Jinja2 {
            return Err(TokenizeError::Refused(EMPTY_CONVERSATION.into()));
        }
        let variables = serde_json::Value::Object(prepared.variables.clone());
        let render = |tools: Option<&serde_json::Value>, agp: bool| {
            self.render_as_given(prepared.dialect, &messages, tools, agp, Some(&variables))
        };
        let with_retry = |agp: bool| match render(prepared.tools.as_ref(), agp) {
            Ok(text) => Ok(text),
            Err(first) if !prepared.retry_with_functions => Err(first),
            Err(_) => {
                let functions = prepared
                    .tools
                    .as_ref()
                    .and_then(|t| t.as_array())
                    .map(|list| {
                        serde_json::Value::Array(
                            list.iter()
                                .map(|t| t.get("function").cloned().unwrap_or_else(|| t.clone()))
                                .collect(),
                        )
                    });
                render(functions.as_ref(), agp)
            }
        };
        let rendered = with_retry(prepared.add_generation_prompt)?;
        match &prepared.continuation {
            Continuation::CutAtTag => cut_at_tag(&rendered),
            Continuation::None | Continuation::AppendEncoded(_) => Ok(rendered),
            Continuation::AfterGenerationPrompt(c) if c.empty => Ok(rendered),
            Continuation::AfterGenerationPrompt(c) => {
                // The template's own generation prompt: what rendering with it adds.
                let with_prompt = with_retry(true)?;
                let common = rendered
                    .char_indices()
                    .zip(with_prompt.chars())
                    .find(|((_, a), b)| a != b)
                    .map_or(rendered.len().min(with_prompt.len()), |((i, _), _)| i);
                let mut prompt = with_prompt.get(common..).unwrap_or_default().to_owned();
                if let Some((start, end)) = &c.reasoning_tags {
                    if let Some(at) = prompt.find(start.as_str()) {
                        prompt.truncate(at);
                    }
                    prompt.push_str(start);
                    prompt.push_str(&c.reasoning);
                    if c.content.is_some() {
                        prompt.push_str(end);
                    }
                }
                if let Some(content) = &c.content {
                    prompt.push_str(content);
                }
                Ok(rendered + &prompt)
            }
        }
    }

    fn render_as_given(
        &self,
        dialect: Dialect,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Value>,
    ) -> Result<String, TokenizeError> {
        let env = match dialect {
            Dialect::Jinja2 => &self.env,
            Dialect::LlamaCpp => &self.chainable,
        };
        let template = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TokenizeError::Template(describe(&e)))?;
        // HF passes `tools=None` when there are none, so `tools is none` holds in templates.
        let tools = tools.map_or(Value::from(()), |t| Value::from(Serde(t)));
        let special =
            |token: &Option<String>| token.as_deref().map_or(Value::UNDEFINED, Value::from);
        let specials = minijinja::context! {
            bos_token => special(&self.bos_token),
            eos_token => special(&self.eos_token),
        };
        // Like HF: extra template kwargs override the special tokens, never the arguments.
        let kwargs = kwargs.map_or(Value::UNDEFINED, |k| Value::from(Serde(k)));
        let base = minijinja::context! {
            messages => Value::from(Serde(messages)),
            tools => tools,
            add_generation_prompt => add_generation_prompt,
        };
        // In `merge_maps`, later maps win.
        let ctx = minijinja::value::merge_maps([specials, kwargs, base]);
        template.render(ctx).map_err(|e| match raised_message(&e) {
            Some(msg) => TokenizeError::TemplateRaised(msg),
            None => TokenizeError::Template(describe(&e)),
        })
    }
}

/// What transformers 5.x does to a conversation before rendering it
/// (`apply_chat_template`, `_normalize_chat_messages`, `_alias_reasoning_fields`):
/// - an empty conversation is an error;
/// - every message key whose value is `None` (JSON `null`) is dropped, so templates see a
///   missing key rather than `none`;
/// - the first non-null of `reasoning_content`, `thinking`, `reasoning` is copied to
///   `thinking` (placed first unless present) and `reasoning_content`.
fn normalize_messages(messages: &serde_json::Value) -> Result<serde_json::Value, TokenizeError> {
    use serde_json::{Map, Value as Json};
    let Json::Array(list) = messages else {
        return Err(TokenizeError::Template(
            "messages must be a list of message objects".into(),
        ));
    };
    if list.is_empty() {
        return Err(TokenizeError::Template(EMPTY_CONVERSATION.into()));
    }
    let mut out = Vec::with_capacity(list.len());
    for message in list {
        let Json::Object(map) = message else {
            return Err(TokenizeError::Template(format!(
                "Chat messages should be dicts, but got {message}"
            )));
        };
        let kept: Map<String, Json> = map
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let reasoning = ["reasoning_content", "thinking", "reasoning"]
            .iter()
            .find_map(|k| kept.get(*k))
            .cloned();
        let message = match reasoning {
            None => kept,
            Some(r) => {
                // `{"thinking": r, **message, "reasoning_content": r}` in Python's key order.
                let mut aliased = Map::new();
                aliased.insert("thinking".to_string(), r.clone());
                for (k, v) in kept {
                    aliased.insert(k, v);
                }
                aliased.insert("reasoning_content".to_string(), r);
                aliased
            }
        };
        out.push(Json::Object(message));
    }
    Ok(Json::Array(out))
}

/// transformers 5.16–5.22 (`_alias_reasoning_fields`): a message with `reasoning_content`,
/// `thinking` or `reasoning` gets the first of them as `thinking` (first) and
/// `reasoning_content`; null keys are kept.
fn alias_reasoning(messages: &serde_json::Value) -> serde_json::Value {
    use serde_json::{Map, Value as Json};
    let Json::Array(list) = messages else {
        return messages.clone();
    };
    Json::Array(
        list.iter()
            .map(|message| {
                let Json::Object(map) = message else {
                    return message.clone();
                };
                let reasoning = ["reasoning_content", "thinking", "reasoning"]
                    .iter()
                    .find_map(|k| map.get(*k).filter(|v| !v.is_null()))
                    .cloned();
                let Some(r) = reasoning else {
                    return message.clone();
                };
                let mut aliased = Map::new();
                aliased.insert("thinking".to_string(), r.clone());
                for (k, v) in map {
                    aliased.insert(k.clone(), v.clone());
                }
                aliased.insert("reasoning_content".to_string(), r);
                Json::Object(aliased)
            })
            .collect(),
    )
}

/// Formats a minijinja error with its detail and line, which its `Display` alone omits.
fn describe(err: &Error) -> String {
    match err.line() {
        Some(line) => format!("{err} (line {line})"),
        None => err.to_string(),
    }
}

/// Finds the message of a `raise_exception` call in an error's cause chain.
fn raised_message(err: &Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cause {
        if let Some(raised) = e.downcast_ref::<RaisedException>() {
            return Some(raised.0.clone());
        }
        cause = e.source();
    }
    None
}

/// `raise_exception(msg)`: templates use it to reject conversations they cannot render.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(RaisedException(msg)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: serde_json::Value) -> Result<String, TokenizeError> {
        ChatTemplate::new(src.to_string(), Some("<s>".into()), Some("</s>".into()))?
            .render(&messages, None, true, None)
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let out = render(
            "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}",
            json!([{"b": "<é & \"q\">\n", "a": [1, 2.5, true, null], "e": {}}]),
        )
        .unwrap();
        assert_eq!(
            out,
            "{\"b\": \"<é & \\\"q\\\">\\n\", \"a\": [1, 2.5, true, null], \"e\": {}}|{\n  \"b\": \"<é & \\\"q\\\">\\n\",\n  \"a\": [\n    1,\n    2.5,\n    true,\n    null\n  ],\n  \"e\": {}\n}"
        );
    }

    #[test]
    fn raise_exception_surfaces_the_template_message() {
        let err = render(
            "{{ raise_exception('Only user and assistant roles') }}",
            json!([{"role": "user", "content": "x"}]),
        )
        .unwrap_err();
        assert!(
            matches!(err, TokenizeError::TemplateRaised(ref m) if m == "Only user and assistant roles"),
            "{err:?}"
        );
    }

    #[test]
    fn trim_and_lstrip_blocks_and_trailing_newline_like_jinja2() {
        let out = render(
            "  {% if true %}\nA\n  {% endif %}\n{{ bos_token }}\n",
            json!([{"role": "user", "content": "x"}]),
        )
        .unwrap();
        assert_eq!(out, "A\n<s>");
    }

    #[test]
    fn pycompat_string_methods_work() {
        let out = render(
            "{{ messages[0].content.strip().upper() }}{{ 'a,b'.split(',')[-1] }}",
            json!([{"content": " hi "}]),
        )
        .unwrap();
        assert_eq!(out, "HIb");
    }

    #[test]
    fn strftime_formats_a_known_date() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        assert_eq!(
            strftime_utc("%d %b %Y %H:%M:%S %A %-d %%", 1_709_211_909),
            "29 Feb 2024 13:05:09 Thursday 29 %"
        );
    }
}
