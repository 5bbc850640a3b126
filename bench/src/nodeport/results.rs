// SPDX-License-Identifier: Apache-2.0
//! Samples of a NodePort benchmark run, the paired ratios, CSV rows and the printed table
//! (pure). One sample is one client run: the same client alternated between the backend
//! (direct) and the NodePort in short slices, with one attachment on the uplink; its
//! ratio is NodePort over that run's direct value. A summary is the median over reps.

use std::fmt::Write as _;

use super::{Attach, Backend, Traffic, env::XdpAttached};
use crate::{
    load::ClientReport,
    results::{Environment, csv_num},
    stats::{median, min_max},
    udp::UdpReport,
};

pub const BENCH: &str = "nodeport";

/// Reads one metric of a route's measurement.
type MetricOf = fn(&Measured) -> Option<f64>;

/// What one route of a client run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// Connections per second (TCP) or answered datagrams per second (UDP).
    pub rate: f64,
    pub connect_p50_us: Option<f64>,
    pub connect_p99_us: Option<f64>,
    pub loss_percent: Option<f64>,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl From<&ClientReport> for Measured {
    fn from(r: &ClientReport) -> Self {
        Measured {
            rate: r.rate,
            connect_p50_us: Some(r.connect_p50_us),
            connect_p99_us: Some(r.connect_p99_us),
            loss_percent: None,
            errors: r.errors,
            first_error: r.first_error.clone(),
        }
    }
}

