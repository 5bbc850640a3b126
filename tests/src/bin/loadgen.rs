// SPDX-License-Identifier: Apache-2.0
//! `loadgen`: the benchmark load generator (`serve`, `client`) and the ClusterIP
//! benchmark that runs them in network namespaces (`bench-clusterip`, root only).
//!
//! ```text
//! loadgen serve --listen 10.244.1.2:8080 [--cpu 1]        # prints READY, answers forever
//! loadgen client --target 10.244.1.2:8080 --target 10.96.0.10:80 --seconds 3 [--cpu 0]
//! sudo loadgen bench-clusterip [--quick] [--csv FILE]     # see `cargo xtask bench clusterip`
//! sudo loadgen cleanup-stale                              # after a run was SIGKILLed
//! ```
#![forbid(unsafe_code)]

use std::{
    io::Write as _,
    net::{SocketAddr, TcpListener},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tests::bench::{
    BenchOptions, Error,
    load::{ClientOptions, pin_to_cpu, run_client, serve},
    net, run_clusterip, signals,
};

#[derive(Parser)]
#[command(about = "Connection-rate load generator and the ClusterIP benchmark")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Answer each connection's 1-byte request with the same byte, then close.
    Serve {
        #[arg(long)]
        listen: SocketAddr,
        /// Pin to this CPU.
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// Open connections one after another (connect, 1-byte request, 1-byte reply, close)
    /// and print the rate and connect() latency per target as one JSON array.
    Client {
        /// Repeatable: several targets are measured in alternating slices (ABBA).
        #[arg(long = "target", required = true)]
        targets: Vec<SocketAddr>,
        /// The measured time per target.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Length of one slice of the alternation.
        #[arg(long, default_value_t = 100)]
        slice_ms: u64,
        /// A target's measured time also ends after this many connections.
        #[arg(long)]
        max_connections: Option<u64>,
        /// Connections made before the measured time, not recorded.
        #[arg(long, default_value_t = 300)]
        warmup_ms: u64,
        /// Pin to this CPU.
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// The ClusterIP benchmark (root): namespaces, the agent in ebpf mode, the client
    /// through a ClusterIP and straight to the backend, with 1 and 10,000 services.
    BenchClusterip {
        /// The agent binary (default: proxy-agent beside this binary).
        #[arg(long)]
        agent: Option<PathBuf>,
        /// 1 rep of 1 s with 1 and 100 services: proves the bench works, not the speed.
        #[arg(long)]
        quick: bool,
        #[arg(long)]
        reps: Option<u32>,
        /// Seconds per rep and route.
        #[arg(long)]
        seconds: Option<f64>,
        /// Service counts, comma-separated (default 1,10000; quick: 1,100).
        #[arg(long, value_delimiter = ',')]
        services: Vec<u32>,
        #[arg(long)]
        client_cpu: Option<usize>,
        #[arg(long)]
        server_cpu: Option<usize>,
        /// Append the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// Remove namespaces, cgroups, pins and files of benchmark runs whose process died.
    CleanupStale,
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("loadgen: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve { listen, cpu } => {
            if let Some(cpu) = cpu {
                pin_to_cpu(cpu)?;
            }
            let listener =
                TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
            println!("READY");
            std::io::stdout().flush()?;
            serve(&listener, Duration::from_secs(2)).context("serving")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Client {
            targets,
            seconds,
            slice_ms,
            max_connections,
            warmup_ms,
            cpu,
        } => {
            if let Some(cpu) = cpu {
                pin_to_cpu(cpu)?;
            }
            let mut opts = ClientOptions::new(
                targets,
                Duration::try_from_secs_f64(seconds).context("--seconds")?,
            );
            opts.slice = Duration::from_millis(slice_ms);
            if let Some(max) = max_connections {
                opts.max_connections = max;
            }
            opts.warmup = Duration::from_millis(warmup_ms);
            let reports = run_client(&opts);
            println!("{}", serde_json::to_string(&reports)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::BenchClusterip {
            agent,
            quick,
            reps,
            seconds,
            services,
            client_cpu,
            server_cpu,
            csv,
        } => {
            let here = std::env::current_exe().context("locating this binary")?;
            let agent = match agent {
                Some(path) => path,
                None => here
                    .parent()
                    .map(|dir| dir.join("proxy-agent"))
                    .context("locating proxy-agent")?,
            };
            let mut opts = if quick {
                BenchOptions::quick(agent, here)
            } else {
                BenchOptions::full(agent, here)
            };
            if let Some(reps) = reps {
                opts.reps = reps;
            }
            if let Some(seconds) = seconds {
                opts.rep_duration = Duration::try_from_secs_f64(seconds).context("--seconds")?;
            }
            if !services.is_empty() {
                opts.service_counts = services;
            }
            opts.client_cpu = client_cpu;
            opts.server_cpu = server_cpu;
            signals::watch()?;
            let started = std::time::Instant::now();
            let results = match run_clusterip(&opts) {
                Ok(results) => results,
                Err(Error::Interrupted(signal)) => {
                    eprintln!("loadgen: interrupted by {signal}; cleaned up");
                    return Ok(ExitCode::from(130));
                }
                Err(err) => return Err(err.into()),
            };
            print!("{}", results.table());
            println!("took {:.0} s in all", started.elapsed().as_secs_f64());
            if let Some(csv) = csv {
                results.append_csv(&csv)?;
                println!(
                    "appended {} rows to {}",
                    results.csv_rows().len(),
                    csv.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::CleanupStale => {
            for line in net::cleanup_stale()? {
                println!("removed {line}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
