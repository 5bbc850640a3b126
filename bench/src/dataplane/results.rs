// SPDX-License-Identifier: Apache-2.0
//! The dataplane benchmark's samples, CSV rows and table (pure).
//!
//! CSV (`bench` = `dataplane`): per (mode, N, rep) the metrics of [`Metric`] through the
//! mode's route, their `ratio_to_baseline` the value over the direct route's in the same
//! client run (ABBA slices, same namespaces), and the direct route's values as
//! `direct_<metric>` (no ratio); `errors`, `setup_time` (s to load the N services), `steal`
//! (% of the client's and server's CPUs' time stolen by the hypervisor during the rep),
//! `load` (the 1-minute load average at its end), `rejected` (1: too much steal or load,
//! left out of the summaries) and, for the iptables-shaped placements, `position` (the
//! measured service's index in `KUBE-SERVICES`). Then per (mode, N) and metric over the
//! accepted reps: a `median` row (median value, median per-rep ratio) and `min` and `max`
//! rows (the smallest and largest value and per-rep ratio: the spread).

use std::fmt::Write as _;

use crate::{
    load::ClientReport,
    results::{Environment, csv_field, csv_num},
    stats::{median, min_max},
};

use super::{modes::DpMode, stream::StreamReport};

pub const BENCH: &str = "dataplane";

/// One (mode, N, rep).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub mode: DpMode,
    pub services: u32,
    pub rep: u32,
    /// The measured service's index among the services, where the order matters.
    pub position: Option<usize>,
    /// How long the mode took to load the N services (agent start to synced, or the
    /// restore).
    pub setup_seconds: f64,
    pub conn: ClientReport,
    pub stream: StreamReport,
    /// The direct route in the same client run (same namespaces, alternating slices).
    pub direct_conn: ClientReport,
    pub direct_stream: StreamReport,
    /// CPU steal on the client's and server's CPUs during the rep (percent).
    pub steal_percent: Option<f64>,
    /// The 1-minute load average at the rep's end.
    pub load: Option<f64>,
    /// Too much steal or load: left out of medians and spreads.
    pub rejected: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    ConnRate,
    ConnectP50,
    ConnectP99,
    RrP50,
    RrP99,
    Throughput,
}

impl Metric {
    pub const ALL: [Metric; 6] = [
        Metric::ConnRate,
        Metric::ConnectP50,
        Metric::ConnectP99,
        Metric::RrP50,
        Metric::RrP99,
        Metric::Throughput,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Metric::ConnRate => "conn_rate",
            Metric::ConnectP50 => "connect_p50",
            Metric::ConnectP99 => "connect_p99",
            Metric::RrP50 => "rr_p50",
            Metric::RrP99 => "rr_p99",
            Metric::Throughput => "throughput",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Metric::ConnRate => "conn/s",
            Metric::Throughput => "MB/s",
            _ => "us",
        }
    }

    pub fn of(self, conn: &ClientReport, stream: &StreamReport) -> f64 {
        match self {
            Metric::ConnRate => conn.rate,
            Metric::ConnectP50 => conn.connect_p50_us,
            Metric::ConnectP99 => conn.connect_p99_us,
            Metric::RrP50 => stream.rr_p50_us,
            Metric::RrP99 => stream.rr_p99_us,
            Metric::Throughput => stream.throughput_mb_s,
        }
    }

    /// The mode's value in `s`.
    pub fn value(self, s: &Sample) -> f64 {
        self.of(&s.conn, &s.stream)
    }

    /// The paired direct value in `s`.
    pub fn direct(self, s: &Sample) -> f64 {
        self.of(&s.direct_conn, &s.direct_stream)
    }

    /// value / paired direct value.
    pub fn ratio(self, s: &Sample) -> Option<f64> {
        let base = self.direct(s);
        (base > 0.0).then(|| self.value(s) / base)
    }
}

/// What a finished run hands back.
#[derive(Debug, Clone, PartialEq)]
pub struct DataplaneResults {
    /// The ids of every (mode, N, rep)'s namespaces, in the order measured.
    pub run_ids: Vec<String>,
    pub env: Environment,
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    /// Wall time of the whole run.
    pub seconds: f64,
    pub samples: Vec<Sample>,
    /// The (mode, N) that could not be measured, and why (first line of the error).
    pub failures: Vec<String>,
}

/// The summary of one (mode, N, metric) over the accepted reps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Median, smallest and largest per-rep ratio.
    pub ratio: Option<(f64, f64, f64)>,
    pub reps: usize,
}

impl DataplaneResults {
    /// (mode, N) pairs by N, then mode.
    fn groups(&self) -> Vec<(DpMode, u32)> {
        let mut groups: Vec<(DpMode, u32)> = Vec::new();
        for s in &self.samples {
            if !groups.contains(&(s.mode, s.services)) {
                groups.push((s.mode, s.services));
            }
        }
        groups.sort_by_key(|(m, n)| (*n, *m));
        groups
    }

