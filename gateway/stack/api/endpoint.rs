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
}

impl Endpoint {
    /// Match a method and path; unknown paths are 404, known paths with the wrong method 405.
    pub fn classify(method: &Method, path: &str) -> Result<Endpoint, GatewayError> {
        let (endpoint, allowed) = match path {
            "/v1/chat/completions" => (Endpoint::ChatCompletions, Method::POST),
            "/v1/completions" => (Endpoint::Completions, Method::POST),
            "/generate" => (Endpoint::Generate, Method::POST),
            "/v1/models" => (Endpoint::ListModels, Method::GET),
            _ => {
                return Err(GatewayError::RouteNotFound {
                    method: method.to_string(),
                    path: path.to_owned(),
                })
            }
        };
        if *method != allowed {
            return Err(GatewayError::MethodNotAllowed {
                method: method.to_string(),
                path: path.to_owned(),
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
            Endpoint::ListModels => "/v1/models",
        }
    }

    /// A short metric label.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat",
            Endpoint::Completions => "completions",
            Endpoint::Generate => "generate",
            Endpoint::ListModels => "models",
        }
    }

    /// Whether the engine must speak SGLang's native API.
    pub fn needs_sglang(self) -> bool {
        self == Endpoint::Generate
    }
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
        assert!(matches!(
            Endpoint::classify(&Method::POST, "/v2/x"),
            Err(GatewayError::RouteNotFound { .. })
        ));
    }
}
