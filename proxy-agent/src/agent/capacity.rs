// SPDX-License-Identifier: Apache-2.0
//! Services left out of full maps, reported where an operator looks: the map gauges and
//! `kubeproxy_ebpf_services_not_programmed`, one warning per sync while it lasts, and a
//! `MapFull` Warning event on the Node (rate-limited by the event sink). Maps that grew
//! count in `kubeproxy_ebpf_map_growths_total` and make a `MapGrown` Normal event on the
//! Node (the proxier logs each growth).

use tracing::{info, warn};

use crate::{
    k8s::events::{EventSink, NodeEvent},
    proxier::SyncStats,
    serve::Metrics,
};

/// Reports the capacity side of a successful sync. `short_before`: whether the previous
/// sync left services out (its end is worth a line too).
pub fn report(stats: &SyncStats, short_before: bool, metrics: &Metrics, events: &EventSink) {
    for usage in &stats.map_usage {
        metrics
            .map_entries
            .with_label_values(&[usage.map])
            .set(usage.entries as f64);
        metrics
            .map_capacity
            .with_label_values(&[usage.map])
            .set(usage.capacity as f64);
    }
    for growth in &stats.map_growth {
        metrics
            .map_growths_total
            .with_label_values(&[growth.map])
            .inc();
    }
    if !stats.map_growth.is_empty() {
        events.emit(NodeEvent::MapGrown {
            maps: stats
                .map_growth
                .iter()
                .map(|g| (g.map, g.from, g.to))
                .collect(),
        });
    }
    metrics
        .services_not_programmed
        .set(i64::try_from(stats.not_programmed).unwrap_or(i64::MAX));
    if stats.not_programmed == 0 {
        if short_before {
            info!("every service is programmed again: the maps have room");
        }
        return;
    }
    let maps: Vec<String> = stats
        .full_maps
        .iter()
        .map(|m| format!("{} (capacity {}, {})", m.map, m.capacity, m.setting))
        .collect();
    warn!(
        not_programmed = stats.not_programmed,
        full_maps = %maps.join(", "),
        services = %stats.not_programmed_examples.join(", "),
        "BPF maps full: services not programmed (the rest is, and they are retried at every \
         sync); raise the setting named for each map and restart the agent"
    );
    events.emit(NodeEvent::MapFull {
        services: stats.not_programmed,
        examples: stats.not_programmed_examples.clone(),
        maps: stats.full_maps.clone(),
    });
}
