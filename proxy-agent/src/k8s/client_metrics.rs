// SPDX-License-Identifier: Apache-2.0
//! client-go's `rest_client_*` families, which upstream kube-proxy exposes (component-base
//! metrics/prometheus/restclient) and the kube-proxy dashboards chart: requests by code,
//! method and host; request latency, request and response sizes and the client-side rate
//! limiter's wait by verb and host, with client-go's buckets. A layer over the API client
//! records them ([`RestClientMetricsLayer`]); the families are process-wide, as client-go's
//! are, and every registry built by `serve::Metrics` shows them.
//!
//! As client-go does: latency runs until the response's headers; a response's size is its
//! body's, read to the end (not recorded for watches, whose body is the event stream); the
//! rate limiter's wait is recorded for each request when requests are rate-limited. The
//! families of client-go's features this client does not have (exec credential plugins, a
//! transport cache) are there with their idle values: the exec plugin's certificate TTL
//! `+Inf`, no rotations, no cached transports, each client's transport created
//! uncacheable.

use std::{
    sync::LazyLock,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use futures::future::BoxFuture;
use http_body_util::BodyExt as _;
use kube::client::DynBody;
use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry,
};
use tower::{Layer, Service};

/// client-go's latency buckets (request and rate limiter).
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];
/// client-go's size buckets (request and response).
const SIZE_BUCKETS: &[f64] = &[
    64.0, 256.0, 512.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0,
];
/// client-go's exec plugin certificate rotation buckets: 10 minutes to 4 years.
const ROTATION_BUCKETS: &[f64] = &[
    600.0,
    1800.0,
    3600.0,
    14400.0,
    86400.0,
    604800.0,
    2592000.0,
    7776000.0,
    15552000.0,
    31104000.0,
    124416000.0,
];

struct Families {
    requests: IntCounterVec,
    latency: HistogramVec,
    request_size: HistogramVec,
    response_size: HistogramVec,
    rate_limiter: HistogramVec,
    exec_plugin_ttl: Gauge,
    exec_plugin_rotation: Histogram,
    transport_cache_entries: IntGauge,
    transport_creates: IntCounterVec,
    transport_cert_rotation_gc: IntCounter,
}

fn histogram(name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .unwrap_or_else(|e| unreachable!("{name} is a valid histogram: {e}"))
}

static FAMILIES: LazyLock<Families> = LazyLock::new(|| {
    let counter = |name: &str, help: &str, labels: &[&str]| {
        IntCounterVec::new(Opts::new(name, help), labels)
            .unwrap_or_else(|e| unreachable!("{name} is a valid counter: {e}"))
    };
    let exec_plugin_ttl = Gauge::new(
        "rest_client_exec_plugin_ttl_seconds",
        "Gauge of the shortest TTL (time-to-live) of the client certificate(s) managed by \
         the auth exec plugin; +INF when no exec plugin manages certificates.",
    )
    .unwrap_or_else(|e| unreachable!("a valid gauge: {e}"));
    exec_plugin_ttl.set(f64::INFINITY);
    Families {
        requests: counter(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            &["code", "method", "host"],
        ),
        latency: histogram(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host.",
            LATENCY_BUCKETS,
            &["verb", "host"],
        ),
        request_size: histogram(
            "rest_client_request_size_bytes",
            "Request size in bytes. Broken down by verb and host.",
            SIZE_BUCKETS,
            &["verb", "host"],
        ),
        response_size: histogram(
            "rest_client_response_size_bytes",
            "Response size in bytes. Broken down by verb and host.",
            SIZE_BUCKETS,
            &["verb", "host"],
        ),
        rate_limiter: histogram(
            "rest_client_rate_limiter_duration_seconds",
            "Client side rate limiter latency in seconds. Broken down by verb, and host.",
            LATENCY_BUCKETS,
            &["verb", "host"],
        ),
        exec_plugin_ttl,
        exec_plugin_rotation: Histogram::with_opts(
            HistogramOpts::new(
                "rest_client_exec_plugin_certificate_rotation_age",
                "Histogram of the number of seconds the last auth exec plugin client \
                 certificate lived before being rotated; empty without exec plugins.",
            )
            .buckets(ROTATION_BUCKETS.to_vec()),
        )
        .unwrap_or_else(|e| unreachable!("a valid histogram: {e}")),
        transport_cache_entries: IntGauge::new(
            "rest_client_transport_cache_entries",
            "Number of transport entries in the internal cache.",
        )
        .unwrap_or_else(|e| unreachable!("a valid gauge: {e}")),
        transport_creates: counter(
            "rest_client_transport_create_calls_total",
            "Number of calls to get a new transport, partitioned by the result of the \
             operation (uncacheable: created and not cached).",
            &["result"],
        ),
        transport_cert_rotation_gc: IntCounter::new(
            "rest_client_transport_cert_rotation_gc_calls_total",
            "Number of times a cert rotation goroutine cancel func is called via GC cleanup \
             of the associated transport",
        )
        .unwrap_or_else(|e| unreachable!("a valid counter: {e}")),
    }
});

/// Adds the `rest_client_*` families to `registry`.
pub fn register(registry: &Registry) -> prometheus::Result<()> {
    let f = &*FAMILIES;
    registry.register(Box::new(f.requests.clone()))?;
    registry.register(Box::new(f.latency.clone()))?;
    registry.register(Box::new(f.request_size.clone()))?;
    registry.register(Box::new(f.response_size.clone()))?;
    registry.register(Box::new(f.rate_limiter.clone()))?;
    registry.register(Box::new(f.exec_plugin_ttl.clone()))?;
    registry.register(Box::new(f.exec_plugin_rotation.clone()))?;
    registry.register(Box::new(f.transport_cache_entries.clone()))?;
    registry.register(Box::new(f.transport_creates.clone()))?;
    registry.register(Box::new(f.transport_cert_rotation_gc.clone()))?;
    Ok(())
}

