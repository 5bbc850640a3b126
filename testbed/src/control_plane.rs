// SPDX-License-Identifier: Apache-2.0
//! A real control plane on this machine: etcd, kube-apiserver (TLS with a CA of the run,
//! RBAC on) and kube-controller-manager limited to the EndpointSlice, EndpointSlice
//! mirroring and ServiceCIDR controllers. No kubelet, scheduler or container runtime: tests
//! create Nodes and Pods and set their status themselves (see [`crate::objects`]).
//!
//! Everything of one control plane lives in one directory: the PKI, the kubeconfigs, the
//! components' logs and data, and `state.json`, which lets another process use the same
//! control plane ([`ControlPlane::attach`]; `cargo xtask test` starts one for the whole
//! suite and names its directory in [`SHARED_ENV`]).

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use ipnet::IpNet;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::{Deserialize, Serialize};

use crate::{
    binaries::Binaries,
    kubeconfig::{self, Credentials},
    pki::{self, Authority, Identity},
    process::Component,
};

/// The directory of a control plane shared by every test of a run (set by `cargo xtask
/// test`); tests that only read and write objects use it instead of starting their own.
pub const SHARED_ENV: &str = "KPE_CONTROL_PLANE";

/// The identity of the harness itself: in `system:masters`, which API Priority and
/// Fairness exempts, so bulk loads are never throttled.
pub const ADMIN_USER: &str = "testbed-admin";

pub use crate::error::{ControlPlaneError, Result};

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ControlPlaneError {
    let context = context.into();
    move |source| ControlPlaneError::Io { context, source }
}

/// What kind of control plane to start.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where everything of this control plane goes; created, and removed by
    /// [`ControlPlane::stop`] unless `keep`.
    pub dir: PathBuf,
    /// `--service-cluster-ip-range`: also the default ServiceCIDR `kubernetes`, and where
    /// `default/kubernetes` gets its ClusterIP.
    pub service_cidrs: Vec<IpNet>,
    /// `--service-node-port-range`.
    pub node_port_range: String,
    /// `--feature-gates` of the API server and the controller manager.
    pub feature_gates: Vec<String>,
    /// Run kube-controller-manager (its EndpointSlice and ServiceCIDR controllers).
    pub controllers: bool,
    pub keep: bool,
}

/// Ranges no scenario file uses (TEST-NET-2's neighbour 198.18.0.0/15 is reserved for
/// benchmarking networks, RFC 2544; and a ULA of the same digits).
pub const DEFAULT_SERVICE_CIDRS: &[&str] = &["198.18.0.0/24", "fd00:198:18::/112"];

/// Feature gates every testbed control plane runs with.
///
/// `StrictIPCIDRValidation` (beta and on since 1.36) refuses new objects whose addresses
/// are written non-canonically (`10.180.00.001`); clusters upgraded from older releases
/// still hold such objects, which proxies must read as upstream's tests require, so the
/// testbed accepts them as a 1.35 server did.
pub const DEFAULT_FEATURE_GATES: &[&str] = &["StrictIPCIDRValidation=false"];

impl Options {
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            service_cidrs: DEFAULT_SERVICE_CIDRS
                .iter()
                .filter_map(|c| c.parse().ok())
                .collect(),
            // Upstream's test fixtures use NodePorts below 30000 (the scenario files
            // keep them), so every port is a valid NodePort here.
            node_port_range: "1-65535".into(),
            feature_gates: DEFAULT_FEATURE_GATES
                .iter()
                .map(|g| g.to_string())
                .collect(),
            controllers: true,
            keep: false,
        }
    }
}

/// What another process needs to use a running control plane (`state.json`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct State {
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    pub apiserver_port: u16,
    /// `http://127.0.0.1:<port>` (etcd's client URL, also its JSON gateway).
    pub etcd: String,
    pub ca_file: PathBuf,
    pub admin_kubeconfig: PathBuf,
    pub service_cidrs: Vec<String>,
    pub version: String,
    /// The process that owns the components (they die with it).
    pub owner_pid: u32,
}

