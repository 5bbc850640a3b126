// SPDX-License-Identifier: Apache-2.0
use super::*;

#[test]
fn reads_rss_and_peak_from_proc_status() {
    let status = "Name:\tproxy-agent\nVmPeak:\t  900 kB\nVmHWM:\t   2048 kB\nVmRSS:\t   1024 kB\n";
    assert_eq!(parse_status(status), Some((1024 * 1024, 2048 * 1024)));
    assert_eq!(parse_status("Name:\tx\n"), None);
}

#[test]
fn reads_a_maps_memlock() {
    let json = r#"{"id": 12, "type": "hash", "name": "SVC4_V2", "flags": 0, "bytes_key": 12,
                   "bytes_value": 12, "max_entries": 65536, "bytes_memlock": 5767168}"#;
    assert_eq!(
        parse_map_show(json).unwrap(),
        ("SVC4_V2".to_string(), 5_767_168)
    );
    assert!(parse_map_show(r#"{"id": 1}"#).is_err());
}

/// The quick slice (1,000 services, both modes, then a scale run of 6,000 × 10): RSS and
/// peak rows for both modes, the BPF map total and per-map rows in ebpf mode, the scale
/// run's rows (maps grown, no probe failed), sane values, nothing left behind. Needs
/// root, the eBPF object and the built agent; without them it skips, unless
/// PROXY_REQUIRE_EBPF=1 says they must be there.
#[test]
fn quick_memory_bench_reads_the_agent_and_its_maps_and_cleans_up() {
    let Some(crate::quick::Built { agent, loadgen }) = crate::quick::prerequisites("memory") else {
        return;
    };
    let mut opts = MemoryOptions::quick(agent, loadgen);
    opts.verbose = false;
    let results = run_memory(&opts).expect("quick memory bench");

    let (memory_rows, scale_rows): (Vec<&Row>, Vec<&Row>) =
        results.rows.iter().partition(|r| r.bench == BENCH);
    let value = |mode: &str, metric: &str| {
        memory_rows
            .iter()
            .find(|r| r.mode == mode && r.n == 1_000 && r.metric == metric)
            .unwrap_or_else(|| panic!("no {mode} {metric} row in {:#?}", results.rows))
            .value
    };
    for mode in ["ebpf", "iptables-legacy"] {
        let (rss, peak) = (value(mode, "agent_rss"), value(mode, "agent_peak_rss"));
        // An agent holds more than a MiB and, at 1,000 services, far less than 4 GiB.
        assert!(rss > 1.0 && rss < 4096.0, "{mode} RSS {rss} MiB");
        assert!(peak >= rss, "{mode} peak {peak} < RSS {rss}");
    }
    let total = value("ebpf", "bpf_map_memory");
    let per_map: Vec<f64> = memory_rows
        .iter()
        .filter(|r| r.metric.starts_with("bpf_map_memory_"))
        .map(|r| r.value)
        .collect();
    assert_eq!(per_map.len(), opts.largest_maps);
    assert!(total > 0.0, "{total}");
    assert!(
        per_map.iter().all(|m| *m > 0.0 && *m < total),
        "{per_map:?} of {total}"
    );
    assert!(
        per_map.windows(2).all(|w| w[0] >= w[1]),
        "largest first: {per_map:?}"
    );
    assert!(memory_rows.iter().all(|r| r.unit == "MiB"));

    let scale = |metric: &str| {
        scale_rows
            .iter()
            .find(|r| r.bench == scale::BENCH && r.n == 6_000 && r.metric == metric)
            .unwrap_or_else(|| panic!("no scale {metric} row in {scale_rows:#?}"))
            .value
    };
    assert!(scale("cold_sync_ms") > 0.0);
    assert!(scale("cold_sync_agent_ms") > 0.0);
    assert!(scale("probes") > 0.0);
    assert_eq!(scale("failed_probes"), 0.0);
    // 6,000 services of 12 service-map slots and 10 backends each outgrow the defaults.
    assert!(scale("map_growths") >= 1.0);
    assert!(scale("agent_rss") > 1.0 && scale("bpf_map_memory") > 0.0);

    assert_eq!(results.run_ids.len(), 3);
    for id in &results.run_ids {
        let left = net::leftovers(id).unwrap();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}
