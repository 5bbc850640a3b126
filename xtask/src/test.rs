// SPDX-License-Identifier: Apache-2.0
//! `cargo xtask test`: setup when needed, the lint gate (`cargo xtask lint`), build
//! everything (the eBPF object required), start upstream's control plane for the tests
//! that share one (`KPE_CONTROL_PLANE`), then run every test with the test runner, whose
//! own summary closes the run; the control plane stops after it.

use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
};

use anyhow::{Context as _, bail};
use clap::Args;

use crate::{
    lint, setup,
    util::{cargo, step},
};

#[derive(Args, Default)]
pub struct TestArgs {
    /// Extra arguments for the test runner (e.g. a filter).
    #[arg(trailing_var_arg = true)]
    pub rest: Vec<String>,
}

pub fn run_tests(args: &TestArgs) -> anyhow::Result<()> {
    setup::ensure_ready()?;
    crate::util::build_workspace(false)?;
    let plane = SharedControlPlane::start()?;
    step("running the tests");
    let mut cmd = cargo();
    cmd.env(SHARED_ENV, &plane.dir);
    if has_nextest() {
        cmd.args(["nextest", "run", "--no-fail-fast"]);
    } else {
        cmd.args(["test", "--no-fail-fast"]);
    }
    cmd.env("PROXY_REQUIRE_EBPF", "1").args(&args.rest);
    // The test runner's own summary is the last thing printed: pass its exit status on
    // without another word.
    let status = crate::util::status(&mut cmd)?;
    plane.stop();
    if !status.success() {
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}

/// The lint gate first, so that CI (`cargo xtask test`) fails on a lint.
pub fn run(args: &TestArgs) -> anyhow::Result<()> {
    lint::run(&lint::LintArgs::default())?;
    run_tests(args)
}

fn has_nextest() -> bool {
    crate::util::output(cargo().args(["nextest", "--version"])).is_some()
}

/// The variable naming the shared control plane's directory (testbed::SHARED_ENV).
const SHARED_ENV: &str = "KPE_CONTROL_PLANE";

/// Upstream's control plane for the whole run (`control-plane serve`), stopped when its
/// standard input closes: when the run ends, or when this process dies.
struct SharedControlPlane {
    dir: PathBuf,
    child: Option<Child>,
}

impl SharedControlPlane {
    fn start() -> anyhow::Result<Self> {
        step("starting upstream's control plane for the tests that share one");
        let dir =
            std::env::temp_dir().join(format!("kpe-shared-control-plane-{}", std::process::id()));
        let mut command: Command = cargo();
        command
            .args([
                "run",
                "--quiet",
                "-p",
                "testbed",
                "--bin",
                "control-plane",
                "--",
            ])
            .args(["serve", "--until-stdin-closes", "--dir"])
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = command.spawn().context("starting `control-plane serve`")?;
        let stdout = child.stdout.take().context("the control plane's output")?;
        let plane = Self {
            dir,
            child: Some(child),
        };
        for line in BufReader::new(stdout).lines() {
            let line = line.context("reading the control plane's output")?;
            println!("    {line}");
            if line.starts_with("READY ") {
                return Ok(plane);
            }
        }
        plane.stop();
        bail!("upstream's control plane did not start (its error is above)")
    }

    fn stop(mut self) {
        self.stop_child();
    }

    fn stop_child(&mut self) {
        if let Some(mut child) = self.child.take() {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

impl Drop for SharedControlPlane {
    fn drop(&mut self) {
        self.stop_child();
    }
}
