// SPDX-License-Identifier: Apache-2.0
//! Samples of a ClusterIP benchmark run, the ratios computed from them, the CSV rows and
//! the printed table (pure).
//!
//! Ratios compare measurements of the same run only. Both routes of a rep come from one
//! client process that alternated between them in short slices, so a rep's ClusterIP value
//! is paired with its direct value, and a phase's ratio is the median of its reps' paired
//! ratios. The scaling ratios compare the ClusterIP medians of the largest and smallest
//! service counts (phases run one after the other).

use std::{
    fmt::Write as _,
    fs::{self, OpenOptions},
    io::Write as _,
    path::Path,
};

use super::{
    error::{Error, Result},
    load::ClientReport,
    stats::{median, min_max},
};

pub const BENCH: &str = "clusterip";
pub const CSV_HEADER: &str = "bench,mode,N,rep,metric,value,unit,ratio_to_baseline,kernel,cpu,run";
/// The targets of issue 3 (reported, never asserted).
pub const TARGET_MIN_RATE_RATIO: f64 = 0.95;
pub const TARGET_MAX_P99_SCALING: f64 = 1.05;

/// How the client reaches the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Straight to the backend's address (the baseline).
    Direct,
    /// Through the ClusterIP, translated at connect().
    ClusterIp,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Direct => "direct",
            Route::ClusterIp => "clusterip",
        }
    }

    /// The order of rep `index` (counted over the whole run): alternating, so neither
    /// route always opens a rep.
    pub fn order(index: u32) -> [Route; 2] {
        if index.is_multiple_of(2) {
            [Route::Direct, Route::ClusterIp]
        } else {
            [Route::ClusterIp, Route::Direct]
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    Rate,
    ConnectP50,
    ConnectP99,
}

impl Metric {
    pub const ALL: [Metric; 3] = [Metric::Rate, Metric::ConnectP50, Metric::ConnectP99];

    pub fn name(self) -> &'static str {
        match self {
            Metric::Rate => "conn_rate",
            Metric::ConnectP50 => "connect_p50",
            Metric::ConnectP99 => "connect_p99",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Metric::Rate => "conn/s",
            Metric::ConnectP50 | Metric::ConnectP99 => "us",
        }
    }

    pub fn of(self, report: &ClientReport) -> f64 {
        match self {
            Metric::Rate => report.rate,
            Metric::ConnectP50 => report.connect_p50_us,
            Metric::ConnectP99 => report.connect_p99_us,
        }
    }
}

/// One client run.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub route: Route,
    /// Services in the maps while it ran.
    pub services: u32,
    pub rep: u32,
    pub report: ClientReport,
    /// Share of the client's and server's CPU time the hypervisor took while it ran.
    pub steal_percent: Option<f64>,
}

/// Medians and paired ratios of one metric in one phase.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricSummary {
    pub direct: f64,
    pub clusterip: f64,
    /// Median over reps of clusterip / direct.
    pub ratio: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
}

/// One service count.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseSummary {
    pub services: u32,
    pub reps: usize,
    pub rate: MetricSummary,
    pub p50: MetricSummary,
    pub p99: MetricSummary,
}

impl PhaseSummary {
    pub fn metric(&self, metric: Metric) -> &MetricSummary {
        match metric {
            Metric::Rate => &self.rate,
            Metric::ConnectP50 => &self.p50,
            Metric::ConnectP99 => &self.p99,
        }
    }
}

/// The largest service count against the smallest, ClusterIP only. Each rep measured both
/// counts next to each other in time; the values are medians of the per-rep ratios.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scaling {
    pub from: u32,
    pub to: u32,
    pub p50: f64,
    pub p99: f64,
    pub p99_min: f64,
    pub p99_max: f64,
    /// p99 scaling with each count's ClusterIP p99 first divided by the direct p99 of
    /// the same client run, which removes what the whole machine did between the two.
    pub p99_normalized: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub phases: Vec<PhaseSummary>,
    pub scaling: Option<Scaling>,
}

