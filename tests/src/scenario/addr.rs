// SPDX-License-Identifier: Apache-2.0
//! Address parsing that accepts what the API accepts: IPv4 octets with leading zeros,
//! read as decimal (`10.180.00.001` is `10.180.0.1`), as Go's legacy parser did.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

use super::error::{Error, Result};

pub fn parse_ip(text: &str) -> Result<IpAddr> {
    let text = text.trim();
    if text.contains(':') {
        return text
            .parse::<Ipv6Addr>()
            .map(IpAddr::V6)
            .map_err(|_| Error::Invalid(format!("bad IPv6 address {text:?}")));
    }
    let octets: Vec<&str> = text.split('.').collect();
    let bad = || Error::Invalid(format!("bad IPv4 address {text:?}"));
    if octets.len() != 4 {
        return Err(bad());
    }
    let mut out = [0u8; 4];
    for (slot, octet) in out.iter_mut().zip(&octets) {
        if octet.is_empty() || octet.len() > 3 || !octet.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        *slot = octet.parse().map_err(|_| bad())?;
    }
    Ok(IpAddr::V4(Ipv4Addr::from(out)))
}

/// `ip:port` or `[v6]:port`.
pub fn parse_socket_addr(text: &str) -> Result<SocketAddr> {
    let text = text.trim();
    let bad = || Error::Invalid(format!("bad address {text:?} (want ip:port or [v6]:port)"));
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        rest.split_once("]:").ok_or_else(bad)?
    } else {
        let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
        if host.contains(':') {
            return Err(bad());
        }
        (host, port)
    };
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok(SocketAddr::new(parse_ip(host)?, port))
}

/// `ip/len`, keeping the host bits (node addresses are written that way).
pub fn parse_cidr(text: &str) -> Result<IpNet> {
    let text = text.trim();
    let (ip, len) = text
        .split_once('/')
        .ok_or_else(|| Error::Invalid(format!("bad CIDR {text:?}")))?;
    let len: u8 = len
        .parse()
        .map_err(|_| Error::Invalid(format!("bad prefix length in {text:?}")))?;
    IpNet::new(parse_ip(ip)?, len)
        .map_err(|_| Error::Invalid(format!("bad prefix length in {text:?}")))
}

pub fn host_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_zeros_are_decimal() {
        assert_eq!(parse_ip("10.180.00.001").unwrap().to_string(), "10.180.0.1");
        assert_eq!(
            parse_ip(" 192.168.099.022").unwrap().to_string(),
            "192.168.99.22"
        );
        assert_eq!(parse_ip("010.0.0.010").unwrap().to_string(), "10.0.0.10");
        for bad in [
            "1.2.3",
            "1.2.3.256",
            "1.2.3.4.5",
            "1.2..4",
            "a.b.c.d",
            "1.2.3.0004",
        ] {
            assert!(parse_ip(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn socket_addresses() {
        assert_eq!(
            parse_socket_addr("1.2.3.004:80").unwrap().to_string(),
            "1.2.3.4:80"
        );
        assert_eq!(
            parse_socket_addr("[fd00::1]:53").unwrap().to_string(),
            "[fd00::1]:53"
        );
        for bad in ["1.2.3.4", "fd00::1:53", "[fd00::1]53", "1.2.3.4:99999"] {
            assert!(parse_socket_addr(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn cidrs() {
        let net = parse_cidr("203.0.113.000/025").unwrap();
        assert_eq!(net.to_string(), "203.0.113.0/25");
        assert_eq!(
            parse_cidr("192.168.0.2/24").unwrap().addr().to_string(),
            "192.168.0.2"
        );
        assert!(parse_cidr("10.0.0.0/33").is_err());
        assert!(parse_cidr("10.0.0.0").is_err());
    }
}
