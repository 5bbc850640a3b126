// SPDX-License-Identifier: Apache-2.0
//! Which connected UDP sockets go, and when the agent looks: the pure choice over listed
//! sockets, and the terminator's schedule and reports over a fake reach.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use super::{
    diag::SockId,
    namespaces::{Destroyed, Listing, Netns, Unreachable, Unsupported},
    reach::{self, SocketReach},
    translations::{TranslatedUdp, Translations, TranslationsError},
    *,
};
use crate::{
    k8s::fixtures::{mk_endpoint, mk_endpointslice, mk_service},
    model::ClusterState,
    node::NodeAddresses,
    proxier::NodeContext,
};

const VIP: &str = "172.30.0.41";
const FIRST: &str = "10.180.0.1";
const SECOND: &str = "10.180.0.2";

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn pod_netns(name: &str) -> Netns {
    Netns {
        path: Some(PathBuf::from("/run/netns").join(name)),
        dev: 4,
        ino: name.len() as u64,
    }
}

/// A socket in `netns` from `local`, translated from `frontend` to `backend` (its peer).
fn socket(netns: &str, local: &str, frontend: &str, backend: &str) -> (Netns, TranslatedUdp) {
    let local = sa(local);
    (
        pod_netns(netns),
        TranslatedUdp {
            id: SockId {
                local,
                peer: sa(backend),
                ifindex: 0,
                cookie: u64::from(local.port()),
            },
            frontend: sa(frontend),
            backend: sa(backend),
        },
    )
}

fn dns_service(protocol: &str) -> Service {
    mk_service("ns1", "dns")
        .cluster_ip(VIP)
        .port("p", 53, protocol)
        .build()
}

fn dns_slice(protocol: &str, endpoints: &[&str]) -> EndpointSlice {
    let mut slice = mk_endpointslice("ns1", "dns-1", "dns", "IPv4").port("p", 5353, protocol);
    for ep in endpoints {
        slice = slice.endpoint(mk_endpoint(ep).node("node-a").build());
    }
    slice.build()
}

fn node() -> NodeContext {
    NodeContext {
        name: "node-a".into(),
        primary_ips: NodeAddresses {
            v4: Some("192.168.0.2".parse().unwrap()),
            v6: None,
        },
        host_addresses: vec!["192.168.0.2".parse().unwrap()],
        ..Default::default()
    }
}

/// What the fake was asked.
#[derive(Default)]
struct Calls {
    lists: usize,
    destroyed: Vec<SockId>,
}

/// Sockets listed from memory; destroying removes them.
struct FakeReach {
    listing: Listing,
    fail_list: bool,
    unsupported_destroy: bool,
    calls: Arc<Mutex<Calls>>,
}

impl SocketReach for FakeReach {
    fn list(&mut self) -> reach::Result<Listing> {
        self.calls.lock().unwrap().lists += 1;
        if self.fail_list {
            return Err(reach::ReachError::Answer("fake failure".into()));
        }
        Ok(self.listing.clone())
    }

    fn destroy(&mut self, targets: Vec<(Netns, SockId)>) -> reach::Result<Destroyed> {
        if self.unsupported_destroy {
            return Ok(Destroyed {
                unsupported: Some(Unsupported::SockDestroy),
                ..Default::default()
            });
        }
        let mut calls = self.calls.lock().unwrap();
        calls.destroyed.extend(targets.iter().map(|(_, id)| *id));
        self.listing
            .sockets
            .retain(|(_, s)| !targets.iter().any(|(_, id)| id == s));
        Ok(Destroyed {
            destroyed: targets,
            ..Default::default()
        })
    }

    fn describe(&self) -> String {
        "a fake".into()
    }
}

/// The translations our program recorded, from memory.
struct FakeTranslations(Vec<TranslatedUdp>);

impl Translations for FakeTranslations {
    fn translated(
        &mut self,
        sockets: &[(Netns, SockId)],
    ) -> Result<Vec<(Netns, TranslatedUdp)>, TranslationsError> {
        Ok(sockets
            .iter()
            .filter_map(|(netns, id)| {
                self.0
                    .iter()
                    .find(|t| t.id == *id)
                    .map(|t| (netns.clone(), *t))
            })
            .collect())
    }
}

/// A fake reach listing `sockets` (translated ones and, in `direct`, sockets connected to
/// a pod directly, which have no translation).
fn fake(
    sockets: &[(Netns, TranslatedUdp)],
    direct: &[(Netns, TranslatedUdp)],
) -> (FakeReach, FakeTranslations) {
    let listed = sockets
        .iter()
        .chain(direct)
        .map(|(netns, t)| (netns.clone(), t.id))
        .collect();
    (
        FakeReach {
            listing: Listing {
                sockets: listed,
                searched: 3,
                ..Default::default()
            },
            fail_list: false,
            unsupported_destroy: false,
            calls: Arc::default(),
        },
        FakeTranslations(sockets.iter().map(|(_, t)| *t).collect()),
    )
}