fn summarize_metric(pairs: &[(&ClientReport, &ClientReport)], metric: Metric) -> MetricSummary {
    let direct: Vec<f64> = pairs.iter().map(|(d, _)| metric.of(d)).collect();
    let cip: Vec<f64> = pairs.iter().map(|(_, c)| metric.of(c)).collect();
    let ratios: Vec<f64> = pairs
        .iter()
        .filter(|(d, _)| metric.of(d) > 0.0)
        .map(|(d, c)| metric.of(c) / metric.of(d))
        .collect();
    let (ratio_min, ratio_max) = min_max(&ratios).unwrap_or((f64::NAN, f64::NAN));
    MetricSummary {
        direct: median(&direct).unwrap_or(f64::NAN),
        clusterip: median(&cip).unwrap_or(f64::NAN),
        ratio: median(&ratios).unwrap_or(f64::NAN),
        ratio_min,
        ratio_max,
    }
}

/// The phases (ascending service counts) and the scaling between the extreme ones.
pub fn summarize(samples: &[Sample]) -> Summary {
    let mut counts: Vec<u32> = samples.iter().map(|s| s.services).collect();
    counts.sort_unstable();
    counts.dedup();
    let mut phases = Vec::new();
    for services in counts {
        let of = |route: Route, rep: u32| {
            samples
                .iter()
                .find(|s| s.services == services && s.route == route && s.rep == rep)
                .map(|s| &s.report)
        };
        let mut reps: Vec<u32> = samples
            .iter()
            .filter(|s| s.services == services)
            .map(|s| s.rep)
            .collect();
        reps.sort_unstable();
        reps.dedup();
        let pairs: Vec<(&ClientReport, &ClientReport)> = reps
            .iter()
            .filter_map(|rep| Some((of(Route::Direct, *rep)?, of(Route::ClusterIp, *rep)?)))
            .collect();
        phases.push(PhaseSummary {
            services,
            reps: pairs.len(),
            rate: summarize_metric(&pairs, Metric::Rate),
            p50: summarize_metric(&pairs, Metric::ConnectP50),
            p99: summarize_metric(&pairs, Metric::ConnectP99),
        });
    }
    let scaling = match (phases.first(), phases.last()) {
        (Some(low), Some(high)) if phases.len() > 1 => {
            scaling(samples, low.services, high.services)
        }
        _ => None,
    };
    Summary { phases, scaling }
}

fn scaling(samples: &[Sample], from: u32, to: u32) -> Option<Scaling> {
    let find = |services: u32, route: Route, rep: u32| {
        samples
            .iter()
            .find(|s| s.services == services && s.route == route && s.rep == rep)
            .map(|s| &s.report)
    };
    let mut p50 = Vec::new();
    let mut p99 = Vec::new();
    let mut p99_normalized = Vec::new();
    let mut reps: Vec<u32> = samples.iter().map(|s| s.rep).collect();
    reps.sort_unstable();
    reps.dedup();
    for rep in reps {
        let (Some(low), Some(high)) = (
            find(from, Route::ClusterIp, rep),
            find(to, Route::ClusterIp, rep),
        ) else {
            continue;
        };
        if low.connect_p50_us > 0.0 {
            p50.push(high.connect_p50_us / low.connect_p50_us);
        }
        if low.connect_p99_us > 0.0 {
            p99.push(high.connect_p99_us / low.connect_p99_us);
        }
        if let (Some(low_direct), Some(high_direct)) =
            (find(from, Route::Direct, rep), find(to, Route::Direct, rep))
            && low.connect_p99_us > 0.0
            && low_direct.connect_p99_us > 0.0
            && high_direct.connect_p99_us > 0.0
        {
            p99_normalized.push(
                (high.connect_p99_us / high_direct.connect_p99_us)
                    / (low.connect_p99_us / low_direct.connect_p99_us),
            );
        }
    }
    let (p99_min, p99_max) = min_max(&p99)?;
    Some(Scaling {
        from,
        to,
        p50: median(&p50).unwrap_or(f64::NAN),
        p99: median(&p99)?,
        p99_min,
        p99_max,
        p99_normalized: median(&p99_normalized).unwrap_or(f64::NAN),
    })
}

