// SPDX-License-Identifier: Apache-2.0
//! Reading and writing the configuration file.
//!
//! Decoding is upstream's: strict first ([`parse_str`]: an unknown or duplicated field is an
//! error naming the field's path); when the trouble is fields this version does not know or
//! a field written twice, the file is decoded again leniently, as kube-proxy's lenient
//! decoder does: without the unknown fields, each named in a warning, and with the last
//! value of a duplicated field ([`parse_lenient`]), so that a newer kubeadm's (or a
//! hand-merged) configuration does not crash-loop the proxy. Any other error (a bad value, a
//! wrong kind) still refuses the file.
//! JSON documents go through serde_json (better error positions), everything else through
//! serde_yaml, which also reads JSON.

use std::path::Path;

use serde::Deserialize;

use super::defaults::apply_defaults;
use super::field::FieldError;
use super::types::{API_VERSION, KIND, KubeProxyConfiguration};
use super::{ConfigError, Result};

/// Reads, decodes (leniently, see [`parse_lenient`]) and defaults the file at `path`, with
/// a warning for each field it did not know. Validation is separate (`validate`), as
/// upstream validates only after command-line overrides are merged in.
pub fn load_file_with_warnings(path: &Path) -> Result<(KubeProxyConfiguration, Vec<String>)> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let (mut config, warnings) = parse_lenient(&text, path)?;
    apply_defaults(&mut config);
    Ok((config, warnings))
}

/// Reads `base` as [`load_file_with_warnings`] does, then lays the fields `overrides` writes
/// over it: kubeadm's `kube-proxy` ConfigMap is read as it is (`--config`) and the agent's
/// own settings come from a second file (`--config-overrides`). Each file is decoded on its
/// own first, so an error names the file and field it is in. A field the overrides file
/// writes replaces the base's value (a list as a whole); a section it writes (`iptables:`,
/// `ebpf:`) is merged field by field; a field it does not write keeps the base's value.
/// Defaults apply to the merged result, as to a single file.
pub fn load_files_with_warnings(
    base: &Path,
    overrides: &Path,
) -> Result<(KubeProxyConfiguration, Vec<String>)> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let (base_config, mut warnings) = parse_lenient(&read(base)?, base)?;
    let overrides_text = read(overrides)?;
    let (overrides_config, overrides_warnings) = parse_lenient(&overrides_text, overrides)?;
    warnings.extend(overrides_warnings);
    let serialize = |config: &KubeProxyConfiguration| {
        serde_json::to_value(config).map_err(|error| ConfigError::Serialize(error.to_string()))
    };
    let mut merged = serialize(&base_config)?;
    let written = document_tree(&overrides_text).unwrap_or_default();
    overlay(&mut merged, &serialize(&overrides_config)?, &written);
    let mut config: KubeProxyConfiguration = serde_path_to_error::deserialize(&merged)
        .map_err(|error| decode_error(overrides, error.path().to_string(), error.inner()))?;
    apply_defaults(&mut config);
    Ok((config, warnings))
}

/// Replaces in `target` each field `written` (the overrides file's own tree) names with its
/// decoded value from `decoded`, descending into sections both sides have. A written field
/// the decoded form lacks (unknown, so dropped with a warning, or left out when empty)
/// falls back to its default.
fn overlay(
    target: &mut serde_json::Value,
    decoded: &serde_json::Value,
    written: &serde_json::Value,
) {
    let (Some(target), Some(written)) = (target.as_object_mut(), written.as_object()) else {
        return;
    };
    for (key, written_value) in written {
        match decoded.get(key) {
            Some(value) if value.is_object() && written_value.is_object() => {
                let slot = target
                    .entry(key.clone())
                    .or_insert_with(|| serde_json::Value::Object(Default::default()));
                if slot.is_object() {
                    overlay(slot, value, written_value);
                } else {
                    *slot = value.clone();
                }
            }
            Some(value) => {
                target.insert(key.clone(), value.clone());
            }
            None => {
                target.remove(key);
            }
        }
    }
}

/// The document as a tree, a key written twice keeping its last value (as the YAML-to-JSON
/// step of upstream's lenient decoder does); `None` when it is neither JSON nor YAML.
fn document_tree(text: &str) -> Option<serde_json::Value> {
    serde_json::from_str(text)
        .ok()
        .or_else(|| serde_yaml::from_str(text).ok())
}

