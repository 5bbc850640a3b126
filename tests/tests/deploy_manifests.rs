// SPDX-License-Identifier: Apache-2.0
//! deploy/: every manifest parses into its k8s-openapi type without losing a field, the
//! kustomization lists exactly the manifests, the pieces refer to each other correctly
//! (service account, ConfigMap keys, mounts, probe port), the RBAC grants exactly what the
//! agent's watchers and events use, the ConfigMap's KubeProxyConfiguration passes the
//! agent's own validation, the demo's example manifests are what `--source` reads, and
//! `kubectl kustomize deploy/` renders a DaemonSet that selectors of kube-proxy find.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use k8s_openapi::{
    Resource,
    api::{
        apps::v1::DaemonSet,
        core::v1::{
            ConfigMap, Container, Node, Pod, PodSpec, Service, ServiceAccount, VolumeMount,
        },
        discovery::v1::EndpointSlice,
        networking::v1::ServiceCIDR,
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    },
};
use proxy_agent::config::{self, ProxyMode};
use serde::{Deserialize as _, Serialize, de::DeserializeOwned};
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| {
            let yaml: serde_yaml::Value = serde::Deserialize::deserialize(document)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            serde_json::to_value(yaml).unwrap()
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// Decodes `document` as `T` and checks that encoding it again gives the document back:
/// k8s-openapi skips unknown fields, so a misspelt or misplaced field would otherwise
/// vanish without a word.
fn typed<T: Resource + DeserializeOwned + Serialize>(document: &Value, origin: &Path) -> T {
    let object: T = serde_json::from_value(document.clone())
        .unwrap_or_else(|e| panic!("{}: not a valid {}: {e}", origin.display(), T::KIND));
    let back = serde_json::to_value(&object).unwrap();
    assert_eq!(
        &back,
        document,
        "{}: the {} loses fields when decoded (unknown or misplaced)",
        origin.display(),
        T::KIND
    );
    object
}

#[derive(Default)]
struct Manifests {
    daemon_sets: Vec<DaemonSet>,
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    config_maps: Vec<ConfigMap>,
}

fn is_kustomization(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "kustomization.yaml")
}

fn load_manifests() -> Manifests {
    let mut all = Manifests::default();
    for file in yaml_files(&deploy_dir())
        .iter()
        .filter(|f| !is_kustomization(f))
    {
        for document in documents(file) {
            let api_version = document["apiVersion"].as_str().unwrap_or_default();
            let kind = document["kind"].as_str().unwrap_or_default();
            match (api_version, kind) {
                (DaemonSet::API_VERSION, DaemonSet::KIND) => {
                    all.daemon_sets.push(typed(&document, file))
                }
                (ServiceAccount::API_VERSION, ServiceAccount::KIND) => {
                    all.service_accounts.push(typed(&document, file))
                }
                (ClusterRole::API_VERSION, ClusterRole::KIND) => {
                    all.cluster_roles.push(typed(&document, file))
                }
                (ClusterRoleBinding::API_VERSION, ClusterRoleBinding::KIND) => {
                    all.bindings.push(typed(&document, file))
                }
                (ConfigMap::API_VERSION, ConfigMap::KIND) => {
                    all.config_maps.push(typed(&document, file))
                }
                other => panic!("{}: unexpected object {other:?}", file.display()),
            }
        }
    }
    all
}

fn only<'a, T>(items: &'a [T], what: &str) -> &'a T {
    assert_eq!(items.len(), 1, "expected exactly one {what}");
    &items[0]
}

fn pod_spec(ds: &DaemonSet) -> &PodSpec {
    ds.spec.template.spec.as_ref().expect("a pod template spec")
}

fn agent_container(ds: &DaemonSet) -> &Container {
    pod_spec(ds)
        .containers
        .iter()
        .find(|c| c.name == "proxy-agent")
        .expect("a proxy-agent container")
}

/// The hostPath behind a container's mount.
fn host_path_of<'a>(ds: &'a DaemonSet, mount: &VolumeMount) -> Option<&'a str> {
    pod_spec(ds)
        .volumes
        .as_ref()?
        .iter()
        .find(|v| v.name == mount.name)?
        .host_path
        .as_ref()
        .map(|h| h.path.as_str())
}