/// Where and when a run was made.
#[derive(Debug, Clone, PartialEq)]
pub struct Environment {
    pub kernel: String,
    pub cpu: String,
    /// When the run started (RFC 3339, UTC): the run's identity in the CSV.
    pub run: String,
}

impl Environment {
    /// The last three fields of every CSV row: `kernel,cpu,run`.
    pub fn csv_tail(&self) -> String {
        format!(
            "{},{},{}",
            csv_field(&self.kernel),
            csv_field(&self.cpu),
            csv_field(&self.run)
        )
    }

    pub fn detect() -> Self {
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|k| k.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let model = fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, m)| m.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        Environment {
            kernel,
            cpu: format!("{model} x{cpus}"),
            run: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        }
    }
}

/// What a finished run hands back.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchResults {
    /// The `kpb<pid>n<seq>` id that named the run's namespaces, cgroup and pins.
    pub run_id: String,
    pub env: Environment,
    /// Connections made to fill the socket reverse-NAT map before the first phase.
    pub sock_rev_nat_fill: Option<u64>,
    pub rep_seconds: f64,
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    pub samples: Vec<Sample>,
    pub summary: Summary,
}

/// A CSV field without the separators.
pub fn csv_field(text: &str) -> String {
    text.replace([',', '\n', '\r'], ";")
}

/// A CSV number (empty when not finite).
pub fn csv_num(value: f64) -> String {
    if value.is_finite() {
        format!("{value:.4}")
    } else {
        String::new()
    }
}

/// Appends `rows` to the CSV at `path`, writing the header first when the file is new.
/// Every benchmark writes the same columns ([`CSV_HEADER`]).
pub fn append_csv_rows(path: &Path, rows: &[String]) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    }
    let fresh = fs::metadata(path).map_or(true, |m| m.len() == 0);
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(Error::io(format!("opening {}", path.display())))?;
    let mut text = String::new();
    if fresh {
        text.push_str(CSV_HEADER);
        text.push('\n');
    }
    for row in rows {
        text.push_str(row);
        text.push('\n');
    }
    file.write_all(text.as_bytes())
        .map_err(Error::io(format!("writing {}", path.display())))
}

