// SPDX-License-Identifier: Apache-2.0
//! Scenario objects through upstream's own API server (the `testbed` control plane): each
//! object is server-side applied as the file writes it (its `status` through the status
//! subresource), so the real validation, defaulting and allocation apply; the agent
//! watches it with the ServiceAccount and RBAC of `deploy/`, through a relay that listens
//! on the node namespace's own 127.0.0.1 (the control plane stays in the host's
//! namespace; loopback does not cross namespaces).
//!
//! A shared control plane serves one file after another: [`RealApiStore::new`] first
//! removes what an earlier file left (Services, EndpointSlices, Pods, Nodes and
//! ServiceCIDRs other than the API server's own), so runs that share it must not overlap
//! (the scenario tests run one at a time).
//!
//! The real server refuses a ClusterIP outside every ServiceCIDR. Files that name no
//! ServiceCIDR for their ClusterIPs get one each ([`covering_cidr`]): the smallest range
//! in which the address is allocatable, so that as few unallocated addresses as possible
//! fall inside a ServiceCIDR (which nftables and ebpf modes drop).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use ipnet::IpNet;
use k8s_openapi::api::{
    core::v1::{Node, Pod, Service},
    discovery::v1::EndpointSlice,
    networking::v1::ServiceCIDR,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams},
};
use serde_json::{Value, json};
use testbed::{ControlPlane, objects::Applier};

use super::{
    agent::Proxy,
    cluster::{AgentConnection, ObjectStore},
    error::{Error, Result},
    format::ObjectRef,
};

/// The ServiceAccounts the agent (deploy/serviceaccount.yaml) and upstream kube-proxy run as.
pub use testbed::objects::{
    AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, UPSTREAM_NAMESPACE, UPSTREAM_SERVICE_ACCOUNT,
};
/// What a file's ServiceCIDR `kubernetes` is called on the real server, whose own one
/// (from `--service-cluster-ip-range`) is immutable: the name means nothing to a proxy.
const RENAMED_DEFAULT_CIDR: &str = "scenario-kubernetes";
/// Names of the ServiceCIDRs made for a file's ClusterIPs.
const COVER_PREFIX: &str = "scenario-cover-";
/// How long a reset may take to see the previous file's objects gone.
const RESET_TIMEOUT: Duration = Duration::from_secs(60);

fn setup(context: &str, err: impl std::fmt::Display) -> Error {
    Error::Setup(format!("{context}: {err}"))
}

/// The smallest range holding `ip` in which the API server would allocate it: IPv4 ranges
/// never allocate their network and broadcast addresses, IPv6 ranges their network address
/// and are at least /64 long (upstream's `ipallocator`).
pub fn covering_cidr(ip: IpAddr) -> Option<IpNet> {
    let (shortest, longest) = match ip {
        IpAddr::V4(_) => (1u8, 31u8),
        IpAddr::V6(_) => (64, 127),
    };
    (shortest..=longest)
        .rev()
        .filter_map(|len| IpNet::new(ip, len).ok().map(|n| n.trunc()))
        .find(|net| allocatable_in(ip, net))
}

/// Disjoint ServiceCIDRs under which every one of `ips` is allocatable. The API server
/// allocates an address from the first ServiceCIDR it finds holding it (in no set order),
/// so no range may hold one of the addresses as its network or broadcast address, and
/// ranges do not nest: each address's own smallest range ([`covering_cidr`]) is merged
/// into any range it overlaps, and a range that holds an address it cannot allocate is
/// widened one bit, until neither happens.
pub fn covering_cidrs(ips: &BTreeSet<IpAddr>) -> Result<Vec<IpNet>> {
    let mut cidrs: BTreeSet<IpNet> = BTreeSet::new();
    for ip in ips {
        cidrs
            .insert(covering_cidr(*ip).ok_or_else(|| {
                Error::Invalid(format!("no ServiceCIDR can hold ClusterIP {ip}"))
            })?);
    }
    let no_fit = || {
        Error::Invalid(format!(
            "no set of ServiceCIDRs fits the ClusterIPs {ips:?}"
        ))
    };
    loop {
        let nested = cidrs.iter().find_map(|inner| {
            cidrs
                .iter()
                .find(|outer| *outer != inner && outer.contains(inner))
                .map(|_| *inner)
        });
        if let Some(inner) = nested {
            cidrs.remove(&inner);
            continue;
        }
        let unfit = cidrs
            .iter()
            .find(|c| {
                ips.iter()
                    .any(|ip| c.contains(ip) && !allocatable_in(*ip, c))
            })
            .copied();
        match unfit {
            Some(narrow) => {
                cidrs.remove(&narrow);
                cidrs.insert(narrow.supernet().ok_or_else(no_fit)?);
            }
            None => break,
        }
    }
    Ok(cidrs.into_iter().collect())
}

