// SPDX-License-Identifier: Apache-2.0
//! The sides of the sync suite: each puts the same cluster into its own fresh network
//! namespace and follows the same steps (a cold full sync, then one change at a time),
//! measured one step at a time on a thread inside that namespace.
//!
//! Ours are the agent's own proxiers run in this process, as the agent runs them: `ebpf`
//! (loading and attaching the programs is part of its cold full sync; maps sized for the
//! cluster), `iptables` (the proxier over iptables-legacy: the nft backend of iptables
//! 1.8.9 does not restore 10,000 services in minutes) and `ipvs-fallback` (ipvs requested
//! on a kernel without IPVS: the agent's capability probe, then the iptables proxier it
//! falls back to) and `nftables` (the nftables proxier: one `nft -f -` transaction per
//! sync, the whole table first, only the changed services' chains and elements after). The
//! baselines are the raw tools fed rules shaped like upstream kube-proxy's
//! ([`shaped`](crate::shaped)): `kube-proxy-iptables` (`iptables-legacy-restore`) and
//! `kube-proxy-nft` (`nft -f`).

use std::{collections::HashSet, net::SocketAddrV4, path::PathBuf};

use proxy_agent::{
    model::NamespacedName,
    proxier::{
        Proxier, StaleConntrack, SyncStats,
        conntrack::NetlinkConntrack,
        ebpf::{EbpfProxier, LoadOptions},
        iptables::{CommandBackend, IptablesConfig, IptablesProxier, RuleOptions},
        nftables::{NftCommand, NftablesProxier},
    },
};

use super::{
    measure::{Cost, in_netns_scoped, measure},
    model::{self, SyncWorld},
    rss::{PeakMark, run_with_input},
};
use ::tests::scenario::netns;

use crate::{
    error::{Error, Result},
    net,
    shaped::{ShapedOptions, ShapedService, iptables_full, iptables_partial, nft_full, nft_update},
};

/// The steps of a rep, in order; each side applies them one after the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// Everything into an empty namespace (ebpf: the programs loaded and attached too).
    Full,
    /// One new service with its endpoints.
    AddService,
    /// One endpoint of a service goes (4 → 3).
    RemoveEndpoint,
    /// One service scales from 4 to 40 endpoints.
    ScaleUp,
}

impl StepKind {
    pub const ALL: [StepKind; 4] = [
        StepKind::Full,
        StepKind::AddService,
        StepKind::RemoveEndpoint,
        StepKind::ScaleUp,
    ];

    /// The partial changes, in the order the steps take them.
    pub const CHANGES: [StepKind; 3] = [
        StepKind::AddService,
        StepKind::RemoveEndpoint,
        StepKind::ScaleUp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Full => "full_sync",
            StepKind::AddService => "add_service",
            StepKind::RemoveEndpoint => "remove_endpoint",
            StepKind::ScaleUp => "scale_4_to_40",
        }
    }
}

/// One step as every side sees it: the world after the change, and what changed.
pub struct Step<'a> {
    pub kind: StepKind,
    pub world: &'a SyncWorld,
    /// The services the model reports changed (empty for the full sync).
    pub changed: &'a HashSet<NamespacedName>,
}

/// What one step cost a side.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepCost {
    pub cost: Cost,
    /// In-process sides: how far this process's peak resident set rose during the step;
    /// raw tools: the tool's own peak resident set.
    pub peak_rss_kib: u64,
}

/// A side of the comparison.
pub trait SyncSide {
    fn name(&self) -> &'static str;
    /// Whether its rows are a baseline's.
    fn is_baseline(&self) -> bool;
    fn apply(&mut self, step: &Step<'_>) -> Result<StepCost>;
}

/// A fresh namespace of one side and rep, deleted on drop.
pub struct SideNamespace {
    name: String,
    path: PathBuf,
}

impl SideNamespace {
    pub fn create(id: &str, rep: u32, tag: &str) -> Result<Self> {
        let name = format!("{id}-s{rep}{tag}");
        netns::add_netns(&name)?;
        let path = netns::netns_path(&name);
        Ok(SideNamespace { name, path })
    }

