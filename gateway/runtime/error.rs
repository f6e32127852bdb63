//! Why the runtime could not do what it was asked: start a gateway ([`StartError`]) or
//! reload its config ([`ReloadError`]). Kept apart from what raises them, so the admin port,
//! the process and the commands share them without importing each other.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::ConfigError;
use crate::tls::TlsError;
use kvgate_tokenize::TokenizeError;

/// Why a gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot listen on {addr} ({key}): {source}")]
    Bind {
        addr: SocketAddr,
        key: &'static str,
        source: std::io::Error,
    },
    #[error("listener address: {0}")]
    Io(#[from] std::io::Error),
    #[error("images: {0}")]
    Vision(String),
    #[error("model `{model}`: {source}")]
    Tokenizer {
        model: String,
        source: TokenizeError,
    },
    #[error("{0}")]
    Limits(String),
    #[error("cannot read server.admin_token_file {path}: {source}")]
    AdminToken {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the audit log: {0}")]
    Audit(std::io::Error),
    #[error("admission.strict is set and the configuration is mismatched:\n{0}")]
    Mismatch(String),
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("certificates not reloaded, the running ones are kept: {0}")]
    Certificates(#[from] TlsError),
    #[error(transparent)]
    Build(#[from] StartError),
    /// The task building the new generation panicked or was cancelled: a gateway bug, not
    /// the file's fault.
    #[error("building the new config stopped before it finished: {0}")]
    Interrupted(String),
}

impl ReloadError {
    /// The error code of the admin port's answer.
    pub fn code(&self) -> &'static str {
        match self {
            ReloadError::Config(_) | ReloadError::Build(_) => "invalid_config",
            ReloadError::Certificates(_) => "invalid_certificate",
            ReloadError::Interrupted(_) => "internal_error",
        }
    }

    /// The admin port's status: the file's fault is 400, the gateway's own is 500.
    pub fn status(&self) -> http::StatusCode {
        match self {
            ReloadError::Interrupted(_) => http::StatusCode::INTERNAL_SERVER_ERROR,
            _ => http::StatusCode::BAD_REQUEST,
        }
    }

    /// The OpenAI-style error type of the admin port's answer.
    pub fn kind(&self) -> &'static str {
        match self {
            ReloadError::Interrupted(_) => "server_error",
            _ => "invalid_request_error",
        }
    }
}
