// SPDX-License-Identifier: Apache-2.0
//! Which scenario files CI leaves to fewer modes, and why: the whole run (tests/tests/
//! scenarios.rs on the host, tests/tests/vm_guest.rs in the emulated guest) must fit CI's
//! budget on two cores, and some files show nothing a mode's own code decides.
//! `cargo xtask scenarios --mode <mode>` still replays every file in any mode.

/// Shared files whose outcome the model decides the same way for every mode, so that a
/// mode's own rules see nothing new in them: topology-hint variants that differ from
/// m1/m5/m6 only in annotation spellings or zone labels (`model/topology.rs` decides which
/// endpoints a node keeps and every mode programs that list), and the service kinds no mode
/// programs (headless, ExternalName). ebpf replays them (and their IPv6 twins) on the
/// host; the netfilter modes and the guest leave them out.
pub const MODEL_DECIDED: &[&str] = &[
    "l1-headless-ignored.yaml",
    "l2-externalname-ignored.yaml",
    "m2-topology-hints-annotation-disabled.yaml",
    "m3-topology-hints-annotation-odd-case.yaml",
    "m4-topology-hints-no-annotation.yaml",
    "m7-topology-node-without-zone-label.yaml",
    "m8-topology-empty-zone-label.yaml",
    "m9-topology-node-in-other-zone.yaml",
    "m10-topology-normal-filtering.yaml",
];

/// Whether `file` is one of [`MODEL_DECIDED`] or its IPv6 twin (`v6-NAME`), by its name.
pub fn model_decided(file: &std::path::Path) -> bool {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let v4 = name.strip_prefix("v6-").unwrap_or(name);
    MODEL_DECIDED.contains(&v4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twins_follow_their_file_and_the_rest_is_replayed() {
        let decided = |name: &str| model_decided(std::path::Path::new("dir").join(name).as_path());
        assert!(decided("m2-topology-hints-annotation-disabled.yaml"));
        assert!(decided("v6-l1-headless-ignored.yaml"));
        assert!(!decided("m1-topology-hints-auto.yaml"));
        assert!(!decided("v6-a1-overall.yaml"));
    }

    #[test]
    fn every_listed_file_exists_among_the_shared_scenarios() {
        let shared =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/scenarios");
        if !shared.is_dir() {
            return;
        }
        for name in MODEL_DECIDED {
            assert!(
                shared.join(name).is_file(),
                "{name} is not a shared scenario"
            );
        }
    }
}
