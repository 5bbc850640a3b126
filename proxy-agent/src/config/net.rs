// SPDX-License-Identifier: Apache-2.0
//! Address parsing with the exact leniency of the Go helpers upstream uses
//! (`netutils.ParseIPSloppy`, `ParseCIDRSloppy`, `net.SplitHostPort`, `strconv.Atoi`,
//! `utilnet.ParsePortRange`, `proxyutil.AppendPortIfNeeded`). Rust's std parsers are
//! stricter (no leading zeros in IPv4 octets), which would turn configurations that
//! kube-proxy accepts into errors.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Like `netutils.ParseIPSloppy`: IPv4 octets may carry leading zeros and are read as
/// decimal ("010.001.0.1" is 10.1.0.1).
pub(crate) fn parse_ip_sloppy(text: &str) -> Option<IpAddr> {
    if text.contains(':') {
        return text.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let value = part.trim_start_matches('0');
        if value.len() > 3 {
            return None;
        }
        *octet = if value.is_empty() {
            0
        } else {
            value.parse::<u8>().ok()?
        };
    }
    if parts.next().is_some() {
        return None;
    }
    Some(IpAddr::V4(Ipv4Addr::from(octets)))
}

/// Go's `ip.To4() != nil`: plain IPv4 or an IPv4-mapped IPv6 address.
pub(crate) fn is_ipv4_like(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
    }
}

/// Like `netutils.ParseCIDRSloppy`: "addr/len" where addr is read sloppily; host bits may be
/// set (they are kept, as `net.ParseCIDR` keeps them in the returned IP).
pub(crate) fn parse_cidr_sloppy(text: &str) -> Option<IpNet> {
    let (addr, prefix) = text.split_once('/')?;
    let ip = parse_ip_sloppy(addr)?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let prefix = prefix.trim_start_matches('0');
    let prefix: u8 = if prefix.is_empty() {
        0
    } else {
        prefix.parse().ok()?
    };
    IpNet::new(ip, prefix).ok()
}

/// `net.SplitHostPort`: "host:port", "[v6]:port"; `None` where Go returns an error.
pub(crate) fn split_host_port(text: &str) -> Option<(&str, &str)> {
    let last_colon = text.rfind(':')?;
    let (host, open_after, close_after) = if text.starts_with('[') {
        let end = text.find(']')?;
        // The ']' must be followed by the last ':' and nothing else in between.
        if end + 1 != last_colon {
            return None;
        }
        (&text[1..end], 1, end + 1)
    } else {
        let host = &text[..last_colon];
        if host.contains(':') {
            return None;
        }
        (host, 0, 0)
    };
    if text[open_after..].contains('[') || text[close_after..].contains(']') {
        return None;
    }
    Some((host, &text[last_colon + 1..]))
}

/// `strconv.Atoi`: optional sign, decimal digits, no spaces.
pub(crate) fn go_atoi(text: &str) -> Option<i64> {
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<i64>().ok()
}

/// `proxyutil.AppendPortIfNeeded`: adds `port` to a bare IP; leaves "ip:port" and anything
/// unparseable alone (validation reports the latter).
pub(crate) fn append_port_if_needed(addr: &str, port: i32) -> String {
    if split_host_port(addr).is_some() {
        return addr.to_owned();
    }
    match parse_ip_sloppy(addr) {
        None => addr.to_owned(),
        Some(ip) if is_ipv4_like(ip) => format!("{addr}:{port}"),
        Some(_) => format!("[{addr}]:{port}"),
    }
}

/// An inclusive port range; `size == 0` means "unset" (the empty string).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub base: u16,
    pub size: u32,
}

