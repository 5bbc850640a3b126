// SPDX-License-Identifier: Apache-2.0
//! Which iptables backend to use when both are installed: the one the host's rules are in.
//!
//! iptables 1.8 comes in two backends, legacy (the kernel's x_tables) and nf_tables, and
//! rules written with one are invisible to the other: a proxy that writes its chains with
//! the other backend than the host's firewall and kubelet ends up ordered wrongly against
//! them (or silently bypassed). The agent's image carries both (`iptables-legacy*` and
//! `iptables-nft*`, Debian's `iptables` package), and the host decides, as upstream's
//! kube-proxy image does with kubernetes-sigs/iptables-wrappers:
//!
//! 1. the kubelet (1.17 and later) creates `KUBE-IPTABLES-HINT` and `KUBE-KUBELET-CANARY` in
//!    the mangle table with the host's backend: a declaration of either in nf_tables'
//!    mangle table (IPv4, then IPv6) chooses nf_tables, else one in legacy's tables
//!    chooses legacy. Legacy is dumped whole, never `-t mangle`: naming a legacy table
//!    makes the kernel create it.
//! 2. Without a kubelet chain (a host without a kubelet, or one older than 1.17): the
//!    backend with more rules (`-A` lines, IPv4 and IPv6 together), as the wrapper's
//!    earlier shell version did.
//! 3. Neither tells (no rules, or as many in both): PATH's `iptables`, the image's default
//!    (Debian's default is nf_tables, the wrapper's default too).
//!
//! When only one backend is installed, PATH's `iptables` is used without a look.
//!
//! The choice reads `*-save` outputs only ([`choose`] is a pure function over them, the
//! commands run lazily and in the order above, as the wrapper does). A save that fails (the
//! backend's kernel side is missing) counts as empty. It is made once per network
//! namespace and process: the host's backend does not change under a running agent, and
//! dumping every rule at each `detect` would cost seconds on a large node.

use std::collections::HashMap;
use std::fmt;
use std::os::unix::fs::MetadataExt as _;
use std::sync::{Mutex, OnceLock};

use super::exec::{CommandBackend, ExecError, Variant, run_program};
use super::save;
use crate::model::IpFamily;

impl CommandBackend {
    /// Detects the iptables version and variant from `iptables --version`, of the backend
    /// the host's rules are in when both are installed, else of PATH's `iptables`. (Here
    /// rather than in `exec`, so that the runner does not depend on the choice.)
    pub fn detect() -> Result<Self, ExecError> {
        let (iptables, ip6tables) = commands();
        Self::detect_named(iptables, ip6tables)
    }
}

/// The chains the kubelet creates in the mangle table of the backend it uses.
pub const KUBELET_CHAINS: [&str; 2] = ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];

/// The command names of PATH's iptables, whichever backend they are.
pub const PATH_COMMANDS: (&str, &str) = ("iptables", "ip6tables");

/// The command names of one backend (`-save` and `-restore` are derived from them).
pub fn backend_commands(variant: Variant) -> Option<(&'static str, &'static str)> {
    match variant {
        Variant::Legacy => Some(("iptables-legacy", "ip6tables-legacy")),
        Variant::Nft => Some(("iptables-nft", "ip6tables-nft")),
        Variant::Unknown => None,
    }
}

/// One dump the choice reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dump {
    /// `iptables-nft-save -t mangle` (ip6tables for IPv6).
    NftMangle(IpFamily),
    /// `iptables-legacy-save`, every table.
    LegacyAll(IpFamily),
    /// `iptables-nft-save`, every table.
    NftAll(IpFamily),
}

