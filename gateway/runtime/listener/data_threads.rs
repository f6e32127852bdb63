//! The data port served thread per core: `server.data_threads` threads, each running its own
//! single-threaded runtime, accept loop and engine connection pool.
//!
//! On tokio's work-stealing runtime a proxied request hops threads: the client connection's
//! task, the engine connection's task (hyper's client runs each connection as a task of its
//! own) and the stages' wakeups land on whichever worker is free, and every hop to a parked
//! worker is a futex wake and a context switch. Measured on the 2-core harness machine with
//! the default config: about 1 context switch and 20 µs of CPU per request went to that.
//! Here a connection, its requests and the engine connections they use stay on one thread —
//! nginx's worker model — and only shared state (limits, fingerprints, windows, budgets)
//! crosses threads, through atomics and locks that never wait on I/O.
//!
//! Every thread accepts on the same listening socket (the kernel hands each connection to
//! one of them, and a thread ahead of the others steps back: `accept_balance`); the
//! connection cap is one semaphore over all of them. Shutdown reaches every
//! thread; the returned future resolves once all of them have drained.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::accept_balance::AcceptBalance;
use super::server::{
    serve_within, ConnectionLimits, ConnectionService, Listening, ResponseBody, Shutdown,
};

/// Serve `listener` on `threads` threads; `make_service` builds each thread's stack (with
/// its own engine client, so pooled connections stay on their thread).
pub async fn serve_on_threads<F, S, B>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    threads: usize,
    make_service: F,
    shutdown: Shutdown,
    drain_timeout: Duration,
    limits: ConnectionLimits,
) -> std::io::Result<()>
where
    F: Fn() -> S,
    S: ConnectionService<B>,
    B: ResponseBody,
{
    let listener = listener.into_std()?;
    let template = Listening {
        tls,
        shutdown,
        drain_timeout,
        connections: Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1))),
        limits,
        balance: None,
    };
    let balance = AcceptBalance::new(threads.max(1));
    let mut finished = Vec::with_capacity(threads);
    for index in 0..threads.max(1) {
        let listener = listener.try_clone()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name(format!("kvgate-data-{index}"))
            .build()?;
        let (done, finished_rx) = tokio::sync::oneshot::channel::<()>();
        let (service, mut listening) = (make_service(), template.clone());
        if threads > 1 {
            listening.balance = Some(balance.slot(index));
        }
        std::thread::Builder::new()
            .name(format!("kvgate-data-{index}"))
            .spawn(move || {
                runtime.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(listener) => serve_within(listener, service, listening).await,
                        Err(e) => tracing::error!(error = %e, "data thread cannot listen"),
                    }
                });
                let _ = done.send(());
            })?;
        finished.push(finished_rx);
    }
    drop(listener);
    for thread in finished {
        // An error only means the thread is gone: it has stopped serving either way.
        let _ = thread.await;
    }
    Ok(())
}
