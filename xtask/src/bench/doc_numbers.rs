// SPDX-License-Identifier: Apache-2.0
//! A check that docs/benchmarks.md states no measurement that the committed CSVs do not
//! hold: every number with a unit of measurement in the hand-written text (outside the
//! generated `BEGIN`/`END` blocks, code and HTML comments) must be a value or ratio of a
//! row of docs/bench/*.csv, or a median over a group's reps, within the rounding of how it
//! is written — or be one of the few configuration values and limits allowed below.
//! A result quoted from a run whose rows were not committed, or a number left behind when
//! a new run changed the CSVs, fails the test.
//!
//! Numbers are matched by unit family (a time against the CSVs' times, converted; a
//! ratio against their ratios), and a section of a suite of its own only against that
//! suite's CSV. The report suites' ratios are many and dense, so a wrong ratio there can
//! still pass by coinciding with another one: the check catches a number with no backing
//! at all, not every misquotation. Numbers without a unit (counts, per-rep lists) are
//! not checked.

use std::path::{Path, PathBuf};

use super::{
    docs::{Row, parse_csv},
    stats::median,
};

/// A number with its unit, as written in the text.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantity {
    /// The text matched: "0.1–1.3 ms", "7,798 ms", "0.21×".
    pub text: String,
    /// Each number (one, or both ends of a range) with its decimals as written.
    pub numbers: Vec<(f64, usize)>,
    pub unit: &'static str,
    /// The line it is on (1-based).
    pub line: usize,
    /// The text around it, for the allow-list and the failure message.
    pub context: String,
    /// The `## ` section it is in ("" before the first).
    pub section: String,
}

/// Units that make a number a measurement, longest first (so "ms" is not read as "m").
const UNITS: [&str; 19] = [
    "connections/s",
    "packets/s",
    "conn/s",
    "pkt/s",
    "MB/s",
    "GiB",
    "MiB",
    "KiB",
    "µs",
    "us",
    "ns",
    "ms",
    "KB",
    "MB",
    "GB",
    "%",
    "×",
    "x",
    "s",
];

/// Numbers in the hand-written text that are not measurements, each with the words
/// around it that identify it (matched within its line's neighbourhood) and why it is
/// allowed. Limits written with ≤ ≥ < > need no entry.
const ALLOWED: [(&str, &str, &str); 11] = [
    // Configuration of the suites: durations, rates and sizes chosen, not measured.
    (
        "60 s",
        "for 60 s, 100 new Services",
        "the latency suite's duration",
    ),
    (
        "1 ms",
        "1 ms (nothing to batch",
        "the ebpf side's minSyncPeriod",
    ),
    ("1 s", "upstream's default 1 s", "a configuration value"),
    (
        "30 s",
        "stops moving for 30 s",
        "how long the suites wait on a service count the agent cannot hold",
    ),
    (
        "100 ms",
        "100 ms slices",
        "the slice length of the ABBA alternation",
    ),
    (
        "3 s",
        "3 s of",
        "the ClusterIP suite's measured time per route",
    ),
    ("0.5 s", "warm-up of 0.5 s", "the ClusterIP suite's warm-up"),
    ("0.1 %", "more than 0.1 %", "the loss that stops a run"),
    ("2 s", "for 2 s each", "the NodePort suite's time per route"),
    ("0.3 s", "0.3 s warm-up", "the NodePort suite's warm-up"),
    (
        "20 ms",
        "for 20 ms counts as lost",
        "the NodePort suite's loss timeout",
    ),
];

/// The hand-written text of the page: generated blocks, fenced code, inline code and
/// HTML comments blanked out (lines kept, so line numbers stay right).
pub fn hand_written(doc: &str) -> String {
    let mut out = String::with_capacity(doc.len());
    let mut in_generated = false;
    let mut in_fence = false;
    for line in doc.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("<!-- BEGIN generated") {
            in_generated = true;
        }
        let fence = trimmed.starts_with("```");
        let skip = in_generated || in_fence || fence;
        if trimmed.starts_with("<!-- END generated") {
            in_generated = false;
        }
        if fence {
            in_fence = !in_fence;
        }
        if !skip {
            out.push_str(&blank_code_and_comments(line));
        }
        out.push('\n');
    }
    out
}

