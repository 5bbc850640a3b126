// SPDX-License-Identifier: Apache-2.0
//! Kubernetes Events on this Node for what an operator must see without reading the
//! agent's log: a proxy-mode fallback, objects the model refused, and services left out
//! because a BPF map is full (`kubectl describe node` shows them). Publishing never blocks the event loop: events go through a bounded
//! channel to a task that posts them, and a rate limiter keeps a flapping object or a
//! flood of bad objects from flooding the API server (as client-go's spam filter does).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::{
    model::{InvalidObject, ObjectKind},
    proxier::FullMap,
};

/// The reporting controller named in every event.
pub const REPORTING_CONTROLLER: &str = "kube-proxy-ebpf";
/// events.k8s.io/v1 refuses notes longer than this.
const NOTE_MAX_BYTES: usize = 1024;
/// Events waiting to be posted; past this, new ones are dropped (and logged at debug).
const QUEUE: usize = 256;

/// Something worth an Event on the Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeEvent {
    /// The requested mode could not run; `running` runs instead.
    ModeFallback {
        requested: String,
        running: String,
        reason: String,
    },
    /// An object the model refused; it contributes nothing, the rest still syncs.
    ObjectRejected(InvalidObject),
    /// Services left out of the dataplane because maps are full; the rest is programmed.
    MapFull {
        /// How many services are left out.
        services: usize,
        /// The first few of them.
        examples: Vec<String>,
        /// Each full map, its capacity and the setting that raises it.
        maps: Vec<FullMap>,
    },
    /// BPF maps replaced by bigger ones under the running programs, so that a sync fits
    /// (no restart, no lost entry): news, not a problem.
    MapGrown {
        /// Each grown map: its name and capacity before and after.
        maps: Vec<(&'static str, usize, usize)>,
    },
    /// Another proxy's dataplane (kube-proxy's chains or tables) is on the node beside ours.
    ForeignProxy {
        /// What was found.
        found: Vec<String>,
    },
}