    /// Measures `body` on a thread inside the namespace, with the process's peak memory.
    fn measure<T: Send>(&self, body: impl FnOnce() -> T + Send) -> Result<(T, StepCost)> {
        in_netns_scoped(&self.path, || {
            let mark = PeakMark::now();
            let (out, cost) = measure(body);
            (
                out,
                StepCost {
                    cost,
                    peak_rss_kib: mark.growth_kib(),
                },
            )
        })
    }
}

impl Drop for SideNamespace {
    fn drop(&mut self) {
        if let Err(err) = netns::delete_netns(&self.name) {
            eprintln!("cleanup: {err}");
        }
    }
}

/// The iptables commands of ours and of the iptables baseline.
pub const IPTABLES_LEGACY: (&str, &str) = ("iptables-legacy", "ip6tables-legacy");

fn legacy_backend() -> Result<CommandBackend> {
    CommandBackend::detect_named(IPTABLES_LEGACY.0, IPTABLES_LEGACY.1)
        .map_err(|err| Error::Setup(format!("{} is not usable: {err}", IPTABLES_LEGACY.0)))
}

/// One step of one of our proxiers, measured on a thread in `ns`: the proxier in `slot`
/// syncs; when there is none yet (the cold full sync), `start` makes it first, and that is
/// part of the step's cost.
fn sync_step<P: Proxier + Send>(
    side: &str,
    ns: &SideNamespace,
    slot: &mut Option<P>,
    step: &Step<'_>,
    start: impl FnOnce() -> Result<P, String> + Send,
) -> Result<StepCost> {
    let stale = StaleConntrack::default();
    let request = step
        .world
        .request(step.kind == StepKind::Full, step.changed, &stale);
    let (synced, cost) = ns.measure(|| {
        if slot.is_none() {
            *slot = Some(start()?);
        }
        let proxier = slot.as_mut().ok_or_else(|| "no proxier".to_string())?;
        proxier.sync(&request).map_err(|e| e.to_string())
    })?;
    check_synced(side, step.kind, synced)?;
    Ok(cost)
}

fn check_synced(side: &str, kind: StepKind, synced: Result<SyncStats, String>) -> Result<()> {
    let stats = synced.map_err(|err| Error::Setup(format!("{side} {}: {err}", kind.as_str())))?;
    if stats.not_programmed > 0 {
        return Err(Error::Setup(format!(
            "{side} {}: {} services not programmed (maps full: {:?})",
            kind.as_str(),
            stats.not_programmed,
            stats.full_maps
        )));
    }
    Ok(())
}

/// The agent's iptables proxier over iptables-legacy; `probe_ipvs` makes it the ipvs
/// mode's fallback (the probe is part of its cold full sync).
pub struct IptablesSide {
    ns: SideNamespace,
    proxier: Option<IptablesProxier>,
    probe_ipvs: bool,
}

impl IptablesSide {
    pub fn new(id: &str, rep: u32, probe_ipvs: bool) -> Result<Self> {
        // A kernel with IPVS would run the ipvs proxier, not this one.
        if probe_ipvs && ipvs_available() {
            return Err(Error::Setup(
                "this kernel has IPVS: ipvs mode would not fall back (measure it in the VM)".into(),
            ));
        }
        Ok(IptablesSide {
            ns: SideNamespace::create(id, rep, if probe_ipvs { "v" } else { "i" })?,
            proxier: None,
            probe_ipvs,
        })
    }
}

impl SyncSide for IptablesSide {
    fn name(&self) -> &'static str {
        if self.probe_ipvs {
            "ipvs-fallback"
        } else {
            "iptables"
        }
    }

    fn is_baseline(&self) -> bool {
        false
    }

    fn apply(&mut self, step: &Step<'_>) -> Result<StepCost> {
        let probe_ipvs = self.probe_ipvs;
        sync_step(self.name(), &self.ns, &mut self.proxier, step, || {
            if probe_ipvs && ipvs_available() {
                return Err("IPVS became available".to_string());
            }
            let backend = legacy_backend().map_err(|e| e.to_string())?;
            let options = RuleOptions {
                random_fully: backend.version.has_random_fully(),
                conntrack_tcp_be_liberal: false,
                // The baseline (kube-proxy-shaped rules) counts nothing with nfacct either.
                ..RuleOptions::default()
            };
            Ok(IptablesProxier::with_parts(
                Box::new(backend),
                Box::new(NetlinkConntrack::new()),
                options,
                IptablesConfig::default(),
            ))
        })
    }
}

/// The agent's nftables proxier over `nft` on PATH, as the agent runs it: its first sync
/// lists the table's chains and loads the whole `kube-proxy` table in one transaction, the
/// later ones write only the changed services' chains and map elements.
pub struct NftablesSide {
    ns: SideNamespace,
    proxier: Option<NftablesProxier>,
}

impl NftablesSide {
    pub fn new(id: &str, rep: u32) -> Result<Self> {
        if let Some(reason) = nftables_unavailable() {
            return Err(Error::Setup(format!("nftables mode cannot run: {reason}")));
        }
        Ok(NftablesSide {
            ns: SideNamespace::create(id, rep, "t")?,
            proxier: None,
        })
    }
}

