// SPDX-License-Identifier: Apache-2.0
//! `inspect rules`: the KUBE-* chains of iptables mode, summarised per service port from
//! `iptables-save` (both families): the frontends KUBE-SERVICES / KUBE-NODEPORTS send to the
//! service's chain, the endpoints its KUBE-SVC / KUBE-SVL chain picks (with probabilities and
//! affinity), and the filter-table verdicts (REJECT without endpoints, DROP for Local
//! policies or source ranges). Parsing is pure; only [`read_live`] runs iptables-save.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    inspect::{Output, Subject},
    model::IpFamily,
    proxier::HostLayout,
    proxier::netfilter::{
        CommandBackend, ExecError, IptablesBackend, Table,
        save::{self, Rule},
    },
};

#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("reading the iptables rules: {0}")]
    Exec(#[from] ExecError),
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RulesSummary {
    pub services: Vec<RuleService>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RuleService {
    pub family: &'static str,
    /// "namespace/name:port" as the rules' comments carry it.
    pub service: String,
    pub frontends: Vec<RuleFrontend>,
    pub endpoints: Vec<RuleEndpoint>,
    pub affinity_seconds: Option<u32>,
    /// Filter-table rules that refuse or drop this service's traffic.
    pub verdicts: Vec<RuleVerdict>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RuleFrontend {
    /// "cluster IP", "external IP", "loadbalancer IP" or "nodeport".
    pub kind: String,
    pub address: Option<String>,
    pub port: Option<u16>,
    pub protocol: Option<String>,
    /// The chain it jumps to (KUBE-SVC-, KUBE-EXT-, KUBE-FW-, ...).
    pub chain: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RuleEndpoint {
    pub address: String,
    pub chain: String,
    /// The probability of its rule (the last one has none: it takes what is left).
    pub probability: Option<f64>,
    /// Picked by the KUBE-SVL (local endpoints) chain rather than KUBE-SVC.
    pub local_chain: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RuleVerdict {
    pub chain: String,
    pub target: String,
    pub destination: Option<String>,
    pub port: Option<u16>,
    pub comment: String,
}

fn strip_host(addr: &str) -> String {
    addr.strip_suffix("/32")
        .or_else(|| addr.strip_suffix("/128"))
        .unwrap_or(addr)
        .to_string()
}

/// The service port a comment names ("ns/svc:port cluster IP", "ns/svc:port -> ep").
fn service_of(comment: &str) -> Option<&str> {
    let first = comment.split_whitespace().next()?;
    first.contains('/').then_some(first)
}

/// Summarises one family's nat and filter tables (pure).
pub fn summarise(family: IpFamily, nat: &str, filter: &str) -> Vec<RuleService> {
    let family_name = match family {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    };
    let nat: Vec<Rule> = save::rules(nat).collect();
    let mut services: BTreeMap<String, RuleService> = BTreeMap::new();
    fn entry<'a>(
        services: &'a mut BTreeMap<String, RuleService>,
        family: &'static str,
        name: &str,
    ) -> &'a mut RuleService {
        services
            .entry(name.to_string())
            .or_insert_with(|| RuleService {
                family,
                service: name.to_string(),
                ..Default::default()
            })
    }
    let dnat: BTreeMap<&str, &str> = nat
        .iter()
        .filter(|r| r.chain.starts_with("KUBE-SEP-"))
        .filter_map(|r| Some((r.chain.as_str(), r.get("--to-destination")?)))
        .collect();
    for r in &nat {
        let Some(name) = r.get("--comment").and_then(service_of) else {
            continue;
        };
        let target = r.get("-j").unwrap_or_default();
        match r.chain.as_str() {
            "KUBE-SERVICES" | "KUBE-NODEPORTS" => {
                let comment = r.get("--comment").unwrap_or_default();
                let kind = if r.chain == "KUBE-NODEPORTS" {
                    "nodeport".to_string()
                } else {
                    comment[name.len()..].trim().to_string()
                };
                entry(&mut services, family_name, name)
                    .frontends
                    .push(RuleFrontend {
                        kind,
                        address: r.get("-d").map(strip_host),
                        port: r.get("--dport").and_then(|p| p.parse().ok()),
                        protocol: r.get("-p").map(str::to_string),
                        chain: target.to_string(),
                    });
            }
            c if (c.starts_with("KUBE-SVC-") || c.starts_with("KUBE-SVL-"))
                && target.starts_with("KUBE-SEP-") =>
            {
                let s = entry(&mut services, family_name, name);
                if let Some(secs) = r.get("--seconds").and_then(|v| v.parse().ok()) {
                    s.affinity_seconds = Some(secs);
                    continue;
                }
                s.endpoints.push(RuleEndpoint {
                    address: dnat.get(target).map_or_else(String::new, |d| d.to_string()),
                    chain: target.to_string(),
                    probability: r.get("--probability").and_then(|p| p.parse().ok()),
                    local_chain: c.starts_with("KUBE-SVL-"),
                });
            }
            _ => {}
        }
    }
    for r in save::rules(filter) {
        let target = r.get("-j").unwrap_or_default();
        if !(target == "REJECT" || target == "DROP") || !r.chain.starts_with("KUBE-") {
            continue;
        }
        let Some(comment) = r.get("--comment") else {
            continue;
        };
        let Some(name) = service_of(comment) else {
            continue;
        };
        entry(&mut services, family_name, name)
            .verdicts
            .push(RuleVerdict {
                chain: r.chain.clone(),
                target: target.to_string(),
                destination: r.get("-d").map(strip_host),
                port: r.get("--dport").and_then(|p| p.parse().ok()),
                comment: comment.to_string(),
            });
    }
    services.into_values().collect()
}

/// `inspect rules` for the modes that program iptables, as registered with the mode.
pub fn inspect_live(_: &HostLayout, subject: Subject, output: Output) -> Result<String, String> {
    debug_assert_eq!(subject, Subject::Rules);
    let summary = read_live().map_err(|e| e.to_string())?;
    Ok(match output {
        Output::Json => serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())? + "\n",
        Output::Text => to_text(&summary),
    })
}

/// Reads both families' rules (iptables-save) and summarises them.
pub fn read_live() -> Result<RulesSummary, RulesError> {
    let mut backend = CommandBackend::detect()?;
    let mut out = RulesSummary::default();
    for family in [IpFamily::V4, IpFamily::V6] {
        let nat = backend.save(family, Table::Nat).unwrap_or_default();
        let filter = backend.save(family, Table::Filter).unwrap_or_default();
        out.services.extend(summarise(family, &nat, &filter));
    }
    Ok(out)
}

/// Human-readable form.
pub fn to_text(summary: &RulesSummary) -> String {
    let mut out = String::new();
    if summary.services.is_empty() {
        out.push_str("no KUBE-* service rules found\n");
    }
    for s in &summary.services {
        out.push_str(&format!("{} ({})\n", s.service, s.family));
        for f in &s.frontends {
            let addr = match (&f.address, f.port) {
                (Some(a), Some(p)) if a.contains(':') => format!("[{a}]:{p}"),
                (Some(a), Some(p)) => format!("{a}:{p}"),
                (None, Some(p)) => format!("*:{p}"),
                _ => "?".into(),
            };
            out.push_str(&format!(
                "  {:<16} {}/{} -> {}\n",
                f.kind,
                addr,
                f.protocol.as_deref().unwrap_or("?"),
                f.chain
            ));
        }
        if let Some(secs) = s.affinity_seconds {
            out.push_str(&format!("  affinity ClientIP {secs}s\n"));
        }
        for e in &s.endpoints {
            let p = e
                .probability
                .map_or_else(|| "rest".to_string(), |p| format!("p={p:.4}"));
            let local = if e.local_chain { " (local)" } else { "" };
            out.push_str(&format!(
                "  endpoint {:<22} {}{local} via {}\n",
                e.address, p, e.chain
            ));
        }
        for v in &s.verdicts {
            out.push_str(&format!("  {} in {}: {}\n", v.target, v.chain, v.comment));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAT: &str = r#"*nat
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 172.30.0.45/32 -p tcp -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-NUKIZ6OKUXPJNT4C
-A KUBE-NODEPORTS -p tcp -m comment --comment "ns5/svc5:p80" -m tcp --dport 3002 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-SEP-I77PXRDZVX7PMWMN -p tcp -m comment --comment "ns5/svc5:p80" -m recent --set --name KUBE-SEP-I77PXRDZVX7PMWMN --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.180.0.3:80
-A KUBE-SEP-YCFYP3HJLF2AOHNO -p tcp -m comment --comment "ns5/svc5:p80" -m tcp -j DNAT --to-destination 10.180.1.3:80
-A KUBE-SVC-NUKIZ6OKUXPJNT4C ! -s 10.0.0.0/8 -d 172.30.0.45/32 -p tcp -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-I77PXRDZVX7PMWMN --mask 255.255.255.255 --rsource -j KUBE-SEP-I77PXRDZVX7PMWMN
-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-I77PXRDZVX7PMWMN
-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.1.3:80" -j KUBE-SEP-YCFYP3HJLF2AOHNO
COMMIT
"#;
    const FILTER: &str = r#"*filter
-A KUBE-SERVICES -d 172.30.0.46/32 -p tcp -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
COMMIT
"#;

    #[test]
    fn saved_rules_are_summarised_per_service() {
        let s = summarise(IpFamily::V4, NAT, FILTER);
        assert_eq!(s.len(), 2);
        let svc5 = &s[0];
        assert_eq!(svc5.service, "ns5/svc5:p80");
        assert_eq!(svc5.affinity_seconds, Some(10800));
        assert_eq!(svc5.frontends.len(), 2);
        assert_eq!(svc5.frontends[0].kind, "cluster IP");
        assert_eq!(svc5.frontends[0].address.as_deref(), Some("172.30.0.45"));
        assert_eq!(svc5.frontends[1].kind, "nodeport");
        assert_eq!(svc5.frontends[1].port, Some(3002));
        let eps: Vec<(&str, Option<f64>)> = svc5
            .endpoints
            .iter()
            .map(|e| (e.address.as_str(), e.probability))
            .collect();
        assert_eq!(eps, [("10.180.0.3:80", Some(0.5)), ("10.180.1.3:80", None)]);
        let svc6 = &s[1];
        assert_eq!(svc6.verdicts[0].target, "REJECT");
        assert_eq!(svc6.verdicts[0].destination.as_deref(), Some("172.30.0.46"));
        let text = to_text(&RulesSummary { services: s });
        assert!(text.contains("ns5/svc5:p80 (IPv4)"), "{text}");
        assert!(text.contains("endpoint 10.180.1.3:80"), "{text}");
        assert!(
            text.contains("REJECT in KUBE-SERVICES: ns6/svc6:p80 has no endpoints"),
            "{text}"
        );
    }
}
