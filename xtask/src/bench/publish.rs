// SPDX-License-Identifier: Apache-2.0
//! Publishing a suite's run: its rows, appended to target/bench/<suite>.csv by the load
//! generator, copied into docs/bench/<suite>.csv, the committed file its section of
//! docs/benchmarks.md is generated from (pure: text in, text out). The published file
//! keeps earlier published runs, for the sections' history tables; publishing the same
//! run again replaces its rows rather than doubling them.

use anyhow::{Context as _, bail};

/// The value of the `run` column of a CSV line (the run's start time).
fn run_of(line: &str, run_column: usize) -> Option<&str> {
    line.split(',').nth(run_column)
}

/// `published` (the committed CSV, if any) with the rows of `raw`'s latest run added,
/// replacing any rows of that run it held. The latest run is the one of `raw`'s last
/// row: the load generator appends, so a run it just finished is at the end.
pub fn publish_latest_run(raw: &str, published: Option<&str>) -> anyhow::Result<String> {
    let mut lines = raw.lines().filter(|l| !l.trim().is_empty());
    let header = lines.next().context("the run's CSV is empty")?;
    let run_column = header
        .split(',')
        .position(|c| c == "run")
        .context("the run's CSV has no run column")?;
    let rows: Vec<&str> = lines.collect();
    let latest = rows
        .last()
        .and_then(|l| run_of(l, run_column))
        .context("the run's CSV holds no rows")?;
    let mut out = String::new();
    out.push_str(header);
    out.push('\n');
    if let Some(published) = published {
        let mut old = published.lines().filter(|l| !l.trim().is_empty());
        if let Some(old_header) = old.next()
            && old_header != header
        {
            bail!(
                "the published CSV's columns ({old_header}) are not the run's ({header}): \
                 convert or move it first"
            );
        }
        for line in old.filter(|l| run_of(l, run_column) != Some(latest)) {
            out.push_str(line);
            out.push('\n');
        }
    }
    for line in rows
        .iter()
        .filter(|l| run_of(l, run_column) == Some(latest))
    {
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "bench,mode,N,rep,metric,value,unit,ratio_to_baseline,kernel,cpu,run";

    fn row(run: &str, value: u32) -> String {
        format!("clusterip,direct,1,0,conn_rate,{value},conn/s,1,k,c,{run}")
    }

    #[test]
    fn the_latest_run_is_added_to_the_published_runs_once() {
        let raw = [HEADER.to_string(), row("r1", 1), row("r2", 2), row("r2", 3)].join("\n");
        let first = publish_latest_run(&raw, None).unwrap();
        assert_eq!(
            first,
            format!("{HEADER}\n{}\n{}\n", row("r2", 2), row("r2", 3))
        );
        let old = format!("{HEADER}\n{}\n", row("r0", 9));
        let added = publish_latest_run(&raw, Some(&old)).unwrap();
        assert_eq!(
            added,
            format!(
                "{HEADER}\n{}\n{}\n{}\n",
                row("r0", 9),
                row("r2", 2),
                row("r2", 3)
            )
        );
        // Publishing the same run again changes nothing.
        assert_eq!(publish_latest_run(&raw, Some(&added)).unwrap(), added);
    }

    #[test]
    fn a_published_file_with_other_columns_or_an_empty_run_is_refused() {
        let raw = format!("{HEADER}\n{}\n", row("r1", 1));
        assert!(publish_latest_run(&raw, Some("bench,mode,run\nx,y,r0\n")).is_err());
        assert!(publish_latest_run(HEADER, None).is_err());
        assert!(publish_latest_run("", None).is_err());
        assert!(publish_latest_run("bench,mode\nx,y\n", None).is_err());
    }
}