struct Harness {
    cluster: ClusterState,
    node: NodeContext,
    terminator: ConnectedUdpTerminator,
    calls: Arc<Mutex<Calls>>,
}

impl Harness {
    fn new(sockets: Vec<(Netns, TranslatedUdp)>) -> Self {
        Self::with(fake(&sockets, &[]))
    }

    fn with((reach, translations): (FakeReach, FakeTranslations)) -> Self {
        let calls = reach.calls.clone();
        Self {
            cluster: ClusterState::new(&[IpFamily::V4], "node-a"),
            node: node(),
            terminator: ConnectedUdpTerminator::new(Box::new(reach), Box::new(translations)),
            calls,
        }
    }

    fn sync(&mut self) -> SocketSweep {
        let applied = self.cluster.apply_pending();
        let request = SyncRequest {
            families: self.cluster.families(),
            node: &self.node,
            full: false,
            changed: &applied.changed,
            stale: &applied.stale,
        };
        self.terminator.after_sync(&request)
    }

    fn destroyed(&self) -> Vec<SocketAddr> {
        self.calls
            .lock()
            .unwrap()
            .destroyed
            .iter()
            .map(|id| id.local)
            .collect()
    }

    fn lists(&self) -> usize {
        self.calls.lock().unwrap().lists
    }
}

fn frontends_of(cluster: &ClusterState, node: &NodeContext) -> Vec<(IpFamily, UdpFrontends)> {
    cluster
        .families()
        .iter()
        .map(|s| (s.family, UdpFrontends::new(s, [], &node.host_addresses)))
        .collect()
}

#[test]
fn only_sockets_on_a_backend_that_left_their_frontend_are_stale() {
    let mut cluster = ClusterState::new(&[IpFamily::V4], "node-a");
    cluster.service(&Arc::new(dns_service("UDP")), false);
    cluster.endpoint_slice(&dns_slice("UDP", &[SECOND]), false);
    cluster.apply_pending();
    let frontends = frontends_of(&cluster, &node());
    let on_removed = socket("p0", "10.0.0.2:40000", "172.30.0.41:53", "10.180.0.1:5353");
    let on_live = socket("p0", "10.0.0.2:40001", "172.30.0.41:53", "10.180.0.2:5353");
    // A frontend no Service has any more (deleted while nobody looked).
    let gone = socket("p1", "10.0.0.3:40000", "172.30.0.99:53", "10.180.0.2:5353");
    // The right backend, but another port of it.
    let old_port = socket("p1", "10.0.0.3:40001", "172.30.0.41:53", "10.180.0.2:53");
    let all = vec![on_removed.clone(), on_live, gone.clone(), old_port.clone()];
    assert_eq!(
        stale_sockets(&frontends, &all),
        vec![on_removed, gone, old_port]
    );
}

#[test]
fn a_family_without_frontends_leaves_nothing_serving() {
    let v6 = socket(
        "p0",
        "[fd00::2]:40000",
        "[fd00:30::41]:53",
        "[fd00:180::1]:5353",
    );
    assert_eq!(stale_sockets(&[], std::slice::from_ref(&v6)), vec![v6]);
}

#[test]
fn the_first_sync_sweeps_then_only_udp_changes_do() {
    let on_first = socket("p0", "10.0.0.2:40000", "172.30.0.41:53", "10.180.0.1:5353");
    let on_second = socket("p0", "10.0.0.2:40001", "172.30.0.41:53", "10.180.0.2:5353");
    // Connected to the first pod directly: listed, never translated.
    let direct = socket("p0", "10.0.0.2:40002", "10.180.0.1:5353", "10.180.0.1:5353");
    let mut h = Harness::with(fake(&[on_first, on_second], &[direct]));
    h.cluster.service(&Arc::new(dns_service("UDP")), false);
    h.cluster
        .endpoint_slice(&dns_slice("UDP", &[FIRST, SECOND]), false);
    let first = h.sync();
    assert!(first.swept, "sockets older than the agent are looked at");
    assert_eq!(first.terminated, 0, "both backends serve");
    assert_eq!(first.result(), "complete");
    assert_eq!(h.lists(), 1);

    // Nothing changed: no sweep.
    assert_eq!(h.sync(), SocketSweep::default());
    // A TCP service changing is no reason either.
    h.cluster.service(
        &Arc::new(
            mk_service("ns1", "web")
                .cluster_ip("172.30.0.80")
                .port("http", 80, "TCP")
                .build(),
        ),
        false,
    );
    assert!(!h.sync().swept);
    assert_eq!(h.lists(), 1);

    // The first backend leaves: its translated socket goes; the other one, and the one
    // connected to the pod directly, stay.
    h.cluster
        .endpoint_slice(&dns_slice("UDP", &[SECOND]), false);
    let sweep = h.sync();
    assert!(sweep.swept);
    assert_eq!(sweep.terminated, 1);
    assert_eq!(h.destroyed(), vec![sa("10.0.0.2:40000")]);
}

