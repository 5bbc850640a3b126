// SPDX-License-Identifier: Apache-2.0
//! Connected UDP sockets whose backend went away.
//!
//! Socket-level load balancing translates a connected UDP socket once, at `connect()`: the
//! kernel then sends its datagrams straight to the backend, with no hook on the way. A
//! client that keeps such a socket (DNS resolvers, QUIC, metrics agents) would keep
//! sending to a backend that left its Service, or to a Service that is gone, for as long as
//! it lives. So after a sync that changed UDP services or their endpoints (and after the
//! first sync, for sockets older than the agent), the agent finds the connected UDP sockets
//! our connect() program translated and destroys those whose backend no longer serves the
//! frontend they asked for. The application's next receive then fails with ECONNABORTED
//! (a blocked one wakes up with it) and its next send without an address with
//! EDESTADDRREQ; the socket is disconnected, and connecting again (to the Service address)
//! goes through the connect() program, which picks a live backend.
//!
//! Which sockets: connected UDP sockets our connect() program translated (it records the
//! socket's cookie and backend with the frontend asked for: `translations`) whose
//! (frontend, backend) pair is stale by the rule the stale UDP conntrack reconciler applies
//! to netfilter and BPF conntrack entries ([`UdpFrontends`]: the backend no longer serves
//! that frontend, or the frontend is gone). Never an unconnected socket (the dump asks for
//! connected sockets only; an unconnected one is translated per datagram anyway), never a
//! socket connected to a pod directly (no record for its cookie and peer), never TCP:
//! upstream does nothing for TCP either, whose connections to a removed endpoint fail on
//! their own (RST or timeout) and which applications already handle.
//!
//! How: NETLINK_SOCK_DIAG, from userspace (`diag`). A dump of the connected UDP sockets
//! per namespace gives each socket's addresses and cookie, and `SOCK_DESTROY` aborts one
//! socket named by them. It works on every kernel built with `CONFIG_INET_DIAG_DESTROY`
//! (a 4.x option; set in Debian's 6.1 kernel, the qemu guest's, and in this host's 6.18,
//! both checked) and UDP sock_diag (`CONFIG_INET_UDP_DIAG`, a module on Debian). The
//! alternative Cilium moved to on 6.5+, a BPF socket iterator calling the
//! `bpf_sock_destroy()` kfunc, is out of reach here: aya 0.14 / aya-ebpf 0.2 (pinned, see
//! the toolchain notes) have no iterator program macro and no kfunc relocation, and the
//! iterator is per namespace too (it walks the sockets of the namespace of whoever reads
//! it), so it would save neither the namespace walk nor a dependency on the kernel config
//! (it needs BTF and 6.5 instead of INET_DIAG_DESTROY).
//!
//! Where: sock_diag answers about the namespace of the asking socket, so every pod
//! namespace is entered (`namespaces`): the agent's own (host-network pods, node
//! processes), then each one named under `/run/netns`. Entering needs CAP_SYS_ADMIN, which
//! the DaemonSet gives only to a sidecar (`reach`); the agent uses it when its socket is
//! there and its own threads otherwise.
//!
//! When something is missing, the dataplane is unaffected and only these sockets are:
//! the agent logs it once at error level (what is missing, which sockets it affects, how
//! to fix it), counts every such sweep in `kubeproxy_ebpf_udp_socket_sweeps_total` (by
//! result), and goes on. Namespaces it may not enter are searched by nobody; a kernel
//! without `SOCK_DESTROY` or UDP sock_diag stops the sweep. Failures are retried at the
//! next sync.

mod diag;
mod namespaces;
mod reach;
mod translations;

/// What the DaemonSet's socket-terminator sidecar and its tests use.
pub use self::{
    diag::SockId,
    namespaces::{Netns, Unsupported},
    reach::{NETNS_DIR, SIDECAR_SOCKET, Sidecar, SocketReach, serve},
    translations::{PinnedRevNat, Translations},
};
pub use crate::proxier::SocketSweep;
use std::{path::Path, sync::Arc};

