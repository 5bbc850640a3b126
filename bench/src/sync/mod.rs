// SPDX-License-Identifier: Apache-2.0
//! The sync benchmark: how long a proxier takes to program N services × E endpoints
//! (a cold full sync) and to apply a one-service change (a partial sync), against the
//! cheapest way to put the same rules into the kernel.
//!
//! `iptables` mode: the agent's iptables proxier (its own code, run in this process on a
//! thread inside a fresh network namespace, driving the real `iptables-restore`) against a
//! raw `iptables-restore` of the very text the proxier restored, into a second fresh
//! namespace holding the same rules. The text is known before either side runs (a twin
//! proxier over a backend that only records computes it), so the two sides alternate
//! which goes first; afterwards the proxier's actual input is checked to be that text.
//! The host's own tables are never touched.

pub mod measure;
pub mod model;
pub mod results;
pub mod rss;
pub mod sides;
pub mod suite;

use std::{collections::HashSet, io::Write as _, process::Stdio};

use proxy_agent::{
    model::IpFamily,
    proxier::{
        Proxier, StaleConntrack,
        conntrack::NetlinkConntrack,
        iptables::{
            CommandBackend, ExecError, IptablesBackend, IptablesConfig, IptablesProxier,
            RuleOptions,
        },
        netfilter::{Table, Variant},
    },
};

use self::{
    measure::{Cost, in_netns_scoped, measure},
    model::SyncWorld,
    results::{Step, SyncResults, SyncSample},
};
use super::{
    error::{Error, Result},
    net,
    results::Environment,
    signals,
};
use ::tests::scenario::netns;

/// The dataplane modes the benchmark knows; only those built can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    Iptables,
}

impl SyncMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SyncMode::Iptables => "iptables",
        }
    }

    /// The baseline's name in the results.
    pub fn baseline(self) -> &'static str {
        match self {
            SyncMode::Iptables => "raw-iptables-restore",
        }
    }
}

impl std::str::FromStr for SyncMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "iptables" => Ok(SyncMode::Iptables),
            "ebpf" | "ipvs" | "nftables" => Err(format!(
                "the sync benchmark does not measure {s} mode yet (only iptables)"
            )),
            other => Err(format!("unknown mode {other:?}")),
        }
    }
}

/// Which iptables commands both sides run: PATH's `iptables*` (whatever variant the host
/// chose, as the agent does), or a named variant's `iptables-legacy*` / `iptables-nft*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IptablesCommands {
    #[default]
    Path,
    Legacy,
    Nft,
}

impl IptablesCommands {
    /// The IPv4 and IPv6 command names.
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            IptablesCommands::Path => ("iptables", "ip6tables"),
            IptablesCommands::Legacy => ("iptables-legacy", "ip6tables-legacy"),
            IptablesCommands::Nft => ("iptables-nft", "ip6tables-nft"),
        }
    }
}

impl std::str::FromStr for IptablesCommands {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "path" => Ok(IptablesCommands::Path),
            "legacy" => Ok(IptablesCommands::Legacy),
            "nft" => Ok(IptablesCommands::Nft),
            other => Err(format!(
                "unknown iptables variant {other:?} (path, legacy, nft)"
            )),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SyncOptions {
    pub mode: SyncMode,
    pub iptables: IptablesCommands,
    pub service_counts: Vec<u32>,
    pub endpoints_per_service: u8,
    pub reps: u32,
    /// One-service changes measured per rep.
    pub partial_changes: u32,
    /// Progress lines go to stderr.
    pub verbose: bool,
}

impl SyncOptions {
    /// 5 reps at 1,000 and 10,000 services × 4 endpoints, 5 one-service changes each.
    pub fn full(mode: SyncMode) -> Self {
        SyncOptions {
            mode,
            iptables: IptablesCommands::Path,
            service_counts: vec![1_000, 10_000],
            endpoints_per_service: 4,
            reps: 5,
            partial_changes: 5,
            verbose: true,
        }
    }

