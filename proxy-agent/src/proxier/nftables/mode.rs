// SPDX-License-Identifier: Apache-2.0
//! The nftables mode's registration: whether it can run here, how it starts, what it
//! leaves, and the operator tools on its live tables. It falls back to iptables.
//!
//! It can run where `nft` 1.0.1 or later is on PATH (older ones parse the whole ruleset,
//! other tables included, and may fail on what other software wrote: upstream's knftables
//! requires it too) and the kernel takes our fixed ruleset: the probe is a dry run
//! (`nft -c`) of the base chains, maps and sets, which needs every nf_tables feature the
//! rules use (verdict maps, concatenated keys, `fib`, `numgen`, NAT chains).

use std::io::Write;
use std::process::{Command, Stdio};

use super::context::NftContext;
use super::names::TABLE;
use super::ruleset::DesiredState;
use super::transport::{NftCommand, family_keyword};
use super::{NftablesProxier, trace};
use crate::{
    config::ProxyMode,
    inspect::Subject,
    model::IpFamily,
    proxier::{
        CleanupReport, CleanupScope, HostLayout, ModeEntry, ModeSettings, ModeTools, NodeContext,
        Proxier, conntrack::NetlinkConntrack,
    },
};

pub static MODE: ModeEntry = ModeEntry {
    mode: ProxyMode::Nftables,
    fallback: Some(ProxyMode::Iptables),
    probe: |_| unavailable(),
    start,
    cleanup,
    tools: ModeTools {
        in_use: trace::in_use,
        inspect_subjects: &[Subject::Rules, Subject::Affinity],
        inspect: Some(trace::inspect_live),
        trace: Some(trace::trace_live),
    },
};

/// The oldest `nft` whose cache reads only the table it is asked about.
const MIN_NFT: (u32, u32, u32) = (1, 0, 1);

/// Why nftables mode cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    let version = match Command::new("nft").arg("--version").output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(out) => {
            return Some(format!(
                "nft --version failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Err(e) => return Some(format!("the nft binary cannot be run: {e}")),
    };
    match parse_version(&version) {
        Some(v) if v >= MIN_NFT => {}
        Some((a, b, c)) => {
            return Some(format!(
                "nft {a}.{b}.{c} is too old: nftables mode needs nft 1.0.1 or later"
            ));
        }
        None => return Some(format!("unrecognised nft version {:?}", version.trim())),
    }
    let node = NodeContext::default();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let probe = DesiredState::from_ports([], &ctx).cold_load(&ctx);
    dry_run(&probe).err().map(|stderr| {
        format!("the kernel does not accept the nftables ruleset (no nf_tables, or a feature missing): {stderr}")
    })
}

/// `nft -c -f -`: the kernel checks the transaction and keeps nothing.
fn dry_run(script: &str) -> Result<(), String> {
    let mut child = Command::new("nft")
        .args(["-c", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(script.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// "nftables v1.0.6 (Lester Gooch #5)" → (1, 0, 6).
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let word = text.split_whitespace().find(|w| w.starts_with('v'))?;
    let mut parts = word[1..].split('.').map(|p| {
        p.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
            .ok()
    });
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

fn start(_settings: &ModeSettings<'_>) -> Result<Box<dyn Proxier>, String> {
    Ok(Box::new(NftablesProxier::new(
        Box::new(NftCommand),
        Box::new(NetlinkConntrack::new()),
    )))
}

/// Deletes the `kube-proxy` tables of both families (when another mode starts, and for
/// `--cleanup`). Nothing to look at without `nft` or nf_tables.
fn cleanup(_: &HostLayout, _: CleanupScope) -> Option<CleanupReport> {
    let listing = Command::new("nft").args(["list", "tables"]).output().ok()?;
    if !listing.status.success() {
        return None;
    }
    let listing = String::from_utf8_lossy(&listing.stdout);
    let mut report = CleanupReport::default();
    for family in [IpFamily::V4, IpFamily::V6] {
        let ip = family_keyword(family);
        if !listing
            .lines()
            .any(|l| l.trim() == format!("table {ip} {TABLE}"))
        {
            continue;
        }
        match Command::new("nft")
            .args(["delete", "table", ip, TABLE])
            .output()
        {
            Ok(out) if out.status.success() => report.removed += 1,
            Ok(out) => report.errors.push(format!(
                "nft delete table {ip} {TABLE}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => report
                .errors
                .push(format!("nft delete table {ip} {TABLE}: {e}")),
        }
    }
    Some(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nft_versions() {
        assert_eq!(
            parse_version("nftables v1.0.6 (Lester Gooch #5)\n"),
            Some((1, 0, 6))
        );
        assert_eq!(parse_version("nftables v0.9.8 (E.D.S.)"), Some((0, 9, 8)));
        assert!(parse_version("nftables v0.9.8 (E.D.S.)").unwrap() < MIN_NFT);
        assert_eq!(parse_version("nftables v1.1 (x)"), Some((1, 1, 0)));
        assert_eq!(parse_version("garbage"), None);
    }
}
