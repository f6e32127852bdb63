//! The runtime around the stack, by job:
//!
//! - `process`: one gateway process — assembling it from a config ([`Gateway`]), the
//!   generations a reload builds and installs (`build`, `live`, `live_stack`, `reload`),
//!   its background loops, tokenizers and the capacity report it logs at start and reload.
//! - `listener`: the data port — TCP/TLS accept loop and drain (`server`), data threads and
//!   accept balancing, connection deadlines.
//! - `admin`: the admin port — routes, the pools and rollouts API (`api`), the status page.
//! - `error`: why a start or a reload failed.
//!
//! The commands that are not a running gateway (`kvgate check`, `preflight`, `demo`) are in
//! `crate::commands`.

pub mod admin;
pub mod error;
pub mod listener;
pub mod process;

pub use error::{ReloadError, StartError};
pub use process::capacity::CapacityReport;
pub use process::gateway::{Gateway, RunningGateway};
pub use process::tokenizers::load_tokenizer;
