// SPDX-License-Identifier: Apache-2.0
//! `loadgen bench-dataplane`: the suite's command line, and the two helpers it runs inside
//! the namespaces (`serve-stream`, `stream-client`), which are its subcommands so that
//! `loadgen` keeps one entry for the whole suite.

use std::{
    io::Write as _,
    net::{SocketAddr, TcpListener},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::{load::pin_to_cpu, report::run_reported};

use super::{
    DataplaneOptions, DpMode,
    abba::{AbbaOptions, AbbaReport, run_routes, run_stream_pair},
    run_dataplane,
    stream::{run_stream_client, serve_stream},
};

#[derive(Debug, Args)]
pub struct DataplaneArgs {
    #[command(subcommand)]
    helper: Option<Helper>,
    /// The agent binary (default: proxy-agent beside this binary).
    #[arg(long)]
    agent: Option<PathBuf>,
    /// 1 rep of 0.2 s per route, six modes at N = 1 and ebpf at 1,000: proves the suite
    /// works.
    #[arg(long)]
    quick: bool,
    /// Reps of every mode (default: 5 for ebpf and direct-ct, 3 for the others).
    #[arg(long)]
    reps: Option<u32>,
    /// Connection-rate seconds per route and rep, every mode (default: 3 for ebpf and
    /// direct-ct, 2 for the others).
    #[arg(long)]
    seconds: Option<f64>,
    /// Request/response and stream seconds per route and rep (default 0.5).
    #[arg(long)]
    stream_seconds: Option<f64>,
    /// Client threads (default 4).
    #[arg(long)]
    threads: Option<usize>,
    /// Service counts, comma-separated (default 1,1000,10000,50000,100000; quick: 1,1000).
    #[arg(long, value_delimiter = ',')]
    services: Vec<u32>,
    /// Modes, comma-separated (ebpf, direct-ct, iptables, nftables, kube-proxy-iptables,
    /// kube-proxy-iptables@random, kube-proxy-nft).
    #[arg(long, value_delimiter = ',')]
    modes: Vec<String>,
    #[arg(long)]
    client_cpu: Option<usize>,
    #[arg(long)]
    server_cpu: Option<usize>,
    /// Append the results to this CSV file.
    #[arg(long)]
    csv: Option<PathBuf>,
}

/// What runs inside the namespaces.
#[derive(Debug, Subcommand)]
enum Helper {
    /// Two routes in ABBA slices: connection rate on several threads, then ping-pong and
    /// streams; prints a JSON report.
    #[command(hide = true)]
    AbbaClient {
        /// Repeatable (one per route): the route's addresses, comma-separated, used in turn.
        #[arg(long = "route", required = true)]
        routes: Vec<String>,
        /// Repeatable (one per route): the route's established-connection target.
        #[arg(long = "stream-target")]
        stream_targets: Vec<SocketAddr>,
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        #[arg(long, default_value_t = 0.5)]
        stream_seconds: f64,
        #[arg(long, default_value_t = 100)]
        slice_ms: u64,
        #[arg(long, default_value_t = 300)]
        warmup_ms: u64,
        #[arg(long, default_value_t = 4)]
        threads: usize,
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// Answer ping-pong and stream connections one at a time (prints READY).
    #[command(hide = true)]
    ServeStream {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// Ping-pong, then a stream, against one target; prints a JSON report.
    #[command(hide = true)]
    StreamClient {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        #[arg(long, default_value_t = 300)]
        warmup_ms: u64,
        #[arg(long)]
        cpu: Option<usize>,
    },
}

pub fn main(args: DataplaneArgs) -> anyhow::Result<ExitCode> {
    match args.helper {
        Some(Helper::AbbaClient {
            routes,
            stream_targets,
            seconds,
            stream_seconds,
            slice_ms,
            warmup_ms,
            threads,
            cpu,
        }) => {
            // Pinned before the threads start: they inherit it.
            if let Some(cpu) = cpu {
                pin_to_cpu(cpu)?;
            }
            let routes = routes
                .iter()
                .map(|r| {
                    r.split(',')
                        .map(|a| {
                            a.parse::<SocketAddr>()
                                .with_context(|| format!("route {r}"))
                        })
                        .collect::<anyhow::Result<Vec<_>>>()
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let warmup = Duration::from_millis(warmup_ms);
            let slice = Duration::from_millis(slice_ms);
            let io_timeout = Duration::from_secs(2);
            let opts = AbbaOptions {
                routes,
                duration: Duration::try_from_secs_f64(seconds).context("--seconds")?,
                slice,
                warmup,
                threads,
                io_timeout,
                max_errors: 1000,
            };
            let conn = run_routes(&opts);
            let stream = if stream_targets.is_empty() {
                Vec::new()
            } else {
                let duration =
                    Duration::try_from_secs_f64(stream_seconds).context("--stream-seconds")?;
                run_stream_pair(&stream_targets, warmup, duration, slice, io_timeout)
                    .context("the established-connection part")?
            };
            println!("{}", serde_json::to_string(&AbbaReport { conn, stream })?);
            Ok(ExitCode::SUCCESS)
        }
        Some(Helper::ServeStream { listen, cpu }) => {
            if let Some(cpu) = cpu {
                pin_to_cpu(cpu)?;
            }
            let listener =
                TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
            println!("READY");
            std::io::stdout().flush()?;
            serve_stream(&listener, Duration::from_secs(2)).context("serving")?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Helper::StreamClient {
            target,
            seconds,
            warmup_ms,
            cpu,
        }) => {
            if let Some(cpu) = cpu {
                pin_to_cpu(cpu)?;
            }
            let duration = Duration::try_from_secs_f64(seconds).context("--seconds")?;
            let report = run_stream_client(target, Duration::from_millis(warmup_ms), duration)
                .with_context(|| format!("stream client to {target}"))?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(ExitCode::SUCCESS)
        }
        None => bench(args),
    }
}

fn bench(args: DataplaneArgs) -> anyhow::Result<ExitCode> {
    let here = std::env::current_exe().context("locating this binary")?;
    let agent = match args.agent {
        Some(path) => path,
        None => here
            .parent()
            .map(|dir| dir.join("proxy-agent"))
            .context("locating proxy-agent")?,
    };
    let mut opts = if args.quick {
        DataplaneOptions::quick(agent, here)
    } else {
        DataplaneOptions::full(agent, here)
    };
    if let Some(reps) = args.reps {
        opts.focus_plan.reps = reps;
        opts.other_plan.reps = reps;
    }
    if let Some(seconds) = args.seconds {
        let duration = Duration::try_from_secs_f64(seconds).context("--seconds")?;
        opts.focus_plan.duration = duration;
        opts.other_plan.duration = duration;
    }
    if let Some(seconds) = args.stream_seconds {
        opts.stream_duration = Duration::try_from_secs_f64(seconds).context("--stream-seconds")?;
    }
    if let Some(threads) = args.threads {
        opts.threads = threads.max(1);
    }
    if !args.services.is_empty() {
        opts.service_counts = args.services;
    }
    if !args.modes.is_empty() {
        opts.modes = args
            .modes
            .iter()
            .map(|m| DpMode::parse(m).with_context(|| format!("unknown mode {m}")))
            .collect::<anyhow::Result<_>>()?;
    }
    opts.client_cpu = args.client_cpu;
    opts.server_cpu = args.server_cpu;
    Ok(run_reported(args.csv.as_deref(), || run_dataplane(&opts))?)
}
