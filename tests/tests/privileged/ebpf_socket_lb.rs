// SPDX-License-Identifier: Apache-2.0
//! The socket programs against the real kernel: maps written by hand (the proxier's own
//! tests cover how it computes them), a client in a test cgroup, a backend on loopback.

use std::net::Ipv4Addr;

use proxy_agent::proxier::ebpf::{leave_new_flows_to_netfilter, load_and_attach, maps_dir};
use proxy_common::{Backend4Value, LbConfig, RevNat4Value, Svc4Key, SvcValue, proto, svc_flags};
use tests::{
    privileged::{TempBpffs, TempCgroup, TempNetns, load_options},
    require_root,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 255, 77, 1);

fn key(port: u16, slot: u16) -> Svc4Key {
    Svc4Key {
        addr: u32::from(VIP).to_be(),
        dport: port.to_be(),
        slot,
        proto: proto::TCP,
        scope: 0,
        _pad: [0; 2],
    }
}

const BACKEND_PORT: u16 = 18080;

/// A backend on 127.0.0.1 inside `ns` that answers every connection with its own port.
fn start_backend(ns: &TempNetns) {
    ns.sh(&format!(
        "python3 -c \"
import socket
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', {BACKEND_PORT}))
l.listen(16)
while True:
    c, _ = l.accept()
    c.recv(64)
    c.sendall(b'backend:{BACKEND_PORT}')
    c.close()
\" >/dev/null 2>&1 &
for i in $(seq 50); do python3 -c \"import socket; socket.create_connection(('127.0.0.1', {BACKEND_PORT}), 0.2)\" 2>/dev/null && exit 0; sleep 0.05; done"
    ));
}

/// A python client: connects, prints getpeername and the answer, or the errno name.
const CLIENT: &str = r#"
import socket, errno, sys
s = socket.socket()
s.settimeout(2)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    peer = s.getpeername()
    s.sendall(b'hi')
    print('ok', peer[0], peer[1], s.recv(64).decode().strip())
except OSError as e:
    print('err', errno.errorcode.get(e.errno, e.errno))
"#;

fn client(ns: &TempNetns, cg: Option<&TempCgroup>, port: u16) -> String {
    let script = format!("python3 -c \"{CLIENT}\" {VIP} {port}");
    let out = match cg {
        Some(cg) => ns.sh_in_cgroup(cg, &script),
        None => ns.sh(&script),
    };
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn connect_is_translated_rejected_or_left_alone_and_left_to_netfilter_at_a_handover() {
    require_root!();
    let bpffs = TempBpffs::new("kpe-socklb");
    let cg = TempCgroup::new("kpe-socklb");
    let mut loaded = load_and_attach(&load_options(&bpffs, &cg)).expect("load and attach");
    loaded
        .write_config(LbConfig::default())
        .expect("config slot");

    let ns = TempNetns::new("kpe-socklb");
    start_backend(&ns);
    let backend_port = BACKEND_PORT;
    let maps = &mut loaded.maps;
    maps.backends4
        .put(
            &7,
            &Backend4Value {
                addr: u32::from(Ipv4Addr::LOCALHOST).to_be(),
                port: backend_port.to_be(),
                proto: proto::TCP,
                flags: 0,
            },
        )
        .expect("backend");
    maps.rev_nat4
        .put(
            &3,
            &RevNat4Value {
                addr: u32::from(VIP).to_be(),
                port: 80u16.to_be(),
                _pad: 0,
            },
        )
        .expect("rev nat");
    maps.svc4
        .put(
            &key(80, 1),
            &SvcValue {
                backend_id: 7,
                rev_nat_id: 3,
                ..Default::default()
            },
        )
        .expect("slot 1");
    maps.svc4
        .put(
            &key(80, 0),
            &SvcValue {
                count: 1,
                rev_nat_id: 3,
                flags: svc_flags::CLUSTER_IP,
                ..Default::default()
            },
        )
        .expect("slot 0");
    // A frontend without endpoints, and the VIP's wildcard entry.
    maps.svc4
        .put(
            &key(81, 0),
            &SvcValue {
                rev_nat_id: 4,
                flags: svc_flags::CLUSTER_IP,
                ..Default::default()
            },
        )
        .expect("empty frontend");
    let mut wildcard = key(0, 0);
    wildcard.proto = 0;
    maps.svc4
        .put(
            &wildcard,
            &SvcValue {
                flags: svc_flags::WILDCARD,
                ..Default::default()
            },
        )
        .expect("wildcard");

    // Translated: the backend answers, getpeername shows the frontend.
    assert_eq!(
        client(&ns, Some(&cg), 80),
        format!("ok {VIP} 80 backend:{backend_port}")
    );
    // No endpoints: refused at once.
    assert_eq!(client(&ns, Some(&cg), 81), "err ECONNREFUSED");
    // A port the ClusterIP does not serve: refused too (the wildcard entry).
    assert_eq!(client(&ns, Some(&cg), 82), "err ECONNREFUSED");
    // Outside the cgroup nothing is translated: the namespace has no route to the VIP.
    assert_eq!(client(&ns, None, 80), "err ENETUNREACH");

    // A netfilter mode taking the node over, its rules in place: new connections are its
    // rules' to translate, or to refuse.
    assert_eq!(
        leave_new_flows_to_netfilter(&maps_dir(&bpffs.path)),
        Ok(true)
    );
    assert_eq!(client(&ns, Some(&cg), 80), "err ENETUNREACH");
    assert_eq!(client(&ns, Some(&cg), 81), "err ENETUNREACH");

    assert_service_map_dump_has_named_fields(&bpffs.path);
}

/// `bpftool -j map dump pinned` on the services map prints every entry with its fields
/// named (the maps carry BTF), so an operator can read them without our tools.
fn assert_service_map_dump_has_named_fields(bpffs_root: &std::path::Path) {
    let pin = tests::scenario::agent::service_map_pin(bpffs_root);
    let out = std::process::Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(&pin)
        .output()
        .expect("bpftool runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
    let entries = dump.as_array().expect("a list of entries");
    assert_eq!(entries.len(), 4, "{dump:#}");
    let formatted: Vec<&serde_json::Value> = entries
        .iter()
        .map(|e| e.get("formatted").unwrap_or(e))
        .collect();
    let slot0 = formatted
        .iter()
        .find(|e| e["key"]["dport"] == 80u16.to_be() && e["key"]["slot"] == 0)
        .unwrap_or_else(|| panic!("no named slot 0 of port 80 in {dump:#}"));
    assert_eq!(slot0["key"]["addr"], u32::from(VIP).to_be(), "{dump:#}");
    assert_eq!(slot0["key"]["proto"], proto::TCP, "{dump:#}");
    assert_eq!(slot0["key"]["scope"], 0, "{dump:#}");
    assert_eq!(slot0["value"]["count"], 1, "{dump:#}");
    assert_eq!(slot0["value"]["rev_nat_id"], 3, "{dump:#}");
    assert_eq!(slot0["value"]["flags"], svc_flags::CLUSTER_IP, "{dump:#}");
    let slot1 = formatted
        .iter()
        .find(|e| e["key"]["dport"] == 80u16.to_be() && e["key"]["slot"] == 1)
        .unwrap_or_else(|| panic!("no named slot 1 of port 80 in {dump:#}"));
    assert_eq!(slot1["value"]["backend_id"], 7, "{dump:#}");
}