#[test]
fn a_deleted_service_takes_its_sockets() {
    let s = socket("p0", "10.0.0.2:40000", "172.30.0.41:53", "10.180.0.1:5353");
    let mut h = Harness::new(vec![s]);
    h.cluster.service(&Arc::new(dns_service("UDP")), false);
    h.cluster.endpoint_slice(&dns_slice("UDP", &[FIRST]), false);
    h.sync();
    assert!(h.destroyed().is_empty());
    h.cluster.service(&Arc::new(dns_service("UDP")), true);
    let sweep = h.sync();
    assert_eq!(sweep.terminated, 1, "{sweep:?}");
}

#[test]
fn a_failed_sweep_is_retried_at_the_next_sync() {
    let s = socket("p0", "10.0.0.2:40000", "172.30.0.41:53", "10.180.0.1:5353");
    let (mut reach, translations) = fake(&[s], &[]);
    reach.fail_list = true;
    let mut h = Harness::with((reach, translations));
    h.cluster.service(&Arc::new(dns_service("UDP")), false);
    h.cluster.endpoint_slice(&dns_slice("UDP", &[FIRST]), false);
    let sweep = h.sync();
    assert!(sweep.failed);
    assert_eq!(sweep.result(), "failed");
    // Nothing changes, but the sweep is due again.
    assert!(h.sync().swept);
    assert_eq!(h.lists(), 2);
}

#[test]
fn namespaces_out_of_reach_are_reported_not_retried() {
    let (mut reach, translations) = fake(&[], &[]);
    reach.listing.searched = 1;
    reach.listing.unreachable = vec![
        Unreachable {
            netns: "/run/netns/p0".into(),
            reason: "setns: EPERM".into(),
            permission: true,
        },
        Unreachable {
            netns: "/run/netns/gone".into(),
            reason: "No such file or directory".into(),
            permission: false,
        },
    ];
    let mut h = Harness::with((reach, translations));
    h.cluster.service(&Arc::new(dns_service("UDP")), false);
    let sweep = h.sync();
    assert_eq!(
        sweep.netns_unreachable, 1,
        "a vanished namespace is not a privilege problem"
    );
    assert_eq!(sweep.result(), "netns_unreachable");
    assert!(!sweep.failed, "retrying cannot help");
    assert!(h.terminator.warned_unreachable, "said once, loudly");
    assert!(!h.sync().swept);
}

#[test]
fn a_kernel_without_sock_destroy_is_reported() {
    let s = socket("p0", "10.0.0.2:40000", "172.30.0.41:53", "10.180.0.1:5353");
    let (mut reach, translations) = fake(&[s], &[]);
    reach.unsupported_destroy = true;
    let mut h = Harness::with((reach, translations));
    h.cluster.service(&Arc::new(dns_service("UDP")), false);
    let sweep = h.sync();
    assert_eq!(sweep.unsupported, Some(Unsupported::SockDestroy));
    assert_eq!(sweep.terminated, 0);
    assert_eq!(sweep.result(), "kernel_unsupported");
    assert!(h.terminator.warned_unsupported);
}

#[test]
fn requests_and_answers_survive_the_sidecar_socket() {
    let (netns, s) = socket("p0", "10.0.0.2:40000", "172.30.0.41:53", "10.180.0.1:5353");
    let request = reach::Request::Destroy {
        targets: vec![(netns.clone(), s.id)],
    };
    let text = serde_json::to_string(&request).unwrap();
    let back: reach::Request = serde_json::from_str(&text).unwrap();
    let reach::Request::Destroy { targets } = back else {
        panic!("{text}")
    };
    assert_eq!(targets, vec![(netns.clone(), s.id)]);
    let answer = reach::Response::Listed(Listing {
        sockets: vec![(netns, s.id)],
        searched: 2,
        unsupported: Some(Unsupported::UdpDiag),
        ..Default::default()
    });
    let text = serde_json::to_string(&answer).unwrap();
    let reach::Response::Listed(listing) = serde_json::from_str(&text).unwrap() else {
        panic!("{text}")
    };
    assert_eq!(listing.sockets[0].1, s.id);
    assert_eq!(listing.unsupported, Some(Unsupported::UdpDiag));
}

#[test]
fn the_sidecar_answers_over_its_unix_socket() {
    let dir = std::env::temp_dir().join(format!("kpe-sockterm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("socket");
    let (serve_path, netns_dir) = (path.clone(), dir.join("netns"));
    std::thread::spawn(move || reach::serve(&serve_path, &netns_dir));
    for _ in 0..100 {
        if path.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut sidecar = reach::Sidecar {
        socket: path.clone(),
    };
    // Nothing to destroy: an empty answer, over the real socket.
    assert_eq!(sidecar.destroy(Vec::new()).unwrap(), Destroyed::default());
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "only root may ask");
    let _ = std::fs::remove_dir_all(&dir);
}