/// The container's mount whose mountPath contains `path` (the deepest one).
fn mount_holding<'a>(container: &'a Container, path: &Path) -> Option<&'a VolumeMount> {
    container
        .volume_mounts
        .as_ref()?
        .iter()
        .filter(|m| path.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())
}

/// The FILE of `--NAME=FILE` the container is started with.
fn file_flag(container: &Container, name: &str) -> PathBuf {
    let prefix = format!("--{name}=");
    let args = container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten());
    args.filter_map(|a| a.strip_prefix(prefix.as_str()))
        .map(PathBuf::from)
        .next()
        .unwrap_or_else(|| panic!("the agent is started with {prefix}FILE"))
}

/// The file at `path` in the container, when a ConfigMap volume provides it.
fn config_map_file(ds: &DaemonSet, cm: &ConfigMap, container: &Container, path: &Path) -> String {
    let mount = mount_holding(container, path).expect("a mount holding the file");
    let pod = pod_spec(ds);
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    let source = volume.config_map.as_ref().expect("a ConfigMap volume");
    assert_eq!(Some(&source.name), cm.metadata.name.as_ref());
    let key = path
        .strip_prefix(&mount.mount_path)
        .unwrap()
        .to_str()
        .unwrap();
    cm.data
        .as_ref()
        .and_then(|d| d.get(key))
        .unwrap_or_else(|| panic!("the ConfigMap has no key {key}"))
        .clone()
}

/// The ConfigMap and key that provide the file at `path` in the container, through a
/// ConfigMap volume that lists its items.
fn config_map_item(ds: &DaemonSet, container: &Container, path: &Path) -> (String, String) {
    let mount = mount_holding(container, path).expect("a mount holding the file");
    let volume = pod_spec(ds)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    let source = volume.config_map.as_ref().expect("a ConfigMap volume");
    let file = path.strip_prefix(&mount.mount_path).unwrap();
    let item = source
        .items
        .iter()
        .flatten()
        .find(|i| Path::new(&i.path) == file)
        .unwrap_or_else(|| panic!("the volume {} has no item {}", mount.name, file.display()));
    assert_ne!(source.optional, Some(true));
    (source.name.clone(), item.key.clone())
}

/// The kubeconfig.conf kubeadm puts in its `kube-proxy` ConfigMap, its endpoint made up.
const KUBEADM_KUBECONFIG: &str = r#"
apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
    server: https://192.0.2.10:6443
  name: default
contexts:
- context:
    cluster: default
    namespace: default
    user: default
  name: default
current-context: default
users:
- name: default
  user:
    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
"#;

/// kubeadm's `config.conf` as `kubeadm init phase addon kube-proxy --print-manifest` (1.37)
/// writes it, with podSubnet 10.244.0.0/16.
fn kubeadm_config_conf() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../proxy-agent/tests/data/config/kubeadm-1.37.conf")
}

