// SPDX-License-Identifier: Apache-2.0
//! `cargo xtask test`: setup when needed, the lint gate (`cargo xtask lint`), build
//! everything (the eBPF object required), then run every test with the test runner, whose
//! own summary closes the run.

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
    step("running the tests");
    let mut cmd = cargo();
    if has_nextest() {
        cmd.args(["nextest", "run", "--no-fail-fast"]);
    } else {
        cmd.args(["test", "--no-fail-fast"]);
    }
    cmd.env("PROXY_REQUIRE_EBPF", "1").args(&args.rest);
    // The test runner's own summary is the last thing printed: pass its exit status on
    // without another word.
    let status = crate::util::status(&mut cmd)?;
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