const STATE_FILE: &str = "state.json";

/// How long each component may take to become ready on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// SIGTERM to SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(15);

pub struct ControlPlane {
    dir: PathBuf,
    state: State,
    ca_pem: String,
    /// `None` when attached to a control plane another process owns.
    owned: Option<Owned>,
}

struct Owned {
    options: Options,
    binaries: Binaries,
    authority: Authority,
    etcd: Option<Component>,
    apiserver: Option<Component>,
    controller_manager: Option<Component>,
    apiserver_args: Vec<String>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("dir", &self.dir)
            .field("server", &self.state.server)
            .field("owned", &self.owned.is_some())
            .finish()
    }
}

/// A free TCP port on 127.0.0.1 (bound, read, released: a component that loses the race
/// fails to start and says so in its log).
fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io("finding a free port"))?;
    let port = listener
        .local_addr()
        .map_err(io("finding a free port"))?
        .port();
    Ok(port)
}

/// The address this machine would send from towards the outside, if it has a route: the
/// API server advertises it for `default/kubernetes` (1.37 refuses a loopback one). No
/// packet is sent.
fn outward_ipv4() -> Option<Ipv4Addr> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    socket.connect((Ipv4Addr::new(192, 0, 2, 1), 9)).ok()?;
    match socket.local_addr().ok()?.ip() {
        IpAddr::V4(ip) if !ip.is_loopback() && !ip.is_unspecified() => Some(ip),
        _ => None,
    }
}

/// One plain-HTTP request to a loopback server (etcd's health and JSON gateway), answered
/// with (status, body). Connection: close, so the body is what remains after the headers.
pub fn plain_http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {response:.80}")))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

fn url_addr(url: &str) -> Result<SocketAddr> {
    let rest = url
        .split_once("://")
        .map(|(_, r)| r)
        .unwrap_or(url)
        .trim_end_matches('/');
    rest.parse()
        .map_err(|e| ControlPlaneError::Other(format!("{url}: not host:port: {e}")))
}

