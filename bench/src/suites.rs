// SPDX-License-Identifier: Apache-2.0
//! The report's suites run one after the other (`loadgen bench-report-suites`, which
//! `cargo xtask bench` launches): each suite runs as its own `loadgen bench-<suite>`
//! process appending to `<csv-dir>/<suite>.csv` (or `<suite>-quick.csv`); unless quick,
//! what this run appended is then published as `<publish>/<suite>.csv`, from which
//! `cargo xtask bench` regenerates the report (docs/benchmarks.md and the plots). A run
//! given options of its own (`cargo xtask bench sync -- --sides nftables,kube-proxy-nft`:
//! a slice of the suite) replaces only the rows of the modes and service counts it
//! measured in the published file and keeps the others ([`merged`]); a run without
//! options replaces the whole file.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

/// The report's suites, in the order a full run takes them (the report in xtask reads
/// the same names from docs/bench).
pub const REPORT_SUITES: [&str; 5] = ["dataplane", "sync", "latency", "bpf", "memory"];

/// What runs the suites.
#[derive(Debug, Clone)]
pub struct SuitesOptions {
    /// The suites to run, in this order (all of [`REPORT_SUITES`] when empty).
    pub suites: Vec<String>,
    pub quick: bool,
    /// Where each suite appends its rows (target/bench).
    pub csv_dir: PathBuf,
    /// Where this run's rows are published (docs/bench); never for quick runs.
    pub publish: Option<PathBuf>,
    /// Options passed on to every suite (`cargo xtask bench <suite> -- <options>`).
    pub extra: Vec<String>,
}

/// `<dir>/<suite>.csv`, or `<suite>-quick.csv`.
pub fn csv_path(dir: &Path, suite: &str, quick: bool) -> PathBuf {
    let name = if quick {
        format!("{suite}-quick.csv")
    } else {
        format!("{suite}.csv")
    };
    dir.join(name)
}

/// The load generator's subcommand of a report suite.
pub fn suite_command(suite: &str) -> anyhow::Result<String> {
    if !REPORT_SUITES.contains(&suite) {
        bail!(
            "{suite:?} is not one of the report's suites ({})",
            REPORT_SUITES.join(", ")
        );
    }
    Ok(match suite {
        "sync" => "bench-sync-modes".into(),
        other => format!("bench-{other}"),
    })
}

/// The options a suite gets in a full run of the whole report when none are given:
/// upstream's default minSyncPeriod (iptables mode) beside ebpf's, for scale.
fn default_extra(suite: &str, quick: bool) -> Vec<String> {
    match (suite, quick) {
        ("latency", false) => ["--mode", "ebpf", "--mode", "iptables-legacy"]
            .map(String::from)
            .to_vec(),
        _ => Vec::new(),
    }
}

