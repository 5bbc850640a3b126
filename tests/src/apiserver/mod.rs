// SPDX-License-Identifier: Apache-2.0
//! A test Kubernetes API server speaking enough of the real protocol for kube-rs
//! clients: list (with paging and resourceVersion rules), watch (history replay,
//! BOOKMARKs, `410 Expired`, `timeoutSeconds`), get/create/update/patch/delete, and
//! discovery, over plain HTTP on 127.0.0.1.
//!
//! Served types: core/v1 Services, Nodes and Events, discovery.k8s.io/v1
//! EndpointSlices, networking.k8s.io/v1 ServiceCIDRs and events.k8s.io/v1 Events.
//! Like etcd, one resourceVersion counter spans every type.
//!
//! Faults for tests: [`TestApiServer::compact`] (the next watch from an older
//! resourceVersion gets `410 Expired`), [`TestApiServer::drop_watches`] (connection
//! drop mid-watch), [`TestApiServer::set_outage`] (connections closed, or 503s).
//! Observation: [`TestApiServer::requests`] / [`TestApiServer::request_count`],
//! [`TestApiServer::open_watches`], [`TestApiServer::bookmarks_sent`],
//! [`TestApiServer::events`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::core::v1::Service;
//! use kube::{Api, runtime::{WatchStreamExt, reflector, watcher}};
//! use tests::apiserver::{TestApiServer, Verb};
//!
//! let server = TestApiServer::start().await?;
//! let mut svc = Service::default();
//! svc.metadata.name = Some("web".into());
//! server.create(&svc)?; // namespace defaults to "default"
//!
//! let (store, writer) = reflector::store::<Service>();
//! let api = Api::<Service>::all(server.client()?);
//! let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()).default_backoff());
//! tokio::spawn(futures::StreamExt::for_each(stream, |_| async {}));
//! store.wait_until_ready().await?;
//!
//! server.set_unavailable(true); // the API server goes away
//! server.delete::<Service>(None, "web")?;
//! server.compact(); // the watcher's resourceVersion is now too old: 410, relist
//! server.set_unavailable(false);
//! server.wait_until(std::time::Duration::from_secs(10), |s| s.request_count(Verb::List, "services") >= 2).await;
//! # Ok(()) }
//! ```

mod error;
mod http;
mod kubeconfig;
mod object;
mod requests;
mod resources;
mod selector;
mod serve;
mod store;
mod watch;

use std::{
    net::SocketAddr,
    path::Path,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use kube::Resource;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use tokio::{net::TcpListener, task::JoinHandle};

pub use self::{
    error::{Error, Result},
    kubeconfig::CONTEXT_NAME,
    requests::{RecordedRequest, Verb},
};
use self::{
    resources::{CORE_EVENTS, ResourceKind},
    store::Store,
};

/// Tunables of a [`TestApiServer`].
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// How often an idle watch that allows bookmarks gets a BOOKMARK (the real
    /// apiserver: about a minute).
    pub bookmark_interval: Duration,
    /// How many changes are kept for watch resumption and paging; older ones are
    /// compacted away, as etcd and the watch cache do.
    pub history_limit: usize,
    /// Watch duration when the client sends no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
    /// Resources (plural names) answered 404, as by an API server that predates them
    /// (`servicecidrs` before Kubernetes 1.33).
    pub unserved: Vec<&'static str>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bookmark_interval: Duration::from_secs(1),
            history_limit: 10_000,
            default_watch_timeout: Duration::from_secs(1800),
            unserved: Vec::new(),
        }
    }
}

/// How the server fails while the API is "down".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outage {
    /// Serving normally.
    #[default]
    None,
    /// Every open connection is cut and new ones are closed as soon as accepted, as
    /// when the apiserver process is gone. Clients see transport errors.
    ConnectionsClosed,
    /// Every request is answered `503 ServiceUnavailable`, as a load balancer in
    /// front of a dead apiserver would. Open watches are cut. Note that kube-rs
    /// clients retry 503s internally (exponential backoff from 5 ms, 15 attempts), so
    /// a short outage of this kind is invisible to the caller beyond latency.
    ServiceUnavailable,
}