impl SyncSide for NftablesSide {
    fn name(&self) -> &'static str {
        "nftables"
    }

    fn is_baseline(&self) -> bool {
        false
    }

    fn apply(&mut self, step: &Step<'_>) -> Result<StepCost> {
        sync_step("nftables", &self.ns, &mut self.proxier, step, || {
            Ok(NftablesProxier::new(
                Box::new(NftCommand),
                Box::new(NetlinkConntrack::new()),
            ))
        })
    }
}

/// The agent's ebpf proxier: programs loaded, pinned under the run's bpffs directory and
/// attached to a cgroup of the run's own (nothing runs in it), maps sized for the cluster.
pub struct EbpfSide {
    ns: SideNamespace,
    bpffs_root: PathBuf,
    cgroup: PathBuf,
    map_sizes: proxy_agent::proxier::ebpf::MapSizes,
    proxier: Option<EbpfProxier>,
}

impl EbpfSide {
    /// Maps with room for `services` services (one more is added) of up to
    /// `max_endpoints` endpoints.
    pub fn new(id: &str, rep: u32, services: u32, max_endpoints: u32) -> Result<Self> {
        if let Some(reason) = proxy_agent::ebpf_object::unavailable_reason() {
            return Err(Error::Setup(format!("ebpf mode cannot run: {reason}")));
        }
        let name = format!("{id}-s{rep}e");
        let cgroup = netns::cgroup2_root()?.join(&name);
        std::fs::create_dir_all(&cgroup)
            .map_err(Error::io(format!("creating {}", cgroup.display())))?;
        let ns = SideNamespace::create(id, rep, "e")?;
        Ok(EbpfSide {
            ns,
            bpffs_root: net::bpffs_root(&name),
            cgroup,
            map_sizes: map_sizes_for(services + 1, max_endpoints),
            proxier: None,
        })
    }
}

/// Map sizes for `services` services × up to `max_endpoints` endpoints (one service at
/// the most, the rest at 4), with room to spare.
pub fn map_sizes_for(services: u32, max_endpoints: u32) -> proxy_agent::proxier::ebpf::MapSizes {
    let mut sizes = proxy_agent::proxier::ebpf::MapSizes::default();
    // A service takes a frontend slot, one per backend and a wildcard entry for its
    // ClusterIP (6 at 4 endpoints); room for one more each.
    let slots = services * 7 + max_endpoints + 1024;
    sizes.services = sizes.services.max(slots);
    sizes.backends = sizes.backends.max(services * 4 + max_endpoints + 1024);
    sizes.rev_nat = sizes.rev_nat.max(services + 1024);
    sizes
}

impl SyncSide for EbpfSide {
    fn name(&self) -> &'static str {
        "ebpf"
    }

    fn is_baseline(&self) -> bool {
        false
    }

    fn apply(&mut self, step: &Step<'_>) -> Result<StepCost> {
        let opts = LoadOptions {
            bpffs_root: self.bpffs_root.clone(),
            cgroup: self.cgroup.clone(),
            map_sizes: self.map_sizes,
            devices: Vec::new(),
            xdp: proxy_agent::config::XdpMode::Off,
            maglev_table_size: proxy_common::maglev::DEFAULT_TABLE_SIZE,
            pod_egress: false,
        };
        let masq = step.world.node.primary_ips.v4;
        sync_step("ebpf", &self.ns, &mut self.proxier, step, || {
            let cookie = proxy_agent::sys::current_netns_cookie()
                .map_err(|e| format!("netns cookie: {e}"))?;
            let mut config = proxy_common::LbConfig {
                host_netns_cookie: cookie,
                ..Default::default()
            };
            if let Some(std::net::IpAddr::V4(ip)) = masq {
                config.masq4 = u32::from_ne_bytes(ip.octets());
            }
            EbpfProxier::start(&opts, config, Default::default()).map_err(|e| e.to_string())
        })
    }
}

impl Drop for EbpfSide {
    fn drop(&mut self) {
        // The links pinned under the root hold the programs attached: unpin, then the
        // cgroup can go.
        self.proxier = None;
        if let Err(err) = proxy_agent::proxier::ebpf::unpin_all(&self.bpffs_root) {
            eprintln!("cleanup: unpinning {}: {err}", self.bpffs_root.display());
        }
        let _ = std::fs::remove_dir_all(&self.bpffs_root);
        if let Err(err) = netns::remove_cgroup(&self.cgroup) {
            eprintln!("cleanup: {err}");
        }
    }
}

