// SPDX-License-Identifier: Apache-2.0
//! `proxy-agent status`: one screen on a node's proxy. The running agent answers what only
//! it knows through its own servers (the mode it runs, `/proxyMode`; the last sync per
//! family and the maps' fill, from `/metrics`); the mode's dataplane answers from the
//! kernel (the ebpf programs and where they are attached, their drop and reject counters),
//! so a node whose agent is down still shows what serves it.
//!
//! The two GETs go to the agent's own servers on this node over a plain `TcpStream`: the
//! tool is synchronous and asks localhost once per page, where an HTTP client crate would
//! bring an async runtime into a command that otherwise has none.

use std::{
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream, ToSocketAddrs as _},
    time::{Duration, SystemTime},
};

use serde::Serialize;

use crate::inspect::{Output, table};

/// One program and where it is attached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AttachedProgram {
    pub program: String,
    /// A device, or `cgroup` for the socket programs.
    pub attached_to: String,
    /// How: `link` (a pinned BPF link), `filter` (a netlink tc filter, kernels before 6.6).
    pub how: &'static str,
}

/// A drop or reject counter of the dataplane.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Counter {
    pub verdict: &'static str,
    pub reason: &'static str,
    pub packets: u64,
}

/// What the mode's dataplane shows from the kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DataplaneStatus {
    pub mode: &'static str,
    pub programs: Vec<AttachedProgram>,
    pub counters: Vec<Counter>,
}

/// One map's fill, as the agent reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MapFill {
    pub map: String,
    pub entries: f64,
    pub capacity: f64,
}

/// What the running agent reports about itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AgentStatus {
    /// Why the agent could not be asked, when it could not.
    pub unreachable: Option<String>,
    pub mode: Option<String>,
    /// `/healthz` answered 200.
    pub healthy: Option<bool>,
    /// The last successful sync per IP family, in seconds since the epoch.
    pub last_sync: Vec<(String, f64)>,
    pub maps: Vec<MapFill>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StatusReport {
    pub agent: AgentStatus,
    pub dataplane: Option<DataplaneStatus>,
}

/// Where the agent's servers answer.
#[derive(Clone, Debug)]
pub struct Endpoints {
    /// `host:port` of the metrics server (`/metrics`, `/proxyMode`).
    pub metrics: String,
    /// `host:port` of the health server (`/healthz`).
    pub healthz: String,
}

/// Asks the agent's servers.
pub fn ask_agent(endpoints: &Endpoints) -> AgentStatus {
    let mut out = AgentStatus::default();
    match get(&endpoints.metrics, "/proxyMode") {
        Ok((_, body)) => out.mode = Some(body.trim().to_string()),
        Err(e) => {
            out.unreachable = Some(format!("{}: {e}", endpoints.metrics));
            return out;
        }
    }
    if let Ok((code, _)) = get(&endpoints.healthz, "/healthz") {
        out.healthy = Some(code == 200);
    }
    if let Ok((_, page)) = get(&endpoints.metrics, "/metrics") {
        read_metrics(&page, &mut out);
    }
    out
}

/// The samples status shows, from a Prometheus text page.
fn read_metrics(page: &str, out: &mut AgentStatus) {
    let mut maps: Vec<MapFill> = Vec::new();
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        if let Some(labels) =
            series.strip_prefix("kubeproxy_sync_proxy_rules_last_timestamp_seconds")
        {
            if let Some(family) = label(labels, "ip_family") {
                out.last_sync.push((family, value));
            }
        } else if let Some(labels) = series.strip_prefix("kubeproxy_ebpf_map_entries") {
            if let Some(map) = label(labels, "map") {
                fill(&mut maps, map).entries = value;
            }
        } else if let Some(labels) = series.strip_prefix("kubeproxy_ebpf_map_capacity")
            && let Some(map) = label(labels, "map")
        {
            fill(&mut maps, map).capacity = value;
        }
    }
    maps.sort_by(|a, b| a.map.cmp(&b.map));
    out.maps = maps;
}

fn fill(maps: &mut Vec<MapFill>, map: String) -> &mut MapFill {
    let index = match maps.iter().position(|m| m.map == map) {
        Some(i) => i,
        None => {
            maps.push(MapFill {
                map,
                entries: 0.0,
                capacity: 0.0,
            });
            maps.len() - 1
        }
    };
    &mut maps[index]
}

/// The value of `name` in a sample's `{a="x",b="y"}` label set.
fn label(labels: &str, name: &str) -> Option<String> {
    let inner = labels.strip_prefix('{')?.strip_suffix('}')?;
    inner.split(',').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key == name).then(|| value.trim_matches('"').to_string())
    })
}

/// How long a GET may take: the servers answer on this node.
const TIMEOUT: Duration = Duration::from_secs(3);

/// One HTTP/1.0 GET: the status code and the body.
fn get(host_port: &str, path: &str) -> std::io::Result<(u16, String)> {
    let addr: SocketAddr = host_port
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {host_port}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP header"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no HTTP status"))?;
    Ok((code, body.to_string()))
}

/// The address a server bound to `bind` (`0.0.0.0:10249`, `:10256`, `[::]:10249`) answers
/// at on this node.
pub fn local_address(bind: &str) -> String {
    match bind.rsplit_once(':') {
        Some((host, port)) if host.is_empty() || host == "0.0.0.0" => format!("127.0.0.1:{port}"),
        Some(("[::]", port)) => format!("[::1]:{port}"),
        _ => bind.to_string(),
    }
}

impl StatusReport {
    pub fn render(&self, output: Output, now: SystemTime) -> Result<String, serde_json::Error> {
        match output {
            Output::Json => Ok(serde_json::to_string_pretty(self)? + "\n"),
            Output::Text => Ok(self.to_text(now)),
        }
    }