/// The configuration the agent container resolves on a kubeadm cluster: `--config` is
/// kubeadm's `config.conf` (from its `kube-proxy` ConfigMap), `--config-overrides` the
/// file `cm` provides.
fn agent_configuration(
    ds: &DaemonSet,
    cm: &ConfigMap,
    container: &Container,
) -> config::KubeProxyConfiguration {
    let base = file_flag(container, "config");
    assert_eq!(
        config_map_item(ds, container, &base),
        ("kube-proxy".to_owned(), "config.conf".to_owned()),
        "{}: --config is kubeadm's file",
        container.name
    );
    let overrides = config_map_file(ds, cm, container, &file_flag(container, "config-overrides"));
    let dir = std::env::temp_dir().join(format!(
        "kpe-deploy-manifests-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let overrides_path = dir.join("overrides.conf");
    std::fs::write(&overrides_path, overrides).unwrap();
    let loaded = config::load_files_with_warnings(&kubeadm_config_conf(), &overrides_path);
    std::fs::remove_dir_all(&dir).unwrap();
    let (mut cfg, warnings) = loaded.unwrap_or_else(|e| panic!("{e}"));
    assert!(warnings.is_empty(), "{warnings:?}");
    // The order `--config` follows: file defaults, platform defaults, validation.
    config::apply_platform_defaults(&mut cfg);
    let errors = config::validate(&cfg);
    assert!(
        errors.is_empty(),
        "the agent refuses the configuration: {errors:?}"
    );
    cfg
}

#[test]
fn every_manifest_parses_into_its_type_without_losing_a_field() {
    let all = load_manifests();
    only(&all.daemon_sets, "DaemonSet");
    only(&all.service_accounts, "ServiceAccount");
    only(&all.cluster_roles, "ClusterRole");
    only(&all.bindings, "ClusterRoleBinding");
    only(&all.config_maps, "ConfigMap");
}

#[test]
fn the_round_trip_check_catches_a_misspelt_field() {
    let document = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "x"},
        "automountServiceAccountTokens": false,
    });
    let caught = std::panic::catch_unwind(|| {
        typed::<ServiceAccount>(&document, Path::new("inline"));
    });
    assert!(caught.is_err());
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    api_version: String,
    kind: String,
    namespace: String,
    resources: Vec<String>,
    #[serde(default)]
    images: Vec<KustomizeImage>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KustomizeImage {
    name: String,
    new_name: Option<String>,
    new_tag: Option<String>,
}

#[test]
fn kustomization_lists_every_manifest_and_the_image() {
    let dir = deploy_dir();
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let k: Kustomization = serde_yaml::from_str(&text).unwrap();
    assert_eq!(k.api_version, "kustomize.config.k8s.io/v1beta1");
    assert_eq!(k.kind, "Kustomization");

    let listed: BTreeSet<String> = k.resources.iter().cloned().collect();
    assert_eq!(
        listed.len(),
        k.resources.len(),
        "a resource is listed twice"
    );
    let present: BTreeSet<String> = yaml_files(&dir)
        .iter()
        .filter(|f| !is_kustomization(f))
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed, present);

    let all = load_manifests();
    let ds = only(&all.daemon_sets, "DaemonSet");
    let pod = pod_spec(ds);
    for container in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        let image = container.image.as_deref().unwrap();
        let rewritten = k.images.iter().find(|i| i.name == image);
        assert!(
            rewritten.is_some_and(|i| i.new_name.is_some() && i.new_tag.is_some()),
            "container {} uses image {image}, which the kustomization does not set",
            container.name
        );
    }
    // Everything namespaced lands where the kustomization puts it.
    let namespaces: BTreeSet<Option<&str>> = [
        ds.metadata.namespace.as_deref(),
        only(&all.service_accounts, "ServiceAccount")
            .metadata
            .namespace
            .as_deref(),
        only(&all.config_maps, "ConfigMap")
            .metadata
            .namespace
            .as_deref(),
    ]
    .into_iter()
    .collect();
    assert_eq!(namespaces, BTreeSet::from([Some(k.namespace.as_str())]));
}