/// What a run appended to a CSV (`before` → `after`), with the header: a new file is
/// all new; an existing one keeps its header and earlier runs' lines at the top.
pub fn appended(before: &str, after: &str) -> String {
    let header = after.lines().next().unwrap_or_default();
    let new = after.strip_prefix(before).unwrap_or(after);
    let mut out = format!("{header}\n");
    for line in new.lines().filter(|l| !l.trim().is_empty() && *l != header) {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The published rows of `published` with those of `run` in place of the rows of every
/// (suite, mode, service count) `run` measured: the file a slice of a suite publishes.
/// Rows are CSV lines whose first three fields are the suite, the mode and the count; the
/// header is `run`'s (or `published`'s when `run` has no rows).
pub fn merged(published: &str, run: &str) -> String {
    let key = |line: &str| -> Option<String> {
        let mut fields = line.splitn(4, ',');
        Some(format!(
            "{},{},{}",
            fields.next()?,
            fields.next()?,
            fields.next()?
        ))
    };
    let rows = |text: &str| -> (Option<String>, Vec<String>) {
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let header = lines.next().map(str::to_string);
        (header, lines.map(str::to_string).collect())
    };
    let (old_header, old) = rows(published);
    let (new_header, new) = rows(run);
    let measured: std::collections::HashSet<String> =
        new.iter().filter_map(|line| key(line)).collect();
    let mut out = String::new();
    if let Some(header) = new_header.or(old_header) {
        out.push_str(&header);
        out.push('\n');
    }
    for line in old
        .iter()
        .filter(|line| key(line).is_none_or(|k| !measured.contains(&k)))
        .chain(&new)
    {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Runs the suites with `loadgen` (this binary), then publishes this run's rows.
/// Returns the exit code of a suite that failed or was interrupted (130), if one did.
pub fn run_suites(loadgen: &Path, opts: &SuitesOptions) -> anyhow::Result<Option<i32>> {
    let all = opts.suites.is_empty();
    let suites: Vec<String> = if all {
        REPORT_SUITES.iter().map(ToString::to_string).collect()
    } else {
        opts.suites.clone()
    };
    fs::create_dir_all(&opts.csv_dir)
        .with_context(|| format!("creating {}", opts.csv_dir.display()))?;
    let started = Instant::now();
    let mut published = Vec::new();
    for name in &suites {
        let before_suite = Instant::now();
        let csv = csv_path(&opts.csv_dir, name, opts.quick);
        let before = fs::read_to_string(&csv).unwrap_or_default();
        println!(
            "==> running the {name} suite{}",
            if opts.quick { " (quick)" } else { "" }
        );
        let mut cmd = Command::new(loadgen);
        cmd.arg(suite_command(name)?).arg("--csv").arg(&csv);
        if opts.quick {
            cmd.arg("--quick");
        }
        if all && opts.extra.is_empty() {
            cmd.args(default_extra(name, opts.quick));
        } else {
            cmd.args(&opts.extra);
        }
        let exit = cmd
            .status()
            .with_context(|| format!("starting {}", loadgen.display()))?;
        if !exit.success() {
            return Ok(Some(exit.code().unwrap_or(1)));
        }
        let after =
            fs::read_to_string(&csv).with_context(|| format!("reading {}", csv.display()))?;
        published.push((name, appended(&before, &after)));
        if all {
            println!(
                "    {name}: {:.0} s (all so far: {:.1} min)",
                before_suite.elapsed().as_secs_f64(),
                started.elapsed().as_secs_f64() / 60.0
            );
        }
    }
    if let (Some(dir), false) = (&opts.publish, opts.quick) {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, text) in published {
            let target = dir.join(format!("{name}.csv"));
            let text = if opts.extra.is_empty() {
                text
            } else {
                merged(&fs::read_to_string(&target).unwrap_or_default(), &text)
            };
            fs::write(&target, text).with_context(|| format!("writing {}", target.display()))?;
            println!("    published {}", target.display());
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "suite,mode,services,rep,metric,value,unit,cpu_frac,kernel,cpu,run";

    #[test]
    fn what_a_run_appended_is_published_alone() {
        let old = format!("{HEADER}\nsync,ebpf,1000,0,full_sync_wall,10,ms,0.2,k,c,r1\n");
        let new =
            "sync,ebpf,1000,0,full_sync_wall,12,ms,0.3,k,c,r2\nsync,ebpf,1000,0,x,1,ms,,k,c,r3\n";
        let published = appended(&old, &format!("{old}{new}"));
        assert_eq!(published, format!("{HEADER}\n{new}"));
        // A new file: everything but its header once.
        assert_eq!(
            appended("", &format!("{HEADER}\n{new}")),
            format!("{HEADER}\n{new}")
        );
    }

    #[test]
    fn a_slice_replaces_only_the_modes_and_counts_it_measured() {
        let published = format!(
            "{HEADER}\n\
             sync,ebpf,1000,0,full_sync_wall,10,ms,0.2,k,c,r1\n\
             sync,kube-proxy-nft,1000,0,full_sync_wall,700,ms,,k,c,r1\n\
             sync,kube-proxy-nft,10000,0,full_sync_wall,90000,ms,,k,c,r1\n"
        );
        let run = format!(
            "{HEADER}\n\
             sync,nftables,1000,0,full_sync_wall,60,ms,0.09,k,c,r2\n\
             sync,kube-proxy-nft,1000,0,full_sync_wall,650,ms,,k,c,r2\n"
        );
        assert_eq!(
            merged(&published, &run),
            format!(
                "{HEADER}\n\
                 sync,ebpf,1000,0,full_sync_wall,10,ms,0.2,k,c,r1\n\
                 sync,kube-proxy-nft,10000,0,full_sync_wall,90000,ms,,k,c,r1\n\
                 sync,nftables,1000,0,full_sync_wall,60,ms,0.09,k,c,r2\n\
                 sync,kube-proxy-nft,1000,0,full_sync_wall,650,ms,,k,c,r2\n"
            )
        );
        // Nothing published yet: the run's rows.
        assert_eq!(merged("", &run), run);
        // A run that wrote nothing leaves the file as it was.
        assert_eq!(merged(&published, &format!("{HEADER}\n")), published);
    }

    #[test]
    fn suites_run_as_their_loadgen_subcommands() {
        assert_eq!(suite_command("sync").unwrap(), "bench-sync-modes");
        assert_eq!(suite_command("dataplane").unwrap(), "bench-dataplane");
        assert!(suite_command("clusterip").is_err());
        assert_eq!(
            csv_path(Path::new("/t"), "bpf", true),
            Path::new("/t/bpf-quick.csv")
        );
        assert_eq!(default_extra("latency", false).len(), 4);
        assert!(default_extra("latency", true).is_empty());
    }
}