impl BenchResults {
    /// Rows for the CSV (without the header): every rep, then the medians with the paired
    /// ratios (`rep` = `median`), then the scaling rows.
    pub fn csv_rows(&self) -> Vec<String> {
        let env = &self.env;
        let tail = env.csv_tail();
        let row =
            |mode: &str, n: u32, rep: &str, metric: &str, value: f64, unit: &str, ratio: &str| {
                format!(
                    "{BENCH},{mode},{n},{rep},{metric},{},{unit},{ratio},{tail}",
                    csv_num(value)
                )
            };
        let mut rows = Vec::new();
        if let (Some(made), Some(first)) = (self.sock_rev_nat_fill, self.summary.phases.first()) {
            rows.push(row(
                "clusterip",
                first.services,
                "setup",
                "sock_rev_nat_fill",
                made as f64,
                "connections",
                "",
            ));
        }
        for s in &self.samples {
            let partner = self
                .samples
                .iter()
                .find(|o| o.services == s.services && o.rep == s.rep && o.route == Route::Direct);
            for metric in Metric::ALL {
                let ratio = match (s.route, partner) {
                    (Route::Direct, _) => "1".to_string(),
                    (Route::ClusterIp, Some(d)) if metric.of(&d.report) > 0.0 => {
                        csv_num(metric.of(&s.report) / metric.of(&d.report))
                    }
                    _ => String::new(),
                };
                rows.push(row(
                    s.route.as_str(),
                    s.services,
                    &s.rep.to_string(),
                    metric.name(),
                    metric.of(&s.report),
                    metric.unit(),
                    &ratio,
                ));
            }
            rows.push(row(
                s.route.as_str(),
                s.services,
                &s.rep.to_string(),
                "errors",
                s.report.errors as f64,
                "count",
                "",
            ));
            if let Some(steal) = s.steal_percent {
                rows.push(row(
                    s.route.as_str(),
                    s.services,
                    &s.rep.to_string(),
                    "cpu_steal",
                    steal,
                    "%",
                    "",
                ));
            }
        }
        for phase in &self.summary.phases {
            for metric in Metric::ALL {
                let m = phase.metric(metric);
                rows.push(row(
                    "direct",
                    phase.services,
                    "median",
                    metric.name(),
                    m.direct,
                    metric.unit(),
                    "1",
                ));
                rows.push(row(
                    "clusterip",
                    phase.services,
                    "median",
                    metric.name(),
                    m.clusterip,
                    metric.unit(),
                    &csv_num(m.ratio),
                ));
            }
        }
        if let Some(sc) = &self.summary.scaling {
            for (metric, value) in [
                ("connect_p50_scaling", sc.p50),
                ("connect_p99_scaling", sc.p99),
                ("connect_p99_scaling_normalized", sc.p99_normalized),
            ] {
                rows.push(row("clusterip", sc.to, "median", metric, value, "x", ""));
            }
        }
        rows
    }

    /// Appends the rows to `path`, writing the header first when the file is new.
    pub fn append_csv(&self, path: &Path) -> Result<()> {
        append_csv_rows(path, &self.csv_rows())
    }

