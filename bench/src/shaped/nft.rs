// SPDX-License-Identifier: Apache-2.0
//! The nftables shape of upstream kube-proxy's nftables mode (`table ip kube-proxy`), as
//! `nft -f` input.

use std::{collections::BTreeSet, fmt::Write as _, net::SocketAddrV4};

use super::{ShapedOptions, ShapedService, changed, hash_prefix, live};

pub const TABLE: &str = "ip kube-proxy";

/// `ns/name/tcp/port`: the readable part of upstream's chain names ("/" cannot occur in
/// the parts, so it separates them).
fn base(svc: &ShapedService) -> String {
    format!("{}/{}/tcp/{}", svc.namespace, svc.name, svc.port_name)
}

/// `service-<hash>-ns/name/tcp/port`, the hash being of the readable part.
pub fn service_chain(svc: &ShapedService) -> String {
    let base = base(svc);
    format!("service-{}-{base}", hash_prefix(&[&base], 8))
}

/// `endpoint-<hash>-ns/name/tcp/port__ip/port`.
pub fn endpoint_chain(svc: &ShapedService, ep: &SocketAddrV4) -> String {
    let base = format!("{}__{}/{}", base(svc), ep.ip(), ep.port());
    format!("endpoint-{}-{base}", hash_prefix(&[&base], 8))
}

/// The table, its sets and maps, the hook chains and the fixed rules. Upstream's
/// filter-side checks for services without endpoints and invalid ClusterIP ports are
/// kept (they run for every new connection); NodePort, firewall and external-IP parts
/// are not (ClusterIP traffic never reaches them).
const BASE: &str = r#"add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy masquerading
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }
add chain ip kube-proxy services
add chain ip kube-proxy service-endpoints-check
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump cluster-ips-check
add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule ip kube-proxy masquerading mark and 0x4000 == 0 return
add rule ip kube-proxy masquerading mark set mark xor 0x4000
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
"#;

const TABLE_LINE: &str = "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n";

/// The rules of a service chain: the masquerade mark for non-pod sources, then one
/// `numgen` verdict map over the endpoint chains.
fn service_chain_rules(out: &mut String, svc: &ShapedService, opts: &ShapedOptions) {
    let chain = service_chain(svc);
    if let Some(cidr) = opts.cluster_cidr {
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "add rule {TABLE} {chain} ip daddr {} ip saddr != {cidr} jump mark-for-masquerade",
            svc.cluster_ip
        );
    }
    let targets: Vec<String> = svc
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| format!("{i} : goto {}", endpoint_chain(svc, ep)))
        .collect();
    let _ = writeln!(
        out,
        "add rule {TABLE} {chain} numgen random mod {} vmap {{ {} }}",
        svc.endpoints.len(),
        targets.join(" , ")
    );
}

/// An endpoint chain's rules: the hairpin masquerade mark, the DNAT.
fn endpoint_chain_rules(out: &mut String, chain: &str, ep: &SocketAddrV4) {
    let _ = writeln!(
        out,
        "add rule {TABLE} {chain} ip saddr {} jump mark-for-masquerade",
        ep.ip()
    );
    let _ = writeln!(
        out,
        "add rule {TABLE} {chain} meta l4proto tcp dnat to {ep}"
    );
}

fn elements(verb: &str, out: &mut String, svc: &ShapedService, with_verdict: bool) {
    let _ = writeln!(
        out,
        "{verb} element {TABLE} cluster-ips {{ {} }}",
        svc.cluster_ip
    );
    let verdict = if with_verdict {
        format!(" : goto {}", service_chain(svc))
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "{verb} element {TABLE} service-ips {{ {} . tcp . {}{verdict} }}",
        svc.cluster_ip, svc.port
    );
}