use tracing::{debug, error, info, warn};

use self::translations::TranslatedUdp;
use crate::{
    model::{IpFamily, ServicePort},
    proxier::{
        SyncRequest,
        conntrack::{FlowVerdict, UdpFrontends},
    },
};

/// The translated sockets of `sockets` to destroy: those whose pair no longer serves (the
/// frontend is gone, or the backend no longer serves it). `frontends` holds each family's
/// UDP frontends; a family without any has no frontend left.
pub fn stale_sockets(
    frontends: &[(IpFamily, UdpFrontends)],
    sockets: &[(Netns, TranslatedUdp)],
) -> Vec<(Netns, TranslatedUdp)> {
    sockets
        .iter()
        .filter(|(_, socket)| {
            let verdict = frontends
                .iter()
                .find(|(family, _)| *family == socket.family())
                .map(|(_, f)| f.verdict(socket.frontend, socket.backend))
                .unwrap_or(FlowVerdict::Unknown);
            // Unknown: our program translated it, so its frontend was a UDP frontend;
            // now it is none.
            verdict != FlowVerdict::Serving
        })
        .cloned()
        .collect()
}

/// Runs the sweep after the syncs that call for one.
pub struct ConnectedUdpTerminator {
    reach: Box<dyn SocketReach>,
    translations: Box<dyn Translations>,
    /// Sweep at the next sync whatever it reports: the first sync (sockets older than the
    /// agent), and after a sweep that failed.
    due: bool,
    /// Replaced ports a failed sweep could not finish with.
    carried: Vec<Arc<ServicePort>>,
    warned_unreachable: bool,
    warned_unsupported: bool,
}

impl ConnectedUdpTerminator {
    pub fn new(reach: Box<dyn SocketReach>, translations: Box<dyn Translations>) -> Self {
        Self {
            reach,
            translations,
            due: true,
            carried: Vec::new(),
            warned_unreachable: false,
            warned_unsupported: false,
        }
    }

    /// The production set-up: the sidecar if it runs, the agent's own threads otherwise;
    /// `maps_dir` holds the pinned maps.
    pub fn for_node(maps_dir: &Path) -> Self {
        Self::new(
            Box::new(reach::Auto {
                sidecar_socket: reach::SIDECAR_SOCKET.into(),
                netns_dir: reach::NETNS_DIR.into(),
            }),
            Box::new(translations::PinnedRevNat {
                v4: maps_dir.join(proxy_common::maps::SOCK_REV_NAT4),
                v6: maps_dir.join(proxy_common::maps::SOCK_REV_NAT6),
            }),
        )
    }

    /// After a sync's maps are written (a socket connecting meanwhile already gets a live
    /// backend). Never fails the sync: the dataplane is right, only old sockets linger.
    pub fn after_sync(&mut self, request: &SyncRequest<'_>) -> SocketSweep {
        if !self.due && !request.stale.cleanup_required() {
            return SocketSweep::default();
        }
        let replaced: Vec<Arc<ServicePort>> = self
            .carried
            .drain(..)
            .chain(request.stale.replaced_udp_ports.iter().cloned())
            .collect();
        let frontends: Vec<(IpFamily, UdpFrontends)> = request
            .families
            .iter()
            .map(|state| {
                (
                    state.family,
                    UdpFrontends::new(
                        state,
                        replaced.iter().map(Arc::as_ref),
                        &request.node.host_addresses,
                    ),
                )
            })
            .collect();
        let sweep = self.sweep(&frontends);
        self.due = sweep.failed;
        if sweep.failed {
            self.carried = replaced;
        }
        sweep
    }

