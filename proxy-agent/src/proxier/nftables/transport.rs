// SPDX-License-Identifier: Apache-2.0
//! How the texts reach the kernel: the `nft` binary, one process per transaction, the
//! transaction's text on its stdin (`nft -f -`), as upstream's knftables does.
//!
//! Why the binary rather than netlink: the rules use expressions (`numgen`, `fib`,
//! verdict maps, concatenated set keys with per-element timeouts, `masquerade
//! fully-random`) whose netlink encoding no maintained Rust crate covers (rustables and
//! nftnl-rs stop at simple matches), and writing that encoder by hand means owning the
//! kernel's expression ABI for every kernel we support; `nft` already is that encoder,
//! it sends the whole text as one netlink batch (one atomic transaction), and its error
//! messages name the input line. What it costs: a process per sync, and `nft` reads the
//! table before it applies the text (about 0.25 s at 10,000 services, paid by partial
//! syncs too; measured in the sync benchmark). Behind [`NftTransport`] so that the
//! proxier is tested without privileges.

use crate::model::IpFamily;
use crate::proxier::netfilter::ExecError;
use crate::proxier::netfilter::exec::{lines_around, run_program};

use super::names::TABLE;

/// Runs `nft` with `args`, `stdin` written to it: every process this mode starts, through
/// the netfilter layer's one runner (a fixed program name, each argument its own argv
/// entry, never a shell).
pub fn nft(args: &[&str], stdin: Option<&str>) -> Result<String, ExecError> {
    run_program("nft", args, stdin)
}

/// The nftables operations of the mode.
pub trait NftTransport: Send {
    /// Runs `script` as one transaction (`nft -f -`).
    fn run(&mut self, script: &str) -> Result<(), ExecError>;
    /// The names of the chains of the family's `kube-proxy` table; empty when there is no
    /// such table.
    fn list_chains(&mut self, family: IpFamily) -> Result<Vec<String>, ExecError>;
    /// Whether the chain of the family's `kube-proxy` table exists and holds rules.
    fn chain_has_rules(&mut self, family: IpFamily, chain: &str) -> Result<bool, ExecError>;
}

/// `nft` on PATH.
#[derive(Debug, Default)]
pub struct NftCommand;

impl NftTransport for NftCommand {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        nft(&["-f", "-"], Some(script)).map(drop)
    }

    fn list_chains(&mut self, family: IpFamily) -> Result<Vec<String>, ExecError> {
        let ip = family_keyword(family);
        // `list chains <family>` prints every table's chain declarations without their
        // rules (still a read of every chain: nft 1.0.6 takes about 4 s at 50,000
        // services, as it does before any transaction adding rules or elements).
        Ok(chains_of_table(&nft(&["list", "chains", ip], None)?, ip))
    }

    fn chain_has_rules(&mut self, family: IpFamily, chain: &str) -> Result<bool, ExecError> {
        let ip = family_keyword(family);
        match nft(&["list", "chain", ip, TABLE, chain], None) {
            Ok(listing) => Ok(listed_rules(&listing) > 0),
            // A missing table or chain is an error exit: that is the answer, not a failure.
            Err(ExecError::Failed { .. }) => Ok(false),
            Err(err) => Err(err),
        }
    }
}

/// The rules in an `nft list chain` listing: the lines inside the chain's braces that are
/// not its declaration (type, hook, policy).
pub fn listed_rules(listing: &str) -> usize {
    listing
        .lines()
        .map(str::trim)
        .filter(|line| {
            !line.is_empty()
                && !line.starts_with("table ")
                && !line.starts_with("chain ")
                && !line.starts_with("type ")
                && *line != "}"
        })
        .count()
}

/// "ip" or "ip6".
pub fn family_keyword(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// The chain names of `table <ip> kube-proxy` in `nft list chains` output.
pub fn chains_of_table(listing: &str, ip: &str) -> Vec<String> {
    let header = format!("table {ip} {TABLE} {{");
    let mut inside = false;
    let mut chains = Vec::new();
    for line in listing.lines() {
        let line = line.trim();
        if line.starts_with("table ") {
            inside = line == header;
        } else if inside
            && let Some(name) = line
                .strip_prefix("chain ")
                .and_then(|rest| rest.strip_suffix(" {"))
        {
            chains.push(name.to_string());
        }
    }
    chains
}

/// The first input line an `nft -f -` error names.
pub fn error_line(stderr: &str) -> Option<usize> {
    stderr.lines().find_map(|line| {
        let rest = line.strip_prefix("/dev/stdin:")?;
        rest.split(':').next()?.parse().ok()
    })
}

/// The input around the line a failed `nft -f -` names, for the log.
pub fn context_of(err: &ExecError, script: &str) -> Option<String> {
    match err {
        ExecError::Failed { stderr, .. } => {
            error_line(stderr).map(|line| lines_around(script, line, 3))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_of_our_table_only() {
        let listing = "table ip filter {\n\tchain INPUT {\n\t\ttype filter hook input priority filter; policy accept;\n\t}\n}\ntable ip kube-proxy {\n\tchain filter-input {\n\t\ttype filter hook input priority -110; policy accept;\n\t}\n\tchain service-ULMVA6XW-ns1/svc1/tcp/p80 {\n\t}\n}\n";
        assert_eq!(
            chains_of_table(listing, "ip"),
            vec!["filter-input", "service-ULMVA6XW-ns1/svc1/tcp/p80"]
        );
        assert!(chains_of_table(listing, "ip6").is_empty());
    }

    #[test]
    fn rules_of_a_listed_chain() {
        let empty = "table ip kube-proxy {\n\tchain nat-prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t}\n}\n";
        assert_eq!(listed_rules(empty), 0);
        let one = "table ip kube-proxy {\n\tchain nat-prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}\n}\n";
        assert_eq!(listed_rules(one), 1);
    }

    #[test]
    fn error_lines() {
        let stderr = "/dev/stdin:12:30-35: Error: Could not process rule: No such file or directory\nadd rule ip kube-proxy x\n                             ^^^^^^";
        assert_eq!(error_line(stderr), Some(12));
        assert_eq!(error_line("Error: syntax error"), None);
        let err = ExecError::Failed {
            program: "nft -f -".into(),
            status: "exit status: 1".into(),
            stderr: "/dev/stdin:2:1-3: Error: syntax error".into(),
            line: None,
        };
        let context = context_of(&err, "a\nb\nc\n").unwrap();
        assert!(context.contains("     2: b"), "{context}");
    }
}