#[test]
fn configmap_configuration_passes_the_agents_validation() {
    let all = load_manifests();
    let ds = only(&all.daemon_sets, "DaemonSet");
    let cm = only(&all.config_maps, "ConfigMap");
    let agent = agent_container(ds);
    let cfg = agent_configuration(ds, cm, agent);
    let effective = config::effective(&cfg).unwrap();
    assert_eq!(effective.mode, ProxyMode::Ebpf);

    // No hand edits: nothing cluster-specific in the overrides. The pod network is
    // kubeadm's podSubnet (upstream's default detector, ClusterCIDR), the API server is in
    // kubeadm's kubeconfig.
    assert_eq!(effective.local_mode, config::LocalMode::ClusterCidr);
    assert_eq!(
        effective.cluster_cidrs,
        vec!["10.244.0.0/16".parse::<ipnet::IpNet>().unwrap()]
    );
    let text = std::fs::read_to_string(deploy_dir().join("configmap.yaml")).unwrap();
    assert!(!text.contains("CONTROL_PLANE_ENDPOINT"));
    for silent in [
        "clusterCIDR",
        "detectLocalMode",
        "kubeconfig",
        "BindAddress",
    ] {
        assert!(
            !text.contains(&format!("{silent}:")),
            "the overrides leave {silent} to kubeadm's file"
        );
    }

    // The kubeconfig it names is kubeadm's, from the `kube-proxy` ConfigMap kubeadm creates,
    // mounted in both the agent and the init container (--init-only reads the Node too).
    let kubeconfig_path = PathBuf::from(&cfg.client_connection.kubeconfig);
    let pod = pod_spec(ds);
    let init = &pod.init_containers.as_ref().unwrap()[0];
    for container in [agent, init] {
        let (name, key) = config_map_item(ds, container, &kubeconfig_path);
        assert_eq!(
            (name.as_str(), key.as_str()),
            ("kube-proxy", "kubeconfig.conf"),
            "{}",
            container.name
        );
    }
    // What kubeadm writes there (cmd/kubeadm/app/phases/addons/proxy, the kube-proxy
    // ConfigMap's kubeconfig.conf): the control-plane endpoint, and the CA and token of
    // the pod's own service account, which are therefore mounted.
    let kubeadm_kubeconfig = kube::config::Kubeconfig::from_yaml(KUBEADM_KUBECONFIG).unwrap();
    let sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    let user = kubeadm_kubeconfig.auth_infos[0].auth_info.as_ref().unwrap();
    assert_eq!(
        user.token_file.as_deref(),
        Some(&*format!("{sa_dir}/token"))
    );
    assert_ne!(pod.automount_service_account_token, Some(false));
    let sa = only(&all.service_accounts, "ServiceAccount");
    assert_ne!(sa.automount_service_account_token, Some(false));

    // The init container reads the same files.
    let init_script = init.command.as_ref().unwrap().join(" ");
    for flag in ["config", "config-overrides"] {
        let path = file_flag(agent, flag);
        assert!(init_script.contains(&format!("--{flag}={}", path.display())));
    }
    assert!(init_script.contains("--init-only"));
}

#[test]
fn daemonset_mounts_what_the_configuration_points_at() {
    let all = load_manifests();
    let ds = only(&all.daemon_sets, "DaemonSet");
    let cm = only(&all.config_maps, "ConfigMap");
    let agent = agent_container(ds);
    let cfg = agent_configuration(ds, cm, agent);

    // Pins go to the host's bpffs, and mounts made there by the init container show up.
    let bpffs = mount_holding(agent, Path::new(&cfg.ebpf.bpffs_root)).unwrap();
    assert_eq!(host_path_of(ds, bpffs), Some("/sys/fs/bpf"));
    assert_eq!(bpffs.mount_propagation.as_deref(), Some("HostToContainer"));
    assert_ne!(bpffs.read_only, Some(true));
    // The socket programs attach to the host's cgroup v2 root, not the container's.
    let cgroup = mount_holding(agent, Path::new(&cfg.ebpf.cgroup_root)).unwrap();
    assert_eq!(cgroup.mount_path, cfg.ebpf.cgroup_root);
    assert_eq!(host_path_of(ds, cgroup), Some("/sys/fs/cgroup"));

    let lib_modules = mount_holding(agent, Path::new("/lib/modules")).unwrap();
    assert_eq!(host_path_of(ds, lib_modules), Some("/lib/modules"));
    assert_eq!(lib_modules.read_only, Some(true));
    let lock = mount_holding(agent, Path::new("/run/xtables.lock")).unwrap();
    assert_eq!(host_path_of(ds, lock), Some("/run/xtables.lock"));

    // Probes on the healthz server's port.
    let healthz_port: i32 = cfg
        .healthz_bind_address
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap();
    for (probe, path) in [
        (agent.liveness_probe.as_ref(), "/livez"),
        (agent.readiness_probe.as_ref(), "/healthz"),
    ] {
        let get = probe.and_then(|p| p.http_get.as_ref()).unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(healthz_port)
        );
    }
}

