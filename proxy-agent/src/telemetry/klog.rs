// SPDX-License-Identifier: Apache-2.0
//! kube-proxy's log formats, written by hand because no crate formats `tracing` events as
//! klog does:
//! - text (klog's default header and structured key/value pairs):
//!   `I1127 01:02:03.456789    1234 proxier.rs:123] "Message" key="value" count=3`,
//!   severity I (info, debug, trace), W or E; UTC time; the process id padded to seven
//!   columns; the source file's name and line; the message and values quoted as Go's
//!   `strconv.Quote` does, numbers and booleans bare; `error` fields are klog's `err`;
//! - JSON (component-base's schema): `{"ts":1764205323456.789,"caller":"proxier.rs:123",
//!   "msg":"Message","v":0,"key":"value"}`, `ts` in milliseconds since the epoch with a
//!   fraction (as zap writes it for component-base), `v` the klog level of the call (absent
//!   on errors, which carry `err`).
//!
//! Levels map to klog's `-v` as kube-proxy uses them ([`klog_level`]): info is V(0), debug
//! V(4), trace V(5); an info event whose target is `klog::v<N>` (`info!(target: V2, ...)`)
//! is V(N), shown from `-v=N` on, where kube-proxy logs the same line at V(N).
//! `--vmodule` raises the level for the source files matching its globs ([`VModuleFilter`]).

use std::{
    fmt::{self, Write as _},
    time::{SystemTime, UNIX_EPOCH},
};

use tracing::{Event, Level, Metadata, Subscriber, field::Field};
use tracing_subscriber::{
    field::Visit,
    fmt::{FmtContext, FormatEvent, FormatFields, format::Writer},
    registry::LookupSpan,
};

use crate::config::VModuleItem;

/// Targets of info events kube-proxy logs at V(1) and V(2): `info!(target: V2, ...)`.
pub const V1: &str = "klog::v1";
pub const V2: &str = "klog::v2";
/// kube-proxy's `klog.V(1).Infof` lines (the flag dump): at V(1), the message unquoted.
pub const V1_PRINTF: &str = "klog::v1::printf";

/// The klog level an event is logged at (`v` of the JSON form): its `klog::v<N>` target's
/// for an info event, else by its level.
pub fn klog_level(meta: &Metadata<'_>) -> u32 {
    match *meta.level() {
        Level::TRACE => 5,
        Level::DEBUG => 4,
        Level::INFO => meta
            .target()
            .strip_prefix("klog::v")
            .map(|rest| rest.split(':').next().unwrap_or_default())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

/// The most verbose `tracing` level `-v=verbosity` shows.
pub fn max_level(verbosity: u32) -> Level {
    match verbosity {
        0..=3 => Level::INFO,
        4 => Level::DEBUG,
        _ => Level::TRACE,
    }
}

/// `-v` with `--vmodule`: an event passes when its level is within the verbosity of the
/// first `--vmodule` glob matching its source file's name (without `.rs`), else within `-v`.
#[derive(Clone, Debug)]
pub struct VModuleFilter {
    verbosity: u32,
    patterns: Vec<VModuleItem>,
}

impl VModuleFilter {
    pub fn new(verbosity: u32, patterns: &[VModuleItem]) -> Self {
        Self {
            verbosity,
            patterns: patterns.to_vec(),
        }
    }

    /// The verbosity that applies to events of `file` (a source path).
    pub fn verbosity_for(&self, file: Option<&str>) -> u32 {
        let stem = file.map(file_stem).unwrap_or_default();
        self.patterns
            .iter()
            .find(|p| glob_matches(&p.file_pattern, stem))
            .map_or(self.verbosity, |p| p.verbosity)
    }

    pub fn enabled(&self, meta: &Metadata<'_>) -> bool {
        let verbosity = self.verbosity_for(meta.file());
        *meta.level() <= max_level(verbosity)
            && (*meta.level() != Level::INFO || klog_level(meta) <= verbosity)
    }

    /// The most verbose level any file may log at (for the subscriber's level hint).
    pub fn most_verbose(&self) -> Level {
        let most = self
            .patterns
            .iter()
            .map(|p| p.verbosity)
            .chain([self.verbosity])
            .max()
            .unwrap_or(self.verbosity);
        max_level(most)
    }
}

/// `proxier/iptables/family.rs` -> `family`.
fn file_stem(path: &str) -> &str {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.strip_suffix(".rs").unwrap_or(name)
}

/// `proxier/iptables/family.rs` -> `family.rs` (what klog shows of a file).
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// klog's vmodule globs: `*` any run of characters, `?` one character.
fn glob_matches(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // Iterative matching with one backtrack point for the last `*`.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Calendar date and time (UTC) of `since_epoch`.
struct UtcTime {
    month: u32,
    day: u32,
    hour: u64,
    minute: u64,
    second: u64,
    micros: u32,
}

impl UtcTime {
    fn of(now: SystemTime) -> Self {
        let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = since.as_secs();
        let (_, month, day) = civil_from_days(secs / 86_400);
        let of_day = secs % 86_400;
        Self {
            month,
            day,
            hour: of_day / 3600,
            minute: of_day % 3600 / 60,
            second: of_day % 60,
            micros: since.subsec_micros(),
        }
    }
}

/// (year, month, day) of a count of days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (i64, u32, u32) {
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A value as klog prints it.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Str(String),
    /// Numbers, booleans and composite values, printed bare.
    Bare(String),
}

impl Value {
    fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Str(s) => serde_json::Value::String(s.clone()),
            Value::Bare(s) => serde_json::from_str(s).unwrap_or_else(|_| s.clone().into()),
        }
    }
}

