// SPDX-License-Identifier: Apache-2.0
//! A timing comparison run by hand, not a test assertion: the cold load of `fillers`
//! (SHAPED_COMPARE_SERVICES, default 10,000, × 4 endpoints) with the agent's nftables
//! shape (`proxy_agent::proxier::nftables`) against the upstream-shaped ruleset
//! ([`nft_full`]), each in one `nft -f` into a fresh network namespace (`unshare -n`),
//! wall time. Root only.
//!
//! `cargo nextest run -p bench --features hand-run --run-ignored only compare_tests --no-capture`
//! (SHAPED_COMPARE_KEEP=1 keeps the two texts and says where; SHAPED_COMPARE_OURS_ONLY=1
//! loads only the agent's shape, for larger counts).

use std::{
    net::{IpAddr, SocketAddr},
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use proxy_agent::{
    model::{Endpoint, IpFamily, NamespacedName, Protocol, ServicePort, ServicePortName},
    node::LocalDetector,
    proxier::{
        NodeContext,
        nftables::{DesiredState, NftContext},
    },
};

use super::*;

type Port = (ServicePortName, ServicePort, Vec<Arc<Endpoint>>);

/// The fillers as the agent's model holds them: TCP ClusterIP ports with ready endpoints
/// on other nodes.
fn as_model(services: &[ShapedService]) -> Vec<Port> {
    services
        .iter()
        .map(|svc| {
            let name = ServicePortName::new(
                NamespacedName::new(svc.namespace.clone(), svc.name.clone()),
                svc.port_name.clone(),
                Protocol::Tcp,
            );
            let port =
                ServicePort::cluster_ip_only(IpAddr::V4(svc.cluster_ip), svc.port, Protocol::Tcp);
            let endpoints = svc
                .endpoints
                .iter()
                .map(|ep| {
                    let addr = SocketAddr::V4(*ep);
                    Arc::new(Endpoint {
                        node_name: Some("other".into()),
                        ..Endpoint::ready_at(addr)
                    })
                })
                .collect();
            (name, port, endpoints)
        })
        .collect()
}

/// Wall time of `nft -f file` in a fresh network namespace.
fn cold_load(file: &std::path::Path) -> Duration {
    let start = Instant::now();
    let out = Command::new("unshare")
        .args(["-n", "nft", "-f"])
        .arg(file)
        .output()
        .expect("spawn unshare");
    let elapsed = start.elapsed();
    assert!(
        out.status.success(),
        "nft -f {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    elapsed
}

#[test]
#[ignore = "a timing comparison run by hand (root, nft): minutes for the upstream shape"]
fn nft_cold_load_ours_vs_upstream_shape() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP nftables cold-load comparison: needs root");
        return;
    }
    let count: u32 = std::env::var("SHAPED_COMPARE_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let services = fillers(count, 4);
    let opts = ShapedOptions {
        cluster_cidr: Some("10.0.0.0/8".parse().unwrap()),
    };
    let node = NodeContext {
        name: "bench-node".into(),
        local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]),
        masquerade_bit: 14,
        ..Default::default()
    };
    let cidrs = ["10.96.0.0/12".parse().unwrap()];
    let ctx = NftContext::new(&node, IpFamily::V4, &cidrs);
    let ports = as_model(&services);
    let start = Instant::now();
    let desired =
        DesiredState::from_ports(ports.iter().map(|(n, s, e)| (n, s, e.as_slice())), &ctx);
    let ours = desired.cold_load(&ctx);
    let generation = start.elapsed();
    let upstream = nft_full(&services, &opts);

    let dir = std::env::temp_dir().join(format!("nft-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ours_file, upstream_file) = (dir.join("ours.nft"), dir.join("upstream.nft"));
    std::fs::write(&ours_file, &ours).unwrap();
    std::fs::write(&upstream_file, &upstream).unwrap();
    let ours_time = cold_load(&ours_file);
    if std::env::var_os("SHAPED_COMPARE_OURS_ONLY").is_some() {
        eprintln!(
            "cold load of {count} services x 4 endpoints, ours only: {ours_time:.2?} (generated in {generation:.2?})"
        );
        if std::env::var_os("SHAPED_COMPARE_KEEP").is_some() {
            eprintln!("text kept in {}", dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
        return;
    }
    let upstream_time = cold_load(&upstream_file);
    if std::env::var_os("SHAPED_COMPARE_KEEP").is_some() {
        eprintln!("texts kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    eprintln!(
        "cold load of {count} services x 4 endpoints, one nft -f into a fresh netns:\n  \
         ours:     {ours_time:.2?} ({} lines, {} bytes; generated in {generation:.2?})\n  \
         upstream: {upstream_time:.2?} ({} lines, {} bytes)\n  ratio upstream/ours: {:.1}",
        ours.lines().count(),
        ours.len(),
        upstream.lines().count(),
        upstream.len(),
        upstream_time.as_secs_f64() / ours_time.as_secs_f64()
    );
}

/// The agent's partial transactions after a cold load of `fillers` (the sync benchmark's
/// three changes), each timed with its own `nft -f` in the same fresh namespace.
#[test]
#[ignore = "a timing run by hand (root, nft)"]
fn nft_partial_transactions_ours() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP nftables partial-transaction timing: needs root");
        return;
    }
    let count: u32 = std::env::var("SHAPED_COMPARE_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let node = NodeContext {
        name: "bench-node".into(),
        local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]),
        masquerade_bit: 14,
        ..Default::default()
    };
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let s0 = fillers(count, 4);
    let added = ShapedService {
        namespace: "ns".into(),
        name: "added".into(),
        port_name: String::new(),
        cluster_ip: "10.99.0.1".parse().unwrap(),
        port: 443,
        endpoints: vec!["10.98.0.1:8443".parse().unwrap()],
    };
    let steps = [
        ("add one service", Change::AddService(added)),
        ("remove one endpoint", Change::RemoveEndpoint { service: 7 }),
        (
            "scale one service 4 -> 40",
            Change::ScaleTo {
                service: 9,
                endpoints: 40,
            },
        ),
    ];
    let desired_of = |services: &[ShapedService]| {
        let ports = as_model(services);
        DesiredState::from_ports(ports.iter().map(|(n, s, e)| (n, s, e.as_slice())), &ctx)
    };
    let mut written = proxy_agent::proxier::nftables::Written::default();
    let now = Instant::now();
    let (cold, _) = written.full(&desired_of(&s0), &ctx, Some(&[]), now);
    let dir = std::env::temp_dir().join(format!("nft-partial-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cold.nft"), &cold).unwrap();
    let mut script = format!("nft -f {}/cold.nft\n", dir.display());
    let mut before = s0;
    for (i, (label, change)) in steps.iter().enumerate() {
        let after = change.apply(&before);
        let desired = desired_of(&after);
        let changed: std::collections::HashSet<NamespacedName> = super::changed(&before, &after)
            .into_iter()
            .filter_map(|(old, new)| new.or(old))
            .map(|s| NamespacedName::new(s.namespace.clone(), s.name.clone()))
            .collect();
        let ports = desired
            .ports
            .iter()
            .filter(|(name, _)| changed.contains(&name.service))
            .map(|(name, rules)| (name.clone(), rules.clone()))
            .collect();
        let (text, _) = written.partial(&desired.base, &changed, &ports, &ctx, now);
        let file = dir.join(format!("partial-{i}.nft"));
        std::fs::write(&file, &text).unwrap();
        script.push_str(&format!(
            "t0=$(date +%s%N); nft -f {}; t1=$(date +%s%N); echo \"{label}: $(( (t1 - t0) / 1000 )) us, {} lines\"\n",
            file.display(),
            text.lines().count()
        ));
        before = after;
    }
    let out = Command::new("unshare")
        .args(["-n", "sh", "-e", "-c", &script])
        .output()
        .expect("spawn unshare");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "partial transactions after a cold load of {count} services x 4 endpoints:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
