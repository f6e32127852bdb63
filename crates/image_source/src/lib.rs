//! Where an image comes from (issue 41, item 3): the bytes of an image a request names,
//! read only as far as the caller needs them.
//!
//! - **Inline** `data:` URLs ([`DataUrl`]): counted in place. The encoded length is capped
//!   before anything is decoded, the whole text is checked to be base64 without allocating,
//!   and only the prefix the caller asks for is decoded.
//! - **Remote** `http(s)://` URLs ([`ImageFetcher`]): fetched only when the pool's
//!   [`FetchPolicy`] allows it. The fetcher resolves the host itself, refuses every private,
//!   loopback, link-local or otherwise non-public address (IP literals in any spelling,
//!   IPv4-mapped and NAT64 forms included) unless an operator allow-listed it, and connects
//!   to the very address it checked, so a DNS answer that changes afterwards (rebinding)
//!   cannot move the connection. Redirects are followed by hand, each hop checked from
//!   scratch. Size and total time are capped, and the body is read only until the caller's
//!   closure says it has enough (then the connection is dropped).
//!
//! Both sides take the same kind of closure, `FnMut(&[u8]) -> Enough`, called with the bytes
//! read so far: the image header parser lives elsewhere, and this crate does not depend on
//! it. Decoding bombs (huge declared dimensions) are the closure's to refuse
//! ([`Enough::Stop`]); nothing here allocates more than the caps allow.
//!
//! [`read_image`] is the one entry point: it sends a URL to the one or the other.
//!
//! Every error is a client's 400 with a message naming the reason, plus a stable `code()`
//! for metrics labels.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod address;
mod cidr;
mod data_url;
mod enough;
mod fetch;
mod policy;
mod resolve;
mod source;

pub use address::Forbidden;
pub use cidr::{CidrError, IpCidr};
pub use data_url::{DataUrl, DataUrlError, DataUrlLimits};
pub use enough::{Enough, Prefix};
pub use fetch::{FetchError, ImageFetcher, SetupError};
pub use policy::FetchPolicy;
pub use resolve::{Resolve, Resolved, SystemResolver};
pub use source::{read_image, ImageSourceError};