/// A whole service: its chains (created, or emptied when they may exist), then their
/// rules (a `goto` needs its target chain to exist).
/// `fresh`: the chains are known not to exist (full load), so no flush is written.
fn write_service(out: &mut String, svc: &ShapedService, opts: &ShapedOptions, fresh: bool) {
    let chains: Vec<String> = svc
        .endpoints
        .iter()
        .map(|ep| endpoint_chain(svc, ep))
        .collect();
    for chain in std::iter::once(&service_chain(svc)).chain(&chains) {
        let _ = writeln!(out, "add chain {TABLE} {chain}");
        if !fresh {
            let _ = writeln!(out, "flush chain {TABLE} {chain}");
        }
    }
    service_chain_rules(out, svc, opts);
    for (chain, ep) in chains.iter().zip(&svc.endpoints) {
        endpoint_chain_rules(out, chain, ep);
    }
}

/// The whole `table ip kube-proxy` of `services` for `nft -f`: the table is created and
/// flushed, then filled (upstream's full sync). Services without endpoints are left out.
pub fn nft_full(services: &[ShapedService], opts: &ShapedOptions) -> String {
    nft_full_in_transactions(services, opts, services.len().max(1)).concat()
}

/// [`nft_full`] cut into texts of at most `per` services, one `nft -f` (one transaction)
/// each, the first with the table's base: on kernel 6.18 the cost of a transaction grows
/// with the square of its anonymous sets (every service chain's `numgen` map is one), so
/// 10,000 services take minutes in one transaction and seconds in 1,000-service ones.
pub fn nft_full_in_transactions(
    services: &[ShapedService],
    opts: &ShapedOptions,
    per: usize,
) -> Vec<String> {
    let live: Vec<&ShapedService> = services
        .iter()
        .filter(|s| !s.endpoints.is_empty())
        .collect();
    let mut texts = Vec::new();
    let mut head = String::from(TABLE_LINE);
    let _ = writeln!(head, "flush table {TABLE}");
    head.push_str(BASE);
    let mut chunks = live.chunks(per.max(1));
    let mut first = Some(head);
    loop {
        let chunk = chunks.next();
        if chunk.is_none() && first.is_none() {
            break;
        }
        let mut out = first.take().unwrap_or_else(|| String::from(TABLE_LINE));
        for svc in chunk.unwrap_or_default() {
            write_service(&mut out, svc, opts, true);
            elements("add", &mut out, svc, true);
        }
        texts.push(out);
    }
    texts
}

fn delete_chain(out: &mut String, chain: &str) {
    let _ = writeln!(out, "flush chain {TABLE} {chain}");
    let _ = writeln!(out, "delete chain {TABLE} {chain}");
}

/// The transaction upstream sends after the services went from `before` to `after`: for a
/// new service its chains and elements; for a changed one its chains emptied and
/// rewritten (the service chain's `numgen` map replaced) and the chains of endpoints it
/// lost deleted; for a removed one its elements and chains deleted. Nothing else.
pub fn nft_update(
    before: &[ShapedService],
    after: &[ShapedService],
    opts: &ShapedOptions,
) -> String {
    let mut out = String::from(TABLE_LINE);
    for (old, new) in changed(before, after) {
        let (old, new) = (live(old), live(new));
        if let Some(new) = new {
            write_service(&mut out, new, opts, old.is_none());
            if old.is_none() {
                elements("add", &mut out, new, true);
            }
        }
        let Some(old) = old else { continue };
        if new.is_none() {
            // The map element goes first: it is what references the service chain.
            elements("delete", &mut out, old, false);
            delete_chain(&mut out, &service_chain(old));
        }
        let kept: BTreeSet<String> = new
            .map(|n| n.endpoints.iter().map(|ep| endpoint_chain(n, ep)).collect())
            .unwrap_or_default();
        for ep in &old.endpoints {
            let chain = endpoint_chain(old, ep);
            if !kept.contains(&chain) {
                delete_chain(&mut out, &chain);
            }
        }
    }
    out
}
