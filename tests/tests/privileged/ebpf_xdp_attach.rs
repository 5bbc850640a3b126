// SPDX-License-Identifier: Apache-2.0
//! XDP acceleration attaches where it can and otherwise leaves the device to tc: native XDP
//! on a device whose driver has none (a bridge) is refused and the loader goes on with tc
//! alone; native XDP asked for on a veth runs as generic XDP (a veth drops what native XDP
//! transmits unless its peer runs XDP); generic XDP attaches; switching modes and turning
//! XDP off replace or remove the link; tc stays attached throughout.

use std::process::Command;

use proxy_agent::{
    config::XdpMode,
    proxier::ebpf::{LoadOptions, MapSizes, load_and_attach},
};
use tests::{
    privileged::{TempBpffs, TempCgroup, TempNetns},
    require_root,
    scenario::netns::in_netns,
};

fn options(bpffs: &TempBpffs, cg: &TempCgroup, xdp: XdpMode) -> LoadOptions {
    options_on(bpffs, cg, xdp, "up0")
}

fn options_on(bpffs: &TempBpffs, cg: &TempCgroup, xdp: XdpMode, device: &str) -> LoadOptions {
    LoadOptions {
        bpffs_root: bpffs.path.clone(),
        cgroup: cg.path.clone(),
        map_sizes: MapSizes::default(),
        devices: vec![device.into()],
        xdp,
        maglev_table_size: proxy_common::maglev::DEFAULT_TABLE_SIZE,
        pod_egress: false,
    }
}

/// `ip -j -d link show DEV` inside the namespace: the link's `xdp` object.
fn xdp_of(ns: &TempNetns, device: &str) -> serde_json::Value {
    let out = Command::new("ip")
        .args([
            "netns", "exec", &ns.name, "ip", "-j", "-d", "link", "show", device,
        ])
        .output()
        .unwrap();
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    links[0]["xdp"].clone()
}

/// The XDP program id on up0, if any.
fn xdp_prog(ns: &TempNetns) -> Option<u64> {
    xdp_of(ns, "up0")["prog"]["id"].as_u64()
}

/// Whether the uplink ingress tc program is attached to up0: its pinned link is a live
/// tcx link (bpftool's view; this kernel has tcx, so tc attaches through links).
fn tc_attached(bpffs: &TempBpffs) -> bool {
    let pin = proxy_agent::proxier::ebpf::links_dir(&bpffs.path).join("tc_uplink_ingress_up0");
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
    ns.sh("ip link add up0 type veth peer name up1 && ip link set up0 up && ip link set up1 up");
    ns.sh("ip link add br0 type bridge && ip link set br0 up");
    let bpffs = TempBpffs::new("kpe-xdp");
    let cg = TempCgroup::new("kpe-xdp");

    // A bridge has no native XDP: refused, tc carries the device.
    let native = options_on(&bpffs, &cg, XdpMode::Native, "br0");
    let devices = in_netns(&ns.name, move || {
        load_and_attach(&native)
            .map(|loaded| loaded.xdp_devices.clone())
            .map_err(std::io::Error::other)
    })
    .unwrap();
    assert!(
        devices.is_empty(),
        "native XDP attached on a bridge: {devices:?}"
    );
    assert_eq!(xdp_of(&ns, "br0")["prog"]["id"].as_u64(), None);
    let bridge_tc =
        proxy_agent::proxier::ebpf::links_dir(&bpffs.path).join("tc_uplink_ingress_br0");
    assert!(
        bridge_tc.exists(),
        "tc must carry the device when XDP cannot"
    );

    // Native on a veth runs generic: the driver's mode would drop XDP_TX frames.
    let native = options(&bpffs, &cg, XdpMode::Native);
    let devices = in_netns(&ns.name, move || {
        load_and_attach(&native)
            .map(|loaded| loaded.xdp_devices.clone())
            .map_err(std::io::Error::other)
    })
    .unwrap();
    assert_eq!(devices, vec!["up0".to_string()]);
    let xdp = xdp_of(&ns, "up0");
    assert_eq!(xdp["mode"], 2, "generic (skb) mode on the veth: {xdp}");
    assert!(tc_attached(&bpffs));

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
