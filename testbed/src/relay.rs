// SPDX-License-Identifier: Apache-2.0
//! A TCP relay from a listener in another network namespace (a node's own 127.0.0.1) to the
//! API server on this one's: loopback does not cross namespaces, and a relay adds no
//! interface or route to the node, whose addresses a proxy under test treats as its own.
//! Bytes pass untouched (TLS end to end); when either side closes, the other is closed.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};

/// Serves `listener` (bound in whatever namespace the node's clients are in) forever,
/// connecting each client to `upstream` from this process's namespace. An upstream that
/// refuses (the API server away) closes the client's connection at once, as a refused
/// connection would.
pub async fn relay(listener: TcpListener, upstream: SocketAddr) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
        });
    }
}

/// A listener on `addr` inside network namespace `netns`, ready for [`relay`] (call from
/// inside a tokio runtime).
pub fn listen_in(netns: &str, addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener =
        netns_scaffold::bind_tcp_listener_in(netns, addr).map_err(std::io::Error::other)?;
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}
