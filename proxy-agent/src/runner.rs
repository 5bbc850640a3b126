// SPDX-License-Identifier: Apache-2.0
//! When to sync: upstream's BoundedFrequencyRunner semantics as a pure state machine.
//!
//! - Requests (a Service or EndpointSlice changed) are coalesced: runs are at least
//!   `min_interval` apart, so a burst of changes costs one sync.
//! - A run happens at least every `max_interval` (kube-proxy's syncPeriod); those periodic runs
//!   are full syncs, as upstream's proxiers do a full resync every syncPeriod.
//! - A failed run is retried with exponential backoff (from `min_interval`, at least 1 s, up
//!   to `max_interval`) and the next run, whenever it happens, is a full sync.
//!
//! The machine never reads a clock: every call takes `now`, which makes it testable with any
//! sequence of instants (the injected clock). The agent's single event loop owns it, asks
//! [`SyncRunner::next_deadline`] how long it may sleep, and calls [`SyncRunner::due`] when it
//! wakes.

use std::time::{Duration, Instant};

/// What kind of run is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunRequest {
    /// Rebuild everything rather than only what changed.
    pub full: bool,
}

#[derive(Debug)]
pub struct SyncRunner {
    min_interval: Duration,
    max_interval: Duration,
    last_run: Option<Instant>,
    /// Changes are waiting for a run.
    pending: bool,
    /// A retry after a failure is scheduled at this instant.
    retry_at: Option<Instant>,
    /// The next run must be a full one (first run, after a failure, periodic).
    full_needed: bool,
    consecutive_failures: u32,
    /// When the first still-pending change was requested (for the queued-timestamp metric
    /// and healthz).
    pending_since: Option<Instant>,
}

impl SyncRunner {
    pub fn new(min_interval: Duration, max_interval: Duration) -> Self {
        // A zero max interval would spin; upstream validation forbids it, keep a floor anyway.
        let max_interval = max_interval.max(Duration::from_millis(1));
        Self {
            min_interval: min_interval.min(max_interval),
            max_interval,
            last_run: None,
            pending: false,
            retry_at: None,
            full_needed: true,
            consecutive_failures: 0,
            pending_since: None,
        }
    }

    /// Something changed; a run should follow, no sooner than `min_interval` after the last.
    pub fn request(&mut self, now: Instant) {
        if !self.pending {
            self.pending = true;
            self.pending_since = Some(now);
        }
    }

    /// Forces the next run to be a full sync (e.g. the dataplane was found flushed).
    pub fn request_full(&mut self, now: Instant) {
        self.full_needed = true;
        self.request(now);
    }

    /// When the loop must wake up next. `None` before the first request: nothing runs
    /// until the initial state is known (kube-proxy waits for its informers to sync).
    pub fn next_deadline(&self) -> Option<Instant> {
        let last = match self.last_run {
            Some(last) => last,
            None => return self.pending.then_some(self.pending_since?),
        };
        let mut deadline = last + self.max_interval;
        if self.pending {
            deadline = deadline.min(last + self.min_interval);
        }
        if let Some(retry) = self.retry_at {
            deadline = deadline.min(retry.max(last + self.min_interval));
        }
        Some(deadline)
    }

    /// If a run is due at `now`, returns what kind; the caller must then run the sync and
    /// report with [`SyncRunner::completed`].
    pub fn due(&self, now: Instant) -> Option<RunRequest> {
        let deadline = self.next_deadline()?;
        if now < deadline {
            return None;
        }
        let periodic = self
            .last_run
            .is_some_and(|last| now >= last + self.max_interval);
        Some(RunRequest {
            full: self.full_needed || periodic,
        })
    }

    /// Records a finished run started at `started`.
    pub fn completed(&mut self, started: Instant, succeeded: bool) {
        self.last_run = Some(started);
        self.pending = false;
        self.pending_since = None;
        if succeeded {
            self.consecutive_failures = 0;
            self.retry_at = None;
            self.full_needed = false;
        } else {
            self.consecutive_failures = self.consecutive_failures.saturating_add(1);
            self.retry_at = Some(started + self.backoff());
            self.full_needed = true;
        }
    }

