// SPDX-License-Identifier: Apache-2.0
//! Reaching the sockets of every network namespace on the node: sock_diag answers only
//! about the namespace of the socket asking, so a short-lived thread asks in the agent's
//! own namespace (the node's: host-network pods and node processes), then enters each
//! namespace named under the netns directory (`/run/netns`, where containerd and CRI-O
//! bind-mount the pods' namespaces) with `setns(CLONE_NEWNET)` and asks there. The thread
//! ends afterwards, so no other thread of the agent ever changes namespace.
//!
//! Entering a namespace needs CAP_SYS_ADMIN; without it only the own namespace is
//! searched and the others are reported unreachable (see the module above for what the
//! agent then does). Destroying needs CAP_NET_ADMIN and a kernel with
//! `CONFIG_INET_DIAG_DESTROY`.

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use nix::{
    errno::Errno,
    sched::{CloneFlags, setns},
};
use serde::{Deserialize, Serialize};

use super::diag::{DiagError, DiagSocket, SockId};
use crate::model::IpFamily;

/// A network namespace: the agent's own (no path), or one under the netns directory,
/// with the identity of its nsfs inode (a name can be reused by a newer namespace).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Netns {
    pub path: Option<PathBuf>,
    pub dev: u64,
    pub ino: u64,
}

impl std::fmt::Display for Netns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{}", path.display()),
            None => f.write_str("the node's own namespace"),
        }
    }
}

/// What the kernel lacks for terminating sockets (no namespace will do better).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Unsupported {
    /// No UDP sock_diag handler (`CONFIG_INET_UDP_DIAG`, the `udp_diag` module).
    UdpDiag,
    /// No `SOCK_DESTROY` (`CONFIG_INET_DIAG_DESTROY`).
    SockDestroy,
}

impl Unsupported {
    pub fn kernel_option(self) -> &'static str {
        match self {
            Unsupported::UdpDiag => "CONFIG_INET_UDP_DIAG (the udp_diag module)",
            Unsupported::SockDestroy => "CONFIG_INET_DIAG_DESTROY",
        }
    }
}

/// A namespace that could not be searched, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unreachable {
    pub netns: String,
    pub reason: String,
    /// Refused for lack of privilege (CAP_SYS_ADMIN to enter it): the same for every
    /// namespace, unlike a namespace that vanished while being listed.
    pub permission: bool,
}

/// The connected UDP sockets of every namespace reached.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub sockets: Vec<(Netns, SockId)>,
    pub searched: usize,
    pub unreachable: Vec<Unreachable>,
    pub unsupported: Option<Unsupported>,
    pub errors: Vec<String>,
}

/// What destroying a set of sockets came to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Destroyed {
    pub destroyed: Vec<(Netns, SockId)>,
    /// Closed by the application meanwhile (or its namespace gone): nothing to do.
    pub gone: usize,
    pub unreachable: Vec<Unreachable>,
    pub unsupported: Option<Unsupported>,
    pub errors: Vec<String>,
}

fn identity(meta: &fs::Metadata) -> (u64, u64) {
    (meta.dev(), meta.ino())
}

/// The calling thread's network namespace.
fn own_netns() -> std::io::Result<Netns> {
    let meta = fs::metadata("/proc/thread-self/ns/net")?;
    let (dev, ino) = identity(&meta);
    Ok(Netns {
        path: None,
        dev,
        ino,
    })
}

/// The namespaces named under `dir`, sorted, without duplicates of `own` (a runtime may
/// name the host's own namespace too) or of each other.
fn named_namespaces(dir: &Path, own: &Netns) -> (Vec<(Netns, fs::File)>, Vec<Unreachable>) {
    let mut found = Vec::new();
    let mut unreachable = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        // No pods yet (the runtime creates the directory with the first one), or not
        // mounted into this container: nothing to search.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (found, unreachable),
        Err(e) => {
            unreachable.push(Unreachable {
                netns: dir.display().to_string(),
                reason: format!("listing the directory: {e}"),
                permission: e.kind() == std::io::ErrorKind::PermissionDenied,
            });
            return (found, unreachable);
        }
    };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    let mut seen: BTreeMap<(u64, u64), ()> = BTreeMap::new();
    seen.insert((own.dev, own.ino), ());
    for path in paths {
        let opened = fs::File::open(&path).and_then(|f| f.metadata().map(|m| (f, m)));
        let (file, meta) = match opened {
            Ok(ok) => ok,
            Err(e) => {
                // Deleted meanwhile, or a stale name whose mount is gone.
                unreachable.push(Unreachable {
                    netns: path.display().to_string(),
                    reason: e.to_string(),
                    permission: e.kind() == std::io::ErrorKind::PermissionDenied,
                });
                continue;
            }
        };
        let (dev, ino) = identity(&meta);
        if seen.insert((dev, ino), ()).is_some() {
            continue;
        }
        found.push((
            Netns {
                path: Some(path),
                dev,
                ino,
            },
            file,
        ));
    }
    (found, unreachable)
}

/// Enters `netns` (opened as `file`) on this thread.
fn enter(netns: &Netns, file: &fs::File) -> Result<(), Unreachable> {
    setns(file, CloneFlags::CLONE_NEWNET).map_err(|errno| Unreachable {
        netns: netns.to_string(),
        reason: format!("setns: {errno}"),
        permission: errno == Errno::EPERM,
    })
}

