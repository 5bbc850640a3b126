// SPDX-License-Identifier: Apache-2.0
//! The running agent: start-up in upstream's order (node name, sources, node facts, mode
//! with fallback, process settings, health and metrics), then one event loop that owns the
//! model and the proxier.

mod capacity;
mod error;
mod event_loop;
mod foreign;
mod mode;
mod node_facts;

use std::net::SocketAddr;

use tokio::sync::mpsc;
use tracing::{info, warn};

pub use self::{
    error::{AgentError, Result},
    mode::{ModeChoice, choose_mode},
};
use crate::{
    config::Resolved,
    k8s::{
        client::{ConnectionSettings, make_client},
        events::EventSink,
        watch::{ClusterEvent, spawn_watchers},
    },
    model::IpFamily,
    serve::{Metrics, ProxyHealth},
};

/// The IP families this node can serve (the kernel has IPv6 unless it is disabled).
pub fn node_families() -> Vec<IpFamily> {
    let mut out = vec![IpFamily::V4];
    if std::path::Path::new("/proc/net/if_inet6").exists() {
        out.push(IpFamily::V6);
    }
    out
}

/// A server's bind address; `None` when it is empty, which disables the server (upstream's
/// `--healthz-port=0` / `--metrics-port=0`, or an empty address in the file).
fn parse_bind(what: &'static str, value: &str) -> Result<Option<SocketAddr>> {
    if value.is_empty() {
        info!(server = what, "server disabled (empty bind address)");
        return Ok(None);
    }
    value
        .parse()
        .map(Some)
        .map_err(|e: std::net::AddrParseError| AgentError::Address {
            what,
            value: value.to_string(),
            reason: e.to_string(),
        })
}

/// How often the configuration file is compared with what the agent started from.
const CONFIG_POLL: std::time::Duration = std::time::Duration::from_secs(5);

/// Exits (status 1) once the file at `path` no longer holds what it held at start, as
/// kube-proxy does so that its supervisor (the kubelet) restarts it with the new file.
async fn exit_when_changed(path: std::path::PathBuf, every: std::time::Duration) {
    changed(&path, every).await;
    tracing::error!(
        path = %path.display(),
        "the configuration file changed: exiting so that the new one is read at restart"
    );
    std::process::exit(1);
}

/// Returns once the file at `path` holds something else than when this was called (or
/// can no longer be read), looking every `every`. A ConfigMap update replaces the file (a
/// symlink swap), which only reading it again sees.
async fn changed(path: &std::path::Path, every: std::time::Duration) {
    let started_with = std::fs::read(path).ok();
    loop {
        tokio::time::sleep(every).await;
        if std::fs::read(path).ok() != started_with {
            return;
        }
    }
}

