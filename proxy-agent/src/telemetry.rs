// SPDX-License-Identifier: Apache-2.0
//! Logging: `tracing` with an env filter; `log` records (aya-log among them) are bridged in.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Installs the global subscriber. `verbosity` follows klog's `-v` loosely: 0-1 info,
/// 2-3 debug, 4+ trace. `RUST_LOG` overrides it.
pub fn init(verbosity: u8, json: bool) {
    let default = match verbosity {
        0 | 1 => "info",
        2 | 3 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let registry = tracing_subscriber::registry().with(filter);
    let installed = if json {
        registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .try_init()
    } else {
        registry
            .with(fmt::layer().with_writer(std::io::stderr))
            .try_init()
    };
    if installed.is_ok() {
        // aya-log and other `log` users: route their records into tracing.
        let _ = tracing_log::LogTracer::init();
    }
}
