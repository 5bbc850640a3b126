// SPDX-License-Identifier: Apache-2.0
//! Loading the embedded object, pinning its maps and attaching its programs so that they
//! outlive the agent: maps and links are pinned under the bpffs root, and a restarted agent
//! reuses the maps (moving those whose configured size changed into new ones, see
//! [`super::resize`]) and swaps each link for a new one without a gap (the new link is attached
//! and pinned before the old pin is replaced, so both run for an instant; the second sees an
//! already translated address and leaves it alone).

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap as AyaHash, LpmTrie, MapData},
    programs::{
        CgroupAttachMode, CgroupSockAddr, SchedClassifier, TcAttachType,
        links::FdLink,
        tc::{
            NlOptions, SchedClassifierLink, TcAttachOptions, TcError, TcHandle, qdisc_add_clsact,
        },
    },
};
use proxy_common::{LB_CFG_READY, LbConfig, maps as names};
use tracing::{debug, info, warn};

use crate::proxier::netlink::tc::ClsactHook;

pub use super::pins::{MapSizes, links_dir, maps_dir};
use super::{
    attached::{self, POD_EGRESS, POD_INGRESS, UPLINK_EGRESS, UPLINK_INGRESS},
    maps::{KernelHash, KernelLpm, KernelMaglev, LbMaps},
    node_settings::LocalCidrMaps,
    resize::{self, PinPlan, Resizable},
    upgrade,
};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("ebpf mode is unavailable: {0}")]
    Unavailable(&'static str),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("attaching {name} to device {device}: {source}")]
    Device {
        name: &'static str,
        device: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("program {name} is missing from the eBPF object")]
    MissingProgram { name: &'static str },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("map {name} is missing from the eBPF object")]
    MissingMap { name: &'static str },
    #[error("pinning {path}: {source}")]
    Pin {
        path: PathBuf,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("link of {name}: {source}")]
    Link {
        name: &'static str,
        #[source]
        source: aya::programs::links::LinkError,
    },
    #[error("no cgroup v2 mount found in /proc/mounts; pass --cgroup-root")]
    NoCgroup2,
}

pub type Result<T, E = LoadError> = std::result::Result<T, E>;

#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Directory under bpffs that holds `maps/` and `links/`.
    pub bpffs_root: PathBuf,
    /// cgroup v2 directory the socket programs attach to.
    pub cgroup: PathBuf,
    pub map_sizes: MapSizes,
    /// The node's uplink devices: tc programs attach there.
    pub devices: Vec<String>,
    /// XDP acceleration on the uplinks.
    pub xdp: crate::config::XdpMode,
    /// Entries of one Maglev table (`ebpf.maglevTableSize`): the Maglev map holds
    /// `map_sizes.maglev_tables` of them.
    pub maglev_table_size: u32,
    /// Attach the pod-side egress program too (socketLBHostNamespaceOnly: see
    /// `proxy_common::LB_CFG_SOCKET_LB_HOST_NETNS_ONLY`); without it, an earlier agent's
    /// links of that program are removed.
    pub pod_egress: bool,
}

/// The socket programs and where they attach.
pub(super) const SOCK_PROGRAMS: &[&str] = &[
    "sock_connect4",
    "sock_connect6",
    "sock_sendmsg4",
    "sock_sendmsg6",
    "sock_recvmsg4",
    "sock_recvmsg6",
    "sock_getpeername4",
    "sock_getpeername6",
];

/// The node's other devices (pods, bridges): every interface but loopback and the
/// uplinks. Reads the agent's own network namespace (unlike /sys/class/net, which shows
/// the namespace /sys was mounted in).
pub fn pod_devices(uplinks: &[String]) -> Vec<String> {
    let Ok(interfaces) = nix::net::if_::if_nameindex() else {
        return Vec::new();
    };
    let mut out: Vec<String> = interfaces
        .iter()
        .map(|i| i.name().to_string_lossy().into_owned())
        .filter(|name| name != "lo" && !uplinks.contains(name))
        .collect();
    out.sort();
    out
}

/// A loaded dataplane, attached unless a layout upgrade waits for its first full sync.
pub struct Loaded {
    /// Keeps the programs' fds; the links live on in their pins.
    ebpf: Ebpf,
    pub maps: LbMaps,
    config: Array<MapData, LbConfig>,
    /// Kept open: a program loaded later (XDP, lazily) refers to the map by this fd.
    _maglev_config: Array<MapData, u32>,
    pub ct4: AyaHash<MapData, proxy_common::Ct4Key, proxy_common::CtValue>,
    pub ct6: AyaHash<MapData, proxy_common::Ct6Key, proxy_common::CtValue>,
    /// The local-traffic detector's CIDRs (written with the node settings, not per service).
    pub local_cidrs: LocalCidrMaps,
    links_dir: PathBuf,
    uplinks: Vec<String>,
    /// Devices the pod-side programs are attached to.
    pod_devices: Vec<String>,
    /// Whether the pod-side egress program is one of them ([`LoadOptions::pod_egress`]).
    pod_egress: bool,
    /// Uplinks XDP runs on.
    pub xdp_devices: Vec<String>,
    /// Set until the programs are attached (at once, or after the first full sync of a
    /// layout upgrade: see [`super::upgrade`]).
    pending: Option<PendingAttach>,
}

impl Loaded {
    /// Writes the runtime configuration slot.
    pub fn write_config(&mut self, mut cfg: LbConfig) -> Result<()> {
        cfg.flags |= LB_CFG_READY;
        self.config.set(0, cfg, 0).map_err(|source| LoadError::Map {
            name: names::LB_CONFIG,
            source,
        })
    }
}

impl Loaded {
    /// A program of the loaded object, for tests that run it with `BPF_PROG_TEST_RUN`
    /// (tests/tests/privileged/bpf_test_run.rs).
    #[cfg(feature = "test-fixtures")]
    pub fn program_mut(&mut self, name: &str) -> Option<&mut aya::programs::Program> {
        self.ebpf.program_mut(name)
    }
}

/// The mount point of the cgroup v2 hierarchy (e.g. /sys/fs/cgroup or, on hybrid systems,
/// /sys/fs/cgroup/unified).
pub fn detect_cgroup2_root() -> Result<PathBuf> {
    let mounts = fs::read_to_string("/proc/mounts").map_err(|source| LoadError::Io {
        what: "reading",
        path: "/proc/mounts".into(),
        source,
    })?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, mount_point, fs_type) = (fields.next()?, fields.next()?, fields.next()?);
            (fs_type == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .next()
        .ok_or(LoadError::NoCgroup2)
}

/// What the socket programs would be attached to, as far as choosing it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupRootFacts {
    /// The directory is on a cgroup v2 filesystem.
    pub cgroup2: bool,
    /// The directory is the root of the host's hierarchy (a kernfs root has inode 1; the
    /// cgroup2 mount of a container with its own cgroup namespace is that container's
    /// cgroup, whatever /proc/self/cgroup says).
    pub hierarchy_root: bool,
}

