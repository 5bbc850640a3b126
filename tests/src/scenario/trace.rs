// SPDX-License-Identifier: Apache-2.0
//! The trace hook: replays a scenario like [`super::run::run_scenario`] and, after each
//! flow's probes, while the agent still runs, asks `proxy-agent trace` (inside the node
//! namespace, on the run's pins) what it says about the same flow, then checks that the
//! verdict agrees with what the probes really saw. [`agreement`] is pure.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    path::Path,
    process::Stdio,
};

use serde::Deserialize;

use super::{
    agent::bpffs_root,
    echo::sctp_supported,
    error::{Error, Result},
    format::{Flow, Mode, Proto, Scenario},
    netns::Place,
    outcome::{AnswerKind, Attempt, Judge, Outcome},
    run::{RunOptions, ScenarioEnv},
};

/// The parts of `proxy-agent trace --output json` the comparison needs.
#[derive(Debug, Clone, Deserialize)]
pub struct TraceVerdict {
    pub action: String,
    #[serde(default)]
    pub candidates: Vec<TraceCandidate>,
    #[serde(default)]
    pub masquerade: bool,
    pub backend_sees_source: Option<IpAddr>,
    #[serde(default)]
    pub steps: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TraceCandidate {
    pub address: IpAddr,
    pub port: u16,
}

/// One traced flow: the runner's judgement and whether trace agreed.
#[derive(Debug, Clone)]
pub struct TracedFlow {
    pub scenario: String,
    pub index: usize,
    pub from: IpAddr,
    pub to: SocketAddr,
    pub proto: Proto,
    /// The runner's own verdict on the flow (expectation met).
    pub passed: bool,
    pub seen: String,
    pub trace: std::result::Result<TraceVerdict, String>,
    /// `None` when trace agrees with the probes, else why not.
    pub disagreement: Option<String>,
}

/// Runs `proxy-agent trace` for `flow` in `place` against the pins under `bpffs`.
pub async fn trace_flow(
    agent_binary: &Path,
    mode: Mode,
    place: &Place,
    bpffs: &Path,
    flow: &Flow,
) -> Result<TraceVerdict> {
    let args: Vec<String> = vec![
        "trace".into(),
        "--mode".into(),
        mode.as_str().into(),
        "--from".into(),
        flow.from.to_string(),
        "--to".into(),
        flow.to.to_string(),
        "--proto".into(),
        flow.proto.to_string(),
        "--output".into(),
        "json".into(),
        "--bpffs-root".into(),
        bpffs.display().to_string(),
    ];
    let output = tokio::process::Command::from(place.command(agent_binary, &args))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(Error::io("running proxy-agent trace"))?;
    if !output.status.success() {
        return Err(Error::Setup(format!(
            "proxy-agent trace exited {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// Whether `trace`'s verdict agrees with the probe attempts (pure). Forward: every attempt
/// reached a candidate, and the source it saw is a node address exactly when trace says
/// the backend sees one; reject: every attempt refused; drop: every attempt silent;
/// untouched: no attempt was answered by anything but the destination itself.
pub fn agreement(
    trace: &TraceVerdict,
    to: SocketAddr,
    attempts: &[Attempt],
    node_addresses: &BTreeSet<IpAddr>,
) -> std::result::Result<(), String> {
    let describe = |a: &Attempt| a.describe();
    for a in attempts {
        let ok = match trace.action.as_str() {
            "forward" => {
                let is_candidate = a.backend.is_some_and(|b| {
                    trace
                        .candidates
                        .iter()
                        .any(|c| SocketAddr::new(c.address, c.port) == b)
                });
                let echo = a.outcome == Outcome::Answer && a.answer_kind == Some(AnswerKind::Echo);
                let source_ok = match (a.seen_source, trace.backend_sees_source) {
                    (Some(seen), Some(said)) => {
                        node_addresses.contains(&seen) == node_addresses.contains(&said)
                    }
                    _ => true,
                };
                echo && is_candidate && source_ok
            }
            "reject" => a.outcome == Outcome::Refused,
            "drop" => a.outcome == Outcome::Timeout,
            "untouched" => a.answer_kind != Some(AnswerKind::Echo) || a.backend == Some(to),
            other => return Err(format!("unknown trace action {other:?}")),
        };
        if !ok {
            let cands: Vec<String> = trace
                .candidates
                .iter()
                .map(|c| SocketAddr::new(c.address, c.port).to_string())
                .collect();
            return Err(format!(
                "trace says {} [{}]{} but a probe saw: {}",
                trace.action,
                cands.join(", "),
                match trace.backend_sees_source {
                    Some(s) if trace.action == "forward" => format!(" (backend sees {s})"),
                    _ => String::new(),
                },
                describe(a)
            ));
        }
    }
    Ok(())
}

/// Replays `scenario` in the options' mode with a trace after every flow. SCTP flows are
/// left out where the kernel has no SCTP.
pub async fn run_scenario_traced(
    options: &RunOptions,
    scenario: &Scenario,
) -> Result<Vec<TracedFlow>> {
    let agent = options
        .agent
        .as_ref()
        .ok_or_else(|| Error::Setup("tracing needs an agent".into()))?;
    let sctp = sctp_supported();
    let mut env = ScenarioEnv::set_up(options, scenario, sctp).await?;
    let bpffs = bpffs_root(&env.topology.id);
    let place = Place {
        netns: env.topology.node_ns.clone(),
        cgroup: None,
    };
    let mut out = Vec::new();
    for (n, stage) in scenario.stages.iter().enumerate() {
        if n > 0 {
            env.change(&stage.change).await?;
        }
        let node_addresses = env.topology.node_addresses()?;
        for flow in stage.flows.iter().filter(|f| f.applies_to(options.mode)) {
            if flow.proto == Proto::Sctp && !sctp {
                continue;
            }
            let attempts = env.probe(flow).await?;
            let judged = Judge {
                flow,
                node_addresses: &node_addresses,
            }
            .verdict(&attempts);
            let trace = trace_flow(&agent.binary, options.mode, &place, &bpffs, flow)
                .await
                .map_err(|e| e.to_string());
            let disagreement = match &trace {
                Ok(t) => agreement(t, flow.to, &attempts, &node_addresses).err(),
                Err(e) => Some(e.clone()),
            };
            out.push(TracedFlow {
                scenario: scenario.name.clone(),
                index: flow.index,
                from: flow.from,
                to: flow.to,
                proto: flow.proto,
                passed: judged.pass,
                seen: judged.text,
                trace,
                disagreement,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(json: &str) -> TraceVerdict {
        serde_json::from_str(json).unwrap()
    }

    fn to() -> SocketAddr {
        "172.30.0.41:80".parse().unwrap()
    }

    fn echo(backend: &str, seen: &str) -> Attempt {
        Attempt::answered(&format!("ECHO {backend} FROM {seen}:40000"), 3)
    }

    #[test]
    fn forward_agrees_only_with_candidates_and_the_right_source() {
        let nodes: BTreeSet<IpAddr> = ["192.168.0.2".parse().unwrap()].into();
        let t = verdict(
            r#"{"action":"forward","candidates":[{"address":"10.180.0.1","port":80}],
                "masquerade":true,"backend_sees_source":"192.168.0.2"}"#,
        );
        assert!(agreement(&t, to(), &[echo("10.180.0.1:80", "192.168.0.2")], &nodes).is_ok());
        // Another backend, or the client's own address seen instead of the node's.
        assert!(agreement(&t, to(), &[echo("10.180.0.9:80", "192.168.0.2")], &nodes).is_err());
        assert!(agreement(&t, to(), &[echo("10.180.0.1:80", "203.0.113.9")], &nodes).is_err());
        assert!(agreement(&t, to(), &[Attempt::new(Outcome::Timeout, 1000)], &nodes).is_err());
    }

    #[test]
    fn reject_drop_and_untouched() {
        let nodes = BTreeSet::new();
        let reject = verdict(r#"{"action":"reject","backend_sees_source":null}"#);
        let drop = verdict(r#"{"action":"drop","backend_sees_source":null}"#);
        let untouched = verdict(r#"{"action":"untouched","backend_sees_source":null}"#);
        let refused = Attempt::new(Outcome::Refused, 1);
        let silent = Attempt::new(Outcome::Timeout, 1000);
        assert!(agreement(&reject, to(), std::slice::from_ref(&refused), &nodes).is_ok());
        assert!(agreement(&reject, to(), std::slice::from_ref(&silent), &nodes).is_err());
        assert!(agreement(&drop, to(), std::slice::from_ref(&silent), &nodes).is_ok());
        assert!(agreement(&drop, to(), &[refused], &nodes).is_err());
        assert!(agreement(&untouched, to(), &[silent], &nodes).is_ok());
        let plain = Attempt::answered("PLAIN 203.0.113.1:80", 2);
        assert!(agreement(&untouched, to(), &[plain], &nodes).is_ok());
        assert!(
            agreement(
                &untouched,
                to(),
                &[echo("10.180.0.1:80", "10.0.0.1")],
                &nodes
            )
            .is_err()
        );
        // A destination that is itself a pod answers for itself.
        let direct: SocketAddr = "10.180.0.1:80".parse().unwrap();
        assert!(
            agreement(
                &untouched,
                direct,
                &[echo("10.180.0.1:80", "10.0.0.1")],
                &nodes
            )
            .is_ok()
        );
    }
}