#[test]
fn daemonset_runs_on_every_node_with_least_privilege() {
    let all = load_manifests();
    let ds = only(&all.daemon_sets, "DaemonSet");
    let sa = only(&all.service_accounts, "ServiceAccount");
    let pod = pod_spec(ds);
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(pod.service_account_name, sa.metadata.name);
    assert_eq!(ds.metadata.namespace, sa.metadata.namespace);
    let tolerates_everything =
        pod.tolerations.iter().flatten().any(|t| {
            t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()
        });
    assert!(
        tolerates_everything,
        "the agent must run on tainted nodes too"
    );

    // The long-running container: not privileged, only added capabilities.
    let agent = agent_container(ds);
    let security = agent.security_context.as_ref().unwrap();
    assert_ne!(security.privileged, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    let caps = security.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
    for needed in ["BPF", "NET_ADMIN"] {
        assert!(added.contains(needed), "CAP_{needed} is missing");
    }
    assert!(!added.contains("SYS_ADMIN"), "CAP_SYS_ADMIN is not needed");

    // Only the init container is privileged, which Bidirectional propagation requires.
    for init in pod.init_containers.iter().flatten() {
        let privileged = init.security_context.as_ref().and_then(|s| s.privileged) == Some(true);
        let bidirectional = init
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_propagation.as_deref() == Some("Bidirectional"));
        assert!(
            !bidirectional || privileged,
            "{}: Bidirectional needs privileged",
            init.name
        );
    }
    for container in &pod.containers {
        for mount in container.volume_mounts.iter().flatten() {
            assert_ne!(mount.mount_propagation.as_deref(), Some("Bidirectional"));
        }
    }

    // Hosts with SELinux or AppArmor: the unprivileged containers run as spc_t, the pod
    // unconfined (pinning under /sys/fs/bpf, entering namespaces), as Cilium's agent does.
    for container in &pod.containers {
        let selinux = container
            .security_context
            .as_ref()
            .and_then(|s| s.se_linux_options.as_ref());
        assert_eq!(
            selinux.and_then(|o| o.type_.as_deref()),
            Some("spc_t"),
            "{}: SELinux type",
            container.name
        );
    }
    let apparmor = pod
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.as_ref());
    assert_eq!(apparmor.map(|p| p.type_.as_str()), Some("Unconfined"));

    // Memory from the measured figures (docs/bench/memory.csv, ebpf): the request covers
    // the agent's peak RSS plus its BPF maps (charged to the pod) at 10,000 services, the
    // limit the largest scale measured.
    let resources = agent.resources.as_ref().unwrap();
    let mib = |q: &str| -> f64 {
        let digits = q.trim_end_matches("Mi");
        assert_ne!(digits, q, "{q}: written in Mi");
        digits.parse().unwrap()
    };
    let request = mib(&resources.requests.as_ref().unwrap()["memory"].0);
    let limit = mib(&resources.limits.as_ref().expect("a memory limit")["memory"].0);
    let measured = measured_memory();
    let needs = |n: u64| {
        let (peak, maps) = measured[&n];
        peak + maps
    };
    assert!(
        request >= needs(10_000),
        "{request} MiB < {} MiB",
        needs(10_000)
    );
    let largest = *measured.keys().max().unwrap();
    assert!(
        limit >= needs(largest),
        "{limit} MiB < {} MiB",
        needs(largest)
    );
    assert!(limit > request);
}

/// ebpf mode's largest measured peak RSS and BPF map memory (MiB) per service count, from
/// the committed benchmark CSV.
fn measured_memory() -> std::collections::BTreeMap<u64, (f64, f64)> {
    let path = deploy_dir().join("../docs/bench/memory.csv");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out: std::collections::BTreeMap<u64, (f64, f64)> = Default::default();
    for line in text.lines().skip(1) {
        let cells: Vec<&str> = line.split(',').collect();
        let (Some(mode), Some(n), Some(metric), Some(value)) =
            (cells.get(1), cells.get(2), cells.get(4), cells.get(5))
        else {
            continue;
        };
        let (Ok(n), Ok(value)) = (n.parse::<u64>(), value.parse::<f64>()) else {
            continue;
        };
        if *mode != "ebpf" {
            continue;
        }
        let entry = out.entry(n).or_default();
        match *metric {
            "agent_peak_rss" => entry.0 = entry.0.max(value),
            "bpf_map_memory" => entry.1 = entry.1.max(value),
            _ => {}
        }
    }
    out.retain(|_, (peak, maps)| *peak > 0.0 && *maps > 0.0);
    assert!(
        out.contains_key(&10_000),
        "{}: no 10,000-service rows",
        path.display()
    );
    out
}