impl Dump {
    /// The save command of this dump.
    pub fn program(self) -> &'static str {
        match self {
            Dump::NftMangle(IpFamily::V4) | Dump::NftAll(IpFamily::V4) => "iptables-nft-save",
            Dump::NftMangle(IpFamily::V6) | Dump::NftAll(IpFamily::V6) => "ip6tables-nft-save",
            Dump::LegacyAll(IpFamily::V4) => "iptables-legacy-save",
            Dump::LegacyAll(IpFamily::V6) => "ip6tables-legacy-save",
        }
    }

    pub fn args(self) -> &'static [&'static str] {
        match self {
            Dump::NftMangle(_) => &["-t", "mangle"],
            Dump::LegacyAll(_) | Dump::NftAll(_) => &[],
        }
    }
}

/// Why a backend was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// The kubelet's chain is declared in this backend's rules.
    KubeletChain {
        chain: &'static str,
        family: IpFamily,
    },
    /// No kubelet chain in either; this backend has more rules.
    MoreRules { legacy: usize, nft: usize },
}

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Evidence::KubeletChain { chain, family } => {
                let family = match family {
                    IpFamily::V4 => "IPv4",
                    IpFamily::V6 => "IPv6",
                };
                write!(f, "the kubelet's {chain} chain is in its {family} rules")
            }
            Evidence::MoreRules { legacy, nft } => write!(
                f,
                "no kubelet chain in either backend; legacy has {legacy} rules, nf_tables {nft}"
            ),
        }
    }
}

/// The decision over the host's dumps: the backend and why, or `None` when nothing tells
/// them apart (then PATH's `iptables` is kept). `dump` gives one dump's output (empty when
/// the save failed); it is asked only for what the decision still needs, each dump once.
pub fn choose(mut dump: impl FnMut(Dump) -> String) -> Option<(Variant, Evidence)> {
    let mut outputs: HashMap<Dump, String> = HashMap::new();
    let mut get =
        |which: Dump| -> String { outputs.entry(which).or_insert_with(|| dump(which)).clone() };
    let families = [IpFamily::V4, IpFamily::V6];
    for (variant, dump_of) in [
        (Variant::Nft, Dump::NftMangle as fn(IpFamily) -> Dump),
        (Variant::Legacy, Dump::LegacyAll),
    ] {
        for family in families {
            if let Some(chain) = kubelet_chain(&get(dump_of(family))) {
                return Some((variant, Evidence::KubeletChain { chain, family }));
            }
        }
    }
    let count = |get: &mut dyn FnMut(Dump) -> String, dump_of: fn(IpFamily) -> Dump| {
        families
            .iter()
            .map(|family| rule_count(&get(dump_of(*family))))
            .sum::<usize>()
    };
    let legacy = count(&mut get, Dump::LegacyAll);
    let nft = count(&mut get, Dump::NftAll);
    let evidence = Evidence::MoreRules { legacy, nft };
    match legacy.cmp(&nft) {
        std::cmp::Ordering::Greater => Some((Variant::Legacy, evidence)),
        std::cmp::Ordering::Less => Some((Variant::Nft, evidence)),
        std::cmp::Ordering::Equal => None,
    }
}

/// The first kubelet chain declared (`:NAME POLICY [packets:bytes]`) in a save output.
fn kubelet_chain(dump: &str) -> Option<&'static str> {
    save::declared_chains(dump)
        .find_map(|name| KUBELET_CHAINS.into_iter().find(|chain| *chain == name))
}

/// The rules (`-A chain ...` lines) of a save output.
fn rule_count(dump: &str) -> usize {
    save::appended_rules(dump).count()
}

/// Whether a backend's six commands are on PATH.
fn installed(variant: Variant) -> bool {
    let Some((v4, v6)) = backend_commands(variant) else {
        return false;
    };
    [v4, v6].into_iter().all(|command| {
        ["", "-save", "-restore"]
            .into_iter()
            .all(|suffix| which::which(format!("{command}{suffix}")).is_ok())
    })
}

/// A network namespace's identity: the device and inode of its nsfs file.
type NetnsId = (u64, u64);
/// The iptables and ip6tables command names.
pub type Commands = (&'static str, &'static str);

