// SPDX-License-Identifier: Apache-2.0
//! The operator subcommands `inspect` and `trace`, and the DaemonSet's `socket-terminator`
//! sidecar. kube-proxy has no subcommands, so the agent's own command line
//! (`proxy-agent --flags...`) is untouched: these exist only when the first word names them.

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
};

use clap::{Args, Subcommand};

use crate::{
    inspect::{self, Output, Subject, live, rules::RulesError},
    model::IpFamily,
    proxier::netfilter::{CommandBackend, IptablesBackend as _, Table},
    trace::{self, ClientKind, Question},
};

#[derive(Clone, Debug, Subcommand)]
pub enum Tool {
    /// Print the running dataplane's state in human terms (services, backends, affinity,
    /// conntrack from the pinned ebpf maps; rules from iptables-save).
    Inspect(InspectArgs),
    /// Explain what the running dataplane would do with a connection.
    Trace(TraceArgs),
    /// Run as the DaemonSet's socket-terminator sidecar: list and destroy the connected UDP
    /// sockets of the node's network namespaces when the agent asks (see
    /// proxier::ebpf::sockets). Needs CAP_SYS_ADMIN (setns) and CAP_NET_ADMIN.
    SocketTerminator(SocketTerminatorArgs),
}

#[derive(Clone, Debug, Args)]
pub struct SocketTerminatorArgs {
    /// The unix socket to listen on (the agent looks for it there).
    #[arg(long, value_name = "PATH", default_value = crate::proxier::ebpf::sockets::reach::SIDECAR_SOCKET)]
    pub socket: PathBuf,
    /// Where the host's named network namespaces are.
    #[arg(long, value_name = "DIR", default_value = crate::proxier::ebpf::sockets::reach::NETNS_DIR)]
    pub netns_dir: PathBuf,
}

#[derive(Clone, Debug, Args)]
pub struct InspectArgs {
    /// services | backends | affinity | conntrack | rules
    #[arg(value_parser = parse_subject)]
    pub subject: Subject,
    /// text or json.
    #[arg(long, short = 'o', default_value = "text", value_parser = parse_output)]
    pub output: Output,
    /// The agent's bpffs root (default: the configuration's, else /sys/fs/bpf/kube-proxy-ebpf).
    #[arg(long, value_name = "DIR")]
    pub bpffs_root: Option<PathBuf>,
}

#[derive(Clone, Debug, Args)]
pub struct TraceArgs {
    /// Client address.
    #[arg(long, value_name = "IP")]
    pub from: IpAddr,
    /// Destination, `IP:PORT` (`[IPv6]:PORT`).
    #[arg(long, value_name = "IP:PORT")]
    pub to: SocketAddr,
    /// tcp, udp or sctp.
    #[arg(long, default_value = "tcp", value_parser = parse_proto)]
    pub proto: u8,
    /// Where the client sits: node, pod or external (default: from this node's addresses
    /// and routes).
    #[arg(long, value_parser = parse_client)]
    pub client: Option<ClientKind>,
    /// text or json.
    #[arg(long, short = 'o', default_value = "text", value_parser = parse_output)]
    pub output: Output,
    /// The agent's bpffs root (default: the configuration's, else /sys/fs/bpf/kube-proxy-ebpf).
    #[arg(long, value_name = "DIR")]
    pub bpffs_root: Option<PathBuf>,
    /// The running mode to trace: ebpf or iptables (default: ebpf when its maps are
    /// pinned, else iptables).
    #[arg(long, value_parser = ["ebpf", "iptables"])]
    pub mode: Option<String>,
}

fn parse_subject(s: &str) -> Result<Subject, String> {
    Subject::parse(s).ok_or_else(|| {
        format!("unknown subject {s:?}: services, backends, affinity, conntrack or rules")
    })
}

fn parse_output(s: &str) -> Result<Output, String> {
    Output::parse(s).ok_or_else(|| format!("unknown output {s:?}: text or json"))
}

fn parse_proto(s: &str) -> Result<u8, String> {
    match s.to_ascii_lowercase().as_str() {
        "tcp" => Ok(proxy_common::proto::TCP),
        "udp" => Ok(proxy_common::proto::UDP),
        "sctp" => Ok(proxy_common::proto::SCTP),
        _ => Err(format!("unknown protocol {s:?}: tcp, udp or sctp")),
    }
}

