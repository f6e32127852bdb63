//! Ceilings on load, so that the gateway's memory and work stay bounded under any mix of
//! clients: requests in flight (global and per pool) and bytes buffered in memory. A
//! request over a ceiling is refused at once with 503 `overloaded` and `Retry-After: 1`;
//! nothing queues.

mod buffer_budget;
mod in_flight;

pub use buffer_budget::{BufferBudget, BufferPermit};
pub use in_flight::{InFlightLimit, InFlightSlot};