fn allocatable_in(ip: IpAddr, cidr: &IpNet) -> bool {
    let host_bits = u32::from(cidr.max_prefix_len() - cidr.prefix_len());
    if host_bits == 0 || (ip.is_ipv6() && cidr.prefix_len() < 64) {
        return false;
    }
    let value: u128 = match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    };
    let mask = if host_bits >= 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    };
    let host = value & mask;
    host != 0 && (ip.is_ipv6() || host != mask)
}

/// The ClusterIPs a Service object asks for (`clusterIP` and `clusterIPs`, not `None`).
pub fn requested_cluster_ips(service: &Value) -> BTreeSet<IpAddr> {
    let spec = &service["spec"];
    let mut ips: BTreeSet<IpAddr> = spec["clusterIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .chain(spec["clusterIP"].as_str())
        .filter_map(|s| s.parse().ok())
        .collect();
    ips.retain(|ip| !ip.is_unspecified());
    ips
}

fn cidrs_of(object: &Value) -> Vec<IpNet> {
    object["spec"]["cidrs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// The kinds whose `status` the scenario owns: applied (empty when the file has none),
/// so that a later stage that drops a status field drops it on the server too.
fn owns_status(kind: &str) -> bool {
    matches!(kind, "Service" | "Node" | "Pod")
}

/// Files upstream's 1.37 API server refuses, with what it says (a part of it): defects of
/// the files (of ../shared/scenarios, whose owner fixes them), replayed through the test
/// API server meanwhile. tests/tests/privileged/real_apiserver.rs checks that each is
/// still refused, so an entry cannot outlive its reason.
pub const REFUSED_BY_REAL_API: &[(&str, &str)] = &[(
    // Service.spec.clusterIP "172.30.0.041": the ClusterIP allocator takes only canonical
    // addresses, whatever StrictIPCIDRValidation says (a Service of an older release may
    // still hold one).
    "l6-non-canonical-ips.yaml",
    "failed to allocate IP 172.30.0.041",
)];

/// Whether the real API server is known to refuse this scenario file (see
/// [`REFUSED_BY_REAL_API`]).
pub fn refused_by_real_api(file: &Path) -> Option<&'static str> {
    let name = file.file_name()?.to_str()?;
    REFUSED_BY_REAL_API
        .iter()
        .find(|(listed, _)| *listed == name)
        .map(|(_, why)| *why)
}

pub struct RealApiStore {
    /// Runs the requests and the relay; shut down in the background on drop (a runtime
    /// must not be dropped inside another's context).
    runtime: Option<tokio::runtime::Runtime>,
    applier: Applier,
    plane: ControlPlane,
    kubeconfig: PathBuf,
    relay: SocketAddr,
    /// ServiceCIDRs the cluster holds now, by name.
    service_cidrs: BTreeMap<String, Vec<IpNet>>,
}

impl std::fmt::Debug for RealApiStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealApiStore")
            .field("server", &self.plane.server())
            .field("relay", &self.relay)
            .finish()
    }
}