fn parse_client(s: &str) -> Result<ClientKind, String> {
    ClientKind::parse(s).ok_or_else(|| format!("unknown client {s:?}: node, pod or external"))
}

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error(transparent)]
    Inspect(#[from] inspect::InspectError),
    #[error(transparent)]
    Live(#[from] live::LiveError),
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("socket terminator: {0}")]
    SocketTerminator(#[source] std::io::Error),
}

/// Runs a subcommand; returns what to print.
pub fn run(tool: &Tool, default_root: &Path) -> Result<String, ToolError> {
    match tool {
        Tool::SocketTerminator(a) => {
            // A long-running server: its log goes to stderr like the agent's.
            crate::telemetry::init(0, false);
            crate::proxier::ebpf::sockets::reach::serve(&a.socket, &a.netns_dir)
                .map_err(ToolError::SocketTerminator)?;
            Ok(String::new())
        }
        Tool::Inspect(a) => Ok(inspect::run(
            a.subject,
            a.output,
            a.bpffs_root.as_deref().unwrap_or(default_root),
        )?),
        Tool::Trace(a) => {
            let root = a.bpffs_root.as_deref().unwrap_or(default_root);
            let ebpf = match a.mode.as_deref() {
                Some(mode) => mode == "ebpf",
                None => inspect::pinned::is_pinned(root),
            };
            let question = |client| Question {
                from: a.from,
                to: a.to,
                proto: a.proto,
                client,
            };
            let verdict = if ebpf {
                let state = live::decode(&inspect::pinned::read_pinned(root)?);
                // The uplinks are known from the link pins of the tc programs; where tc
                // attaches over netlink (kernels before 6.6) there are none, and the devices
                // holding the node's addresses are the uplinks, as for iptables mode.
                let client = a.client.unwrap_or_else(|| {
                    let uplinks = if state.node.uplinks.is_empty() {
                        trace::client::address_devices()
                    } else {
                        state.node.uplinks.clone()
                    };
                    trace::client::classify(&a.from, &uplinks)
                });
                trace::ebpf::trace(&state, &question(client))
            } else {
                let client = a.client.unwrap_or_else(|| {
                    trace::client::classify(&a.from, &trace::client::address_devices())
                });
                let family = if a.to.is_ipv6() {
                    IpFamily::V6
                } else {
                    IpFamily::V4
                };
                let mut backend = CommandBackend::detect().map_err(RulesError::from)?;
                let nat = backend.save(family, Table::Nat).map_err(RulesError::from)?;
                let filter = backend
                    .save(family, Table::Filter)
                    .map_err(RulesError::from)?;
                let node: Vec<IpAddr> = trace::client::local_addresses()
                    .into_iter()
                    .map(|(_, ip)| ip)
                    .collect();
                trace::iptables::trace(&nat, &filter, &node, &recent_lists(), &question(client))
            };
            Ok(match a.output {
                Output::Json => serde_json::to_string_pretty(&verdict)? + "\n",
                Output::Text => verdict.to_text(),
            })
        }
    }
}

/// The affinity lists of the `recent` module in this network namespace (endpoint chains).
fn recent_lists() -> trace::iptables::RecentLists {
    std::fs::read_dir("/proc/net/xt_recent")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("KUBE-SEP-").then(|| {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                (name, trace::iptables::parse_recent(&text))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, FromArgMatches as _, Parser};

    use super::*;
    use crate::config::Flags;

    /// The binary's command line: kube-proxy's flags plus the optional subcommands.
    #[derive(Parser)]
    #[command(name = "proxy-agent", args_override_self = true)]
    struct Cli {
        #[command(flatten)]
        flags: Flags,
        #[command(subcommand)]
        tool: Option<Tool>,
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let m = Cli::command().try_get_matches_from(args)?;
        Cli::from_arg_matches(&m)
    }

    #[test]
    fn agent_flags_parse_as_before_and_subcommands_are_optional() {
        let cli = parse(&[
            "proxy-agent",
            "--proxy-mode",
            "iptables",
            "--masquerade-all",
            "--hostname-override=n1",
        ])
        .unwrap();
        assert!(cli.tool.is_none());
        assert_eq!(cli.flags.proxy_mode.as_deref(), Some("iptables"));
        assert_eq!(cli.flags.masquerade_all, Some(true));
        assert_eq!(cli.flags.hostname_override.as_deref(), Some("n1"));
    }

    #[test]
    fn inspect_and_trace_parse() {
        let cli = parse(&[
            "proxy-agent",
            "inspect",
            "services",
            "--output",
            "json",
            "--bpffs-root",
            "/sys/fs/bpf/x",
        ])
        .unwrap();
        match cli.tool {
            Some(Tool::Inspect(a)) => {
                assert_eq!(a.subject, Subject::Services);
                assert_eq!(a.output, Output::Json);
                assert_eq!(a.bpffs_root, Some(PathBuf::from("/sys/fs/bpf/x")));
            }
            _ => panic!("inspect expected"),
        }
        let cli = parse(&[
            "proxy-agent",
            "trace",
            "--from",
            "10.0.0.2",
            "--to",
            "[fd00::1]:80",
            "--proto",
            "udp",
        ])
        .unwrap();
        match cli.tool {
            Some(Tool::Trace(a)) => {
                assert_eq!(a.to, "[fd00::1]:80".parse::<SocketAddr>().unwrap());
                assert_eq!(a.proto, proxy_common::proto::UDP);
                assert_eq!(a.client, None);
            }
            _ => panic!("trace expected"),
        }
        assert!(parse(&["proxy-agent", "inspect", "nonsense"]).is_err());
        assert!(parse(&["proxy-agent", "trace", "--from", "1.2.3.4"]).is_err());
    }
}
