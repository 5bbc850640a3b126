// SPDX-License-Identifier: Apache-2.0
//! Talking to iptables: the few operations the iptables and ipvs modes need, behind a trait
//! so the sync logic is testable without privileges, and their implementation with the
//! `iptables`, `iptables-save` and `iptables-restore` binaries (ip6tables-* for IPv6), as
//! upstream does. Whether those are the nft or the legacy variant is the host's choice:
//! where both are installed (the agent's image), [`CommandBackend::detect`] uses the
//! backend the host's rules are in (see `host_backend`), else PATH's `iptables`;
//! [`CommandBackend::detect_named`] names one. The version is detected to be logged and to
//! know which options the binaries accept.

use std::fs::File;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

use super::table::Table;
use crate::model::IpFamily;

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("could not run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed ({status}): {stderr}")]
    Failed {
        program: String,
        status: String,
        stderr: String,
        /// The input line iptables-restore reported, when it did.
        line: Option<usize>,
    },
    #[error("could not take the xtables lock {path}: {reason}")]
    Lock { path: String, reason: String },
    #[error("unexpected output from {program}: {detail}")]
    Output { program: String, detail: String },
}

/// The iptables operations of the iptables and ipvs modes.
pub trait IptablesBackend: Send {
    /// `iptables-restore --noflush` of `input`, all tables in it committed atomically.
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), ExecError>;
    /// `iptables-save -t table`.
    fn save(&mut self, family: IpFamily, table: Table) -> Result<String, ExecError>;
    /// `iptables -t table -S chain`; `None` when the chain does not exist.
    fn list_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<Option<String>, ExecError>;
}

/// Which iptables implementation the binaries use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Nft,
    Legacy,
    Unknown,
}

impl Variant {
    /// As `iptables --version` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Nft => "nf_tables",
            Variant::Legacy => "legacy",
            Variant::Unknown => "unknown",
        }
    }
}

/// Parsed `iptables --version` output ("iptables v1.8.9 (nf_tables)").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    pub variant: Variant,
}

/// The version a netfilter tool's `--version` prints after " v" ("iptables v1.8.9
/// (nf_tables)", "nftables v1.0.6 (Lester Gooch #5)"), as (major, minor, patch); missing
/// parts are 0.
pub fn tool_version(text: &str) -> Option<(u32, u32, u32)> {
    let start = text.find(" v")? + 2;
    let digits: String = text[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut parts = digits.split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

impl Version {
    pub fn parse(text: &str) -> Option<Self> {
        let (major, minor, patch) = tool_version(text)?;
        let variant = if text.contains("nf_tables") {
            Variant::Nft
        } else if text.contains("legacy") {
            Variant::Legacy
        } else {
            Variant::Unknown
        };
        Some(Self {
            major,
            minor,
            patch,
            variant,
        })
    }

    fn at_least(&self, major: u32, minor: u32, patch: u32) -> bool {
        (self.major, self.minor, self.patch) >= (major, minor, patch)
    }

    /// `MASQUERADE --random-fully` exists from 1.6.2.
    pub fn has_random_fully(&self) -> bool {
        self.at_least(1, 6, 2)
    }

    /// `iptables` waits for the xtables lock itself (`-w seconds -W usecs` from 1.6.1).
    fn wait_args(&self) -> &'static [&'static str] {
        if self.at_least(1, 6, 1) {
            &["-w", "5", "-W", "100000"]
        } else if self.at_least(1, 4, 22) {
            &["-w", "5"]
        } else if self.at_least(1, 4, 20) {
            &["-w"]
        } else {
            &[]
        }
    }

    /// `iptables-restore` accepts `--wait` from 1.6.2; older ones need the lock taken for
    /// them.
    fn restore_waits(&self) -> bool {
        self.at_least(1, 6, 2)
    }
}

/// The binaries of one family.
#[derive(Clone, Debug)]
struct Tools {
    iptables: String,
    save: String,
    restore: String,
    wait: &'static [&'static str],
    restore_waits: bool,
}

/// The real backend.
#[derive(Debug)]
pub struct CommandBackend {
    v4: Tools,
    v6: Tools,
    pub version: Version,
    lock_path: String,
}

/// Where iptables keeps its lock when it does not wait itself.
const XTABLES_LOCK: &str = "/run/xtables.lock";

impl CommandBackend {
    /// As [`Self::detect`] (in `host_backend`, which chooses the commands), with other command names: `iptables-legacy` stands for
    /// `iptables-legacy`, `iptables-legacy-save` and `iptables-legacy-restore`. The agent
    /// names what [`Self::detect`] chose; the sync benchmark names a variant to measure it.
    pub fn detect_named(iptables: &str, ip6tables: &str) -> Result<Self, ExecError> {
        let output = run_program(iptables, &["--version"], None)?;
        let version = Version::parse(&output).ok_or_else(|| ExecError::Output {
            program: "iptables --version".into(),
            detail: output.trim().to_string(),
        })?;
        tracing::info!(
            version = %format_args!("{}.{}.{}", version.major, version.minor, version.patch),
            variant = version.variant.as_str(),
            random_fully = version.has_random_fully(),
            command = iptables,
            "using these iptables binaries"
        );
        let tools = |prefix: &str| Tools {
            iptables: prefix.to_string(),
            save: format!("{prefix}-save"),
            restore: format!("{prefix}-restore"),
            wait: version.wait_args(),
            restore_waits: version.restore_waits(),
        };
        Ok(Self {
            v4: tools(iptables),
            v6: tools(ip6tables),
            version,
            lock_path: XTABLES_LOCK.into(),
        })
    }

