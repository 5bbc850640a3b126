// SPDX-License-Identifier: Apache-2.0
//! Where a traced connection's client sits: on the node (one of its addresses), in a pod
//! of this node (routed through a device other than an uplink), or outside (routed through
//! an uplink, or unknown). The route lookup reads /proc/net/route and /proc/net/ipv6_route
//! of the current network namespace (longest prefix, then lowest metric); parsing is pure.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::ClientKind;

/// One route: prefix, its length, metric and device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub dest: IpAddr,
    pub prefix_len: u8,
    pub metric: u32,
    pub device: String,
}

fn contains(r: &Route, ip: &IpAddr) -> bool {
    match (r.dest, ip) {
        (IpAddr::V4(d), IpAddr::V4(a)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(r.prefix_len))
                .unwrap_or(0);
            u32::from(d) & mask == u32::from(*a) & mask
        }
        (IpAddr::V6(d), IpAddr::V6(a)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(r.prefix_len))
                .unwrap_or(0);
            u128::from(d) & mask == u128::from(*a) & mask
        }
        _ => false,
    }
}

/// Parses /proc/net/route (IPv4; addresses printed as native-order hex words).
pub fn parse_route4(text: &str) -> Vec<Route> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let dest = u32::from_str_radix(f.get(1)?, 16).ok()?;
            let metric = f.get(6)?.parse().ok()?;
            let mask = u32::from_str_radix(f.get(7)?, 16).ok()?;
            Some(Route {
                dest: IpAddr::V4(Ipv4Addr::from(dest.to_ne_bytes())),
                prefix_len: u32::from_be_bytes(mask.to_ne_bytes()).count_ones() as u8,
                metric,
                device: f.first()?.to_string(),
            })
        })
        .collect()
}

/// Parses /proc/net/ipv6_route.
pub fn parse_route6(text: &str) -> Vec<Route> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let dest = u128::from_str_radix(f.first()?, 16).ok()?;
            let prefix_len = u8::from_str_radix(f.get(1)?, 16).ok()?;
            let metric = u32::from_str_radix(f.get(5)?, 16).ok()?;
            Some(Route {
                dest: IpAddr::V6(Ipv6Addr::from(dest)),
                prefix_len,
                metric,
                device: f.get(9)?.to_string(),
            })
        })
        .collect()
}

/// The device the best route to `ip` leaves through.
pub fn route_device<'a>(routes: &'a [Route], ip: &IpAddr) -> Option<&'a str> {
    routes
        .iter()
        .filter(|r| contains(r, ip))
        .max_by_key(|r| (r.prefix_len, std::cmp::Reverse(r.metric)))
        .map(|r| r.device.as_str())
}

/// Classifies a client (pure).
pub fn classify_with(
    from: &IpAddr,
    node_addresses: &[IpAddr],
    routes: &[Route],
    uplinks: &[String],
) -> ClientKind {
    if from.is_loopback() || node_addresses.contains(from) {
        return ClientKind::Node;
    }
    match route_device(routes, from) {
        Some(dev) if !uplinks.is_empty() && !uplinks.iter().any(|u| u == dev) && dev != "lo" => {
            ClientKind::Pod
        }
        _ => ClientKind::External,
    }
}

/// This network namespace's addresses, with the device holding each.
pub fn local_addresses() -> Vec<(String, IpAddr)> {
    nix::ifaddrs::getifaddrs()
        .map(|addrs| {
            addrs
                .filter_map(|a| {
                    let s = a.address?;
                    let ip = s
                        .as_sockaddr_in()
                        .map(|v4| IpAddr::V4(v4.ip()))
                        .or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))?;
                    Some((a.interface_name, ip))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Devices holding a global address: the uplinks, when no program says which they are.
pub fn address_devices() -> Vec<String> {
    let mut out: Vec<String> = local_addresses()
        .into_iter()
        .filter(|(_, ip)| match ip {
            IpAddr::V4(a) => !a.is_loopback() && !a.is_link_local(),
            IpAddr::V6(a) => !a.is_loopback() && !a.is_unicast_link_local(),
        })
        .map(|(dev, _)| dev)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Classifies a client against this network namespace's addresses and routes.
pub fn classify(from: &IpAddr, uplinks: &[String]) -> ClientKind {
    let addresses: Vec<IpAddr> = local_addresses().into_iter().map(|(_, ip)| ip).collect();
    let mut routes = parse_route4(&std::fs::read_to_string("/proc/net/route").unwrap_or_default());
    routes.extend(parse_route6(
        &std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default(),
    ));
    classify_with(from, &addresses, &routes, uplinks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_and_the_longest_prefix_wins() {
        // 192.168.0.0/24 dev eth0, default via eth0, 10.180.0.2/32 dev kp0 (little endian).
        let v4 = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n\
                  eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                  eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  kp0\t0200B40A\t00000000\t0005\t0\t0\t0\tFFFFFFFF\t0\t0\t0\n";
        let routes = parse_route4(v4);
        if cfg!(target_endian = "little") {
            assert_eq!(routes[2].dest, "10.180.0.2".parse::<IpAddr>().unwrap());
            assert_eq!(routes[1].prefix_len, 24);
            assert_eq!(
                route_device(&routes, &"10.180.0.2".parse().unwrap()),
                Some("kp0")
            );
            assert_eq!(
                route_device(&routes, &"10.180.0.3".parse().unwrap()),
                Some("eth0")
            );
        }
        let v6 = "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n\
                  fd00000000000000000000000000b402 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000400 00000001 00000000 00000001      kp1\n";
        let routes6 = parse_route6(v6);
        assert_eq!(routes6.len(), 2);
        assert_eq!(
            route_device(&routes6, &"fd00::b402".parse().unwrap()),
            Some("kp1")
        );
        assert_eq!(
            route_device(&routes6, &"fd00::9".parse().unwrap()),
            Some("eth0")
        );
    }

    #[test]
    fn clients_are_classified_by_address_and_route() {
        let routes = vec![
            Route {
                dest: "0.0.0.0".parse().unwrap(),
                prefix_len: 0,
                metric: 0,
                device: "eth0".into(),
            },
            Route {
                dest: "10.180.0.2".parse().unwrap(),
                prefix_len: 32,
                metric: 0,
                device: "kp0".into(),
            },
        ];
        let node = ["192.168.0.2".parse().unwrap()];
        let uplinks = ["eth0".to_string()];
        let kind = |ip: &str| classify_with(&ip.parse().unwrap(), &node, &routes, &uplinks);
        assert_eq!(kind("192.168.0.2"), ClientKind::Node);
        assert_eq!(kind("127.0.0.1"), ClientKind::Node);
        assert_eq!(kind("10.180.0.2"), ClientKind::Pod);
        assert_eq!(kind("203.0.113.9"), ClientKind::External);
    }
}