impl CgroupRootFacts {
    /// Reads them for `path`.
    pub fn of(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let stat = nix::sys::statfs::statfs(path).map_err(std::io::Error::from)?;
        let cgroup2 = stat.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC;
        let hierarchy_root = cgroup2 && fs::metadata(path)?.ino() == 1;
        Ok(Self {
            cgroup2,
            hierarchy_root,
        })
    }
}

/// Whether the socket programs may attach to `path` (`explicit`: `ebpf.cgroupRoot` names
/// it; otherwise it was found in /proc/mounts): an error saying why not, or a warning to
/// log. A detected mount that is not the hierarchy's root would translate only the agent's
/// own container (its cgroup namespace) while pods' ClusterIP traffic went untranslated;
/// an explicit sub-cgroup is a choice (only the processes below it are translated).
pub fn judge_cgroup_root(
    path: &Path,
    facts: CgroupRootFacts,
    explicit: bool,
) -> std::result::Result<Option<String>, String> {
    let shown = path.display();
    if !facts.cgroup2 {
        return Err(format!(
            "{shown} is not a cgroup v2 mount (on a hybrid cgroup host the v2 hierarchy is \
             /sys/fs/cgroup/unified); set ebpf.cgroupRoot to the host's cgroup v2 root"
        ));
    }
    match (facts.hierarchy_root, explicit) {
        (true, _) => Ok(None),
        (false, false) => Err(format!(
            "the cgroup v2 mount {shown} is not the root of the host's hierarchy (this \
             container has its own cgroup namespace): socket programs attached there would \
             translate only this container's traffic; mount the host's /sys/fs/cgroup \
             (a hostPath volume) and set ebpf.cgroupRoot to it"
        )),
        (false, true) => Ok(Some(format!(
            "ebpf.cgroupRoot {shown} is below the root of the cgroup hierarchy: only \
             processes in it are translated by the socket programs"
        ))),
    }
}

