// SPDX-License-Identifier: Apache-2.0
//! What a latency run is asked to do: the mode it measures and its options. Below both
//! the run and the node set-up, which read them.

use std::{path::PathBuf, time::Duration};

use super::prober::MAX_CONNECTS_PER_SEC;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyMode {
    Ebpf,
    /// Our agent in iptables mode, its PATH's iptables* being the -legacy variants.
    IptablesLegacy,
}

impl LatencyMode {
    pub fn name(self) -> &'static str {
        match self {
            LatencyMode::Ebpf => "ebpf",
            LatencyMode::IptablesLegacy => "iptables-legacy",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [LatencyMode::Ebpf, LatencyMode::IptablesLegacy]
            .into_iter()
            .find(|m| m.name() == text)
    }

    /// The minSyncPeriod the mode runs with unless told: 1 ms for ebpf (a sync per batch
    /// of events; each costs little. Not 0: upstream's defaulting, which the agent follows,
    /// turns `iptables.minSyncPeriod: 0` into 1 s), upstream's 1 s for iptables.
    pub fn default_min_sync(self) -> Duration {
        match self {
            LatencyMode::Ebpf => Duration::from_millis(1),
            LatencyMode::IptablesLegacy => Duration::from_secs(1),
        }
    }
}

impl LatencyMode {
    /// In iptables mode every probe's SYN walks the nat table's service list (16,000
    /// rules), which costs the node far more than a failed connect in ebpf mode: a smaller
    /// budget keeps the prober from starving the agent on 2 cores.
    pub fn default_probe_budget(self) -> u32 {
        match self {
            LatencyMode::Ebpf => MAX_CONNECTS_PER_SEC,
            LatencyMode::IptablesLegacy => 2_000,
        }
    }
}

#[derive(Debug, Clone)]
pub struct LatencyOptions {
    pub agent_binary: PathBuf,
    pub loadgen_binary: PathBuf,
    pub mode: LatencyMode,
    /// Filler services preloaded (4 endpoints each).
    pub services: u32,
    /// Changes per second, for `duration`.
    pub rate: f64,
    pub duration: Duration,
    /// A change not programmed by then is failed and no longer probed.
    pub give_up: Duration,
    pub min_sync_period: Duration,
    /// The prober's connects per second in all (see [`MAX_CONNECTS_PER_SEC`]).
    pub probe_budget: u32,
    /// How long the agent may take for its first sync.
    pub sync_timeout: Duration,
    pub rep: u32,
    pub verbose: bool,
}

impl LatencyOptions {
    /// 10,000 services, 100 changes/s for 60 s, 10 s bound.
    pub fn full(agent_binary: PathBuf, loadgen_binary: PathBuf, mode: LatencyMode) -> Self {
        LatencyOptions {
            agent_binary,
            loadgen_binary,
            mode,
            services: 10_000,
            rate: 100.0,
            duration: Duration::from_secs(60),
            give_up: Duration::from_secs(10),
            min_sync_period: mode.default_min_sync(),
            probe_budget: mode.default_probe_budget(),
            sync_timeout: Duration::from_secs(180),
            rep: 0,
            verbose: true,
        }
    }

    /// 1,000 services, 20 changes/s for 5 s.
    pub fn quick(agent_binary: PathBuf, loadgen_binary: PathBuf, mode: LatencyMode) -> Self {
        LatencyOptions {
            services: 1_000,
            rate: 20.0,
            duration: Duration::from_secs(5),
            sync_timeout: Duration::from_secs(60),
            ..Self::full(agent_binary, loadgen_binary, mode)
        }
    }

    pub(super) fn total_changes(&self) -> u64 {
        // Whole changes only; the rate and duration are small positive numbers.
        (self.rate * self.duration.as_secs_f64()).round().max(0.0) as u64
    }
}