/// [`load_file_with_warnings`] without the warnings.
pub fn load_file(path: &Path) -> Result<KubeProxyConfiguration> {
    load_file_with_warnings(path).map(|(config, _)| config)
}

/// Decodes `text` strictly, and when strict decoding fails only on fields this version
/// does not know, again without them: the configuration and one warning per dropped field.
/// Other errors are the strict decoding's.
pub fn parse_lenient(text: &str, origin: &Path) -> Result<(KubeProxyConfiguration, Vec<String>)> {
    let strict = match parse_str(text, origin) {
        Ok(config) => return Ok((config, Vec::new())),
        Err(err) => err,
    };
    let is_unknown_field = |message: &str| message.starts_with("unknown field");
    let duplicate = match &strict {
        ConfigError::Decode { message, .. } if is_unknown_field(message) => None,
        ConfigError::Decode { message, field, .. } if message.starts_with("duplicate field") => {
            Some(format!(
                "{}: {}{message}: the last value applies: strict decoding failed, decoded \
                 leniently as kube-proxy does",
                origin.display(),
                if field.is_empty() {
                    String::new()
                } else {
                    format!("{field}: ")
                }
            ))
        }
        _ => return Err(strict),
    };
    let Some(mut value) = document_tree(text) else {
        return Err(strict);
    };
    let mut dropped = Vec::new();
    loop {
        match serde_path_to_error::deserialize::<_, KubeProxyConfiguration>(&value) {
            Ok(config) => {
                let warnings = duplicate
                    .into_iter()
                    .chain(dropped.iter().map(|field| {
                        format!(
                            "{}: unknown field {field} ignored: strict decoding failed, \
                             decoded leniently as kube-proxy does",
                            origin.display()
                        )
                    }))
                    .collect();
                return Ok((config, warnings));
            }
            Err(err) => {
                let field = err.path().to_string();
                // Each round drops one field; a bound guards against a path that does
                // not lead to what the error named.
                if !is_unknown_field(&err.inner().to_string())
                    || dropped.len() > 1000
                    || !remove_field(&mut value, &field)
                {
                    return Err(strict);
                }
                dropped.push(field);
            }
        }
    }
}

/// Removes the field at `path` (`a.b[2].c`, as serde_path_to_error prints it).
fn remove_field(value: &mut serde_json::Value, path: &str) -> bool {
    let mut steps: Vec<Step> = Vec::new();
    for segment in path.split('.') {
        let (name, indexes) = match segment.find('[') {
            Some(at) => (&segment[..at], &segment[at..]),
            None => (segment, ""),
        };
        if !name.is_empty() {
            steps.push(Step::Key(name.to_string()));
        }
        for index in indexes.split('[').filter(|i| !i.is_empty()) {
            match index.trim_end_matches(']').parse() {
                Ok(i) => steps.push(Step::Index(i)),
                Err(_) => return false,
            }
        }
    }
    let Some(Step::Key(last)) = steps.pop() else {
        return false;
    };
    let mut current = value;
    for step in steps {
        let next = match step {
            Step::Key(key) => current.get_mut(key.as_str()),
            Step::Index(i) => current.get_mut(i),
        };
        match next {
            Some(next) => current = next,
            None => return false,
        }
    }
    current
        .as_object_mut()
        .is_some_and(|object| object.remove(&last).is_some())
}

enum Step {
    Key(String),
    Index(usize),
}

/// Decodes `text` without defaulting; `origin` names the source in errors.
pub fn parse_str(text: &str, origin: &Path) -> Result<KubeProxyConfiguration> {
    // A YAML flow mapping also starts with '{'; only well-formed JSON takes the JSON path.
    let is_json = text.trim_start().starts_with('{')
        && serde_json::from_str::<serde_json::Value>(text).is_ok();
    check_type_meta(text, is_json, origin)?;
    if is_json {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(&mut deserializer)
            .map_err(|error| decode_error(origin, error.path().to_string(), error.inner()))
            .and_then(|config| {
                deserializer
                    .end()
                    .map_err(|error| decode_error(origin, String::new(), &error))?;
                Ok(config)
            })
    } else {
        let deserializer = serde_yaml::Deserializer::from_str(text);
        serde_path_to_error::deserialize(deserializer)
            .map_err(|error| decode_error(origin, error.path().to_string(), error.inner()))
    }
}

