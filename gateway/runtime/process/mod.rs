//! One gateway process: built from a config, serving one [`crate::generation::Generation`]
//! at a time and replacing it on reload.
//!
//! - `gateway`: assembling and running one gateway (data port, admin port, background
//!   loops); the process's [`crate::shared::Shared`] is made here.
//! - `build`: a generation from a config, taking over what a reload left unchanged.
//! - `live`, `live_stack`: the current generation, and each data thread's stack following it.
//! - `reload`: read the file again and install the next generation, all or nothing.
//! - `background`: discovery, health checks, sweeps, activity buckets.
//! - `capacity`: what admission will enforce per pool, and where the config is dangerous.
//! - `tokenizers`, `redact`: tokenizers loaded once per process; secrets out of logs.
//! - `replica`: this replica's name and the owner map of stored responses it shares.

mod background;
pub mod build;
pub mod capacity;
pub mod gateway;
pub mod live;
pub mod live_stack;
pub mod redact;
pub mod reload;
mod replica;
pub mod shared_redis;
pub mod tokenizers;
