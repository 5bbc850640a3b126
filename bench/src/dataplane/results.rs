// SPDX-License-Identifier: Apache-2.0
//! The dataplane benchmark's samples, CSV rows and table (pure).
//!
//! CSV (`bench` = `dataplane`): per (mode, N, rep) the metrics of [`Metric`], plus
//! `errors`, `setup_time` (s to load the N services) and, for the iptables-shaped
//! placements, `position` (the measured service's index in `KUBE-SERVICES`). Every mode's
//! rep is paired with a `direct` run made right before or after it (ABBA) in clean
//! namespaces; its `ratio_to_baseline` is its value over that paired direct value. The
//! `direct` rows (the baseline, empty ratio) give per (N, rep) the median of the direct
//! runs paired with the modes at that N. Then per (mode, N) a `median` row: the median
//! value over the reps, and the median of the per-rep ratios.

use std::fmt::Write as _;

use crate::{
    load::ClientReport,
    results::{Environment, csv_field, csv_num},
    stats::median,
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
    /// The `direct` runs paired with these (same rep, right before or after).
    pub direct_conn: ClientReport,
    pub direct_stream: StreamReport,
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
}

impl DataplaneResults {
    /// (mode, N) pairs by N, then mode; `direct` (whose values are the paired runs of the
    /// modes at that N) first.
    fn groups(&self) -> Vec<(DpMode, u32)> {
        let mut groups: Vec<(DpMode, u32)> = Vec::new();
        for s in &self.samples {
            for key in [(DpMode::Direct, s.services), (s.mode, s.services)] {
                if !groups.contains(&key) {
                    groups.push(key);
                }
            }
        }
        groups.sort_by_key(|(m, n)| (*n, *m));
        groups
    }

    fn reps(&self, n: u32) -> Vec<u32> {
        let mut reps: Vec<u32> = self
            .samples
            .iter()
            .filter(|s| s.services == n)
            .map(|s| s.rep)
            .collect();
        reps.sort_unstable();
        reps.dedup();
        reps
    }

    /// `direct`'s value at (N, rep): the median of the direct runs paired with the modes.
    pub fn direct_value(&self, n: u32, rep: u32, metric: Metric) -> Option<f64> {
        let values: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.services == n && s.rep == rep)
            .map(|s| metric.direct(s))
            .collect();
        median(&values)
    }

    /// Median value and median paired ratio of `metric` over the reps of (mode, N).
    pub fn median_of(&self, mode: DpMode, n: u32, metric: Metric) -> (f64, Option<f64>) {
        if mode == DpMode::Direct {
            let values: Vec<f64> = self
                .reps(n)
                .into_iter()
                .filter_map(|rep| self.direct_value(n, rep, metric))
                .collect();
            return (median(&values).unwrap_or(0.0), None);
        }
        let of: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.mode == mode && s.services == n)
            .collect();
        let values: Vec<f64> = of.iter().map(|s| metric.value(s)).collect();
        let ratios: Vec<f64> = of.iter().filter_map(|s| metric.ratio(s)).collect();
        (median(&values).unwrap_or(0.0), median(&ratios))
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
        let mut counts: Vec<u32> = self.samples.iter().map(|s| s.services).collect();
        counts.sort_unstable();
        counts.dedup();
        for n in counts {
            for rep in self.reps(n) {
                for metric in Metric::ALL {
                    if let Some(value) = self.direct_value(n, rep, metric) {
                        let head = row(
                            DpMode::Direct,
                            n,
                            &rep.to_string(),
                            metric.name(),
                            value,
                            metric.unit(),
                        );
                        rows.push(finish(head, None));
                    }
                }
            }
        }
        for s in &self.samples {
            let (mode, n, rep) = (s.mode, s.services, s.rep.to_string());
            for metric in Metric::ALL {
                let head = row(mode, n, &rep, metric.name(), metric.value(s), metric.unit());
                rows.push(finish(head, metric.ratio(s)));
            }
            let errors = s.conn.errors as f64;
            rows.push(finish(row(mode, n, &rep, "errors", errors, "count"), None));
            let setup = row(mode, n, &rep, "setup_time", s.setup_seconds, "s");
            rows.push(finish(setup, None));
            if let Some(position) = s.position {
                let head = row(mode, n, &rep, "position", position as f64, "index");
                rows.push(finish(head, None));
            }
        }
        for (mode, n) in self.groups() {
            for metric in Metric::ALL {
                let (value, ratio) = self.median_of(mode, n, metric);
                let head = row(mode, n, "median", metric.name(), value, metric.unit());
                rows.push(finish(head, ratio));
            }
        }
        rows
    }

    /// The medians, one line per (N, mode), ratios to direct in brackets.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let cpu = |c: Option<usize>| c.map_or("unpinned".to_string(), |c| format!("CPU {c}"));
        let reps = self.samples.iter().map(|s| s.rep + 1).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "dataplane benchmark: {} on {}; client {}, server {}; {reps} reps; medians (x direct)",
            self.env.kernel,
            self.env.cpu,
            cpu(self.client_cpu),
            cpu(self.server_cpu)
        );
        let _ = writeln!(
            out,
            "{:>6} {:<27} {:>16} {:>16} {:>14} {:>14} {:>16}",
            "N", "mode", "conn/s", "connect p99 us", "rr p50 us", "rr p99 us", "MB/s"
        );
        for (mode, n) in self.groups() {
            let cell = |metric: Metric| {
                let (value, ratio) = self.median_of(mode, n, metric);
                match ratio {
                    Some(r) => format!("{value:.1} ({r:.2})"),
                    None => format!("{value:.1}"),
                }
            };
            let _ = writeln!(
                out,
                "{n:>6} {:<27} {:>16} {:>16} {:>14} {:>14} {:>16}",
                mode.name(),
                cell(Metric::ConnRate),
                cell(Metric::ConnectP99),
                cell(Metric::RrP50),
                cell(Metric::RrP99),
                cell(Metric::Throughput)
            );
        }
        let _ = writeln!(out, "took {:.0} s", self.seconds);
        out
    }
}
