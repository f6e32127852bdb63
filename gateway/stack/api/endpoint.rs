//! The data-port routes.

use http::Method;

use crate::error::GatewayError;

/// A data-port endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /v1/chat/completions` (OpenAI)
    ChatCompletions,
    /// `POST /v1/completions` (OpenAI)
    Completions,
    /// `POST /generate` (SGLang native)
    Generate,
    /// `GET /v1/models`
    ListModels,
    /// `GET /v1/models/{id}` (the OpenAI SDK's `models.retrieve`)
    RetrieveModel,
}

impl Endpoint {
    /// Match a method and path; unknown paths are 404, known paths with the wrong method 405.
    pub fn classify(method: &Method, path: &str) -> Result<Endpoint, GatewayError> {
        let (endpoint, allowed) = match path {
            "/v1/chat/completions" => (Endpoint::ChatCompletions, Method::POST),
            "/v1/completions" => (Endpoint::Completions, Method::POST),
            "/generate" => (Endpoint::Generate, Method::POST),
            "/v1/models" => (Endpoint::ListModels, Method::GET),
            p if model_id(p).is_some() => (Endpoint::RetrieveModel, Method::GET),
            _ => {
                return Err(GatewayError::RouteNotFound {
                    method: method.to_string(),
                    path: path.to_owned(),
                    body_unread: false,
                })
            }
        };
        if *method != allowed {
            return Err(GatewayError::MethodNotAllowed {
                method: method.to_string(),
                path: path.to_owned(),
                body_unread: false,
            });
        }
        Ok(endpoint)
    }

    /// The path on the engine (the same as the client's).
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Generate => "/generate",
            Endpoint::ListModels | Endpoint::RetrieveModel => "/v1/models",
        }
    }

    /// A short metric label.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat",
            Endpoint::Completions => "completions",
            Endpoint::Generate => "generate",
            Endpoint::ListModels | Endpoint::RetrieveModel => "models",
        }
    }

    /// Whether the engine must speak SGLang's native API.
    pub fn needs_sglang(self) -> bool {
        self == Endpoint::Generate
    }
}

/// The model id of a `/v1/models/{id}` path, percent-decoded (ids such as `Qwen/Qwen3-8B`
/// arrive with their slash as is or as `%2F`); None for any other path or a bad escape.
pub fn model_id(path: &str) -> Option<String> {
    let raw = path
        .strip_prefix("/v1/models/")
        .filter(|id| !id.is_empty())?;
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_known_routes_and_rejects_others() {
        assert_eq!(
            Endpoint::classify(&Method::POST, "/generate").unwrap(),
            Endpoint::Generate
        );
        assert!(matches!(
            Endpoint::classify(&Method::GET, "/generate"),
            Err(GatewayError::MethodNotAllowed { .. })
        ));
        assert_eq!(
            Endpoint::classify(&Method::GET, "/v1/models/Qwen/Qwen3-8B").unwrap(),
            Endpoint::RetrieveModel
        );
        assert_eq!(
            model_id("/v1/models/Qwen%2FQwen3-8B").as_deref(),
            Some("Qwen/Qwen3-8B")
        );
        assert_eq!(model_id("/v1/models/qwen3").as_deref(), Some("qwen3"));
        assert_eq!(model_id("/v1/models/"), None);
        assert_eq!(model_id("/v1/models/%zz"), None);
        assert!(matches!(
            Endpoint::classify(&Method::POST, "/v2/x"),
            Err(GatewayError::RouteNotFound { .. })
        ));
    }
}