/// Runs the agent until a termination signal.
pub async fn run(resolved: Resolved) -> Result<()> {
    let config = &resolved.config;
    let node_name =
        crate::node::node_name(&config.hostname_override).map_err(AgentError::NodeName)?;
    info!(node = %node_name, "starting");
    let families = node_families();
    let periods = resolved.effective.sync_periods;

    // Sources first: the Node object (addresses, podCIDRs) is needed to finish start-up.
    let (tx, rx) = mpsc::channel::<ClusterEvent>(4096);
    let events = match &resolved.options.source_dir {
        Some(dir) => {
            info!(dir = %dir.display(), "reading cluster objects from a directory (--source)");
            crate::source::dir::spawn(dir.clone(), node_name.clone(), families.clone(), tx);
            EventSink::disabled()
        }
        None => {
            let kubeconfig = (!config.client_connection.kubeconfig.is_empty())
                .then(|| config.client_connection.kubeconfig.clone());
            let connection = &config.client_connection;
            let client = make_client(&ConnectionSettings {
                kubeconfig,
                master: resolved.options.master.clone(),
                qps: connection.qps,
                burst: connection.burst,
                content_type: connection.content_type.clone(),
                accept_content_types: connection.accept_content_types.clone(),
            })
            .await?;
            let events = EventSink::spawn(client.clone(), &node_name);
            spawn_watchers(client, &node_name, &families, tx);
            events
        }
    };

    let options = &resolved.options;
    for path in options
        .config_file
        .iter()
        .chain(&options.config_overrides_file)
    {
        tokio::spawn(exit_when_changed(path.clone(), CONFIG_POLL));
    }

    let requested = resolved.effective.mode;
    let health = ProxyHealth::new(2 * periods.sync.to_std(), requested.as_str());
    let metrics = Metrics::new();
    metrics.set_feature_gates(&config.feature_gates);
    metrics.start_families(&families);
    let healthz = parse_bind("healthzBindAddress", &config.healthz_bind_address)?;
    let metrics_addr = parse_bind("metricsBindAddress", &config.metrics_bind_address)?;
    spawn_server("healthz", healthz, config.bind_address_hard_fail, {
        let (h, m) = (health.clone(), metrics.clone());
        move |addr| crate::serve::serve_healthz(addr, h, Some(m))
    });
    spawn_server("metrics", metrics_addr, config.bind_address_hard_fail, {
        let (h, m) = (health.clone(), metrics.clone());
        let configz = crate::serve::configz_body(config);
        move |addr| crate::serve::serve_metrics(addr, m, h, configz)
    });
    if config.enable_profiling {
        info!("enableProfiling is set; this agent has no /debug/pprof handlers");
    }

    let mut event_loop = event_loop::EventLoop::new(
        &resolved,
        node_name,
        &families,
        health,
        metrics,
        rx,
        periods.min_sync.to_std(),
        periods.sync.to_std(),
    );
    event_loop.set_event_sink(events);
    event_loop.wait_for_initial_state().await?;
    let facts = node_facts::establish(&resolved, &mut event_loop).await?;
    let choice = choose_mode(requested, &resolved)?;
    if choice.fell_back() {
        event_loop.record_fallback(&choice);
    }
    node_facts::apply_process_settings(&resolved, choice.mode);
    if resolved.options.init_only {
        info!("--init-only: initialisation done, exiting");
        return Ok(());
    }
    event_loop.start(choice, facts).await
}

/// Serves `what` on `addr` in the background (nothing when the server is disabled). A
/// failure to bind is fatal with bindAddressHardFail, a warning otherwise (upstream's
/// behaviour).
fn spawn_server<F, Fut>(what: &'static str, addr: Option<SocketAddr>, hard_fail: bool, serve: F)
where
    F: FnOnce(SocketAddr) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
{
    let Some(addr) = addr else {
        return;
    };
    tokio::spawn(async move {
        if let Err(e) = serve(addr).await {
            if hard_fail {
                tracing::error!(server = what, %addr, error = %e, "cannot serve; bindAddressHardFail is set, exiting");
                std::process::exit(1);
            }
            warn!(server = what, %addr, error = %e, "cannot serve");
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_changed_or_replaced_configuration_file_is_noticed() {
        let dir = std::env::temp_dir().join(format!("kpe-config-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.conf");
        std::fs::write(&path, "mode: iptables\n").unwrap();
        let every = Duration::from_millis(10);
        // Unchanged (rewritten with the same bytes): still waiting.
        std::fs::write(&path, "mode: iptables\n").unwrap();
        let waiting = tokio::time::timeout(Duration::from_millis(100), changed(&path, every)).await;
        assert!(waiting.is_err(), "the same content is no change");
        // Replaced by another file (a ConfigMap update swaps a symlink).
        let watch = tokio::spawn({
            let path = path.clone();
            async move { changed(&path, every).await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let next = dir.join("config.conf.new");
        std::fs::write(&next, "mode: ebpf\n").unwrap();
        std::fs::rename(&next, &path).unwrap();
        tokio::time::timeout(Duration::from_secs(5), watch)
            .await
            .expect("the change is seen")
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_empty_bind_address_disables_the_server() {
        assert_eq!(parse_bind("healthzBindAddress", "").unwrap(), None);
        assert_eq!(
            parse_bind("healthzBindAddress", "0.0.0.0:10256").unwrap(),
            Some("0.0.0.0:10256".parse().unwrap())
        );
        assert!(parse_bind("healthzBindAddress", "nonsense").is_err());
    }
}