impl From<&UdpReport> for Measured {
    fn from(r: &UdpReport) -> Self {
        Measured {
            rate: r.pps,
            connect_p50_us: None,
            connect_p99_us: None,
            loss_percent: Some(r.loss_percent()),
            errors: r.errors,
            first_error: r.first_error.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeportSample {
    pub attach: Attach,
    pub backend: Backend,
    pub traffic: Traffic,
    pub rep: u32,
    pub direct: Measured,
    pub nodeport: Measured,
    pub steal_percent: Option<f64>,
}

/// Medians of one (attachment, backend, traffic) over the reps.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeportSummary {
    pub attach: Attach,
    pub backend: Backend,
    pub traffic: Traffic,
    pub reps: usize,
    pub direct_rate: f64,
    pub nodeport_rate: f64,
    /// Median of the paired NodePort / direct rate ratios, and their range.
    pub rate_ratio: f64,
    pub rate_ratio_min: f64,
    pub rate_ratio_max: f64,
    /// TCP: median paired connect() p99 ratio.
    pub p99_ratio: Option<f64>,
    /// UDP: median NodePort loss.
    pub nodeport_loss_percent: Option<f64>,
    pub nodeport_errors: u64,
    pub first_error: Option<String>,
}

/// How an attachment the run asked for sat on the uplink.
#[derive(Debug, Clone, PartialEq)]
pub struct AttachState {
    pub attach: Attach,
    pub seen: XdpAttached,
    /// The agent's XDP log lines when it did not attach as asked.
    pub note: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeportResults {
    pub run_id: String,
    pub env: Environment,
    pub rep_seconds: f64,
    pub udp_window: u32,
    pub attach_states: Vec<AttachState>,
    pub samples: Vec<NodeportSample>,
}

fn med(values: &[f64]) -> f64 {
    median(values).unwrap_or(f64::NAN)
}

impl NodeportResults {
    pub fn summary(&self) -> Vec<NodeportSummary> {
        let mut out = Vec::new();
        for attach in Attach::ALL {
            for backend in [Backend::Local, Backend::Remote] {
                for traffic in [Traffic::Tcp, Traffic::Udp] {
                    let of: Vec<&NodeportSample> = self
                        .samples
                        .iter()
                        .filter(|s| s.attach == attach && s.backend == backend)
                        .filter(|s| s.traffic == traffic)
                        .collect();
                    if of.is_empty() {
                        continue;
                    }
                    let ratios: Vec<f64> = of
                        .iter()
                        .filter(|s| s.direct.rate > 0.0)
                        .map(|s| s.nodeport.rate / s.direct.rate)
                        .collect();
                    let (lo, hi) = min_max(&ratios).unwrap_or((f64::NAN, f64::NAN));
                    let p99: Vec<f64> = of
                        .iter()
                        .filter_map(|s| Some(s.nodeport.connect_p99_us? / s.direct.connect_p99_us?))
                        .filter(|r| r.is_finite())
                        .collect();
                    let loss: Vec<f64> =
                        of.iter().filter_map(|s| s.nodeport.loss_percent).collect();
                    out.push(NodeportSummary {
                        attach,
                        backend,
                        traffic,
                        reps: of.len(),
                        direct_rate: med(&of.iter().map(|s| s.direct.rate).collect::<Vec<_>>()),
                        nodeport_rate: med(&of.iter().map(|s| s.nodeport.rate).collect::<Vec<_>>()),
                        rate_ratio: med(&ratios),
                        rate_ratio_min: lo,
                        rate_ratio_max: hi,
                        p99_ratio: median(&p99),
                        nodeport_loss_percent: median(&loss),
                        nodeport_errors: of.iter().map(|s| s.nodeport.errors).sum(),
                        first_error: of.iter().find_map(|s| s.nodeport.first_error.clone()),
                    });
                }
            }
        }
        out
    }

    /// Rows for the CSV (without the header). `mode` is `<route>/<attachment>/<backend>`
    /// (route `direct` or `nodeport`); N is the number of services (2).
    pub fn csv_rows(&self) -> Vec<String> {
        let env = &self.env;
        let tail = env.csv_tail();
        let row = |mode: &str, rep: &str, metric: &str, value: f64, unit: &str, ratio: &str| {
            format!(
                "{BENCH},{mode},2,{rep},{metric},{},{unit},{ratio},{tail}",
                csv_num(value)
            )
        };
        let mut rows = Vec::new();
        for state in &self.attach_states {
            let ok = state.seen.matches(state.attach);
            rows.push(row(
                &format!("nodeport/{}/-", state.attach.as_str()),
                "setup",
                "attached_as_asked",
                if ok { 1.0 } else { 0.0 },
                "bool",
                "",
            ));
        }
        for s in &self.samples {
            let rep = s.rep.to_string();
            let place = format!("{}/{}", s.attach.as_str(), s.backend.as_str());
            let metrics: Vec<(&str, &str, MetricOf)> = match s.traffic {
                Traffic::Tcp => vec![
                    ("conn_rate", "conn/s", |m| Some(m.rate)),
                    ("connect_p50", "us", |m| m.connect_p50_us),
                    ("connect_p99", "us", |m| m.connect_p99_us),
                    ("tcp_errors", "count", |m| Some(m.errors as f64)),
                ],
                Traffic::Udp => vec![
                    ("udp_pps", "pkt/s", |m| Some(m.rate)),
                    ("udp_loss", "%", |m| m.loss_percent),
                    ("udp_errors", "count", |m| Some(m.errors as f64)),
                ],
            };
            for (metric, unit, get) in metrics {
                let (Some(d), Some(n)) = (get(&s.direct), get(&s.nodeport)) else {
                    continue;
                };
                let ratio = if metric.ends_with("errors") || metric == "udp_loss" || d <= 0.0 {
                    String::new()
                } else {
                    csv_num(n / d)
                };
                rows.push(row(&format!("direct/{place}"), &rep, metric, d, unit, "1"));
                rows.push(row(
                    &format!("nodeport/{place}"),
                    &rep,
                    metric,
                    n,
                    unit,
                    &ratio,
                ));
            }
            if let Some(steal) = s.steal_percent {
                let metric = format!("{}_cpu_steal", s.traffic.as_str());
                rows.push(row(
                    &format!("nodeport/{place}"),
                    &rep,
                    &metric,
                    steal,
                    "%",
                    "",
                ));
            }
        }
        for sum in self.summary() {
            let place = format!("{}/{}", sum.attach.as_str(), sum.backend.as_str());
            let (metric, unit) = match sum.traffic {
                Traffic::Tcp => ("conn_rate", "conn/s"),
                Traffic::Udp => ("udp_pps", "pkt/s"),
            };
            rows.push(row(
                &format!("direct/{place}"),
                "median",
                metric,
                sum.direct_rate,
                unit,
                "1",
            ));
            rows.push(row(
                &format!("nodeport/{place}"),
                "median",
                metric,
                sum.nodeport_rate,
                unit,
                &csv_num(sum.rate_ratio),
            ));
            if let Some(p99) = sum.p99_ratio {
                rows.push(row(
                    &format!("nodeport/{place}"),
                    "median",
                    "connect_p99_ratio",
                    p99,
                    "x",
                    "",
                ));
            }
            if let Some(loss) = sum.nodeport_loss_percent {
                rows.push(row(
                    &format!("nodeport/{place}"),
                    "median",
                    "udp_loss",
                    loss,
                    "%",
                    "",
                ));
            }
        }
        rows
    }

    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "nodeport benchmark, {} ({}; kernel {}; {:.1} s per route and client run; UDP window {})",
            self.env.run, self.env.cpu, self.env.kernel, self.rep_seconds, self.udp_window
        );
        for state in &self.attach_states {
            if !state.seen.matches(state.attach) {
                let _ = writeln!(
                    out,
                    "{}: not attached as asked (uplink shows {:?}); not measured. {}",
                    state.attach.as_str(),
                    state.seen,
                    state.note
                );
            }
        }
        let _ = writeln!(
            out,
            "{:<12} {:<7} {:<4} {:>5} {:>12} {:>12} {:>8} {:>15} {:>9} {:>7}",
            "attach",
            "backend",
            "",
            "reps",
            "direct",
            "nodeport",
            "ratio",
            "ratio range",
            "p99 x",
            "loss %"
        );
        for s in self.summary() {
            let _ = writeln!(
                out,
                "{:<12} {:<7} {:<4} {:>5} {:>12.0} {:>12.0} {:>8.3} {:>7.3}..{:<7.3} {:>9} {:>7}",
                s.attach.as_str(),
                s.backend.as_str(),
                s.traffic.as_str(),
                s.reps,
                s.direct_rate,
                s.nodeport_rate,
                s.rate_ratio,
                s.rate_ratio_min,
                s.rate_ratio_max,
                s.p99_ratio.map_or("-".into(), |r| format!("{r:.3}")),
                s.nodeport_loss_percent
                    .map_or("-".into(), |l| format!("{l:.2}")),
            );
            if s.nodeport_errors > 0 {
                let _ = writeln!(
                    out,
                    "    {} NodePort errors (first: {})",
                    s.nodeport_errors,
                    s.first_error.as_deref().unwrap_or("?")
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(rate: f64, p99: f64) -> Measured {
        Measured {
            rate,
            connect_p50_us: Some(p99 / 2.0),
            connect_p99_us: Some(p99),
            loss_percent: None,
            errors: 0,
            first_error: None,
        }
    }

    fn udp(pps: f64, loss: f64) -> Measured {
        Measured {
            rate: pps,
            connect_p50_us: None,
            connect_p99_us: None,
            loss_percent: Some(loss),
            errors: 0,
            first_error: None,
        }
    }

    fn results() -> NodeportResults {
        let sample = |attach, traffic, rep, direct, nodeport| NodeportSample {
            attach,
            backend: Backend::Local,
            traffic,
            rep,
            direct,
            nodeport,
            steal_percent: Some(0.5),
        };
        NodeportResults {
            run_id: "kpt0001".into(),
            env: Environment {
                kernel: "6.1.0".into(),
                cpu: "Some CPU x2".into(),
                run: "2025-01-02T03:04:05Z".into(),
            },
            rep_seconds: 1.0,
            udp_window: 16,
            attach_states: vec![
                AttachState {
                    attach: Attach::Tc,
                    seen: XdpAttached::None,
                    note: String::new(),
                },
                AttachState {
                    attach: Attach::XdpNative,
                    seen: XdpAttached::None,
                    note: "fell back".into(),
                },
            ],
            samples: vec![
                sample(
                    Attach::Tc,
                    Traffic::Tcp,
                    0,
                    tcp(1000.0, 40.0),
                    tcp(900.0, 60.0),
                ),
                sample(
                    Attach::Tc,
                    Traffic::Tcp,
                    1,
                    tcp(1000.0, 40.0),
                    tcp(800.0, 40.0),
                ),
                sample(
                    Attach::Tc,
                    Traffic::Tcp,
                    2,
                    tcp(2000.0, 40.0),
                    tcp(1900.0, 80.0),
                ),
                sample(
                    Attach::Tc,
                    Traffic::Udp,
                    0,
                    udp(10000.0, 0.0),
                    udp(9000.0, 1.0),
                ),
            ],
        }
    }

    #[test]
    fn ratios_pair_each_client_run() {
        let s = results().summary();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].traffic, s[0].reps), (Traffic::Tcp, 3));
        assert!((s[0].rate_ratio - 0.9).abs() < 1e-9);
        assert!((s[0].rate_ratio_min - 0.8).abs() < 1e-9);
        assert!((s[0].rate_ratio_max - 0.95).abs() < 1e-9);
        assert_eq!(s[0].p99_ratio, Some(1.5));
        assert_eq!(s[0].direct_rate, 1000.0);
        assert_eq!(s[1].traffic, Traffic::Udp);
        assert!((s[1].rate_ratio - 0.9).abs() < 1e-9);
        assert_eq!(s[1].nodeport_loss_percent, Some(1.0));
    }

    #[test]
    fn csv_rows_name_route_attachment_and_backend() {
        let r = results();
        let rows = r.csv_rows();
        assert!(
            rows[0].starts_with("nodeport,nodeport/tc/-,2,setup,attached_as_asked,1.0000,bool,,")
        );
        assert!(
            rows[1].starts_with("nodeport,nodeport/xdp-native/-,2,setup,attached_as_asked,0.0000,")
        );
        assert!(rows.contains(
            &"nodeport,nodeport/tc/local,2,0,conn_rate,900.0000,conn/s,0.9000,6.1.0,Some CPU x2,2025-01-02T03:04:05Z".to_string()
        ));
        assert!(
            rows.iter()
                .any(|r| r.starts_with("nodeport,direct/tc/local,2,0,udp_pps,10000.0000,pkt/s,1,"))
        );
        assert!(rows.iter().any(|r| {
            r.starts_with("nodeport,nodeport/tc/local,2,median,conn_rate,900.0000,conn/s,0.9000,")
        }));
        let columns = crate::results::CSV_HEADER.split(',').count();
        assert!(
            rows.iter().all(|r| r.split(',').count() == columns),
            "{rows:#?}"
        );
        let table = r.table();
        assert!(
            table.contains("xdp-native: not attached as asked"),
            "{table}"
        );
    }
}
