// SPDX-License-Identifier: Apache-2.0
use super::*;
use std::fs;

#[test]
fn map_sizes_hold_the_services_with_room() {
    assert_eq!(sized(10, 65_536), 65_536);
    assert_eq!(sized(150_000, 65_536), 262_144);
    let fragment = agent_fragment(50_000, 4);
    let sizes = &fragment["ebpf"]["mapSizes"];
    assert_eq!(sizes["services"], 524_288);
    assert_eq!(sizes["backends"], 262_144);
    assert_eq!(sizes["revNat"], 131_072);
    let sizes = &agent_fragment_with_ct(100_000, 1, 1_000_000)["ebpf"]["mapSizes"];
    assert_eq!(sizes["revNat"], 262_144);
    assert_eq!(sizes["conntrack"], 1_048_576);
    // The benchmark's other settings stay.
    assert!(fragment.contains_key("iptables"));
}

/// The quick slice, as the test suite runs it: per-program rows for the socket programs
/// at both service counts, map-update rows for both modes, and nothing left behind
/// (namespaces, pins, and the run-time statistics switched off again). Speed is not
/// judged. Needs root, the eBPF object and the built binaries; without them it skips,
/// unless PROXY_REQUIRE_EBPF=1 says they must be there.
#[test]
fn quick_bpf_bench_measures_programs_and_maps_and_cleans_up() {
    let Some(crate::quick::Built { agent, loadgen }) = crate::quick::prerequisites("bpf") else {
        return;
    };
    let stats_before = fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").ok();
    let mut opts = BpfOptions::quick(agent, loadgen);
    opts.verbose = false;
    let results = run_bpf(&opts).expect("quick bpf bench");

    let find = |mode: &str, n: u64, metric: &str| {
        results
            .rows
            .iter()
            .find(|r| r.mode == mode && r.n == n && r.metric == metric)
            .unwrap_or_else(|| panic!("no {mode} N={n} {metric} row in {:#?}", results.rows))
    };
    for n in [1, 1_000] {
        let calls = find("ebpf", n, "sock_connect4_calls");
        assert!(calls.value >= 10.0, "{calls:?}");
        let ns = find("ebpf", n, "sock_connect4_ns_per_call");
        // A program run costs more than nothing and far less than a millisecond.
        assert!(ns.value > 0.0 && ns.value < 1e6, "{ns:?}");
        assert_eq!(ns.unit, "ns");
    }
    for n in [1, 1_000] {
        let att = find(connect::MODE_ATTACHED, n, "connect_p99");
        let det = find(connect::MODE_DETACHED, n, "connect_p99");
        assert!(att.value > 0.0 && det.value > 0.0, "{att:?} {det:?}");
        assert!((att.ratio.expect("attached / detached") - att.value / det.value).abs() < 1e-9);
    }
    assert!(find(connect::MODE_ATTACHED, 1_000, connect::METRIC_P99_VS_1).value > 0.0);
    for flows in [0, 10_000] {
        let off = find(testrun::MODE_TEST_RUN, flows, testrun::METRIC_NS);
        // A program run costs more than nothing and far less than a millisecond.
        assert!(off.value > 0.0 && off.value < 1e6, "{off:?}");
        find(
            testrun::MODE_TEST_RUN_STATS,
            flows,
            testrun::METRIC_STATS_OVERHEAD,
        );
        for program in ["tc_uplink_ingress", "xdp_uplink"] {
            let ns = find(
                testrun::MODE_TEST_RUN,
                flows,
                &format!("{program}_ns_per_packet"),
            );
            assert!(ns.value > 0.0 && ns.value < 1e6, "{ns:?}");
        }
    }
    find("ebpf", 1, "sock_connect4_ns_per_call_net");
    for metric in [mapupdate::METRIC_INSERT, mapupdate::METRIC_OVERWRITE] {
        let single = find(mapupdate::MODE_SINGLE, 1_000, metric);
        let batch = find(mapupdate::MODE_BATCH, 1_000, metric);
        assert!(single.value > 0.0 && single.value < 1e6, "{single:?}");
        assert!(batch.value > 0.0 && batch.value < 1e6, "{batch:?}");
        assert_eq!(single.ratio, None);
        let ratio = batch.ratio.expect("batch rows carry batch/single");
        assert!((ratio - batch.value / single.value).abs() < 1e-9);
    }
    let csv = crate::rows::csv_rows(&results.rows, &results.env);
    assert!(csv.iter().all(|l| l.starts_with("bpf,")));
    let id = results.run_id.expect("the program part ran");
    // The bare cgroup (`<id>-bare`) and the test-run pins (`<id>-progs`) included.
    let left = net::leftovers(&id).unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert_eq!(
        fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").ok(),
        stats_before,
        "run-time stats left switched on"
    );
}