/// `kubectl kustomize deploy/`, as an operator would render it (kubectl is installed on the
/// project's machines; without it the test says so and passes).
#[test]
fn kubectl_kustomize_renders_a_daemonset_kube_proxy_selectors_find() {
    let output = match std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(deploy_dir())
        .output()
    {
        Ok(output) => output,
        Err(err) => {
            eprintln!("kubectl is not installed ({err}): the rendering is not checked here");
            return;
        }
    };
    assert!(
        output.status.success(),
        "kubectl kustomize deploy/: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let mut kinds = BTreeSet::new();
    let mut daemon_set = None;
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = Value::deserialize(document).unwrap();
        let kind = value["kind"].as_str().unwrap_or_default().to_string();
        assert_eq!(
            value["metadata"]["namespace"]
                .as_str()
                .unwrap_or("kube-system"),
            "kube-system",
            "{kind}"
        );
        if kind == DaemonSet::KIND {
            daemon_set = Some(typed::<DaemonSet>(&value, Path::new("kubectl kustomize")));
        }
        kinds.insert(kind);
    }
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "ServiceAccount"
        ]
        .map(String::from)
        .into(),
    );
    let ds = daemon_set.unwrap();
    let label = |labels: Option<&std::collections::BTreeMap<String, String>>| {
        labels.and_then(|l| l.get("k8s-app")).cloned()
    };
    assert_eq!(
        label(ds.metadata.labels.as_ref()).as_deref(),
        Some("kube-proxy")
    );
    let template = ds.spec.template.metadata.as_ref().unwrap();
    assert_eq!(
        label(template.labels.as_ref()).as_deref(),
        Some("kube-proxy")
    );
    // The image the kustomization names replaces the manifests' placeholder.
    for container in &pod_spec(&ds).containers {
        assert_ne!(container.image.as_deref(), Some("kube-proxy-ebpf"));
    }
}

#[test]
fn the_socket_terminator_sidecar_has_what_it_needs_and_no_more() {
    use proxy_agent::proxier::ebpf::sockets::{NETNS_DIR, SIDECAR_SOCKET};
    let all = load_manifests();
    let ds = only(&all.daemon_sets, "DaemonSet");
    let pod = pod_spec(ds);
    let sidecar = pod
        .containers
        .iter()
        .find(|c| c.name == "socket-terminator")
        .expect("a socket-terminator container");
    let args: Vec<&str> = sidecar
        .command
        .iter()
        .flatten()
        .chain(sidecar.args.iter().flatten())
        .map(String::as_str)
        .collect();
    assert_eq!(args.get(1), Some(&"socket-terminator"), "{args:?}");
    assert!(
        args.contains(&&*format!("--socket={SIDECAR_SOCKET}")),
        "{args:?}"
    );
    assert!(
        args.contains(&&*format!("--netns-dir={NETNS_DIR}")),
        "{args:?}"
    );

    // Entering namespaces and destroying sockets; nothing else.
    let security = sidecar.security_context.as_ref().unwrap();
    assert_ne!(security.privileged, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    let caps = security.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
    assert_eq!(added, BTreeSet::from(["SYS_ADMIN", "NET_ADMIN"]));

    // The agent finds the socket where the sidecar makes it: a volume of this pod only.
    let socket = Path::new(SIDECAR_SOCKET);
    let agent = agent_container(ds);
    let theirs = mount_holding(sidecar, socket).expect("the sidecar mounts the socket's volume");
    let ours = mount_holding(agent, socket).expect("the agent mounts the socket's volume");
    assert_eq!(theirs.name, ours.name);
    assert_eq!(theirs.mount_path, ours.mount_path);
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == ours.name)
        .unwrap();
    assert!(
        volume.empty_dir.is_some(),
        "the socket's volume is the pod's own"
    );

    // The pods' namespaces, read-only, new ones included; no other host path.
    let netns = mount_holding(sidecar, Path::new(NETNS_DIR)).expect("the netns directory");
    assert_eq!(host_path_of(ds, netns), Some(NETNS_DIR));
    assert_eq!(netns.read_only, Some(true));
    assert_eq!(netns.mount_propagation.as_deref(), Some("HostToContainer"));
    let host_paths: Vec<&str> = sidecar
        .volume_mounts
        .iter()
        .flatten()
        .filter_map(|m| host_path_of(ds, m))
        .collect();
    assert_eq!(host_paths, vec![NETNS_DIR]);
}

