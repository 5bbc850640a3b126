// SPDX-License-Identifier: Apache-2.0
//! XDP acceleration on the uplinks. The XDP program runs the tc ingress translation
//! earlier and hands on what it does not finish, and tc stays attached regardless: so XDP
//! failing to attach, or being detached, only costs speed. That is why every failure here
//! is one warning and never an error.
//!
//! Links are pinned like the others, with the mode in the pin's name: a restarted agent
//! swaps the program of an existing link in place (no instant without XDP), while a mode
//! change needs a new link (the old one goes first; tc covers the instant between).

use std::{
    fs,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    programs::{
        Xdp,
        links::{FdLink, PinnedLink},
        xdp::{XdpLink, XdpMode as AttachMode},
    },
};
use tracing::{debug, info, warn};

use crate::config::XdpMode;

pub const PROGRAM: &str = "xdp_uplink";
const PIN_PREFIX: &str = "xdp_uplink_";

/// The pin of `device`'s XDP link in `mode`.
pub fn pin_name(mode: XdpMode, device: &str) -> String {
    format!("{PIN_PREFIX}{}_{device}", mode_name(mode))
}

fn mode_name(mode: XdpMode) -> &'static str {
    match mode {
        XdpMode::Off => "off",
        XdpMode::Generic => "generic",
        XdpMode::Native => "native",
    }
}

/// Pins of XDP links that the wanted configuration does not keep.
pub fn stale_pins(existing: &[String], mode: XdpMode, devices: &[String]) -> Vec<String> {
    let wanted: Vec<String> = match mode {
        XdpMode::Off => Vec::new(),
        _ => devices.iter().map(|d| pin_name(mode, d)).collect(),
    };
    existing
        .iter()
        .filter(|name| name.starts_with(PIN_PREFIX) && !wanted.contains(name))
        .cloned()
        .collect()
}

fn pinned_names(links_dir: &Path) -> Vec<String> {
    fs::read_dir(links_dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Attaches (or keeps, with the new program) XDP on every device in `mode`, detaching
/// links of other modes and devices. Returns the devices XDP runs on.
pub fn attach(ebpf: &mut Ebpf, mode: XdpMode, devices: &[String], links_dir: &Path) -> Vec<String> {
    for stale in stale_pins(&pinned_names(links_dir), mode, devices) {
        // Removing the only reference detaches the link; tc carries the traffic.
        match fs::remove_file(links_dir.join(&stale)) {
            Ok(()) => info!(pin = %stale, "XDP link removed"),
            Err(e) => warn!(pin = %stale, error = %e, "could not remove an XDP link"),
        }
    }
    if mode == XdpMode::Off || devices.is_empty() {
        return Vec::new();
    }
    if !super::kernel::has_xdp_links() {
        // Through netlink instead, the program would stay attached after the pins go.
        warn!(
            "XDP acceleration unavailable: it needs XDP bpf_links (kernel 5.9+); tc handles all traffic"
        );
        return Vec::new();
    }
    let program: &mut Xdp = match ebpf.program_mut(PROGRAM).map(|p| p.try_into()).transpose() {
        Ok(Some(p)) => p,
        Ok(None) => {
            warn!(
                program = PROGRAM,
                "XDP acceleration unavailable: program missing from the object; tc handles all traffic"
            );
            return Vec::new();
        }
        Err(e) => {
            warn!(error = %e, "XDP acceleration unavailable; tc handles all traffic");
            return Vec::new();
        }
    };
    if let Err(e) = program.load() {
        warn!(error = %e, "XDP acceleration unavailable: the kernel refused the program; tc handles all traffic");
        return Vec::new();
    }
    let mut running = Vec::new();
    for device in devices {
        let pin = links_dir.join(pin_name(mode, device));
        match attach_one(program, mode, device, &pin) {
            Ok(()) => running.push(device.clone()),
            Err(reason) => warn!(
                %device,
                mode = mode_name(mode),
                %reason,
                "XDP cannot run on this device; tc handles its traffic"
            ),
        }
    }
    if !running.is_empty() {
        info!(mode = mode_name(mode), devices = ?running, "XDP acceleration attached");
    }
    running
}

fn attach_one(program: &mut Xdp, mode: XdpMode, device: &str, pin: &PathBuf) -> Result<(), String> {
    if pin.exists() {
        match swap_program(program, pin) {
            Ok(()) => return Ok(()),
            Err(reason) => {
                debug!(%device, %reason, "replacing the XDP link instead of updating it");
                let _ = fs::remove_file(pin);
            }
        }
    }
    let flags = match mode {
        XdpMode::Native if is_veth(device) => {
            // A veth drops the frames native XDP transmits (XDP_TX to a backend on another
            // node) unless its peer runs XDP too, which is not ours to decide: generic
            // XDP does the same work without that condition.
            warn!(
                %device,
                "native XDP on a veth would drop traffic to remote backends; using generic XDP on it"
            );
            AttachMode::Skb
        }
        XdpMode::Native => AttachMode::Driver,
        _ => AttachMode::Skb,
    };
    let id = program.attach(device, flags).map_err(|e| e.to_string())?;
    let link = program.take_link(id).map_err(|e| e.to_string())?;
    let link = FdLink::try_from(link).map_err(|e| format!("not a bpf link: {e}"))?;
    pin_link(link, pin)
}

/// Whether `device` is a veth (asked over rtnetlink; unknown counts as not).
fn is_veth(device: &str) -> bool {
    crate::proxier::netlink::route::RouteSocket::open()
        .and_then(|mut socket| socket.link_kind(device))
        .map(|kind| kind.as_deref() == Some("veth"))
        .unwrap_or(false)
}

/// Points the pinned link at the newly loaded program (atomically, in the kernel).
fn swap_program(program: &mut Xdp, pin: &PathBuf) -> Result<(), String> {
    // Unpinning hands us the link's fd, which keeps it attached until it is pinned again.
    let link = PinnedLink::from_pin(pin)
        .map_err(|e| e.to_string())?
        .unpin()
        .map_err(|e| e.to_string())?;
    let xdp_link = match XdpLink::try_from(link) {
        Ok(l) => l,
        Err(e) => return Err(format!("pinned link is not XDP: {e}")),
    };
    let id = program
        .attach_to_link(xdp_link)
        .map_err(|e| e.to_string())?;
    let link = program.take_link(id).map_err(|e| e.to_string())?;
    let link = FdLink::try_from(link).map_err(|e| e.to_string())?;
    pin_link(link, pin)
}

fn pin_link(link: FdLink, pin: &PathBuf) -> Result<(), String> {
    let pinned = link.pin(pin).map_err(|e| e.to_string())?;
    // The pin keeps the link attached.
    drop(pinned);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_links_of_the_wanted_mode_and_devices_stay() {
        let existing = names(&[
            "xdp_uplink_generic_eth0",
            "xdp_uplink_native_eth1",
            "xdp_uplink_generic_gone0",
            "tc_uplink_ingress_eth0",
            "sock_connect4",
        ]);
        let devices = names(&["eth0", "eth1"]);
        assert_eq!(
            stale_pins(&existing, XdpMode::Generic, &devices),
            names(&["xdp_uplink_native_eth1", "xdp_uplink_generic_gone0"])
        );
        assert_eq!(
            stale_pins(&existing, XdpMode::Off, &devices),
            names(&[
                "xdp_uplink_generic_eth0",
                "xdp_uplink_native_eth1",
                "xdp_uplink_generic_gone0"
            ])
        );
        assert_eq!(pin_name(XdpMode::Native, "eth1"), "xdp_uplink_native_eth1");
    }
}
