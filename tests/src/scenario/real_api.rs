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
    cluster::{AgentConnection, ObjectStore},
    error::{Error, Result},
    format::ObjectRef,
};

/// The ServiceAccount the agent runs as, from deploy/serviceaccount.yaml.
pub const AGENT_NAMESPACE: &str = "kube-system";
pub const AGENT_SERVICE_ACCOUNT: &str = "kube-proxy-ebpf";
/// The manifests that give the agent its identity and permissions, as deployed.
pub const IDENTITY_MANIFESTS: &[&str] = &["deploy/serviceaccount.yaml", "deploy/rbac.yaml"];
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
    let (bits, shortest, longest) = match ip {
        IpAddr::V4(_) => (32u8, 1u8, 30u8),
        IpAddr::V6(_) => (128, 64, 127),
    };
    for len in (shortest..=longest).rev() {
        let net = IpNet::new(ip, len).ok()?.trunc();
        let host_bits = bits - len;
        let host: u128 = match ip {
            IpAddr::V4(v4) => u128::from(u32::from(v4)),
            IpAddr::V6(v6) => u128::from(v6),
        } & ((1u128 << host_bits) - 1);
        let all_ones = (1u128 << host_bits) - 1;
        let allocatable = host != 0 && (ip.is_ipv6() || host != all_ones);
        if allocatable {
            return Some(net);
        }
    }
    None
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
    /// earlier user left, applies the agent's identity from `deploy/`, and writes the
    /// agent's kubeconfig into `run_dir` (its ServiceAccount token; the relay's URL).
    pub fn new(plane_dir: &Path, node_ns: &str, run_dir: &Path) -> Result<Self> {
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
        store.apply_identity()?;
        store.start_relay(node_ns)?;
        let server = format!("https://{}", store.relay);
        let written = store.block(store.plane.write_service_account_kubeconfig(
            AGENT_NAMESPACE,
            AGENT_SERVICE_ACCOUNT,
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

    fn apply_identity(&mut self) -> Result<()> {
        let root = testbed::binaries::workspace_root();
        let mut documents = Vec::new();
        for manifest in IDENTITY_MANIFESTS {
            let path = root.join(manifest);
            let text = std::fs::read_to_string(&path)
                .map_err(Error::io(format!("reading {}", path.display())))?;
            for document in serde_yaml::Deserializer::from_str(&text) {
                let value: Value = serde::Deserialize::deserialize(document)?;
                if !value.is_null() {
                    documents.push(value);
                }
            }
        }
        let applier = &mut self.applier;
        on(
            self.runtime.as_ref().unwrap_or_else(|| unreachable!()),
            async {
                for document in &documents {
                    applier.apply(document).await?;
                }
                Ok::<_, testbed::control_plane::ControlPlaneError>(())
            },
        )
        .map_err(|e| setup("applying the agent's identity from deploy/", e))
    }

    fn start_relay(&mut self, node_ns: &str) -> Result<()> {
        let listener = super::netns::bind_tcp_listener_in(node_ns, ([127, 0, 0, 1], 0).into())?;
        listener
            .set_nonblocking(true)
            .map_err(Error::io("the relay's listener"))?;
        self.relay = listener
            .local_addr()
            .map_err(Error::io("the relay's listener"))?;
        let upstream: SocketAddr = ([127, 0, 0, 1], self.plane.state().apiserver_port).into();
        let runtime = self.runtime();
        let _guard = runtime.enter();
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(Error::io("the relay's listener"))?;
        runtime.spawn(relay(listener, upstream));
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

    fn covered(&self, ip: IpAddr) -> bool {
        self.service_cidrs
            .values()
            .flatten()
            .any(|cidr| cidr.contains(&ip))
    }

    /// Makes a ServiceCIDR for each of the Service's ClusterIPs that none holds yet, and
    /// waits until the API server allocates from it.
    fn cover(&mut self, service: &Value) -> Result<()> {
        let missing: Vec<IpAddr> = requested_cluster_ips(service)
            .into_iter()
            .filter(|ip| !self.covered(*ip))
            .collect();
        for ip in missing {
            let cidr = covering_cidr(ip)
                .ok_or_else(|| Error::Invalid(format!("no ServiceCIDR can hold ClusterIP {ip}")))?;
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
            .map_err(|e| setup(&format!("ServiceCIDR {cidr} for ClusterIP {ip}"), e))?;
            self.service_cidrs.insert(name, vec![cidr]);
        }
        Ok(())
    }
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

async fn relay(listener: tokio::net::TcpListener, upstream: SocketAddr) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            // The API server away: the agent sees its connection closed, as it would see a
            // refused one.
            let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
        });
    }
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
        for c in cidrs.list(&ListParams::default()).await? {
            let name = c.metadata.name.unwrap_or_default();
            if name != "kubernetes" {
                left += 1;
                if c.metadata.deletion_timestamp.is_none() {
                    let _ = cidrs.delete(&name, &now).await;
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
        if r.kind == "Service" {
            self.cover(object)?;
        }
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
        assert_eq!(cover("172.30.0.43"), "172.30.0.32/28");
        assert_eq!(cover("10.0.0.0"), "8.0.0.0/6");
        // IPv6 ranges allocate their last address, never their first.
        assert_eq!(cover("fd00:30::41"), "fd00:30::40/127");
        assert_eq!(cover("fd00:30::40"), "fd00:30::40/126");
        // Nothing at least /64 long allocates a network address.
        assert_eq!(covering_cidr("fd00:30::".parse().unwrap()), None);
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