    /// Whether changes are waiting (for healthz: an update was queued and not yet applied).
    pub fn pending_since(&self) -> Option<Instant> {
        self.pending_since
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    fn backoff(&self) -> Duration {
        let base = self.min_interval.max(Duration::from_secs(1));
        let exp = self.consecutive_failures.saturating_sub(1).min(16);
        base.saturating_mul(1u32 << exp).min(self.max_interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(30);

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn nothing_runs_before_the_first_request() {
        let t0 = Instant::now();
        let r = SyncRunner::new(MIN, MAX);
        assert_eq!(r.next_deadline(), None);
        assert_eq!(r.due(at(t0, 100_000)), None);
    }

    #[test]
    fn first_run_is_immediate_and_full() {
        let t0 = Instant::now();
        let mut r = SyncRunner::new(MIN, MAX);
        r.request(t0);
        assert_eq!(r.next_deadline(), Some(t0));
        assert_eq!(r.due(t0), Some(RunRequest { full: true }));
        r.completed(t0, true);
        assert_eq!(r.pending_since(), None);
    }

    #[test]
    fn bursts_of_changes_are_coalesced_to_min_interval() {
        let t0 = Instant::now();
        let mut r = SyncRunner::new(MIN, MAX);
        r.request(t0);
        r.completed(t0, true);
        // Three changes within 300 ms after the run.
        r.request(at(t0, 100));
        r.request(at(t0, 200));
        r.request(at(t0, 300));
        assert_eq!(r.pending_since(), Some(at(t0, 100)));
        assert_eq!(r.due(at(t0, 999)), None);
        assert_eq!(r.next_deadline(), Some(at(t0, 1000)));
        assert_eq!(r.due(at(t0, 1000)), Some(RunRequest { full: false }));
        r.completed(at(t0, 1000), true);
        // One run served all three: nothing pending, next wake-up is the periodic one.
        assert_eq!(r.next_deadline(), Some(at(t0, 31_000)));
    }

    #[test]
    fn a_change_long_after_the_last_run_runs_at_once() {
        let t0 = Instant::now();
        let mut r = SyncRunner::new(MIN, MAX);
        r.request(t0);
        r.completed(t0, true);
        r.request(at(t0, 5_000));
        assert_eq!(r.due(at(t0, 5_000)), Some(RunRequest { full: false }));
    }

    #[test]
    fn periodic_runs_are_full_syncs() {
        let t0 = Instant::now();
        let mut r = SyncRunner::new(MIN, MAX);
        r.request(t0);
        r.completed(t0, true);
        assert_eq!(r.due(at(t0, 29_999)), None);
        assert_eq!(r.due(at(t0, 30_000)), Some(RunRequest { full: true }));
        r.completed(at(t0, 30_000), true);
        assert_eq!(r.next_deadline(), Some(at(t0, 60_000)));
    }

    #[test]
    fn failures_retry_with_backoff_and_force_a_full_sync() {
        let t0 = Instant::now();
        let mut r = SyncRunner::new(MIN, MAX);
        r.request(t0);
        r.completed(t0, true);
        r.request(at(t0, 2_000));
        assert_eq!(r.due(at(t0, 2_000)), Some(RunRequest { full: false }));
        r.completed(at(t0, 2_000), false);
        assert_eq!(r.consecutive_failures(), 1);
        // Retry after 1 s, as a full sync.
        assert_eq!(r.next_deadline(), Some(at(t0, 3_000)));
        assert_eq!(r.due(at(t0, 3_000)), Some(RunRequest { full: true }));
        r.completed(at(t0, 3_000), false);
        // Second failure: 2 s.
        assert_eq!(r.next_deadline(), Some(at(t0, 5_000)));
        r.completed(at(t0, 5_000), false);
        assert_eq!(r.next_deadline(), Some(at(t0, 9_000)));
        // Success resets the backoff and the full-sync flag.
        assert_eq!(r.due(at(t0, 9_000)), Some(RunRequest { full: true }));
        r.completed(at(t0, 9_000), true);
        assert_eq!(r.consecutive_failures(), 0);
        r.request(at(t0, 20_000));
        assert_eq!(r.due(at(t0, 20_000)), Some(RunRequest { full: false }));
    }

    #[test]
    fn backoff_is_capped_at_the_sync_period() {
        let t0 = Instant::now();
        let mut r = SyncRunner::new(MIN, Duration::from_secs(10));
        r.request(t0);
        let mut t = t0;
        let mut gaps = Vec::new();
        for _ in 0..6 {
            r.completed(t, false);
            let next = r.next_deadline().expect("a retry is scheduled");
            gaps.push((next - t).as_secs());
            t = next;
        }
        assert_eq!(gaps, vec![1, 2, 4, 8, 10, 10]);
    }

    #[test]
    fn a_requested_full_sync_is_full() {
        let t0 = Instant::now();
        let mut r = SyncRunner::new(MIN, MAX);
        r.request(t0);
        r.completed(t0, true);
        r.request_full(at(t0, 4_000));
        assert_eq!(r.due(at(t0, 4_000)), Some(RunRequest { full: true }));
    }

    #[test]
    fn zero_min_interval_runs_every_change_immediately() {
        let t0 = Instant::now();
        let mut r = SyncRunner::new(Duration::ZERO, MAX);
        r.request(t0);
        r.completed(t0, true);
        r.request(at(t0, 1));
        assert_eq!(r.due(at(t0, 1)), Some(RunRequest { full: false }));
    }
}