/// (API group, resource) of a k8s-openapi type.
fn resource_of<K: Resource>() -> (String, String) {
    (K::GROUP.to_string(), K::URL_PATH_SEGMENT.to_string())
}

#[test]
fn rbac_grants_exactly_what_the_agent_uses() {
    let all = load_manifests();
    let role = only(&all.cluster_roles, "ClusterRole");
    let binding = only(&all.bindings, "ClusterRoleBinding");
    let sa = only(&all.service_accounts, "ServiceAccount");

    let mut granted = BTreeSet::new();
    for rule in role.rules.iter().flatten() {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    granted.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    // What the watchers list and watch, and the events the agent records (events.k8s.io/v1,
    // kube's Recorder).
    let mut expected = BTreeSet::new();
    for (group, resource) in [
        resource_of::<Service>(),
        resource_of::<EndpointSlice>(),
        resource_of::<Node>(),
        resource_of::<ServiceCIDR>(),
    ] {
        for verb in ["list", "watch"] {
            expected.insert((group.clone(), resource.clone(), verb.to_string()));
        }
    }
    for (group, resource) in [resource_of::<k8s_openapi::api::events::v1::Event>()] {
        for verb in ["create", "patch"] {
            expected.insert((group.clone(), resource.clone(), verb.to_string()));
        }
    }
    assert_eq!(granted, expected);

    assert_eq!(binding.role_ref.kind, ClusterRole::KIND);
    assert_eq!(Some(&binding.role_ref.name), role.metadata.name.as_ref());
    let subjects = binding.subjects.as_deref().unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, ServiceAccount::KIND);
    assert_eq!(Some(&subjects[0].name), sa.metadata.name.as_ref());
    assert_eq!(subjects[0].namespace, sa.metadata.namespace);
}

/// deploy/examples/ is a small cluster for `cargo xtask demo`: one Node, Services whose
/// selectors pick Pods on it (valid objects, each Pod with the status the demo writes in
/// place of a kubelet: an address in the Node's podCIDR, a Ready condition), and a named
/// targetPort that a Pod's container port resolves. Upstream's EndpointSlice controller
/// makes the slices from them (the demo shows it); none is written by hand.
#[test]
fn demo_examples_are_a_cluster_the_controller_makes_slices_for() {
    let mut nodes = Vec::new();
    let mut services = Vec::new();
    let mut pods = Vec::new();
    for file in yaml_files(&deploy_dir().join("examples")) {
        let documents = documents(&file);
        assert!(!documents.is_empty(), "{} holds no object", file.display());
        for document in documents {
            match document["kind"].as_str() {
                Some("Node") => nodes.push(typed::<Node>(&document, &file)),
                Some("Service") => services.push(typed::<Service>(&document, &file)),
                Some("Pod") => pods.push(typed::<Pod>(&document, &file)),
                Some("Namespace") => {}
                other => panic!("{}: a {other:?} in the demo's examples", file.display()),
            }
        }
    }
    let [node] = nodes.as_slice() else {
        panic!("the demo runs one node, not {}", nodes.len());
    };
    let node_name = node.metadata.name.clone().unwrap();
    let pod_cidr: ipnet::IpNet = node
        .spec
        .as_ref()
        .unwrap()
        .pod_cidr
        .as_ref()
        .unwrap()
        .parse()
        .unwrap();
    for pod in &pods {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(
            spec.node_name.as_ref(),
            Some(&node_name),
            "pods live on the demo node"
        );
        let status = pod.status.as_ref().expect("the status the demo writes");
        let ip: std::net::IpAddr = status.pod_ip.as_ref().unwrap().parse().unwrap();
        assert!(
            pod_cidr.contains(&ip),
            "{ip} outside the node's podCIDR {pod_cidr}"
        );
        assert!(
            status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready")
        );
    }
    assert!(services.len() >= 2);
    let mut named_port = false;
    for service in &services {
        let spec = service.spec.as_ref().unwrap();
        let selector = spec
            .selector
            .as_ref()
            .expect("the controller needs a selector");
        let selected: Vec<&Pod> = pods
            .iter()
            .filter(|p| {
                p.metadata.namespace == service.metadata.namespace
                    && selector
                        .iter()
                        .all(|(k, v)| p.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v))
            })
            .collect();
        assert!(
            selected.len() >= 2,
            "{:?} selects {} pods",
            service.metadata.name,
            selected.len()
        );
        for port in spec.ports.iter().flatten() {
            if let Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name)) =
                &port.target_port
            {
                named_port = true;
                for pod in &selected {
                    let containers = &pod.spec.as_ref().unwrap().containers;
                    assert!(
                        containers
                            .iter()
                            .flat_map(|c| c.ports.iter().flatten())
                            .any(|p| p.name.as_deref() == Some(name)),
                        "{:?} has no container port named {name}",
                        pod.metadata.name
                    );
                }
            }
        }
    }
    assert!(named_port, "one Service shows a named targetPort");
}