    /// The human-readable report.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let reps = self.summary.phases.first().map_or(0, |p| p.reps);
        let cpu = |c: Option<usize>| c.map_or("unpinned".to_string(), |c| format!("CPU {c}"));
        let _ = writeln!(
            out,
            "clusterip benchmark, {} ({}; kernel {}; {reps} reps of {:.1} s per route; client {}, server {})",
            self.env.run,
            self.env.cpu,
            self.env.kernel,
            self.rep_seconds,
            cpu(self.client_cpu),
            cpu(self.server_cpu),
        );
        let _ = writeln!(
            out,
            "{:>8}  {:<10} {:>12} {:>14} {:>14}   {:>10} {:>10} {:>10}",
            "services", "route", "conn/s", "connect p50", "connect p99", "rate x", "p50 x", "p99 x"
        );
        for p in &self.summary.phases {
            for route in [Route::Direct, Route::ClusterIp] {
                let pick = |m: &MetricSummary| match route {
                    Route::Direct => m.direct,
                    Route::ClusterIp => m.clusterip,
                };
                let ratios = match route {
                    Route::Direct => String::new(),
                    Route::ClusterIp => format!(
                        "   {:>10.3} {:>10.3} {:>10.3}",
                        p.rate.ratio, p.p50.ratio, p.p99.ratio
                    ),
                };
                let _ = writeln!(
                    out,
                    "{:>8}  {:<10} {:>12.0} {:>11.1} us {:>11.1} us{ratios}",
                    p.services,
                    route.as_str(),
                    pick(&p.rate),
                    pick(&p.p50),
                    pick(&p.p99),
                );
            }
        }
        let steal: Vec<f64> = self
            .samples
            .iter()
            .filter_map(|s| s.steal_percent)
            .collect();
        if let (Some(med), Some((_, max))) = (median(&steal), min_max(&steal)) {
            let _ = writeln!(
                out,
                "CPU time taken by the hypervisor (steal) on the client and server CPUs: median {med:.1} %, worst rep {max:.1} %"
            );
        }
        let _ = writeln!(out, "ratios measured in this run (medians over reps):");
        for line in self.verdicts() {
            let _ = writeln!(out, "  {line}");
        }
        out
    }

    /// One line per target of the issue, with whether it holds (never asserted).
    pub fn verdicts(&self) -> Vec<String> {
        let holds = |ok: bool| if ok { "holds" } else { "does NOT hold" };
        let mut lines = Vec::new();
        for p in &self.summary.phases {
            lines.push(format!(
                "rate(ClusterIP, N={})/rate(direct) = {:.3} (reps {:.3}..{:.3}); target >= {TARGET_MIN_RATE_RATIO}: {}",
                p.services,
                p.rate.ratio,
                p.rate.ratio_min,
                p.rate.ratio_max,
                holds(p.rate.ratio >= TARGET_MIN_RATE_RATIO)
            ));
            lines.push(format!(
                "p50(ClusterIP, N={})/p50(direct) = {:.3}, p99(ClusterIP, N={})/p99(direct) = {:.3}",
                p.services, p.p50.ratio, p.services, p.p99.ratio
            ));
        }
        if let Some(sc) = &self.summary.scaling {
            lines.push(format!(
                "p99(N={})/p99(N={}) = {:.3} (reps {:.3}..{:.3}; drift-normalized {:.3}); target <= {TARGET_MAX_P99_SCALING}: {}",
                sc.to,
                sc.from,
                sc.p99,
                sc.p99_min,
                sc.p99_max,
                sc.p99_normalized,
                holds(sc.p99 <= TARGET_MAX_P99_SCALING)
            ));
            lines.push(format!(
                "p50(N={})/p50(N={}) = {:.3}",
                sc.to, sc.from, sc.p50
            ));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rate: f64, p50: f64, p99: f64) -> ClientReport {
        ClientReport {
            target: "10.0.0.1:80".parse().unwrap(),
            connections: 100,
            errors: 0,
            first_error: None,
            seconds: 1.0,
            rate,
            connect_p50_us: p50,
            connect_p99_us: p99,
            connect_mean_us: p50,
        }
    }

    fn sample(route: Route, services: u32, rep: u32, r: ClientReport) -> Sample {
        Sample {
            route,
            services,
            rep,
            report: r,
            steal_percent: (rep == 0).then_some(12.5),
        }
    }

    fn results() -> BenchResults {
        let samples = vec![
            sample(Route::Direct, 1, 0, report(1000.0, 10.0, 20.0)),
            sample(Route::ClusterIp, 1, 0, report(950.0, 11.0, 22.0)),
            sample(Route::ClusterIp, 1, 1, report(1000.0, 10.0, 30.0)),
            sample(Route::Direct, 1, 1, report(1000.0, 10.0, 20.0)),
            sample(Route::Direct, 1, 2, report(2000.0, 10.0, 20.0)),
            sample(Route::ClusterIp, 1, 2, report(1800.0, 10.0, 20.0)),
            sample(Route::Direct, 100, 0, report(1000.0, 10.0, 20.0)),
            sample(Route::ClusterIp, 100, 0, report(900.0, 12.0, 44.0)),
        ];
        BenchResults {
            run_id: "kpb1n0".into(),
            sock_rev_nat_fill: Some(144_179),
            env: Environment {
                kernel: "6.1.0".into(),
                cpu: "Some CPU, 2 GHz x2".into(),
                run: "2025-01-02T03:04:05Z".into(),
            },
            rep_seconds: 1.0,
            client_cpu: Some(0),
            server_cpu: Some(1),
            summary: summarize(&samples),
            samples,
        }
    }

    #[test]
    fn orders_alternate() {
        assert_eq!(Route::order(0), [Route::Direct, Route::ClusterIp]);
        assert_eq!(Route::order(1), [Route::ClusterIp, Route::Direct]);
        assert_eq!(Route::order(2), Route::order(0));
    }

    #[test]
    fn ratios_pair_reps_and_take_medians() {
        let r = results();
        let low = &r.summary.phases[0];
        assert_eq!((low.services, low.reps), (1, 3));
        // Paired rate ratios 0.95, 1.0, 0.9: median 0.95, not a ratio of medians.
        assert!((low.rate.ratio - 0.95).abs() < 1e-12);
        assert_eq!((low.rate.ratio_min, low.rate.ratio_max), (0.9, 1.0));
        assert_eq!(low.rate.direct, 1000.0);
        assert_eq!(low.rate.clusterip, 1000.0);
        assert_eq!(low.p99.clusterip, 22.0);
        // Scaling pairs the counts within a rep: only rep 0 has both.
        let sc = r.summary.scaling.unwrap();
        assert_eq!((sc.from, sc.to), (1, 100));
        assert_eq!((sc.p99, sc.p99_min, sc.p99_max), (2.0, 2.0, 2.0));
        assert!((sc.p50 - 12.0 / 11.0).abs() < 1e-12);
        // (44 / 20) / (22 / 20)
        assert!((sc.p99_normalized - 2.0).abs() < 1e-12);
        assert_eq!(summarize(&r.samples[..2]).scaling, None);
    }

    #[test]
    fn csv_rows_carry_every_rep_and_the_summary() {
        let r = results();
        let rows = r.csv_rows();
        // The fill, 8 samples x (3 metrics + errors), steal for the 4 of rep 0, 2 phases x 3
        // metrics x 2 routes, 3 scaling rows.
        assert_eq!(rows.len(), 1 + 8 * 4 + 4 + 12 + 3);
        assert!(rows[0].starts_with(
            "clusterip,clusterip,1,setup,sock_rev_nat_fill,144179.0000,connections,,"
        ));
        let columns = CSV_HEADER.split(',').count();
        assert!(
            rows.iter().all(|r| r.split(',').count() == columns),
            "{rows:#?}"
        );
        assert_eq!(
            rows[6],
            "clusterip,clusterip,1,0,conn_rate,950.0000,conn/s,0.9500,6.1.0,Some CPU; 2 GHz x2,2025-01-02T03:04:05Z"
        );
        assert!(rows.contains(
            &"clusterip,clusterip,100,median,connect_p99_scaling,2.0000,x,,6.1.0,Some CPU; 2 GHz x2,2025-01-02T03:04:05Z".to_string()
        ));
        assert!(
            rows.iter()
                .any(|r| r.starts_with("clusterip,direct,1,0,conn_rate,1000.0000,conn/s,1,"))
        );
    }

    #[test]
    fn csv_appends_below_one_header() {
        let path = std::env::temp_dir().join(format!("kpb-csv-{}.csv", std::process::id()));
        let _ = fs::remove_file(&path);
        let r = results();
        r.append_csv(&path).unwrap();
        r.append_csv(&path).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        fs::remove_file(&path).unwrap();
        assert_eq!(text.lines().filter(|l| *l == CSV_HEADER).count(), 1);
        assert_eq!(text.lines().count(), 1 + 2 * r.csv_rows().len());
    }

    #[test]
    fn verdicts_say_whether_targets_hold() {
        let r = results();
        let v = r.verdicts();
        assert!(
            v[0].starts_with("rate(ClusterIP, N=1)/rate(direct) = 0.950"),
            "{v:?}"
        );
        assert!(v[0].ends_with(": holds"));
        assert!(v[2].starts_with("rate(ClusterIP, N=100)/rate(direct) = 0.900"));
        assert!(v[2].ends_with("does NOT hold"));
        assert!(v[4].starts_with("p99(N=100)/p99(N=1) = 2.000"));
        assert!(v[4].ends_with("does NOT hold"));
        assert!(r.table().contains("median 12.5 %, worst rep 12.5 %"));
    }
}
