// SPDX-License-Identifier: Apache-2.0
//! Project tasks. `cargo xtask <task>`; see `cargo xtask --help`.

mod bench;
mod conformance;
mod demo;
mod lint;
mod scenarios;
mod setup;
mod test;
mod vm_cmd;

use xtask::{image, util};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "xtask",
    about = "Project tasks: setup, build, lint, test, scenarios, demo, bench, vm, image"
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
    /// The lint gate: rustfmt, clippy (host crates and the eBPF crate), rustdoc, unused
    /// dependencies and import cycles, warnings denied everywhere.
    Lint(lint::LintArgs),
    /// The README's test command: setup when needed, the lint gate, build everything, run
    /// every test.
    Test(test::TestArgs),
    /// Benchmarks (root): `bench [suite] [--quick]`; `bench --report-only` regenerates
    /// docs/benchmarks.md from docs/bench/*.csv (no root).
    Bench(bench::BenchArgs),
    /// The README's first command: setup when needed, build, then the agent in ebpf mode on
    /// a sandbox node (network namespaces and a cgroup of its own) with a few pods, requests
    /// to the ClusterIPs spread over them, the services map; then everything removed.
    Demo(demo::DemoArgs),
    /// Replay the behaviour scenarios (../shared/scenarios, tests/scenarios) in one mode
    /// with the scenario runner; ipvs on a kernel without IPVS runs in the test VM.
    Scenarios(scenarios::ScenariosArgs),
    /// Replay the scenarios through one of our modes and through upstream's kube-proxy,
    /// and print the flows they saw differently outside the documented divergences.
    Conformance(conformance::ConformanceArgs),
    /// Run a command as root in a throw-away qemu guest whose kernel has IPVS (the host's
    /// files read-only, no network device); exits with the command's status.
    Vm(vm_cmd::VmArgs),
    /// The agent image's runtime stage (deploy/Dockerfile) assembled without a container
    /// engine: the release agent built by deploy/image/build-agent.sh, as the image's build
    /// stage builds it, plus the stage's files, into DIR/rootfs, and DIR/image.yaml (base,
    /// entrypoint, packages); with --oci, an OCI image layout of it. See docs/image.md.
    Image(ImageArgs),
    /// The demo's pod: an HTTP server answering with its name (run by `demo`).
    #[command(hide = true)]
    DemoBackend(demo::BackendArgs),
}

#[derive(clap::Args)]
struct ImageArgs {
    /// Where to assemble the tree (emptied first; default: target/image).
    #[arg(long, value_name = "DIR")]
    out: Option<std::path::PathBuf>,
    /// Install this already-built agent (it must embed the eBPF object) instead of
    /// building the release agent.
    #[arg(long, value_name = "PATH")]
    agent_binary: Option<std::path::PathBuf>,
    /// Also write an OCI image layout of it into DIR/oci (tag `latest`), for
    /// `skopeo copy oci:DIR/oci:latest docker://...` to push.
    #[arg(long)]
    oci: bool,
    /// The image's bottom layer: `debian` (the Dockerfile's Debian release with the runtime
    /// packages, made by mmdebstrap), `none` (the agent's layer only), or a root file
    /// system tarball.
    #[arg(
        long,
        value_name = "debian|none|TARBALL",
        default_value = "debian",
        requires = "oci"
    )]
    oci_base: String,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::Setup(args) => setup::run(&args),
        Task::Build { release } => {
            setup::ensure_ready()?;
            util::build_workspace(release)
        }
        Task::Lint(args) => lint::run(&args),
        Task::Test(args) => test::run(&args),
        Task::Bench(args) => bench::run(&args),
        Task::Demo(args) => demo::run(&args),
        Task::Scenarios(args) => scenarios::run(&args),
        Task::Conformance(args) => conformance::run(&args),
        Task::Vm(args) => vm_cmd::run(&args),
        Task::Image(args) => {
            let agent = match args.agent_binary {
                Some(path) => image::Agent::Prebuilt(path),
                None => {
                    setup::ensure_ready()?;
                    image::Agent::Build
                }
            };
            let base = match args.oci_base.as_str() {
                "debian" => image::OciBase::Debian,
                "none" => image::OciBase::None,
                path => image::OciBase::Tarball(path.into()),
            };
            image::run(args.out, &agent, args.oci.then_some(&base))
        }
        Task::DemoBackend(args) => demo::run_backend(&args),
    }
}
