// SPDX-License-Identifier: Apache-2.0
//! Logging: `tracing` events written in kube-proxy's formats (klog text, or klog's JSON
//! with `--logging-format=json`; see [`klog`]), filtered by `-v` and `--vmodule` as klog
//! does; `log` records (aya-log among them) are bridged in. `RUST_LOG`, when set, replaces
//! the klog filter (a developer's knob; kube-proxy has none).

pub mod klog;

#[cfg(test)]
pub(crate) use self::captured::CapturedLog;

use tracing::Level;
use tracing_subscriber::{
    EnvFilter, Layer as _,
    filter::filter_fn,
    fmt::{self, writer::BoxMakeWriter, writer::MakeWriterExt as _},
    prelude::*,
};

use self::klog::{KlogFormat, VModuleFilter};
use crate::config::VModuleItem;

/// Installs the global subscriber: klog's text format (JSON when `json`), showing what
/// `-v=verbosity` and `--vmodule` let through.
///
/// Everything goes to stderr, as klog writes; with `split_stream` (logsapi's alpha
/// `splitStream`) error messages go to stderr and the others to stdout.
pub fn init(verbosity: u32, vmodule: &[VModuleItem], json: bool, split_stream: bool) {
    let klog_filter = VModuleFilter::new(verbosity, vmodule);
    let env_filter = EnvFilter::try_from_default_env().ok();
    let from_env = env_filter.is_some();
    let most_verbose = klog_filter.most_verbose();
    // Decided per call site (file and level), once: no cost per event.
    let filter = filter_fn(move |meta| from_env || klog_filter.enabled(meta));
    let filter = if from_env {
        filter
    } else {
        filter.with_max_level_hint(most_verbose)
    };
    let format = if json {
        KlogFormat::Json
    } else {
        KlogFormat::Text
    };
    let writer = if split_stream {
        BoxMakeWriter::new(
            std::io::stderr
                .with_max_level(Level::ERROR)
                .or_else(std::io::stdout),
        )
    } else {
        BoxMakeWriter::new(std::io::stderr)
    };
    let layer = fmt::layer()
        .event_format(format)
        .with_writer(writer)
        .with_filter(filter);
    let installed = tracing_subscriber::registry()
        .with(env_filter)
        .with(layer)
        .try_init();
    if installed.is_ok() {
        // aya-log and other `log` users: route their records into tracing.
        let _ = tracing_log::LogTracer::init();
    }
}

#[cfg(test)]
mod captured {
    use std::sync::{Arc, Mutex};

    /// Log output captured for one test (a `MakeWriter` for a test subscriber).
    #[derive(Clone, Default)]
    pub(crate) struct CapturedLog(Arc<Mutex<Vec<u8>>>);

    impl CapturedLog {
        pub(crate) fn text(&self) -> String {
            let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        }

        pub(crate) fn lines(&self) -> Vec<String> {
            self.text().lines().map(str::to_string).collect()
        }
    }

    impl std::io::Write for CapturedLog {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut bytes) = self.0.lock() {
                bytes.extend_from_slice(buf);
            }
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLog {
        type Writer = CapturedLog;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }
}
