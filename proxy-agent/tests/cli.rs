// SPDX-License-Identifier: Apache-2.0
//! The binary's edge: a bad configuration prints one precise line per bad field and exits
//! 1 having touched nothing; --write-config-to writes a file that loads back.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_proxy-agent");

#[test]
fn a_bad_config_prints_one_line_per_bad_field_and_exits_1() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let bad = format!("{dir}/tests/data/config/bad.yaml");
    let out = Command::new(BIN).args(["--config", &bad]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let expected =
        std::fs::read_to_string(format!("{dir}/tests/data/config/bad.expected")).unwrap();
    let want: Vec<String> = expected.lines().map(|l| format!("{bad}: {l}")).collect();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let got: Vec<&str> = stderr.lines().collect();
    assert_eq!(got, want);
    assert!(out.stdout.is_empty());
}

#[test]
fn an_unknown_field_is_named() {
    let path = std::env::temp_dir().join(format!("kpe-unknown-{}.yaml", std::process::id()));
    std::fs::write(
        &path,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables:\n  masqueradeBits: 14\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("iptables.masqueradeBits"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn write_config_to_round_trips_through_the_flags() {
    let path = std::env::temp_dir().join(format!("kpe-written-{}.yaml", std::process::id()));
    let out = Command::new(BIN)
        .args([
            "--proxy-mode",
            "iptables",
            "--cluster-cidr",
            "10.0.0.0/8",
            "--write-config-to",
            path.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("mode: iptables"), "{text}");
    assert!(text.contains("clusterCIDR: 10.0.0.0/8"), "{text}");
    // The written file is a valid configuration on its own.
    let check = Command::new(BIN)
        .args([
            "--config",
            path.to_str().unwrap(),
            "--write-config-to",
            "/dev/null",
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}
