// SPDX-License-Identifier: Apache-2.0
//! The CSV reader and section splicing every benchmark's docs share, and the ClusterIP
//! section of docs/benchmarks.md, generated from docs/bench/clusterip.csv
//! (columns `bench,mode,N,rep,metric,value,unit,ratio_to_baseline,kernel,cpu,run`): the
//! latest run in detail, every run in a history table. Only the text between the markers
//! is replaced; the rest of the page is written by hand.

use std::{collections::BTreeSet, fmt::Write as _, path::Path};

use anyhow::{Context as _, bail};

pub const BEGIN: &str = "<!-- BEGIN generated: clusterip -->";
pub const END: &str = "<!-- END generated: clusterip -->";
const MIN_RATE_RATIO: f64 = 0.95;
const MAX_P99_SCALING: f64 = 1.05;

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub bench: String,
    pub mode: String,
    pub n: u32,
    pub rep: String,
    pub metric: String,
    pub value: Option<f64>,
    /// Empty in CSVs written before the column was read.
    pub unit: String,
    pub ratio: Option<f64>,
    pub kernel: String,
    pub cpu: String,
    pub run: String,
}

/// Parses the CSV by its header, so added columns do not break old readers.
pub fn parse_csv(text: &str) -> anyhow::Result<Vec<Row>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines
        .next()
        .context("the CSV is empty")?
        .split(',')
        .collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .with_context(|| format!("the CSV has no {name} column"))
    };
    let idx = [
        col("bench")?,
        col("mode")?,
        col("N")?,
        col("rep")?,
        col("metric")?,
        col("value")?,
        col("ratio_to_baseline")?,
        col("kernel")?,
        col("cpu")?,
        col("run")?,
    ];
    let unit_col = header.iter().position(|h| *h == "unit");
    let mut rows = Vec::new();
    for (number, line) in lines.enumerate() {
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != header.len() {
            bail!(
                "CSV line {}: {} fields, expected {}",
                number + 2,
                fields.len(),
                header.len()
            );
        }
        let text = |i: usize| fields[idx[i]].to_string();
        let float = |i: usize| fields[idx[i]].parse::<f64>().ok();
        rows.push(Row {
            bench: text(0),
            mode: text(1),
            n: fields[idx[2]]
                .parse()
                .with_context(|| format!("CSV line {}: N", number + 2))?,
            rep: text(3),
            metric: text(4),
            value: float(5),
            unit: unit_col.map(|i| fields[i].to_string()).unwrap_or_default(),
            ratio: float(6),
            kernel: text(7),
            cpu: text(8),
            run: text(9),
        });
    }
    Ok(rows)
}

pub fn find<'a>(rows: &[&'a Row], mode: &str, n: u32, metric: &str) -> Option<&'a Row> {
    rows.iter()
        .copied()
        .find(|r| r.mode == mode && r.n == n && r.rep == "median" && r.metric == metric)
}

pub fn fmt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "–".to_string(), |v| format!("{v:.decimals$}"))
}

pub fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "–",
    }
}

/// One run's facts for the tables.
struct RunView<'a> {
    rows: Vec<&'a Row>,
    counts: Vec<u32>,
}

impl<'a> RunView<'a> {
    fn new(all: &'a [Row], run: &str) -> Self {
        let rows: Vec<&Row> = all
            .iter()
            .filter(|r| r.bench == "clusterip" && r.run == run)
            .collect();
        let counts: BTreeSet<u32> = rows.iter().map(|r| r.n).collect();
        RunView {
            rows,
            counts: counts.into_iter().collect(),
        }
    }

    fn rate_ratio(&self, n: u32) -> Option<f64> {
        find(&self.rows, "clusterip", n, "conn_rate").and_then(|r| r.ratio)
    }

    fn scaling(&self, metric: &str) -> Option<f64> {
        let top = *self.counts.last()?;
        find(&self.rows, "clusterip", top, metric).and_then(|r| r.value)
    }

