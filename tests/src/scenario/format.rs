// SPDX-License-Identifier: Apache-2.0
//! The scenario file format (shared/scenarios/README.md): the raw serde shape and the
//! checked form the runner works with.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    str::FromStr,
};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    addr::{parse_cidr, parse_ip, parse_socket_addr},
    error::{Error, Result},
};

/// A file exactly as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawScenario {
    pub name: String,
    #[serde(default)]
    pub about: String,
    #[serde(default)]
    pub upstream: String,
    pub node: RawNode,
    #[serde(default)]
    pub config: Map<String, Value>,
    #[serde(default)]
    pub objects: Vec<Value>,
    #[serde(default)]
    pub flows: Vec<RawFlow>,
    #[serde(default)]
    pub steps: Vec<RawStep>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNode {
    pub name: String,
    pub addresses: Vec<String>,
    #[serde(rename = "podCIDR")]
    pub pod_cidr: RawCidrs,
}

/// `podCIDR: 10.0.0.0/8`, `podCIDR: 10.0.0.0/8,fd00:10::/64` (as `clusterCIDR` is
/// written) or `podCIDR: [10.0.0.0/8, fd00:10::/64]`: one CIDR per family on a
/// dual-stack node.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawCidrs {
    One(String),
    Many(Vec<String>),
}

impl RawCidrs {
    fn parse(&self) -> Result<Vec<IpNet>> {
        let texts: Vec<&str> = match self {
            RawCidrs::One(text) => text.split(',').collect(),
            RawCidrs::Many(list) => list.iter().map(String::as_str).collect(),
        };
        let cidrs = texts
            .into_iter()
            .map(|t| parse_cidr(t).map(|c| c.trunc()))
            .collect::<Result<Vec<_>>>()?;
        if cidrs.is_empty() {
            return Err(Error::Invalid("node.podCIDR is empty".into()));
        }
        Ok(cidrs)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFlow {
    pub from: String,
    pub to: String,
    #[serde(default)]
    pub proto: Proto,
    pub expect: RawExpect,
    #[serde(default)]
    pub masq: Option<bool>,
    #[serde(default)]
    pub sticky: bool,
    #[serde(default)]
    pub modes: Option<Vec<String>>,
    #[serde(default)]
    pub note: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawExpect {
    Backends(Vec<String>),
    Keyword(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStep {
    #[serde(default)]
    pub objects: Option<Vec<Value>>,
    #[serde(default)]
    pub delete: Option<Vec<String>>,
    #[serde(default)]
    pub flows: Vec<RawFlow>,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    #[default]
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    pub const ALL: [Proto; 3] = [Proto::Tcp, Proto::Udp, Proto::Sctp];

    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Proto {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Proto::Tcp),
            "udp" => Ok(Proto::Udp),
            "sctp" => Ok(Proto::Sctp),
            other => Err(Error::Invalid(format!("unknown protocol {other:?}"))),
        }
    }
}

/// A dataplane mode a flow may name (shared/scenarios/README.md, "Modes and
/// divergences").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    Ebpf,
    Iptables,
    Ipvs,
    /// Upstream's current mode. Scenario files name it where its outcome differs from
    /// iptables mode's (ebpf mode follows it).
    Nftables,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Ebpf, Mode::Iptables, Mode::Ipvs, Mode::Nftables];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Ebpf => "ebpf",
            Mode::Iptables => "iptables",
            Mode::Ipvs => "ipvs",
            Mode::Nftables => "nftables",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Mode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| {
                Error::Invalid(format!("unknown mode {s:?} (ebpf|iptables|ipvs|nftables)"))
            })
    }
}

/// What a flow must see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expectation {
    /// Every attempt is answered by an echo server at one of these addresses.
    Backends(BTreeSet<SocketAddr>),
    Reject,
    Drop,
    Local,
    Untouched,
}

