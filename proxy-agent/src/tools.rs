// SPDX-License-Identifier: Apache-2.0
//! The operator subcommands `inspect`, `trace` and `handover`, and the DaemonSet's
//! `socket-terminator` sidecar. kube-proxy has no subcommands, so the agent's own command line
//! (`proxy-agent --flags...`) is untouched: these exist only when the first word names them.

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

use clap::{Args, Subcommand};

use crate::{
    config::ProxyMode,
    inspect::{Output, Subject},
    proxier::{self, HostLayout},
    trace::{ClientKind, TraceRequest},
};

#[derive(Clone, Debug, Subcommand)]
pub enum Tool {
    /// Print the running dataplane's state in human terms (services, backends, affinity,
    /// conntrack from the pinned ebpf maps; rules from iptables-save).
    Inspect(InspectArgs),
    /// Explain what the running dataplane would do with a connection.
    Trace(TraceArgs),
    /// One screen on this node's proxy: the mode the agent runs, its last sync, the
    /// dataplane's programs and where they are attached, the maps' fill, and the
    /// dataplane's drop and reject counters by reason.
    Status(StatusArgs),
    /// Run as the DaemonSet's socket-terminator sidecar: list and destroy the connected UDP
    /// sockets of the node's network namespaces when the agent asks (see
    /// proxier::ebpf::sockets). Needs CAP_SYS_ADMIN (setns) and CAP_NET_ADMIN.
    SocketTerminator(SocketTerminatorArgs),
    /// Hand the node over to another proxy running MODE (kube-proxy, when rolling back):
    /// remove what this agent's other modes left on the node — pinned eBPF programs and
    /// maps, tc filters, XDP, IPVS state — and keep MODE's rules, as starting MODE would.
    /// Unlike --cleanup, it leaves a running kube-proxy's rules alone.
    Handover(HandoverArgs),
}

#[derive(Clone, Debug, Args)]
pub struct HandoverArgs {
    /// The mode the proxy taking over runs (kubeadm's kube-proxy: iptables).
    #[arg(long, value_parser = parse_mode)]
    pub to: ProxyMode,
    /// The agent's bpffs root (default: the configuration's, else /sys/fs/bpf/kube-proxy-ebpf).
    #[arg(long, value_name = "DIR")]
    pub bpffs_root: Option<PathBuf>,
}