impl NodeEvent {
    /// The event's machine-readable reason (CamelCase, as Kubernetes reasons are).
    pub fn reason(&self) -> &'static str {
        match self {
            NodeEvent::ModeFallback { .. } => "ProxyModeFallback",
            NodeEvent::ObjectRejected(o) => match o.kind {
                ObjectKind::Service => "InvalidService",
                ObjectKind::EndpointSlice => "InvalidEndpointSlice",
                ObjectKind::Node => "InvalidNode",
                ObjectKind::ServiceCidr => "InvalidServiceCIDR",
            },
            NodeEvent::MapFull { .. } => "MapFull",
            NodeEvent::MapGrown { .. } => "MapGrown",
            NodeEvent::ForeignProxy { .. } => "ForeignProxyDetected",
        }
    }

    /// Normal for news, Warning for what needs an operator.
    pub fn event_type(&self) -> EventType {
        match self {
            NodeEvent::MapGrown { .. } => EventType::Normal,
            _ => EventType::Warning,
        }
    }

    /// What the agent was doing when this happened.
    pub fn action(&self) -> &'static str {
        match self {
            NodeEvent::ModeFallback { .. } => "StartProxier",
            NodeEvent::ObjectRejected(_)
            | NodeEvent::MapFull { .. }
            | NodeEvent::MapGrown { .. }
            | NodeEvent::ForeignProxy { .. } => "Sync",
        }
    }

    /// The human-readable note, cut to the API's limit on a character boundary.
    pub fn note(&self) -> String {
        let note = match self {
            NodeEvent::ModeFallback {
                requested,
                running,
                reason,
            } => format!(
                "proxy mode {requested} cannot run on this node ({reason}); running {running} mode instead"
            ),
            NodeEvent::ObjectRejected(o) => format!(
                "{} {}/{} ignored: {}",
                o.kind, o.namespace, o.name, o.reason
            ),
            NodeEvent::MapFull {
                services,
                examples,
                maps,
            } => {
                let maps: Vec<String> = maps
                    .iter()
                    .map(|m| format!("{} (capacity {}, {})", m.map, m.capacity, m.setting))
                    .collect();
                let more = match services.saturating_sub(examples.len()) {
                    0 => String::new(),
                    n => format!(" and {n} more"),
                };
                format!(
                    "{services} services not programmed, BPF maps full: {}; not programmed: \
                     {}{more}. Raise the capacities and restart the agent",
                    maps.join(", "),
                    examples.join(", ")
                )
            }
            NodeEvent::MapGrown { maps } => {
                let maps: Vec<String> = maps
                    .iter()
                    .map(|(map, from, to)| format!("{map} {from} -> {to}"))
                    .collect();
                format!(
                    "BPF maps grown without a restart to fit the services: {}",
                    maps.join(", ")
                )
            }
            NodeEvent::ForeignProxy { found } => format!(
                "another proxy is programming this node: {} (kube-proxy? two proxies on one \
                 node fight over its rules; stop the other one)",
                found.join(", ")
            ),
        };
        truncate(note, NOTE_MAX_BYTES)
    }

    /// The object the event is about besides the Node (the refused object).
    pub fn related(&self) -> Option<ObjectReference> {
        let NodeEvent::ObjectRejected(o) = self else {
            return None;
        };
        let (api_version, kind) = match o.kind {
            ObjectKind::Service => ("v1", "Service"),
            ObjectKind::EndpointSlice => ("discovery.k8s.io/v1", "EndpointSlice"),
            ObjectKind::Node => ("v1", "Node"),
            ObjectKind::ServiceCidr => ("networking.k8s.io/v1", "ServiceCIDR"),
        };
        Some(ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
            namespace: (!o.namespace.is_empty()).then(|| o.namespace.clone()),
            name: Some(o.name.clone()),
            ..Default::default()
        })
    }

    /// Events with the same key are the same news: the rate limiter counts them together.
    fn key(&self) -> String {
        match self {
            NodeEvent::ModeFallback { requested, .. } => format!("fallback/{requested}"),
            NodeEvent::ObjectRejected(o) => {
                format!("{}/{}/{}", o.kind, o.namespace, o.name)
            }
            // The news is that maps are full, whichever services it hits this time.
            NodeEvent::MapFull { .. } => "map-full".into(),
            // Each growth is news of its own: the sizes tell them apart.
            NodeEvent::MapGrown { maps } => {
                let sizes: Vec<String> =
                    maps.iter().map(|(m, _, to)| format!("{m}={to}")).collect();
                format!("map-grown/{}", sizes.join(","))
            }
            NodeEvent::ForeignProxy { found } => format!("foreign-proxy/{}", found.join(",")),
        }
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max.saturating_sub(3);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// Which events may be posted now: one per key per `per_key` interval, and overall a token
/// bucket of `burst` events refilled one every `refill` (client-go's spam filter has the
/// same shape: a burst, then a slow trickle).
#[derive(Debug)]
pub struct EventRateLimiter {
    per_key: Duration,
    burst: u32,
    refill: Duration,
    tokens: u32,
    last_refill: Instant,
    last_by_key: HashMap<String, Instant>,
}

impl EventRateLimiter {
    pub fn new(per_key: Duration, burst: u32, refill: Duration, now: Instant) -> Self {
        Self {
            per_key,
            burst,
            refill,
            tokens: burst,
            last_refill: now,
            last_by_key: HashMap::new(),
        }
    }

    /// The agent's limits: the same news at most every 5 minutes; 25 events at once, then
    /// one every 10 seconds.
    pub fn standard(now: Instant) -> Self {
        Self::new(Duration::from_secs(300), 25, Duration::from_secs(10), now)
    }

    /// Whether an event with this key may be posted at `now` (and counts it if so).
    pub fn allow(&mut self, key: &str, now: Instant) -> bool {
        self.refill_tokens(now);
        if let Some(last) = self.last_by_key.get(key)
            && now.saturating_duration_since(*last) < self.per_key
        {
            return false;
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        self.last_by_key.insert(key.to_string(), now);
        // Forget keys whose interval has passed, so the map stays as small as the news.
        let per_key = self.per_key;
        self.last_by_key
            .retain(|_, t| now.saturating_duration_since(*t) < per_key);
        true
    }

    fn refill_tokens(&mut self, now: Instant) {
        if self.refill.is_zero() {
            self.tokens = self.burst;
            return;
        }
        let elapsed = now.saturating_duration_since(self.last_refill);
        let earned = (elapsed.as_nanos() / self.refill.as_nanos()) as u64;
        if earned > 0 {
            let tokens = u64::from(self.tokens).saturating_add(earned);
            self.tokens = u32::try_from(tokens.min(u64::from(self.burst))).unwrap_or(self.burst);
            self.last_refill += self.refill * u32::try_from(earned).unwrap_or(u32::MAX);
        }
    }
}

/// Where the event loop sends events. Without an API server (`--source`) it only logs.
#[derive(Clone, Debug, Default)]
pub struct EventSink {
    tx: Option<mpsc::Sender<NodeEvent>>,
}

impl EventSink {
    /// A sink that posts nothing (no API server).
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Starts the task that posts events about `node_name` through `client`.
    pub fn spawn(client: Client, node_name: &str) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let reporter = Reporter {
            controller: REPORTING_CONTROLLER.into(),
            instance: Some(format!("{REPORTING_CONTROLLER}-{node_name}")),
        };
        let recorder = Recorder::new(client, reporter);
        tokio::spawn(post_events(rx, recorder, node_reference(node_name)));
        Self { tx: Some(tx) }
    }

    /// Queues an event; never waits. A full queue drops it (the log has it anyway).
    pub fn emit(&self, event: NodeEvent) {
        let Some(tx) = &self.tx else {
            return;
        };
        if let Err(e) = tx.try_send(event) {
            debug!(error = %e, "event queue full or closed; event dropped");
        }
    }
}

/// The Node as events refer to it. Like upstream kube-proxy, the UID is the node name
/// (the agent may not have seen the Node object yet), and events about this cluster-scoped
/// object live in the `default` namespace.
pub fn node_reference(node_name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node_name.into()),
        uid: Some(node_name.into()),
        namespace: Some("default".into()),
        ..Default::default()
    }
}