/// A raw tool fed text on stdin, measured with its own peak memory.
fn raw_step(ns: &SideNamespace, program: &str, args: &[&str], text: &str) -> Result<StepCost> {
    let (kib, mut cost) = ns.measure(|| run_with_input(program, args, text))?;
    cost.peak_rss_kib = kib?;
    Ok(cost)
}

/// The world's services as the shaped-rule generators take them: the same ClusterIPs,
/// ports and endpoints the agent's model holds, in index order.
pub fn shaped_services(world: &SyncWorld) -> Vec<ShapedService> {
    (0..world.service_count)
        .map(|index| {
            let service = model::service_name(index);
            ShapedService {
                namespace: service.namespace().to_owned(),
                name: service.name().to_owned(),
                port_name: "p".into(),
                cluster_ip: match model::cluster_ip(index) {
                    std::net::IpAddr::V4(ip) => ip,
                    std::net::IpAddr::V6(_) => std::net::Ipv4Addr::UNSPECIFIED,
                },
                port: model::SERVICE_PORT,
                endpoints: (0..world.endpoints_of(index))
                    .filter_map(|slot| match model::endpoint_ip(index, slot) {
                        std::net::IpAddr::V4(ip) => Some(SocketAddrV4::new(ip, model::TARGET_PORT)),
                        std::net::IpAddr::V6(_) => None,
                    })
                    .collect(),
            }
        })
        .collect()
}

fn shaped_options() -> ShapedOptions {
    ShapedOptions {
        cluster_cidr: model::CLUSTER_CIDR.parse().ok(),
    }
}

/// The restore options the agent's backend passes (iptables ≥ 1.6.2 waits for the
/// xtables lock itself), so the baseline pays for the same.
const RESTORE_ARGS: [&str; 6] = ["-w", "5", "-W", "100000", "--noflush", "--counters"];

/// Which raw tool a baseline feeds, and the rules it is fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapedTool {
    /// `iptables-legacy-restore` of the nat table shaped like upstream kube-proxy's
    /// iptables mode: the whole table first, then upstream's partial restores.
    IptablesRestore,
    /// `nft -f` of the table shaped like upstream kube-proxy's nftables mode: the whole
    /// table first, then upstream's incremental transactions.
    Nft,
}

/// A baseline: a raw tool fed rules shaped like upstream kube-proxy's.
pub struct ShapedSide {
    tool: ShapedTool,
    ns: SideNamespace,
    current: Vec<ShapedService>,
}

impl ShapedSide {
    pub fn new(tool: ShapedTool, id: &str, rep: u32) -> Result<Self> {
        let tag = match tool {
            ShapedTool::IptablesRestore => "k",
            ShapedTool::Nft => "n",
        };
        Ok(ShapedSide {
            tool,
            ns: SideNamespace::create(id, rep, tag)?,
            current: Vec::new(),
        })
    }
}

impl SyncSide for ShapedSide {
    fn name(&self) -> &'static str {
        match self.tool {
            ShapedTool::IptablesRestore => "kube-proxy-iptables",
            ShapedTool::Nft => "kube-proxy-nft",
        }
    }

    fn is_baseline(&self) -> bool {
        true
    }

    fn apply(&mut self, step: &Step<'_>) -> Result<StepCost> {
        let after = shaped_services(step.world);
        let opts = shaped_options();
        let full = step.kind == StepKind::Full;
        let cost = match self.tool {
            ShapedTool::IptablesRestore => {
                let text = if full {
                    iptables_full(&after, &opts)
                } else {
                    iptables_partial(&self.current, &after, &opts)
                };
                let program = format!("{}-restore", IPTABLES_LEGACY.0);
                raw_step(&self.ns, &program, &RESTORE_ARGS, &text)?
            }
            ShapedTool::Nft => {
                let text = if full {
                    nft_full(&after, &opts)
                } else {
                    nft_update(&self.current, &after, &opts)
                };
                raw_step(&self.ns, "nft", &["-f", "-"], &text)?
            }
        };
        self.current = after;
        Ok(cost)
    }
}

/// Why this host cannot run nftables mode (the registry's probe: `nft` 1.0.1 or later, and
/// a kernel that accepts the table), if it cannot.
fn nftables_unavailable() -> Option<String> {
    let layout = proxy_agent::proxier::HostLayout::from_defaults();
    proxy_agent::proxier::unavailable(proxy_agent::config::ProxyMode::Nftables, &layout)
}

/// Whether this kernel runs ipvs mode (the registry's probe).
fn ipvs_available() -> bool {
    let layout = proxy_agent::proxier::HostLayout::from_defaults();
    proxy_agent::proxier::unavailable(proxy_agent::config::ProxyMode::Ipvs, &layout).is_none()
}