    /// Connections made to fill the socket reverse-NAT map before measuring.
    fn fill(&self) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.metric == "sock_rev_nat_fill")
            .and_then(|r| r.value)
    }

    /// Median and largest CPU steal over the run's reps, in percent.
    fn steal(&self) -> Option<(f64, f64)> {
        let mut values: Vec<f64> = self
            .rows
            .iter()
            .filter(|r| r.metric == "cpu_steal" && r.rep != "median")
            .filter_map(|r| r.value)
            .collect();
        values.sort_by(f64::total_cmp);
        let mid = values.len() / 2;
        let median = match values.len() {
            0 => return None,
            n if n % 2 == 1 => values[mid],
            _ => (values[mid - 1] + values[mid]) / 2.0,
        };
        Some((median, values[values.len() - 1]))
    }

    fn reps(&self, n: u32) -> usize {
        self.rows
            .iter()
            .filter(|r| r.n == n && r.mode == "clusterip" && r.metric == "conn_rate")
            .filter(|r| r.rep != "median")
            .count()
    }
}

/// The generated section, markers included.
pub fn render_section(rows: &[Row], csv: &Path) -> anyhow::Result<String> {
    let mut runs: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r.bench == "clusterip") {
        if !runs.contains(&r.run.as_str()) {
            runs.push(&r.run);
        }
    }
    let latest = *runs.last().context("the CSV holds no clusterip run")?;
    let view = RunView::new(rows, latest);
    let first = view.rows[0];
    let (low, high) = match (view.counts.first(), view.counts.last()) {
        (Some(l), Some(h)) => (*l, *h),
        _ => bail!("the latest run has no service counts"),
    };
    let file = csv
        .file_name()
        .map_or("the CSV".into(), |f| f.to_string_lossy().into_owned());

    let mut out = String::new();
    let _ = writeln!(out, "{BEGIN}");
    let _ = writeln!(
        out,
        "<!-- Generated by `cargo xtask bench clusterip` from docs/bench/{file}; edits here are overwritten. -->\n"
    );
    let _ = writeln!(out, "### Latest run: {latest}\n");
    let _ = writeln!(
        out,
        "Kernel `{}`, CPU `{}`, {} reps per route and service count. Values are medians over\n\
         reps; route ratios are medians of each client run's ClusterIP value over its direct value.\n",
        first.kernel,
        first.cpu,
        view.reps(low)
    );
    match view.fill() {
        Some(made) => {
            let _ = writeln!(
                out,
                "The socket reverse-NAT map was filled first ({made:.0} ClusterIP connections), so every\n\
                 measurement ran with it full, as on a node in steady state.\n"
            );
        }
        None => out.push_str(
            "The socket reverse-NAT map was not filled first: the first measurements ran with it\n\
             emptier than later ones.\n\n",
        ),
    }
    if let Some((median, worst)) = view.steal() {
        let _ = writeln!(
            out,
            "CPU time taken by the hypervisor (steal) on the client's and server's CPUs during the\n\
             reps: median {median:.1} %, worst rep {worst:.1} %. Treat the ratios as noisy when steal is high.\n"
        );
    }
    out.push_str(
        "| services | route | conn/s | connect p50 (µs) | connect p99 (µs) | rate ratio | p50 ratio | p99 ratio |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for &n in &view.counts {
        for mode in ["direct", "clusterip"] {
            let get = |metric: &str| find(&view.rows, mode, n, metric);
            let ratio = |metric: &str| {
                if mode == "direct" {
                    String::new()
                } else {
                    fmt(get(metric).and_then(|r| r.ratio), 3)
                }
            };
            let _ = writeln!(
                out,
                "| {n} | {mode} | {} | {} | {} | {} | {} | {} |",
                fmt(get("conn_rate").and_then(|r| r.value), 0),
                fmt(get("connect_p50").and_then(|r| r.value), 1),
                fmt(get("connect_p99").and_then(|r| r.value), 1),
                ratio("conn_rate"),
                ratio("connect_p50"),
                ratio("connect_p99"),
            );
        }
    }
    out.push_str("\n| target (issue 3) | measured | holds |\n|---|---:|---|\n");
    for n in [low, high] {
        let ratio = view.rate_ratio(n);
        let _ = writeln!(
            out,
            "| rate(ClusterIP, N={n}) / rate(direct) ≥ {MIN_RATE_RATIO} | {} | {} |",
            fmt(ratio, 3),
            verdict(ratio.map(|r| r >= MIN_RATE_RATIO))
        );
        if low == high {
            break;
        }
    }
    if low != high {
        let p99 = view.scaling("connect_p99_scaling");
        let _ = writeln!(
            out,
            "| connect() p99(N={high}) / p99(N={low}) ≤ {MAX_P99_SCALING} | {} (drift-normalized {}) | {} |",
            fmt(p99, 3),
            fmt(view.scaling("connect_p99_scaling_normalized"), 3),
            verdict(p99.map(|r| r <= MAX_P99_SCALING))
        );
        let _ = writeln!(
            out,
            "| connect() p50(N={high}) / p50(N={low}) (no target) | {} | |",
            fmt(view.scaling("connect_p50_scaling"), 3)
        );
    }

    out.push_str(
        "\n### All runs\n\n\
         | run | kernel | CPU | services | rate ratio (fewest) | rate ratio (most) | p99 scaling | steal (median) |\n\
         |---|---|---|---|---:|---:|---:|---:|\n",
    );
    for run in runs.iter().rev() {
        let v = RunView::new(rows, run);
        let (Some(l), Some(h)) = (v.counts.first(), v.counts.last()) else {
            continue;
        };
        let _ = writeln!(
            out,
            "| {run} | {} | {} | {l}, {h} | {} | {} | {} | {} |",
            v.rows[0].kernel,
            v.rows[0].cpu,
            fmt(v.rate_ratio(*l), 3),
            fmt(v.rate_ratio(*h), 3),
            fmt(v.scaling("connect_p99_scaling"), 3),
            v.steal()
                .map_or("–".to_string(), |(m, _)| format!("{m:.1} %")),
        );
    }
    let _ = writeln!(out, "{END}");
    Ok(out)
}