/// Creates a pin directory that only root can enter: whoever can write a pinned map can
/// redirect every service, so the directory's mode must not depend on the agent's umask.
fn create_dir(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::create_dir_all(path).map_err(|source| LoadError::Io {
        what: "creating",
        path: path.to_path_buf(),
        source,
    })?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(|source| LoadError::Io {
        what: "restricting",
        path: path.to_path_buf(),
        source,
    })
}

/// Loads the embedded object, pins (or reuses) the maps and attaches every program (or,
/// on a layout upgrade, leaves that to [`Loaded::attach_pending`] after the first full sync).
pub fn load_and_attach(opts: &LoadOptions) -> Result<Loaded> {
    load_and_attach_sized(opts, &resize::Capacities::new(), false)
}

/// [`load_and_attach`] with the maps in `capacities` at those sizes (moved into new maps
/// when their pins have others: how maps grow, see `growth`); with `defer`, the programs
/// wait for [`Loaded::attach_pending`] even when no layout upgrade asks for it (a growth
/// during the first full sync of one).
pub(super) fn load_and_attach_sized(
    opts: &LoadOptions,
    capacities: &resize::Capacities,
    defer: bool,
) -> Result<Loaded> {
    if let Some(reason) = crate::ebpf_object::unavailable_reason() {
        return Err(LoadError::Unavailable(reason));
    }
    let maps_dir = maps_dir(&opts.bpffs_root);
    let links_dir = links_dir(&opts.bpffs_root);
    create_dir(&opts.bpffs_root)?;
    create_dir(&maps_dir)?;
    create_dir(&links_dir)?;

    // Maps whose size changed are loaded anew beside their pins, filled from them, and
    // take their place once the programs using them are attached (see `resize`).
    let reused = names::ALL
        .iter()
        .filter(|n| maps_dir.join(n).exists())
        .count();
    // An earlier layout's programs keep serving until this layout's maps are filled
    // (asked before loading, which pins this layout's maps).
    let defer = defer || upgrade::deferred_attach(&maps_dir, &links_dir);
    let resizable = resize::resizable(&opts.map_sizes, capacities);
    let mut plans = resize::plan(&maps_dir, &resizable);
    let maglev_entries = resize::maglev_entries(&opts.map_sizes, opts.maglev_table_size);
    resize::replace_other_maglev_layout(&maps_dir, maglev_entries, opts.maglev_table_size);
    let mut ebpf = loop {
        let ebpf = load_object(&maps_dir, &resizable, &plans, maglev_entries)?;
        if resize::copy_over(&maps_dir, &resizable, &mut plans) {
            break ebpf;
        }
        // A map could not be filled: it is kept, and the object loaded again to use it.
    };
    let resizing = plans
        .iter()
        .filter(|p| matches!(p, PinPlan::Resize { .. }))
        .count();
    info!(
        root = %opts.bpffs_root.display(),
        reused_maps = reused.saturating_sub(resizing),
        resizing_maps = resizing,
        "eBPF object loaded, maps pinned"
    );

    let maps = take_maps(&mut ebpf)?;
    let config = take_array(&mut ebpf, names::LB_CONFIG)?;
    // The table size goes in before any program is attached: a program reading the tables
    // with another size would index into the wrong table.
    let mut maglev_config: Array<MapData, u32> = take_array(&mut ebpf, names::MAGLEV_CONFIG)?;
    maglev_config
        .set(0, opts.maglev_table_size, 0)
        .map_err(|source| LoadError::Map {
            name: names::MAGLEV_CONFIG,
            source,
        })?;
    let ct4 = take_raw_hash(&mut ebpf, names::CT4)?;
    let ct6 = take_raw_hash(&mut ebpf, names::CT6)?;
    let local_cidrs = LocalCidrMaps {
        v4: take_lpm(&mut ebpf, names::LOCAL_CIDRS4)?,
        v6: take_lpm(&mut ebpf, names::LOCAL_CIDRS6)?,
    };
    let mut loaded = Loaded {
        ebpf,
        maps,
        config,
        _maglev_config: maglev_config,
        ct4,
        ct6,
        local_cidrs,
        links_dir,
        uplinks: opts.devices.clone(),
        pod_devices: Vec::new(),
        pod_egress: opts.pod_egress,
        xdp_devices: Vec::new(),
        pending: Some(PendingAttach {
            cgroup: opts.cgroup.clone(),
            xdp: opts.xdp,
            maps_dir,
            resizable,
            plans,
        }),
    };
    if defer {
        info!(
            "map layout upgrade: the running programs keep serving from the earlier layout's maps until the first full sync has filled the new ones"
        );
    } else {
        loaded.attach_pending()?;
    }
    Ok(loaded)
}

