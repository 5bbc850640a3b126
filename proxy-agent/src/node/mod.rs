// SPDX-License-Identifier: Apache-2.0
//! Facts about the node and settings of the agent's process, established at start-up the
//! way upstream's server.go does: the node name, its IPs and IP families, the local-traffic
//! detector, the OOM score adjustment and the conntrack sysctls.

pub mod addresses;
pub mod local;
pub mod sysctl;

pub use addresses::{
    IPVS_DUMMY_DEVICE, NodeAddresses, host_addresses, node_ips_from_node, primary_node_ips,
};
pub use local::{LocalDetector, LocalDetectorError};
pub use sysctl::{ConntrackSettings, ProcSysctl, Sysctl, apply_conntrack, apply_oom_score_adj};

/// The node name: `--hostname-override` when set, else the OS hostname; trimmed and
/// lower-cased, as upstream does.
pub fn node_name(hostname_override: &str) -> std::io::Result<String> {
    let raw = if hostname_override.trim().is_empty() {
        nix::unistd::gethostname()
            .map_err(std::io::Error::from)?
            .to_string_lossy()
            .into_owned()
    } else {
        hostname_override.to_string()
    };
    let name = raw.trim().to_lowercase();
    if name.is_empty() {
        return Err(std::io::Error::other("empty hostname"));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn override_is_trimmed_and_lowercased() {
        assert_eq!(
            super::node_name("  Node-A \n").ok().as_deref(),
            Some("node-a")
        );
    }

    #[test]
    fn os_hostname_is_used_without_override() {
        let name = super::node_name("").expect("the test machine has a hostname");
        assert_eq!(name, name.to_lowercase());
        assert!(!name.is_empty());
    }
}
