// SPDX-License-Identifier: Apache-2.0
//! Plain result rows of the `bpf` and `memory` benchmarks (pure): one measured value
//! each, written in the common CSV columns ([`CSV_HEADER`](super::results::CSV_HEADER)).

use std::fmt::Write as _;

use super::{
    results::{Environment, csv_field, csv_num},
    stats::{median, min_max},
};

/// One CSV row without the environment columns.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub bench: &'static str,
    pub mode: String,
    pub n: u64,
    /// A rep number, or `median` for the median over reps.
    pub rep: String,
    pub metric: String,
    pub value: f64,
    pub unit: &'static str,
    /// `None` for baselines and where no ratio applies.
    pub ratio: Option<f64>,
}

impl Row {
    pub fn csv(&self, env: &Environment) -> String {
        format!(
            "{},{},{},{},{},{},{},{},{},{},{}",
            self.bench,
            csv_field(&self.mode),
            self.n,
            csv_field(&self.rep),
            csv_field(&self.metric),
            csv_num(self.value),
            self.unit,
            self.ratio.map(csv_num).unwrap_or_default(),
            csv_field(&env.kernel),
            csv_field(&env.cpu),
            csv_field(&env.run)
        )
    }
}

/// Adds, for every (mode, N, metric) measured in numbered reps, a `median` row: the median
/// of the values and of the ratios (each rep's ratio pairs values of that same rep).
pub fn with_medians(rows: Vec<Row>) -> Vec<Row> {
    let mut keys: Vec<(String, u64, String)> = Vec::new();
    for row in &rows {
        let key = (row.mode.clone(), row.n, row.metric.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let mut out = rows.clone();
    for (mode, n, metric) in keys {
        let same: Vec<&Row> = rows
            .iter()
            .filter(|r| {
                r.mode == mode && r.n == n && r.metric == metric && r.rep.parse::<u32>().is_ok()
            })
            .collect();
        let Some(first) = same.first() else { continue };
        if same.len() < 2 {
            continue;
        }
        let values: Vec<f64> = same.iter().map(|r| r.value).collect();
        let ratios: Vec<f64> = same.iter().filter_map(|r| r.ratio).collect();
        out.push(Row {
            rep: "median".into(),
            value: median(&values).unwrap_or(f64::NAN),
            ratio: median(&ratios),
            ..(*first).clone()
        });
    }
    out
}

/// Adds, for every (mode, N, metric) of `modes` measured in numbered reps, `min` and
/// `max` rows: the smallest and largest value and per-rep ratio (the spread).
pub fn with_spread(rows: Vec<Row>, modes: &[&str]) -> Vec<Row> {
    let mut keys: Vec<(String, u64, String)> = Vec::new();
    for row in rows.iter().filter(|r| modes.contains(&r.mode.as_str())) {
        let key = (row.mode.clone(), row.n, row.metric.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let mut out = rows.clone();
    for (mode, n, metric) in keys {
        let same: Vec<&Row> = rows
            .iter()
            .filter(|r| {
                r.mode == mode && r.n == n && r.metric == metric && r.rep.parse::<u32>().is_ok()
            })
            .collect();
        let Some(first) = same.first() else { continue };
        let values: Vec<f64> = same.iter().map(|r| r.value).collect();
        let ratios: Vec<f64> = same.iter().filter_map(|r| r.ratio).collect();
        let (Some((lo, hi)), ratio) = (min_max(&values), min_max(&ratios)) else {
            continue;
        };
        for (rep, value, r) in [
            ("min", lo, ratio.map(|r| r.0)),
            ("max", hi, ratio.map(|r| r.1)),
        ] {
            out.push(Row {
                rep: rep.into(),
                value,
                ratio: r,
                ..(*first).clone()
            });
        }
    }
    out
}

/// The rows as an aligned text table.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>9} {:>6}  {:<40} {:>14} {:<5} {:>7}",
        "mode", "N", "rep", "metric", "value", "unit", "ratio"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<16} {:>9} {:>6}  {:<40} {:>14.1} {:<5} {:>7}",
            r.mode,
            r.n,
            r.rep,
            r.metric,
            r.value,
            r.unit,
            r.ratio.map(|x| format!("{x:.3}")).unwrap_or_default()
        );
    }
    out
}

pub fn csv_rows(rows: &[Row], env: &Environment) -> Vec<String> {
    rows.iter().map(|r| r.csv(env)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(rep: u32, value: f64, ratio: Option<f64>) -> Row {
        Row {
            bench: "bpf",
            mode: "map-batch".into(),
            n: 1000,
            rep: rep.to_string(),
            metric: "update_ns_per_elem".into(),
            value,
            unit: "ns",
            ratio,
        }
    }

    #[test]
    fn medians_follow_each_mode_n_and_metric() {
        let rows = with_medians(vec![
            row(0, 10.0, Some(0.5)),
            row(1, 30.0, Some(0.3)),
            row(2, 20.0, Some(0.4)),
        ]);
        assert_eq!(rows.len(), 4);
        let m = rows.last().unwrap();
        assert_eq!(
            (m.rep.as_str(), m.value, m.ratio),
            ("median", 20.0, Some(0.4))
        );
        // A single rep gets no median row.
        assert_eq!(with_medians(vec![row(0, 1.0, None)]).len(), 1);
    }

    #[test]
    fn csv_rows_have_the_common_columns() {
        let env = Environment {
            kernel: "6.18".into(),
            cpu: "x, y".into(),
            run: "t".into(),
        };
        let line = row(0, 12.5, Some(0.25)).csv(&env);
        assert_eq!(
            line,
            "bpf,map-batch,1000,0,update_ns_per_elem,12.5000,ns,0.2500,6.18,x; y,t"
        );
        assert_eq!(
            line.split(',').count(),
            super::super::results::CSV_HEADER.split(',').count()
        );
        assert!(row(0, 1.0, None).csv(&env).contains(",ns,,"));
    }
}
