// SPDX-License-Identifier: Apache-2.0
//! The suite's pure parts, and its quick slice (root).

use std::net::SocketAddr;

use std::time::Duration;

use super::{modes::*, results::Metric, *};
use crate::{load::summarize, results::Environment, shaped::iptables::svc_chain};

#[test]
fn mode_names_round_trip_and_alternate() {
    for mode in DpMode::ALL {
        assert_eq!(DpMode::parse(mode.name()), Some(mode));
    }
    assert_eq!(
        DpMode::parse("kube-proxy-iptables@random"),
        Some(DpMode::KubeProxyIptablesRandom)
    );
    let modes = [DpMode::Direct, DpMode::Ebpf, DpMode::KubeProxyNft];
    assert_eq!(mode_order(&modes, 0), [DpMode::Ebpf, DpMode::KubeProxyNft]);
    assert_eq!(mode_order(&modes, 1), [DpMode::KubeProxyNft, DpMode::Ebpf]);
    // The two iptables placements share one load: the random one follows the other.
    let modes = [
        DpMode::KubeProxyIptablesRandom,
        DpMode::Ebpf,
        DpMode::KubeProxyIptables,
    ];
    let groups = mode_groups(&mode_order(&modes, 0));
    assert_eq!(
        groups,
        [
            vec![DpMode::KubeProxyIptables, DpMode::KubeProxyIptablesRandom],
            vec![DpMode::Ebpf]
        ]
    );
    assert_eq!(
        mode_groups(&[DpMode::KubeProxyIptablesRandom]),
        [vec![DpMode::KubeProxyIptablesRandom]]
    );
}

#[test]
fn nftables_mode_is_ours_and_uncapped() {
    assert_eq!(DpMode::parse("nftables"), Some(DpMode::Nftables));
    assert!(DpMode::ALL.contains(&DpMode::Nftables));
    let opts = DataplaneOptions::full("agent".into(), "loadgen".into());
    assert!(opts.modes.contains(&DpMode::Nftables));
    assert_eq!(opts.max_services(DpMode::Nftables), None);
    let quick = DataplaneOptions::quick("agent".into(), "loadgen".into());
    assert!(quick.modes.contains(&DpMode::Nftables));
    assert_eq!(quick.max_services(DpMode::Nftables), Some(1));
    assert_eq!(quick.max_services(DpMode::Ebpf), None);
    // Its own load, not grouped with another mode's.
    assert_eq!(
        mode_groups(&[DpMode::Nftables, DpMode::KubeProxyNft]),
        [vec![DpMode::Nftables], vec![DpMode::KubeProxyNft]]
    );
}

#[test]
fn service_ips_map_elements_are_counted_across_line_wraps() {
    let listing = "table ip kube-proxy {\n\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\tcomment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\"\n\t\telements = { 10.96.0.1 . tcp . 443 comment \"default/kubernetes:https\" : goto service-2QRHZV4L-default/kubernetes/tcp/https,\n\t\t\t     10.96.0.2 . tcp . 80 : goto service-AAAAAAAA-bench/measured/tcp/conn }\n\t}\n}\n";
    assert_eq!(map_elements(listing), 2);
    let empty = "table ip kube-proxy {\n\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t}\n}\n";
    assert_eq!(map_elements(empty), 0);
}

#[test]
fn measured_service_is_placed_last_or_at_the_seeded_position() {
    let last = services(100, None);
    assert_eq!(last.len(), 101);
    assert_eq!(last[99..], measured());
    let position = random_position(99);
    assert_eq!(position, random_position(99), "seeded");
    assert!(position <= 99);
    let placed = services(100, Some(position));
    assert_eq!(placed[position..position + 2], measured());
    // Different Ns, different places (for these seeds), never past the end.
    let spots: std::collections::BTreeSet<usize> = [999, 9_999, 49_999]
        .map(random_position)
        .into_iter()
        .collect();
    assert_eq!(spots.len(), 3);
    assert_eq!(random_position(0), 0);
    assert_eq!(services(1, None), measured());
    // The iptables text keeps the order: the measured ports' jumps come last.
    let text = crate::shaped::iptables_full(&last, &shaped_options());
    let jumps: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("-A KUBE-SERVICES"))
        .collect();
    assert!(jumps[100].ends_with(&svc_chain(&measured()[1])));
}