#[derive(Clone, Debug, Args)]
pub struct SocketTerminatorArgs {
    /// The unix socket to listen on (the agent looks for it there).
    #[arg(long, value_name = "PATH", default_value = crate::proxier::ebpf::sockets::SIDECAR_SOCKET)]
    pub socket: PathBuf,
    /// Where the host's named network namespaces are.
    #[arg(long, value_name = "DIR", default_value = crate::proxier::ebpf::sockets::NETNS_DIR)]
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
pub struct StatusArgs {
    /// The agent's metrics server (`metricsBindAddress`; `0.0.0.0` is asked on 127.0.0.1).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:10249")]
    pub metrics_address: String,
    /// The agent's health server (`healthzBindAddress`).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:10256")]
    pub healthz_address: String,
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
    #[arg(long, value_parser = parse_traced_mode)]
    pub mode: Option<ProxyMode>,
}

/// A mode `trace` can follow (the registry says which).
fn parse_traced_mode(s: &str) -> Result<ProxyMode, String> {
    let traced = || {
        proxier::MODES
            .iter()
            .filter(|e| e.tools.trace.is_some())
            .map(|e| e.mode.as_str())
    };
    ProxyMode::parse(s)
        .filter(|m| traced().any(|t| t == m.as_str()))
        .ok_or_else(|| {
            format!(
                "cannot trace {s:?}: {}",
                traced().collect::<Vec<_>>().join(", ")
            )
        })
}

/// A mode the registry knows.
fn parse_mode(s: &str) -> Result<ProxyMode, String> {
    let known = || proxier::MODES.iter().map(|e| e.mode.as_str());
    ProxyMode::parse(s)
        .filter(|m| known().any(|k| k == m.as_str()))
        .ok_or_else(|| {
            format!(
                "unknown mode {s:?}: {}",
                known().collect::<Vec<_>>().join(", ")
            )
        })
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
    /// No mode answers, or the mode's reader failed (its message).
    #[error("{0}")]
    Mode(String),
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("socket terminator: {0}")]
    SocketTerminator(#[source] std::io::Error),
    #[error("handover to {0} mode: some state could not be removed (the log says which)")]
    Handover(&'static str),
}

/// Runs a subcommand; returns what to print. `layout` is where the modes keep their state
/// (from the configuration, or the defaults); `--bpffs-root` overrides its pin directory.
pub fn run(tool: &Tool, layout: &HostLayout) -> Result<String, ToolError> {
    let with_root = |root: &Option<PathBuf>| HostLayout {
        bpffs_root: root.clone().unwrap_or_else(|| layout.bpffs_root.clone()),
        ..layout.clone()
    };
    match tool {
        Tool::SocketTerminator(a) => {
            // A long-running server: its log goes to stderr like the agent's.
            crate::telemetry::init(0, &[], false, false);
            crate::proxier::ebpf::sockets::serve(&a.socket, &a.netns_dir)
                .map_err(ToolError::SocketTerminator)?;
            Ok(String::new())
        }
        Tool::Handover(a) => {
            // What each mode removed, and what it could not, goes to the log (stderr).
            crate::telemetry::init(0, &[], false, false);
            let layout = with_root(&a.bpffs_root);
            if crate::cleanup::cleanup_other_modes(a.to, &layout.bpffs_root, &layout.ipvs_exclude) {
                Ok(format!(
                    "handed over to {} mode: the other modes' state is gone\n",
                    a.to.as_str()
                ))
            } else {
                Err(ToolError::Handover(a.to.as_str()))
            }
        }
        Tool::Inspect(a) => {
            let layout = with_root(&a.bpffs_root);
            let entry = proxier::tool_mode(None, &layout, |t| proxier::inspects(t, a.subject))
                .map_err(|e| ToolError::Mode(format!("inspect {}: {e}", a.subject.as_str())))?;
            let inspect = entry.tools.inspect.ok_or_else(|| {
                ToolError::Mode(format!("{} mode has no inspect", entry.mode.as_str()))
            })?;
            inspect(&layout, a.subject, a.output).map_err(ToolError::Mode)
        }
        Tool::Status(a) => {
            let layout = with_root(&a.bpffs_root);
            let endpoints = crate::status::Endpoints {
                metrics: crate::status::local_address(&a.metrics_address),
                healthz: crate::status::local_address(&a.healthz_address),
            };
            let agent = crate::status::ask_agent(&endpoints);
            // The dataplane of the mode the agent names, else of the mode in use here.
            let named = agent.mode.as_deref().and_then(ProxyMode::parse);
            let dataplane = proxier::tool_mode(named, &layout, |t| t.status.is_some())
                .ok()
                .filter(|entry| named.is_some() || (entry.tools.in_use)(&layout))
                .and_then(|entry| entry.tools.status)
                .map(|status| status(&layout))
                .transpose()
                .map_err(ToolError::Mode)?;
            let report = crate::status::StatusReport { agent, dataplane };
            Ok(report.render(a.output, std::time::SystemTime::now())?)
        }
        Tool::Trace(a) => {
            let layout = with_root(&a.bpffs_root);
            let entry = proxier::tool_mode(a.mode, &layout, |t| t.trace.is_some())
                .map_err(|e| ToolError::Mode(format!("trace: {e}")))?;
            let trace = entry.tools.trace.ok_or_else(|| {
                ToolError::Mode(format!("{} mode has no trace", entry.mode.as_str()))
            })?;
            let request = TraceRequest {
                from: a.from,
                to: a.to,
                proto: a.proto,
                client: a.client,
            };
            let verdict = trace(&layout, &request).map_err(ToolError::Mode)?;
            Ok(match a.output {
                Output::Json => serde_json::to_string_pretty(&verdict)? + "\n",
                Output::Text => verdict.to_text(),
            })
        }
    }
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
        match parse(&["proxy-agent", "handover", "--to", "iptables"])
            .unwrap()
            .tool
        {
            Some(Tool::Handover(a)) => assert_eq!(a.to, ProxyMode::Iptables),
            _ => panic!("handover expected"),
        }
        assert!(parse(&["proxy-agent", "handover", "--to", "userspace"]).is_err());
        assert!(parse(&["proxy-agent", "handover"]).is_err());
        assert!(parse(&["proxy-agent", "inspect", "nonsense"]).is_err());
        assert!(parse(&["proxy-agent", "trace", "--from", "1.2.3.4"]).is_err());
    }
}