    fn sweep(&mut self, frontends: &[(IpFamily, UdpFrontends)]) -> SocketSweep {
        let mut out = SocketSweep {
            swept: true,
            ..Default::default()
        };
        let listing = match self.reach.list() {
            Ok(listing) => listing,
            Err(e) => {
                warn!(error = %e, "listing connected UDP sockets failed; retrying at the next sync");
                out.failed = true;
                return out;
            }
        };
        let mut unreachable: Vec<String> = listing
            .unreachable
            .iter()
            .filter(|u| u.permission)
            .map(|u| u.netns.clone())
            .collect();
        for u in listing.unreachable.iter().filter(|u| !u.permission) {
            // Namespaces that went away while being listed, mostly: their sockets went too.
            debug!(netns = %u.netns, reason = %u.reason, "network namespace skipped");
        }
        for e in &listing.errors {
            warn!(error = %e, "listing connected UDP sockets");
        }
        out.failed = !listing.errors.is_empty();
        out.unsupported = listing.unsupported;
        let translated = match self.translations.translated(&listing.sockets) {
            Ok(translated) => translated,
            Err(e) => {
                warn!(error = %e, "looking up connected UDP sockets' translations failed; retrying at the next sync");
                out.failed = true;
                return out;
            }
        };
        let stale = stale_sockets(frontends, &translated);
        if out.unsupported.is_none() && !stale.is_empty() {
            let targets = stale
                .iter()
                .map(|(netns, s)| (netns.clone(), s.id))
                .collect();
            match self.reach.destroy(targets) {
                Ok(done) => {
                    for (netns, id) in &done.destroyed {
                        let socket = stale.iter().find(|(_, s)| s.id == *id).map(|(_, s)| s);
                        info!(
                            netns = %netns,
                            socket = %id.local,
                            frontend = %socket.map(|s| s.frontend.to_string()).unwrap_or_default(),
                            backend = %id.peer,
                            "connected UDP socket terminated: its backend no longer serves its Service"
                        );
                    }
                    out.terminated = done.destroyed.len();
                    out.unsupported = done.unsupported;
                    for e in &done.errors {
                        warn!(error = %e, "terminating a connected UDP socket");
                    }
                    out.failed |= !done.errors.is_empty();
                    unreachable.extend(
                        done.unreachable
                            .iter()
                            .filter(|u| u.permission)
                            .map(|u| u.netns.clone()),
                    );
                }
                Err(e) => {
                    warn!(error = %e, "terminating connected UDP sockets failed; retrying at the next sync");
                    out.failed = true;
                }
            }
        }
        out.netns_unreachable = unreachable.len();
        self.report(&out, &unreachable, stale.len());
        out
    }

    /// The loud, once-only explanations of what cannot be done, and a debug line per sweep.
    fn report(&mut self, sweep: &SocketSweep, unreachable: &[String], stale: usize) {
        if let Some(missing) = sweep.unsupported
            && !self.warned_unsupported
        {
            error!(
                kernel_option = missing.kernel_option(),
                "this kernel cannot terminate sockets: applications that keep a connected \
                 UDP socket to a Service (DNS resolvers, QUIC, metrics agents) keep sending \
                 to a backend after it leaves the Service, until they reconnect; the \
                 dataplane is otherwise unaffected (counted in \
                 kubeproxy_ebpf_udp_socket_sweeps_total{{result=\"kernel_unsupported\"}})"
            );
            self.warned_unsupported = true;
        }
        if !unreachable.is_empty() && !self.warned_unreachable {
            error!(
                via = %self.reach.describe(),
                namespaces = unreachable.len(),
                first = unreachable.first().map(String::as_str).unwrap_or_default(),
                "cannot enter the pods' network namespaces (CAP_SYS_ADMIN): connected UDP \
                 sockets in pods keep sending to a backend after it leaves the Service, until \
                 they reconnect; run the socket-terminator sidecar (deploy/daemonset.yaml) or \
                 give the agent CAP_SYS_ADMIN (counted in \
                 kubeproxy_ebpf_udp_socket_sweeps_total{{result=\"netns_unreachable\"}})"
            );
            self.warned_unreachable = true;
        }
        debug!(
            result = sweep.result(),
            stale,
            terminated = sweep.terminated,
            unreachable = unreachable.len(),
            "connected UDP sockets swept"
        );
    }
}

#[cfg(test)]
mod tests;
