//! The data port's listener: the TCP/TLS accept loop and drain (`server`), one runtime per
//! data thread with accept balancing between them (`data_threads`, `accept_balance`), and
//! the deadlines of a connection (`conn_deadlines`), binding with the accept queue (`bind`).

pub mod accept_balance;
pub mod bind;
pub mod conn_deadlines;
pub mod data_threads;
pub mod server;
