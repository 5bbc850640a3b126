// SPDX-License-Identifier: Apache-2.0
//! The demo's pods: `xtask demo-backend --name NAME --listen ADDR...`, a tiny HTTP server
//! that answers every request with its name, so each response says which pod served it.
//! The demo runs one per pod inside the pod's network namespace.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    thread,
    time::Duration,
};

use anyhow::Context as _;
use clap::Args;

#[derive(Args, Debug)]
pub struct BackendArgs {
    /// The name every response carries.
    #[arg(long)]
    pub name: String,
    /// Address to serve on; may be repeated.
    #[arg(long, required = true)]
    pub listen: Vec<SocketAddr>,
}

/// Serves until killed.
pub fn run(args: &BackendArgs) -> anyhow::Result<()> {
    let mut servers = Vec::new();
    for addr in &args.listen {
        let listener = TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
        let name = args.name.clone();
        servers.push(thread::spawn(move || serve(&listener, &name)));
    }
    for server in servers {
        // A server thread only ends by panicking; the others keep serving until killed.
        let _ = server.join();
    }
    Ok(())
}

fn serve(listener: &TcpListener, name: &str) {
    for stream in listener.incoming().flatten() {
        let name = name.to_string();
        thread::spawn(move || answer(stream, &name));
    }
}

/// Reads the request head (a client that never finishes it is dropped after a second)
/// and answers `name`.
fn answer(mut stream: TcpStream, name: &str) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let _ = stream.write_all(response(name).as_bytes());
}

fn response(name: &str) -> String {
    let body = format!("{name}\n");
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_its_name_over_http() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || serve(&listener, "hello-7"));
        let mut client = TcpStream::connect(addr).unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut reply = String::new();
        client.read_to_string(&mut reply).unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(head.contains("Content-Length: 8"));
        assert_eq!(body, "hello-7\n");
    }
}
