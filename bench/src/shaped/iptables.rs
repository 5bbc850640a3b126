// SPDX-License-Identifier: Apache-2.0
//! The iptables (`nat` table) shape of upstream kube-proxy's iptables mode, as
//! `iptables-restore` input.

use std::{collections::BTreeSet, fmt::Write as _, net::SocketAddrV4};

use super::{ShapedOptions, ShapedService, changed, hash_prefix, live};

pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// The chains every restore rewrites whole, in upstream's order.
const TOP_LEVEL: [&str; 4] = [
    KUBE_SERVICES,
    KUBE_NODEPORTS,
    KUBE_POSTROUTING,
    KUBE_MARK_MASQ,
];

/// `KUBE-SVC-` and the hash of the service port name and protocol.
pub fn svc_chain(svc: &ShapedService) -> String {
    format!(
        "KUBE-SVC-{}",
        hash_prefix(&[&svc.port_name_text(), "tcp"], 16)
    )
}

/// `KUBE-SEP-` and the hash of the service port name, protocol and endpoint.
pub fn sep_chain(svc: &ShapedService, endpoint: &SocketAddrV4) -> String {
    let ep = endpoint.to_string();
    format!(
        "KUBE-SEP-{}",
        hash_prefix(&[&svc.port_name_text(), "tcp", &ep], 16)
    )
}

/// A comment argument, quoted when it holds a space (as iptables-save writes it).
fn comment(text: &str) -> String {
    if text.contains(' ') {
        format!("-m comment --comment \"{text}\"")
    } else {
        format!("-m comment --comment {text}")
    }
}

/// upstream's `-m statistic` probability: 1/(n-i) with ten decimals.
pub fn probability(remaining: usize) -> String {
    format!("{:.10}", 1.0 / remaining as f64)
}

fn declare(out: &mut String, chain: &str) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, ":{chain} - [0:0]");
}

fn declare_service(out: &mut String, svc: &ShapedService) {
    declare(out, &svc_chain(svc));
    for ep in &svc.endpoints {
        declare(out, &sep_chain(svc, ep));
    }
}

/// The top-level chains' rules: one `KUBE-SERVICES` rule per service in the given order,
/// then the NodePort rule upstream keeps last, the masquerade chains.
fn top_level_rules(out: &mut String, services: &[ShapedService]) {
    for svc in services.iter().filter(|s| !s.endpoints.is_empty()) {
        let _ = writeln!(
            out,
            "-A {KUBE_SERVICES} {} -m tcp -p tcp -d {} --dport {} -j {}",
            comment(&format!("{} cluster IP", svc.port_name_text())),
            svc.cluster_ip,
            svc.port,
            svc_chain(svc)
        );
    }
    let _ = writeln!(
        out,
        "-A {KUBE_SERVICES} {} -m addrtype --dst-type LOCAL -j {KUBE_NODEPORTS}",
        comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain")
    );
    let _ = writeln!(out, "-A {KUBE_MARK_MASQ} -j MARK --or-mark 0x4000");
    let _ = writeln!(
        out,
        "-A {KUBE_POSTROUTING} -m mark ! --mark 0x4000/0x4000 -j RETURN"
    );
    let _ = writeln!(out, "-A {KUBE_POSTROUTING} -j MARK --xor-mark 0x4000");
    let _ = writeln!(
        out,
        "-A {KUBE_POSTROUTING} {} -j MASQUERADE",
        comment("kubernetes service traffic requiring SNAT")
    );
}