/// `doc` with the text between the markers replaced by `section` (which carries the
/// markers); appended when the markers are missing.
#[cfg(test)]
pub fn splice(doc: &str, section: &str) -> String {
    splice_between(doc, BEGIN, END, section)
}

/// `doc` with the text between `begin` and `end` (markers included) replaced by
/// `section`; appended when the markers are missing.
pub fn splice_between(doc: &str, begin_marker: &str, end_marker: &str, section: &str) -> String {
    if let (Some(begin), Some(end)) = (doc.find(begin_marker), doc.find(end_marker))
        && begin < end
    {
        let after = &doc[end + end_marker.len()..];
        let after = after.strip_prefix('\n').unwrap_or(after);
        return format!("{}{section}{after}", &doc[..begin]);
    }
    let mut out = doc.to_string();
    if !out.is_empty() && !out.ends_with("\n\n") {
        out.push_str(if out.ends_with('\n') { "\n" } else { "\n\n" });
    }
    out.push_str(section);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "bench,mode,N,rep,metric,value,unit,ratio_to_baseline,kernel,cpu,run";

    fn run_rows(run: &str, rate_ratio_low: &str, p99_scaling: &str) -> String {
        let tail = format!("6.1.0,Xeon x2,{run}");
        let mut rows = Vec::new();
        for n in [1, 10000] {
            for rep in 0..2 {
                rows.push(format!(
                    "clusterip,direct,{n},{rep},conn_rate,1000.0,conn/s,1,{tail}"
                ));
                rows.push(format!(
                    "clusterip,clusterip,{n},{rep},conn_rate,980.0,conn/s,0.98,{tail}"
                ));
                let steal = 10 * (rep + 1);
                rows.push(format!(
                    "clusterip,direct,{n},{rep},cpu_steal,{steal}.0,%,,{tail}"
                ));
            }
            let ratio = if n == 1 { rate_ratio_low } else { "0.9000" };
            rows.push(format!(
                "clusterip,direct,{n},median,conn_rate,1000.0,conn/s,1,{tail}"
            ));
            rows.push(format!(
                "clusterip,clusterip,{n},median,conn_rate,980.0,conn/s,{ratio},{tail}"
            ));
            rows.push(format!(
                "clusterip,direct,{n},median,connect_p99,40.0,us,1,{tail}"
            ));
            rows.push(format!(
                "clusterip,clusterip,{n},median,connect_p99,41.0,us,1.025,{tail}"
            ));
        }
        rows.push(format!(
            "clusterip,clusterip,10000,median,connect_p99_scaling,{p99_scaling},x,,{tail}"
        ));
        if run.starts_with("2025-02") {
            rows.push(format!(
                "clusterip,clusterip,1,setup,sock_rev_nat_fill,144179.0000,connections,,{tail}"
            ));
        }
        rows.join("\n")
    }

    #[test]
    fn renders_the_latest_run_and_the_history() {
        let csv = format!(
            "{HEADER}\n{}\n{}\n",
            run_rows("2025-01-01T00:00:00Z", "0.9700", "1.0100"),
            run_rows("2025-02-01T00:00:00Z", "0.9600", "1.2000")
        );
        let rows = parse_csv(&csv).unwrap();
        assert_eq!(rows.len(), 2 * 21 + 1);
        let section = render_section(&rows, Path::new("/x/target/bench/clusterip.csv")).unwrap();
        assert!(section.starts_with(BEGIN) && section.trim_end().ends_with(END));
        assert!(section.contains("### Latest run: 2025-02-01T00:00:00Z"));
        assert!(section.contains("2 reps per route"));
        assert!(section.contains("filled first (144179 ClusterIP connections)"));
        assert!(
            section.contains("| 1 | clusterip | 980 | – | 41.0 | 0.960 | – | 1.025 |"),
            "{section}"
        );
        assert!(section.contains("| rate(ClusterIP, N=1) / rate(direct) ≥ 0.95 | 0.960 | yes |"));
        assert!(
            section.contains("| rate(ClusterIP, N=10000) / rate(direct) ≥ 0.95 | 0.900 | **no** |")
        );
        assert!(section.contains("p99(N=10000) / p99(N=1) ≤ 1.05 | 1.200"));
        // History: newest first, both runs.
        let feb = section.find("| 2025-02-01T00:00:00Z |").unwrap();
        let jan = section.find("| 2025-01-01T00:00:00Z |").unwrap();
        assert!(feb < jan);
        assert!(section.contains(
            "| 2025-01-01T00:00:00Z | 6.1.0 | Xeon x2 | 1, 10000 | 0.970 | 0.900 | 1.010 |"
        ));
    }

    #[test]
    fn bad_csv_is_refused() {
        assert!(parse_csv("").is_err());
        assert!(parse_csv("bench,mode\nclusterip,direct\n").is_err());
        assert!(parse_csv(&format!("{HEADER}\nclusterip,direct,1\n")).is_err());
        let empty = parse_csv(&format!("{HEADER}\n")).unwrap();
        assert!(render_section(&empty, Path::new("c.csv")).is_err());
    }

    #[test]
    fn splice_replaces_between_markers_or_appends() {
        let section = format!("{BEGIN}\nnew\n{END}\n");
        let doc = format!("# Title\n\nintro\n\n{BEGIN}\nold\n{END}\n\n## After\n");
        assert_eq!(
            splice(&doc, &section),
            format!("# Title\n\nintro\n\n{BEGIN}\nnew\n{END}\n\n## After\n")
        );
        assert_eq!(
            splice("# Title\n", &section),
            format!("# Title\n\n{section}")
        );
        assert_eq!(splice("", &section), section);
        // Splicing twice changes nothing more.
        let once = splice(&doc, &section);
        assert_eq!(splice(&once, &section), once);
    }
}