/// The iptables and ip6tables command names the agent uses in the calling thread's network
/// namespace (see the module doc), decided once per namespace and logged with the reason.
pub fn commands() -> Commands {
    static CHOSEN: OnceLock<Mutex<HashMap<NetnsId, Commands>>> = OnceLock::new();
    // The namespace's identity; without it (no /proc), decide every time.
    let netns = std::fs::metadata("/proc/thread-self/ns/net")
        .ok()
        .map(|m| (m.dev(), m.ino()));
    let cache = CHOSEN.get_or_init(Default::default);
    if let Some(key) = netns
        && let Some(chosen) = cache.lock().ok().and_then(|c| c.get(&key).copied())
    {
        return chosen;
    }
    let chosen = decide();
    if let (Some(key), Ok(mut cache)) = (netns, cache.lock()) {
        cache.insert(key, chosen);
    }
    chosen
}

/// [`commands`] without the cache: looks at what is installed and at the host's rules.
pub fn decide() -> Commands {
    if !(installed(Variant::Legacy) && installed(Variant::Nft)) {
        tracing::debug!("one iptables backend installed: using PATH's iptables");
        return PATH_COMMANDS;
    }
    let choice = choose(|dump| {
        run_program(dump.program(), dump.args(), None).unwrap_or_else(|e| {
            tracing::debug!(error = %e, "reading the host's rules: counted as none");
            String::new()
        })
    });
    match choice {
        Some((variant, evidence)) => {
            let names = backend_commands(variant).unwrap_or(PATH_COMMANDS);
            tracing::info!(
                backend = variant.as_str(),
                command = names.0,
                reason = %evidence,
                "iptables backend chosen: the one the host's rules are in"
            );
            names
        }
        None => {
            tracing::info!(
                command = PATH_COMMANDS.0,
                "iptables backend: no kubelet chain and as many rules in legacy as in \
                 nf_tables; using PATH's iptables"
            );
            PATH_COMMANDS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dumps of a host, by command; every one not given is empty. Records which were
    /// read.
    struct Host {
        dumps: Vec<(Dump, String)>,
        read: Vec<Dump>,
    }

    impl Host {
        fn new(dumps: &[(Dump, &str)]) -> Self {
            Self {
                dumps: dumps.iter().map(|(d, s)| (*d, s.to_string())).collect(),
                read: Vec::new(),
            }
        }

        fn choose(&mut self) -> Option<(Variant, Evidence)> {
            choose(|which| {
                self.read.push(which);
                self.dumps
                    .iter()
                    .find(|(d, _)| *d == which)
                    .map(|(_, s)| s.clone())
                    .unwrap_or_default()
            })
        }
    }

    const KUBELET_MANGLE: &str = "\
# Generated by iptables-nft-save v1.8.9 (nf_tables) on Fri Nov 27 10:00:00 2026
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
";

    const FIREWALL: &str = "\
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -i lo -j ACCEPT
-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A FORWARD -j DOCKER-USER
COMMIT
";

    #[test]
    fn a_kubelet_chain_in_nf_tables_chooses_it_without_reading_legacy() {
        let mut host = Host::new(&[
            (Dump::NftMangle(IpFamily::V4), KUBELET_MANGLE),
            (Dump::LegacyAll(IpFamily::V4), FIREWALL),
        ]);
        assert_eq!(
            host.choose(),
            Some((
                Variant::Nft,
                Evidence::KubeletChain {
                    chain: "KUBE-IPTABLES-HINT",
                    family: IpFamily::V4
                }
            ))
        );
        // Legacy is never dumped when nf_tables already answers.
        assert_eq!(host.read, [Dump::NftMangle(IpFamily::V4)]);
    }

    #[test]
    fn a_kubelet_chain_in_legacy_wins_over_more_nf_tables_rules() {
        let legacy = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n";
        let mut host = Host::new(&[
            (Dump::LegacyAll(IpFamily::V6), legacy),
            (Dump::NftAll(IpFamily::V4), FIREWALL),
        ]);
        assert_eq!(
            host.choose(),
            Some((
                Variant::Legacy,
                Evidence::KubeletChain {
                    chain: "KUBE-KUBELET-CANARY",
                    family: IpFamily::V6
                }
            ))
        );
        // Upstream's order: nf_tables' mangle (v4, v6), then legacy whole (v4, v6).
        assert_eq!(
            host.read,
            [
                Dump::NftMangle(IpFamily::V4),
                Dump::NftMangle(IpFamily::V6),
                Dump::LegacyAll(IpFamily::V4),
                Dump::LegacyAll(IpFamily::V6),
            ]
        );
    }

    #[test]
    fn the_kubelet_chain_must_be_declared_not_just_mentioned() {
        // A rule or comment naming the chain, or a longer name, is not the kubelet's chain.
        let mentions = "*mangle\n:KUBE-IPTABLES-HINT-OLD - [0:0]\n\
                        -A OUTPUT -m comment --comment \":KUBE-KUBELET-CANARY\" -j ACCEPT\n\
                        # :KUBE-IPTABLES-HINT\nCOMMIT\n";
        let mut host = Host::new(&[
            (Dump::NftMangle(IpFamily::V4), mentions),
            (Dump::NftAll(IpFamily::V4), mentions),
        ]);
        // No kubelet chain: the count decides (its one rule against none in legacy).
        assert_eq!(
            host.choose(),
            Some((Variant::Nft, Evidence::MoreRules { legacy: 0, nft: 1 }))
        );
    }

    #[test]
    fn without_kubelet_chains_the_backend_with_more_rules_wins() {
        let mut host = Host::new(&[
            (Dump::LegacyAll(IpFamily::V4), FIREWALL),
            (Dump::LegacyAll(IpFamily::V6), FIREWALL),
            (Dump::NftAll(IpFamily::V4), FIREWALL),
        ]);
        assert_eq!(
            host.choose(),
            Some((Variant::Legacy, Evidence::MoreRules { legacy: 6, nft: 3 }))
        );
        let mut host = Host::new(&[(Dump::NftAll(IpFamily::V6), FIREWALL)]);
        assert_eq!(
            host.choose(),
            Some((Variant::Nft, Evidence::MoreRules { legacy: 0, nft: 3 }))
        );
        // Each dump is read once, though the legacy ones serve both steps.
        assert_eq!(host.read.len(), 6);
    }

    #[test]
    fn nothing_to_tell_them_apart_keeps_paths_iptables() {
        assert_eq!(Host::new(&[]).choose(), None);
        let mut host = Host::new(&[
            (Dump::LegacyAll(IpFamily::V4), FIREWALL),
            (Dump::NftAll(IpFamily::V6), FIREWALL),
        ]);
        assert_eq!(host.choose(), None);
    }

    #[test]
    fn the_evidence_reads_as_a_reason() {
        let chain = Evidence::KubeletChain {
            chain: "KUBE-IPTABLES-HINT",
            family: IpFamily::V6,
        };
        assert_eq!(
            chain.to_string(),
            "the kubelet's KUBE-IPTABLES-HINT chain is in its IPv6 rules"
        );
        assert_eq!(
            Evidence::MoreRules { legacy: 2, nft: 40 }.to_string(),
            "no kubelet chain in either backend; legacy has 2 rules, nf_tables 40"
        );
    }

    #[test]
    fn dumps_name_fixed_commands() {
        assert_eq!(
            Dump::NftMangle(IpFamily::V6).program(),
            "ip6tables-nft-save"
        );
        assert_eq!(Dump::NftMangle(IpFamily::V4).args(), ["-t", "mangle"]);
        // Legacy is never asked for one table (that would create it).
        assert!(Dump::LegacyAll(IpFamily::V4).args().is_empty());
        assert_eq!(
            backend_commands(Variant::Legacy),
            Some(("iptables-legacy", "ip6tables-legacy"))
        );
        assert_eq!(backend_commands(Variant::Unknown), None);
    }
}
