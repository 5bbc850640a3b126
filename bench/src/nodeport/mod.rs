// SPDX-License-Identifier: Apache-2.0
//! The NodePort benchmark: UDP packets per second and TCP connection rate from an
//! external client through a NodePort of the node (ebpf mode: tc, XDP generic or XDP
//! native on the uplink), against the same client reaching the backend pod directly
//! through the same node, for a backend on the node and one on a remote node.
//!
//! Rep after rep, the agent is started with each attachment in turn (in reverse order in
//! odd reps, so a drift of the machine falls on all of them alike); with each, one client
//! run per backend and traffic alternates between the direct route and the NodePort in
//! short slices, so every ratio pairs two measurements made side by side. An attachment
//! the uplink does not take (XDP native on a driver without it) is reported, not
//! measured. Everything is removed afterwards, also on error or signal.

pub mod env;
mod kinds;
pub mod results;

pub use kinds::{Attach, Backend, Traffic};

use std::{
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use self::{
    env::{BACKEND_PORT, NODE_IP, NodeportEnv, node_ports, pod_of},
    results::{AttachState, Measured, NodeportResults, NodeportSample},
};
use super::{
    client::run_json,
    error::{Error, Result},
    load::{ClientReport, allowed_cpus},
    net,
    results::Environment,
    signals,
    udp::UdpReport,
};

#[derive(Debug, Clone)]
pub struct NodeportOptions {
    pub agent_binary: PathBuf,
    pub loadgen_binary: PathBuf,
    pub reps: u32,
    /// Measured time per route in one client run.
    pub rep_duration: Duration,
    pub warmup: Duration,
    pub attaches: Vec<Attach>,
    pub backends: Vec<Backend>,
    pub udp_window: u32,
    /// `None`: the first two CPUs this process may use, when there are two.
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    pub sync_timeout: Duration,
    pub verbose: bool,
}

impl NodeportOptions {
    /// 5 reps of 2 s per route, every attachment, both backends.
    pub fn full(agent_binary: PathBuf, loadgen_binary: PathBuf) -> Self {
        NodeportOptions {
            agent_binary,
            loadgen_binary,
            reps: 5,
            rep_duration: Duration::from_secs(2),
            warmup: Duration::from_millis(300),
            attaches: Attach::ALL.to_vec(),
            backends: vec![Backend::Local, Backend::Remote],
            udp_window: 16,
            client_cpu: None,
            server_cpu: None,
            sync_timeout: Duration::from_secs(60),
            verbose: true,
        }
    }

    /// The slice the test suite runs: 1 rep of 0.5 s, tc and XDP generic, both backends.
    pub fn quick(agent_binary: PathBuf, loadgen_binary: PathBuf) -> Self {
        NodeportOptions {
            reps: 1,
            rep_duration: Duration::from_millis(500),
            warmup: Duration::from_millis(100),
            attaches: vec![Attach::Tc, Attach::XdpGeneric],
            ..Self::full(agent_binary, loadgen_binary)
        }
    }

    fn cpus(&self) -> (Option<usize>, Option<usize>) {
        if self.client_cpu.is_some() || self.server_cpu.is_some() {
            return (self.client_cpu, self.server_cpu);
        }
        match allowed_cpus().as_slice() {
            [first, second, ..] => (Some(*first), Some(*second)),
            _ => (None, None),
        }
    }
}

fn progress(opts: &NodeportOptions, line: &str) {
    if opts.verbose {
        eprintln!("==> {line}");
    }
}

/// The attachments of rep `rep`: as given in even reps, reversed in odd ones.
pub fn attach_order(attaches: &[Attach], rep: u32) -> Vec<Attach> {
    let mut order = attaches.to_vec();
    if !rep.is_multiple_of(2) {
        order.reverse();
    }
    order
}

/// The targets of one client run, direct first when `direct_first`.
fn targets(backend: Backend, traffic: Traffic, direct_first: bool) -> [SocketAddr; 2] {
    let direct = SocketAddr::from((pod_of(backend), BACKEND_PORT));
    let (tcp, udp) = node_ports(backend);
    let port = match traffic {
        Traffic::Tcp => tcp,
        Traffic::Udp => udp,
    };
    let nodeport = SocketAddr::from((NODE_IP, port));
    if direct_first {
        [direct, nodeport]
    } else {
        [nodeport, direct]
    }
}

/// Runs the benchmark. Needs root, the release agent with its eBPF object, and loadgen.
pub fn run_nodeport(opts: &NodeportOptions) -> Result<NodeportResults> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err(Error::Setup(
            "the benchmark needs root (namespaces, cgroups, eBPF)".into(),
        ));
    }
    net::check_built(&[&opts.agent_binary, &opts.loadgen_binary])?;
    if opts.reps == 0 || opts.attaches.is_empty() || opts.backends.is_empty() {
        return Err(Error::Setup(
            "need at least one rep, attachment and backend".into(),
        ));
    }
    let env_info = Environment::detect();
    let (client_cpu, server_cpu) = opts.cpus();
    let watched: Vec<usize> = client_cpu.into_iter().chain(server_cpu).collect();
    progress(
        opts,
        "building the namespaces (node, switch, external client, remote node, pods)",
    );
    let mut env = NodeportEnv::build(&opts.loadgen_binary, &opts.agent_binary, server_cpu)?;
    let run_id = env.topology.id.clone();
    let mut attach_states: Vec<AttachState> = Vec::new();
    let mut samples = Vec::new();
    let mut client_runs = 0u32;
    for rep in 0..opts.reps {
        for attach in attach_order(&opts.attaches, rep) {
            signals::check()?;
            if attach_states
                .iter()
                .any(|s| s.attach == attach && !s.seen.matches(attach))
            {
                continue;
            }
            let started = Instant::now();
            let seen = env.start_agent(attach, opts.sync_timeout)?;
            if !attach_states.iter().any(|s| s.attach == attach) {
                let ok = seen.matches(attach);
                let note = if ok {
                    String::new()
                } else {
                    env.agent_xdp_lines()
                };
                progress(
                    opts,
                    &format!(
                        "{}: uplink shows XDP {seen:?}{}",
                        attach.as_str(),
                        if ok {
                            ""
                        } else {
                            " - not as asked, not measured"
                        }
                    ),
                );
                attach_states.push(AttachState { attach, seen, note });
                if !ok {
                    continue;
                }
            }
            progress(
                opts,
                &format!(
                    "rep {rep}: agent up with {} in {:.1} s",
                    attach.as_str(),
                    started.elapsed().as_secs_f64()
                ),
            );
            for &backend in &opts.backends {
                for traffic in [Traffic::Tcp, Traffic::Udp] {
                    let direct_first = client_runs.is_multiple_of(2);
                    client_runs += 1;
                    let order = targets(backend, traffic, direct_first);
                    let (direct, nodeport, steal) = client_run(
                        opts,
                        &env,
                        traffic,
                        &order,
                        direct_first,
                        client_cpu,
                        &watched,
                    )?;
                    progress(
                        opts,
                        &format!(
                            "rep {rep} {:<11} {:<6} {}: direct {:>8.0}/s, nodeport {:>8.0}/s (x{:.3}){}",
                            attach.as_str(),
                            backend.as_str(),
                            traffic.as_str(),
                            direct.rate,
                            nodeport.rate,
                            if direct.rate > 0.0 {
                                nodeport.rate / direct.rate
                            } else {
                                f64::NAN
                            },
                            match &nodeport.first_error {
                                Some(err) => format!(" [{} errors: {err}]", nodeport.errors),
                                None => String::new(),
                            }
                        ),
                    );
                    samples.push(NodeportSample {
                        attach,
                        backend,
                        traffic,
                        rep,
                        direct,
                        nodeport,
                        steal_percent: steal,
                    });
                }
            }
        }
    }
    env.stop_agent();
    drop(env);
    Ok(NodeportResults {
        run_id,
        env: env_info,
        rep_seconds: opts.rep_duration.as_secs_f64(),
        udp_window: opts.udp_window,
        attach_states,
        samples,
    })
}

