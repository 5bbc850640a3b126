// SPDX-License-Identifier: Apache-2.0
//! `proxy-agent inspect services|backends|affinity|conntrack` in ebpf mode: the pinned
//! maps ([`pinned`], decoded by [`live`]) in human terms (service names, not ids), like
//! `cilium bpf lb list`. Rendering is pure; the JSON form is the serde form of the decoded
//! structures, so it is stable and machine-readable.

pub(super) mod live;
mod pinned;

use std::{fmt::Write as _, net::SocketAddr, path::Path};

pub(super) use self::live::{LiveError, LiveState};
pub(super) use self::pinned::{is_pinned, read_pinned};
use crate::{
    inspect::{Output, Subject, table},
    proxier::HostLayout,
};

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(transparent)]
    Live(#[from] LiveError),
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The subjects ebpf mode answers.
pub(super) const SUBJECTS: &[Subject] = &[
    Subject::Services,
    Subject::Backends,
    Subject::Affinity,
    Subject::Conntrack,
];

/// `inspect` in ebpf mode, as registered with the mode.
pub(super) fn inspect_live(
    layout: &HostLayout,
    subject: Subject,
    output: Output,
) -> Result<String, String> {
    run(subject, output, &layout.bpffs_root).map_err(|e| e.to_string())
}

/// Reads the pinned maps under `bpffs_root` and renders `subject`.
pub fn run(subject: Subject, output: Output, bpffs_root: &Path) -> Result<String, InspectError> {
    let state = live::decode(&pinned::read_pinned(bpffs_root)?);
    render(subject, &state, output)
}

/// Renders one subject of a decoded state (pure).
pub fn render(subject: Subject, state: &LiveState, output: Output) -> Result<String, InspectError> {
    if output == Output::Json {
        let value = match subject {
            Subject::Services => serde_json::to_value(&state.frontends)?,
            Subject::Backends => serde_json::to_value(&state.backends)?,
            Subject::Affinity => serde_json::to_value(&state.affinity)?,
            Subject::Conntrack => serde_json::to_value(&state.conntrack)?,
            Subject::Rules => serde_json::to_value(state)?,
        };
        return Ok(serde_json::to_string_pretty(&value)? + "\n");
    }
    Ok(match subject {
        Subject::Services | Subject::Rules => services_text(state),
        Subject::Backends => backends_text(state),
        Subject::Affinity => affinity_text(state),
        Subject::Conntrack => conntrack_text(state),
    })
}

fn frontend_addr(f: &live::LiveFrontend) -> String {
    if f.address.is_unspecified() {
        format!("*:{}/{}", f.port, f.protocol)
    } else {
        format!("{}/{}", SocketAddr::new(f.address, f.port), f.protocol)
    }
}

fn frontend_flags(f: &live::LiveFrontend) -> String {
    let mut flags = Vec::new();
    if f.external_traffic_local {
        flags.push("eTP=Local".to_string());
    }
    if f.internal_traffic_local {
        flags.push("iTP=Local".to_string());
    }
    if f.masquerade {
        flags.push("masquerade".to_string());
    }
    if let Some(t) = f.affinity_timeout {
        flags.push(format!("affinity={t}s"));
    }
    if !f.source_ranges.is_empty() {
        let ranges: Vec<String> = f.source_ranges.iter().map(ToString::to_string).collect();
        flags.push(format!("sourceRanges={}", ranges.join(",")));
    }
    flags.join(" ")
}

fn services_text(state: &LiveState) -> String {
    let mut rows = Vec::new();
    for f in &state.frontends {
        let service = f.service.as_ref().map_or_else(
            || format!("(rev_nat_id {})", f.rev_nat_id),
            ToString::to_string,
        );
        let mut first = true;
        for scope in &f.scopes {
            let mut backends: Vec<String> = scope
                .backend_ids
                .iter()
                .map(|id| match state.backend(f.address.is_ipv6(), *id) {
                    Some(b) => format!(
                        "{} ({}, {})",
                        SocketAddr::new(b.address, b.port),
                        if b.local { "local" } else { "remote" },
                        b.state()
                    ),
                    None => format!("backend {id} (missing)"),
                })
                .collect();
            if backends.is_empty() {
                backends.push(
                    if scope.drop_when_empty {
                        "(none: DROP)"
                    } else {
                        "(none: REJECT)"
                    }
                    .to_string(),
                );
            }
            for (i, b) in backends.into_iter().enumerate() {
                let head = first && i == 0;
                rows.push(vec![
                    if head { service.clone() } else { String::new() },
                    if head {
                        frontend_addr(f)
                    } else {
                        String::new()
                    },
                    if head {
                        f.kind.label().to_string()
                    } else {
                        String::new()
                    },
                    if i == 0 {
                        scope.scope.to_string()
                    } else {
                        String::new()
                    },
                    if head {
                        frontend_flags(f)
                    } else {
                        String::new()
                    },
                    b,
                ]);
            }
            first = false;
        }
    }
    let mut out = table(
        &["SERVICE", "FRONTEND", "TYPE", "SCOPE", "FLAGS", "BACKENDS"],
        &rows,
    );
    if !state.node.nodeport_addresses.is_empty() {
        let addrs: Vec<String> = state
            .node
            .nodeport_addresses
            .iter()
            .map(ToString::to_string)
            .collect();
        let _ = writeln!(out, "NodePorts (*) are served on: {}", addrs.join(", "));
    }
    out
}

fn backends_text(state: &LiveState) -> String {
    let rows: Vec<Vec<String>> = state
        .backends
        .iter()
        .map(|b| {
            vec![
                b.id.to_string(),
                SocketAddr::new(b.address, b.port).to_string(),
                b.protocol.to_string(),
                b.state().to_string(),
                if b.local { "local" } else { "remote" }.to_string(),
            ]
        })
        .collect();
    table(&["ID", "ADDRESS", "PROTO", "STATE", "NODE"], &rows)
}

fn affinity_text(state: &LiveState) -> String {
    let rows: Vec<Vec<String>> = state
        .affinity
        .iter()
        .map(|a| {
            vec![
                a.service.as_ref().map_or_else(
                    || format!("(rev_nat_id {})", a.rev_nat_id),
                    ToString::to_string,
                ),
                a.frontend.clone().unwrap_or_default(),
                a.client.clone(),
                a.backend
                    .clone()
                    .unwrap_or_else(|| format!("backend {}", a.backend_id)),
                format!("{}s", a.idle_seconds),
            ]
        })
        .collect();
    table(&["SERVICE", "FRONTEND", "CLIENT", "BACKEND", "IDLE"], &rows)
}

fn conntrack_text(state: &LiveState) -> String {
    let rows: Vec<Vec<String>> = state
        .conntrack
        .iter()
        .map(|c| {
            let mut st = Vec::new();
            if c.reply_seen {
                st.push("replied");
            }
            if c.closing {
                st.push("closing");
            }
            vec![
                c.protocol.to_string(),
                c.direction.to_string(),
                c.client.clone(),
                c.frontend.clone(),
                c.backend.clone(),
                c.snat.clone().unwrap_or_else(|| "-".into()),
                c.service
                    .as_ref()
                    .map_or_else(|| "-".into(), ToString::to_string),
                if st.is_empty() {
                    "new".into()
                } else {
                    st.join(",")
                },
                format!("{}s", c.expires_in),
            ]
        })
        .collect();
    table(
        &[
            "PROTO", "DIR", "CLIENT", "FRONTEND", "BACKEND", "SNAT", "SERVICE", "STATE", "EXPIRES",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests;