/// What attaching the programs needs, kept from loading until it happens.
struct PendingAttach {
    cgroup: PathBuf,
    xdp: crate::config::XdpMode,
    maps_dir: PathBuf,
    resizable: Vec<Resizable>,
    plans: Vec<PinPlan>,
}

impl Loaded {
    /// Whether the programs wait for the maps to be filled (a layout upgrade).
    pub fn programs_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Whether maps loaded at staging pins wait for the programs to be attached before
    /// they take their pins (a resize at start during a layout upgrade): no other resize
    /// may start before.
    pub fn resize_pending(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| {
            p.plans
                .iter()
                .any(|plan| matches!(plan, PinPlan::Resize { .. }))
        })
    }

    /// Attaches every program (replacing the links of an earlier agent), completes the
    /// resizes and, after a layout upgrade, removes the earlier layout's maps. Does nothing
    /// when already attached.
    pub fn attach_pending(&mut self) -> Result<()> {
        let Some(pending) = self.pending.take() else {
            return Ok(());
        };
        let (ebpf, links_dir) = (&mut self.ebpf, &self.links_dir);
        let cgroup = fs::File::open(&pending.cgroup).map_err(|source| LoadError::Io {
            what: "opening cgroup",
            path: pending.cgroup.clone(),
            source,
        })?;
        for name in SOCK_PROGRAMS {
            let program: &mut CgroupSockAddr = ebpf
                .program_mut(name)
                .ok_or(LoadError::MissingProgram { name })?
                .try_into()
                .map_err(|source| LoadError::Program { name, source })?;
            program
                .load()
                .map_err(|source| LoadError::Program { name, source })?;
            let link_id = program
                .attach(&cgroup, CgroupAttachMode::Single)
                .map_err(|source| LoadError::Program { name, source })?;
            let link = program
                .take_link(link_id)
                .map_err(|source| LoadError::Program { name, source })?;
            let link: FdLink = link
                .try_into()
                .map_err(|source| LoadError::Link { name, source })?;
            replace_pinned_link(links_dir, name, link)?;
        }
        info!(cgroup = %pending.cgroup.display(), "socket programs attached");
        attach_tc(
            ebpf,
            UPLINK_INGRESS,
            TcAttachType::Ingress,
            &self.uplinks,
            links_dir,
        )?;
        attach_tc(
            ebpf,
            UPLINK_EGRESS,
            TcAttachType::Egress,
            &self.uplinks,
            links_dir,
        )?;
        let pods = pod_devices(&self.uplinks);
        attach_pod_side(ebpf, self.pod_egress, &pods, links_dir)?;
        if !self.pod_egress {
            remove_pod_egress(links_dir, &pods);
        }
        self.pod_devices = pods;
        // After tc: what XDP passes on must find tc in place.
        self.xdp_devices = super::xdp::attach(ebpf, pending.xdp, &self.uplinks, links_dir);
        // Every program now runs against the new maps: they take the old maps' pins.
        resize::complete(&pending.maps_dir, &pending.resizable, &pending.plans).map_err(
            |source| LoadError::Io {
                what: "replacing the pin of a resized map under",
                path: pending.maps_dir.clone(),
                source,
            },
        )?;
        if let Err(e) = upgrade::remove_other_layouts(&pending.maps_dir) {
            warn!(error = %e, "could not look for the maps of an earlier layout");
        }
        Ok(())
    }
}