/// State shared by the HTTP handlers and the test's handle.
pub(crate) struct Shared {
    store: Mutex<Store>,
    config: ServerConfig,
    outage: Mutex<Outage>,
    /// Bumped to cut every open connection.
    cut_connections: tokio::sync::watch::Sender<u64>,
    /// Connections closed as soon as accepted ([`Outage::ConnectionsClosed`]).
    refused_connections: std::sync::atomic::AtomicUsize,
    requests: Mutex<Vec<RecordedRequest>>,
    bookmarks: AtomicU64,
}

impl Shared {
    fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn current_rv(&self) -> u64 {
        self.store().current_rv()
    }

    fn count_bookmark(&self) {
        self.bookmarks.fetch_add(1, Ordering::Relaxed);
    }

    fn outage(&self) -> Outage {
        *self.outage.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count_refused_connection(&self) {
        self.refused_connections.fetch_add(1, Ordering::Relaxed);
    }

    fn cut_all_connections(&self) {
        self.cut_connections
            .send_modify(|generation| *generation += 1);
    }

    fn requests(&self) -> MutexGuard<'_, Vec<RecordedRequest>> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, request: RecordedRequest) {
        self.requests().push(request);
    }
}

/// A running test API server. Dropping it stops accepting connections and cuts
/// every open one.
pub struct TestApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept_task: JoinHandle<()>,
    /// Accept loops of the listeners added by [`TestApiServer::also_serve_on`].
    more_accept_tasks: Vec<JoinHandle<()>>,
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.accept_task.abort();
        for task in &self.more_accept_tasks {
            task.abort();
        }
        self.shared.store().drop_watches();
        self.shared.cut_all_connections();
    }
}

/// The served type of a typed object, from its `apiVersion` and `kind`.
fn kind_of<K: Resource<DynamicType = ()>>() -> Result<&'static ResourceKind> {
    let (api_version, kind) = (K::api_version(&()), K::kind(&()));
    resources::by_type(&api_version, &kind).ok_or_else(|| Error::UnknownKind {
        api_version: api_version.into_owned(),
        kind: kind.into_owned(),
    })
}

/// The served type of a raw object; a namespaced object without a namespace is put
/// in `default`, as kubectl would.
fn kind_of_value(object: &mut Value) -> Result<&'static ResourceKind> {
    let field = |name: &str| {
        object
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    let resource =
        resources::by_type(&api_version, &kind).ok_or(Error::UnknownKind { api_version, kind })?;
    if resource.namespaced
        && object::namespace(object).is_none()
        && let Some(meta) = object::metadata_mut(object)
    {
        meta.insert("namespace".into(), Value::String("default".into()));
    }
    Ok(resource)
}

fn from_stored<K: DeserializeOwned>(object: &Value) -> Result<K> {
    Ok(serde_json::from_value(object.clone())?)
}

impl TestApiServer {
    /// Starts a server with [`ServerConfig::default`] on an ephemeral port of 127.0.0.1.
    pub async fn start() -> Result<Self> {
        Self::start_with(ServerConfig::default()).await
    }

