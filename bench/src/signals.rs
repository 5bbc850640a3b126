// SPDX-License-Identifier: Apache-2.0
//! SIGINT and SIGTERM turn into a flag the benchmark checks between and during its
//! steps, so an interrupted run unwinds through its guards and removes what it created.

use std::sync::OnceLock;

use super::error::{Error, Result};

static RECEIVED: OnceLock<&'static str> = OnceLock::new();

/// Starts watching for SIGINT and SIGTERM (once per process). From then on the first such
/// signal no longer ends the process; [`check`] reports it instead. A second one exits.
pub fn watch() -> Result<()> {
    static STARTED: OnceLock<()> = OnceLock::new();
    if STARTED.set(()).is_err() {
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(Error::io("starting the signal watcher"))?;
    // Registered here, before the thread runs, so no signal slips through in between.
    let mut term = runtime
        .block_on(async {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        })
        .map_err(Error::io("watching SIGTERM"))?;
    let mut int = runtime
        .block_on(async {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        })
        .map_err(Error::io("watching SIGINT"))?;
    std::thread::spawn(move || {
        loop {
            let name = runtime.block_on(async {
                tokio::select! {
                    _ = int.recv() => "SIGINT",
                    _ = term.recv() => "SIGTERM",
                }
            });
            // A second signal while cleaning up means the user wants out now.
            if RECEIVED.set(name).is_err() {
                eprintln!("{name} again: exiting without finishing the cleanup");
                std::process::exit(130);
            }
        }
    });
    Ok(())
}

/// The signal received, if any.
pub fn received() -> Option<&'static str> {
    RECEIVED.get().copied()
}

/// `Err(Interrupted)` once a signal has arrived.
pub fn check() -> Result<()> {
    match received() {
        Some(name) => Err(Error::Interrupted(name)),
        None => Ok(()),
    }
}