impl fmt::Display for Expectation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expectation::Backends(set) => {
                let list: Vec<String> = set.iter().map(ToString::to_string).collect();
                write!(f, "[{}]", list.join(", "))
            }
            Expectation::Reject => f.write_str("REJECT"),
            Expectation::Drop => f.write_str("DROP"),
            Expectation::Local => f.write_str("LOCAL"),
            Expectation::Untouched => f.write_str("UNTOUCHED"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    /// 1-based position among all flows of the file (steps included), stable across modes.
    pub index: usize,
    /// 0 for the initial objects, n for the n-th step.
    pub step: usize,
    pub from: IpAddr,
    pub to: SocketAddr,
    pub proto: Proto,
    pub expect: Expectation,
    pub masq: Option<bool>,
    pub sticky: bool,
    /// `None`: every mode.
    pub modes: Option<BTreeSet<Mode>>,
    pub note: String,
}

impl Flow {
    pub fn applies_to(&self, mode: Mode) -> bool {
        self.modes.as_ref().is_none_or(|m| m.contains(&mode))
    }
}

/// `Kind/namespace/name`, or `Kind/name` for cluster-scoped objects.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl FromStr for ObjectRef {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let parts: Vec<&str> = s.split('/').collect();
        match parts.as_slice() {
            [kind, name] if !kind.is_empty() && !name.is_empty() => Ok(ObjectRef {
                kind: kind.to_string(),
                namespace: None,
                name: name.to_string(),
            }),
            [kind, ns, name] if !kind.is_empty() && !ns.is_empty() && !name.is_empty() => {
                Ok(ObjectRef {
                    kind: kind.to_string(),
                    namespace: Some(ns.to_string()),
                    name: name.to_string(),
                })
            }
            _ => Err(Error::Invalid(format!(
                "object reference {s:?} is not Kind/namespace/name or Kind/name"
            ))),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{}/{}/{}", self.kind, ns, self.name),
            None => write!(f, "{}/{}", self.kind, self.name),
        }
    }
}

/// How a stage changes the cluster state before its flows run.
#[derive(Debug, Clone)]
pub enum Change {
    /// The whole state becomes these objects (the initial `objects`, or a step's).
    Replace(Vec<Value>),
    Delete(Vec<ObjectRef>),
}

#[derive(Debug, Clone)]
pub struct Stage {
    pub change: Change,
    pub flows: Vec<Flow>,
}

#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub name: String,
    /// Canonical, in file order; the first is the primary address.
    pub addresses: Vec<IpNet>,
    /// At least one; one per family on a dual-stack node.
    pub pod_cidrs: Vec<IpNet>,
}

impl NodeSpec {
    pub fn primary(&self) -> IpNet {
        // `Scenario::from_raw` rejects a node without addresses.
        self.addresses[0]
    }

    /// The first address of `ip`'s family: where that family's uplink subnet, router
    /// and default route come from.
    pub fn primary_for(&self, ip: IpAddr) -> Option<IpNet> {
        self.addresses
            .iter()
            .copied()
            .find(|a| a.addr().is_ipv4() == ip.is_ipv4())
    }

    /// The first address of each family the node has, primary family first.
    pub fn family_primaries(&self) -> Vec<IpNet> {
        let mut out: Vec<IpNet> = Vec::new();
        for address in &self.addresses {
            if !out
                .iter()
                .any(|a| a.addr().is_ipv4() == address.addr().is_ipv4())
            {
                out.push(*address);
            }
        }
        out
    }

    pub fn in_pod_cidrs(&self, ip: IpAddr) -> bool {
        self.pod_cidrs.iter().any(|c| c.contains(&ip))
    }

    pub fn owns(&self, ip: IpAddr) -> bool {
        self.addresses.iter().any(|a| a.addr() == ip)
    }
}

/// A checked scenario file.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub about: String,
    pub upstream: String,
    pub path: PathBuf,
    pub node: NodeSpec,
    pub config: Map<String, Value>,
    /// Stage 0 is the initial objects; one more per step.
    pub stages: Vec<Stage>,
}

