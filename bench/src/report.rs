// SPDX-License-Identifier: Apache-2.0
//! How every benchmark ends: Ctrl-C watched for the whole run (the benchmark cleans up
//! and the process exits 130), then its table printed, the time it took, and its rows
//! appended to the CSV.

use std::{path::Path, process::ExitCode, time::Instant};

use super::{
    error::{Error, Result},
    results::append_csv_rows,
    signals,
};

/// What a finished benchmark hands back.
pub trait BenchReport {
    /// The rows for the CSV (without the header).
    fn csv_rows(&self) -> Vec<String>;
    /// The human-readable report.
    fn table(&self) -> String;
}

/// Runs `bench` with signals watched and reports it (see the module doc).
pub fn run_reported<R: BenchReport>(
    csv: Option<&Path>,
    bench: impl FnOnce() -> Result<R>,
) -> Result<ExitCode> {
    signals::watch()?;
    let started = Instant::now();
    let results = match bench() {
        Ok(results) => results,
        Err(Error::Interrupted(signal)) => {
            eprintln!("loadgen: interrupted by {signal}; cleaned up");
            return Ok(ExitCode::from(130));
        }
        Err(err) => return Err(err),
    };
    print!("{}", results.table());
    println!("took {:.0} s in all", started.elapsed().as_secs_f64());
    if let Some(csv) = csv {
        let rows = results.csv_rows();
        append_csv_rows(csv, &rows)?;
        println!("appended {} rows to {}", rows.len(), csv.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Results whose own methods make the rows and the table.
macro_rules! reported_by_methods {
    ($($results:ty),* $(,)?) => {
        $(impl BenchReport for $results {
            fn csv_rows(&self) -> Vec<String> {
                <$results>::csv_rows(self)
            }
            fn table(&self) -> String {
                <$results>::table(self)
            }
        })*
    };
}

reported_by_methods!(
    super::results::BenchResults,
    super::nodeport::results::NodeportResults,
    super::sync::results::SyncResults,
    super::sync::suite::SuiteResults,
    super::dataplane::DataplaneResults,
    super::latency::LatencyResults,
);

/// Results kept as generic rows ([`rows`](super::rows)).
macro_rules! reported_by_rows {
    ($($results:ty),* $(,)?) => {
        $(impl BenchReport for $results {
            fn csv_rows(&self) -> Vec<String> {
                super::rows::csv_rows(&self.rows, &self.env)
            }
            fn table(&self) -> String {
                super::rows::table(&self.rows)
            }
        })*
    };
}

reported_by_rows!(super::bpf::BpfResults, super::memory::MemoryResults);