    pub async fn start_with(config: ServerConfig) -> Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(Error::Bind)?;
        Self::serve_on(listener, config)
    }

    /// Serves on a listener the caller bound, e.g. inside another network namespace (a
    /// socket stays in the namespace it was created in), so that an agent running there
    /// reaches the server on that namespace's 127.0.0.1.
    pub fn start_on(listener: std::net::TcpListener, config: ServerConfig) -> Result<Self> {
        listener.set_nonblocking(true).map_err(Error::Bind)?;
        let listener = TcpListener::from_std(listener).map_err(Error::Bind)?;
        Self::serve_on(listener, config)
    }

    fn serve_on(listener: TcpListener, config: ServerConfig) -> Result<Self> {
        let addr = listener.local_addr().map_err(Error::Bind)?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(config.history_limit)),
            config,
            outage: Mutex::new(Outage::None),
            cut_connections: tokio::sync::watch::Sender::new(0),
            refused_connections: std::sync::atomic::AtomicUsize::new(0),
            requests: Mutex::new(Vec::new()),
            bookmarks: AtomicU64::new(0),
        });
        let accept_task = tokio::spawn(serve::accept_loop(listener, shared.clone()));
        Ok(Self {
            shared,
            addr,
            accept_task,
            more_accept_tasks: Vec::new(),
        })
    }

    /// Serves the same objects on one more listener the caller bound (another network
    /// namespace's 127.0.0.1: one server for the agents of several node namespaces).
    /// Returns the kubeconfig YAML that reaches the server through it.
    pub fn also_serve_on(&mut self, listener: std::net::TcpListener) -> Result<String> {
        listener.set_nonblocking(true).map_err(Error::Bind)?;
        let listener = TcpListener::from_std(listener).map_err(Error::Bind)?;
        let addr = listener.local_addr().map_err(Error::Bind)?;
        self.more_accept_tasks.push(tokio::spawn(serve::accept_loop(
            listener,
            self.shared.clone(),
        )));
        Ok(kubeconfig::render(&format!("http://{addr}")))
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig (context [`CONTEXT_NAME`], namespace `default`, no credentials).
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig::render(&self.url())
    }

    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.kubeconfig_yaml()).map_err(|source| Error::WriteKubeconfig {
            path: path.to_path_buf(),
            source,
        })
    }

    /// A client configuration for this server, default namespace `default`.
    pub fn client_config(&self) -> kube::Config {
        let uri = axum::http::Uri::builder()
            .scheme("http")
            .authority(self.addr.to_string())
            .path_and_query("/")
            .build()
            .unwrap_or_default();
        kube::Config::new(uri)
    }

    pub fn client(&self) -> Result<kube::Client> {
        kube::Client::try_from(self.client_config()).map_err(Error::Client)
    }

    // ---- objects ----

    /// Creates an object (`ADDED`); fails if it exists. Returns it as stored.
    pub fn create<K: Serialize + DeserializeOwned>(&self, object: &K) -> Result<K> {
        from_stored(&self.create_value(serde_json::to_value(object)?)?)
    }

    /// Replaces an existing object (`MODIFIED`, unless nothing changed). A non-empty
    /// `metadata.resourceVersion` must match the stored one.
    pub fn update<K: Serialize + DeserializeOwned>(&self, object: &K) -> Result<K> {
        from_stored(&self.update_value(serde_json::to_value(object)?)?)
    }

    /// Creates or replaces an object, ignoring its `metadata.resourceVersion`.
    pub fn apply<K: Serialize + DeserializeOwned>(&self, object: &K) -> Result<K> {
        from_stored(&self.apply_value(serde_json::to_value(object)?)?)
    }

    /// Deletes an object (`DELETED`); returns its last state. `namespace` is ignored
    /// for cluster-scoped types and defaults to `default` for namespaced ones.
    pub fn delete<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<K> {
        let resource = kind_of::<K>()?;
        let namespace = if resource.namespaced {
            namespace.unwrap_or("default")
        } else {
            ""
        };
        let deleted = self.shared.store().delete(resource, namespace, name)?;
        from_stored(&deleted)
    }

    pub fn get<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<K>> {
        let resource = kind_of::<K>()?;
        let namespace = if resource.namespaced {
            namespace.unwrap_or("default")
        } else {
            ""
        };
        let stored = self.shared.store().get(resource, namespace, name);
        stored.map(|o| from_stored(&o)).transpose()
    }

    /// Every stored object of a type, ordered by namespace and name.
    pub fn list<K: Resource<DynamicType = ()> + DeserializeOwned>(&self) -> Result<Vec<K>> {
        let resource = kind_of::<K>()?;
        let objects = self.shared.store().objects(resource);
        objects.iter().map(|o| from_stored(o)).collect()
    }

    pub fn create_value(&self, mut object: Value) -> Result<Value> {
        let resource = kind_of_value(&mut object)?;
        Ok((*self.shared.store().create(resource, object)?).clone())
    }

    pub fn update_value(&self, mut object: Value) -> Result<Value> {
        let resource = kind_of_value(&mut object)?;
        Ok((*self.shared.store().replace(resource, object, true)?).clone())
    }

    pub fn apply_value(&self, mut object: Value) -> Result<Value> {
        let resource = kind_of_value(&mut object)?;
        Ok((*self.shared.store().upsert(resource, object)?).clone())
    }

    /// Deletes by `apiVersion`, `kind`, namespace (`None` for cluster-scoped) and name.
    pub fn delete_value(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value> {
        let resource = resources::by_type(api_version, kind).ok_or_else(|| Error::UnknownKind {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        })?;
        let namespace = if resource.namespaced {
            namespace.unwrap_or("default")
        } else {
            ""
        };
        Ok((*self.shared.store().delete(resource, namespace, name)?).clone())
    }

    /// Every Event received, core/v1 first then events.k8s.io/v1, each by namespace and name.
    pub fn events(&self) -> Vec<Value> {
        let store = self.shared.store();
        let mut events: Vec<Value> = store
            .objects(&CORE_EVENTS)
            .iter()
            .map(|o| (**o).clone())
            .collect();
        events.extend(
            store
                .objects(&resources::EVENTS)
                .iter()
                .map(|o| (**o).clone()),
        );
        events
    }

    /// The newest resourceVersion (the global counter).
    pub fn resource_version(&self) -> u64 {
        self.shared.current_rv()
    }

    // ---- faults ----

    /// Drops all change history: a watch from any earlier resourceVersion gets a
    /// single `ERROR` event with `410 Expired`, a continued list gets HTTP 410.
    pub fn compact(&self) {
        self.shared.store().compact();
    }

    /// Cuts every open watch mid-stream, as a connection drop would.
    pub fn drop_watches(&self) {
        self.shared.store().drop_watches();
    }

    /// `true`: the API server is down ([`Outage::ConnectionsClosed`]); `false`: back up.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.set_outage(if unavailable {
            Outage::ConnectionsClosed
        } else {
            Outage::None
        });
    }

    /// Starts or ends an outage of the given kind. Starting one cuts every open
    /// watch (and with [`Outage::ConnectionsClosed`] every connection) at once.
    pub fn set_outage(&self, outage: Outage) {
        *self
            .shared
            .outage
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = outage;
        match outage {
            Outage::None => {}
            Outage::ServiceUnavailable => self.drop_watches(),
            Outage::ConnectionsClosed => {
                self.drop_watches();
                self.shared.cut_all_connections();
            }
        }
    }

    // ---- observation ----

    /// Connections accepted and closed at once during [`Outage::ConnectionsClosed`]: each
    /// is a client's attempt to reach the server while it is away.
    pub fn refused_connections(&self) -> usize {
        self.shared.refused_connections.load(Ordering::Relaxed)
    }

    /// Open watches on a type (its plural, any group).
    pub fn open_watches(&self, resource: &str) -> usize {
        let store = self.shared.store();
        resources::ALL
            .iter()
            .filter(|r| r.plural == resource)
            .map(|r| store.open_watches(Some(r)))
            .sum()
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests().clone()
    }

    /// How many `verb` requests on `resource` (plural, any group) were answered.
    pub fn request_count(&self, verb: Verb, resource: &str) -> usize {
        self.shared
            .requests()
            .iter()
            .filter(|r| r.is(verb, resource))
            .count()
    }

    pub fn clear_requests(&self) {
        self.shared.requests().clear();
    }

    /// How many BOOKMARK events all watches have been sent.
    pub fn bookmarks_sent(&self) -> u64 {
        self.shared.bookmarks.load(Ordering::Relaxed)
    }

    /// Polls `condition` every 10 ms until it holds (true) or `timeout` passes (false).
    pub async fn wait_until(
        &self,
        timeout: Duration,
        mut condition: impl FnMut(&Self) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if condition(self) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