/// Runs `work` on a fresh thread (which may change namespace and then ends).
fn on_worker<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    std::thread::Builder::new()
        .name("socket-sweep".into())
        .spawn(work)
        .ok()?
        .join()
        .ok()
}

/// Lists the connected UDP sockets of one namespace (the thread's current).
fn list_here(netns: &Netns, out: &mut Listing) -> Result<(), Option<Unsupported>> {
    let mut diag = match DiagSocket::open() {
        Ok(diag) => diag,
        Err(e) => {
            out.errors.push(format!("{netns}: {e}"));
            return Ok(());
        }
    };
    for family in [IpFamily::V4, IpFamily::V6] {
        match diag.connected_udp(family) {
            Ok(sockets) => out
                .sockets
                .extend(sockets.into_iter().map(|s| (netns.clone(), s))),
            Err(e) if e.errno() == Some(Errno::ENOENT) => {
                return Err(Some(Unsupported::UdpDiag));
            }
            // A family the namespace does not have (IPv6 disabled) lists nothing.
            Err(e) if e.errno() == Some(Errno::EAFNOSUPPORT) => {}
            Err(e) => out.errors.push(format!("{netns}: {family}: {e}")),
        }
    }
    out.searched += 1;
    Ok(())
}

/// The connected UDP sockets of the own namespace and of every namespace named under
/// `netns_dir` (see the module documentation).
pub fn list_connected(netns_dir: &Path) -> Listing {
    let dir = netns_dir.to_path_buf();
    on_worker(move || {
        let mut out = Listing::default();
        let own = match own_netns() {
            Ok(own) => own,
            Err(e) => {
                out.errors
                    .push(format!("identifying the own namespace: {e}"));
                return out;
            }
        };
        if let Err(unsupported) = list_here(&own, &mut out) {
            out.unsupported = unsupported;
            return out;
        }
        let (named, unreachable) = named_namespaces(&dir, &own);
        out.unreachable = unreachable;
        let mut refused = false;
        for (netns, file) in named {
            if refused {
                // Without the privilege no namespace can be entered: say so for each,
                // without trying.
                out.unreachable.push(Unreachable {
                    netns: netns.to_string(),
                    reason: "setns: EPERM".into(),
                    permission: true,
                });
                continue;
            }
            if let Err(why) = enter(&netns, &file) {
                refused = why.permission;
                out.unreachable.push(why);
                continue;
            }
            if let Err(unsupported) = list_here(&netns, &mut out) {
                out.unsupported = unsupported;
                return out;
            }
        }
        out
    })
    .unwrap_or_else(|| Listing {
        errors: vec!["the namespace thread could not run".into()],
        ..Default::default()
    })
}

/// Destroys `targets`, each in its namespace (entered again and checked to be the same
/// one it was listed in).
pub fn destroy(targets: Vec<(Netns, SockId)>) -> Destroyed {
    on_worker(move || {
        let mut out = Destroyed::default();
        let mut by_netns: BTreeMap<Netns, Vec<SockId>> = BTreeMap::new();
        for (netns, id) in targets {
            by_netns.entry(netns).or_default().push(id);
        }
        // The own namespace (no path) sorts first: it is checked before this thread
        // enters any other.
        for (netns, ids) in by_netns {
            let here = match &netns.path {
                None => own_netns()
                    .ok()
                    .filter(|own| own.ino == netns.ino && own.dev == netns.dev),
                Some(path) => match fs::File::open(path).and_then(|f| f.metadata().map(|m| (f, m)))
                {
                    Ok((file, meta)) if identity(&meta) == (netns.dev, netns.ino) => {
                        match enter(&netns, &file) {
                            Ok(()) => Some(netns.clone()),
                            Err(why) => {
                                out.unreachable.push(why);
                                continue;
                            }
                        }
                    }
                    // Gone, or the name now belongs to another namespace: its sockets went
                    // with it.
                    _ => None,
                },
            };
            if here.is_none() {
                out.gone += ids.len();
                continue;
            }
            let mut diag = match DiagSocket::open() {
                Ok(diag) => diag,
                Err(e) => {
                    out.errors.push(format!("{netns}: {e}"));
                    continue;
                }
            };
            for id in ids {
                match diag.destroy(&id) {
                    Ok(()) => out.destroyed.push((netns.clone(), id)),
                    Err(e) => match destroy_failure(&e) {
                        Failure::Gone => out.gone += 1,
                        Failure::Unsupported(what) => {
                            out.unsupported = Some(what);
                            return out;
                        }
                        Failure::Other => out.errors.push(format!("{netns}: {}: {e}", id.local)),
                    },
                }
            }
        }
        out
    })
    .unwrap_or_else(|| Destroyed {
        errors: vec!["the namespace thread could not run".into()],
        ..Default::default()
    })
}

enum Failure {
    Gone,
    Unsupported(Unsupported),
    Other,
}

fn destroy_failure(e: &DiagError) -> Failure {
    match e.errno() {
        // The socket was closed (or reconnected elsewhere: the cookie no longer matches
        // what the 4-tuple finds).
        Some(Errno::ENOENT) => Failure::Gone,
        Some(Errno::EOPNOTSUPP) => Failure::Unsupported(Unsupported::SockDestroy),
        _ => Failure::Other,
    }
}
