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

/// Runs the binary on a configuration with a field this version does not know (as a newer
/// kubeadm's would have), writing the effective configuration out; returns its stderr.
fn run_with_unknown_field(extra: &[&str]) -> String {
    let id = format!("{}-{}", std::process::id(), extra.len());
    let path = std::env::temp_dir().join(format!("kpe-unknown-{id}.yaml"));
    let written = std::env::temp_dir().join(format!("kpe-unknown-written-{id}.yaml"));
    std::fs::write(
        &path,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables:\n  masqueradeBits: 14\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["--config", path.to_str().unwrap()])
        .args(["--write-config-to", written.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let text = std::fs::read_to_string(&written).unwrap_or_default();
    let _ = std::fs::remove_file(&written);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    assert!(!text.contains("masqueradeBits"), "{text}");
    stderr
}

/// klog's text header: severity, MMDD, time with microseconds, thread id, file:line.
fn klog_header(line: &str) -> Option<(char, &str)> {
    let (header, rest) = line.split_once("] ")?;
    let parts: Vec<&str> = header.split_whitespace().collect();
    let [date, time, pid, caller] = parts.as_slice() else {
        return None;
    };
    let severity = date.chars().next().filter(|c| "IWEF".contains(*c))?;
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    let time_ok =
        time.len() == 15 && time.split([':', '.']).map(digits).filter(|ok| *ok).count() == 4;
    let caller_ok = caller
        .rsplit_once(':')
        .is_some_and(|(file, line)| file.ends_with(".rs") && digits(line));
    (date.len() == 5 && digits(&date[1..]) && time_ok && digits(pid) && caller_ok)
        .then_some((severity, rest))
}

#[test]
fn an_unknown_field_is_named_in_a_klog_warning_and_the_rest_applies() {
    let stderr = run_with_unknown_field(&[]);
    let first = stderr.lines().next().unwrap_or_default();
    let (severity, message) =
        klog_header(first).unwrap_or_else(|| panic!("not klog text: {first}"));
    assert_eq!(severity, 'W', "{first}");
    assert!(message.starts_with('"'), "{first}");
    assert!(
        message.contains("unknown field iptables.masqueradeBits"),
        "{first}"
    );
    // Every line the agent wrote is klog text.
    for line in stderr.lines() {
        assert!(klog_header(line).is_some(), "not klog text: {line}");
    }
}

#[test]
fn json_logging_writes_klogs_json_schema() {
    let stderr = run_with_unknown_field(&["--logging-format=json"]);
    let first = stderr.lines().next().unwrap_or_default();
    let entry: serde_json::Value =
        serde_json::from_str(first).unwrap_or_else(|e| panic!("{e}: {first}"));
    assert!(entry["ts"].as_f64().is_some_and(|ts| ts > 1.7e9), "{first}");
    let caller = entry["caller"].as_str().unwrap_or_default();
    assert!(caller.contains(".rs:"), "{first}");
    assert_eq!(entry["v"], 0, "{first}");
    assert!(
        entry["msg"]
            .as_str()
            .unwrap_or_default()
            .contains("unknown field iptables.masqueradeBits"),
        "{first}"
    );
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

/// verflag's values: `--version` and `--version=raw` print and exit 0, before anything
/// else is looked at; `--version=false` runs; another binary version is refused.
#[test]
fn version_flag_prints_and_exits_as_kube_proxys() {
    let version = env!("CARGO_PKG_VERSION");
    for (args, stdout_has) in [
        (vec!["--version"], format!("proxy-agent v{version}")),
        (vec!["--version=true"], format!("proxy-agent v{version}")),
        (
            vec!["--version=raw", "--config", "/nonexistent"],
            format!("GitVersion:\"v{version}\""),
        ),
    ] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(&stdout_has), "{args:?}: {stdout}");
    }
    let out = Command::new(BIN)
        .args(["--version=v9.9.9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let path = std::env::temp_dir().join(format!("kpe-version-{}.yaml", std::process::id()));
    let out = Command::new(BIN)
        .args([
            "--version=false",
            "--write-config-to",
            path.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// pflag's normalisation: `--cluster_cidr` is `--cluster-cidr`; a configuration file with
/// a key written twice is read with its last value and a warning, as kube-proxy's lenient
/// decoder reads it.
#[test]
fn underscore_flags_and_duplicated_keys_are_read_as_kube_proxy_reads_them() {
    let id = std::process::id();
    let written = std::env::temp_dir().join(format!("kpe-underscore-{id}.yaml"));
    let out = Command::new(BIN)
        .args(["--proxy_mode=iptables", "--cluster_cidr", "10.0.0.0/8"])
        .args(["--write_config_to", written.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&written).unwrap();
    assert!(
        text.contains("mode: iptables") && text.contains("clusterCIDR: 10.0.0.0/8"),
        "{text}"
    );

    let config = std::env::temp_dir().join(format!("kpe-duplicated-{id}.yaml"));
    std::fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\nmode: iptables\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["--config", config.to_str().unwrap()])
        .args(["--write-config-to", written.to_str().unwrap()])
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&written).unwrap_or_default();
    let _ = std::fs::remove_file(&config);
    let _ = std::fs::remove_file(&written);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(text.contains("mode: iptables"), "{text}");
    assert!(stderr.contains("duplicate field"), "{stderr}");
}