/// One client run from the external namespace over both routes; (direct, nodeport,
/// steal). A route that answered nothing at all is an error: the path is broken.
fn client_run(
    opts: &NodeportOptions,
    env: &NodeportEnv,
    traffic: Traffic,
    order: &[SocketAddr; 2],
    direct_first: bool,
    client_cpu: Option<usize>,
    watched: &[usize],
) -> Result<(Measured, Measured, Option<f64>)> {
    let mut args = vec![match traffic {
        Traffic::Tcp => "client".to_string(),
        Traffic::Udp => "udp-client".to_string(),
    }];
    for target in order {
        args.extend(["--target".into(), target.to_string()]);
    }
    args.extend([
        "--seconds".into(),
        format!("{}", opts.rep_duration.as_secs_f64()),
        "--warmup-ms".into(),
        opts.warmup.as_millis().to_string(),
    ]);
    if traffic == Traffic::Udp {
        args.extend(["--window".into(), opts.udp_window.to_string()]);
    }
    if let Some(cpu) = client_cpu {
        args.extend(["--cpu".into(), cpu.to_string()]);
    }
    let limit = 2 * opts.rep_duration + opts.warmup + Duration::from_secs(20);
    let place = env.client_place();
    let (measured, steal): (Vec<Measured>, Option<f64>) = match traffic {
        Traffic::Tcp => {
            let (reports, steal): (Vec<ClientReport>, _) =
                run_json(&place, &opts.loadgen_binary, &args, limit, watched)?;
            (reports.iter().map(Measured::from).collect(), steal)
        }
        Traffic::Udp => {
            let (reports, steal): (Vec<UdpReport>, _) =
                run_json(&place, &opts.loadgen_binary, &args, limit, watched)?;
            (reports.iter().map(Measured::from).collect(), steal)
        }
    };
    let [first, second]: [Measured; 2] = measured.try_into().map_err(|got: Vec<Measured>| {
        Error::Load(format!("the client reported {} targets, not 2", got.len()))
    })?;
    let (direct, nodeport) = if direct_first {
        (first, second)
    } else {
        (second, first)
    };
    if direct.rate <= 0.0 {
        return Err(Error::Load(format!(
            "nothing came back from the backend directly ({}): {}",
            traffic.as_str(),
            direct.first_error.as_deref().unwrap_or("no answers")
        )));
    }
    Ok((direct, nodeport, steal))
}

