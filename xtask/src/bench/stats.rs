// SPDX-License-Identifier: Apache-2.0
//! The latest run of each suite as rows, and a (mode, N, metric)'s value and ratio in
//! them: what the report and the targets both read.

use super::docs::Row;

/// The rows of one suite's latest run.
#[derive(Debug, Clone, Default)]
pub struct SuiteRows {
    pub suite: &'static str,
    pub rows: Vec<Row>,
}

/// The median of `values` (sorted in place; the mean of the middle two for an even count).
pub fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// A (mode, N, metric)'s value and ratio: the suite's own `median` row when it wrote one,
/// else the medians over its reps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    pub value: Option<f64>,
    pub ratio: Option<f64>,
}

pub fn stat(rows: &[Row], mode: &str, n: u32, metric: &str) -> Option<Stat> {
    let of: Vec<&Row> = rows
        .iter()
        .filter(|r| r.mode == mode && r.n == n && r.metric == metric)
        .collect();
    if let Some(m) = of.iter().find(|r| r.rep == "median") {
        return Some(Stat {
            value: m.value,
            ratio: m.ratio,
        });
    }
    let reps: Vec<&&Row> = of.iter().filter(|r| r.rep.parse::<u32>().is_ok()).collect();
    if reps.is_empty() {
        return None;
    }
    let mut values: Vec<f64> = reps.iter().filter_map(|r| r.value).collect();
    let mut ratios: Vec<f64> = reps.iter().filter_map(|r| r.ratio).collect();
    Some(Stat {
        value: median(&mut values),
        ratio: median(&mut ratios),
    })
}

pub fn value(rows: &[Row], mode: &str, n: u32, metric: &str) -> Option<f64> {
    stat(rows, mode, n, metric).and_then(|s| s.value)
}

pub fn ratio(rows: &[Row], mode: &str, n: u32, metric: &str) -> Option<f64> {
    stat(rows, mode, n, metric).and_then(|s| s.ratio)
}

/// The per-rep values of a (mode, N, metric), keyed by rep number (the suite's summary
/// rows — `median`, `min`, `max` — and `setup` rows left out, and reps the suite rejected:
/// a `rejected` row of 1 for the same mode, N and rep, as the dataplane suite writes for
/// reps with too much steal or load): what a spread is computed from.
pub fn rep_values(rows: &[Row], mode: &str, n: u32, metric: &str) -> Vec<(u32, f64)> {
    per_rep(rows, mode, n, metric, |r| r.value)
}

/// The per-rep ratios to the baseline of a (mode, N, metric), keyed by rep number.
pub fn rep_ratios(rows: &[Row], mode: &str, n: u32, metric: &str) -> Vec<(u32, f64)> {
    per_rep(rows, mode, n, metric, |r| r.ratio)
}

fn per_rep(
    rows: &[Row],
    mode: &str,
    n: u32,
    metric: &str,
    pick: impl Fn(&Row) -> Option<f64>,
) -> Vec<(u32, f64)> {
    let rejected = |rep: &str| {
        rows.iter().any(|r| {
            r.mode == mode
                && r.n == n
                && r.rep == rep
                && r.metric == "rejected"
                && r.value == Some(1.0)
        })
    };
    rows.iter()
        .filter(|r| r.mode == mode && r.n == n && r.metric == metric)
        .filter(|r| metric == "rejected" || !rejected(&r.rep))
        .filter_map(|r| Some((r.rep.parse::<u32>().ok()?, pick(r)?)))
        .filter(|(_, v)| v.is_finite())
        .collect()
}

/// The spread of a (mode, N, metric)'s per-rep values: the suite's `min` and `max` rows
/// when it wrote both (the dataplane and bpf suites: over the reps they accepted), else
/// over its numbered reps ([`rep_values`]).
pub fn value_spread(rows: &[Row], mode: &str, n: u32, metric: &str) -> Option<Spread> {
    summary_spread(rows, mode, n, metric, |r| r.value)
}

/// The spread of a (mode, N, metric)'s per-rep ratios to the baseline, as
/// [`value_spread`].
pub fn ratio_spread(rows: &[Row], mode: &str, n: u32, metric: &str) -> Option<Spread> {
    summary_spread(rows, mode, n, metric, |r| r.ratio)
}

fn summary_spread(
    rows: &[Row],
    mode: &str,
    n: u32,
    metric: &str,
    pick: impl Fn(&Row) -> Option<f64>,
) -> Option<Spread> {
    let reps = per_rep(rows, mode, n, metric, &pick);
    let of = |rep: &str| {
        rows.iter()
            .find(|r| r.mode == mode && r.n == n && r.metric == metric && r.rep == rep)
            .and_then(&pick)
            .filter(|v| v.is_finite())
    };
    match (of("min"), of("max")) {
        (Some(min), Some(max)) => Some(Spread {
            min,
            max,
            reps: reps.len(),
        }),
        _ => spread(reps.into_iter().map(|(_, v)| v)),
    }
}

/// `numerator / denominator` of each rep both measured (same rep number: measured in
/// the same pass, next to each other in time).
pub fn paired_ratios(numerator: &[(u32, f64)], denominator: &[(u32, f64)]) -> Vec<f64> {
    numerator
        .iter()
        .filter_map(|(rep, top)| {
            let (_, bottom) = denominator.iter().find(|(r, _)| r == rep)?;
            (*bottom > 0.0).then(|| top / bottom)
        })
        .collect()
}

/// The range of per-rep values behind a median.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub min: f64,
    pub max: f64,
    /// How many reps (0: a suite's `min` and `max` rows without its numbered reps).
    pub reps: usize,
}

pub fn spread(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
    values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(None, |acc: Option<Spread>, v| {
            Some(match acc {
                None => Spread {
                    min: v,
                    max: v,
                    reps: 1,
                },
                Some(s) => Spread {
                    min: s.min.min(v),
                    max: s.max.max(v),
                    reps: s.reps + 1,
                },
            })
        })
}

/// The rows of `rows` whose bench column is `bench`: a suite's own measurements without
/// the rows it writes for another report section (the memory suite's `scale` rows).
pub fn bench_rows(rows: &[Row], bench: &str) -> Vec<Row> {
    rows.iter().filter(|r| r.bench == bench).cloned().collect()
}

/// The rows of `suite` in `all` (none when it did not run).
pub fn rows_of<'a>(all: &'a [SuiteRows], suite: &str) -> &'a [Row] {
    all.iter()
        .find(|s| s.suite == suite)
        .map_or(&[], |s| s.rows.as_slice())
}