    /// `metric` over the accepted reps of (mode, N).
    pub fn summary(&self, mode: DpMode, n: u32, metric: Metric) -> Option<Summary> {
        let of: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.mode == mode && s.services == n && !s.rejected)
            .collect();
        let values: Vec<f64> = of.iter().map(|s| metric.value(s)).collect();
        let ratios: Vec<f64> = of.iter().filter_map(|s| metric.ratio(s)).collect();
        let (min, max) = min_max(&values)?;
        let ratio = match (median(&ratios), min_max(&ratios)) {
            (Some(m), Some((lo, hi))) => Some((m, lo, hi)),
            _ => None,
        };
        Some(Summary {
            median: median(&values)?,
            min,
            max,
            ratio,
            reps: of.len(),
        })
    }

    pub fn csv_rows(&self) -> Vec<String> {
        let env = &self.env;
        let tail = env.csv_tail();
        let row = |mode: DpMode, n: u32, rep: &str, metric: &str, value: f64, unit: &str| {
            format!(
                "{BENCH},{},{n},{rep},{metric},{},{unit},",
                csv_field(mode.name()),
                csv_num(value)
            )
        };
        let finish = |head: String, ratio: Option<f64>| {
            format!("{head}{},{tail}", ratio.map(csv_num).unwrap_or_default())
        };
        let mut rows = Vec::new();
        for s in &self.samples {
            let (mode, n, rep) = (s.mode, s.services, s.rep.to_string());
            for metric in Metric::ALL {
                let head = row(mode, n, &rep, metric.name(), metric.value(s), metric.unit());
                rows.push(finish(head, metric.ratio(s)));
            }
            for metric in Metric::ALL {
                let name = format!("direct_{}", metric.name());
                let head = row(mode, n, &rep, &name, metric.direct(s), metric.unit());
                rows.push(finish(head, None));
            }
            let errors = (s.conn.errors + s.direct_conn.errors) as f64;
            rows.push(finish(row(mode, n, &rep, "errors", errors, "count"), None));
            let setup = row(mode, n, &rep, "setup_time", s.setup_seconds, "s");
            rows.push(finish(setup, None));
            if let Some(steal) = s.steal_percent {
                rows.push(finish(row(mode, n, &rep, "steal", steal, "%"), None));
            }
            if let Some(load) = s.load {
                rows.push(finish(row(mode, n, &rep, "load", load, "loadavg"), None));
            }
            let rejected = f64::from(u8::from(s.rejected));
            rows.push(finish(
                row(mode, n, &rep, "rejected", rejected, "bool"),
                None,
            ));
            if let Some(position) = s.position {
                let head = row(mode, n, &rep, "position", position as f64, "index");
                rows.push(finish(head, None));
            }
        }
        for (mode, n) in self.groups() {
            for metric in Metric::ALL {
                let Some(sum) = self.summary(mode, n, metric) else {
                    continue;
                };
                let (name, unit) = (metric.name(), metric.unit());
                let ratio = |pick: fn((f64, f64, f64)) -> f64| sum.ratio.map(pick);
                let median_row = row(mode, n, "median", name, sum.median, unit);
                rows.push(finish(median_row, ratio(|r| r.0)));
                rows.push(finish(
                    row(mode, n, "min", name, sum.min, unit),
                    ratio(|r| r.1),
                ));
                rows.push(finish(
                    row(mode, n, "max", name, sum.max, unit),
                    ratio(|r| r.2),
                ));
            }
        }
        rows
    }

    /// The medians, one line per (N, mode), in brackets the median per-rep ratio to the
    /// direct route and its range over the reps.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let cpu = |c: Option<usize>| c.map_or("unpinned".to_string(), |c| format!("CPU {c}"));
        let rejected = self.samples.iter().filter(|s| s.rejected).count();
        let _ = writeln!(
            out,
            "dataplane benchmark: {} on {}; client {}, server {}; medians over accepted reps \
             (median per-rep ratio to the same run's direct route, [min–max]); {rejected} reps rejected",
            self.env.kernel,
            self.env.cpu,
            cpu(self.client_cpu),
            cpu(self.server_cpu)
        );
        let _ = writeln!(
            out,
            "{:>6} {:<27} {:>4} {:>30} {:>30} {:>26}",
            "N", "mode", "reps", "conn/s", "connect p99 us", "rr p50 us"
        );
        for (mode, n) in self.groups() {
            let cell = |metric: Metric| match self.summary(mode, n, metric) {
                Some(Summary {
                    median,
                    ratio: Some((r, lo, hi)),
                    ..
                }) => format!("{median:.1} ({r:.3} [{lo:.3}–{hi:.3}])"),
                Some(sum) => format!("{:.1}", sum.median),
                None => "–".into(),
            };
            let reps = self
                .summary(mode, n, Metric::ConnRate)
                .map_or(0, |s| s.reps);
            let _ = writeln!(
                out,
                "{n:>6} {:<27} {reps:>4} {:>30} {:>30} {:>26}",
                mode.name(),
                cell(Metric::ConnRate),
                cell(Metric::ConnectP99),
                cell(Metric::RrP50),
            );
        }
        for failure in &self.failures {
            let first = failure.lines().next().unwrap_or_default();
            let _ = writeln!(out, "{first}");
        }
        let _ = writeln!(out, "took {:.0} s", self.seconds);
        out
    }
}
