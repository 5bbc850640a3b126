// SPDX-License-Identifier: Apache-2.0
//! An in-memory conntrack table for tests (upstream's fake netlink handler): lists what
//! it holds, deletes by original tuple, counts the calls.

use std::sync::{Arc, Mutex};

use super::{ConntrackTable, Entry, IPPROTO_UDP, Result, Tuple};
use crate::model::IpFamily;

#[derive(Debug, Default)]
pub struct FakeTable {
    pub entries: Vec<Entry>,
    pub lists: usize,
    pub deletes: usize,
}

/// Shared, so that a test keeps a handle on the table it gives a proxier.
#[derive(Clone, Debug, Default)]
pub struct FakeConntrack(pub Arc<Mutex<FakeTable>>);

impl FakeConntrack {
    pub fn with(entries: Vec<Entry>) -> Self {
        let fake = Self::default();
        fake.table().entries = entries;
        fake
    }

    pub fn table(&self) -> std::sync::MutexGuard<'_, FakeTable> {
        self.0.lock().unwrap()
    }

    /// The entries left, sorted.
    pub fn entries(&self) -> Vec<Entry> {
        let mut entries = self.table().entries.clone();
        entries.sort();
        entries
    }
}

impl ConntrackTable for FakeConntrack {
    fn list(&mut self, family: IpFamily) -> Result<Vec<Entry>> {
        let mut table = self.table();
        table.lists += 1;
        Ok(table
            .entries
            .iter()
            .filter(|entry| entry.family == family)
            .copied()
            .collect())
    }

    fn delete(&mut self, entries: &[Entry]) -> Result<usize> {
        let mut table = self.table();
        let mut deleted = 0;
        for doomed in entries {
            table.deletes += 1;
            let before = table.entries.len();
            table.entries.retain(|entry| {
                (entry.family, entry.orig, entry.zone) != (doomed.family, doomed.orig, doomed.zone)
            });
            deleted += before - table.entries.len();
        }
        Ok(deleted)
    }
}

/// A UDP entry: the client sent to `orig_dst`, `reply_src` answers (both `ip:port`).
pub fn udp_entry(client: &str, orig_dst: &str, reply_src: &str) -> Entry {
    entry(IPPROTO_UDP, client, orig_dst, reply_src)
}

/// An entry of any protocol; `client` is `ip:port` too.
pub fn entry(protocol: u8, client: &str, orig_dst: &str, reply_src: &str) -> Entry {
    let client: std::net::SocketAddr = client.parse().unwrap();
    let orig_dst: std::net::SocketAddr = orig_dst.parse().unwrap();
    let reply_src: std::net::SocketAddr = reply_src.parse().unwrap();
    Entry {
        family: IpFamily::of(&client.ip()),
        orig: Tuple {
            src: client.ip(),
            dst: orig_dst.ip(),
            protocol,
            src_port: client.port(),
            dst_port: orig_dst.port(),
        },
        reply: Tuple {
            src: reply_src.ip(),
            dst: client.ip(),
            protocol,
            src_port: reply_src.port(),
            dst_port: client.port(),
        },
        zone: 0,
    }
}
