// SPDX-License-Identifier: Apache-2.0
//! `cargo xtask vm [-o DIR] -- <command...>`: one command as root in the test VM
//! (xtask::vm), its console streamed here, its exit status ours.

use std::{path::PathBuf, time::Duration};

use clap::Args;
use xtask::vm::{self, VmOptions};

/// The status when the guest did not run the command to its end (as `timeout` and
/// recipe A of ../shared/ipvs-vm.md use).
pub const GUEST_FAILED: i32 = 125;

#[derive(Args)]
pub struct VmArgs {
    /// Read-write directory shared with the guest at the same path: results come back here
    /// (everything else the guest writes vanishes with it).
    #[arg(short = 'o', long = "out")]
    pub out: Option<PathBuf>,
    /// Seconds before the guest is killed.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Virtual CPUs (TCG threads).
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 2048)]
    pub memory_mib: u32,
    /// The command, run by bash in the current directory. One argument is shell text
    /// (`'modprobe -a ip_vs && ipvsadm -Ln'`); several are the exact argument vector.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// The guest script for a command given on our command line: one word is shell text,
/// several are an argument vector; RUST_LOG and RUST_BACKTRACE travel along.
pub fn script_for(command: &[String]) -> String {
    let mut script = String::new();
    for var in ["RUST_LOG", "RUST_BACKTRACE"] {
        if let Ok(value) = std::env::var(var) {
            script.push_str(&format!("export {var}={}\n", vm::shell_quote(&value)));
        }
    }
    match command {
        [text] => script.push_str(text),
        words => script.push_str(&vm::shell_words(words)),
    }
    script.push('\n');
    script
}

/// Runs `script` in the guest with the console streamed; the guest's exit status, or
/// [`GUEST_FAILED`] after saying why it did not get one.
pub fn run_in_guest(script: &str, options: &VmOptions) -> i32 {
    match vm::run_script(script, options) {
        Ok(outcome) => {
            eprintln!(
                "vm: exit status {} after {:.1} s",
                outcome.status,
                outcome.elapsed.as_secs_f64()
            );
            outcome.status
        }
        Err(err) => {
            eprintln!("vm: {err}");
            GUEST_FAILED
        }
    }
}

pub fn run(args: &VmArgs) -> anyhow::Result<()> {
    let options = VmOptions {
        out_dir: args.out.clone(),
        timeout: Duration::from_secs(args.timeout),
        cpus: args.cpus,
        memory_mib: args.memory_mib,
        ..VmOptions::default()
    };
    std::process::exit(run_in_guest(&script_for(&args.command), &options));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_word_is_shell_text_several_are_an_argument_vector() {
        let text = script_for(&["modprobe -a ip_vs && ipvsadm -Ln".to_string()]);
        assert!(
            text.ends_with("modprobe -a ip_vs && ipvsadm -Ln\n"),
            "{text}"
        );
        let argv = script_for(&["echo".to_string(), "a && b".to_string()]);
        assert!(argv.ends_with("echo 'a && b'\n"), "{argv}");
    }
}