impl Scenario {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let raw: RawScenario = serde_yaml::from_str(&text).map_err(|source| Error::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_raw(raw, path).map_err(|err| match err {
            Error::Invalid(msg) => Error::Invalid(format!("{}: {msg}", path.display())),
            other => other,
        })
    }

    pub fn from_raw(raw: RawScenario, path: &Path) -> Result<Self> {
        let node = NodeSpec {
            addresses: raw
                .node
                .addresses
                .iter()
                .map(|a| parse_cidr(a))
                .collect::<Result<_>>()?,
            pod_cidrs: raw.node.pod_cidr.parse()?,
            name: raw.node.name,
        };
        if node.addresses.is_empty() {
            return Err(Error::Invalid("node.addresses is empty".into()));
        }
        let mut index = 0;
        let mut flows = |raw_flows: Vec<RawFlow>, step: usize| -> Result<Vec<Flow>> {
            raw_flows
                .into_iter()
                .map(|f| {
                    index += 1;
                    check_flow(f, index, step)
                })
                .collect()
        };
        let mut stages = vec![Stage {
            change: Change::Replace(raw.objects),
            flows: flows(raw.flows, 0)?,
        }];
        for (n, step) in raw.steps.into_iter().enumerate() {
            let change = match (step.objects, step.delete) {
                (Some(objects), None) => Change::Replace(objects),
                (None, Some(refs)) => {
                    Change::Delete(refs.iter().map(|r| r.parse()).collect::<Result<_>>()?)
                }
                _ => {
                    return Err(Error::Invalid(format!(
                        "step {} must have exactly one of objects or delete",
                        n + 1
                    )));
                }
            };
            stages.push(Stage {
                change,
                flows: flows(step.flows, n + 1)?,
            });
        }
        for stage in &stages {
            check_mode_coverage(&stage.flows)?;
        }
        Ok(Scenario {
            name: raw.name,
            about: raw.about,
            upstream: raw.upstream,
            path: path.to_path_buf(),
            node,
            config: raw.config,
            stages,
        })
    }

    pub fn flows(&self) -> impl Iterator<Item = &Flow> {
        self.stages.iter().flat_map(|s| s.flows.iter())
    }

    /// Every object of every stage (for placement: pods must exist for any of them).
    pub fn all_objects(&self) -> impl Iterator<Item = &Value> {
        self.stages.iter().flat_map(|s| match &s.change {
            Change::Replace(objects) => objects.as_slice(),
            Change::Delete(_) => &[],
        })
    }
}

