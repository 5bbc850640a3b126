// SPDX-License-Identifier: Apache-2.0
use clap::Parser;

use super::*;

/// `loadgen bench-memory`'s scale options alone.
#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    scale: ScaleArgs,
}

fn parsed(args: &[&str]) -> Result<ScaleOptions> {
    let cli = Cli::try_parse_from(std::iter::once("loadgen").chain(args.iter().copied()))
        .map_err(|e| Error::Setup(e.to_string()))?;
    cli.scale.apply(ScaleOptions::full())
}

#[test]
fn the_defaults_are_issue_20s_target_once_and_a_small_quick_run() {
    let full = ScaleOptions::full();
    assert_eq!((full.services, full.endpoints, full.reps), (100_000, 10, 1));
    let quick = ScaleOptions::quick();
    assert_eq!(
        (quick.services, quick.endpoints, quick.reps),
        (6_000, 10, 1)
    );
    assert!(full.check().is_ok() && quick.check().is_ok());
    assert_eq!(parsed(&[]).unwrap(), full);
}

#[test]
fn options_replace_the_defaults_they_name() {
    let opts = parsed(&[
        "--scale-services",
        "50000",
        "--scale-endpoints",
        "4",
        "--scale-reps",
        "3",
        "--scale-timeout-secs",
        "30",
    ])
    .unwrap();
    assert_eq!(
        opts,
        ScaleOptions {
            services: 50_000,
            endpoints: 4,
            reps: 3,
            sync_timeout: Duration::from_secs(30),
        }
    );
    let quick = ScaleArgs {
        scale_reps: Some(2),
        ..ScaleArgs::default()
    }
    .apply(ScaleOptions::quick())
    .unwrap();
    assert_eq!((quick.services, quick.reps), (6_000, 2));
}

#[test]
fn zero_reps_skip_the_run_whatever_else_is_asked() {
    let opts = parsed(&["--scale-reps", "0", "--scale-endpoints", "0"]).unwrap();
    assert_eq!(opts.reps, 0);
}

#[test]
fn runs_the_manifests_cannot_describe_are_refused() {
    for args in [
        &["--scale-services", "0"][..],
        &["--scale-endpoints", "0"],
        &["--scale-endpoints", "65"],
        // 200,000 × 10 backends: more addresses than the filler range has.
        &["--scale-services", "200000"],
        &["--scale-timeout-secs", "0"],
        &["--scale-services", "-1"],
        &["--scale-services", "many"],
    ] {
        assert!(parsed(args).is_err(), "{args:?} accepted");
    }
    assert!(parsed(&["--scale-services", "104857", "--scale-endpoints", "10"]).is_ok());
}

const METRICS: &str = r#"# HELP kubeproxy_sync_proxy_rules_duration_seconds SyncProxyRules latency in seconds
# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 0
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 2.5
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 3
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 2.5
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 3
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1700000010.25
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1700000009
kubeproxy_sync_proxy_rules_service_changes_total 50001
kubeproxy_sync_proxy_rules_endpoint_changes_total 50001
kubeproxy_ebpf_map_growths_total{map="v4_services"} 1
kubeproxy_ebpf_map_growths_total{map="v4_backends"} 1
kubeproxy_ebpf_map_growths_total{map="v4_rev_nat"} 1
kubeproxy_ebpf_services_not_programmed 0
"#;

#[test]
fn a_sample_reads_the_counters_once_per_sync_whatever_the_families() {
    let sample = AgentSample::parse(METRICS);
    assert_eq!(sample.syncs, 3.0, "both families record each sync");
    assert_eq!(sample.sync_seconds, 2.5);
    assert_eq!(sample.service_changes, 50_001.0);
    assert_eq!(sample.endpoint_changes, 50_001.0);
    assert_eq!(sample.map_growths, 3.0);
    assert_eq!(sample.not_programmed, 0.0);
    assert_eq!(sample.times.last_sync(), Some(1_700_000_010.25));
    assert_eq!(sample.times.last_queued(), Some(1_700_000_009.0));
    let empty = AgentSample::parse("");
    assert_eq!(empty, AgentSample::default());
    assert_eq!(format!("{:.0}", empty.map_growths), "0", "not -0");
}