/// The message and the fields of one event, in order.
#[derive(Default)]
struct Fields {
    message: String,
    pairs: Vec<(String, Value)>,
}

impl Fields {
    fn push(&mut self, field: &Field, value: Value) {
        let name = match field.name() {
            // klog's ErrorS and upstream's structured logs call it `err`.
            "error" => "err",
            name => name,
        };
        self.pairs.push((name.to_string(), value));
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.push(field, Value::Str(value.to_string()));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, Value::Bare(value.to_string()));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, Value::Bare(value.to_string()));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push(field, Value::Bare(value.to_string()));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, Value::Bare(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
            return;
        }
        // Displayed values (`%x`) and debug-printed scalars arrive here: numbers stay bare,
        // lists and maps too (klog prints them with %+v), everything else is a string.
        let bare = text.parse::<f64>().is_ok()
            || text == "true"
            || text == "false"
            || text.starts_with('[')
            || text.starts_with('{');
        let value = match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
            // `?name` of a string: already quoted by Debug.
            Some(inner) if !bare => Value::Str(inner.replace("\\\"", "\"")),
            _ if bare => Value::Bare(text),
            _ => Value::Str(text),
        };
        self.push(field, value);
    }
}

/// Go's `strconv.Quote`, for the characters a log line holds.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// klog's formats, as a `tracing_subscriber` event format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KlogFormat {
    #[default]
    Text,
    Json,
}

fn severity(level: &Level) -> char {
    match *level {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    }
}

/// One event as klog's text line (without the newline).
fn text_line(meta: &Metadata<'_>, fields: &Fields, now: SystemTime, pid: u32) -> String {
    let t = UtcTime::of(now);
    let mut line = format!(
        "{}{:02}{:02} {:02}:{:02}:{:02}.{:06} {:>7} {}:{}] {}",
        severity(meta.level()),
        t.month,
        t.day,
        t.hour,
        t.minute,
        t.second,
        t.micros,
        pid,
        meta.file().map_or("???", file_name),
        meta.line().unwrap_or(0),
        if meta.target().ends_with("::printf") {
            fields.message.clone()
        } else {
            quote(&fields.message)
        },
    );
    for (key, value) in &fields.pairs {
        let _ = match value {
            Value::Str(s) => write!(line, " {key}={}", quote(s)),
            Value::Bare(s) => write!(line, " {key}={s}"),
        };
    }
    line
}

/// One event as klog's JSON object, its keys in klog's order (ts, caller, msg, v, then
/// the event's).
fn json_line(meta: &Metadata<'_>, fields: &Fields, now: SystemTime) -> String {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let ts = (since.as_micros() as f64) / 1000.0;
    let caller = format!(
        "{}:{}",
        meta.file().map_or("???", file_name),
        meta.line().unwrap_or(0)
    );
    let json = |value: serde_json::Value| value.to_string();
    let mut line = format!(
        "{{\"ts\":{},\"caller\":{},\"msg\":{}",
        json(ts.into()),
        json(caller.into()),
        json(fields.message.clone().into())
    );
    if *meta.level() != Level::ERROR {
        let _ = write!(line, ",\"v\":{}", klog_level(meta));
    }
    for (key, value) in &fields.pairs {
        let _ = write!(
            line,
            ",{}:{}",
            json(key.clone().into()),
            json(value.to_json())
        );
    }
    line.push('}');
    line
}