/// A service's `KUBE-SVC` chain (masquerade mark for non-pod sources, then one rule per
/// endpoint picking it with probability 1/(remaining endpoints)) and its `KUBE-SEP` chains
/// (hairpin masquerade mark, DNAT).
fn service_rules(out: &mut String, svc: &ShapedService, opts: &ShapedOptions) {
    let name = svc.port_name_text();
    let svc_chain = svc_chain(svc);
    if let Some(cidr) = opts.cluster_cidr {
        let _ = writeln!(
            out,
            "-A {svc_chain} {} -m tcp -p tcp -d {} --dport {} ! -s {cidr} -j {KUBE_MARK_MASQ}",
            comment(&format!("{name} cluster IP")),
            svc.cluster_ip,
            svc.port
        );
    }
    let n = svc.endpoints.len();
    for (i, ep) in svc.endpoints.iter().enumerate() {
        let statistic = if i + 1 < n {
            format!(
                " -m statistic --mode random --probability {}",
                probability(n - i)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "-A {svc_chain} {}{statistic} -j {}",
            comment(&format!("{name} -> {ep}")),
            sep_chain(svc, ep)
        );
    }
    for ep in &svc.endpoints {
        let sep = sep_chain(svc, ep);
        let _ = writeln!(
            out,
            "-A {sep} {} -s {} -j {KUBE_MARK_MASQ}",
            comment(&name),
            ep.ip()
        );
        let _ = writeln!(
            out,
            "-A {sep} {} -m tcp -p tcp -j DNAT --to-destination {ep}",
            comment(&name)
        );
    }
}

/// The whole `nat` ruleset of `services` for `iptables-restore --noflush` into a fresh
/// namespace. Services without endpoints are left out (upstream rejects them in the filter
/// table instead).
pub fn iptables_full(services: &[ShapedService], opts: &ShapedOptions) -> String {
    let mut out = String::with_capacity(services.len() * 1500 + 1024);
    out.push_str("*nat\n");
    for chain in TOP_LEVEL {
        declare(&mut out, chain);
    }
    let live = || services.iter().filter(|s| !s.endpoints.is_empty());
    for svc in live() {
        declare_service(&mut out, svc);
    }
    // Upstream inserts these with `iptables -I` once; a fresh namespace needs them too.
    let _ = writeln!(
        out,
        "-A PREROUTING {} -j {KUBE_SERVICES}",
        comment("kubernetes service portals")
    );
    let _ = writeln!(
        out,
        "-A OUTPUT {} -j {KUBE_SERVICES}",
        comment("kubernetes service portals")
    );
    let _ = writeln!(
        out,
        "-A POSTROUTING {} -j {KUBE_POSTROUTING}",
        comment("kubernetes postrouting rules")
    );
    top_level_rules(&mut out, services);
    for svc in live() {
        service_rules(&mut out, svc, opts);
    }
    out.push_str("COMMIT\n");
    out
}

/// What upstream restores (with `--noflush`) after the services went from `before` to
/// `after`: the top-level chains whole, the `KUBE-SVC` and `KUBE-SEP` chains of changed
/// services, and `-X` for the chains no service or endpoint owns any more. The jumps from
/// the built-in chains are not repeated (they exist already).
pub fn iptables_partial(
    before: &[ShapedService],
    after: &[ShapedService],
    opts: &ShapedOptions,
) -> String {
    let pairs = changed(before, after);
    let mut out = String::with_capacity(after.len() * 120 + pairs.len() * 1500 + 1024);
    out.push_str("*nat\n");
    for chain in TOP_LEVEL {
        declare(&mut out, chain);
    }
    let mut written = BTreeSet::new();
    for svc in pairs.iter().filter_map(|(_, new)| live(*new)) {
        declare_service(&mut out, svc);
        written.insert(svc_chain(svc));
        written.extend(svc.endpoints.iter().map(|ep| sep_chain(svc, ep)));
    }
    // The chains of the old versions that the new ones do not write again.
    let mut stale = BTreeSet::new();
    for old in pairs.iter().filter_map(|(old, _)| live(*old)) {
        stale.insert(svc_chain(old));
        stale.extend(old.endpoints.iter().map(|ep| sep_chain(old, ep)));
    }
    let stale: Vec<String> = stale.difference(&written).cloned().collect();
    // Declaring a chain flushes it, so that it may be deleted once nothing jumps there.
    for chain in &stale {
        declare(&mut out, chain);
    }
    top_level_rules(&mut out, after);
    for svc in pairs.iter().filter_map(|(_, new)| live(*new)) {
        service_rules(&mut out, svc, opts);
    }
    for chain in &stale {
        let _ = writeln!(out, "-X {chain}");
    }
    out.push_str("COMMIT\n");
    out
}