impl ControlPlane {
    /// Starts etcd, the API server and (with `options.controllers`) the controller manager,
    /// each waited for; the harness's admin identity and its kubeconfig are ready when this
    /// returns.
    pub async fn start(options: Options) -> Result<Self> {
        let binaries = Binaries::locate()?;
        let dir = options.dir.clone();
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io(format!("emptying {}", dir.display())))?;
        }
        for sub in ["pki", "etcd", "certs", "logs"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(io(format!("creating {}", dir.join(sub).display())))?;
        }
        let pki_dir = dir.join("pki");
        let authority = Authority::new("testbed-ca")?;
        let ca_file = pki::write_private(&pki_dir, "ca.crt", authority.cert_pem())?;
        let mut san_ips: Vec<IpAddr> = vec![
            Ipv4Addr::LOCALHOST.into(),
            "::1"
                .parse()
                .map_err(|e| ControlPlaneError::Other(format!("{e}")))?,
        ];
        // The first address of each service range: default/kubernetes, as in-cluster
        // clients reach it.
        san_ips.extend(options.service_cidrs.iter().filter_map(first_service_ip));
        let advertise = outward_ipv4();
        san_ips.extend(advertise.map(IpAddr::from));
        let serving = authority.serving(
            &san_ips,
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        )?;
        let serving_cert = pki::write_private(&pki_dir, "apiserver.crt", &serving.cert)?;
        let serving_key = pki::write_private(&pki_dir, "apiserver.key", &serving.key)?;
        let signing = pki::token_signing_key()?;
        let sa_pub = pki::write_private(&pki_dir, "sa.pub", &signing.cert)?;
        let sa_key = pki::write_private(&pki_dir, "sa.key", &signing.key)?;

        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let apiserver_port = free_port()?;
        let server = format!("https://127.0.0.1:{apiserver_port}");
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");

        let admin = authority.client(&Identity::new(ADMIN_USER, &["system:masters"]))?;
        let admin_kubeconfig = pki::write_private(
            &dir,
            "admin.kubeconfig",
            &kubeconfig::render(
                &server,
                authority.cert_pem(),
                ADMIN_USER,
                &Credentials::Certificate {
                    cert: admin.cert,
                    key: admin.key,
                },
            ),
        )?;

        let state = State {
            server: server.clone(),
            apiserver_port,
            etcd: etcd_url.clone(),
            ca_file: ca_file.clone(),
            admin_kubeconfig: admin_kubeconfig.clone(),
            service_cidrs: options
                .service_cidrs
                .iter()
                .map(ToString::to_string)
                .collect(),
            version: binaries.version(),
            owner_pid: std::process::id(),
        };

        let etcd_args = vec![
            "--name=testbed".to_string(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-cluster=testbed=http://127.0.0.1:{peer_port}"),
            // Tests never need durability across a machine crash.
            "--unsafe-no-fsync".to_string(),
            "--log-level=warn".to_string(),
        ];
        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={apiserver_port}"),
            "--bind-address=127.0.0.1".to_string(),
            format!("--tls-cert-file={}", serving_cert.display()),
            format!("--tls-private-key-file={}", serving_key.display()),
            format!("--cert-dir={}", dir.join("certs").display()),
            format!("--client-ca-file={}", ca_file.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            format!(
                "--service-cluster-ip-range={}",
                state.service_cidrs.join(",")
            ),
            format!("--service-node-port-range={}", options.node_port_range),
            "--authorization-mode=RBAC".to_string(),
            // No ServiceAccount controller runs: pods are admitted without one.
            "--disable-admission-plugins=ServiceAccount".to_string(),
            // The agent's DaemonSet is privileged (dry-run of deploy/).
            "--allow-privileged=true".to_string(),
            "--shutdown-delay-duration=0s".to_string(),
            "--profiling=false".to_string(),
            "--v=1".to_string(),
        ];
        match advertise {
            Some(ip) => apiserver_args.push(format!("--advertise-address={ip}")),
            // 1.37 refuses a loopback advertise address; without a route outwards there is
            // no other, and default/kubernetes goes without endpoints.
            None => apiserver_args.push("--endpoint-reconciler-type=none".to_string()),
        }
        if !options.feature_gates.is_empty() {
            apiserver_args.push(format!(
                "--feature-gates={}",
                options.feature_gates.join(",")
            ));
        }

        let logs = dir.join("logs");
        let etcd = Component::start(
            "etcd",
            &binaries.etcd(),
            &etcd_args,
            &logs.join("etcd.log"),
            STOP_GRACE,
        )?;
        let mut plane = ControlPlane {
            dir: dir.clone(),
            state,
            ca_pem: authority.cert_pem().to_string(),
            owned: Some(Owned {
                options: options.clone(),
                binaries: binaries.clone(),
                authority,
                etcd: Some(etcd),
                apiserver: None,
                controller_manager: None,
                apiserver_args,
            }),
        };
        plane.wait_etcd().await?;
        plane.start_apiserver().await?;
        if options.controllers {
            plane.start_controller_manager().await?;
        }
        plane.write_state()?;
        Ok(plane)
    }

    /// A control plane another process started (its directory).
    pub fn attach(dir: &Path) -> Result<Self> {
        let path = dir.join(STATE_FILE);
        let text =
            std::fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))?;
        let state: State = serde_json::from_str(&text).map_err(|e| ControlPlaneError::State {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let ca_pem = std::fs::read_to_string(&state.ca_file)
            .map_err(io(format!("reading {}", state.ca_file.display())))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            state,
            ca_pem,
            owned: None,
        })
    }

    /// The shared control plane of this run ([`SHARED_ENV`]), if there is one.
    pub fn shared() -> Option<Result<Self>> {
        let dir = std::env::var_os(SHARED_ENV)?;
        Some(Self::attach(Path::new(&dir)))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn server(&self) -> &str {
        &self.state.server
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub fn admin_kubeconfig(&self) -> &Path {
        &self.state.admin_kubeconfig
    }

    /// Whether this process started it (and may restart or stop its components).
    pub fn is_owned(&self) -> bool {
        self.owned.is_some()
    }

    /// A client with the harness's admin identity.
    pub async fn admin_client(&self) -> Result<kube::Client> {
        client_from_kubeconfig(&self.state.admin_kubeconfig).await
    }

    /// The logs of the components this process started, as (name, path).
    pub fn logs(&self) -> Vec<(String, PathBuf)> {
        let logs = self.dir.join("logs");
        ["etcd", "kube-apiserver", "kube-controller-manager"]
            .iter()
            .map(|n| (n.to_string(), logs.join(format!("{n}.log"))))
            .filter(|(_, p)| p.exists())
            .collect()
    }

    fn owned(&mut self) -> Result<&mut Owned> {
        self.owned.as_mut().ok_or_else(|| {
            ControlPlaneError::Other(
                "this control plane belongs to another process: it cannot be restarted from here"
                    .into(),
            )
        })
    }

    fn write_state(&self) -> Result<()> {
        let path = self.dir.join(STATE_FILE);
        let text = serde_json::to_string_pretty(&self.state)
            .map_err(|e| ControlPlaneError::Other(e.to_string()))?;
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))
    }

    async fn wait_etcd(&mut self) -> Result<()> {
        let addr = url_addr(&self.state.etcd)?;
        let started = Instant::now();
        loop {
            if let Ok((200, body)) = plain_http(addr, "GET", "/health", "")
                && body.contains("\"health\":\"true\"")
            {
                return Ok(());
            }
            self.check_alive("etcd", started, "GET /health is not healthy")?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails when the component exited or the time is up.
    fn check_alive(&mut self, name: &str, started: Instant, why: &str) -> Result<()> {
        let owned = self.owned()?;
        let component = match name {
            "etcd" => owned.etcd.as_mut(),
            "kube-apiserver" => owned.apiserver.as_mut(),
            _ => owned.controller_manager.as_mut(),
        };
        let Some(component) = component else {
            return Err(ControlPlaneError::Other(format!("{name} is not running")));
        };
        let exited = component.exited();
        if exited.is_some() || started.elapsed() > READY_TIMEOUT {
            let why = match exited {
                Some(status) => format!("it exited ({status})"),
                None => why.to_string(),
            };
            return Err(ControlPlaneError::NotReady {
                component: name.to_string(),
                waited: started.elapsed(),
                why,
                log: component.log().to_path_buf(),
                tail: component.log_tail(40),
            });
        }
        Ok(())
    }

    /// Starts the API server (again, with the same flags and port) and waits until
    /// `/readyz` answers `ok` and the default ServiceCIDR and `default/kubernetes` exist.
    pub async fn start_apiserver(&mut self) -> Result<()> {
        let log = self.dir.join("logs/kube-apiserver.log");
        let owned = self.owned()?;
        if owned.apiserver.is_some() {
            return Ok(());
        }
        let component = Component::start(
            "kube-apiserver",
            &owned.binaries.kube_apiserver(),
            &owned.apiserver_args,
            &log,
            STOP_GRACE,
        )?;
        self.owned()?.apiserver = Some(component);
        let started = Instant::now();
        let client = self.admin_client().await?;
        loop {
            let readyz = client
                .request_text(
                    http::Request::get("/readyz")
                        .body(Vec::new())
                        .map_err(|e| ControlPlaneError::Other(e.to_string()))?,
                )
                .await;
            if matches!(readyz.as_deref(), Ok("ok")) && self.defaults_exist(&client).await {
                return Ok(());
            }
            let why = match readyz {
                Ok(text) => format!("GET /readyz: {text:.200}"),
                Err(e) => format!("GET /readyz: {e}"),
            };
            self.check_alive("kube-apiserver", started, &why)?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn defaults_exist(&self, client: &kube::Client) -> bool {
        use k8s_openapi::api::{core::v1::Service, networking::v1::ServiceCIDR};
        let cidr = kube::Api::<ServiceCIDR>::all(client.clone())
            .get_opt("kubernetes")
            .await;
        let service = kube::Api::<Service>::namespaced(client.clone(), "default")
            .get_opt("kubernetes")
            .await;
        matches!((cidr, service), (Ok(Some(_)), Ok(Some(_))))
    }

    /// Stops the API server (SIGTERM, as an upgrade or a crash-looping pod would see it);
    /// etcd keeps the data.
    pub fn stop_apiserver(&mut self) -> Result<()> {
        if let Some(mut component) = self.owned()?.apiserver.take() {
            component.stop();
        }
        Ok(())
    }

    /// Stops and starts the API server, waiting until it is ready again.
    pub async fn restart_apiserver(&mut self) -> Result<()> {
        self.stop_apiserver()?;
        self.start_apiserver().await
    }

    async fn start_controller_manager(&mut self) -> Result<()> {
        let port = free_port()?;
        let owned = self.owned()?;
        let identity = Identity::new("system:kube-controller-manager", &["system:masters"]);
        let creds = owned.authority.client(&identity)?;
        let config = pki::write_private(
            &self.dir,
            "controller-manager.kubeconfig",
            &kubeconfig::render(
                &self.state.server,
                &self.ca_pem,
                &identity.user,
                &Credentials::Certificate {
                    cert: creds.cert,
                    key: creds.key,
                },
            ),
        )?;
        let cert_dir = self.dir.join("certs");
        let log = self.dir.join("logs/kube-controller-manager.log");
        let owned = self.owned()?;
        let mut args = vec![
            format!("--kubeconfig={}", config.display()),
            format!("--authentication-kubeconfig={}", config.display()),
            format!("--authorization-kubeconfig={}", config.display()),
            "--leader-elect=false".to_string(),
            "--controllers=endpointslice-controller,endpointslice-mirroring-controller,service-cidr-controller"
                .to_string(),
            "--use-service-account-credentials=false".to_string(),
            "--bind-address=127.0.0.1".to_string(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", cert_dir.display()),
            // Every change reaches the slices at once (upstream's default; said so that a
            // change of default does not slow the tests down silently).
            "--endpointslice-updates-batch-period=0s".to_string(),
            "--v=1".to_string(),
        ];
        if !owned.options.feature_gates.is_empty() {
            args.push(format!(
                "--feature-gates={}",
                owned.options.feature_gates.join(",")
            ));
        }
        let component = Component::start(
            "kube-controller-manager",
            &owned.binaries.kube_controller_manager(),
            &args,
            &log,
            STOP_GRACE,
        )?;
        owned.controller_manager = Some(component);
        self.wait_controllers().await
    }

    /// The controllers are ready when a Service with a selector and a ready Pod gets its
    /// EndpointSlice (the smoke test runs in a namespace of its own, removed afterwards).
    async fn wait_controllers(&mut self) -> Result<()> {
        let client = self.admin_client().await?;
        let started = Instant::now();
        let smoke = crate::objects::Smoke::create(&client).await?;
        loop {
            if smoke.has_slice(&client).await? {
                smoke.remove(&client).await?;
                return Ok(());
            }
            self.check_alive(
                "kube-controller-manager",
                started,
                "the smoke Service has no EndpointSlice with its Pod",
            )?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// etcd's current revision.
    pub fn etcd_revision(&self) -> Result<i64> {
        let addr = url_addr(&self.state.etcd)?;
        let (status, body) = plain_http(addr, "POST", "/v3/kv/range", r#"{"key":"AA=="}"#)
            .map_err(io("asking etcd for its revision"))?;
        let value: serde_json::Value = serde_json::from_str(&body).map_err(|e| {
            ControlPlaneError::Other(format!("etcd answered {status}: {e}: {body:.200}"))
        })?;
        value["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| {
                ControlPlaneError::Other(format!(
                    "etcd answered {status} without a revision: {body:.200}"
                ))
            })
    }

    /// Compacts etcd's history up to its current revision (physically): every watch that
    /// resumes from an older resourceVersion is then answered 410 Gone. Returns the
    /// revision compacted to.
    pub fn compact_etcd(&self) -> Result<i64> {
        let revision = self.etcd_revision()?;
        let addr = url_addr(&self.state.etcd)?;
        let (status, body) = plain_http(
            addr,
            "POST",
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        )
        .map_err(io("compacting etcd"))?;
        if status != 200 {
            return Err(ControlPlaneError::Other(format!(
                "etcd refused the compaction ({status}): {body:.200}"
            )));
        }
        Ok(revision)
    }

    /// A kubeconfig at `path` for a client-certificate identity, pointing at `server`
    /// (the API server's own URL, or a relay's).
    pub fn write_cert_kubeconfig(
        &mut self,
        identity: &Identity,
        server: &str,
        path: &Path,
    ) -> Result<PathBuf> {
        let owned = self.owned()?;
        let creds = owned.authority.client(identity)?;
        let text = kubeconfig::render(
            server,
            &self.ca_pem,
            &identity.user,
            &Credentials::Certificate {
                cert: creds.cert,
                key: creds.key,
            },
        );
        write_kubeconfig(path, &text)
    }

    /// A kubeconfig at `path` for ServiceAccount `namespace/name` (a token from the
    /// TokenRequest API, valid for a day), pointing at `server`.
    pub async fn write_service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        server: &str,
        path: &Path,
    ) -> Result<PathBuf> {
        let client = self.admin_client().await?;
        let token = crate::objects::service_account_token(&client, namespace, name).await?;
        let user = format!("system:serviceaccount:{namespace}:{name}");
        let text = kubeconfig::render(server, &self.ca_pem, &user, &Credentials::Token(token));
        write_kubeconfig(path, &text)
    }

    /// Stops every component this process started (controller manager, API server, etcd)
    /// and removes the directory unless the options keep it. Attached handles only forget.
    pub fn stop(&mut self) {
        let Some(mut owned) = self.owned.take() else {
            return;
        };
        for component in [
            owned.controller_manager.take(),
            owned.apiserver.take(),
            owned.etcd.take(),
        ]
        .into_iter()
        .flatten()
        {
            let mut component = component;
            component.stop();
        }
        if !owned.options.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

fn write_kubeconfig(path: &Path, text: &str) -> Result<PathBuf> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| ControlPlaneError::Other(format!("{}: not a file path", path.display())))?;
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    Ok(pki::write_private(dir, name, text)?)
}

/// The first address of a service range after its network address: the one the API server
/// gives default/kubernetes (in both families).
fn first_service_ip(cidr: &IpNet) -> Option<IpAddr> {
    match cidr.network() {
        IpAddr::V4(net) => u32::from(net).checked_add(1).map(|n| IpAddr::V4(n.into())),
        IpAddr::V6(net) => u128::from(net).checked_add(1).map(|n| IpAddr::V6(n.into())),
    }
    .filter(|ip| cidr.contains(ip))
}

/// A client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_ranges_parse_and_name_their_first_address() {
        let options = Options::new(Path::new("/nonexistent"));
        assert_eq!(options.service_cidrs.len(), DEFAULT_SERVICE_CIDRS.len());
        let first: Vec<String> = options
            .service_cidrs
            .iter()
            .filter_map(first_service_ip)
            .map(|ip| ip.to_string())
            .collect();
        assert_eq!(first, ["198.18.0.1", "fd00:198:18::1"]);
    }

    #[test]
    fn urls_name_their_socket() {
        assert_eq!(
            url_addr("http://127.0.0.1:2379").unwrap(),
            "127.0.0.1:2379".parse().unwrap()
        );
        assert!(url_addr("http://localhost").is_err());
    }
}
