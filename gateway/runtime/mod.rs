//! The runtime around the stack: the process (`app`: config, state, reload), the listeners
//! (`server`: TCP/TLS accept loop, drain; `conn_deadlines`), the admin port (`admin`, its pools and rollouts API `admin_api`, its HTML `status_page`), reloading the config (`reload`), and the commands that
//! are not the request path (`check`, `demo`).

pub mod accept_balance;
pub mod admin;
pub mod admin_api;
pub mod app;
mod background;
pub mod check;
pub mod conn_deadlines;
pub mod data_threads;
pub mod demo;
mod generation;
pub mod live;
pub mod live_stack;
pub mod preflight;
pub mod redact;
pub mod reload;
pub mod server;
pub mod status_page;