    fn to_text(&self, now: SystemTime) -> String {
        let mut out = String::new();
        let agent = &self.agent;
        let mode = agent
            .mode
            .clone()
            .or_else(|| self.dataplane.as_ref().map(|d| d.mode.to_string()));
        let _ = writeln!(out, "mode: {}", mode.as_deref().unwrap_or("unknown"));
        match &agent.unreachable {
            Some(why) => {
                let _ = writeln!(
                    out,
                    "agent: not reachable ({why}); the kernel's state follows"
                );
            }
            None => {
                let health = match agent.healthy {
                    Some(true) => "healthy",
                    Some(false) => "unhealthy (/healthz answers 503)",
                    None => "health unknown",
                };
                let _ = writeln!(out, "agent: running, {health}");
            }
        }
        let now_secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        if agent.last_sync.is_empty() {
            let _ = writeln!(out, "last sync: unknown");
        }
        for (family, at) in &agent.last_sync {
            let _ = writeln!(
                out,
                "last sync: {family} {:.1}s ago",
                (now_secs - at).max(0.0)
            );
        }
        if let Some(d) = &self.dataplane {
            out.push_str("\nprograms:\n");
            let rows: Vec<Vec<String>> = d
                .programs
                .iter()
                .map(|p| vec![p.program.clone(), p.attached_to.clone(), p.how.to_string()])
                .collect();
            out.push_str(&table(&["PROGRAM", "ATTACHED TO", "HOW"], &rows));
        }
        if !agent.maps.is_empty() {
            out.push_str("\nmaps:\n");
            let rows: Vec<Vec<String>> = agent
                .maps
                .iter()
                .map(|m| {
                    let percent = if m.capacity > 0.0 {
                        format!("{:.1}%", 100.0 * m.entries / m.capacity)
                    } else {
                        "-".into()
                    };
                    vec![
                        m.map.clone(),
                        format!("{}", m.entries),
                        format!("{}", m.capacity),
                        percent,
                    ]
                })
                .collect();
            out.push_str(&table(&["MAP", "ENTRIES", "CAPACITY", "FILL"], &rows));
        }
        if let Some(d) = &self.dataplane
            && !d.counters.is_empty()
        {
            out.push_str("\ndrops and rejects (since the maps were created):\n");
            let rows: Vec<Vec<String>> = d
                .counters
                .iter()
                .map(|c| {
                    vec![
                        c.verdict.to_string(),
                        c.reason.to_string(),
                        c.packets.to_string(),
                    ]
                })
                .collect();
            out.push_str(&table(&["VERDICT", "REASON", "PACKETS"], &rows));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# HELP x y\n\
        kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1000.5\n\
        kubeproxy_ebpf_map_entries{map=\"SVC4_V2\"} 12\n\
        kubeproxy_ebpf_map_capacity{map=\"SVC4_V2\"} 65536\n\
        kubeproxy_ebpf_map_capacity{map=\"BACKENDS4_V1\"} 65536\n";

    #[test]
    fn the_agents_samples_are_read_from_its_page() {
        let mut status = AgentStatus::default();
        read_metrics(PAGE, &mut status);
        assert_eq!(status.last_sync, vec![("IPv4".to_string(), 1000.5)]);
        assert_eq!(
            status.maps,
            vec![
                MapFill {
                    map: "BACKENDS4_V1".into(),
                    entries: 0.0,
                    capacity: 65536.0
                },
                MapFill {
                    map: "SVC4_V2".into(),
                    entries: 12.0,
                    capacity: 65536.0
                },
            ]
        );
    }

    #[test]
    fn bind_addresses_are_asked_on_loopback() {
        assert_eq!(local_address("0.0.0.0:10249"), "127.0.0.1:10249");
        assert_eq!(local_address(":10256"), "127.0.0.1:10256");
        assert_eq!(local_address("[::]:10249"), "[::1]:10249");
        assert_eq!(local_address("192.168.0.2:10249"), "192.168.0.2:10249");
    }

    #[test]
    fn text_shows_the_mode_sync_programs_maps_and_counters() {
        let mut agent = AgentStatus {
            mode: Some("ebpf".into()),
            healthy: Some(true),
            ..Default::default()
        };
        read_metrics(PAGE, &mut agent);
        let report = StatusReport {
            agent,
            dataplane: Some(DataplaneStatus {
                mode: "ebpf",
                programs: vec![AttachedProgram {
                    program: "tc_uplink_ingress".into(),
                    attached_to: "eth0".into(),
                    how: "link",
                }],
                counters: vec![Counter {
                    verdict: "reject",
                    reason: "no_endpoints",
                    packets: 2,
                }],
            }),
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1003);
        let text = report.render(Output::Text, now).unwrap();
        for expected in [
            "mode: ebpf\n",
            "agent: running, healthy\n",
            "last sync: IPv4 2.5s ago\n",
            "tc_uplink_ingress  eth0         link\n",
            "SVC4_V2       12       65536     0.0%\n",
            "reject   no_endpoints  2\n",
        ] {
            assert!(text.contains(expected), "{expected:?} in:\n{text}");
        }
    }

    #[test]
    fn an_unreachable_agent_still_shows_the_dataplane() {
        let report = StatusReport {
            agent: AgentStatus {
                unreachable: Some("127.0.0.1:10249: connection refused".into()),
                ..Default::default()
            },
            dataplane: Some(DataplaneStatus {
                mode: "ebpf",
                ..Default::default()
            }),
        };
        let text = report.render(Output::Text, SystemTime::now()).unwrap();
        assert!(
            text.starts_with("mode: ebpf\nagent: not reachable"),
            "{text}"
        );
    }
}
