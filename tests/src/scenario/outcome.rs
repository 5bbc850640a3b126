// SPDX-License-Identifier: Apache-2.0
//! What one probe attempt saw, and whether a flow's attempts meet its expectation
//! (pure).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
};

use serde::{Deserialize, Serialize};

use super::format::{Expectation, Flow, Proto};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Answer,
    /// ECONNREFUSED: a TCP RST or an ICMP port unreachable.
    Refused,
    /// Nothing within the timeout.
    Timeout,
    /// Any other immediate error (EPERM, ENETUNREACH, ...): neither a refusal nor a drop.
    Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnswerKind {
    /// A scenario echo server (`ECHO <own> FROM <peer>`).
    Echo,
    /// A plain listener at an UNTOUCHED destination (`PLAIN <own> ...`).
    Plain,
    /// Anything else, e.g. a health-check server's HTTP response.
    Other,
}

/// One probe attempt, as the `probe` subcommand prints it (one JSON object a line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_kind: Option<AnswerKind>,
    /// The echo server's (or plain listener's) own address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<SocketAddr>,
    /// The source address the echo server saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_source: Option<IpAddr>,
    /// First line of the answer (trimmed), for reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_line: Option<String>,
    /// True when a stream connection was established before the timeout.
    #[serde(default)]
    pub connected: bool,
    /// The address the client's socket was talking to, as the client saw it: its stream
    /// socket's peer (getpeername) or the source of the datagram answer. A translated
    /// reply path shows here as the address the client dialled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<SocketAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub elapsed_ms: u64,
}

impl Attempt {
    pub fn new(outcome: Outcome, elapsed_ms: u64) -> Self {
        Attempt {
            outcome,
            answer_kind: None,
            backend: None,
            seen_source: None,
            first_line: None,
            connected: false,
            peer: None,
            errno: None,
            message: None,
            elapsed_ms,
        }
    }

    /// An attempt that got `text` back.
    pub fn answered(text: &str, elapsed_ms: u64) -> Self {
        let line = text.lines().next().unwrap_or_default().trim().to_string();
        let mut words = line.split_whitespace();
        let (kind, backend, seen) = match (words.next(), words.next(), words.next(), words.next()) {
            (Some("ECHO"), Some(own), Some("FROM"), Some(peer)) => (
                AnswerKind::Echo,
                own.parse().ok(),
                peer.parse::<SocketAddr>().ok().map(|p| p.ip()),
            ),
            (Some("PLAIN"), Some(own), _, _) => (AnswerKind::Plain, own.parse().ok(), None),
            _ => (AnswerKind::Other, None, None),
        };
        Attempt {
            answer_kind: Some(kind),
            backend,
            seen_source: seen,
            first_line: Some(line),
            connected: true,
            ..Attempt::new(Outcome::Answer, elapsed_ms)
        }
    }

    fn is_echo(&self) -> bool {
        self.outcome == Outcome::Answer && self.answer_kind == Some(AnswerKind::Echo)
    }

    /// A short description for reports.
    pub fn describe(&self) -> String {
        match (self.outcome, self.answer_kind) {
            (Outcome::Answer, Some(AnswerKind::Echo)) => {
                format!("echo {} saw {}", opt(&self.backend), opt(&self.seen_source))
            }
            (Outcome::Answer, Some(AnswerKind::Plain)) => {
                format!("plain listener {}", opt(&self.backend))
            }
            (Outcome::Answer, _) => {
                let line = self.first_line.as_deref().unwrap_or_default();
                let short: String = line.chars().take(48).collect();
                format!("other answer {short:?}")
            }
            (Outcome::Refused, _) => "refused".into(),
            (Outcome::Timeout, _) if self.connected => {
                format!("connected, no answer in {} ms", self.elapsed_ms)
            }
            (Outcome::Timeout, _) => format!("no answer in {} ms", self.elapsed_ms),
            (Outcome::Error, _) => format!(
                "error {} ({})",
                self.errno.map_or_else(|| "?".to_string(), errno_name),
                self.message.as_deref().unwrap_or_default()
            ),
        }
    }
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map_or_else(|| "?".to_string(), ToString::to_string)
}