/// Refuses a stage whose flows judge a packet (client, destination, protocol) in some modes
/// and leave others without an expectation: a file that splits a packet by `modes:` must
/// say what every mode does with it, or that mode's replay silently checks nothing.
fn check_mode_coverage(flows: &[Flow]) -> Result<()> {
    let mut judged: BTreeMap<(IpAddr, SocketAddr, &'static str), (usize, BTreeSet<Mode>)> =
        BTreeMap::new();
    for flow in flows {
        let entry = judged
            .entry((flow.from, flow.to, flow.proto.as_str()))
            .or_insert_with(|| (flow.index, BTreeSet::new()));
        match &flow.modes {
            Some(modes) => entry.1.extend(modes.iter().copied()),
            None => entry.1.extend(Mode::ALL),
        }
    }
    for ((from, to, proto), (index, modes)) in judged {
        let missing: Vec<&str> = Mode::ALL
            .into_iter()
            .filter(|m| !modes.contains(m))
            .map(Mode::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(Error::Invalid(format!(
                "flow #{index}: {proto} {from} -> {to} has an expectation in {} mode but none \
                 in {} mode: give every mode an outcome for the packet (a flow per outcome, \
                 each with its `modes:`)",
                modes
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                missing.join(", ")
            )));
        }
    }
    Ok(())
}

/// An `expect:` as written: a backend list, or one of the outcome keywords.
pub fn parse_expectation(raw: &RawExpect) -> Result<Expectation, String> {
    Ok(match raw {
        RawExpect::Backends(list) => {
            if list.is_empty() {
                return Err("empty backend list".into());
            }
            Expectation::Backends(
                list.iter()
                    .map(|b| parse_socket_addr(b))
                    .collect::<Result<_>>()
                    .map_err(|e| e.to_string())?,
            )
        }
        RawExpect::Keyword(word) => match word.as_str() {
            "REJECT" => Expectation::Reject,
            "DROP" => Expectation::Drop,
            "LOCAL" => Expectation::Local,
            "UNTOUCHED" => Expectation::Untouched,
            other => return Err(format!("unknown expectation {other:?}")),
        },
    })
}

fn check_flow(raw: RawFlow, index: usize, step: usize) -> Result<Flow> {
    let what = |msg: String| Error::Invalid(format!("flow #{index}: {msg}"));
    let from = parse_ip(&raw.from).map_err(|e| what(e.to_string()))?;
    let to = parse_socket_addr(&raw.to).map_err(|e| what(e.to_string()))?;
    let expect = parse_expectation(&raw.expect).map_err(what)?;
    let modes = raw
        .modes
        .map(|m| m.iter().map(|s| s.parse()).collect::<Result<_>>())
        .transpose()
        .map_err(|e| what(e.to_string()))?;
    if raw.sticky && !matches!(expect, Expectation::Backends(_)) {
        return Err(what("sticky needs a backend set".into()));
    }
    Ok(Flow {
        index,
        step,
        from,
        to,
        proto: raw.proto,
        expect,
        masq: raw.masq,
        sticky: raw.sticky,
        modes,
        note: raw.note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/scenarios")
    }

    /// The shared scenarios and this crate's own, together: names must be unique
    /// across both, as the runner takes both directories by default.
    #[test]
    fn every_scenario_parses() {
        let dir = shared_dir();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            eprintln!("skipping: {} not present", dir.display());
            return;
        };
        let own = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios"))
            .into_iter()
            .flatten();
        let mut names = BTreeSet::new();
        let mut count = 0;
        for entry in entries.chain(own) {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
                continue;
            }
            let scenario = Scenario::load(&path).unwrap();
            assert!(
                names.insert(scenario.name.clone()),
                "duplicate name {}",
                scenario.name
            );
            assert!(
                scenario.flows().count() > 0,
                "{} has no flows",
                scenario.name
            );
            let indices: Vec<usize> = scenario.flows().map(|f| f.index).collect();
            assert_eq!(indices, (1..=indices.len()).collect::<Vec<_>>());
            count += 1;
        }
        assert!(count >= 40, "only {count} scenario files found");
    }

    #[test]
    fn a1_flows_and_expectations() {
        let path = shared_dir().join("a1-overall.yaml");
        if !path.exists() {
            return;
        }
        let s = Scenario::load(&path).unwrap();
        assert_eq!(s.name, "a1-overall");
        assert_eq!(s.node.primary().to_string(), "192.168.0.2/24");
        assert_eq!(s.node.pod_cidrs, [parse_cidr("10.0.0.0/8").unwrap()]);
        assert_eq!(
            s.config.get("clusterCIDR"),
            Some(&Value::String("10.0.0.0/8".into()))
        );
        let flows: Vec<&Flow> = s.flows().collect();
        assert_eq!(flows[0].expect, Expectation::Untouched);
        assert_eq!(flows[0].to, "10.0.0.3:80".parse().unwrap());
        assert_eq!(flows[1].masq, Some(false));
        let sticky = flows.iter().find(|f| f.sticky).unwrap();
        assert_eq!(sticky.to, "5.6.7.8:80".parse().unwrap());
        let ebpf_only = flows.iter().filter(|f| f.applies_to(Mode::Ebpf)).count();
        let ipt_only = flows
            .iter()
            .filter(|f| f.applies_to(Mode::Iptables))
            .count();
        assert_eq!(ebpf_only, flows.len() - 1);
        assert_eq!(ipt_only, flows.len() - 1);
    }

    #[test]
    fn steps_become_stages() {
        let raw: RawScenario = serde_yaml::from_str(
            r#"
name: x
node: {name: n, addresses: [192.168.0.2/24], podCIDR: 10.0.0.0/8}
objects: []
flows: [{from: 10.0.0.2, to: '1.2.3.4:80', expect: DROP}]
steps:
- delete: [EndpointSlice/ns1/a, ServiceCIDR/kubernetes]
  flows:
  - {from: 10.0.0.2, to: '[fd00::1]:53', proto: udp, expect: ['[fd00::2]:53'], modes: [ebpf]}
  - {from: 10.0.0.2, to: '[fd00::1]:53', proto: udp, expect: DROP, modes: [iptables, ipvs, nftables]}
- objects: []
"#,
        )
        .unwrap();
        let s = Scenario::from_raw(raw, Path::new("x.yaml")).unwrap();
        assert_eq!(s.stages.len(), 3);
        let Change::Delete(refs) = &s.stages[1].change else {
            panic!("expected delete")
        };
        assert_eq!(refs[0].namespace.as_deref(), Some("ns1"));
        assert_eq!(refs[1].namespace, None);
        assert_eq!(refs[1].to_string(), "ServiceCIDR/kubernetes");
        let flow = &s.stages[1].flows[0];
        assert_eq!((flow.index, flow.step, flow.proto), (2, 1, Proto::Udp));
        assert!(flow.applies_to(Mode::Ebpf) && !flow.applies_to(Mode::Ipvs));
        assert_eq!(flow.to.port(), 53);
    }

    #[test]
    fn pod_cidrs_one_per_family() {
        let node = |pod_cidr: &str| {
            let text = format!(
                "name: x\nnode: {{name: n, addresses: [192.168.0.2/24, 'fd00:168::2/64'], podCIDR: {pod_cidr}}}\n"
            );
            let raw: RawScenario = serde_yaml::from_str(&text).unwrap();
            Scenario::from_raw(raw, Path::new("x")).map(|s| s.node)
        };
        let want = [
            parse_cidr("10.0.0.0/8").unwrap(),
            parse_cidr("fd00:10::/64").unwrap(),
        ];
        for form in [
            "'10.0.0.0/8,fd00:10::/64'",
            "['10.0.0.0/8', 'fd00:10::/64']",
            "[10.0.0.9/8, 'fd00:10::1/64']",
        ] {
            let n = node(form).unwrap();
            assert_eq!(n.pod_cidrs, want, "{form}");
            assert!(n.in_pod_cidrs("fd00:10::180:0:1".parse().unwrap()));
            assert!(n.in_pod_cidrs("10.180.0.1".parse().unwrap()));
            assert!(!n.in_pod_cidrs("fd00:11::1".parse().unwrap()));
        }
        assert!(node("[]").is_err());
        assert!(node("'10.0.0.0/8,'").is_err());

        let n = node("10.0.0.0/8").unwrap();
        assert_eq!(n.pod_cidrs, want[..1]);
        assert_eq!(
            n.primary_for("fd00::1".parse().unwrap())
                .map(|a| a.to_string()),
            Some("fd00:168::2/64".to_string())
        );
        assert_eq!(
            n.primary_for("1.1.1.1".parse().unwrap())
                .map(|a| a.to_string()),
            Some("192.168.0.2/24".to_string())
        );
        let families: Vec<String> = n.family_primaries().iter().map(|a| a.to_string()).collect();
        assert_eq!(families, ["192.168.0.2/24", "fd00:168::2/64"]);
    }

    /// `nftables` is a mode name flows may list: such flows are parsed, and ignored by
    /// the modes they do not list.
    #[test]
    fn nftables_flows_are_ignored_elsewhere() {
        let raw: RawScenario = serde_yaml::from_str(
            r#"
name: x
node: {name: n, addresses: [192.168.0.2/24], podCIDR: 10.0.0.0/8}
flows:
- {from: 10.0.0.2, to: '172.30.0.41:80', expect: DROP, modes: [ebpf, nftables]}
- {from: 10.0.0.2, to: '172.30.0.41:80', expect: REJECT, modes: [iptables, ipvs]}
- {from: 10.0.0.2, to: '172.30.0.41:81', expect: REJECT, modes: [nftables]}
- {from: 10.0.0.2, to: '172.30.0.41:81', expect: DROP, modes: [ebpf, iptables, ipvs]}
"#,
        )
        .unwrap();
        let s = Scenario::from_raw(raw, Path::new("x")).unwrap();
        let flows: Vec<&Flow> = s.flows().collect();
        let applying = |mode| -> Vec<usize> {
            flows
                .iter()
                .filter(|f| f.applies_to(mode))
                .map(|f| f.index)
                .collect()
        };
        assert_eq!(applying(Mode::Ebpf), [1, 4]);
        assert_eq!(applying(Mode::Iptables), [2, 4]);
        assert_eq!(applying(Mode::Ipvs), [2, 4]);
        assert_eq!(applying(Mode::Nftables), [1, 3]);
        assert_eq!("nftables".parse::<Mode>().unwrap(), Mode::Nftables);
    }

    #[test]
    fn bad_flows_are_rejected() {
        for body in [
            "{from: 10.0.0.2, to: '1.2.3.4', expect: DROP}",
            "{from: 10.0.0.2, to: '1.2.3.4:80', expect: MAYBE}",
            "{from: 10.0.0.2, to: '1.2.3.4:80', expect: DROP, modes: [nft]}",
            "{from: 10.0.0.2, to: '1.2.3.4:80', expect: DROP, sticky: true}",
            "{from: 10.0.0.2, to: '1.2.3.4:80', expect: []}",
        ] {
            let text = format!(
                "name: x\nnode: {{name: n, addresses: [192.168.0.2/24], podCIDR: 10.0.0.0/8}}\nflows: [{body}]\n"
            );
            let raw: RawScenario = serde_yaml::from_str(&text).unwrap();
            assert!(
                Scenario::from_raw(raw, Path::new("x")).is_err(),
                "{body} accepted"
            );
        }
    }

    /// A packet judged in some modes must be judged in all: a split that leaves a mode
    /// out is refused, naming the flow and the mode; other packets, other protocols and
    /// other steps are apart.
    #[test]
    fn a_split_that_leaves_a_mode_out_is_refused() {
        let parse = |flows: &str| {
            let text = format!(
                "name: x\nnode: {{name: n, addresses: [192.168.0.2/24], podCIDR: 10.0.0.0/8}}\nflows:\n{flows}"
            );
            let raw: RawScenario = serde_yaml::from_str(&text).unwrap();
            Scenario::from_raw(raw, Path::new("x"))
        };
        let err = parse(
            "- {from: 10.0.0.2, to: '172.30.0.41:80', expect: DROP, modes: [ebpf]}\n\
             - {from: 10.0.0.2, to: '172.30.0.41:80', expect: REJECT, modes: [iptables, ipvs]}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("flow #1") && err.contains("none in nftables mode"),
            "{err}"
        );
        assert!(
            parse(
                "- {from: 10.0.0.2, to: '172.30.0.41:80', expect: DROP, modes: [ebpf, nftables]}\n\
                 - {from: 10.0.0.2, to: '172.30.0.41:80', expect: REJECT, modes: [iptables, ipvs]}\n\
                 - {from: 10.0.0.2, to: '172.30.0.41:80', proto: udp, expect: DROP}\n",
            )
            .is_ok()
        );
        let err = parse(
            "- {from: 10.0.0.2, to: '172.30.0.41:80', expect: DROP}\n\
             - {from: 10.0.0.2, to: '172.30.0.41:80', proto: udp, expect: DROP, modes: [ipvs]}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("flow #2") && err.contains("ebpf, iptables, nftables"),
            "{err}"
        );
    }
}