/// Records each request of the service it wraps. `host` is the API server's `host:port`
/// (the requests it sees carry only a path: the base URI is added further in).
#[derive(Clone, Debug)]
pub struct RestClientMetricsLayer {
    host: String,
    rate_limited: bool,
}

impl RestClientMetricsLayer {
    /// `rate_limited`: the service it wraps waits for a rate limiter in `poll_ready`, whose
    /// wait is then recorded per request.
    pub fn new(host: String, rate_limited: bool) -> Self {
        FAMILIES
            .transport_creates
            .with_label_values(&["uncacheable"])
            .inc();
        Self { host, rate_limited }
    }
}

impl<S> Layer<S> for RestClientMetricsLayer {
    type Service = RestClientMetrics<S>;

    fn layer(&self, inner: S) -> RestClientMetrics<S> {
        RestClientMetrics {
            inner,
            host: self.host.clone(),
            rate_limited: self.rate_limited,
            waiting_since: None,
            waited: Duration::ZERO,
        }
    }
}

pub struct RestClientMetrics<S> {
    inner: S,
    host: String,
    rate_limited: bool,
    /// When the current wait for readiness began.
    waiting_since: Option<Instant>,
    /// How long the next request waited for readiness (the rate limiter).
    waited: Duration,
}

type Request = http::Request<kube::client::Body>;
type Response = http::Response<Box<DynBody>>;

impl<S> Service<Request> for RestClientMetrics<S>
where
    S: Service<Request, Response = Response>,
    S::Future: Send + 'static,
    S::Error: 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let since = *self.waiting_since.get_or_insert_with(Instant::now);
        let ready = self.inner.poll_ready(cx);
        if ready.is_ready() {
            self.waited = since.elapsed();
            self.waiting_since = None;
        }
        ready
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let f = &*FAMILIES;
        let verb = request.method().as_str().to_owned();
        let host = self.host.clone();
        let labels = [verb.as_str(), host.as_str()];
        if self.rate_limited {
            f.rate_limiter
                .with_label_values(&labels)
                .observe(std::mem::take(&mut self.waited).as_secs_f64());
        }
        let request_size = http_body::Body::size_hint(request.body())
            .exact()
            .unwrap_or(0);
        f.request_size
            .with_label_values(&labels)
            .observe(request_size as f64);
        let watch = is_watch(request.uri());
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let labels = [verb.as_str(), host.as_str()];
            f.latency
                .with_label_values(&labels)
                .observe(started.elapsed().as_secs_f64());
            let response = result?;
            let code = response.status().as_u16().to_string();
            f.requests
                .with_label_values(&[code.as_str(), verb.as_str(), host.as_str()])
                .inc();
            if watch {
                return Ok(response);
            }
            let size = BodySize {
                bytes: 0,
                observer: f.response_size.with_label_values(&labels),
            };
            Ok(response.map(|body| {
                let mut size = size;
                Box::new(body.map_frame(move |frame| {
                    if let Some(data) = frame.data_ref() {
                        size.add(data.len());
                    }
                    frame
                })) as Box<DynBody>
            }))
        })
    }
}

/// A response body's size so far; recorded when the body is dropped (read to the end, or
/// given up).
struct BodySize {
    bytes: usize,
    observer: Histogram,
}

impl BodySize {
    /// A method, so that the closure holding it owns all of it (and drops it with the body).
    fn add(&mut self, bytes: usize) {
        self.bytes += bytes;
    }
}

impl Drop for BodySize {
    fn drop(&mut self) {
        self.observer.observe(self.bytes as f64);
    }
}

fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_told_by_their_query() {
        let watch: http::Uri = "/api/v1/services?watch=true&resourceVersion=1"
            .parse()
            .unwrap();
        let list: http::Uri = "/api/v1/services?limit=500".parse().unwrap();
        assert!(is_watch(&watch));
        assert!(!is_watch(&list));
    }

    #[tokio::test]
    async fn a_request_is_counted_timed_and_sized() {
        use tower::ServiceExt as _;
        let host = "unit-test-host:6443";
        let service = tower::service_fn(|_: Request| async {
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(200)
                    .body(Box::new(
                        http_body_util::Full::new(axum::body::Bytes::from_static(b"0123456789"))
                            .map_err(|never| -> tower::BoxError { match never {} }),
                    ) as Box<DynBody>)
                    .unwrap(),
            )
        });
        let mut client = RestClientMetricsLayer::new(host.into(), true).layer(service);
        let request = http::Request::get("/api/v1/services?limit=500")
            .body(kube::client::Body::empty())
            .unwrap();
        let response = client.ready().await.unwrap().call(request).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"0123456789");
        let f = &*FAMILIES;
        assert_eq!(f.requests.with_label_values(&["200", "GET", host]).get(), 1);
        assert_eq!(
            f.latency
                .with_label_values(&["GET", host])
                .get_sample_count(),
            1
        );
        assert_eq!(
            f.rate_limiter
                .with_label_values(&["GET", host])
                .get_sample_count(),
            1
        );
        let response_size = f.response_size.with_label_values(&["GET", host]);
        assert_eq!(response_size.get_sample_count(), 1);
        assert_eq!(response_size.get_sample_sum(), 10.0);
    }
}
