// SPDX-License-Identifier: Apache-2.0
//! Address parsing with the API's historical leniency.
//!
//! The API server validated IPv4 addresses with Go's pre-1.17 parser, which accepts
//! leading zeros in octets and reads them as decimal ("010" is ten, never octal). Objects
//! stored back then are still served, so kube-proxy parses with a "sloppy" parser that
//! keeps that reading; these functions do the same and return canonical values.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Parses an IP address the way upstream's `ParseIPSloppy` does: IPv4 octets may carry
/// leading zeros (decimal), IPv4-mapped IPv6 addresses are IPv4 addresses. No surrounding
/// whitespace is allowed.
pub fn parse_ip_sloppy(text: &str) -> Option<IpAddr> {
    if let Some(v4) = parse_ipv4_sloppy(text) {
        return Some(IpAddr::V4(v4));
    }
    let v6 = parse_ipv6_sloppy(text)?;
    Some(match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    })
}

/// Parses a CIDR the way upstream's `ParseCIDRSloppy` does and masks it to its prefix
/// ("203.0.113.000/025" is 203.0.113.0/25). The prefix length may carry leading zeros.
pub fn parse_cidr_sloppy(text: &str) -> Option<IpNet> {
    let (addr, prefix) = text.split_once('/')?;
    let prefix = parse_decimal(prefix, 128)?;
    let net = if let Some(v4) = parse_ipv4_sloppy(addr) {
        IpNet::new(IpAddr::V4(v4), u8::try_from(prefix).ok()?).ok()?
    } else {
        IpNet::new(
            IpAddr::V6(parse_ipv6_sloppy(addr)?),
            u8::try_from(prefix).ok()?,
        )
        .ok()?
    };
    Some(net.trunc())
}

fn parse_ipv4_sloppy(text: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut fields = text.split('.');
    for octet in &mut octets {
        let value = parse_decimal(fields.next()?, 255)?;
        *octet = u8::try_from(value).ok()?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some(Ipv4Addr::from(octets))
}

fn parse_ipv6_sloppy(text: &str) -> Option<Ipv6Addr> {
    if !text.contains(':') {
        return None;
    }
    if let Ok(v6) = text.parse::<Ipv6Addr>() {
        return Some(v6);
    }
    // An embedded IPv4 tail ("::ffff:010.1.1.1") follows the IPv4 leniency.
    let (head, tail) = text.rsplit_once(':')?;
    let v4 = parse_ipv4_sloppy(tail)?;
    format!("{head}:{v4}").parse().ok()
}

/// A non-empty run of ASCII digits whose value is at most `max`; leading zeros allowed.
fn parse_decimal(text: &str, max: u32) -> Option<u32> {
    if text.is_empty() {
        return None;
    }
    let mut value: u32 = 0;
    for byte in text.bytes() {
        if !byte.is_ascii_digit() {
            return None;
        }
        value = value * 10 + u32::from(byte - b'0');
        if value > max {
            return None;
        }
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn leading_zeros_are_decimal() {
        assert_eq!(parse_ip_sloppy("172.30.0.041"), Some(ip("172.30.0.41")));
        assert_eq!(parse_ip_sloppy("10.180.00.001"), Some(ip("10.180.0.1")));
        assert_eq!(parse_ip_sloppy("010.010.010.010"), Some(ip("10.10.10.10")));
        assert_eq!(parse_ip_sloppy("1.2.3.004"), Some(ip("1.2.3.4")));
        assert_eq!(parse_ip_sloppy("0000000001.2.3.4"), Some(ip("1.2.3.4")));
    }

    #[test]
    fn malformed_addresses_are_refused() {
        for bad in [
            "",
            "1.2.3",
            "1.2.3.4.5",
            "1.2.3.256",
            "1.2..4",
            " 1.2.3.4",
            "1.2.3.4 ",
            "a.b.c.d",
            "1.2.3.-4",
            "fd00::g",
            "None",
        ] {
            assert_eq!(parse_ip_sloppy(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ipv6_is_canonical_and_mapped_ipv4_is_ipv4() {
        assert_eq!(
            parse_ip_sloppy("2001:0db8:0000::0001"),
            Some(ip("2001:db8::1"))
        );
        assert_eq!(parse_ip_sloppy("::ffff:1.2.3.4"), Some(ip("1.2.3.4")));
        assert_eq!(parse_ip_sloppy("::ffff:010.1.1.1"), Some(ip("10.1.1.1")));
        assert_eq!(
            parse_ip_sloppy("64:ff9b::010.1.1.1"),
            Some(ip("64:ff9b::a01:101"))
        );
    }

    #[test]
    fn cidrs_are_masked_and_lenient() {
        let net = |text: &str| text.parse::<IpNet>().unwrap();
        assert_eq!(
            parse_cidr_sloppy("203.0.113.000/025"),
            Some(net("203.0.113.0/25"))
        );
        assert_eq!(parse_cidr_sloppy("10.1.2.3/24"), Some(net("10.1.2.0/24")));
        assert_eq!(
            parse_cidr_sloppy("2001:db8::1/32"),
            Some(net("2001:db8::/32"))
        );
        assert_eq!(parse_cidr_sloppy("0.0.0.0/0"), Some(net("0.0.0.0/0")));
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0",
            "10.0.0.0/",
            "fd00::/129",
            " 10.0.0.0/8",
            "x/8",
        ] {
            assert_eq!(parse_cidr_sloppy(bad), None, "{bad:?}");
        }
    }
}
