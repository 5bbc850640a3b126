// SPDX-License-Identifier: Apache-2.0
//! A tiny blocking HTTP/1.0 GET (the `http-get` subcommand, run inside the node
//! namespace to poll the agent's /healthz), and RFC 3339 timestamps.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};

use super::{
    addr::parse_socket_addr,
    error::{Error, Result},
};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpResponse {
    pub status: u16,
    pub body: String,
}

/// `http://ip:port/path` into the address and the path.
pub fn split_url(url: &str) -> Result<(SocketAddr, String)> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| Error::Invalid(format!("only http:// URLs: {url:?}")))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    Ok((parse_socket_addr(authority)?, path))
}

pub fn get(url: &str, timeout: Duration) -> Result<HttpResponse> {
    get_with(url, timeout, |addr| {
        TcpStream::connect_timeout(&addr, timeout)
    })
}

/// GET `url` over the connection `connect` makes to its address (e.g. a socket made
/// inside another network namespace).
pub fn get_with(
    url: &str,
    timeout: Duration,
    connect: impl FnOnce(SocketAddr) -> std::io::Result<TcpStream>,
) -> Result<HttpResponse> {
    let (addr, path) = split_url(url)?;
    let context = format!("GET {url}");
    let mut stream = connect(addr).map_err(Error::io(context.clone()))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(Error::io(context.clone()))?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(Error::io(context.clone()))?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(Error::io(context.clone()))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(Error::io(context.clone()))?;
    parse_response(&String::from_utf8_lossy(&raw))
}

pub fn parse_response(text: &str) -> Result<HttpResponse> {
    let bad = || {
        Error::Invalid(format!(
            "not an HTTP response: {:?}",
            text.chars().take(80).collect::<String>()
        ))
    };
    let status_line = text.lines().next().ok_or_else(bad)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let body = text
        .split_once("\r\n\r\n")
        .or_else(|| text.split_once("\n\n"))
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok(HttpResponse { status, body })
}

/// An RFC 3339 time (`2025-01-02T03:04:05.123456Z`, or with a `+hh:mm` offset), and
/// whether it carries a fraction of a second.
pub fn parse_timestamp(text: &str) -> Option<(SystemTime, bool)> {
    let text = text.trim();
    let (base, offset_secs) =
        if let Some(base) = text.strip_suffix('Z').or_else(|| text.strip_suffix('z')) {
            (base, 0i64)
        } else {
            let split = text.len().checked_sub(6)?;
            let (base, offset) = text.split_at(split);
            let sign = match offset.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (h, m) = offset[1..].split_once(':')?;
            (
                base,
                sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60),
            )
        };
    let has_fraction = base.contains('.');
    let utc = humantime::parse_rfc3339_weak(base).ok()?;
    let magnitude = Duration::from_secs(offset_secs.unsigned_abs());
    // Local time = UTC + offset, so UTC = local - offset.
    let time = if offset_secs >= 0 {
        utc.checked_sub(magnitude)?
    } else {
        utc.checked_add(magnitude)?
    };
    Some((time, has_fraction))
}

#[cfg(test)]
mod tests {
    use std::{net::TcpListener, thread};

    use super::*;

    #[test]
    fn urls_and_responses() {
        let (addr, path) = split_url("http://127.0.0.1:10256/healthz").unwrap();
        assert_eq!(
            (addr.to_string(), path.as_str()),
            ("127.0.0.1:10256".into(), "/healthz")
        );
        assert_eq!(split_url("http://[::1]:80").unwrap().1, "/");
        assert!(split_url("https://x:1/").is_err());
        let r =
            parse_response("HTTP/1.1 503 Service Unavailable\r\nA: b\r\n\r\n{\"x\":1}").unwrap();
        assert_eq!((r.status, r.body.as_str()), (503, "{\"x\":1}"));
        assert!(parse_response("ECHO 1.2.3.4:5 FROM 6.7.8.9:10").is_err());
    }

    #[test]
    fn gets_from_a_server() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 512];
            while !request.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "request cut short");
                request.extend_from_slice(&buf[..n]);
            }
            assert!(String::from_utf8_lossy(&request).starts_with("GET /healthz HTTP/1.0\r\n"));
            s.write_all(
                b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"lastUpdated\":\"x\"}",
            )
            .unwrap();
        });
        let r = get(&format!("http://{addr}/healthz"), Duration::from_secs(2)).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "{\"lastUpdated\":\"x\"}");
    }

    #[test]
    fn timestamps() {
        let (z, frac) = parse_timestamp("2025-01-02T03:04:05.5Z").unwrap();
        assert!(frac);
        let (plus, _) = parse_timestamp("2025-01-02T05:04:05.5+02:00").unwrap();
        let (minus, _) = parse_timestamp("2025-01-02T02:04:05.5-01:00").unwrap();
        assert_eq!(z, plus);
        assert_eq!(z, minus);
        let (whole, frac) = parse_timestamp("2025-01-02T03:04:05Z").unwrap();
        assert!(!frac);
        assert_eq!(z.duration_since(whole).unwrap(), Duration::from_millis(500));
        // Go's zero time (a never-synced agent) is not a usable time.
        assert!(parse_timestamp("0001-01-01T00:00:00Z").is_none());
        assert!(parse_timestamp("yesterday").is_none());
    }
}