/// Removes what NodePort benchmark runs (scenario-runner topologies) and ClusterIP runs
/// left behind when their process died.
pub fn cleanup_stale() -> Result<Vec<String>> {
    let mut removed = net::cleanup_stale()?;
    removed.extend(::tests::scenario::stale::cleanup_stale()?);
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachments_alternate_and_parse() {
        assert_eq!(
            attach_order(&Attach::ALL, 1),
            [Attach::XdpNative, Attach::XdpGeneric, Attach::Tc]
        );
        assert_eq!(attach_order(&Attach::ALL, 2), Attach::ALL);
        assert_eq!("xdp-generic".parse::<Attach>(), Ok(Attach::XdpGeneric));
        assert!("xdp".parse::<Attach>().is_err());
        assert_eq!("remote".parse::<Backend>(), Ok(Backend::Remote));
        let [a, b] = targets(Backend::Remote, Traffic::Udp, false);
        assert_eq!(a, "192.168.0.2:30091".parse().unwrap());
        assert_eq!(b, "10.180.1.1:8080".parse().unwrap());
    }

    /// The quick slice, as the test suite runs it: every route, attachment, backend and
    /// traffic gives a sample with answers on both routes, and nothing is left behind.
    /// Speed is not judged. Skips without root, the eBPF object or the binaries, unless
    /// PROXY_REQUIRE_EBPF=1 says they must be there.
    #[test]
    fn quick_nodeport_bench_measures_every_route_and_cleans_up() {
        let Some(crate::quick::Built { agent, loadgen }) = crate::quick::prerequisites("nodeport")
        else {
            return;
        };
        let mut opts = NodeportOptions::quick(agent, loadgen);
        opts.verbose = false;
        let results = run_nodeport(&opts).expect("quick nodeport bench");
        for attach in [Attach::Tc, Attach::XdpGeneric] {
            let state = results
                .attach_states
                .iter()
                .find(|s| s.attach == attach)
                .unwrap();
            assert!(state.seen.matches(attach), "{state:?}");
            for backend in [Backend::Local, Backend::Remote] {
                for traffic in [Traffic::Tcp, Traffic::Udp] {
                    let s = results
                        .samples
                        .iter()
                        .find(|s| {
                            s.attach == attach && s.backend == backend && s.traffic == traffic
                        })
                        .unwrap_or_else(|| panic!("no sample {attach:?} {backend:?} {traffic:?}"));
                    assert!(s.direct.rate > 0.0, "{s:?}");
                    assert!(s.nodeport.rate > 0.0, "{s:?}");
                }
            }
        }
        assert_eq!(results.samples.len(), 8);
        assert_eq!(results.summary().len(), 8);
        assert!(results.csv_rows().len() > 8 * 6);
        let left: Vec<String> = ::tests::scenario::netns::list_netns()
            .unwrap()
            .into_iter()
            .filter(|n| n.starts_with(&format!("{}-", results.run_id)))
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
        assert!(
            !::tests::scenario::topology::runs_dir()
                .join(&results.run_id)
                .exists()
        );
    }
}