fn decode_error(origin: &Path, field: String, error: &dyn std::fmt::Display) -> ConfigError {
    // serde_path_to_error spells the document root ".".
    let field = if field == "." { String::new() } else { field };
    let message = strip_parent_path(&field, error.to_string());
    ConfigError::Decode {
        path: origin.to_owned(),
        field,
        message,
    }
}

/// serde_yaml starts its messages with the path of the value's parent ("iptables: unknown
/// field ..."); the full path is printed already, so that prefix is dropped.
fn strip_parent_path(field: &str, message: String) -> String {
    let mut candidate = field;
    while !candidate.is_empty() {
        if let Some(rest) = message
            .strip_prefix(candidate)
            .and_then(|rest| rest.strip_prefix(": "))
        {
            return rest.to_owned();
        }
        candidate = match candidate.rfind(['.', '[']) {
            Some(cut) => &candidate[..cut],
            None => "",
        };
    }
    message
}

/// Only the two TypeMeta fields; everything else is ignored at this stage.
#[derive(Deserialize)]
#[serde(
    rename_all = "camelCase",
    expecting = "a KubeProxyConfiguration mapping"
)]
struct TypeMeta {
    api_version: Option<String>,
    kind: Option<String>,
}

/// Refuses documents of another kind or version before their fields are interpreted, so
/// that a kubelet configuration passed by mistake is reported as such rather than as a
/// list of unknown fields.
fn check_type_meta(text: &str, is_json: bool, origin: &Path) -> Result<()> {
    let type_meta: TypeMeta = if is_json {
        serde_json::from_str(text).map_err(|error| decode_error(origin, String::new(), &error))?
    } else {
        serde_yaml::from_str(text).map_err(|error| decode_error(origin, String::new(), &error))?
    };
    let mut errors = Vec::new();
    match type_meta.api_version.as_deref() {
        Some(API_VERSION) => {}
        None | Some("") => errors.push(FieldError::required(
            "apiVersion",
            format!("must be {API_VERSION}"),
        )),
        Some(other) => errors.push(FieldError::not_supported(
            "apiVersion",
            other,
            &[API_VERSION],
        )),
    }
    match type_meta.kind.as_deref() {
        Some(KIND) => {}
        None | Some("") => errors.push(FieldError::required("kind", format!("must be {KIND}"))),
        Some(other) => errors.push(FieldError::not_supported("kind", other, &[KIND])),
    }
    if errors.is_empty() {
        return Ok(());
    }
    Err(ConfigError::Invalid {
        origin: origin.display().to_string(),
        errors,
    })
}

/// The configuration as YAML, every field included (what `--write-config-to` writes).
pub fn to_yaml(config: &KubeProxyConfiguration) -> Result<String> {
    serde_yaml::to_string(config).map_err(|error| ConfigError::Serialize(error.to_string()))
}