/// `line` without its inline code spans and HTML comments (a comment or span left open
/// at the end of the line runs to its end).
fn blank_code_and_comments(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    loop {
        let code = rest.find('`');
        let comment = rest.find("<!--");
        match (code, comment) {
            (Some(c), m) if m.is_none_or(|m| c < m) => {
                out.push_str(&rest[..c]);
                out.push(' ');
                let after = &rest[c + 1..];
                rest = after.find('`').map_or("", |e| &after[e + 1..]);
            }
            (_, Some(m)) => {
                out.push_str(&rest[..m]);
                out.push(' ');
                let after = &rest[m + 4..];
                rest = after.find("-->").map_or("", |e| &after[e + 3..]);
            }
            _ => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

/// A number at the start of `text`: digits with optional thousands commas and a decimal
/// part. Returns the value, its decimals and its length in bytes.
fn number_at(text: &str) -> Option<(f64, usize, usize)> {
    let bytes = text.as_bytes();
    let mut end = 0;
    let mut digits = String::new();
    while end < bytes.len() {
        let b = bytes[end];
        if b.is_ascii_digit() {
            digits.push(char::from(b));
            end += 1;
        } else if b == b','
            && !digits.is_empty()
            && !digits.contains('.')
            && bytes.len() >= end + 4
            && bytes[end + 1..end + 4].iter().all(u8::is_ascii_digit)
            && bytes.get(end + 4).is_none_or(|b| !b.is_ascii_digit())
        {
            // A thousands separator (1,946), not a list (1, 2) or a long tail.
            end += 1;
        } else if b == b'.'
            && !digits.is_empty()
            && !digits.contains('.')
            && bytes.get(end + 1).is_some_and(u8::is_ascii_digit)
        {
            digits.push('.');
            end += 1;
        } else {
            break;
        }
    }
    if digits.is_empty() {
        return None;
    }
    let decimals = digits.split_once('.').map_or(0, |(_, d)| d.len());
    Some((digits.parse().ok()?, decimals, end))
}

/// The unit right after a number (after at most one space), and the length consumed.
fn unit_at(text: &str) -> Option<(&'static str, usize)> {
    let (space, rest) = match text
        .strip_prefix(' ')
        .or_else(|| text.strip_prefix('\u{a0}'))
    {
        Some(rest) => (text.len() - rest.len(), rest),
        None => (0, text),
    };
    let unit = UNITS.iter().find(|u| rest.starts_with(**u))?;
    let after = &rest[unit.len()..];
    let next = after.chars().next();
    // "ms" of "msec" or "s" of "services" is not a unit; "%" and "×" end themselves.
    let word_unit = unit.chars().all(|c| c.is_alphanumeric() || c == '/');
    if word_unit && next.is_some_and(char::is_alphanumeric) {
        return None;
    }
    // "10,000 × 4" multiplies; "0.21× the" is a ratio.
    if *unit == "×" && after.trim_start().starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    // "x" only written onto the number: "1.05x", not "4 x 2".
    if *unit == "x" && space > 0 {
        return None;
    }
    Some((unit, space + unit.len()))
}

/// Every number with a unit in `text` (already reduced to its hand-written part), except
/// limits (after ≤ ≥ < >).
pub fn quantities(text: &str) -> Vec<Quantity> {
    let mut found = Vec::new();
    let mut section = "";
    for (index, line) in text.lines().enumerate() {
        if let Some(heading) = line.strip_prefix("## ") {
            section = heading.trim();
        }
        let mut at = 0;
        while at < line.len() {
            let rest = &line[at..];
            let before = line[..at].chars().next_back();
            let starts_number = rest.starts_with(|c: char| c.is_ascii_digit())
                && !before.is_some_and(|c| c.is_alphanumeric() || c == '.' || c == ',');
            if !starts_number {
                at += rest.chars().next().map_or(1, char::len_utf8);
                continue;
            }
            let Some((first, decimals, len)) = number_at(rest) else {
                at += 1;
                continue;
            };
            let mut numbers = vec![(first, decimals)];
            let mut end = len;
            // A range: "0.1–1.3 ms", "5–15 %".
            if let Some(dash) = ['–', '-'].iter().find(|d| rest[end..].starts_with(**d))
                && let Some((second, decimals, len)) = number_at(&rest[end + dash.len_utf8()..])
            {
                numbers.push((second, decimals));
                end += dash.len_utf8() + len;
            }
            let Some((unit, unit_len)) = unit_at(&rest[end..]) else {
                at += end;
                continue;
            };
            let limit = line[..at].trim_end().ends_with(['≤', '≥', '<', '>', '±']);
            if !limit {
                found.push(Quantity {
                    text: rest[..end + unit_len].to_string(),
                    numbers,
                    unit,
                    line: index + 1,
                    context: line.to_string(),
                    section: section.to_string(),
                });
            }
            at += end + unit_len;
        }
    }
    found
}

/// The allow-list entry that covers `q`, if any: the same text, with the entry's words
/// on the same line or the lines around it (a sentence may wrap).
fn allowed_by(q: &Quantity, neighbourhood: &str) -> Option<usize> {
    ALLOWED
        .iter()
        .position(|(text, words, _why)| q.text == *text && neighbourhood.contains(words))
}

/// Each quantity of the hand-written text with the lines around it.
fn with_neighbourhoods(doc: &str) -> Vec<(Quantity, String)> {
    let text = hand_written(doc);
    let lines: Vec<&str> = text.lines().collect();
    quantities(&text)
        .into_iter()
        .map(|q| {
            let from = q.line.saturating_sub(2);
            let to = (q.line + 1).min(lines.len());
            let neighbourhood = lines[from..to].join(" ");
            (q, neighbourhood)
        })
        .collect()
}

/// Allow-list entries that no quantity of `doc` uses any more (an entry outliving its
/// sentence would let a later measurement with the same text through).
pub fn unused_allowances(doc: &str) -> Vec<&'static str> {
    let used: Vec<usize> = with_neighbourhoods(doc)
        .iter()
        .filter_map(|(q, around)| allowed_by(q, around))
        .collect();
    ALLOWED
        .iter()
        .enumerate()
        .filter(|(i, _)| !used.contains(i))
        .map(|(_, (_, words, _))| *words)
        .collect()
}

/// The quantities the CSVs hold, by unit: every row's value (in its unit) and ratio, and
/// each group's median over its reps (what the tables show when no median row exists).
pub struct Measured {
    values: Vec<(String, f64)>,
    ratios: Vec<f64>,
}

impl Measured {
    pub fn from_rows(rows: &[Row]) -> Self {
        let mut values: Vec<(String, f64)> = Vec::new();
        let mut ratios: Vec<f64> = Vec::new();
        for r in rows {
            if let Some(v) = r.value {
                values.push((r.unit.clone(), v));
            }
            ratios.extend(r.ratio);
        }
        let mut groups: Vec<(&Row, Vec<f64>, Vec<f64>)> = Vec::new();
        for r in rows.iter().filter(|r| r.rep.parse::<u32>().is_ok()) {
            let same = |g: &&mut (&Row, Vec<f64>, Vec<f64>)| {
                g.0.bench == r.bench && g.0.mode == r.mode && g.0.n == r.n && g.0.metric == r.metric
            };
            match groups.iter_mut().find(same) {
                Some(group) => {
                    group.1.extend(r.value);
                    group.2.extend(r.ratio);
                }
                None => groups.push((
                    r,
                    r.value.into_iter().collect(),
                    r.ratio.into_iter().collect(),
                )),
            }
        }
        for (first, mut group_values, mut group_ratios) in groups {
            if let Some(m) = median(&mut group_values) {
                values.push((first.unit.clone(), m));
            }
            ratios.extend(median(&mut group_ratios));
        }
        Measured { values, ratios }
    }

    /// Whether `x`, written with `decimals` decimals in `unit`, is one of the measured
    /// quantities rounded as written.
    pub fn holds(&self, x: f64, decimals: usize, unit: &str) -> bool {
        let tolerance = 0.5 * 10f64.powi(-i32::try_from(decimals).unwrap_or(9)) + 1e-9;
        let near = |q: f64| (q - x).abs() <= tolerance;
        let value_in = |csv_unit: &str, per: f64| {
            self.values
                .iter()
                .any(|(u, v)| u == csv_unit && near(v / per))
        };
        match unit {
            "ms" => value_in("ms", 1.0),
            "s" => value_in("ms", 1000.0) || value_in("s", 1.0),
            "µs" | "us" => value_in("us", 1.0),
            "ns" => value_in("ns", 1.0),
            "MiB" => value_in("MiB", 1.0),
            "GiB" => value_in("MiB", 1024.0),
            "KiB" | "KB" => value_in("KiB", 1.0) || value_in("MiB", 1.0 / 1024.0),
            "MB" | "MB/s" => value_in("MB/s", 1.0),
            "conn/s" | "connections/s" => value_in("conn/s", 1.0),
            "pkt/s" | "packets/s" => value_in("pkt/s", 1.0),
            "×" | "x" => self.ratios.iter().any(|r| near(*r)) || value_in("x", 1.0),
            // A percentage: of a value in %, or a ratio's distance from 1 ("+5%", "8% below").
            "%" => {
                value_in("%", 1.0)
                    || self
                        .ratios
                        .iter()
                        .any(|r| near((r - 1.0).abs() * 100.0) || near(r * 100.0))
            }
            _ => false,
        }
    }
}

/// The published CSVs a `## ` section's numbers may come from: a suite with a section of
/// its own only from its CSV (so that a result of a run that was never published cannot
/// pass on another suite's coincidentally equal number); the rest of the page, the
/// report's, from the report suites' CSVs.
pub fn csvs_of_section(heading: &str) -> &'static [&'static str] {
    if heading.starts_with("ClusterIP") {
        &["clusterip"]
    } else if heading.starts_with("NodePort") {
        &["nodeport"]
    } else if heading.starts_with("Sync-iptables") {
        &["sync-iptables"]
    } else {
        &super::report::SUITES
    }
}

/// The hand-written quantities of `doc` that neither the CSVs of their section hold nor
/// the allow-list covers, as "line N: text (in: context)".
pub fn unbacked(doc: &str, measured_in: &dyn Fn(&str) -> Measured) -> Vec<String> {
    with_neighbourhoods(doc)
        .into_iter()
        .filter(|(q, around)| allowed_by(q, around).is_none())
        .map(|(q, _)| q)
        .filter(|q| {
            let measured = measured_in(&q.section);
            !q.numbers
                .iter()
                .all(|(x, decimals)| measured.holds(*x, *decimals, q.unit))
        })
        .map(|q| format!("line {}: {} (in: {})", q.line, q.text, q.context.trim()))
        .collect()
}

fn workspace_docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("docs"), |root| root.join("docs"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "bench,mode,N,rep,metric,value,unit,ratio_to_baseline,kernel,cpu,run";

    fn measured(lines: &[&str]) -> Measured {
        let rows = parse_csv(&format!("{HEADER}\n{}\n", lines.join("\n"))).unwrap();
        Measured::from_rows(&rows)
    }

    #[test]
    fn finds_numbers_with_units_and_skips_limits_code_and_generated_text() {
        let doc = "Sync took 7,798 ms, 0.1–1.3 ms per change, 0.21× the raw restore.\n\
                   Target ≤ 150 MiB; N = 10,000 × 4; `--seconds 2 s`; 12 services.\n\
                   <!-- BEGIN generated: x -->\n563 MiB\n<!-- END generated: x -->\n\
                   ```sh\nsleep 5 s\n```\n\
                   v6.18 and 1.05x direct, +5% and 46 ms.";
        let found: Vec<String> = quantities(&hand_written(doc))
            .into_iter()
            .map(|q| format!("{}:{}", q.line, q.text))
            .collect();
        assert_eq!(
            found,
            [
                "1:7,798 ms",
                "1:0.1–1.3 ms",
                "1:0.21×",
                "9:1.05x",
                "9:5%",
                "9:46 ms"
            ]
        );
        let q = &quantities("about 0.1–1.3 ms")[0];
        assert_eq!(q.numbers, vec![(0.1, 1), (1.3, 1)]);
    }

    #[test]
    fn a_number_is_backed_by_a_value_ratio_or_median_within_its_rounding() {
        let m = measured(&[
            "sync,nftables,50000,0,full_sync_wall,7798.2,ms,,k,c,r",
            "sync,ebpf,10000,0,full_sync_wall,500,ms,0.2071,k,c,r",
            "sync,ebpf,10000,1,full_sync_wall,520,ms,0.2140,k,c,r",
            "sync,ebpf,10000,2,full_sync_wall,560,ms,0.2490,k,c,r",
            "memory,ebpf,50000,0,agent_rss,563.4,MiB,,k,c,r",
        ]);
        assert!(m.holds(7798.0, 0, "ms"));
        assert!(m.holds(7.8, 1, "s"));
        assert!(!m.holds(7.7, 1, "s"));
        assert!(m.holds(0.21, 2, "×"));
        // The median of the reps' values (520) and ratios (0.214).
        assert!(m.holds(520.0, 0, "ms"));
        assert!(m.holds(0.214, 3, "x"));
        assert!(m.holds(563.0, 0, "MiB"));
        assert!(!m.holds(563.0, 0, "ms"));
        assert!(!m.holds(100.0, 0, "MiB"));
        // 0.2071 is 79 % below 1.
        assert!(m.holds(79.0, 0, "%"));
        assert!(!m.holds(12.0, 0, "%"));
    }

    #[test]
    fn an_unbacked_number_is_reported_unless_allowed() {
        let m = measured(&["sync,ebpf,1000,0,add_service_wall,0.124,ms,,k,c,r"]);
        let doc =
            "It took 0.12 ms, then 165 ms.\nThe prober ran for 60 s, 100 new Services a second.\n";
        let all = |_: &str| measured(&["sync,ebpf,1000,0,add_service_wall,0.124,ms,,k,c,r"]);
        assert_eq!(
            unbacked(doc, &all),
            ["line 1: 165 ms (in: It took 0.12 ms, then 165 ms.)"]
        );
        // A section whose suite published nothing backs no number.
        let doc = "## Sync\n\n0.12 ms\n\n## ClusterIP: x\n\n0.12 ms\n";
        let scoped = |section: &str| {
            if csvs_of_section(section).contains(&"sync") {
                measured(&["sync,ebpf,1000,0,add_service_wall,0.124,ms,,k,c,r"])
            } else {
                measured(&[])
            }
        };
        assert_eq!(unbacked(doc, &scoped), ["line 7: 0.12 ms (in: 0.12 ms)"]);
        drop(m);
    }

    /// The page itself: every measured-looking number outside the generated blocks is in
    /// a committed CSV (docs/bench/*.csv) or on the allow-list.
    /// Every quantity the page's hand-written text states, for reading them over
    /// (`cargo test -p xtask list_page_quantities -- --ignored --nocapture`).
    #[test]
    #[ignore = "a listing, not a check"]
    fn list_page_quantities() {
        let doc = std::fs::read_to_string(workspace_docs().join("benchmarks.md")).unwrap();
        for q in quantities(&hand_written(&doc)) {
            println!("{}: {} [{}]", q.line, q.text, q.section);
        }
    }

    #[test]
    fn benchmarks_page_states_only_numbers_the_committed_csvs_hold() {
        let docs = workspace_docs();
        let doc = std::fs::read_to_string(docs.join("benchmarks.md")).unwrap();
        let mut published: Vec<(String, Vec<Row>)> = Vec::new();
        for entry in std::fs::read_dir(docs.join("bench")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "csv") {
                let text = std::fs::read_to_string(&path).unwrap();
                let rows = parse_csv(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let suite = path.file_stem().unwrap().to_string_lossy().into_owned();
                published.push((suite, rows));
            }
        }
        let measured_in = |section: &str| {
            let suites = csvs_of_section(section);
            let rows: Vec<Row> = published
                .iter()
                .filter(|(suite, _)| suites.contains(&suite.as_str()))
                .flat_map(|(_, rows)| rows.iter().cloned())
                .collect();
            Measured::from_rows(&rows)
        };
        let problems = unbacked(&doc, &measured_in);
        assert!(
            problems.is_empty(),
            "docs/benchmarks.md states numbers no committed CSV holds (move them into \
             generated text, drop them, or allow-list a configuration value):\n{}",
            problems.join("\n")
        );
        let unused = unused_allowances(&doc);
        assert!(
            unused.is_empty(),
            "allow-list entries no sentence of docs/benchmarks.md uses any more: {unused:?}"
        );
    }
}