#[test]
fn manifests_group_the_ports_of_a_service() {
    let text = manifests(&services(3, None));
    assert_eq!(text.matches("kind: Service\n").count(), 3);
    assert_eq!(text.matches("kind: EndpointSlice").count(), 3);
    assert!(text.contains(
        "ports: [{name: \"conn\", port: 80, targetPort: 8080, protocol: TCP}, {name: \"stream\", port: 81, targetPort: 8081, protocol: TCP}]"
    ));
    assert!(text.contains(
        "endpoints: [{addresses: [10.244.1.2], conditions: {ready: true}}, {addresses: [10.244.1.3], conditions: {ready: true}}, {addresses: [10.244.1.4], conditions: {ready: true}}, {addresses: [10.244.1.5], conditions: {ready: true}}]\n"
    ));
    let filler = text.split("---").nth(2).unwrap();
    assert_eq!(filler.matches("addresses:").count(), 4, "{filler}");
    // Parses as YAML documents.
    for doc in text.split("---\n").filter(|d| !d.trim().is_empty()) {
        let _: serde_yaml::Value = serde_yaml::from_str(doc).unwrap();
    }
    let fragment = agent_fragment(50_000);
    assert!(fragment["ebpf"]["mapSizes"]["services"].as_u64().unwrap() >= 300_000);
    assert!(fragment["ebpf"]["mapSizes"]["backends"].as_u64().unwrap() >= 200_000);
}

fn stream(target: SocketAddr, mb_s: f64) -> StreamReport {
    StreamReport {
        target,
        round_trips: 10,
        rr_p50_us: 10.0,
        rr_p99_us: 20.0,
        bytes: 1_000_000,
        stream_seconds: 1.0,
        throughput_mb_s: mb_s,
    }
}

/// A sample whose mode made `rate` conn/s against a paired direct `direct` conn/s.
fn sample(mode: DpMode, n: u32, rep: u32, rate: f64, direct: f64) -> Sample {
    let target: SocketAddr = "10.96.0.10:80".parse().unwrap();
    let conn = |rate: f64| summarize(target, vec![1000, 2000], 0, None, 2.0 / rate);
    Sample {
        mode,
        services: n,
        rep,
        position: (mode == DpMode::KubeProxyIptables).then_some(n as usize - 1),
        setup_seconds: 0.5,
        conn: conn(rate),
        stream: stream(target, rate / 10.0),
        direct_conn: conn(direct),
        direct_stream: stream(target, direct / 10.0),
        steal_percent: Some(0.5),
        load: Some(1.5),
        rejected: false,
    }
}