/// Loads the embedded object: maps at their pins (a resized map at its staging pin), with
/// the configured capacities (`maglev_entries` for the Maglev tables).
fn load_object(
    maps_dir: &Path,
    resizable: &[Resizable],
    plans: &[PinPlan],
    maglev_entries: u32,
) -> Result<Ebpf> {
    let mut loader = EbpfLoader::new();
    for name in names::ALL {
        loader.map_pin_path(name, resize::pin_path(maps_dir, name, resizable, plans));
    }
    for map in resizable {
        loader.map_max_entries(map.name, map.wanted.max_entries);
    }
    loader.map_max_entries(names::MAGLEV, maglev_entries);
    Ok(loader.load(crate::ebpf_object::bytes())?)
}

impl Loaded {
    /// Attaches the pod-side programs to devices that appeared since the last look and drops
    /// the links of devices that went away. Returns the devices added.
    pub fn refresh_pod_devices(&mut self) -> Result<Vec<String>> {
        if self.pending.is_some() {
            return Ok(Vec::new());
        }
        let now = pod_devices(&self.uplinks);
        let added: Vec<String> = now
            .iter()
            .filter(|d| !self.pod_devices.contains(d))
            .cloned()
            .collect();
        for gone in self.pod_devices.iter().filter(|d| !now.contains(d)) {
            for program in [POD_INGRESS, POD_EGRESS] {
                let _ = fs::remove_file(self.links_dir.join(format!("{program}_{gone}")));
            }
        }
        if !added.is_empty() {
            attach_pod_side(&mut self.ebpf, self.pod_egress, &added, &self.links_dir)?;
        }
        self.pod_devices = now;
        Ok(added)
    }
}

/// The pod-side programs on `devices`: ingress always, egress when asked for.
fn attach_pod_side(
    ebpf: &mut Ebpf,
    egress: bool,
    devices: &[String],
    links_dir: &Path,
) -> Result<()> {
    attach_tc(ebpf, POD_INGRESS, TcAttachType::Ingress, devices, links_dir)?;
    if egress {
        attach_tc(ebpf, POD_EGRESS, TcAttachType::Egress, devices, links_dir)?;
    }
    Ok(())
}

/// Removes the pod-side egress program an earlier agent attached with
/// socketLBHostNamespaceOnly: its pinned links (every device's, the devices gone since
/// included) and, on kernels without TCX, its filters on `devices`.
fn remove_pod_egress(links_dir: &Path, devices: &[String]) {
    let prefix = format!("{POD_EGRESS}_");
    let mut removed = 0;
    if let Ok(entries) = fs::read_dir(links_dir) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix)
                && fs::remove_file(entry.path()).is_ok()
            {
                removed += 1;
            }
        }
    }
    if !super::kernel::has_tcx() {
        for device in devices {
            attached::remove_stale_filters(device, ClsactHook::Egress, POD_EGRESS, None);
        }
    }
    if removed > 0 {
        info!(
            links = removed,
            "pod-side egress program of an earlier agent detached (socketLBHostNamespaceOnly is off)"
        );
    }
}

