//! A whole answer, parsed once for every check that reads it.

use serde_json::Value;

use crate::accounting::TokenUsage;

use super::{
    check_native_item, check_openai, check_openai_parts, error_object, typed, Expectation, Markers,
    Shape, Trip,
};

/// A whole (non-streaming) answer, parsed once for every check that reads it: an OpenAI
/// answer as a typed view when that reads it exactly ([`typed`]), anything else as a tree.
#[derive(Debug)]
pub struct Answer<'a>(pub(super) Parsed<'a>);

#[derive(Debug)]
pub(super) enum Parsed<'a> {
    OpenAi(typed::OpenAiAnswer<'a>),
    /// `None`: not JSON.
    Tree(Option<Value>),
}

impl<'a> Answer<'a> {
    /// Parse `body`, an answer of `shape` (not JSON is kept as such: [`Answer::check`]
    /// trips on it).
    pub fn parse(body: &'a [u8], shape: Shape) -> Self {
        if shape == Shape::OpenAi {
            if let Some(view) = typed::OpenAiAnswer::parse(body) {
                return Self(Parsed::OpenAi(view));
            }
        }
        Self(Parsed::Tree(serde_json::from_slice::<Value>(body).ok()))
    }

    /// The I1 checks of the answer.
    pub fn check(&self, shape: Shape, markers: &Markers, expect: &Expectation) -> Result<(), Trip> {
        let v = match &self.0 {
            Parsed::OpenAi(view) => {
                let choices = view.choices.array().map(|c| {
                    c.iter()
                        .map(|choice| (choice.finish_reason.as_str(), choice.marker_text()))
                });
                let prompt_tokens = view.prompt_tokens();
                return check_openai_parts(choices, prompt_tokens, markers, expect);
            }
            Parsed::Tree(v) => v,
        };
        let Some(v) = v else {
            return Err(Trip::EmptyResult {
                detail: "the answer is not JSON",
            });
        };
        if let Some(trip) = error_object(v) {
            return Err(trip);
        }
        match (shape, v) {
            (Shape::Native, Value::Array(items)) if !items.is_empty() => items
                .iter()
                .enumerate()
                .try_for_each(|(i, item)| check_native_item(item, i, markers, expect)),
            (Shape::Native, Value::Object(_)) => check_native_item(v, 0, markers, expect),
            (Shape::Native, _) => Err(Trip::EmptyResult {
                detail: "the answer is empty",
            }),
            (Shape::OpenAi, _) => check_openai(v, markers, expect),
        }
    }

    /// The engine's usage split into prompt, completion and cached tokens (the tenant's
    /// account).
    pub fn token_usage(&self, shape: Shape) -> Option<TokenUsage> {
        let v = match &self.0 {
            Parsed::OpenAi(view) => return view.token_usage(),
            Parsed::Tree(v) => v.as_ref()?,
        };
        match shape {
            Shape::OpenAi => TokenUsage::from_usage(v.get("usage")?),
            Shape::Native => TokenUsage::from_answer(v),
        }
    }

    /// The engine's usage: prompt + completion tokens over all samples.
    pub fn usage(&self, shape: Shape) -> Option<u64> {
        let v = match &self.0 {
            Parsed::OpenAi(view) => return view.total_tokens(),
            Parsed::Tree(v) => v.as_ref()?,
        };
        match shape {
            Shape::OpenAi => v
                .get("usage")
                .and_then(|x| x.get("total_tokens"))
                .and_then(Value::as_u64),
            Shape::Native => {
                let items: Vec<&Value> = match v {
                    Value::Array(items) => items.iter().collect(),
                    other => vec![other],
                };
                let total = items
                    .iter()
                    .filter_map(|i| i.get("meta_info"))
                    .map(|m| {
                        ["prompt_tokens", "completion_tokens"]
                            .iter()
                            .filter_map(|k| m.get(*k).and_then(Value::as_u64))
                            .sum::<u64>()
                    })
                    .sum();
                Some(total)
            }
        }
    }

    /// The generated texts (for the leak scan), borrowed from the parsed answer.
    pub fn texts(&self, shape: Shape) -> Vec<&str> {
        let v = match &self.0 {
            Parsed::OpenAi(view) => {
                return view
                    .choices
                    .array()
                    .into_iter()
                    .flatten()
                    .filter_map(typed::Choice::scan_text)
                    .collect()
            }
            Parsed::Tree(v) => v,
        };
        let Some(v) = v else {
            return Vec::new();
        };
        let items: Vec<&Value> = match (v, shape) {
            (Value::Array(items), Shape::Native) => items.iter().collect(),
            (_, Shape::Native) => vec![v],
            (_, Shape::OpenAi) => v
                .get("choices")
                .and_then(Value::as_array)
                .map(|c| c.iter().collect())
                .unwrap_or_default(),
        };
        items
            .into_iter()
            .filter_map(|i| {
                i.get("text")
                    .or_else(|| i.get("message").and_then(|x| x.get("content")))
                    .and_then(Value::as_str)
            })
            .collect()
    }
}

/// Check a whole (non-streaming) answer.
pub fn check_answer(
    shape: Shape,
    body: &[u8],
    markers: &Markers,
    expect: &Expectation,
) -> Result<(), Trip> {
    Answer::parse(body, shape).check(shape, markers, expect)
}
