// SPDX-License-Identifier: Apache-2.0
//! Project tasks. `cargo xtask <task>`; see `cargo xtask --help`.

mod bench;
mod setup;
mod test;
mod util;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "xtask",
    about = "Project tasks: setup, build, test, scenarios, demo, bench, vm"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install everything a fresh Debian machine needs (apt packages, rust-src, bpf-linker
    /// built against LLVM 22). Idempotent: a second run changes nothing.
    Setup(setup::SetupArgs),
    /// Build the workspace, the eBPF object included (fails if it cannot be built).
    Build {
        /// Build with the release profile.
        #[arg(long)]
        release: bool,
    },
    /// The README's test command: setup when needed, build everything, run every test.
    Test(test::TestArgs),
    /// Benchmarks (root): `bench clusterip [--quick]`.
    Bench(bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::Setup(args) => setup::run(&args),
        Task::Build { release } => {
            setup::ensure_ready()?;
            util::build_workspace(release)
        }
        Task::Test(args) => test::run(&args),
        Task::Bench(args) => bench::run(&args),
    }
}