/// Attaches a tc program to every device. On kernels with TCX (6.6+) the links are pinned
/// like the cgroup ones; older kernels get a netlink filter on a clsact qdisc, which stays
/// attached by itself and which [`super::attached`] finds again by the program's name.
/// Either way, filters of this program that an earlier agent left on the hook go once the
/// new program is attached (a restart neither leaves a gap nor adds a filter).
fn attach_tc(
    ebpf: &mut Ebpf,
    name: &'static str,
    direction: TcAttachType,
    devices: &[String],
    links_dir: &Path,
) -> Result<()> {
    let program: &mut SchedClassifier = ebpf
        .program_mut(name)
        .ok_or(LoadError::MissingProgram { name })?
        .try_into()
        .map_err(|source| LoadError::Program { name, source })?;
    if program.fd().is_err() {
        program
            .load()
            .map_err(|source| LoadError::Program { name, source })?;
    }
    let hook = match direction {
        TcAttachType::Egress => ClsactHook::Egress,
        _ => ClsactHook::Ingress,
    };
    let tcx = super::kernel::has_tcx();
    for device in devices {
        let device_error = |source| LoadError::Device {
            name,
            device: device.clone(),
            source,
        };
        if tcx {
            let link_id = program.attach(device, direction).map_err(device_error)?;
            let link = program
                .take_link(link_id)
                .map_err(|source| LoadError::Program { name, source })?;
            let fd_link =
                FdLink::try_from(link).map_err(|source| LoadError::Link { name, source })?;
            replace_pinned_link(links_dir, &format!("{name}_{device}"), fd_link)?;
            // An agent from before TCX (or before an upgrade of the kernel) used filters.
            attached::remove_stale_filters(device, hook, name, None);
        } else {
            // The filters' qdisc; EEXIST when it is there already.
            let _ = qdisc_add_clsact(device);
            let kept = attach_filter(program, device, direction, hook).map_err(device_error)?;
            debug!(program = name, %device, priority = kept.0, handle = kept.1, "netlink tc filter attached");
            attached::remove_stale_filters(device, hook, name, Some(kept));
        }
    }
    if !devices.is_empty() {
        info!(program = name, devices = ?devices, tcx, "tc program attached");
    }
    Ok(())
}

/// Attaches `program` as a netlink filter at our priority and handle, replacing the
/// program inside an earlier agent's filter there (atomically, in the kernel); where
/// someone else's filter holds that slot, wherever the kernel puts it. Returns the
/// filter's priority and handle.
fn attach_filter(
    program: &mut SchedClassifier,
    device: &str,
    direction: TcAttachType,
    hook: ClsactHook,
) -> std::result::Result<(u16, u32), aya::programs::ProgramError> {
    let slot = attached::our_slot(device, hook);
    let ours = TcHandle::from(attached::TC_HANDLE);
    let link_id = match slot {
        attached::Slot::Ours => {
            let existing =
                SchedClassifierLink::attached(device, direction, attached::TC_PRIORITY, ours, None)
                    .map_err(TcError::IoError)?;
            program.attach_to_link(existing)?
        }
        attached::Slot::Free | attached::Slot::Taken => {
            let options = if slot == attached::Slot::Free {
                NlOptions {
                    priority: attached::TC_PRIORITY,
                    handle: ours,
                    classid: None,
                }
            } else {
                warn!(%device, hook = hook.as_str(), priority = attached::TC_PRIORITY, "another filter holds our tc priority and handle; attaching at one the kernel picks");
                NlOptions::default()
            };
            program.attach_with_options(device, direction, TcAttachOptions::Netlink(options))?
        }
    };
    let link = program.take_link(link_id)?;
    let kept = (link.priority()?, u32::from(link.handle()?));
    // Dropping the link would detach the filter, which must outlive the agent. Taking
    // the netlink link out of its wrapper (which is what converting it does; it is no
    // bpf_link, so the conversion answers InvalidLink) releases it without detaching.
    let released = FdLink::try_from(link);
    debug_assert!(released.is_err(), "a netlink filter is no bpf_link");
    Ok(kept)
}

/// Pins `link` as `links/<name>`, replacing (and thereby detaching) a previous link of the
/// same program only once the new one is attached.
fn replace_pinned_link(links_dir: &Path, name: &str, link: FdLink) -> Result<()> {
    let final_path = links_dir.join(name);
    // bpffs refuses names with dots.
    let staging = links_dir.join(format!("{name}_staging"));
    if staging.exists() {
        let _ = fs::remove_file(&staging);
    }
    let pinned = link.pin(&staging).map_err(|source| LoadError::Pin {
        path: staging.clone(),
        source,
    })?;
    fs::rename(&staging, &final_path).map_err(|source| LoadError::Io {
        what: "replacing pinned link",
        path: final_path.clone(),
        source,
    })?;
    // The pin keeps the link attached; our fd is no longer needed.
    drop(pinned);
    debug!(program = name, pin = %final_path.display(), "link pinned");
    Ok(())
}

