// SPDX-License-Identifier: Apache-2.0
//! The sync-iptables section of docs/benchmarks.md, generated from
//! docs/bench/sync-iptables.csv: the latest run's medians and paired ratios per mode,
//! service count and step, the targets, and every run in a history table.

use std::{collections::BTreeSet, fmt::Write as _, path::Path};

use anyhow::Context as _;

use super::docs::{Row, fmt, verdict};

pub const BEGIN: &str = "<!-- BEGIN generated: sync -->";
pub const END: &str = "<!-- END generated: sync -->";
/// Issue 5's target: a sync costs at most this much of the raw restore's wall time.
const MAX_RATIO: f64 = 1.2;
const STEPS: [(&str, &str); 2] = [
    ("full_sync", "full sync (cold)"),
    ("partial_sync", "one-service change"),
];

fn runs_of(rows: &[Row]) -> Vec<&str> {
    let mut runs: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r.bench == "sync") {
        if !runs.contains(&r.run.as_str()) {
            runs.push(&r.run);
        }
    }
    runs
}

struct View<'a> {
    rows: Vec<&'a Row>,
}

impl<'a> View<'a> {
    fn new(all: &'a [Row], run: &str) -> Self {
        View {
            rows: all
                .iter()
                .filter(|r| r.bench == "sync" && r.run == run)
                .collect(),
        }
    }

    /// The measured modes (the baselines are named `raw-*`).
    fn modes(&self) -> Vec<&'a str> {
        let set: BTreeSet<&str> = self
            .rows
            .iter()
            .map(|r| r.mode.as_str())
            .filter(|m| !m.starts_with("raw-"))
            .collect();
        set.into_iter().collect()
    }

    fn counts(&self) -> Vec<u32> {
        let set: BTreeSet<u32> = self.rows.iter().map(|r| r.n).collect();
        set.into_iter().collect()
    }

    fn median(&self, mode: &str, n: u32, metric: &str) -> Option<&'a Row> {
        self.rows
            .iter()
            .copied()
            .find(|r| r.mode == mode && r.n == n && r.rep == "median" && r.metric == metric)
    }

    /// The baseline row beside `mode`'s: `raw-<mode>-restore` (the same iptables variant),
    /// or, in runs from before the variant was named, the run's only `raw-*`.
    fn baseline_of(&self, mode: &str, n: u32, metric: &str) -> Option<&'a Row> {
        let own = format!("raw-{mode}-restore");
        let same = |r: &&Row| r.mode == own && r.n == n && r.rep == "median" && r.metric == metric;
        if let Some(row) = self.rows.iter().copied().find(same) {
            return Some(row);
        }
        self.rows.iter().copied().find(|r| {
            r.mode.starts_with("raw-")
                && r.mode != mode
                && r.n == n
                && r.rep == "median"
                && r.metric == metric
        })
    }

    /// Per-sample ratios of `metric` (the range behind a median).
    fn ratio_range(&self, mode: &str, n: u32, metric: &str) -> Option<(f64, f64, usize)> {
        let ratios: Vec<f64> = self
            .rows
            .iter()
            .filter(|r| r.mode == mode && r.n == n && r.metric == metric)
            .filter(|r| r.rep != "median" && r.rep != "setup")
            .filter_map(|r| r.ratio)
            .collect();
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (!ratios.is_empty()).then_some((lo, hi, ratios.len()))
    }

    /// The fastest sample of each side, and their ratio: on a busy machine the wall time
    /// of a sample is its cost plus however long it waited for a CPU, and the fastest
    /// sample waited least.
    fn fastest(&self, mode: &str, n: u32, metric: &str) -> Option<(f64, f64, f64)> {
        let best = |side: &dyn Fn(&str) -> bool| {
            self.rows
                .iter()
                .filter(|r| side(&r.mode) && r.n == n && r.metric == metric)
                .filter(|r| r.rep != "median" && r.rep != "setup")
                .filter_map(|r| r.value)
                .fold(None, |acc: Option<f64>, v| {
                    Some(acc.map_or(v, |a| a.min(v)))
                })
        };
        let ours = best(&|m| m == mode)?;
        let raw = best(&|m| m.starts_with("raw-") && m != mode)?;
        (raw > 0.0).then(|| (ours, raw, ours / raw))
    }

    fn input_bytes(&self, mode: &str, n: u32, step: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| {
                r.mode == mode
                    && r.n == n
                    && r.rep == "setup"
                    && r.metric == format!("{step}_input")
            })
            .and_then(|r| r.value)
    }
}

