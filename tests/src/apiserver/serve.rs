// SPDX-License-Identifier: Apache-2.0
//! The accept loop. Connections are served by hyper directly (rather than
//! `axum::serve`) so that an outage can cut every open connection and refuse new ones.

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::body::Body;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::{Outage, Shared, http};

pub async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(err) => {
                // Typically EMFILE; back off instead of spinning.
                tracing::warn!(reason = %err, "test API server accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if shared.outage() == Outage::ConnectionsClosed {
            // Accept and close at once: the client sees the connection reset, as
            // when the apiserver process is gone.
            shared.count_refused_connection();
            drop(stream);
            continue;
        }
        let mut cut = shared.cut_connections.subscribe();
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: hyper::Request<Incoming>| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(http::handle(shared, request.map(Body::new)).await) }
            });
            let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                result = connection => {
                    if let Err(err) = result {
                        tracing::debug!(reason = %err, "test API server connection ended with an error");
                    }
                }
                // Dropping the connection future closes the socket mid-whatever.
                _ = cut.changed() => {}
            }
        });
    }
}