    /// The slice the test suite runs: 1 rep at 1,000 services, 2 changes.
    pub fn quick(mode: SyncMode) -> Self {
        SyncOptions {
            service_counts: vec![1_000],
            reps: 1,
            partial_changes: 2,
            ..Self::full(mode)
        }
    }
}

fn progress(opts: &SyncOptions, line: &str) {
    if opts.verbose {
        eprintln!("==> {line}");
    }
}

/// Accepts every input and shows an empty kernel: the twin that computes, before the
/// real proxier runs, the input a fresh namespace gets.
struct RecordingBackend;

impl IptablesBackend for RecordingBackend {
    fn restore(&mut self, _: IpFamily, _: &str) -> Result<(), ExecError> {
        Ok(())
    }
    fn save(&mut self, _: IpFamily, _: Table) -> Result<String, ExecError> {
        Ok(String::new())
    }
    fn list_chain(&mut self, _: IpFamily, _: Table, _: &str) -> Result<Option<String>, ExecError> {
        Ok(Some(String::new()))
    }
}

/// The arguments the proxier's backend gives iptables-restore (iptables ≥ 1.6.2 waits for
/// the xtables lock itself), so the baseline pays for the same options.
const RESTORE_ARGS: [&str; 6] = ["-w", "5", "-W", "100000", "--noflush", "--counters"];

/// `<iptables>-restore` of `input` in the calling thread's namespace.
fn raw_restore(iptables: &str, input: &str) -> Result<()> {
    let mut child = std::process::Command::new(format!("{iptables}-restore"))
        .args(RESTORE_ARGS)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Error::io("starting iptables-restore"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(Error::io("writing to iptables-restore"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(Error::io("waiting for iptables-restore"))?;
    if !out.status.success() {
        return Err(Error::Setup(format!(
            "raw iptables-restore failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

fn proxier_over(backend: Box<dyn IptablesBackend>, options: RuleOptions) -> IptablesProxier {
    IptablesProxier::with_parts(
        backend,
        Box::new(NetlinkConntrack::new()),
        options,
        IptablesConfig::default(),
    )
}

/// Two fresh namespaces (the proxier's and the baseline's), deleted on drop.
struct NamespacePair {
    ours: String,
    raw: String,
}

impl NamespacePair {
    fn create(id: &str, rep: u32) -> Result<Self> {
        let pair = NamespacePair {
            ours: format!("{id}-s{rep}o"),
            raw: format!("{id}-s{rep}r"),
        };
        netns::add_netns(&pair.ours)?;
        if let Err(err) = netns::add_netns(&pair.raw) {
            let _ = netns::delete_netns(&pair.ours);
            return Err(err.into());
        }
        Ok(pair)
    }
}

impl Drop for NamespacePair {
    fn drop(&mut self) {
        for ns in [&self.ours, &self.raw] {
            if let Err(err) = netns::delete_netns(ns) {
                eprintln!("cleanup: {err}");
            }
        }
    }
}

/// One step on both sides, in the given order; returns (ours, raw).
fn paired(
    ours_first: bool,
    mut ours: impl FnMut() -> Result<Cost>,
    mut raw: impl FnMut() -> Result<Cost>,
) -> Result<(Cost, Cost)> {
    if ours_first {
        let o = ours()?;
        signals::check()?;
        Ok((o, raw()?))
    } else {
        let r = raw()?;
        signals::check()?;
        Ok((ours()?, r))
    }
}

/// Runs the benchmark and returns its samples. Needs root and iptables.
pub fn run_sync(opts: &SyncOptions) -> Result<SyncResults> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err(Error::Setup(
            "the sync benchmark needs root (network namespaces, iptables)".into(),
        ));
    }
    if opts.reps == 0 || opts.service_counts.is_empty() {
        return Err(Error::Setup(
            "need at least one rep and one service count".into(),
        ));
    }
    for line in net::cleanup_stale()? {
        progress(opts, &format!("removed stale {line}"));
    }
    let (v4_command, v6_command) = opts.iptables.names();
    let detect = || {
        CommandBackend::detect_named(v4_command, v6_command)
            .map_err(|err| Error::Setup(format!("{v4_command} is not usable: {err}")))
    };
    let backend = detect()?;
    let variant = match backend.version.variant {
        Variant::Nft => "nft",
        Variant::Legacy => "legacy",
        Variant::Unknown => "unknown",
    };
    if !backend.version.has_random_fully() {
        return Err(Error::Setup(
            "iptables older than 1.6.2: the baseline's restore options would differ".into(),
        ));
    }
    let options = RuleOptions {
        random_fully: backend.version.has_random_fully(),
        conntrack_tcp_be_liberal: false,
        // The baseline (kube-proxy-shaped rules) counts nothing with nfacct either.
        ..RuleOptions::default()
    };
    let env = Environment::detect();
    let id = net::new_run_id();
    let mut counts = opts.service_counts.clone();
    counts.sort_unstable();
    counts.dedup();
    let mut samples = Vec::new();
    let mut input_bytes = Vec::new();
    let none = HashSet::new();
    let stale = StaleConntrack::default();
    for &services in &counts {
        signals::check()?;
        progress(
            opts,
            &format!(
                "building the model: {services} services x {} endpoints",
                opts.endpoints_per_service
            ),
        );
        let mut world = SyncWorld::new(services, opts.endpoints_per_service);
        for rep in 0..opts.reps {
            signals::check()?;
            let pair = NamespacePair::create(&id, rep)?;
            let ours_path = netns::netns_path(&pair.ours);
            let raw_path = netns::netns_path(&pair.raw);
            let mut twin = proxier_over(Box::new(RecordingBackend), options);
            let mut proxier = proxier_over(Box::new(detect()?), options);

            // Cold full sync.
            let (generated, generation) =
                measure(|| twin.sync(&world.request(true, &none, &stale)));
            generated.map_err(|err| Error::Setup(format!("generating the rules: {err}")))?;
            progress(
                opts,
                &format!(
                    "N={services} rep {rep} generating the full sync's rules alone (no kernel): {:.0} ms",
                    ms(generation.wall)
                ),
            );
            let text = twin
                .last_restore_input(IpFamily::V4)
                .unwrap_or("")
                .to_string();
            let full = paired(
                rep % 2 == 1,
                || {
                    let (synced, cost) = in_netns_scoped(&ours_path, || {
                        measure(|| proxier.sync(&world.request(true, &none, &stale)))
                    })?;
                    synced.map_err(|err| Error::Setup(format!("full sync: {err}")))?;
                    Ok(cost)
                },
                || {
                    let (restored, cost) =
                        in_netns_scoped(&raw_path, || measure(|| raw_restore(v4_command, &text)))?;
                    restored?;
                    Ok(cost)
                },
            )?;
            check_same_input(&proxier, &text, "full sync")?;
            input_bytes.push((services, Step::Full, text.len()));
            progress(
                opts,
                &format!(
                    "N={services} rep {rep} full sync: ours {:.0} ms (cpu {:.0} ms), raw {:.0} ms (cpu {:.0} ms)",
                    ms(full.0.wall),
                    ms(full.0.cpu()),
                    ms(full.1.wall),
                    ms(full.1.cpu())
                ),
            );
            samples.push(SyncSample {
                services,
                rep,
                step: Step::Full,
                ours: full.0,
                raw: full.1,
            });

            // One-service changes.
            for k in 0..opts.partial_changes {
                signals::check()?;
                let index = world.changed_service(rep * opts.partial_changes + k);
                let changed = world.toggle_one_endpoint(index);
                twin.sync(&world.request(false, &changed, &stale))
                    .map_err(|err| Error::Setup(format!("generating the rules: {err}")))?;
                let text = twin
                    .last_restore_input(IpFamily::V4)
                    .unwrap_or("")
                    .to_string();
                let partial = paired(
                    (rep + k) % 2 == 0,
                    || {
                        let (synced, cost) = in_netns_scoped(&ours_path, || {
                            measure(|| proxier.sync(&world.request(false, &changed, &stale)))
                        })?;
                        synced.map_err(|err| Error::Setup(format!("partial sync: {err}")))?;
                        Ok(cost)
                    },
                    || {
                        let (restored, cost) = in_netns_scoped(&raw_path, || {
                            measure(|| raw_restore(v4_command, &text))
                        })?;
                        restored?;
                        Ok(cost)
                    },
                )?;
                check_same_input(&proxier, &text, "partial sync")?;
                if rep == 0 && k == 0 {
                    input_bytes.push((services, Step::Partial(0), text.len()));
                }
                progress(
                    opts,
                    &format!(
                        "N={services} rep {rep} change {k}: ours {:.1} ms (cpu {:.1} ms), raw {:.1} ms (cpu {:.1} ms)",
                        ms(partial.0.wall),
                        ms(partial.0.cpu()),
                        ms(partial.1.wall),
                        ms(partial.1.cpu())
                    ),
                );
                samples.push(SyncSample {
                    services,
                    rep,
                    step: Step::Partial(k),
                    ours: partial.0,
                    raw: partial.1,
                });
            }
            drop(pair);
        }
    }
    Ok(SyncResults {
        run_id: id,
        env,
        mode: opts.mode,
        variant: variant.to_string(),
        endpoints_per_service: opts.endpoints_per_service,
        input_bytes,
        samples,
    })
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The proxier must have restored exactly the baseline's text, or the comparison is void.
fn check_same_input(proxier: &IptablesProxier, expected: &str, what: &str) -> Result<()> {
    let actual = proxier.last_restore_input(IpFamily::V4).unwrap_or("");
    if actual != expected {
        return Err(Error::Setup(format!(
            "{what}: the proxier restored {} bytes, not the {} bytes the baseline restored",
            actual.len(),
            expected.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::results::Side;

    #[test]
    fn modes_parse_and_name_their_baseline() {
        assert_eq!("iptables".parse::<SyncMode>(), Ok(SyncMode::Iptables));
        assert!(
            "ebpf"
                .parse::<SyncMode>()
                .unwrap_err()
                .contains("not measure")
        );
        assert!("bogus".parse::<SyncMode>().is_err());
        assert_eq!(SyncMode::Iptables.baseline(), "raw-iptables-restore");
    }

    /// The quick slice, as the test suite runs it: it must measure a full sync and the
    /// changes against the baseline, and leave no namespace behind. Speed is not judged.
    #[test]
    fn quick_sync_bench_measures_both_sides_and_cleans_up() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("SKIP quick sync bench: needs root");
            return;
        }
        let mut opts = SyncOptions::quick(SyncMode::Iptables);
        opts.verbose = false;
        let results = run_sync(&opts).expect("quick sync bench");
        assert_eq!(results.samples.len(), 1 + 2);
        assert_eq!(results.samples[0].step, Step::Full);
        for s in &results.samples {
            assert_eq!(s.services, 1_000);
            for side in [Side::Ours, Side::Baseline] {
                let cost = s.cost(side);
                assert!(cost.wall > std::time::Duration::ZERO, "{s:?}");
                assert!(cost.cpu_children > std::time::Duration::ZERO, "{s:?}");
            }
        }
        let rows = results.csv_rows();
        assert!(rows.iter().any(|r| r.contains(",full_sync_wall,")));
        assert!(rows.iter().any(|r| r.contains(",partial_sync_cpu,")));
        assert!(results.input_bytes.iter().all(|(_, _, b)| *b > 0));
        let left = net::leftovers(&results.run_id).unwrap();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}