async fn post_events(mut rx: mpsc::Receiver<NodeEvent>, recorder: Recorder, node: ObjectReference) {
    let mut limiter = EventRateLimiter::standard(Instant::now());
    while let Some(event) = rx.recv().await {
        if !limiter.allow(&event.key(), Instant::now()) {
            debug!(reason = event.reason(), "event rate-limited");
            continue;
        }
        let ev = Event {
            type_: event.event_type(),
            reason: event.reason().into(),
            note: Some(event.note()),
            action: event.action().into(),
            secondary: event.related(),
        };
        if let Err(e) = recorder.publish(&ev, &node).await {
            warn!(reason = event.reason(), error = %e, "cannot post an event on the Node");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(name: &str, reason: &str) -> NodeEvent {
        NodeEvent::ObjectRejected(InvalidObject::new(ObjectKind::Service, "ns1", name, reason))
    }

    #[test]
    fn rejected_objects_name_the_object_and_why() {
        let e = rejected("svc1", "clusterIP \"10.0.0.x\" is not an IP address");
        assert_eq!(e.reason(), "InvalidService");
        assert_eq!(
            e.note(),
            "Service ns1/svc1 ignored: clusterIP \"10.0.0.x\" is not an IP address"
        );
        let related = e.related().unwrap();
        assert_eq!(related.kind.as_deref(), Some("Service"));
        assert_eq!(related.namespace.as_deref(), Some("ns1"));
        assert_eq!(related.name.as_deref(), Some("svc1"));
        let slice = NodeEvent::ObjectRejected(InvalidObject::new(
            ObjectKind::EndpointSlice,
            "ns1",
            "s-1",
            "x",
        ));
        assert_eq!(slice.reason(), "InvalidEndpointSlice");
        assert_eq!(
            slice.related().unwrap().api_version.as_deref(),
            Some("discovery.k8s.io/v1")
        );
    }

    #[test]
    fn fallback_note_says_what_runs_instead() {
        let e = NodeEvent::ModeFallback {
            requested: "ipvs".into(),
            running: "iptables".into(),
            reason: "the kernel has no IPVS support".into(),
        };
        assert_eq!(e.reason(), "ProxyModeFallback");
        assert_eq!(
            e.note(),
            "proxy mode ipvs cannot run on this node (the kernel has no IPVS support); running iptables mode instead"
        );
        assert!(e.related().is_none());
    }

    #[test]
    fn full_maps_name_the_maps_their_settings_and_the_first_services() {
        let e = NodeEvent::MapFull {
            services: 7,
            examples: vec!["ns1/svc-c".into(), "ns1/svc-d".into()],
            maps: vec![FullMap {
                map: "SVC4_V2",
                capacity: 8,
                setting: "ebpf.mapSizes.services",
            }],
        };
        assert_eq!(e.reason(), "MapFull");
        assert_eq!(e.event_type(), EventType::Warning);
        assert_eq!(e.action(), "Sync");
        assert!(e.related().is_none());
        assert_eq!(
            e.note(),
            "7 services not programmed, BPF maps full: SVC4_V2 (capacity 8, \
             ebpf.mapSizes.services); not programmed: ns1/svc-c, ns1/svc-d and 5 more. Raise \
             the capacities and restart the agent"
        );
    }

    #[test]
    fn grown_maps_are_normal_news_each_growth_its_own() {
        let first = NodeEvent::MapGrown {
            maps: vec![
                ("SVC4_V2", 65_536, 131_072),
                ("REV_NAT4_V2", 65_536, 131_072),
            ],
        };
        assert_eq!(first.reason(), "MapGrown");
        assert_eq!(first.event_type(), EventType::Normal);
        assert_eq!(first.action(), "Sync");
        assert_eq!(
            first.note(),
            "BPF maps grown without a restart to fit the services: SVC4_V2 65536 -> 131072, \
             REV_NAT4_V2 65536 -> 131072"
        );
        let second = NodeEvent::MapGrown {
            maps: vec![("SVC4_V2", 131_072, 262_144)],
        };
        assert_ne!(first.key(), second.key(), "the rate limiter keeps both");
    }

    #[test]
    fn long_notes_are_cut_on_a_character_boundary() {
        let e = rejected("svc1", &"é".repeat(2000));
        let note = e.note();
        assert!(note.len() <= NOTE_MAX_BYTES);
        assert!(note.ends_with("..."));
    }

    #[test]
    fn the_same_news_is_posted_once_per_interval() {
        let t0 = Instant::now();
        let mut l =
            EventRateLimiter::new(Duration::from_secs(300), 25, Duration::from_secs(10), t0);
        assert!(l.allow("a", t0));
        assert!(!l.allow("a", t0 + Duration::from_secs(299)));
        assert!(l.allow("b", t0 + Duration::from_secs(1)));
        assert!(l.allow("a", t0 + Duration::from_secs(300)));
    }

    #[test]
    fn a_flood_gets_a_burst_then_a_trickle() {
        let t0 = Instant::now();
        let mut l = EventRateLimiter::new(Duration::from_secs(300), 3, Duration::from_secs(10), t0);
        let allowed = (0..10).filter(|i| l.allow(&format!("k{i}"), t0)).count();
        assert_eq!(allowed, 3);
        assert!(!l.allow("k10", t0 + Duration::from_secs(9)));
        assert!(l.allow("k11", t0 + Duration::from_secs(10)));
        assert!(!l.allow("k12", t0 + Duration::from_secs(11)));
        // Tokens never pile up past the burst.
        let later = t0 + Duration::from_secs(1000);
        let allowed = (0..10)
            .filter(|i| l.allow(&format!("late{i}"), later))
            .count();
        assert_eq!(allowed, 3);
    }
}
