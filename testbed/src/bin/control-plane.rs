// SPDX-License-Identifier: Apache-2.0
//! `control-plane`: upstream's control plane for other processes. `serve` starts it and
//! keeps it until SIGTERM/SIGINT/SIGHUP (or, with `--until-stdin-closes`, until its stdin
//! closes), printing `READY <dir>` once it can be used; `stop` ends the one serving a
//! directory. `cargo xtask test` serves one for the whole suite (its directory in
//! `KPE_CONTROL_PLANE`); `cargo xtask demo --keep` leaves one serving.

use std::{
    io::{BufRead as _, Write as _},
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use testbed::{ControlPlane, Options};

#[derive(Parser)]
#[command(
    about = "Upstream's etcd, kube-apiserver and kube-controller-manager for the tests and the demo"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a control plane in DIR and keep it until told to stop.
    Serve {
        #[arg(long)]
        dir: PathBuf,
        /// Leave DIR (PKI, logs, data) in place when stopping.
        #[arg(long)]
        keep: bool,
        /// Also stop when standard input closes (the starter died or is done).
        #[arg(long)]
        until_stdin_closes: bool,
        /// Without kube-controller-manager (no controller-made EndpointSlices).
        #[arg(long)]
        no_controllers: bool,
        /// `--service-cluster-ip-range` (repeatable, one per family; default: ranges no
        /// scenario file uses).
        #[arg(long = "service-cidr")]
        service_cidrs: Vec<ipnet::IpNet>,
        /// Also serve the API on ADDR (default 127.0.0.1:6443) inside network namespace
        /// NETNS, through a relay: `NETNS` or `NETNS=ADDR`.
        #[arg(long)]
        relay: Option<String>,
        /// Apply the agent's ServiceAccount and RBAC from deploy/ and write a kubeconfig
        /// with its token here (pointing at the relay when there is one).
        #[arg(long, value_name = "PATH")]
        agent_kubeconfig: Option<PathBuf>,
    },
    /// Stop the control plane serving DIR and wait until it is gone.
    Stop {
        #[arg(long)]
        dir: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Serve {
            dir,
            keep,
            until_stdin_closes,
            no_controllers,
            service_cidrs,
            relay,
            agent_kubeconfig,
        } => {
            let mut options = Options::new(&dir);
            options.keep = keep;
            options.controllers = !no_controllers;
            if !service_cidrs.is_empty() {
                options.service_cidrs = service_cidrs;
            }
            let relay = relay.as_deref().map(parse_relay).transpose()?;
            serve(options, until_stdin_closes, relay, agent_kubeconfig)
        }
        Command::Stop { dir } => stop(&dir),
    }
}

/// `NETNS` or `NETNS=IP:PORT`.
fn parse_relay(text: &str) -> anyhow::Result<(String, SocketAddr)> {
    match text.split_once('=') {
        Some((netns, addr)) => Ok((
            netns.to_string(),
            addr.parse()
                .with_context(|| format!("--relay {text}: {addr} is not IP:PORT"))?,
        )),
        None => Ok((text.to_string(), SocketAddr::from(([127, 0, 0, 1], 6443)))),
    }
}

fn serve(
    options: Options,
    until_stdin_closes: bool,
    relay: Option<(String, SocketAddr)>,
    agent_kubeconfig: Option<PathBuf>,
) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("installing the signal handlers")?;
    }
    if until_stdin_closes {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                if line.is_err() {
                    break;
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
    // A current-thread runtime: the components are started from this (the main) thread,
    // which lives as long as they should (see testbed::process).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let started = Instant::now();
    let mut plane = runtime
        .block_on(ControlPlane::start(options))
        .context("starting the control plane")?;
    let mut server = plane.server().to_string();
    if let Some((netns, addr)) = &relay {
        let _guard = runtime.enter();
        let listener = testbed::relay::listen_in(netns, *addr)
            .with_context(|| format!("listening on {addr} in network namespace {netns}"))?;
        let upstream = SocketAddr::from(([127, 0, 0, 1], plane.state().apiserver_port));
        runtime.spawn(testbed::relay::relay(listener, upstream));
        server = format!("https://{addr}");
        println!("the API server is also at {server} inside network namespace {netns}");
    }
    if let Some(path) = &agent_kubeconfig {
        runtime
            .block_on(async {
                let mut applier = testbed::objects::Applier::new(plane.admin_client().await?);
                testbed::objects::apply_agent_identity(&mut applier).await?;
                plane
                    .write_service_account_kubeconfig(
                        testbed::objects::AGENT_NAMESPACE,
                        testbed::objects::AGENT_SERVICE_ACCOUNT,
                        &server,
                        path,
                    )
                    .await
            })
            .context("the agent's identity and kubeconfig")?;
        println!(
            "the agent's kubeconfig (ServiceAccount {}/{} of deploy/): {}",
            testbed::objects::AGENT_NAMESPACE,
            testbed::objects::AGENT_SERVICE_ACCOUNT,
            path.display()
        );
    }
    println!(
        "READY {} (upstream {}, {} in {:.1} s)",
        plane.dir().display(),
        plane.state().version,
        plane.server(),
        started.elapsed().as_secs_f64()
    );
    std::io::stdout().flush().ok();
    // The relay's tasks run on this runtime while it waits.
    runtime.block_on(async {
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    plane.stop();
    Ok(())
}

fn stop(dir: &std::path::Path) -> anyhow::Result<()> {
    let plane = ControlPlane::attach(dir)
        .with_context(|| format!("no control plane in {}", dir.display()))?;
    let pid = plane.state().owner_pid;
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    if !proc_dir.exists() {
        println!("the control plane of {} is not running", dir.display());
        return Ok(());
    }
    let Ok(raw) = i32::try_from(pid) else {
        bail!("pid {pid} out of range");
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(raw),
        nix::sys::signal::Signal::SIGTERM,
    )
    .with_context(|| format!("signalling {pid}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while proc_dir.exists() {
        if Instant::now() > deadline {
            bail!("the control plane (pid {pid}) did not stop within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("stopped the control plane of {}", dir.display());
    Ok(())
}
