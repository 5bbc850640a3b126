// SPDX-License-Identifier: Apache-2.0
//! Client-side rate limiting of API requests, as `clientConnection.qps` and `.burst`
//! (`--kube-api-qps`, `--kube-api-burst`) ask: a token bucket that starts full with `burst`
//! tokens and refills at `qps` per second. A request that finds the bucket empty waits for
//! its token instead of failing, as client-go's limiter does. Each request counts once;
//! a watch counts when it starts, not for the events it streams.
//!
//! Written here rather than taken from a crate: tower's `RateLimit` is a fixed window (it
//! allows twice the burst across a window's edge), and governor keeps its own clock, so the
//! waits could not be tested under tokio's paused time. The bucket is a few lines.

use std::{
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// Tokens refilled continuously; a reservation may drive the count below zero, and the
/// request then waits until its token is due.
#[derive(Debug)]
pub struct TokenBucket {
    per_second: f64,
    capacity: f64,
    tokens: f64,
    refilled_at: Instant,
}

impl TokenBucket {
    /// `None` when `qps` does not limit anything (not positive), as client-go builds no
    /// limiter then. A burst below one still lets one request through at a time.
    pub fn new(qps: f32, burst: i32, now: Instant) -> Option<Self> {
        if !(qps.is_finite() && qps > 0.0) {
            return None;
        }
        let capacity = f64::from(burst.max(1));
        Some(Self {
            per_second: f64::from(qps),
            capacity,
            tokens: capacity,
            refilled_at: now,
        })
    }

    /// Takes one token and returns how long its request has to wait for it.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity);
        self.refilled_at = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.per_second)
        }
    }
}

/// Puts a [`TokenBucket`] in front of the API client's HTTP stack.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<TokenBucket>>,
}

impl RateLimitLayer {
    pub fn new(bucket: TokenBucket) -> Self {
        Self {
            bucket: Arc::new(Mutex::new(bucket)),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            state: Reservation::None,
        }
    }
}

enum Reservation {
    /// No token taken for the next request yet.
    None,
    /// A token is taken; the request may go once the sleep ends.
    Waiting(Pin<Box<Sleep>>),
    /// The token is due: the next `call` spends it.
    Ready,
}

pub struct RateLimited<S> {
    inner: S,
    bucket: Arc<Mutex<TokenBucket>>,
    state: Reservation,
}

impl<S, Request> Service<Request> for RateLimited<S>
where
    S: Service<Request>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            match &mut self.state {
                Reservation::None => {
                    let now = Instant::now();
                    // A poisoned lock only means another request panicked while holding it;
                    // the bucket's numbers are still usable.
                    let wait = self
                        .bucket
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .reserve(now);
                    self.state = if wait.is_zero() {
                        Reservation::Ready
                    } else {
                        Reservation::Waiting(Box::pin(tokio::time::sleep_until(now + wait)))
                    };
                }
                Reservation::Waiting(sleep) => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.state = Reservation::Ready;
                }
                Reservation::Ready => return self.inner.poll_ready(cx),
            }
        }
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.state = Reservation::None;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::ServiceExt;

    use super::*;

    /// The times, after the start, at which `count` requests went through a limiter of
    /// `qps` and `burst`, sent one after another as fast as it lets them.
    async fn send_times(qps: f32, burst: i32, count: usize) -> Vec<Duration> {
        let start = Instant::now();
        let bucket = TokenBucket::new(qps, burst, start).expect("a limiting qps");
        let mut service =
            RateLimitLayer::new(bucket).layer(tower::service_fn(|_: ()| async move {
                Ok::<_, Infallible>(Instant::now())
            }));
        let mut times = Vec::new();
        for _ in 0..count {
            let sent = service.ready().await.expect("ready").call(()).await;
            times.push(sent.expect("sent").duration_since(start));
        }
        times
    }

    fn millis(times: &[Duration]) -> Vec<u128> {
        times.iter().map(Duration::as_millis).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn burst_goes_at_once_then_qps_paces_the_rest() {
        // kube-proxy's defaults: 5 per second, bursts of 10.
        let times = send_times(5.0, 10, 13).await;
        assert_eq!(
            millis(&times),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 200, 400, 600]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn fractional_qps_and_a_burst_of_one() {
        let times = send_times(0.5, 1, 3).await;
        assert_eq!(millis(&times), [0, 2000, 4000]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_bucket_refills_up_to_the_burst_only() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(2.0, 3, start).expect("limiting");
        for _ in 0..3 {
            assert_eq!(bucket.reserve(start), Duration::ZERO);
        }
        // A minute idle refills three tokens, not 120.
        let later = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(bucket.reserve(later), Duration::ZERO);
        }
        assert_eq!(bucket.reserve(later), Duration::from_millis(500));
    }

    #[test]
    fn no_limit_without_a_positive_qps() {
        let now = Instant::now();
        assert!(TokenBucket::new(0.0, 10, now).is_none());
        assert!(TokenBucket::new(-1.0, 10, now).is_none());
        assert!(TokenBucket::new(f32::NAN, 10, now).is_none());
        assert!(TokenBucket::new(0.1, 0, now).is_some());
    }
}