#[test]
fn rows_pair_each_mode_with_its_direct_route_and_leave_rejected_reps_out() {
    let mut noisy = sample(DpMode::Ebpf, 10, 2, 10.0, 100.0);
    noisy.rejected = true;
    noisy.steal_percent = Some(30.0);
    let results = DataplaneResults {
        run_ids: vec![],
        env: Environment {
            kernel: "k".into(),
            cpu: "c".into(),
            run: "r".into(),
        },
        client_cpu: Some(0),
        server_cpu: Some(1),
        seconds: 1.0,
        failures: vec!["N=100000 ebpf: not measured: full\nlog".into()],
        samples: vec![
            sample(DpMode::Ebpf, 10, 0, 90.0, 100.0),
            sample(DpMode::Ebpf, 10, 1, 100.0, 200.0),
            noisy,
            sample(DpMode::KubeProxyIptables, 10, 0, 50.0, 120.0),
        ],
    };
    let rows = results.csv_rows();
    let find = |prefix: &str| {
        rows.iter()
            .find(|r| r.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {rows:#?}"))
            .clone()
    };
    assert!(find("dataplane,ebpf,10,0,conn_rate,").contains(",conn/s,0.9000,"));
    assert_eq!(
        find("dataplane,ebpf,10,0,direct_conn_rate,"),
        "dataplane,ebpf,10,0,direct_conn_rate,100.0000,conn/s,,k,c,r"
    );
    assert!(find("dataplane,ebpf,10,1,throughput,").contains(",MB/s,0.5000,"));
    // The median, smallest and largest per-rep ratio of the accepted reps (0.9, 0.5; the
    // rejected rep's 0.1 left out).
    assert!(find("dataplane,ebpf,10,median,conn_rate,").contains(",conn/s,0.7000,"));
    assert!(find("dataplane,ebpf,10,min,conn_rate,").contains(",conn/s,0.5000,"));
    assert!(find("dataplane,ebpf,10,max,conn_rate,").contains(",conn/s,0.9000,"));
    assert!(find("dataplane,ebpf,10,2,rejected,").contains(",1.0000,bool,,"));
    assert!(find("dataplane,ebpf,10,2,steal,").contains(",30.0000,%,,"));
    assert!(find("dataplane,ebpf,10,0,rejected,").contains(",0.0000,bool,,"));
    assert!(find("dataplane,kube-proxy-iptables,10,0,position,").contains(",9.0000,index,,"));
    assert!(find("dataplane,ebpf,10,0,setup_time,").contains(",0.5000,s,,"));
    assert!(rows.iter().all(|r| r.split(',').count() == 11), "{rows:?}");
    assert!(!rows.iter().any(|r| r.starts_with("dataplane,direct,")));
    let summary = results.summary(DpMode::Ebpf, 10, Metric::ConnRate).unwrap();
    assert_eq!(summary.reps, 2);
    let table = results.table();
    assert!(
        table.contains("ebpf") && table.contains("(0.700 [0.500–0.900])"),
        "{table}"
    );
    assert!(
        table.contains("N=100000 ebpf: not measured: full\ntook"),
        "{table}"
    );
}

#[test]
fn every_mode_is_paired_with_the_backends_own_addresses() {
    let [service, direct] = routes(DpMode::Ebpf);
    assert_eq!(direct.0.len(), usize::from(MEASURED_BACKENDS));
    assert_eq!(service.0, [SocketAddr::from((SERVICE_IP, SERVICE_PORT))]);
    assert_ne!(service.1, direct.1);
    // direct-ct has no service: A against A.
    let [a, b] = routes(DpMode::DirectCt);
    assert_eq!(a, b);
    let full = DataplaneOptions::full("agent".into(), "loadgen".into());
    assert_eq!(full.plan(DpMode::Ebpf).reps, 5);
    assert!(full.plan(DpMode::Ebpf).duration >= Duration::from_secs(3));
    assert_eq!(full.max_services(DpMode::Ebpf), None);
    assert!(full.service_counts.contains(&100_000));
    assert_eq!(full.max_services(DpMode::DirectCt), Some(1));
    assert!(DIRECT_CT_RULESET.contains("hook prerouting"));
}

/// The quick slice, as the test suite runs it: every mode measured at both Ns, nothing
/// left behind. Speed is not judged. Needs root, the eBPF object and the built binaries;
/// without them it skips, unless PROXY_REQUIRE_EBPF=1 says they must be there.
#[test]
fn quick_bench_measures_every_mode_and_cleans_up() {
    let Some(crate::quick::Built { agent, loadgen }) = crate::quick::prerequisites("dataplane")
    else {
        return;
    };
    let mut opts = DataplaneOptions::quick(agent, loadgen);
    opts.verbose = false;
    let results = run_dataplane(&opts).expect("quick bench");
    assert!(results.failures.is_empty(), "{:?}", results.failures);
    // Every mode at N = 1, ebpf at 1,000 too.
    assert_eq!(results.samples.len(), opts.modes.len() + 1);
    for s in &results.samples {
        assert!(s.conn.connections > 0 && s.conn.errors == 0, "{s:?}");
        assert!(
            s.direct_conn.connections > 0 && s.direct_conn.errors == 0,
            "{s:?}"
        );
        assert!(s.stream.round_trips > 0 && s.stream.bytes > 0, "{s:?}");
    }
    let rows = results.csv_rows();
    for prefix in [
        "dataplane,ebpf,1000,0,conn_rate,",
        "dataplane,ebpf,1000,0,direct_conn_rate,",
        "dataplane,direct-ct,1,0,conn_rate,",
        "dataplane,kube-proxy-nft,1,0,rejected,",
        "dataplane,ebpf,1,median,conn_rate,",
        "dataplane,ebpf,1,min,conn_rate,",
    ] {
        assert!(
            rows.iter().any(|r| r.starts_with(prefix)),
            "no {prefix} row"
        );
    }
    assert!(rows.len() > results.samples.len() * 14);
    // One set of namespaces per (mode, N) (the quick slice has no pair of placements
    // sharing one).
    assert_eq!(results.run_ids.len(), results.samples.len());
    for id in &results.run_ids {
        assert_eq!(net::owner_pid(id), Some(std::process::id()));
        let left = net::leftovers(id).unwrap();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}