/// `utilnet.ParsePortRange`: "", "N", "N-M" or "N+offset"; ports up to 65535.
pub(crate) fn parse_port_range(text: &str) -> Result<PortRange, String> {
    let value = text.trim();
    if value.is_empty() {
        return Ok(PortRange { base: 0, size: 0 });
    }
    let number =
        |s: &str| go_atoi(s).ok_or_else(|| format!("invalid number {s:?} in port range {value:?}"));
    let (low, high) = match (value.find('-'), value.find('+')) {
        (None, None) => {
            let port = number(value)?;
            (port, port)
        }
        (Some(dash), None) => (number(&value[..dash])?, number(&value[dash + 1..])?),
        (None, Some(plus)) => {
            let low = number(&value[..plus])?;
            (low, low.saturating_add(number(&value[plus + 1..])?))
        }
        (Some(_), Some(_)) => return Err(format!("unable to parse port range: {value}")),
    };
    if low > 65535 || high > 65535 {
        return Err(format!(
            "the port range cannot be greater than 65535: {value}"
        ));
    }
    if high < low {
        return Err(format!("end port cannot be less than start port: {value}"));
    }
    let base = u16::try_from(low).map_err(|_| format!("invalid start port in {value:?}"))?;
    Ok(PortRange {
        base,
        size: u32::try_from(high - low + 1).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sloppy_ip_accepts_leading_zeros() {
        assert_eq!(
            parse_ip_sloppy("010.001.0.1"),
            Some("10.1.0.1".parse().unwrap())
        );
        assert_eq!(parse_ip_sloppy("0.0.0.0"), Some("0.0.0.0".parse().unwrap()));
        assert_eq!(parse_ip_sloppy("::1"), Some("::1".parse().unwrap()));
        assert_eq!(
            parse_ip_sloppy("::ffff:1.2.3.4"),
            Some("::ffff:1.2.3.4".parse().unwrap())
        );
        for bad in [
            "",
            "1.2.3",
            "1.2.3.4.5",
            "256.0.0.1",
            "1.2.3.-4",
            "a.b.c.d",
            "1.2.3.4 ",
            "1..2.3",
            "fe80::1%eth0",
        ] {
            assert_eq!(parse_ip_sloppy(bad), None, "{bad}");
        }
    }

    #[test]
    fn ipv4_mapped_counts_as_ipv4() {
        assert!(is_ipv4_like("1.2.3.4".parse().unwrap()));
        assert!(is_ipv4_like("::ffff:1.2.3.4".parse().unwrap()));
        assert!(!is_ipv4_like("::1".parse().unwrap()));
    }

    #[test]
    fn sloppy_cidr() {
        assert_eq!(
            parse_cidr_sloppy("10.0.0.0/8"),
            Some("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(
            parse_cidr_sloppy("10.1.2.3/8"),
            Some("10.1.2.3/8".parse().unwrap())
        );
        assert_eq!(
            parse_cidr_sloppy("010.0.0.0/08"),
            Some("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(
            parse_cidr_sloppy("fd00::/64"),
            Some("fd00::/64".parse().unwrap())
        );
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "10.0.0.0/",
            "/8",
            "fd00::/129",
            "10.0.0.0/-1",
            "foo/8",
            "10.0.0.0/8/8",
        ] {
            assert_eq!(parse_cidr_sloppy(bad), None, "{bad}");
        }
    }

    #[test]
    fn split_host_port_matches_go() {
        assert_eq!(split_host_port("0.0.0.0:10256"), Some(("0.0.0.0", "10256")));
        assert_eq!(split_host_port("[::]:10256"), Some(("::", "10256")));
        assert_eq!(split_host_port(":80"), Some(("", "80")));
        assert_eq!(split_host_port("host:"), Some(("host", "")));
        assert_eq!(split_host_port("0.0.0.0"), None);
        assert_eq!(split_host_port("::1"), None);
        assert_eq!(split_host_port("::1:80"), None);
        assert_eq!(split_host_port("[::1]"), None);
        assert_eq!(split_host_port("[::1]x:80"), None);
        assert_eq!(split_host_port("[::1]:80]"), None);
        assert_eq!(split_host_port("a[b:80"), None);
    }

    #[test]
    fn appends_port_like_upstream() {
        assert_eq!(append_port_if_needed("0.0.0.0", 10256), "0.0.0.0:10256");
        assert_eq!(append_port_if_needed("::", 10256), "[::]:10256");
        assert_eq!(
            append_port_if_needed("::ffff:1.2.3.4", 1),
            "::ffff:1.2.3.4:1"
        );
        assert_eq!(append_port_if_needed("1.2.3.4:99", 10256), "1.2.3.4:99");
        assert_eq!(append_port_if_needed("not-an-ip", 10256), "not-an-ip");
        assert_eq!(append_port_if_needed("", 10256), "");
    }

    #[test]
    fn atoi_like_go() {
        assert_eq!(go_atoi("80"), Some(80));
        assert_eq!(go_atoi("+80"), Some(80));
        assert_eq!(go_atoi("-1"), Some(-1));
        assert_eq!(go_atoi(""), None);
        assert_eq!(go_atoi(" 80"), None);
        assert_eq!(go_atoi("8o"), None);
    }

    #[test]
    fn port_ranges() {
        assert_eq!(parse_port_range(""), Ok(PortRange { base: 0, size: 0 }));
        assert_eq!(parse_port_range("  "), Ok(PortRange { base: 0, size: 0 }));
        assert_eq!(
            parse_port_range("300-2000"),
            Ok(PortRange {
                base: 300,
                size: 1701
            })
        );
        assert_eq!(parse_port_range("80"), Ok(PortRange { base: 80, size: 1 }));
        assert_eq!(
            parse_port_range("100+10"),
            Ok(PortRange {
                base: 100,
                size: 11
            })
        );
        assert_eq!(parse_port_range("0-0"), Ok(PortRange { base: 0, size: 1 }));
        for bad in [
            "2000-300", "1-65536", "70000", "a-b", "1-2+3", "-5", "5-", "x", "5+-10",
        ] {
            assert!(parse_port_range(bad).is_err(), "{bad}");
        }
    }
}
