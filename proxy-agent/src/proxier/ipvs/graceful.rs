// SPDX-License-Identifier: Apache-2.0
//! Graceful termination of real servers, as upstream's manager: a real server that leaves
//! a virtual server keeps its established connections; it is given weight 0 (no new
//! connections) and deleted once the kernel counts no active or inactive connection on
//! it, which later syncs (and the periodic maintenance) check. UDP has no connection
//! end, so its real servers go at once (the kernel then expires their entries on the
//! next packet, expire_nodest_conn).

use std::collections::BTreeSet;

use super::desired::{RealServer, ServiceKey};
use super::genl::RealServerStatus;
use crate::model::Protocol;

/// Whether a removed real server of `protocol` drains rather than goes at once.
pub fn drains(protocol: Protocol) -> bool {
    protocol != Protocol::Udp
}

/// Whether a draining real server may go now.
pub fn drained(status: &RealServerStatus) -> bool {
    status.active_connections == 0 && status.inactive_connections == 0
}

/// The real servers being drained.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Draining {
    servers: BTreeSet<(ServiceKey, RealServer)>,
}

impl Draining {
    pub fn start(&mut self, key: ServiceKey, server: RealServer) {
        self.servers.insert((key, server));
    }

    /// The server is wanted again (or gone): stop tracking it.
    pub fn stop(&mut self, key: &ServiceKey, server: &RealServer) {
        self.servers.remove(&(*key, *server));
    }

    /// Forgets every server of a deleted virtual server.
    pub fn forget_service(&mut self, key: &ServiceKey) {
        self.servers.retain(|(k, _)| k != key);
    }

    pub fn contains(&self, key: &ServiceKey, server: &RealServer) -> bool {
        self.servers.contains(&(*key, *server))
    }

    /// The virtual servers with a draining real server.
    pub fn services(&self) -> BTreeSet<ServiceKey> {
        self.servers.iter().map(|(k, _)| *k).collect()
    }

    /// The draining real servers of `key`.
    pub fn servers_of(&self, key: &ServiceKey) -> Vec<RealServer> {
        self.servers
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, rs)| *rs)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draining_lifecycle() {
        let key = ServiceKey {
            addr: "10.96.0.10".parse().unwrap(),
            protocol: Protocol::Tcp,
            port: 80,
        };
        let server = RealServer {
            addr: "10.0.0.2".parse().unwrap(),
            port: 8080,
        };
        let mut draining = Draining::default();
        draining.start(key, server);
        assert!(draining.contains(&key, &server));
        assert_eq!(
            draining.services().into_iter().collect::<Vec<_>>(),
            vec![key]
        );
        let mut status = RealServerStatus {
            server,
            weight: 0,
            masquerading: true,
            active_connections: 1,
            inactive_connections: 0,
        };
        assert!(!drained(&status));
        status.active_connections = 0;
        status.inactive_connections = 2;
        assert!(!drained(&status), "TIME_WAIT connections still count");
        status.inactive_connections = 0;
        assert!(drained(&status));
        draining.forget_service(&key);
        assert!(draining.is_empty());
        assert!(drains(Protocol::Tcp) && drains(Protocol::Sctp) && !drains(Protocol::Udp));
    }
}
