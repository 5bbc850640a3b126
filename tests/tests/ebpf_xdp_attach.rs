// SPDX-License-Identifier: Apache-2.0
//! XDP acceleration attaches where it can and otherwise leaves the device to tc: native XDP
//! on a veth whose MTU is too large for it is refused by the driver, and the loader goes on
//! with tc alone; generic XDP attaches; switching modes and turning XDP off replace or
//! remove the link; tc stays attached throughout.

use std::process::Command;

use proxy_agent::{
    config::XdpMode,
    proxier::ebpf::loader::{LoadOptions, MapSizes, load_and_attach},
};
use tests::{
    privileged::{TempBpffs, TempCgroup, TempNetns},
    require_root,
    scenario::netns::in_netns,
};

fn options(bpffs: &TempBpffs, cg: &TempCgroup, xdp: XdpMode) -> LoadOptions {
    LoadOptions {
        bpffs_root: bpffs.path.clone(),
        cgroup: cg.path.clone(),
        map_sizes: MapSizes::default(),
        devices: vec!["up0".into()],
        xdp,
    }
}

/// `ip -j link show up0` inside the namespace: the XDP program id, if any.
fn xdp_prog(ns: &TempNetns) -> Option<u64> {
    let out = Command::new("ip")
        .args([
            "netns", "exec", &ns.name, "ip", "-j", "-d", "link", "show", "up0",
        ])
        .output()
        .unwrap();
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    links[0]["xdp"]["prog"]["id"].as_u64()
}

/// Whether the uplink ingress tc program is attached to up0: its pinned link is a live
/// tcx link (bpftool's view; this kernel has tcx, so tc attaches through links).
fn tc_attached(bpffs: &TempBpffs) -> bool {
    let pin =
        proxy_agent::proxier::ebpf::loader::links_dir(&bpffs.path).join("tc_uplink_ingress_up0");
    let out = Command::new("bpftool")
        .args(["-j", "link", "show", "pinned"])
        .arg(&pin)
        .output()
        .unwrap();
    let link: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    // BPF_LINK_TYPE_TCX is 11; older bpftool prints the number.
    link["type"] == "tcx" || link["type"] == 11
}

#[test]
fn xdp_falls_back_to_tc_where_it_cannot_run_and_follows_the_configured_mode() {
    require_root!();
    let ns = TempNetns::new("kpe-xdp");
    // An MTU above what native XDP on veth accepts (one page per frame).
    ns.sh("ip link add up0 mtu 9000 type veth peer name up1 mtu 9000 && ip link set up0 up && ip link set up1 up");
    let bpffs = TempBpffs::new("kpe-xdp");
    let cg = TempCgroup::new("kpe-xdp");

    let native = options(&bpffs, &cg, XdpMode::Native);
    let devices = in_netns(&ns.name, move || {
        load_and_attach(&native)
            .map(|loaded| loaded.xdp_devices.clone())
            .map_err(std::io::Error::other)
    })
    .unwrap();
    assert!(
        devices.is_empty(),
        "native XDP attached at MTU 9000: {devices:?}"
    );
    assert_eq!(xdp_prog(&ns), None);
    assert!(
        tc_attached(&bpffs),
        "tc must carry the device when XDP cannot"
    );

    let generic = options(&bpffs, &cg, XdpMode::Generic);
    let devices = in_netns(&ns.name, move || {
        load_and_attach(&generic)
            .map(|loaded| loaded.xdp_devices.clone())
            .map_err(std::io::Error::other)
    })
    .unwrap();
    assert_eq!(devices, vec!["up0".to_string()]);
    let first = xdp_prog(&ns).expect("generic XDP attached");

    // A restart in the same mode swaps the program inside the same link.
    let generic = options(&bpffs, &cg, XdpMode::Generic);
    in_netns(&ns.name, move || {
        load_and_attach(&generic)
            .map(drop)
            .map_err(std::io::Error::other)
    })
    .unwrap();
    let second = xdp_prog(&ns).expect("still attached after a restart");
    assert_ne!(first, second, "the new program runs");

    let off = options(&bpffs, &cg, XdpMode::Off);
    in_netns(&ns.name, move || {
        load_and_attach(&off)
            .map(drop)
            .map_err(std::io::Error::other)
    })
    .unwrap();
    assert_eq!(xdp_prog(&ns), None, "XDP off removes the link");
    assert!(tc_attached(&bpffs));
}