impl<S, N> FormatEvent<S, N> for KlogFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let now = SystemTime::now();
        let line = match self {
            KlogFormat::Text => text_line(event.metadata(), &fields, now, std::process::id()),
            KlogFormat::Json => json_line(event.metadata(), &fields, now),
        };
        writeln!(writer, "{line}")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tracing_subscriber::prelude::*;

    use super::*;
    use crate::telemetry::CapturedLog;

    /// Logs a few events through `format` and returns the lines.
    fn log_with(format: KlogFormat, filter: VModuleFilter) -> Vec<String> {
        let out = CapturedLog::default();
        let layer = tracing_subscriber::fmt::layer()
            .event_format(format)
            .with_writer(out.clone())
            .with_filter(tracing_subscriber::filter::filter_fn(move |m| {
                filter.enabled(m)
            }));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let device = "eth0";
            tracing::info!(mode = "ebpf", services = 3u64, ready = true, %device, "proxier running");
            tracing::warn!(error = %"no \"route\"", "cannot serve");
            tracing::debug!("a V(4) detail");
        });
        out.lines()
    }

    /// `info!(target: V2, ..)` is kube-proxy's `klog.V(2).InfoS`: shown from -v=2 on (or
    /// where --vmodule says), with `"v":2` in JSON.
    #[test]
    fn v_targets_are_klog_levels() {
        let log = |filter: VModuleFilter, format| {
            let out = CapturedLog::default();
            let layer = tracing_subscriber::fmt::layer()
                .event_format(format)
                .with_writer(out.clone())
                .with_filter(tracing_subscriber::filter::filter_fn(move |m| {
                    filter.enabled(m)
                }));
            tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
                tracing::info!(target: V1, "at one");
                tracing::info!(target: V2, "at two");
                tracing::info!("at zero");
                tracing::info!(target: V1_PRINTF, "FLAG: --v=\"2\"");
            });
            out.lines()
        };
        assert_eq!(log(VModuleFilter::new(0, &[]), KlogFormat::Text).len(), 1);
        let at_one = log(VModuleFilter::new(1, &[]), KlogFormat::Text);
        assert_eq!(at_one.len(), 3);
        // A printf line is written as it is, as klog's Infof writes it.
        assert!(at_one[2].ends_with(r#"] FLAG: --v="2""#), "{}", at_one[2]);
        let raised = [VModuleItem {
            file_pattern: "klog".into(),
            verbosity: 2,
        }];
        assert_eq!(
            log(VModuleFilter::new(0, &raised), KlogFormat::Text).len(),
            4
        );
        let json = log(VModuleFilter::new(2, &[]), KlogFormat::Json);
        let levels: Vec<u64> = json
            .iter()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["v"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(levels, [1, 2, 0, 1]);
    }

    #[test]
    fn text_lines_have_klogs_header_and_quoted_pairs() {
        let lines = log_with(KlogFormat::Text, VModuleFilter::new(2, &[]));
        assert_eq!(lines.len(), 2, "-v=2 shows no debug: {lines:?}");
        let (header, rest) = lines[0].split_once("] ").unwrap();
        // I<MMDD> <HH:MM:SS.micros> <pid padded to 7> <file>:<line>
        let parts: Vec<&str> = header.split_whitespace().collect();
        assert_eq!(parts.len(), 4, "{header}");
        assert!(parts[0].starts_with('I') && parts[0].len() == 5, "{header}");
        assert_eq!(parts[1].len(), 15, "{header}");
        assert_eq!(parts[2], std::process::id().to_string());
        assert!(parts[3].starts_with("klog.rs:"), "{header}");
        assert_eq!(
            rest,
            r#""proxier running" mode="ebpf" services=3 ready=true device="eth0""#
        );
        assert!(lines[1].starts_with('W'), "{}", lines[1]);
        assert!(
            lines[1].ends_with(r#"] "cannot serve" err="no \"route\"""#),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn json_lines_follow_component_bases_schema() {
        let lines = log_with(KlogFormat::Json, VModuleFilter::new(4, &[]));
        assert_eq!(lines.len(), 3, "-v=4 shows debug: {lines:?}");
        assert!(lines[0].starts_with(r#"{"ts":"#), "{}", lines[0]);
        let first: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        // Milliseconds since the epoch, with a fraction.
        assert!(first["ts"].as_f64().unwrap() > 1.7e12);
        assert!(first["caller"].as_str().unwrap().starts_with("klog.rs:"));
        assert_eq!(first["msg"], "proxier running");
        assert_eq!(first["v"], 0);
        assert_eq!(first["mode"], "ebpf");
        assert_eq!(first["services"], 3);
        assert_eq!(first["ready"], true);
        assert_eq!(first["device"], "eth0");
        let warning: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(warning["err"], "no \"route\"");
        let detail: serde_json::Value = serde_json::from_str(&lines[2]).unwrap();
        assert_eq!(detail["v"], 4);
    }

    #[test]
    fn vmodule_raises_the_level_of_matching_files() {
        let item = |pattern: &str, verbosity| VModuleItem {
            file_pattern: pattern.into(),
            verbosity,
        };
        let filter = VModuleFilter::new(0, &[item("kl*g", 5), item("family", 4)]);
        assert_eq!(filter.verbosity_for(Some("src/telemetry/klog.rs")), 5);
        assert_eq!(filter.verbosity_for(Some("proxier/iptables/family.rs")), 4);
        assert_eq!(filter.verbosity_for(Some("proxier/ebpf/mod.rs")), 0);
        assert_eq!(filter.most_verbose(), Level::TRACE);
        let lines = log_with(KlogFormat::Text, filter);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(glob_matches("a?c*", "abcdef") && !glob_matches("a?c", "abcd"));
        assert!(glob_matches("*", "") && !glob_matches("x", ""));
    }

    #[test]
    fn civil_dates_and_times_are_utc() {
        // 2026-11-27 01:02:03.456789 UTC
        let at = UNIX_EPOCH + Duration::from_micros(1_795_741_323_456_789);
        let t = UtcTime::of(at);
        assert_eq!(
            (t.month, t.day, t.hour, t.minute, t.second, t.micros),
            (11, 27, 1, 2, 3, 456_789)
        );
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }
}
