//! Binding a listening port with the configured accept queue (`[server] listen_backlog`):
//! `TcpListener::bind` fixes it (mio: 1024), and a burst of new connections beyond it is
//! dropped or reset by the kernel instead of waiting to be accepted.

use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpSocket};

/// Listen on `addr` with an accept queue of `backlog` (Linux caps it at
/// `net.core.somaxconn`).
pub fn bind_with_backlog(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}