/// Writes `config` to `path` as YAML.
pub fn write_config(path: &Path, config: &KubeProxyConfiguration) -> Result<()> {
    let yaml = to_yaml(config)?;
    std::fs::write(path, yaml).map_err(|source| ConfigError::Write {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::defaults::default_config;
    use crate::config::duration::Duration;
    use crate::config::validate::validate;

    fn data_file(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/config")
            .join(name)
    }

    fn parse(text: &str) -> Result<KubeProxyConfiguration> {
        parse_str(text, Path::new("test.yaml"))
    }

    const HEADER: &str =
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

    /// Upstream's strict decoder refuses a key written twice and its lenient one keeps the
    /// last value (a hand-merged ConfigMap), with a log line: so do we.
    #[test]
    fn a_duplicated_field_keeps_its_last_value_with_a_warning() {
        for text in [
            format!("{HEADER}mode: iptables\nclusterCIDR: 10.0.0.0/8\nmode: nftables\n"),
            format!("{HEADER}iptables:\n  masqueradeBit: 12\n  masqueradeBit: 13\nmode: nftables\n"),
            format!("{HEADER}mode: iptables\nmode: nftables\nnewTopLevel: 1\n"),
            r#"{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration", "mode": "iptables", "mode": "nftables"}"#.to_string(),
        ] {
            assert!(parse(&text).is_err(), "strict decoding refuses {text}");
            let (config, warnings) = parse_lenient(&text, Path::new("test.yaml")).unwrap();
            assert_eq!(config.mode, "nftables", "{text}");
            assert!(!warnings.is_empty(), "{text}");
            if text.contains("masqueradeBit: 13") {
                assert_eq!(config.iptables.masquerade_bit, Some(13));
            }
        }
        // A bad value is still refused, duplicated or not.
        let bad =
            format!("{HEADER}mode: iptables\nmode: iptables\niptables:\n  masqueradeBit: many\n");
        assert!(parse_lenient(&bad, Path::new("test.yaml")).is_err());
    }

    #[test]
    fn unknown_fields_are_dropped_with_a_warning_naming_each() {
        let text = format!(
            "{HEADER}mode: iptables\nnewTopLevel: 1\niptables:\n  masqueradeBit: 12\n  \
             futureKnob: true\nlogging:\n  vmodule:\n  - {{filePattern: a, verbosity: 3, \
             extra: x}}\n"
        );
        assert!(parse(&text).is_err(), "strict decoding refuses them");
        let (config, warnings) = parse_lenient(&text, Path::new("test.yaml")).unwrap();
        assert_eq!(config.mode, "iptables");
        assert_eq!(config.iptables.masquerade_bit, Some(12));
        assert_eq!(config.logging.vmodule[0].verbosity, 3);
        let named: Vec<&str> = warnings
            .iter()
            .map(|w| {
                w.split("unknown field ")
                    .nth(1)
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap()
            })
            .collect();
        // In the order the retries meet them (the decoded document's key order).
        assert_eq!(
            named,
            [
                "iptables.futureKnob",
                "logging.vmodule[0].extra",
                "newTopLevel"
            ]
        );
        assert!(warnings[0].starts_with("test.yaml: "), "{}", warnings[0]);
        // Known fields decode as strictly as before: a bad value still refuses the file.
        let bad = format!("{HEADER}unknownOne: 1\niptables:\n  masqueradeBit: many\n");
        assert!(parse_lenient(&bad, Path::new("test.yaml")).is_err());
        // A file that decodes strictly has no warning.
        let (_, none) = parse_lenient(&format!("{HEADER}mode: ipvs\n"), Path::new("t")).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn yaml_and_json_fixtures_load_to_the_same_configuration() {
        let from_yaml = load_file(&data_file("full.yaml")).unwrap();
        let from_json = load_file(&data_file("full.json")).unwrap();
        assert_eq!(from_yaml, from_json);
        assert!(
            validate(&from_yaml).is_empty(),
            "{:?}",
            validate(&from_yaml)
        );
        assert_eq!(from_yaml.mode, "ipvs");
        assert_eq!(from_yaml.cluster_cidr, "10.244.0.0/16,fd00:10:244::/56");
        assert_eq!(from_yaml.ipvs.scheduler, "wrr");
        assert_eq!(from_yaml.ipvs.min_sync_period, Duration::from_secs(2));
        assert_eq!(from_yaml.conntrack.udp_timeout, Duration::from_secs(30));
        assert_eq!(from_yaml.feature_gates.get("SomeGate"), Some(&true));
        assert_eq!(
            from_yaml.ebpf.devices,
            vec!["eth0".to_owned(), "eth1".to_owned()]
        );
        assert_eq!(from_yaml.ebpf.map_sizes.services, 1024);
        assert_eq!(from_yaml.ebpf.map_sizes.backends, 65536);
        assert_eq!(from_yaml.logging.verbosity, 2);
        // Defaults fill what the file leaves out.
        assert_eq!(from_yaml.iptables.masquerade_bit, Some(14));
        assert_eq!(from_yaml.oom_score_adj, Some(-999));
    }

    #[test]
    fn empty_document_defaults_like_an_empty_object() {
        let config = load_file(&data_file("minimal.yaml")).unwrap();
        assert_eq!(config, default_config());
    }

    #[test]
    fn yaml_flow_mapping_is_not_mistaken_for_json() {
        let config = parse("{apiVersion: kubeproxy.config.k8s.io/v1alpha1, kind: KubeProxyConfiguration, mode: ipvs}")
            .unwrap();
        assert_eq!(config.mode, "ipvs");
    }

    #[test]
    fn unknown_top_level_field_is_named() {
        let err = parse(&format!("{HEADER}clusterCidr: 10.0.0.0/8\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("test.yaml: clusterCidr: unknown field `clusterCidr`, expected one of"),
            "{err}"
        );
    }

    #[test]
    fn unknown_nested_field_is_named_with_its_path() {
        let err = parse(&format!("{HEADER}iptables:\n  masqueradeBits: 14\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("test.yaml: iptables.masqueradeBits: unknown field `masqueradeBits`"),
            "{err}"
        );
        let err = parse_str(
            r#"{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","ebpf":{"mapSizes":{"service":1}}}"#,
            Path::new("c.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("c.json: ebpf.mapSizes.service: unknown field `service`"),
            "{err}"
        );
    }

    #[test]
    fn bad_duration_is_named_with_its_path() {
        let err = parse(&format!("{HEADER}conntrack:\n  udpTimeout: 30\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("test.yaml: conntrack.udpTimeout: "),
            "{err}"
        );
        let err = parse(&format!("{HEADER}configSyncPeriod: 15 minutes\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(r#"test.yaml: configSyncPeriod: time: unknown unit " minutes" in duration "15 minutes""#),
            "{err}"
        );
    }

    #[test]
    fn wrong_type_is_named_with_its_path() {
        let err = parse(&format!("{HEADER}featureGates:\n  Foo: maybe\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("test.yaml: featureGates.Foo: invalid type"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_fields_are_refused_by_strict_decoding() {
        let err = parse(&format!("{HEADER}mode: ipvs\nmode: iptables\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("duplicate"), "{err}");
    }

    #[test]
    fn wrong_api_version_is_refused() {
        let err =
            parse("apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n")
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"test.yaml: apiVersion: Unsupported value: "kubeproxy.config.k8s.io/v1alpha2": supported values: "kubeproxy.config.k8s.io/v1alpha1""#
        );
    }

    #[test]
    fn wrong_kind_is_refused() {
        let err = parse(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\nfoo: 1\n",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"test.yaml: kind: Unsupported value: "KubeletConfiguration": supported values: "KubeProxyConfiguration""#
        );
    }

    #[test]
    fn missing_type_meta_is_refused() {
        let err = parse("mode: ipvs\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "test.yaml: apiVersion: Required value: must be kubeproxy.config.k8s.io/v1alpha1\n\
             test.yaml: kind: Required value: must be KubeProxyConfiguration"
        );
    }

    #[test]
    fn non_mapping_document_is_refused() {
        let err = parse("- a\n- b\n").unwrap_err().to_string();
        assert!(
            err.starts_with(
                "test.yaml: invalid type: sequence, expected a KubeProxyConfiguration mapping"
            ),
            "{err}"
        );
        let err = parse(&format!("{HEADER}mode: [\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("test.yaml: did not find expected node content"),
            "{err}"
        );
    }

    #[test]
    fn unreadable_file_names_the_path() {
        let err = load_file(Path::new("/nonexistent/kube-proxy.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/nonexistent/kube-proxy.yaml: cannot read configuration file"),
            "{err}"
        );
    }

    #[test]
    fn written_configuration_reads_back_identically() {
        let mut config = default_config();
        config.mode = "ipvs".into();
        config.cluster_cidr = "10.0.0.0/8".into();
        config.node_port_addresses = vec!["primary".into()];
        config.conntrack.tcp_close_wait_timeout = Some(Duration::from_secs(90));
        config.feature_gates.insert("Gate".into(), false);
        config.ebpf.devices = vec!["eth0".into()];
        let yaml = to_yaml(&config).unwrap();
        assert!(yaml.contains("tcpCloseWaitTimeout: 1m30s\n"), "{yaml}");
        assert!(yaml.contains("syncPeriod: 30s\n"), "{yaml}");
        assert!(yaml.contains("clusterCIDR: 10.0.0.0/8\n"), "{yaml}");
        let read_back = parse(&yaml).unwrap();
        assert_eq!(read_back, config);

        let dir = std::env::temp_dir().join(format!("kp-config-roundtrip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("written.yaml");
        write_config(&path, &config).unwrap();
        assert_eq!(load_file(&path).unwrap(), config);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn upstream_defaulted_file_is_accepted() {
        // What upstream's own round-trip test writes for an empty v1alpha1 object.
        let config = load_file(&data_file("upstream-defaults.yaml")).unwrap();
        assert!(validate(&config).is_empty(), "{:?}", validate(&config));
        assert_eq!(config.iptables.localhost_node_ports, Some(true));
        assert_eq!(config.winkernel, Default::default());
    }
}