/// The latest run that measured each (mode, service count) any run measured: a large count,
/// or another iptables variant, may be run on its own without hiding the others.
fn latest_per_mode_and_count<'a>(
    rows: &'a [Row],
    runs: &[&'a str],
) -> Vec<(&'a str, u32, &'a str)> {
    let keys: BTreeSet<(&str, u32)> = rows
        .iter()
        .filter(|r| r.bench == "sync" && r.rep == "median" && !r.mode.starts_with("raw-"))
        .map(|r| (r.mode.as_str(), r.n))
        .collect();
    keys.into_iter()
        .filter_map(|(mode, n)| {
            runs.iter()
                .rev()
                .find(|run| {
                    rows.iter().any(|r| {
                        r.bench == "sync"
                            && r.run == **run
                            && r.mode == mode
                            && r.n == n
                            && r.rep == "median"
                    })
                })
                .map(|run| (mode, n, *run))
        })
        .collect()
}

/// The generated section, markers included.
pub fn render_section(rows: &[Row], csv: &Path) -> anyhow::Result<String> {
    let runs = runs_of(rows);
    let latest = *runs.last().context("the CSV holds no sync run")?;
    let first = View::new(rows, latest).rows[0];
    let per_count = latest_per_mode_and_count(rows, &runs);
    let file = csv
        .file_name()
        .map_or("the CSV".into(), |f| f.to_string_lossy().into_owned());
    let mut out = String::new();
    let _ = writeln!(out, "{BEGIN}");
    let _ = writeln!(
        out,
        "<!-- Generated by `cargo xtask bench sync-iptables` from docs/bench/{file}; edits here are overwritten. -->\n"
    );
    let _ = writeln!(out, "### Latest results\n");
    let sources: Vec<String> = per_count
        .iter()
        .map(|(mode, n, run)| format!("{mode} N={n} from the run of {run}"))
        .collect();
    let _ = writeln!(
        out,
        "{}. Kernel `{}`, CPU `{}`. Values are medians; ratios are medians of each sample's own\n\
         ratio (the proxier and the raw restore of the same text, measured one right after the\n\
         other). CPU is the measuring thread's plus its child processes' (iptables-restore,\n\
         iptables-save, iptables).\n",
        sources.join("; "),
        first.kernel,
        first.cpu
    );
    out.push_str(
        "| mode | services | step | samples | sync (ms) | raw restore (ms) | wall ratio (range) | fastest sync / fastest raw (ms) | sync CPU (ms) | raw CPU (ms) | CPU ratio | restore input |\n\
         |---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut targets = Vec::new();
    for (mode, n, run) in &per_count {
        let (mode, n) = (*mode, *n);
        let view = View::new(rows, run);
        {
            for (step, label) in STEPS {
                let wall = format!("{step}_wall");
                let cpu = format!("{step}_cpu");
                let Some(ours) = view.median(mode, n, &wall) else {
                    continue;
                };
                let raw = view.baseline_of(mode, n, &wall);
                let range = view.ratio_range(mode, n, &wall);
                let ours_cpu = view.median(mode, n, &cpu);
                let raw_cpu = view.baseline_of(mode, n, &cpu);
                let _ = writeln!(
                    out,
                    "| {mode} | {n} | {label} | {} | {} | {} | {}{} | {} | {} | {} | {} | {} |",
                    range.map_or("–".into(), |(_, _, k)| k.to_string()),
                    fmt(ours.value, 1),
                    fmt(raw.and_then(|r| r.value), 1),
                    fmt(ours.ratio, 3),
                    range.map_or(String::new(), |(lo, hi, _)| format!(" ({lo:.2}–{hi:.2})")),
                    view.fastest(mode, n, &wall)
                        .map_or("–".into(), |(o, r, x)| format!(
                            "{o:.1} / {r:.1} = {x:.3}"
                        )),
                    fmt(ours_cpu.and_then(|r| r.value), 1),
                    fmt(raw_cpu.and_then(|r| r.value), 1),
                    fmt(ours_cpu.and_then(|r| r.ratio), 3),
                    view.input_bytes(mode, n, step)
                        .map_or("–".into(), |b| format!("{:.0} KiB", b / 1024.0)),
                );
                targets.push((mode, n, label, ours.ratio, ours_cpu.and_then(|r| r.ratio)));
            }
        }
    }
    let _ = writeln!(
        out,
        "\n| target (issue 5) | wall ratio | holds | CPU ratio | holds on CPU |\n|---|---:|---|---:|---|"
    );
    for (mode, n, label, ratio, cpu) in targets {
        let _ = writeln!(
            out,
            "| {mode} {label}, N={n}: ≤ {MAX_RATIO}× raw restore | {} | {} | {} | {} |",
            fmt(ratio, 3),
            verdict(ratio.map(|r| r <= MAX_RATIO)),
            fmt(cpu, 3),
            verdict(cpu.map(|r| r <= MAX_RATIO))
        );
    }
    out.push_str(
        "\n### All runs\n\n\
         | run | kernel | mode | services | full sync ratio | one-service change ratio |\n\
         |---|---|---|---|---:|---:|\n",
    );
    for run in runs.iter().rev() {
        let v = View::new(rows, run);
        for mode in v.modes() {
            for n in v.counts() {
                let full = v.median(mode, n, "full_sync_wall").and_then(|r| r.ratio);
                let partial = v.median(mode, n, "partial_sync_wall").and_then(|r| r.ratio);
                if full.is_none() && partial.is_none() {
                    continue;
                }
                let _ = writeln!(
                    out,
                    "| {run} | {} | {mode} | {n} | {} | {} |",
                    v.rows[0].kernel,
                    fmt(full, 3),
                    fmt(partial, 3)
                );
            }
        }
    }
    let _ = writeln!(out, "{END}");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::docs::parse_csv;

    const HEADER: &str = "bench,mode,N,rep,metric,value,unit,ratio_to_baseline,kernel,cpu,run";

    #[test]
    fn renders_medians_ratios_targets_and_history() {
        let run = "2025-03-01T00:00:00Z";
        let tail = format!("6.1.0,Xeon x2,{run}");
        let mut lines = vec![HEADER.to_string()];
        for (rep, ratio) in [("0", "1.1000"), ("1", "1.3000")] {
            lines.push(format!(
                "sync,iptables,1000,{rep},full_sync_wall,110.0,ms,{ratio},{tail}"
            ));
            lines.push(format!(
                "sync,raw-iptables-restore,1000,{rep},full_sync_wall,100.0,ms,1,{tail}"
            ));
        }
        for line in [
            "sync,iptables,1000,median,full_sync_wall,120.0,ms,1.2000",
            "sync,raw-iptables-restore,1000,median,full_sync_wall,100.0,ms,1",
            "sync,iptables,1000,median,full_sync_cpu,90.0,ms,1.0500",
            "sync,raw-iptables-restore,1000,median,full_sync_cpu,85.0,ms,1",
            "sync,iptables,1000,median,partial_sync_wall,30.0,ms,1.5000",
            "sync,raw-iptables-restore,1000,median,partial_sync_wall,20.0,ms,1",
            "sync,iptables,1000,setup,full_sync_input,204800.0,bytes,",
        ] {
            lines.push(format!("{line},{tail}"));
        }
        let rows = parse_csv(&lines.join("\n")).unwrap();
        let section = render_section(&rows, Path::new("/t/target/bench/sync.csv")).unwrap();
        assert!(section.starts_with(BEGIN) && section.trim_end().ends_with(END));
        assert!(section.contains(
            "### Latest results\n\niptables N=1000 from the run of 2025-03-01T00:00:00Z."
        ));
        assert!(
            section.contains(
                "| iptables | 1000 | full sync (cold) | 2 | 120.0 | 100.0 | 1.200 (1.10–1.30) | 110.0 / 100.0 = 1.100 | 90.0 | 85.0 | 1.050 | 200 KiB |"
            ),
            "{section}"
        );
        assert!(section.contains(
            "| iptables full sync (cold), N=1000: ≤ 1.2× raw restore | 1.200 | yes | 1.050 | yes |"
        ));
        assert!(section.contains(
            "| iptables one-service change, N=1000: ≤ 1.2× raw restore | 1.500 | **no** | – | – |"
        ));
        assert!(
            section.contains("| 2025-03-01T00:00:00Z | 6.1.0 | iptables | 1000 | 1.200 | 1.500 |")
        );
        assert!(render_section(&[], Path::new("s.csv")).is_err());
    }
}