/// deploy/cleanup/: the rollback DaemonSet hands each node back to kube-proxy's mode
/// (`handover`, which the agent's command line accepts), needs no API access, and renders
/// with `kubectl kustomize`.
#[test]
fn cleanup_daemonset_hands_nodes_back_without_api_access() {
    use clap::{CommandFactory as _, FromArgMatches as _, Parser};
    use proxy_agent::tools::Tool;

    #[derive(Parser)]
    #[command(name = "proxy-agent")]
    struct Cli {
        #[command(flatten)]
        flags: config::Flags,
        #[command(subcommand)]
        tool: Option<Tool>,
    }

    let dir = deploy_dir().join("cleanup");
    let documents = documents(&dir.join("daemonset.yaml"));
    assert_eq!(documents.len(), 1);
    let ds: DaemonSet = typed(&documents[0], &dir.join("daemonset.yaml"));
    let pod = pod_spec(&ds);
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.automount_service_account_token, Some(false));
    let init = &pod.init_containers.as_ref().unwrap()[0];
    let command = init.command.as_ref().unwrap();
    assert_eq!(command[0], "/usr/local/bin/proxy-agent");
    let matches = Cli::command()
        .try_get_matches_from(command)
        .unwrap_or_else(|e| panic!("the agent refuses {command:?}: {e}"));
    let cli = Cli::from_arg_matches(&matches).unwrap();
    let Some(Tool::Handover(handover)) = cli.tool else {
        panic!("{command:?} is not a handover");
    };
    assert_eq!(handover.to, ProxyMode::Iptables);
    // The same pins the agent's configuration names, on the host's bpffs.
    let all = load_manifests();
    let agent_ds = only(&all.daemon_sets, "DaemonSet");
    let agent = agent_container(agent_ds);
    let cfg = agent_configuration(agent_ds, only(&all.config_maps, "ConfigMap"), agent);
    let root = handover.bpffs_root.expect("--bpffs-root");
    assert_eq!(root, PathBuf::from(&cfg.ebpf.bpffs_root));
    let bpffs = mount_holding(init, &root).unwrap();
    assert_eq!(host_path_of(&ds, bpffs), Some("/sys/fs/bpf"));

    let Ok(output) = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
    else {
        eprintln!("kubectl is not installed: the rendering is not checked here");
        return;
    };
    assert!(
        output.status.success(),
        "kubectl kustomize deploy/cleanup: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let rendered: DaemonSet = serde_yaml::from_str(&text).unwrap();
    assert_eq!(rendered.metadata.namespace.as_deref(), Some("kube-system"));
}
