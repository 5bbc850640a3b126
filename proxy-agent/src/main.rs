// SPDX-License-Identifier: Apache-2.0
//! proxy-agent: the binary's edge (flags, logging, exit codes).

use clap::{CommandFactory as _, FromArgMatches as _, Parser};
use proxy_agent::{
    config::{self, Flags, VersionRequest},
    proxier::HostLayout,
};
use tracing::{info, warn};

/// A Kubernetes service proxy: kube-proxy's behaviour with an eBPF fast path.
#[derive(Parser)]
#[command(
    name = "proxy-agent",
    version,
    disable_version_flag = true,
    args_override_self = true
)]
struct Cli {
    #[command(flatten)]
    flags: Flags,

    /// Operator tools (kube-proxy has none: without one, the agent runs).
    #[command(subcommand)]
    tool: Option<proxy_agent::tools::Tool>,
}

/// jemalloc, not glibc's malloc: see [`proxy_agent::sys::release_free_memory`].
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's built-in options (its `malloc_conf`, under the prefix `tikv-jemalloc-sys`
/// gives its symbols). `narenas:1`: one arena, not four per CPU. The agent's memory is one
/// model that its event loop builds and changes; with an arena per thread, the blocks a
/// sync freed on one runtime thread stay cached in that thread's arena while another
/// thread's arena grows for the next (176 MiB resident against 182 at 50,000 services × 4,
/// and a peak of 371 MiB against 470). `_RJEM_MALLOC_CONF` still overrides it.
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_CONF: &[u8; 10] = b"narenas:1\0";

fn main() -> std::process::ExitCode {
    let args = config::normalize_word_separators(std::env::args_os());
    let matches = Cli::command().get_matches_from(args);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let version = env!("CARGO_PKG_VERSION");
    match &cli.flags.version {
        Some(VersionRequest::Print) => {
            println!("proxy-agent v{version}");
            return std::process::ExitCode::SUCCESS;
        }
        Some(VersionRequest::Raw) => {
            println!(
                "version.Info{{GitVersion:\"v{version}\", Compiler:\"rustc\", Platform:\"{}/{}\"}}",
                std::env::consts::OS,
                std::env::consts::ARCH
            );
            return std::process::ExitCode::SUCCESS;
        }
        Some(VersionRequest::Report(reported))
            if reported
                .trim_start_matches('v')
                .split(['-', '+'])
                .next()
                .is_none_or(|core| core != version) =>
        {
            eprintln!(
                "Error: invalid argument {reported:?} for \"--version\" flag: version {reported:?} must match major/minor/patch of default version \"v{version}\""
            );
            return std::process::ExitCode::from(1);
        }
        Some(VersionRequest::No | VersionRequest::Report(_)) | None => {}
    }
    if let Some(tool) = &cli.tool {
        // The configuration (when it resolves) says where the modes keep their state.
        let layout = config::resolve(&cli.flags, &matches)
            .map(|r| HostLayout::from_config(&r.config))
            .unwrap_or_else(|_| HostLayout::from_defaults());
        return match proxy_agent::tools::run(tool, &layout) {
            Ok(text) => {
                print!("{text}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("proxy-agent: {e}");
                std::process::ExitCode::from(1)
            }
        };
    }
    let resolved = match config::resolve(&cli.flags, &matches) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::from(1);
        }
    };
    let json = resolved.options.log_format == "json";
    let stream_options = resolved
        .config
        .logging
        .options
        .get(if json { "json" } else { "text" });
    let split_stream = stream_options
        .and_then(|o| o.get("splitStream"))
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    proxy_agent::telemetry::init(
        resolved.options.verbosity,
        &resolved.config.logging.vmodule,
        json,
        split_stream,
    );
    // As kube-proxy starts: every flag at V(1), then its version.
    for (name, value) in config::flag_dump(&matches) {
        info!(target: proxy_agent::telemetry::klog::V1_PRINTF, "FLAG: --{name}={value:?}");
    }
    if let Some(VersionRequest::Report(reported)) = &cli.flags.version {
        warn!(
            version = %reported,
            "--version=vX.Y.Z accepted; the agent reports its own version, v{version}"
        );
    }
    for flag in &resolved.ignored_flags {
        warn!(flag = %flag, "flag ignored because --config is given (the file's value applies)");
    }
    for w in &resolved.warnings {
        warn!("{w}");
    }

    if let Some(path) = &resolved.options.write_config_to {
        return match config::write_config(path, &resolved.config) {
            Ok(()) => {
                info!(path = %path.display(), "configuration written");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::ExitCode::from(1)
            }
        };
    }
    // As kube-proxy's Run starts (after the configuration's warnings; not for
    // --write-config-to, which exits before).
    info!(version = %format!("v{version}"), "Version info");
    if resolved.options.cleanup {
        let layout = HostLayout::from_config(&resolved.config);
        return if proxy_agent::cleanup::cleanup_all(&layout.bpffs_root, &layout.ipvs_exclude) {
            std::process::ExitCode::SUCCESS
        } else {
            std::process::ExitCode::from(1)
        };
    }

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("starting the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match runtime.block_on(proxy_agent::agent::run(resolved)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "exiting");
            eprintln!("proxy-agent: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