fn at(secs: f64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs_f64(secs)
}

#[test]
fn the_sync_is_done_once_every_change_is_applied_and_nothing_is_queued() {
    let before = AgentSample {
        service_changes: 1.0,
        endpoint_changes: 1.0,
        ..AgentSample::default()
    };
    let change = Change {
        started: at(1_700_000_000.0),
        at: at(1_700_000_000.0),
        initial: false,
    };
    let later = at(1_700_000_020.0);
    let done = AgentSample::parse(METRICS);
    assert_eq!(
        judge_scale_sync(&before, &done, 50_000, change, later),
        Ok(())
    );

    // A sync of part of them (the agent syncs while it still reads events): not done,
    // though nothing is queued after it.
    let part = AgentSample {
        service_changes: 4097.0,
        endpoint_changes: 1.0,
        ..done.clone()
    };
    let why = judge_scale_sync(&before, &part, 50_000, change, later).unwrap_err();
    assert!(
        why.contains("4096 of 50000 service") && why.contains("0 of 50000 EndpointSlice"),
        "{why}"
    );

    // Every change read by a sync still running (queued after the last sync ended).
    let running = AgentSample {
        times: SyncTimes {
            families: [(
                "IPv4".to_string(),
                ::tests::scenario::readiness::FamilyTimes {
                    last_sync: Some(1_700_000_001.0),
                    last_queued: Some(1_700_000_002.0),
                },
            )]
            .into(),
        },
        ..done.clone()
    };
    let why = judge_scale_sync(&before, &running, 50_000, change, later).unwrap_err();
    assert!(why.contains("queued"), "{why}");
}

fn run() -> ScaleRun {
    ScaleRun {
        cold_sync: Duration::from_millis(2_500),
        agent_sync: Duration::from_millis(1_200),
        syncs: 2,
        probes: ProbeReport {
            attempts: 900,
            failures: 0,
            first_error: None,
            failed_at_ms: Vec::new(),
            longest_gap_ms: 12,
        },
        rss_bytes: 300 * 1024 * 1024,
        peak_rss_bytes: 600 * 1024 * 1024,
        map_bytes: 80 * 1024 * 1024 + 512 * 1024,
        map_growths: 3,
    }
}

#[test]
fn a_run_is_the_rows_the_report_reads_and_a_few_more() {
    let rows = run().rows(100_000, 2);
    assert!(
        rows.iter()
            .all(|r| r.bench == "scale" && r.mode == "ebpf" && r.n == 100_000 && r.rep == "2")
    );
    let value = |metric: &str| {
        rows.iter()
            .find(|r| r.metric == metric)
            .map(|r| (r.value, r.unit))
            .unwrap_or_else(|| panic!("no {metric} in {rows:#?}"))
    };
    // What xtask's report reads (targets::scale_rows, report::scale_section).
    assert_eq!(value("cold_sync_ms"), (2_500.0, "ms"));
    assert_eq!(value("failed_probes"), (0.0, "count"));
    assert_eq!(value("agent_rss"), (300.0, "MiB"));
    assert_eq!(value("bpf_map_memory"), (80.5, "MiB"));
    // And what explains them.
    assert_eq!(value("cold_sync_agent_ms"), (1_200.0, "ms"));
    assert_eq!(value("cold_syncs"), (2.0, "count"));
    assert_eq!(value("probes"), (900.0, "count"));
    assert_eq!(value("probe_longest_gap_ms"), (12.0, "ms"));
    assert_eq!(value("agent_peak_rss"), (600.0, "MiB"));
    assert_eq!(value("map_growths"), (3.0, "count"));
    assert_eq!(rows.len(), 10);
    let line = run().summary(100_000, 10);
    assert!(
        line.contains("cold sync 2500 ms") && line.contains("0 of 900 probes failed"),
        "{line}"
    );
}

#[test]
fn failures_are_placed_after_the_services_were_written() {
    let report = ProbeReport {
        failed_at_ms: vec![990, 1_250],
        ..ProbeReport::default()
    };
    assert_eq!(failure_offsets(&report, 1_000), "-10 ms, +250 ms");
    assert_eq!(failure_offsets(&ProbeReport::default(), 1_000), "");
}
