// SPDX-License-Identifier: Apache-2.0
//! What a latency run measured, its table and its CSV rows (pure).

use std::fmt::Write as _;

use crate::{
    results::{Environment, csv_field, csv_num},
    stats::percentile,
};

pub const BENCH: &str = "latency";

/// The agent's sync counters over the measured window (from its metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SyncCounts {
    pub full: u64,
    pub partial: u64,
    /// Time the agent spent in those syncs.
    pub full_seconds: f64,
    pub partial_seconds: f64,
}

impl SyncCounts {
    /// The mean partial sync, in milliseconds (NaN without one).
    pub fn partial_mean_ms(&self) -> f64 {
        if self.partial == 0 {
            f64::NAN
        } else {
            self.partial_seconds * 1e3 / self.partial as f64
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LatencyResults {
    pub run_id: String,
    pub env: Environment,
    /// `ebpf` or `iptables-legacy`.
    pub mode: String,
    /// Filler services preloaded before the agent started.
    pub services: u32,
    pub rep: u32,
    /// Changes written into the API server.
    pub changes: u64,
    /// Per programmed change, t1 - t0 in milliseconds (in the order they were programmed).
    pub latencies_ms: Vec<f64>,
    pub failed: u64,
    /// Changes per second achieved (changes over the time from the first to the last).
    pub change_rate: f64,
    /// The rate asked for.
    pub target_rate: f64,
    pub min_sync_period_ms: f64,
    /// Connects to the never-created control frontend, and how many were answered (must
    /// be 0: any would be a false success of the prober).
    pub control_attempts: u64,
    pub false_successes: u64,
    /// Probe connects made for the changes.
    pub probe_attempts: u64,
    /// The longest interval between two connects to one frontend (1 ms unless so many
    /// were pending that the prober's connect budget stretched it).
    pub longest_probe_interval_ms: f64,
    /// Syncs the agent ran while changes were made and probed.
    pub syncs: SyncCounts,
    pub seconds: f64,
}

impl LatencyResults {
    pub fn programmed(&self) -> u64 {
        self.latencies_ms.len() as u64
    }

    fn sorted(&self) -> Vec<f64> {
        let mut sorted = self.latencies_ms.clone();
        sorted.sort_by(f64::total_cmp);
        sorted
    }

    /// p50, p90, p99 and max, in milliseconds (NaN without a programmed change).
    pub fn percentiles(&self) -> [f64; 4] {
        let sorted = self.sorted();
        let at = |p: f64| percentile(&sorted, p).unwrap_or(f64::NAN);
        [at(50.0), at(90.0), at(99.0), at(100.0)]
    }

    /// Metric name, value, unit; in CSV order.
    pub fn metrics(&self) -> Vec<(&'static str, f64, &'static str)> {
        let [p50, p90, p99, max] = self.percentiles();
        let count = |n: u64| n as f64;
        vec![
            ("programming_p50", p50, "ms"),
            ("programming_p90", p90, "ms"),
            ("programming_p99", p99, "ms"),
            ("programming_max", max, "ms"),
            ("changes", count(self.changes), "count"),
            ("programmed", count(self.programmed()), "count"),
            ("failed", count(self.failed), "count"),
            ("change_rate", self.change_rate, "1/s"),
            ("false_successes", count(self.false_successes), "count"),
            ("min_sync_period", self.min_sync_period_ms, "ms"),
            ("syncs_partial", count(self.syncs.partial), "count"),
            ("syncs_full", count(self.syncs.full), "count"),
            ("partial_sync_mean", self.syncs.partial_mean_ms(), "ms"),
            ("probe_interval_max", self.longest_probe_interval_ms, "ms"),
        ]
    }

    /// CSV rows: no baseline in this suite, `ratio_to_baseline` stays empty.
    pub fn csv_rows(&self) -> Vec<String> {
        let env = &self.env;
        let tail = env.csv_tail();
        self.metrics()
            .into_iter()
            .map(|(metric, value, unit)| {
                format!(
                    "{BENCH},{},{},{},{metric},{},{unit},,{tail}",
                    csv_field(&self.mode),
                    self.services,
                    self.rep,
                    csv_num(value)
                )
            })
            .collect()
    }

    pub fn table(&self) -> String {
        let [p50, p90, p99, max] = self.percentiles();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "programming latency, {} mode, {} services preloaded (run {}, {:.0} s):",
            self.mode, self.services, self.run_id, self.seconds
        );
        let _ = writeln!(
            out,
            "  p50 {p50:.1} ms, p90 {p90:.1} ms, p99 {p99:.1} ms, max {max:.1} ms"
        );
        let _ = writeln!(
            out,
            "  changes {} at {:.1}/s (asked {:.0}/s), programmed {}, failed {}",
            self.changes,
            self.change_rate,
            self.target_rate,
            self.programmed(),
            self.failed
        );
        let _ = writeln!(
            out,
            "  agent syncs during the run: {} partial (mean {:.1} ms), {} full (minSyncPeriod {:.0} ms)",
            self.syncs.partial,
            self.syncs.partial_mean_ms(),
            self.syncs.full,
            self.min_sync_period_ms
        );
        let _ = writeln!(
            out,
            "  probes: {} connects to the new frontends (interval up to {:.1} ms); control frontend {} connects, {} false successes",
            self.probe_attempts,
            self.longest_probe_interval_ms,
            self.control_attempts,
            self.false_successes
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results() -> LatencyResults {
        LatencyResults {
            run_id: "kpb1n0".into(),
            env: Environment {
                kernel: "6.18.0".into(),
                cpu: "Some CPU x2".into(),
                run: "2026-01-02T03:04:05Z".into(),
            },
            mode: "ebpf".into(),
            services: 10_000,
            rep: 0,
            changes: 100,
            latencies_ms: (1..=99).map(f64::from).collect(),
            failed: 1,
            change_rate: 99.5,
            target_rate: 100.0,
            min_sync_period_ms: 0.0,
            control_attempts: 5000,
            false_successes: 0,
            probe_attempts: 400,
            longest_probe_interval_ms: 1.0,
            syncs: SyncCounts {
                full: 0,
                partial: 80,
                full_seconds: 0.0,
                partial_seconds: 0.4,
            },
            seconds: 70.0,
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        assert_eq!(results().percentiles(), [50.0, 90.0, 99.0, 99.0]);
        let empty = LatencyResults {
            latencies_ms: Vec::new(),
            ..results()
        };
        assert!(empty.percentiles().iter().all(|v| v.is_nan()));
    }

    #[test]
    fn csv_rows_name_the_metrics_without_ratio() {
        let rows = results().csv_rows();
        assert_eq!(rows.len(), 14);
        assert_eq!(
            rows[0],
            "latency,ebpf,10000,0,programming_p50,50.0000,ms,,6.1.0,Some CPU x2,2026-01-02T03:04:05Z"
                .replace("6.1.0", "6.18.0")
        );
        assert!(rows[4].starts_with("latency,ebpf,10000,0,changes,100.0000,count,,"));
        assert!(rows[6].starts_with("latency,ebpf,10000,0,failed,1.0000,count,,"));
        for row in &rows {
            assert_eq!(row.split(',').count(), 11, "{row}");
        }
        assert!(results().table().contains("p99 99.0 ms"));
    }
}