fn take_hash<K: aya::Pod + Send + Sync, V: aya::Pod + Send + Sync>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<Box<KernelHash<K, V>>> {
    let map = ebpf.take_map(name).ok_or(LoadError::MissingMap { name })?;
    let map: AyaHash<MapData, K, V> =
        AyaHash::try_from(map).map_err(|source| LoadError::Map { name, source })?;
    Ok(Box::new(KernelHash::new(name, map)))
}

fn take_raw_hash<K: aya::Pod, V: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<AyaHash<MapData, K, V>> {
    let map = ebpf.take_map(name).ok_or(LoadError::MissingMap { name })?;
    AyaHash::try_from(map).map_err(|source| LoadError::Map { name, source })
}

fn take_lpm<D: aya::Pod + Send>(ebpf: &mut Ebpf, name: &'static str) -> Result<Box<KernelLpm<D>>> {
    let map = ebpf.take_map(name).ok_or(LoadError::MissingMap { name })?;
    let map: LpmTrie<MapData, D, u8> =
        LpmTrie::try_from(map).map_err(|source| LoadError::Map { name, source })?;
    Ok(Box::new(KernelLpm::new(name, map)))
}

fn take_array<V: aya::Pod>(ebpf: &mut Ebpf, name: &'static str) -> Result<Array<MapData, V>> {
    let map = ebpf.take_map(name).ok_or(LoadError::MissingMap { name })?;
    Array::try_from(map).map_err(|source| LoadError::Map { name, source })
}

fn take_maps(ebpf: &mut Ebpf) -> Result<LbMaps> {
    Ok(LbMaps {
        svc4: take_hash(ebpf, names::SVC4)?,
        svc6: take_hash(ebpf, names::SVC6)?,
        backends4: take_hash(ebpf, names::BACKENDS4)?,
        backends6: take_hash(ebpf, names::BACKENDS6)?,
        rev_nat4: take_hash(ebpf, names::REV_NAT4)?,
        rev_nat6: take_hash(ebpf, names::REV_NAT6)?,
        affinity: take_hash(ebpf, names::AFFINITY)?,
        svc_cidrs4: take_lpm(ebpf, names::SVC_CIDRS4)?,
        svc_cidrs6: take_lpm(ebpf, names::SVC_CIDRS6)?,
        nodeport_addrs4: take_hash(ebpf, names::NODEPORT_ADDRS4)?,
        nodeport_addrs6: take_hash(ebpf, names::NODEPORT_ADDRS6)?,
        src_ranges4: take_lpm(ebpf, names::SRC_RANGES4)?,
        src_ranges6: take_lpm(ebpf, names::SRC_RANGES6)?,
        maglev: Box::new(KernelMaglev::new(take_array(ebpf, names::MAGLEV)?)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: CgroupRootFacts = CgroupRootFacts {
        cgroup2: true,
        hierarchy_root: true,
    };
    const NAMESPACED: CgroupRootFacts = CgroupRootFacts {
        cgroup2: true,
        hierarchy_root: false,
    };

    #[test]
    fn a_detected_mount_must_be_the_hierarchys_root_and_an_explicit_one_a_cgroup2() {
        let path = Path::new("/sys/fs/cgroup");
        assert_eq!(judge_cgroup_root(path, ROOT, false), Ok(None));
        assert_eq!(judge_cgroup_root(path, ROOT, true), Ok(None));
        // A container's own cgroup namespace: refused when detected, a warning when chosen.
        let refused = judge_cgroup_root(path, NAMESPACED, false).unwrap_err();
        assert!(refused.contains("own cgroup namespace"), "{refused}");
        let warned = judge_cgroup_root(path, NAMESPACED, true).unwrap().unwrap();
        assert!(warned.contains("only processes in it"), "{warned}");
        let not_cgroup = CgroupRootFacts {
            cgroup2: false,
            hierarchy_root: false,
        };
        for explicit in [false, true] {
            let err = judge_cgroup_root(path, not_cgroup, explicit).unwrap_err();
            assert!(err.contains("not a cgroup v2 mount"), "{err}");
        }
    }

    #[test]
    fn facts_of_a_directory_that_is_no_cgroup() {
        let facts = CgroupRootFacts::of(Path::new("/proc")).unwrap();
        assert!(!facts.cgroup2 && !facts.hierarchy_root);
        assert!(CgroupRootFacts::of(Path::new("/nonexistent/kpe")).is_err());
    }
}