/// `EPERM`, `ENETUNREACH`, ...
pub fn errno_name(errno: i32) -> String {
    format!("{:?}", nix::errno::Errno::from_raw(errno))
}

/// Whether the attempt failed with the EPERM that a netfilter drop (a REJECT included) in
/// the output hook gives the sender.
pub fn dropped_in_output_hook(attempt: &Attempt) -> bool {
    attempt.outcome == Outcome::Error && attempt.errno == Some(nix::errno::Errno::EPERM as i32)
}

/// A flow's verdict and the sentence that explains it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub pass: bool,
    pub text: String,
}

/// Context for judging a flow's attempts.
#[derive(Debug, Clone)]
pub struct Judge<'a> {
    pub flow: &'a Flow,
    /// Every address the node namespace owns (read after the agent synced).
    pub node_addresses: &'a BTreeSet<IpAddr>,
}

impl Judge<'_> {
    /// A REJECT: connection refused, or for UDP from the node itself the EPERM with which
    /// send() reports a datagram that a REJECT rule in the output hook dropped (the ICMP
    /// answer comes after the error).
    fn refused(&self, attempt: &Attempt) -> bool {
        attempt.outcome == Outcome::Refused
            || (self.flow.proto == Proto::Udp
                && self.node_addresses.contains(&self.flow.from)
                && dropped_in_output_hook(attempt))
    }

    /// A DROP: no answer; for UDP from the node itself the EPERM with which send()
    /// reports a datagram that a rule in the output hook dropped.
    fn dropped(&self, attempt: &Attempt) -> bool {
        if self.flow.proto == Proto::Udp && self.node_addresses.contains(&self.flow.from) {
            return dropped_in_output_hook(attempt);
        }
        attempt.outcome == Outcome::Timeout
    }

    pub fn verdict(&self, attempts: &[Attempt]) -> Verdict {
        let seen = summarize(attempts);
        if attempts.is_empty() {
            return fail(self.flow, "no attempt ran".into());
        }
        let problem = match &self.flow.expect {
            Expectation::Backends(set) => self.backend_problem(set, attempts),
            Expectation::Reject => attempts.iter().any(|a| !self.refused(a)).then_some(()),
            Expectation::Drop => attempts.iter().any(|a| !self.dropped(a)).then_some(()),
            Expectation::Local => attempts
                .iter()
                .any(|a| {
                    !(a.outcome == Outcome::Answer && a.answer_kind == Some(AnswerKind::Other))
                })
                .then_some(()),
            Expectation::Untouched => attempts.iter().any(|a| !self.untouched_ok(a)).then_some(()),
        };
        match problem {
            None => Verdict {
                pass: true,
                text: seen,
            },
            Some(()) => fail(self.flow, seen),
        }
    }

    fn untouched_ok(&self, a: &Attempt) -> bool {
        match a.outcome {
            Outcome::Timeout => true,
            Outcome::Answer => {
                a.answer_kind == Some(AnswerKind::Plain) && a.backend == Some(self.flow.to)
            }
            Outcome::Refused | Outcome::Error => false,
        }
    }

    fn backend_problem(&self, set: &BTreeSet<SocketAddr>, attempts: &[Attempt]) -> Option<()> {
        let client = self.flow.from;
        for a in attempts {
            if !a.is_echo() || !a.backend.is_some_and(|b| set.contains(&b)) {
                return Some(());
            }
            let source_ok = match (self.flow.masq, a.seen_source) {
                (None, _) => true,
                (_, None) => false,
                // An address the node owns; for a client on the node that may be its own
                // address: masquerading to itself looks unchanged.
                (Some(true), Some(src)) => self.node_addresses.contains(&src),
                (Some(false), Some(src)) => src == client,
            };
            if !source_ok {
                return Some(());
            }
        }
        let backends: BTreeSet<_> = attempts.iter().filter_map(|a| a.backend).collect();
        (self.flow.sticky && backends.len() > 1).then_some(())
    }
}