impl RealApiStore {
    /// Uses the control plane in `plane_dir` for a node in `node_ns`: removes what an
    /// earlier user left, makes ServiceCIDRs for `cluster_ips` (see
    /// [`uncovered_cluster_ips`]), applies the agent's identity from `deploy/`, and writes
    /// the agent's kubeconfig into `run_dir` (its ServiceAccount token; the relay's URL).
    pub fn new(
        plane_dir: &Path,
        node_ns: &str,
        run_dir: &Path,
        cluster_ips: &BTreeSet<IpAddr>,
    ) -> Result<Self> {
        Self::for_proxy(Proxy::Ours, plane_dir, node_ns, run_dir, cluster_ips)
    }

    /// [`RealApiStore::new`] for `proxy`: ours with the identity deploy/ gives it, or
    /// upstream's kube-proxy with the one kubeadm gives it (`system:node-proxier`).
    pub fn for_proxy(
        proxy: Proxy,
        plane_dir: &Path,
        node_ns: &str,
        run_dir: &Path,
        cluster_ips: &BTreeSet<IpAddr>,
    ) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("real-api")
            .enable_all()
            .build()
            .map_err(|e| setup("starting the API client runtime", e))?;
        let plane = ControlPlane::attach(plane_dir)
            .map_err(|e| setup(&format!("the control plane in {}", plane_dir.display()), e))?;
        let admin_kubeconfig = plane.admin_kubeconfig().to_path_buf();
        let client = on(
            &runtime,
            testbed::control_plane::client_from_kubeconfig(&admin_kubeconfig),
        )
        .map_err(|e| setup("the admin client", e))?;
        let mut store = Self {
            applier: Applier::new(client),
            runtime: Some(runtime),
            kubeconfig: run_dir.join("kubeconfig"),
            relay: ([127, 0, 0, 1], 0).into(),
            service_cidrs: BTreeMap::new(),
            plane,
        };
        store.reset()?;
        store.cover(cluster_ips)?;
        store.apply_identity(proxy)?;
        store.start_relay(node_ns)?;
        let server = format!("https://{}", store.relay);
        let (namespace, account) = match proxy {
            Proxy::Ours => (AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT),
            Proxy::Upstream => (UPSTREAM_NAMESPACE, UPSTREAM_SERVICE_ACCOUNT),
        };
        let written = store.block(store.plane.write_service_account_kubeconfig(
            namespace,
            account,
            &server,
            &store.kubeconfig,
        ));
        written.map_err(|e| setup("the agent's kubeconfig", e))?;
        Ok(store)
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime
            .as_ref()
            .unwrap_or_else(|| unreachable!("the runtime lives until drop"))
    }

    /// Runs `future` to completion on the store's runtime, from whatever thread (inside
    /// another runtime or not) the caller is on.
    fn block<F: std::future::Future + Send>(&self, future: F) -> F::Output
    where
        F::Output: Send,
    {
        on(self.runtime(), future)
    }

    pub fn plane(&self) -> &ControlPlane {
        &self.plane
    }

    pub fn client(&self) -> kube::Client {
        self.applier.client().clone()
    }

    /// Where the agent reaches the API server, inside the node namespace.
    pub fn relay(&self) -> SocketAddr {
        self.relay
    }

    fn apply_identity(&mut self, proxy: Proxy) -> Result<()> {
        let applier = &mut self.applier;
        let runtime = self.runtime.as_ref().unwrap_or_else(|| unreachable!());
        match proxy {
            Proxy::Ours => on(runtime, testbed::objects::apply_agent_identity(applier))
                .map_err(|e| setup("applying the agent's identity from deploy/", e)),
            Proxy::Upstream => on(runtime, testbed::objects::apply_upstream_identity(applier))
                .map_err(|e| setup("applying upstream kube-proxy's identity", e)),
        }
    }

    fn start_relay(&mut self, node_ns: &str) -> Result<()> {
        let upstream: SocketAddr = ([127, 0, 0, 1], self.plane.state().apiserver_port).into();
        let runtime = self.runtime.as_ref().unwrap_or_else(|| unreachable!());
        let _guard = runtime.enter();
        let listener = testbed::relay::listen_in(node_ns, ([127, 0, 0, 1], 0).into())
            .map_err(Error::io("the relay's listener in the node namespace"))?;
        let address = listener
            .local_addr()
            .map_err(Error::io("the relay's listener"))?;
        runtime.spawn(testbed::relay::relay(listener, upstream));
        self.relay = address;
        Ok(())
    }

    /// Removes every Service, EndpointSlice, Pod, Node and ServiceCIDR but the API server's
    /// own (`default/kubernetes`, ServiceCIDR `kubernetes`), and waits until they are gone.
    pub fn reset(&mut self) -> Result<()> {
        let client = self.client();
        let outcome = self.block(async move { reset_cluster(&client).await });
        outcome.map_err(|e| setup("removing an earlier run's objects", e))?;
        self.service_cidrs = self
            .plane
            .state()
            .service_cidrs
            .iter()
            .filter_map(|c| c.parse().ok())
            .map(|c: IpNet| ("kubernetes".to_string(), c))
            .fold(BTreeMap::new(), |mut map, (name, cidr)| {
                map.entry(name).or_insert_with(Vec::new).push(cidr);
                map
            });
        Ok(())
    }

    /// Makes the ServiceCIDRs under which `cluster_ips` (those of the file's Services
    /// that no ServiceCIDR of the file holds) can be allocated ([`covering_cidrs`]), and
    /// waits until the API server allocates from them.
    fn cover(&mut self, cluster_ips: &BTreeSet<IpAddr>) -> Result<()> {
        for cidr in covering_cidrs(cluster_ips)? {
            let name = format!(
                "{COVER_PREFIX}{}-{}",
                cidr.addr().to_string().replace(['.', ':'], "-"),
                cidr.prefix_len()
            );
            let object = json!({
                "apiVersion": "networking.k8s.io/v1",
                "kind": "ServiceCIDR",
                "metadata": {"name": name},
                "spec": {"cidrs": [cidr.to_string()]},
            });
            let client = self.client();
            let applier = &mut self.applier;
            let runtime = self.runtime.as_ref().unwrap_or_else(|| unreachable!());
            on(runtime, async {
                applier.apply(&object).await?;
                wait_service_cidr_ready(&client, &name).await
            })
            .map_err(|e| setup(&format!("ServiceCIDR {cidr}"), e))?;
            self.service_cidrs.insert(name, vec![cidr]);
        }
        Ok(())
    }
}

