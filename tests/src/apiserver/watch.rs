// SPDX-License-Identifier: Apache-2.0
//! The body of a watch response: newline-delimited JSON watch events, periodic
//! BOOKMARKs, the end at `timeoutSeconds`, and an abrupt end when the test drops it.

use std::{collections::VecDeque, io, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::Stream;
use serde_json::{Value, json};
use tokio::{
    sync::mpsc::UnboundedReceiver,
    time::{Instant, Interval, MissedTickBehavior, interval_at, sleep_until},
};

use super::{
    Shared,
    resources::ResourceKind,
    store::{WatchEvent, WatchFeed},
};

/// How the client asked to watch.
#[derive(Debug, Clone, Copy)]
pub struct WatchOptions {
    pub bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Duration,
    pub bookmark_interval: Duration,
}

/// Annotation on the BOOKMARK that ends the initial events of a streaming list.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

fn line(value: &Value) -> Bytes {
    let mut text = value.to_string();
    text.push('\n');
    Bytes::from(text)
}

fn bookmark(resource: &ResourceKind, rv: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({INITIAL_EVENTS_END: "true"});
    }
    line(&json!({
        "type": "BOOKMARK",
        "object": {"kind": resource.kind, "apiVersion": resource.api_version(), "metadata": metadata}
    }))
}

fn object_rv(event: &WatchEvent) -> u64 {
    super::object::meta_str(&event.object, "resourceVersion")
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

struct WatchState {
    shared: Arc<Shared>,
    resource: &'static ResourceKind,
    options: WatchOptions,
    pending: VecDeque<Bytes>,
    live: UnboundedReceiver<WatchEvent>,
    deadline: Instant,
    ticker: Interval,
    /// The newest resourceVersion this client has been sent.
    sent_rv: u64,
    finished: bool,
}

impl WatchState {
    fn push_event(&mut self, event: &WatchEvent) {
        self.sent_rv = self.sent_rv.max(object_rv(event));
        self.pending.push_back(line(&event.to_json()));
    }

    /// Queues everything already committed, then a bookmark at the newest RV the
    /// client is now guaranteed to have seen every relevant event up to. Reading the
    /// store's RV before draining makes that guarantee hold: events are queued
    /// under the store lock, so all events up to that RV are in the channel.
    fn push_bookmark(&mut self) {
        let committed = self.shared.current_rv();
        while let Ok(event) = self.live.try_recv() {
            self.push_event(&event);
        }
        self.sent_rv = self.sent_rv.max(committed);
        self.pending
            .push_back(bookmark(self.resource, self.sent_rv, false));
        self.shared.count_bookmark();
    }

    async fn next_item(mut self) -> Option<(Result<Bytes, io::Error>, Self)> {
        loop {
            if let Some(line) = self.pending.pop_front() {
                return Some((Ok(line), self));
            }
            if self.finished {
                return None;
            }
            tokio::select! {
                biased;
                event = self.live.recv() => match event {
                    Some(event) => self.push_event(&event),
                    None => {
                        // The test dropped the watch: end the body with an error so the
                        // connection is cut mid-stream, as a network failure would.
                        self.finished = true;
                        let err = io::Error::new(io::ErrorKind::ConnectionAborted, "watch dropped by the test API server");
                        return Some((Err(err), self));
                    }
                },
                () = sleep_until(self.deadline) => {
                    if self.options.bookmarks {
                        self.push_bookmark();
                    }
                    self.finished = true;
                }
                _ = self.ticker.tick(), if self.options.bookmarks => self.push_bookmark(),
            }
        }
    }
}

/// The streaming body for an established watch.
pub fn event_stream(
    shared: Arc<Shared>,
    resource: &'static ResourceKind,
    feed: WatchFeed,
    options: WatchOptions,
) -> impl Stream<Item = Result<Bytes, io::Error>> + Send + 'static {
    let now = Instant::now();
    let interval = options.bookmark_interval.max(Duration::from_millis(10));
    let mut ticker = interval_at(now + interval, interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut state = WatchState {
        shared,
        resource,
        options,
        pending: VecDeque::new(),
        live: feed.live,
        deadline: now + options.timeout,
        ticker,
        sent_rv: 0,
        finished: false,
    };
    for event in &feed.initial {
        state.push_event(event);
    }
    if options.send_initial_events && options.bookmarks {
        state.sent_rv = state.sent_rv.max(feed.start_rv);
        state
            .pending
            .push_back(bookmark(resource, feed.start_rv, true));
        state.shared.count_bookmark();
    }
    futures::stream::unfold(state, WatchState::next_item)
}

/// The body for a watch that cannot start: a single ERROR event carrying `status`,
/// which is how the apiserver reports an expired resourceVersion to a watch.
pub fn error_stream(
    status: Value,
) -> impl Stream<Item = Result<Bytes, io::Error>> + Send + 'static {
    futures::stream::once(async move { Ok(line(&json!({"type": "ERROR", "object": status}))) })
}