fn fail(flow: &Flow, seen: String) -> Verdict {
    let mut expected = flow.expect.to_string();
    if let Some(masq) = flow.masq {
        expected.push_str(&format!(" masq {masq}"));
    }
    if flow.sticky {
        expected.push_str(" sticky");
    }
    Verdict {
        pass: false,
        text: format!("expected {expected}, saw {seen}"),
    }
}

/// `4x echo 10.180.0.1:80 saw 10.0.0.2, 1x refused`, in order of first appearance.
pub fn summarize(attempts: &[Attempt]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for a in attempts {
        // Timeouts differ only by elapsed time; count them as one kind.
        let key = match a.outcome {
            Outcome::Timeout => Attempt {
                elapsed_ms: attempts
                    .iter()
                    .filter(|b| b.outcome == Outcome::Timeout)
                    .map(|b| b.elapsed_ms)
                    .max()
                    .unwrap_or_default(),
                ..a.clone()
            }
            .describe(),
            _ => a.describe(),
        };
        let count = counts.entry(key.clone()).or_insert(0);
        if *count == 0 {
            order.push(key);
        }
        *count += 1;
    }
    order
        .iter()
        .map(|k| format!("{}x {k}", counts[k]))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(expect: Expectation, masq: Option<bool>, sticky: bool) -> Flow {
        Flow {
            index: 1,
            step: 0,
            from: "10.0.0.2".parse().unwrap(),
            to: "172.30.0.41:80".parse().unwrap(),
            proto: Proto::Tcp,
            expect,
            masq,
            sticky,
            modes: None,
            note: String::new(),
        }
    }

    fn backends(list: &[&str]) -> Expectation {
        Expectation::Backends(list.iter().map(|b| b.parse().unwrap()).collect())
    }

    fn echo(backend: &str, source: &str) -> Attempt {
        Attempt::answered(&format!("ECHO {backend} FROM {source}:40000\n"), 1)
    }

    fn judge(flow: &Flow, attempts: &[Attempt]) -> Verdict {
        let node: BTreeSet<IpAddr> = ["192.168.0.2", "127.0.0.1"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        Judge {
            flow,
            node_addresses: &node,
        }
        .verdict(attempts)
    }

    #[test]
    fn parses_answers() {
        let a = echo("10.180.0.1:80", "10.0.0.2");
        assert_eq!(a.answer_kind, Some(AnswerKind::Echo));
        assert_eq!(a.backend, Some("10.180.0.1:80".parse().unwrap()));
        assert_eq!(a.seen_source, Some("10.0.0.2".parse().unwrap()));
        let v6 = Attempt::answered("ECHO [fd00::1]:80 FROM [fd00::2]:5\n", 1);
        assert_eq!(v6.seen_source, Some("fd00::2".parse().unwrap()));
        let p = Attempt::answered("PLAIN 10.0.0.3:80 FROM 10.0.0.2:1\n", 1);
        assert_eq!(
            (p.answer_kind, p.backend),
            (
                Some(AnswerKind::Plain),
                Some("10.0.0.3:80".parse().unwrap())
            )
        );
        let h = Attempt::answered("HTTP/1.1 503 Service Unavailable\r\nx: y\r\n", 1);
        assert_eq!(h.answer_kind, Some(AnswerKind::Other));
        assert_eq!(
            h.first_line.as_deref(),
            Some("HTTP/1.1 503 Service Unavailable")
        );
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<Attempt>(&json).unwrap(), a);
    }

    #[test]
    fn backend_sets_and_masquerade() {
        let f = flow(
            backends(&["10.180.0.1:80", "10.180.2.1:80"]),
            Some(false),
            false,
        );
        let good = [
            echo("10.180.0.1:80", "10.0.0.2"),
            echo("10.180.2.1:80", "10.0.0.2"),
        ];
        let v = judge(&f, &good);
        assert!(v.pass, "{}", v.text);
        assert_eq!(
            v.text,
            "1x echo 10.180.0.1:80 saw 10.0.0.2, 1x echo 10.180.2.1:80 saw 10.0.0.2"
        );

        let wrong_backend = [
            echo("10.180.0.1:80", "10.0.0.2"),
            echo("10.180.0.9:80", "10.0.0.2"),
        ];
        assert!(!judge(&f, &wrong_backend).pass);
        let masqueraded = [echo("10.180.0.1:80", "192.168.0.2")];
        let v = judge(&f, &masqueraded);
        assert!(!v.pass);
        assert_eq!(
            v.text,
            "expected [10.180.0.1:80, 10.180.2.1:80] masq false, saw 1x echo 10.180.0.1:80 saw 192.168.0.2"
        );

        let f = flow(backends(&["10.180.0.1:80"]), Some(true), false);
        assert!(judge(&f, &masqueraded).pass);
        assert!(!judge(&f, &[echo("10.180.0.1:80", "10.0.0.2")]).pass);
        // Not a node address either: an unrelated source is not masquerade.
        assert!(!judge(&f, &[echo("10.180.0.1:80", "10.9.9.9")]).pass);

        let f = flow(backends(&["10.180.0.1:80"]), None, false);
        assert!(judge(&f, &[echo("10.180.0.1:80", "10.9.9.9")]).pass);
        let mut plain = Attempt::answered("PLAIN 10.180.0.1:80", 1);
        plain.backend = Some("10.180.0.1:80".parse().unwrap());
        assert!(!judge(&f, &[plain]).pass);
        assert!(!judge(&f, &[Attempt::new(Outcome::Refused, 1)]).pass);
        assert!(!judge(&f, &[]).pass);
    }

    #[test]
    fn stickiness() {
        let f = flow(backends(&["10.180.0.1:80", "10.180.2.1:80"]), None, true);
        let same = vec![echo("10.180.2.1:80", "10.0.0.2"); 10];
        assert!(judge(&f, &same).pass);
        let mut mixed = same.clone();
        mixed[7] = echo("10.180.0.1:80", "10.0.0.2");
        let v = judge(&f, &mixed);
        assert!(!v.pass);
        assert_eq!(
            v.text,
            "expected [10.180.0.1:80, 10.180.2.1:80] sticky, saw 9x echo 10.180.2.1:80 saw 10.0.0.2, \
             1x echo 10.180.0.1:80 saw 10.0.0.2"
        );
    }

    #[test]
    fn reject_drop_local() {
        let refused = Attempt::new(Outcome::Refused, 2);
        let timeout = Attempt::new(Outcome::Timeout, 1000);
        let error = Attempt {
            errno: Some(1),
            message: Some("Operation not permitted".into()),
            ..Attempt::new(Outcome::Error, 0)
        };
        let http = Attempt::answered("HTTP/1.1 200 OK", 3);

        let reject = flow(Expectation::Reject, None, false);
        assert!(judge(&reject, &[refused.clone(), refused.clone()]).pass);
        assert!(!judge(&reject, &[refused.clone(), timeout.clone()]).pass);
        assert!(!judge(&reject, std::slice::from_ref(&error)).pass);
        let mut udp_from_node = flow(Expectation::Reject, None, false);
        udp_from_node.proto = Proto::Udp;
        assert!(!judge(&udp_from_node, std::slice::from_ref(&error)).pass);
        udp_from_node.from = "192.168.0.2".parse().unwrap();
        assert!(judge(&udp_from_node, std::slice::from_ref(&error)).pass);
        assert!(judge(&udp_from_node, std::slice::from_ref(&refused)).pass);
        assert!(!judge(&udp_from_node, std::slice::from_ref(&timeout)).pass);
        udp_from_node.proto = Proto::Tcp;
        assert!(!judge(&udp_from_node, std::slice::from_ref(&error)).pass);

        let drop = flow(Expectation::Drop, None, false);
        assert!(judge(&drop, std::slice::from_ref(&timeout)).pass);
        let v = judge(&drop, std::slice::from_ref(&error));
        assert!(!v.pass);
        assert_eq!(
            v.text,
            "expected DROP, saw 1x error EPERM (Operation not permitted)"
        );
        assert!(!judge(&drop, std::slice::from_ref(&refused)).pass);
        // From the node, a dropped datagram fails send() with EPERM, and only that.
        let mut udp_drop_from_node = flow(Expectation::Drop, None, false);
        udp_drop_from_node.proto = Proto::Udp;
        udp_drop_from_node.from = "192.168.0.2".parse().unwrap();
        assert!(judge(&udp_drop_from_node, std::slice::from_ref(&error)).pass);
        assert!(!judge(&udp_drop_from_node, std::slice::from_ref(&timeout)).pass);
        assert!(!judge(&udp_drop_from_node, std::slice::from_ref(&refused)).pass);

        let local = flow(Expectation::Local, None, false);
        assert!(judge(&local, std::slice::from_ref(&http)).pass);
        assert!(!judge(&local, &[echo("10.180.0.1:80", "10.0.0.2")]).pass);
        assert!(!judge(&local, &[timeout]).pass);
    }

    #[test]
    fn untouched() {
        let f = flow(Expectation::Untouched, None, false);
        let plain_here = Attempt::answered("PLAIN 172.30.0.41:80 FROM 10.0.0.2:3", 1);
        let plain_elsewhere = Attempt::answered("PLAIN 10.0.0.3:80 FROM 10.0.0.2:3", 1);
        assert!(judge(&f, &[plain_here]).pass);
        assert!(judge(&f, &[Attempt::new(Outcome::Timeout, 1000)]).pass);
        assert!(!judge(&f, &[plain_elsewhere]).pass);
        assert!(!judge(&f, &[echo("172.30.0.41:80", "10.0.0.2")]).pass);
        assert!(!judge(&f, &[Attempt::new(Outcome::Refused, 1)]).pass);
    }

    #[test]
    fn ipv6_backends_and_masquerade() {
        let mut f = flow(
            backends(&["[fd00:10::180:0:1]:80", "[fd00:10::180:2:1]:80"]),
            Some(false),
            false,
        );
        f.from = "fd00:10::2".parse().unwrap();
        f.to = "[fd00:30::41]:80".parse().unwrap();
        let node: BTreeSet<IpAddr> = ["fd00:168::2", "fe80::1", "192.168.0.2"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let judge6 = |f: &Flow, attempts: &[Attempt]| {
            Judge {
                flow: f,
                node_addresses: &node,
            }
            .verdict(attempts)
        };
        let seen_pod = Attempt::answered("ECHO [fd00:10::180:2:1]:80 FROM [fd00:10::2]:41000\n", 1);
        let seen_node =
            Attempt::answered("ECHO [fd00:10::180:0:1]:80 FROM [fd00:168::2]:41000\n", 1);
        // The echo server prints canonical text; the flow may spell the same address
        // differently and still match.
        let other_spelling =
            Attempt::answered("ECHO [FD00:10:0:0:0:180:0:1]:80 FROM [fd00:10:0::2]:1\n", 1);
        let v = judge6(&f, &[seen_pod.clone(), other_spelling]);
        assert!(v.pass, "{}", v.text);
        assert!(!judge6(&f, std::slice::from_ref(&seen_node)).pass);

        f.masq = Some(true);
        assert!(judge6(&f, std::slice::from_ref(&seen_node)).pass);
        assert!(!judge6(&f, std::slice::from_ref(&seen_pod)).pass);
        // An IPv4 node address does not make an IPv6 backend's view of the pod masquerade.
        let v4_mapped = Attempt::answered(
            "ECHO [fd00:10::180:0:1]:80 FROM [::ffff:192.168.0.2]:1\n",
            1,
        );
        assert!(!judge6(&f, &[v4_mapped]).pass);
    }
}