/// The ClusterIPs of `objects`' Services that none of their ServiceCIDRs holds (objects of
/// every stage of a file: the ranges are made once, before the first).
pub fn uncovered_cluster_ips<'a>(
    objects: impl IntoIterator<Item = &'a Value> + Clone,
) -> BTreeSet<IpAddr> {
    let file_cidrs: Vec<IpNet> = objects
        .clone()
        .into_iter()
        .filter(|o| o["kind"] == "ServiceCIDR")
        .flat_map(cidrs_of)
        .collect();
    objects
        .into_iter()
        .filter(|o| o["kind"] == "Service")
        .flat_map(requested_cluster_ips)
        .filter(|ip| !file_cidrs.iter().any(|c| c.contains(ip)))
        .collect()
}

impl Drop for RealApiStore {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// `future` on `runtime`, from any thread: a scoped thread of its own blocks on it, so a
/// caller inside another runtime is never blocked inside that runtime's context.
fn on<F: std::future::Future + Send>(runtime: &tokio::runtime::Runtime, future: F) -> F::Output
where
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| runtime.block_on(future))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

async fn wait_service_cidr_ready(
    client: &kube::Client,
    name: &str,
) -> testbed::control_plane::Result<()> {
    let api = Api::<ServiceCIDR>::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = api.get_opt(name).await?.is_some_and(|cidr| {
            cidr.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(testbed::control_plane::ControlPlaneError::Other(format!(
                "ServiceCIDR {name} is not Ready after 30 s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn reset_cluster(client: &kube::Client) -> testbed::control_plane::Result<()> {
    let now = DeleteParams::default().grace_period(0);
    let own = |ns: Option<&str>, name: &str| ns == Some("default") && name == "kubernetes";
    let services = Api::<Service>::all(client.clone());
    let slices = Api::<EndpointSlice>::all(client.clone());
    let pods = Api::<Pod>::all(client.clone());
    let nodes = Api::<Node>::all(client.clone());
    let cidrs = Api::<ServiceCIDR>::all(client.clone());
    let deadline = Instant::now() + RESET_TIMEOUT;
    loop {
        let mut left = 0usize;
        for s in services.list(&ListParams::default()).await? {
            let (ns, name) = (
                s.metadata.namespace.as_deref(),
                s.metadata.name.clone().unwrap_or_default(),
            );
            if !own(ns, &name) {
                left += 1;
                let _ = Api::<Service>::namespaced(client.clone(), ns.unwrap_or("default"))
                    .delete(&name, &now)
                    .await;
            }
        }
        for s in slices.list(&ListParams::default()).await? {
            let (ns, name) = (
                s.metadata.namespace.as_deref(),
                s.metadata.name.clone().unwrap_or_default(),
            );
            if !own(ns, &name) {
                left += 1;
                let _ = Api::<EndpointSlice>::namespaced(client.clone(), ns.unwrap_or("default"))
                    .delete(&name, &now)
                    .await;
            }
        }
        for p in pods.list(&ListParams::default()).await? {
            left += 1;
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            let name = p.metadata.name.clone().unwrap_or_default();
            let _ = Api::<Pod>::namespaced(client.clone(), &ns)
                .delete(&name, &now)
                .await;
        }
        for n in nodes.list(&ListParams::default()).await? {
            left += 1;
            let _ = nodes
                .delete(&n.metadata.name.unwrap_or_default(), &now)
                .await;
        }
        // The ServiceCIDR controller holds a deleted range for 10 s (its deletionGracePeriod,
        // for allocations racing the deletion) before it drops the finalizer. Every Service
        // is gone first here, so nothing can be allocated from it: the harness drops the
        // finalizer itself instead of waiting, or each file would wait 10 s.
        let no_finalizers = kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}}));
        let services_left = !services
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .all(|s| {
                own(
                    s.metadata.namespace.as_deref(),
                    s.metadata.name.as_deref().unwrap_or_default(),
                )
            });
        for c in cidrs.list(&ListParams::default()).await? {
            let name = c.metadata.name.unwrap_or_default();
            if name != "kubernetes" {
                left += 1;
                if c.metadata.deletion_timestamp.is_none() {
                    let _ = cidrs.delete(&name, &now).await;
                }
                if !services_left {
                    let _ = cidrs
                        .patch(&name, &Default::default(), &no_finalizers)
                        .await;
                }
            }
        }
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(testbed::control_plane::ControlPlaneError::Other(format!(
                "{left} objects of an earlier run still there after {RESET_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The name an object of the file has on the real server (see [`RENAMED_DEFAULT_CIDR`]).
fn server_name(r: &ObjectRef) -> String {
    if r.kind == "ServiceCIDR" && r.name == "kubernetes" {
        RENAMED_DEFAULT_CIDR.to_string()
    } else {
        r.name.clone()
    }
}

impl ObjectStore for RealApiStore {
    fn put(&mut self, r: &ObjectRef, object: &Value) -> Result<()> {
        let mut object = object.clone();
        let name = server_name(r);
        object["metadata"]["name"] = json!(name);
        if owns_status(&r.kind)
            && let Some(map) = object.as_object_mut()
        {
            map.entry("status").or_insert_with(|| json!({}));
        }
        let applier = &mut self.applier;
        let runtime = self.runtime.as_ref().unwrap_or_else(|| unreachable!());
        on(runtime, applier.apply(&object))
            .map(drop)
            .map_err(|e| setup(&format!("the API server refused {r}"), e))?;
        if r.kind == "ServiceCIDR" {
            self.service_cidrs.insert(name, cidrs_of(&object));
        }
        Ok(())
    }

    fn remove(&mut self, r: &ObjectRef) -> Result<()> {
        let api_version = super::objects::api_version_of(&r.kind)
            .ok_or_else(|| Error::Invalid(format!("unknown kind in {r}")))?;
        let name = server_name(r);
        let mut object =
            json!({"apiVersion": api_version, "kind": r.kind, "metadata": {"name": name}});
        if let Some(ns) = &r.namespace {
            object["metadata"]["namespace"] = json!(ns);
        }
        let applier = &mut self.applier;
        let runtime = self.runtime.as_ref().unwrap_or_else(|| unreachable!());
        on(runtime, applier.delete(&object)).map_err(|e| setup(&format!("deleting {r}"), e))?;
        if r.kind == "ServiceCIDR" {
            self.service_cidrs.remove(&name);
        }
        Ok(())
    }

    fn connection(&self) -> AgentConnection {
        AgentConnection::Kubeconfig(self.kubeconfig.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cover(ip: &str) -> String {
        covering_cidr(ip.parse().unwrap()).unwrap().to_string()
    }

    #[test]
    fn a_covering_range_is_the_smallest_that_allocates_the_address() {
        assert_eq!(cover("172.30.0.41"), "172.30.0.40/30");
        assert_eq!(cover("172.30.0.42"), "172.30.0.40/30");
        // .40 and .43 are the network and broadcast of their /30.
        assert_eq!(cover("172.30.0.40"), "172.30.0.32/28");
        assert_eq!(cover("172.30.0.43"), "172.30.0.40/29");
        assert_eq!(cover("10.0.0.0"), "8.0.0.0/6");
        // IPv6 ranges allocate their last address, never their first.
        assert_eq!(cover("fd00:30::41"), "fd00:30::40/127");
        assert_eq!(cover("fd00:30::40"), "fd00:30::/121");
        // Nothing at least /64 long allocates a network address.
        assert_eq!(covering_cidr("fd00:30::".parse().unwrap()), None);
    }

    #[test]
    fn a_range_holding_an_address_as_its_edge_is_widened() {
        let ips: BTreeSet<IpAddr> = ["172.30.0.41", "172.30.0.43", "172.30.0.44"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let cidrs: Vec<String> = covering_cidrs(&ips)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        // .43 is the broadcast of .41's /30, and .44 the network of its own /30: one /29
        // holds all three.
        assert_eq!(cidrs, ["172.30.0.40/29"]);
        // .47 is the broadcast of its /29 and /28: its own range, a /27, takes them all in.
        let mut more = ips.clone();
        more.insert("172.30.0.47".parse().unwrap());
        let cidrs = covering_cidrs(&more).unwrap();
        assert_eq!(cidrs, ["172.30.0.32/27".parse::<IpNet>().unwrap()]);
        for ip in &more {
            let holding: Vec<&IpNet> = cidrs.iter().filter(|c| c.contains(ip)).collect();
            assert_eq!(holding.len(), 1, "{ip}: exactly one range");
            assert!(allocatable_in(*ip, holding[0]), "{ip} in {}", holding[0]);
        }
    }

    #[test]
    fn addresses_the_file_covers_get_no_range() {
        let objects = [
            json!({"kind": "ServiceCIDR", "spec": {"cidrs": ["172.30.0.0/16"]}}),
            json!({"kind": "Service", "spec": {"clusterIP": "172.30.0.1"}}),
            json!({"kind": "Service", "spec": {"clusterIPs": ["10.96.0.10", "fd00::10"]}}),
        ];
        let ips: Vec<String> = uncovered_cluster_ips(&objects)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(ips, ["10.96.0.10", "fd00::10"]);
    }

    #[test]
    fn a_services_cluster_ips_are_both_fields_without_none() {
        let service =
            json!({"spec": {"clusterIP": "172.30.0.1", "clusterIPs": ["172.30.0.1", "fd00::1"]}});
        let ips: Vec<String> = requested_cluster_ips(&service)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(ips, ["172.30.0.1", "fd00::1"]);
        assert!(requested_cluster_ips(&json!({"spec": {"clusterIP": "None"}})).is_empty());
        assert!(requested_cluster_ips(&json!({"spec": {}})).is_empty());
    }
}
