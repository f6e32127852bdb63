//! Why a remote image was not read. Every variant is the client's 400: the URL is theirs.
//! Messages name the reason in words a client can act on; `code()` is the metrics label.

use std::net::IpAddr;
use std::time::Duration;

use crate::address::Forbidden;

/// Why a remote image fetch failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The pool does not fetch remote images.
    #[error("remote image URLs are not accepted for this model: send the image inline as a base64 data: URL")]
    Disabled,
    /// The URL does not parse, or names no host.
    #[error("invalid image URL: {reason}")]
    InvalidUrl {
        /// What is wrong with it.
        reason: String,
    },
    /// A scheme the policy does not fetch (`ftp`, `file`, or `http` when only `https` is).
    #[error(
        "image URL scheme `{scheme}` is not allowed: remote images are fetched over {allowed} only"
    )]
    Scheme {
        /// The scheme given.
        scheme: String,
        /// The schemes that are fetched, in words.
        allowed: &'static str,
    },
    /// `user:password@` in the URL.
    #[error("image URLs may not carry credentials (user:password@host)")]
    Credentials,
    /// The host is, or resolves to, an address images may not come from.
    #[error("image URL host `{host}` resolves to {class} ({addr}): remote images may only come from public addresses")]
    Forbidden {
        /// The host as the URL names it.
        host: String,
        /// The address refused.
        addr: IpAddr,
        /// Why.
        class: Forbidden,
    },
    /// DNS failed.
    #[error("image URL host `{host}` could not be resolved: {reason}")]
    Dns {
        /// The host.
        host: String,
        /// The resolver's error.
        reason: String,
    },
    /// DNS answered no address.
    #[error("image URL host `{host}` has no address")]
    NoAddress {
        /// The host.
        host: String,
    },
    /// No checked address accepted a connection.
    #[error("could not connect to image host `{host}`: {reason}")]
    Connect {
        /// The host.
        host: String,
        /// The last connection error.
        reason: String,
    },
    /// The TLS handshake failed (an untrusted or mismatched certificate, say).
    #[error("TLS to image host `{host}` failed: {reason}")]
    Tls {
        /// The host.
        host: String,
        /// rustls's error.
        reason: String,
    },
    /// The host broke HTTP.
    #[error("image host `{host}` sent a bad HTTP response: {reason}")]
    Protocol {
        /// The host.
        host: String,
        /// hyper's error.
        reason: String,
    },
    /// A status other than 2xx (or a followed redirect).
    #[error("image URL answered HTTP {status}: expected 200 with an image")]
    Status {
        /// The status code.
        status: u16,
    },
    /// A content type that is not an image.
    #[error("image URL serves `{content_type}`, not an image")]
    ContentType {
        /// The `Content-Type` given.
        content_type: String,
    },
    /// A compressed body (it was asked for `identity`): the bytes would not be the image.
    #[error("image URL sent the image with content encoding `{encoding}`; only unencoded images are read")]
    ContentEncoding {
        /// The `Content-Encoding` given.
        encoding: String,
    },
    /// A redirect without a usable `Location`.
    #[error("image URL redirect is invalid: {reason}")]
    Redirect {
        /// What is wrong with it.
        reason: String,
    },
    /// More redirects than the policy follows.
    #[error("image URL redirected more than {max} times")]
    TooManyRedirects {
        /// The policy's limit.
        max: usize,
    },
    /// Reading the image's header needs more bytes than the policy reads.
    #[error("remote image too large: its header is not within the first {max_bytes} bytes, the most that is read")]
    TooLarge {
        /// The policy's limit.
        max_bytes: usize,
    },
    /// The whole fetch took longer than the policy allows.
    #[error("fetching the image URL took longer than {}s", .after.as_secs_f64())]
    Timeout {
        /// The policy's limit.
        after: Duration,
    },
    /// The caller refused the image (e.g. a decoding bomb).
    #[error("{0}")]
    Refused(String),
}

impl FetchError {
    /// A stable, low-cardinality label for metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Disabled => "remote_disabled",
            Self::InvalidUrl { .. } => "invalid_url",
            Self::Scheme { .. } => "scheme",
            Self::Credentials => "credentials",
            Self::Forbidden { .. } => "forbidden_address",
            Self::Dns { .. } | Self::NoAddress { .. } => "dns",
            Self::Connect { .. } => "connect",
            Self::Tls { .. } => "tls",
            Self::Protocol { .. } => "protocol",
            Self::Status { .. } => "status",
            Self::ContentType { .. } => "content_type",
            Self::ContentEncoding { .. } => "content_encoding",
            Self::Redirect { .. } => "redirect",
            Self::TooManyRedirects { .. } => "too_many_redirects",
            Self::TooLarge { .. } => "too_large",
            Self::Timeout { .. } => "timeout",
            Self::Refused(_) => "refused",
        }
    }

    /// A finer, still bounded label: for a forbidden address, which kind (`loopback`,
    /// `private`, `metadata`, ...); otherwise the same as [`code`](Self::code).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Forbidden { class, .. } => class.label(),
            other => other.code(),
        }
    }

    /// The HTTP status for the client: always 400, the URL is the client's.
    pub fn status(&self) -> u16 {
        400
    }
}

/// Why an [`ImageFetcher`](crate::ImageFetcher) could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// Remote fetches are allowed but the system has no CA certificates to verify hosts by.
    #[error("remote image fetching is enabled but the system has no CA certificates ({0})")]
    NoRoots(String),
    /// rustls refused the configuration.
    #[error("TLS configuration for image fetching: {0}")]
    Tls(String),
}
