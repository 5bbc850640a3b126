// SPDX-License-Identifier: Apache-2.0
//! Report lines and totals.

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
};

use super::format::Proto;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        })
    }
}

/// One flow's result: `PASS <scenario> #<n> <from> -> <to>/<proto>: <what happened>`; or a
/// failed check of a whole step (index 0): `FAIL <scenario> step <n>: <what is wrong>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowReport {
    pub status: Status,
    pub scenario: String,
    /// The flow's 1-based index in its file; 0 for a step's check.
    pub index: usize,
    pub from: IpAddr,
    pub to: SocketAddr,
    pub proto: Proto,
    pub text: String,
}

impl FlowReport {
    /// A failed check of step `step` (0: the initial objects) that no single flow owns,
    /// e.g. the IPVS table lacking a virtual server.
    pub fn check(scenario: &str, step: usize, text: String) -> Self {
        Self {
            status: Status::Fail,
            scenario: scenario.to_string(),
            index: 0,
            from: IpAddr::from([0, 0, 0, 0]),
            to: SocketAddr::from(([0, 0, 0, 0], 0)),
            proto: Proto::Tcp,
            text: format!("step {step}: {text}"),
        }
    }
}

impl fmt::Display for FlowReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.index == 0 {
            return write!(f, "{} {} {}", self.status, self.scenario, self.text);
        }
        write!(
            f,
            "{} {} #{} {} -> {}/{}: {}",
            self.status, self.scenario, self.index, self.from, self.to, self.proto, self.text
        )
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Totals {
    pub fn add(&mut self, status: Status) {
        match status {
            Status::Pass => self.passed += 1,
            Status::Fail => self.failed += 1,
            Status::Skip => self.skipped += 1,
        }
    }
}

impl fmt::Display for Totals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_totals() {
        let report = FlowReport {
            status: Status::Fail,
            scenario: "a1-overall".into(),
            index: 5,
            from: "203.0.113.2".parse().unwrap(),
            to: "[fd00::1]:80".parse().unwrap(),
            proto: Proto::Udp,
            text: "expected DROP, saw 1x refused".into(),
        };
        assert_eq!(
            report.to_string(),
            "FAIL a1-overall #5 203.0.113.2 -> [fd00::1]:80/udp: expected DROP, saw 1x refused"
        );
        let mut totals = Totals::default();
        for s in [Status::Pass, Status::Pass, Status::Fail, Status::Skip] {
            totals.add(s);
        }
        assert_eq!(totals.to_string(), "2 passed, 1 failed, 1 skipped");
        let check = FlowReport::check("c1", 2, "ipvsadm -Ln lacks virtual servers [..]".into());
        assert_eq!(check.status, Status::Fail);
        assert_eq!(
            check.to_string(),
            "FAIL c1 step 2: ipvsadm -Ln lacks virtual servers [..]"
        );
    }
}
