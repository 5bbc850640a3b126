// SPDX-License-Identifier: Apache-2.0
//! healthCheckNodePort servers (upstream's ServiceHealthServer): for every LoadBalancer
//! service with externalTrafficPolicy Local, an HTTP server on its health-check node port
//! tells load balancers whether this node has a ready local endpoint: 200 with the count,
//! 503 without (terminating endpoints do not count) or while the proxy itself is unhealthy.

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::SystemTime,
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::health::ProxyHealth;
use crate::model::{FamilyState, NamespacedName, ServicePortMap};

/// One service's health as served.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ServiceState {
    local_endpoints: usize,
}

type Shared = Arc<Mutex<HashMap<NamespacedName, ServiceState>>>;

/// The body upstream writes (same fields, same order).
pub fn body(service: &NamespacedName, local_endpoints: usize, proxy_healthy: bool) -> String {
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {:?},\n\t\t\"name\": {:?}\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        service.namespace(),
        service.name()
    )
}

#[derive(Clone)]
struct Handler {
    service: NamespacedName,
    shared: Shared,
    health: ProxyHealth,
}

async fn answer(State(h): State<Handler>) -> impl IntoResponse {
    let count = h
        .shared
        .lock()
        .map(|m| m.get(&h.service).map_or(0, |s| s.local_endpoints))
        .unwrap_or(0);
    let healthy = h.health.verdict(SystemTime::now()).healthy;
    let status = if count > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
            (
                header::HeaderName::from_static("x-load-balancing-endpoint-weight"),
                count.to_string(),
            ),
        ],
        body(&h.service, count, healthy),
    )
}

/// The servers of every health-check node port.
pub struct ServiceHealthServers {
    shared: Shared,
    health: ProxyHealth,
    /// Where to listen: the NodePort addresses, or every address (None).
    addresses: Option<Vec<IpAddr>>,
    /// service -> (port, listener tasks)
    servers: HashMap<NamespacedName, (u16, Vec<JoinHandle<()>>)>,
}

impl ServiceHealthServers {
    pub fn new(health: ProxyHealth, addresses: Option<Vec<IpAddr>>) -> Self {
        Self {
            shared: Arc::default(),
            health,
            addresses,
            servers: HashMap::new(),
        }
    }

    fn bind_addrs(&self, port: u16) -> Vec<SocketAddr> {
        match &self.addresses {
            Some(list) => list.iter().map(|ip| SocketAddr::new(*ip, port)).collect(),
            // Every address: one dual-stack socket where the kernel has IPv6 (it takes
            // IPv4 too, as Go's ":port" does), else the IPv4 wildcard.
            None if std::path::Path::new("/proc/net/if_inet6").exists() => {
                vec![SocketAddr::from(([0u16; 8], port))]
            }
            None => vec![SocketAddr::from(([0, 0, 0, 0], port))],
        }
    }

    fn start(&self, service: &NamespacedName, port: u16) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        for addr in self.bind_addrs(port) {
            let socket = match std::net::TcpListener::bind(addr)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .and_then(tokio::net::TcpListener::from_std)
            {
                Ok(l) => l,
                Err(e) => {
                    warn!(service = %service, %addr, error = %e, "cannot serve the health-check node port");
                    continue;
                }
            };
            let app = Router::new().fallback(get(answer)).with_state(Handler {
                service: service.clone(),
                shared: self.shared.clone(),
                health: self.health.clone(),
            });
            info!(service = %service, %addr, "serving health-check node port");
            tasks.push(tokio::spawn(async move {
                let _ = axum::serve(socket, app).await;
            }));
        }
        tasks
    }

    /// Brings the servers and counts in line with the model, for the services in `changed`
    /// (every service when `full`).
    pub fn sync(
        &mut self,
        families: &[FamilyState],
        changed: &HashSet<NamespacedName>,
        full: bool,
    ) {
        let services: HashSet<NamespacedName> = if full {
            let mut all: HashSet<NamespacedName> = self.servers.keys().cloned().collect();
            for f in families {
                all.extend(f.services.services().cloned());
            }
            all
        } else {
            changed.clone()
        };
        for service in services {
            let port = families
                .iter()
                .find_map(|f| health_check_port(&f.services, &service));
            // Counted only for services with a health check node port: a cold sync of
            // 100,000 services spent a quarter second counting for services that have none.
            let count = port.map(|_| local_ready_endpoints(families, &service));
            if let Ok(mut m) = self.shared.lock() {
                match count {
                    Some(count) => {
                        m.insert(
                            service.clone(),
                            ServiceState {
                                local_endpoints: count,
                            },
                        );
                    }
                    None => {
                        m.remove(&service);
                    }
                }
            }
            match (port, self.servers.get(&service).map(|(p, _)| *p)) {
                (Some(p), Some(old)) if p == old => {}
                (Some(p), _) => {
                    if let Some((_, tasks)) = self.servers.remove(&service) {
                        tasks.iter().for_each(JoinHandle::abort);
                    }
                    let tasks = self.start(&service, p);
                    self.servers.insert(service, (p, tasks));
                }
                (None, Some(_)) => {
                    if let Some((_, tasks)) = self.servers.remove(&service) {
                        tasks.iter().for_each(JoinHandle::abort);
                        info!(service = %service, "health-check node port closed");
                    }
                }
                (None, None) => {}
            }
        }
    }
}

fn health_check_port(map: &ServicePortMap, service: &NamespacedName) -> Option<u16> {
    map.ports_of(service)
        .find_map(|(_, p)| p.health_check_node_port)
}

/// Distinct local, ready endpoint addresses of the service (all its ports and families).
fn local_ready_endpoints(families: &[FamilyState], service: &NamespacedName) -> usize {
    let mut ips: HashSet<IpAddr> = HashSet::new();
    for f in families {
        for (name, _) in f.services.ports_of(service) {
            if let Some(eps) = f.endpoints.get(name) {
                ips.extend(eps.iter().filter(|e| e.is_local && e.ready).map(|e| e.ip));
            }
        }
    }
    ips.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_matches_upstreams_shape() {
        let b = body(&NamespacedName::new("ns1", "svc1"), 2, true);
        let v: serde_json::Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["service"]["namespace"], "ns1");
        assert_eq!(v["service"]["name"], "svc1");
        assert_eq!(v["localEndpoints"], 2);
        assert_eq!(v["serviceProxyHealthy"], true);
    }
}