    fn tools(&self, family: IpFamily) -> &Tools {
        match family {
            IpFamily::V4 => &self.v4,
            IpFamily::V6 => &self.v6,
        }
    }

    /// Takes the xtables lock for an iptables-restore too old to wait for it, giving up
    /// after 5 s as `-w 5` would.
    fn lock(&self) -> Result<Flock<File>, ExecError> {
        let err = |reason: String| ExecError::Lock {
            path: self.lock_path.clone(),
            reason,
        };
        let mut file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock_path)
            .map_err(|e| err(e.to_string()))?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(lock),
                Err((f, errno)) => {
                    if Instant::now() >= deadline {
                        return Err(err(errno.to_string()));
                    }
                    file = f;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

impl IptablesBackend for CommandBackend {
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), ExecError> {
        let tools = self.tools(family).clone();
        let mut args: Vec<&str> = Vec::with_capacity(6);
        let _lock = if tools.restore_waits {
            args.extend(tools.wait);
            None
        } else {
            Some(self.lock()?)
        };
        args.extend(["--noflush", "--counters"]);
        run_program(&tools.restore, &args, Some(input)).map(drop)
    }

    fn save(&mut self, family: IpFamily, table: Table) -> Result<String, ExecError> {
        let tools = self.tools(family);
        run_program(&tools.save, &["-t", table.as_str()], None)
    }

    fn list_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<Option<String>, ExecError> {
        let tools = self.tools(family);
        let mut args: Vec<&str> = tools.wait.to_vec();
        args.extend(["-t", table.as_str(), "-S", chain]);
        match run_program(&tools.iptables, &args, None) {
            Ok(out) => Ok(Some(out)),
            // Exit status 1: no such chain. 4 would be a resource problem (the lock).
            Err(ExecError::Failed { status, .. }) if status == "exit status: 1" => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Runs `program` with `args`, `stdin` written to it; its output, or why it failed (with
/// the input line a restore reported). The one runner of the netfilter tools (iptables,
/// ipset).
pub fn run_program(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ExecError> {
    let spawn_err = |source| ExecError::Spawn {
        program: program.to_string(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A write error means the child exited early; its status tells why.
        let _ = pipe.write_all(input.as_bytes());
    }
    let output = child.wait_with_output().map_err(spawn_err)?;
    if output.status.success() {
        return String::from_utf8(output.stdout).map_err(|e| ExecError::Output {
            program: program.to_string(),
            detail: e.to_string(),
        });
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    Err(ExecError::Failed {
        program: format!("{program} {}", args.join(" ")),
        status: output.status.to_string(),
        line: failed_line(&stderr),
        stderr,
    })
}

/// "iptables-restore: line 12 failed" -> 12.
pub fn failed_line(stderr: &str) -> Option<usize> {
    let rest = &stderr[stderr.find("line ")? + 5..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Lines `line - context ..= line + context` of `input` (1-based), for error logs.
pub fn lines_around(input: &str, line: usize, context: usize) -> String {
    let first = line.saturating_sub(context).max(1);
    input
        .lines()
        .enumerate()
        .skip(first - 1)
        .take(line + context + 1 - first)
        .map(|(i, text)| format!("{:>6}: {text}\n", i + 1))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        let v = Version::parse("iptables v1.8.9 (nf_tables)\n").unwrap();
        assert_eq!(
            (v.major, v.minor, v.patch, v.variant),
            (1, 8, 9, Variant::Nft)
        );
        assert!(v.has_random_fully() && v.restore_waits());
        assert_eq!(v.wait_args(), &["-w", "5", "-W", "100000"]);
        let old = Version::parse("iptables v1.4.21").unwrap();
        assert_eq!(old.variant, Variant::Unknown);
        assert!(!old.has_random_fully() && !old.restore_waits());
        assert_eq!(old.wait_args(), &["-w"]);
        let legacy = Version::parse("ip6tables v1.8.7 (legacy)").unwrap();
        assert_eq!(legacy.variant, Variant::Legacy);
        assert!(Version::parse("garbage").is_none());
    }

    #[test]
    fn restore_errors_point_at_the_line() {
        assert_eq!(
            failed_line("iptables-restore v1.8.9 (nf_tables): line 12 failed"),
            Some(12)
        );
        assert_eq!(
            failed_line("Another app is currently holding the xtables lock"),
            None
        );
        let text = "a\nb\nc\nd\ne\n";
        assert_eq!(lines_around(text, 1, 1), "     1: a\n     2: b\n");
        assert_eq!(
            lines_around(text, 4, 1),
            "     3: c\n     4: d\n     5: e\n"
        );
    }
}
