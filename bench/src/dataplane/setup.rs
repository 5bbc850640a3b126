// SPDX-License-Identifier: Apache-2.0
//! Putting N services into a fresh node namespace the way of each mode.

use std::{
    thread,
    time::{Duration, Instant, SystemTime},
};

use ::tests::scenario::{Mode, netns::Place};

use crate::{
    agent::BenchAgent,
    error::{Error, Result},
    maps::{STALL, Stall, frontends_in},
    net::{self, BenchNet},
    shaped::{iptables_full, iptables_partial, nft_full_in_transactions},
    signals,
};

use super::{DataplaneOptions, DpMode, modes};

/// Moves the measured service from where `from` placed it to where `to` places it, with
/// the partial restore upstream would make (`KUBE-SERVICES` rewritten); its position.
pub(super) fn reorder(
    opts: &DataplaneOptions,
    bench_net: &BenchNet,
    from: DpMode,
    to: DpMode,
    n: u32,
) -> Result<Option<usize>> {
    let place = |mode| match mode {
        DpMode::KubeProxyIptablesRandom => Some(modes::random_position(n - 1)),
        _ => None,
    };
    let (before, after) = (place(from), place(to));
    let text = iptables_partial(
        &modes::services(n, before),
        &modes::services(n, after),
        &modes::shaped_options(),
    );
    let node = Place {
        netns: bench_net.node_ns.clone(),
        cgroup: None,
    };
    let args = ["--noflush"];
    modes::run_with_input(
        &node,
        "iptables-legacy-restore",
        &args,
        &text,
        opts.setup_timeout,
    )?;
    Ok(Some(after.unwrap_or(n as usize - 1)))
}

/// Puts `n` services into the node namespace the `mode` way; the agent (kept running) and
/// the measured service's position among the services, where the mode has one.
pub(super) fn load(
    opts: &DataplaneOptions,
    bench_net: &BenchNet,
    mode: DpMode,
    n: u32,
) -> Result<(Option<BenchAgent>, Option<usize>)> {
    let node = Place {
        netns: bench_net.node_ns.clone(),
        cgroup: None,
    };
    let limit = opts.setup_timeout;
    match mode {
        DpMode::Direct => Ok((None, None)),
        DpMode::DirectCt => {
            modes::run_with_input(&node, "nft", &["-f", "-"], modes::DIRECT_CT_RULESET, limit)?;
            Ok((None, None))
        }
        DpMode::KubeProxyIptables | DpMode::KubeProxyIptablesRandom => {
            let position =
                (mode == DpMode::KubeProxyIptablesRandom).then(|| modes::random_position(n - 1));
            let text = iptables_full(&modes::services(n, position), &modes::shaped_options());
            let args = ["--noflush"];
            modes::run_with_input(&node, "iptables-legacy-restore", &args, &text, limit)?;
            Ok((None, Some(position.unwrap_or(n as usize - 1))))
        }
        DpMode::KubeProxyNft => {
            let services = modes::services(n, None);
            // In transactions of at most NFT_CHUNK services: the kernel's cost of one
            // transaction grows with the square of its anonymous sets (one per service).
            let opts = modes::shaped_options();
            for text in nft_full_in_transactions(&services, &opts, modes::NFT_CHUNK) {
                modes::run_with_input(&node, "nft", &["-f", "-"], &text, limit)?;
            }
            Ok((None, None))
        }
        DpMode::Ebpf | DpMode::Iptables | DpMode::Nftables => {
            let agent = start_agent(opts, bench_net, mode, n)?;
            Ok((Some(agent), None))
        }
    }
}

/// Our agent with the `n` services in its source directory from the start, synced.
fn start_agent(
    opts: &DataplaneOptions,
    bench_net: &BenchNet,
    mode: DpMode,
    n: u32,
) -> Result<BenchAgent> {
    let dir = bench_net.run_dir.join("manifests");
    std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let file = dir.join("services.yaml");
    std::fs::write(&file, modes::manifests(&modes::services(n, None)))
        .map_err(Error::io(format!("writing {}", file.display())))?;
    let bpffs = net::bpffs_root(&bench_net.id);
    let (agent_mode, env) = match mode {
        DpMode::Iptables => {
            let path = modes::legacy_path(&bench_net.run_dir.join("legacy-bin"))?;
            (Mode::Iptables, vec![("PATH".into(), path)])
        }
        DpMode::Nftables => (Mode::Nftables, Vec::new()),
        _ => (Mode::Ebpf, Vec::new()),
    };
    let started = SystemTime::now();
    let mut agent = BenchAgent::start_in_mode(
        &opts.agent_binary,
        bench_net.node_place(),
        &bench_net.run_dir,
        &dir,
        &bpffs,
        &modes::agent_fragment(n),
        agent_mode,
        env.clone(),
    )?;
    agent.wait_initial_sync(started, opts.setup_timeout)?;
    // The service ports the dataplane must hold: the fillers' and the measured two.
    let expected = n as usize + 1;
    let deadline = Instant::now() + opts.setup_timeout;
    let mut stall = Stall::new(STALL);
    loop {
        signals::check()?;
        let node = Place {
            netns: bench_net.node_ns.clone(),
            cgroup: None,
        };
        let seen = match (&env.first(), mode) {
            (Some((_, path)), DpMode::Iptables) => {
                modes::kube_services_rules(&node, path, opts.setup_timeout)?
            }
            (_, DpMode::Nftables) => modes::service_ips_elements(&node, opts.setup_timeout)?,
            _ => frontends_in(&bpffs)?,
        };
        if seen == expected {
            return Ok(agent);
        }
        let stalled = stall.stalled(seen, expected);
        if Instant::now() >= deadline || stalled {
            let how = if stalled {
                "stopped moving"
            } else {
                "timed out"
            };
            return Err(agent.failure(format!(
                "the dataplane holds {seen} service ports, not {expected} ({how})"
            )));
        }
        thread::sleep(Duration::from_millis(250));
    }
}
