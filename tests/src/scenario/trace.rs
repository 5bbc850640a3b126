// SPDX-License-Identifier: Apache-2.0
//! The trace check (`scenario-runner run --trace-check`): after each flow's probes, while
//! the agent still runs, [`trace_flow`] asks `proxy-agent trace` (inside the node
//! namespace, on the run's pins) what it says about the same flow, and [`agreement`]
//! (pure) checks that the verdict agrees with what the probes really saw.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    path::Path,
    process::Stdio,
};

use serde::Deserialize;

use super::{
    error::{Error, Result},
    format::{Flow, Mode},
    netns::Place,
    outcome::{AnswerKind, Attempt, Outcome, dropped_in_output_hook},
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
    #[serde(default)]
    pub masquerade: bool,
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
/// that candidate sees one (masqueraded, or a client on the node); reject: every attempt refused (or EPERM from the node); drop: every attempt silent (or
/// EPERM from the node);
/// untouched: no attempt was answered by anything but the destination itself.
pub fn agreement(
    trace: &TraceVerdict,
    from: IpAddr,
    to: SocketAddr,
    attempts: &[Attempt],
    node_addresses: &BTreeSet<IpAddr>,
) -> std::result::Result<(), String> {
    let describe = |a: &Attempt| a.describe();
    for a in attempts {
        let ok = match trace.action.as_str() {
            "forward" => {
                let candidate = a.backend.and_then(|b| {
                    trace
                        .candidates
                        .iter()
                        .find(|c| SocketAddr::new(c.address, c.port) == b)
                });
                let echo = a.outcome == Outcome::Answer && a.answer_kind == Some(AnswerKind::Echo);
                let source_ok = match (a.seen_source, candidate) {
                    (Some(seen), Some(c)) => {
                        node_addresses.contains(&seen)
                            == (c.masquerade || node_addresses.contains(&from))
                    }
                    _ => true,
                };
                echo && candidate.is_some() && source_ok
            }
            // From the node, an output-hook REJECT of a datagram fails send() with EPERM
            // (see Judge::refused; TCP from the node sees the reset, a refusal).
            "reject" => {
                a.outcome == Outcome::Refused
                    || (node_addresses.contains(&from) && dropped_in_output_hook(a))
            }
            // From the node, a datagram dropped in the output hook fails send() with EPERM
            // too (see Judge::dropped; a dropped SYN is retransmitted until it times out).
            "drop" => {
                a.outcome == Outcome::Timeout
                    || (node_addresses.contains(&from) && dropped_in_output_hook(a))
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(json: &str) -> TraceVerdict {
        serde_json::from_str(json).unwrap()
    }

    fn from() -> IpAddr {
        "203.0.113.9".parse().unwrap()
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
            r#"{"action":"forward","candidates":[{"address":"10.180.0.1","port":80,"masquerade":true}],
                "masquerade":true,"backend_sees_source":"192.168.0.2"}"#,
        );
        assert!(
            agreement(
                &t,
                from(),
                to(),
                &[echo("10.180.0.1:80", "192.168.0.2")],
                &nodes
            )
            .is_ok()
        );
        // Another backend, or the client's own address seen instead of the node's.
        assert!(
            agreement(
                &t,
                from(),
                to(),
                &[echo("10.180.0.9:80", "192.168.0.2")],
                &nodes
            )
            .is_err()
        );
        assert!(
            agreement(
                &t,
                from(),
                to(),
                &[echo("10.180.0.1:80", "203.0.113.9")],
                &nodes
            )
            .is_err()
        );
        assert!(
            agreement(
                &t,
                from(),
                to(),
                &[Attempt::new(Outcome::Timeout, 1000)],
                &nodes
            )
            .is_err()
        );
    }

    #[test]
    fn masquerade_is_judged_per_candidate() {
        // Hairpin in iptables mode: only the way to the client's own endpoint is masqueraded.
        let nodes: BTreeSet<IpAddr> = ["192.168.0.2".parse().unwrap()].into();
        let t = verdict(
            r#"{"action":"forward","backend_sees_source":null,"candidates":[
                {"address":"10.180.0.1","port":80,"masquerade":true},
                {"address":"10.180.0.2","port":80,"masquerade":false}]}"#,
        );
        let me: IpAddr = "10.180.0.1".parse().unwrap();
        let saw = |b: &str, s: &str| agreement(&t, me, to(), &[echo(b, s)], &nodes);
        assert!(saw("10.180.0.1:80", "192.168.0.2").is_ok());
        assert!(saw("10.180.0.2:80", "10.180.0.1").is_ok());
        assert!(saw("10.180.0.2:80", "192.168.0.2").is_err());
        assert!(saw("10.180.0.1:80", "10.180.0.1").is_err());
    }

    #[test]
    fn reject_drop_and_untouched() {
        let nodes = BTreeSet::new();
        let reject = verdict(r#"{"action":"reject","backend_sees_source":null}"#);
        let drop = verdict(r#"{"action":"drop","backend_sees_source":null}"#);
        let untouched = verdict(r#"{"action":"untouched","backend_sees_source":null}"#);
        let refused = Attempt::new(Outcome::Refused, 1);
        let silent = Attempt::new(Outcome::Timeout, 1000);
        assert!(
            agreement(
                &reject,
                from(),
                to(),
                std::slice::from_ref(&refused),
                &nodes
            )
            .is_ok()
        );
        assert!(agreement(&reject, from(), to(), std::slice::from_ref(&silent), &nodes).is_err());
        assert!(agreement(&drop, from(), to(), std::slice::from_ref(&silent), &nodes).is_ok());
        assert!(agreement(&drop, from(), to(), &[refused], &nodes).is_err());
        assert!(agreement(&untouched, from(), to(), &[silent], &nodes).is_ok());
        let plain = Attempt::answered("PLAIN 203.0.113.1:80", 2);
        assert!(agreement(&untouched, from(), to(), &[plain], &nodes).is_ok());
        assert!(
            agreement(
                &untouched,
                from(),
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
                from(),
                direct,
                &[echo("10.180.0.1:80", "10.0.0.1")],
                &nodes
            )
            .is_ok()
        );
    }
}
