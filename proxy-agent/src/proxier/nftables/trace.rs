// SPDX-License-Identifier: Apache-2.0
//! The nftables mode's operator tools on the LIVE table: `trace` (what the kernel's
//! `table ip kube-proxy` / `table ip6 kube-proxy` would do with one new connection),
//! `inspect rules` (the tables as nft lists them), `inspect affinity` (the live ClientIP
//! affinity entries) and whether the mode's state is on this node.
//!
//! The trace reads the kernel's own listing (`nft -j list table <family> kube-proxy`), not
//! the text the proxier wrote: the kernel normalises expressions (`ip daddr 10.0.0.0/8`
//! comes back as a prefix, a numgen offset as a signed number) and the listing is what
//! the packets meet, including the dynamic `affinity` set's live elements. [`Listing`]
//! parses the JSON into rules, sets and maps by hand over `serde_json::Value`. The
//! `nftables` crate models the libnftables JSON schema, but as closed enums deserialised
//! with the whole document, so one expression it does not model (a newer nft's, another
//! tool's rule in the table) would fail the listing, where the trace must still answer;
//! and the walk needs its own small expression form anyway. Here an unknown expression
//! becomes [`Expr::Unknown`] and never matches.
//!
//! [`trace`] then walks a packet through the base chains as netfilter orders them: the
//! output hook (a client on the node) or prerouting (a pod or an outside client), then
//! input when the (translated) destination is local, forward otherwise, and postrouting
//! (which decides the masquerade); within a hook by priority. `jump`, `goto`, `return`,
//! verdict maps (`vmap @service-ips`) and set lookups are followed exactly; a `numgen
//! random` comparison is a branch, so every endpoint chain the cascade can reach becomes
//! a candidate, with the masquerade its own path decided (the hairpin rule marks only
//! the endpoint reaching itself). What the listing cannot say is modelled from the
//! question: `fib … type local` from the node's addresses (and loopback), an `iifname`
//! match (the pod-interface detectors) holds for a pod client only, `ct state` is `new`.
//! Pure: the listing, the node's addresses and the question in, a [`Verdict`] out.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use proxy_common::proto;
use serde::Serialize;
use serde_json::Value;

use super::names::{
    AFFINITY, CLUSTER_IPS, FIREWALL_IPS, NAT_OUTPUT, NAT_PREROUTING, NO_ENDPOINT_NODEPORTS,
    NO_ENDPOINT_SERVICES, SERVICE_IPS, SERVICE_NODEPORTS, TABLE,
};
use super::ruleset::BASE_CHAINS;
use super::transport::{family_keyword, nft};
use crate::{
    inspect::{Output, Subject},
    model::{IpFamily, PortRef},
    proxier::{HostLayout, netfilter::ExecError},
    trace::{
        Action, AffinityInfo, Candidate, ClientKind, FrontendKind, MatchedFrontend, Question,
        TraceRequest, Verdict, client, proto_name,
    },
};

#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    #[error(transparent)]
    Nft(#[from] ExecError),
    #[error("reading nft's JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("nft's JSON has no `nftables` array")]
    Shape,
}

/// `nft [-j] list table <family> kube-proxy`; `None` when the table does not exist.
fn list_table(family: IpFamily, json: bool) -> Result<Option<String>, ListingError> {
    let mut args = Vec::with_capacity(5);
    if json {
        args.push("-j");
    }
    args.extend(["list", "table", family_keyword(family), TABLE]);
    match nft(&args, None) {
        Ok(listing) => Ok(Some(listing)),
        // nft reports a missing table as ENOENT.
        Err(ExecError::Failed { stderr, .. }) if stderr.contains("No such file or directory") => {
            Ok(None)
        }
        Err(err) => Err(err.into()),
    }
}

/// Whether the nftables mode's table (either family) is on this node.
pub fn in_use(_: &HostLayout) -> bool {
    [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .any(|family| matches!(list_table(family, false), Ok(Some(_))))
}

/// `inspect rules`: both families' tables as the kernel lists them (text), or one
/// `{"nftables": [...]}` document holding both tables' objects (JSON, as `nft -j list
/// ruleset` would print them). `inspect affinity`: the live ClientIP affinity entries,
/// with the service port and backend of the endpoint chain each one's slot names.
pub fn inspect_live(_: &HostLayout, subject: Subject, output: Output) -> Result<String, String> {
    match subject {
        Subject::Rules => inspect_rules(output),
        Subject::Affinity => {
            let mut entries = Vec::new();
            for family in [IpFamily::V4, IpFamily::V6] {
                if let Some(text) = list_table(family, true).map_err(|e| e.to_string())? {
                    let listing = Listing::parse(&text).map_err(|e| e.to_string())?;
                    entries.extend(live_affinity(&listing));
                }
            }
            Ok(match output {
                Output::Json => {
                    serde_json::to_string_pretty(&entries).map_err(|e| e.to_string())? + "\n"
                }
                Output::Text => affinity_text(&entries),
            })
        }
        other => Err(format!(
            "inspect {} is not available in nftables mode",
            other.as_str()
        )),
    }
}

/// One live ClientIP affinity entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveAffinity {
    pub client: IpAddr,
    /// The endpoint slot (see [`super::affinity_slot`]).
    pub slot: u32,
    /// The service port and backend of the endpoint chain with this slot, when one is
    /// in the table.
    pub service: Option<PortRef>,
    pub backend: Option<SocketAddr>,
    pub expires_seconds: Option<u64>,
}

/// The affinity set's entries, each with the endpoint chain its slot belongs to (pure).
pub fn live_affinity(listing: &Listing) -> Vec<LiveAffinity> {
    let endpoints: BTreeMap<u32, (&str, &Chain)> = listing
        .chains
        .iter()
        .filter(|(name, _)| name.starts_with("endpoint-"))
        .map(|(name, chain)| (super::affinity_slot(name), (name.as_str(), chain)))
        .collect();
    listing
        .affinity_entries()
        .into_iter()
        .map(|(client, slot, expires_seconds)| {
            let endpoint = endpoints.get(&slot);
            LiveAffinity {
                client,
                slot,
                service: endpoint.and_then(|(name, _)| service_of_chain(name)),
                backend: endpoint.and_then(|(_, chain)| {
                    chain
                        .rules
                        .iter()
                        .flat_map(|r| &r.statements)
                        .find_map(|s| match s {
                            Statement::Dnat {
                                addr: Some(addr),
                                port: Some(port),
                            } => Some(SocketAddr::new(*addr, *port)),
                            _ => None,
                        })
                }),
                expires_seconds,
            }
        })
        .collect()
}

fn affinity_text(entries: &[LiveAffinity]) -> String {
    if entries.is_empty() {
        return "no ClientIP affinity entries\n".into();
    }
    let mut out = format!(
        "{:<32} {:<40} {:<46} EXPIRES\n",
        "SERVICE", "CLIENT", "BACKEND"
    );
    for e in entries {
        let service = e
            .service
            .as_ref()
            .map_or_else(|| "?".to_string(), ToString::to_string);
        let backend = e
            .backend
            .map_or_else(|| format!("(slot {})", e.slot), |b| b.to_string());
        let expires = e
            .expires_seconds
            .map_or_else(|| "-".to_string(), |s| format!("{s}s"));
        out.push_str(&format!(
            "{service:<32} {:<40} {backend:<46} {expires}\n",
            e.client
        ));
    }
    out
}

fn inspect_rules(output: Output) -> Result<String, String> {
    let json = output == Output::Json;
    let mut listings = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        if let Some(text) = list_table(family, json).map_err(|e| e.to_string())? {
            listings.push(text);
        }
    }
    if json {
        return merge_json_listings(&listings).map_err(|e| e.to_string());
    }
    if listings.is_empty() {
        return Ok(format!("no table ip {TABLE} or ip6 {TABLE} on this node\n"));
    }
    Ok(listings.concat())
}

/// One `{"nftables": [...]}` document from several `nft -j` listings: the first
/// metainfo, then every listing's objects.
pub fn merge_json_listings(listings: &[String]) -> Result<String, ListingError> {
    let mut objects: Vec<Value> = Vec::new();
    for listing in listings {
        let value: Value = serde_json::from_str(listing)?;
        let items = value
            .get("nftables")
            .and_then(Value::as_array)
            .ok_or(ListingError::Shape)?;
        for item in items {
            if item.get("metainfo").is_some() && !objects.is_empty() {
                continue;
            }
            objects.push(item.clone());
        }
    }
    let doc = serde_json::json!({ "nftables": objects });
    Ok(serde_json::to_string_pretty(&doc)? + "\n")
}

/// `trace` in nftables mode: the destination family's table (`nft -j`), the node's
/// addresses, followed.
pub fn trace_live(_: &HostLayout, request: &TraceRequest) -> Result<Verdict, String> {
    let question = request.question(|from| client::classify(from, &client::address_devices()));
    let family = if request.to.is_ipv6() {
        IpFamily::V6
    } else {
        IpFamily::V4
    };
    let text = list_table(family, true)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!(
                "no table {} {TABLE} on this node: is the nftables mode running?",
                family_keyword(family)
            )
        })?;
    let listing = Listing::parse(&text).map_err(|e| e.to_string())?;
    let node: Vec<IpAddr> = client::local_addresses()
        .into_iter()
        .map(|(_, ip)| ip)
        .collect();
    Ok(trace(&listing, &node, &question))
}

// ---------------------------------------------------------------------------------------
// The listing.

/// An expression as the kernel lists it.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// `ip saddr`, `tcp dport`, `th dport`.
    Payload {
        protocol: String,
        field: String,
    },
    /// `meta l4proto`, `meta mark`, `iifname`.
    Meta(String),
    /// `ct state`.
    Ct(String),
    /// `fib saddr type`: the flags (saddr/daddr) and the result.
    Fib {
        flags: Vec<String>,
        result: String,
    },
    /// `numgen random mod N offset O`.
    Numgen {
        modulus: u32,
        offset: u32,
    },
    Concat(Vec<Expr>),
    /// `&`, `|`, `^` of two expressions.
    Binary {
        op: char,
        left: Box<Expr>,
        right: Box<Expr>,
    },
    Prefix(IpNet),
    Range(Box<Expr>, Box<Expr>),
    /// `@name`.
    SetRef(String),
    /// An anonymous set `{ a, b }`.
    AnonSet(Vec<Expr>),
    /// An anonymous verdict map `{ 0 : goto a, 1 : goto b }`.
    AnonMap(Vec<Element>),
    /// An address, a protocol name, `local`, `new`, an interface name.
    Text(String),
    Number(u64),
    /// Anything else, kept as its JSON text: it never matches.
    Unknown(String),
}

/// Where a rule or a map element sends the packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleVerdict {
    Accept,
    Drop,
    Continue,
    Return,
    Jump(String),
    Goto(String),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Statement {
    /// `==`, `!=` or `in` (a membership or flag test, `==` for our purposes).
    Match {
        negate: bool,
        left: Expr,
        right: Expr,
    },
    Verdict(RuleVerdict),
    /// `<key> vmap @map`.
    Vmap {
        key: Expr,
        map: Expr,
    },
    Dnat {
        addr: Option<IpAddr>,
        port: Option<u16>,
    },
    /// `dnat to <key> map @map`: the address and port are the element's data.
    DnatMap {
        key: Expr,
        map: String,
    },
    Masquerade,
    Reject,
    /// `meta mark set <value>`.
    SetMark(Expr),
    /// `update @set { key timeout N }`.
    SetUpdate {
        set: String,
        key: Expr,
        timeout: Option<u64>,
    },
    /// Counters, logs and the like: no effect on the decision.
    Other(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub statements: Vec<Statement>,
    pub comment: Option<String>,
}

/// A base chain's hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hook {
    /// "filter" or "nat".
    pub kind: String,
    /// "prerouting", "input", "forward", "output", "postrouting".
    pub hook: String,
    pub priority: i64,
    pub policy_drop: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chain {
    pub hook: Option<Hook>,
    pub rules: Vec<Rule>,
}

/// One element of a set or map.
#[derive(Clone, Debug, PartialEq)]
pub struct Element {
    pub key: Expr,
    /// What a verdict map maps the key to.
    pub verdict: Option<RuleVerdict>,
    /// What another map maps it to (an endpoint's `address . port`).
    pub data: Option<Expr>,
    pub comment: Option<String>,
    /// Seconds left of a dynamic element (the affinity set's).
    pub expires: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Set {
    pub elements: Vec<Element>,
}

/// One family's `kube-proxy` table, parsed from `nft -j list table`.
#[derive(Clone, Debug, PartialEq)]
pub struct Listing {
    pub family: IpFamily,
    pub chains: BTreeMap<String, Chain>,
    pub sets: BTreeMap<String, Set>,
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A number as nft prints it: numgen offsets come back signed (a slot above 2^31 as a
/// negative number), so 32-bit values wrap.
fn number(v: &Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| v.as_i64().map(|n| u64::from(n as u32)))
}

fn parse_expr(v: &Value) -> Expr {
    match v {
        Value::String(s) => match s.strip_prefix('@') {
            Some(name) => Expr::SetRef(name.to_string()),
            None => Expr::Text(s.clone()),
        },
        Value::Number(_) => number(v).map_or_else(|| Expr::Unknown(v.to_string()), Expr::Number),
        Value::Array(items) => Expr::AnonSet(items.iter().map(parse_expr).collect()),
        Value::Object(map) => {
            let Some((key, body)) = map.iter().next().filter(|_| map.len() == 1) else {
                return Expr::Unknown(v.to_string());
            };
            match key.as_str() {
                "payload" => Expr::Payload {
                    protocol: body.get("protocol").map(text).unwrap_or_default(),
                    field: body.get("field").map(text).unwrap_or_default(),
                },
                "meta" => Expr::Meta(body.get("key").map(text).unwrap_or_default()),
                "ct" => Expr::Ct(body.get("key").map(text).unwrap_or_default()),
                "fib" => Expr::Fib {
                    flags: match body.get("flags") {
                        Some(Value::Array(flags)) => flags.iter().map(text).collect(),
                        Some(flag) => vec![text(flag)],
                        None => Vec::new(),
                    },
                    result: body.get("result").map(text).unwrap_or_default(),
                },
                "numgen" if body.get("mode").and_then(Value::as_str) == Some("random") => {
                    Expr::Numgen {
                        modulus: body.get("mod").and_then(number).unwrap_or(0) as u32,
                        offset: body.get("offset").and_then(number).unwrap_or(0) as u32,
                    }
                }
                "concat" => match body {
                    Value::Array(items) => Expr::Concat(items.iter().map(parse_expr).collect()),
                    _ => Expr::Unknown(v.to_string()),
                },
                "&" | "|" | "^" => match body.as_array().map(Vec::as_slice) {
                    Some([left, right]) => Expr::Binary {
                        op: key.chars().next().unwrap_or('&'),
                        left: Box::new(parse_expr(left)),
                        right: Box::new(parse_expr(right)),
                    },
                    _ => Expr::Unknown(v.to_string()),
                },
                "prefix" => {
                    let addr = body.get("addr").and_then(Value::as_str).unwrap_or_default();
                    let len = body.get("len").and_then(Value::as_u64).unwrap_or(0);
                    format!("{addr}/{len}")
                        .parse()
                        .map_or_else(|_| Expr::Unknown(v.to_string()), Expr::Prefix)
                }
                "range" => match body.as_array().map(Vec::as_slice) {
                    Some([low, high]) => {
                        Expr::Range(Box::new(parse_expr(low)), Box::new(parse_expr(high)))
                    }
                    _ => Expr::Unknown(v.to_string()),
                },
                "set" => match body {
                    Value::Array(items) => Expr::AnonSet(items.iter().map(parse_expr).collect()),
                    single => Expr::AnonSet(vec![parse_expr(single)]),
                },
                // An element with its attributes (in anonymous sets): the value matters.
                "elem" => body
                    .get("val")
                    .map_or_else(|| Expr::Unknown(v.to_string()), parse_expr),
                _ => Expr::Unknown(v.to_string()),
            }
        }
        _ => Expr::Unknown(v.to_string()),
    }
}

/// A verdict object (`{"goto": {"target": ...}}`, `{"drop": null}`), if `v` is one.
fn parse_jump(v: &Value) -> Option<RuleVerdict> {
    let map = v.as_object()?;
    let (key, body) = map.iter().next()?;
    let target = || body.get("target").map(text);
    Some(match key.as_str() {
        "accept" => RuleVerdict::Accept,
        "drop" => RuleVerdict::Drop,
        "continue" => RuleVerdict::Continue,
        "return" => RuleVerdict::Return,
        "jump" => RuleVerdict::Jump(target()?),
        "goto" => RuleVerdict::Goto(target()?),
        _ => return None,
    })
}

fn parse_statement(v: &Value) -> Statement {
    if let Some(jump) = parse_jump(v) {
        return Statement::Verdict(jump);
    }
    let other = || Statement::Other(v.to_string());
    let Some((key, body)) = v.as_object().and_then(|m| m.iter().next()) else {
        return other();
    };
    match key.as_str() {
        "match" => {
            let op = body.get("op").and_then(Value::as_str).unwrap_or("==");
            let (Some(left), Some(right)) = (body.get("left"), body.get("right")) else {
                return other();
            };
            let left = parse_expr(left);
            let right = parse_expr(right);
            match op {
                "==" | "in" => Statement::Match {
                    negate: false,
                    left,
                    right,
                },
                "!=" => Statement::Match {
                    negate: true,
                    left,
                    right,
                },
                // Orderings (<, >) are not written by the proxier: an unknown match.
                _ => Statement::Match {
                    negate: false,
                    left: Expr::Unknown(v.to_string()),
                    right,
                },
            }
        }
        "vmap" => match (body.get("key"), body.get("data")) {
            (Some(key), Some(data)) => Statement::Vmap {
                key: parse_expr(key),
                map: match data.get("set").and_then(Value::as_array) {
                    // An anonymous map: [key, verdict] pairs.
                    Some(pairs) => {
                        Expr::AnonMap(pairs.iter().map(|p| parse_element(p, true)).collect())
                    }
                    None => parse_expr(data),
                },
            },
            _ => other(),
        },
        "dnat" => match body.get("addr").and_then(|a| a.get("map")) {
            Some(lookup) => match (lookup.get("key"), lookup.get("data")) {
                (Some(key), Some(data)) => Statement::DnatMap {
                    key: parse_expr(key),
                    map: text(data).trim_start_matches('@').to_string(),
                },
                _ => other(),
            },
            None => Statement::Dnat {
                addr: body
                    .get("addr")
                    .and_then(Value::as_str)
                    .and_then(|a| a.parse().ok()),
                port: body
                    .get("port")
                    .and_then(Value::as_u64)
                    .and_then(|p| u16::try_from(p).ok()),
            },
        },
        "masquerade" => Statement::Masquerade,
        "reject" => Statement::Reject,
        "mangle" => match (body.get("key"), body.get("value")) {
            (Some(target), Some(value)) if parse_expr(target) == Expr::Meta("mark".into()) => {
                Statement::SetMark(parse_expr(value))
            }
            _ => other(),
        },
        "set" => {
            let op = body.get("op").and_then(Value::as_str).unwrap_or_default();
            let set = body.get("set").map(text).unwrap_or_default();
            let elem = body.get("elem");
            // {"elem": {"val": key, "timeout": N}} or the key itself.
            let inner = elem.and_then(|e| e.get("elem"));
            let (key, timeout) = match inner {
                Some(inner) => (
                    inner.get("val").map(parse_expr),
                    inner.get("timeout").and_then(Value::as_u64),
                ),
                None => (elem.map(parse_expr), None),
            };
            match (op, key) {
                ("update" | "add", Some(key)) => Statement::SetUpdate {
                    set: set.trim_start_matches('@').to_string(),
                    key,
                    timeout,
                },
                _ => other(),
            }
        }
        _ => other(),
    }
}

fn parse_element(v: &Value, is_map: bool) -> Element {
    let (key_value, verdict, data) = match (is_map, v.as_array().map(Vec::as_slice)) {
        (true, Some([key, value])) => match parse_jump(value) {
            Some(verdict) => (key, Some(verdict), None),
            None => (key, None, Some(parse_expr(value))),
        },
        _ => (v, None, None),
    };
    let attributes = key_value.get("elem");
    let key = attributes
        .and_then(|a| a.get("val"))
        .map_or_else(|| parse_expr(key_value), parse_expr);
    Element {
        key,
        verdict,
        data,
        comment: attributes
            .and_then(|a| a.get("comment"))
            .and_then(Value::as_str)
            .map(str::to_string),
        expires: attributes
            .and_then(|a| a.get("expires"))
            .and_then(Value::as_u64),
    }
}

impl Listing {
    /// Parses `nft -j list table <family> kube-proxy` output.
    pub fn parse(json: &str) -> Result<Self, ListingError> {
        let doc: Value = serde_json::from_str(json)?;
        let items = doc
            .get("nftables")
            .and_then(Value::as_array)
            .ok_or(ListingError::Shape)?;
        let mut listing = Listing {
            family: IpFamily::V4,
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
        };
        let ours = |body: &Value| body.get("table").and_then(Value::as_str) == Some(TABLE);
        for item in items {
            let Some((kind, body)) = item.as_object().and_then(|m| m.iter().next()) else {
                continue;
            };
            match kind.as_str() {
                "table"
                    if body.get("name").and_then(Value::as_str) == Some(TABLE)
                        && body.get("family").and_then(Value::as_str) == Some("ip6") =>
                {
                    listing.family = IpFamily::V6;
                }
                "chain" if ours(body) => {
                    let name = body.get("name").map(text).unwrap_or_default();
                    let hook = body.get("hook").map(|hook| Hook {
                        kind: body.get("type").map(text).unwrap_or_default(),
                        hook: text(hook),
                        priority: body.get("prio").and_then(Value::as_i64).unwrap_or(0),
                        policy_drop: body.get("policy").and_then(Value::as_str) == Some("drop"),
                    });
                    listing.chains.entry(name).or_default().hook = hook;
                }
                "rule" if ours(body) => {
                    let chain = body.get("chain").map(text).unwrap_or_default();
                    let statements = body
                        .get("expr")
                        .and_then(Value::as_array)
                        .map(|exprs| exprs.iter().map(parse_statement).collect())
                        .unwrap_or_default();
                    listing.chains.entry(chain).or_default().rules.push(Rule {
                        statements,
                        comment: body
                            .get("comment")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                    });
                }
                "set" | "map" if ours(body) => {
                    let name = body.get("name").map(text).unwrap_or_default();
                    let is_map = kind == "map";
                    let elements = body
                        .get("elem")
                        .and_then(Value::as_array)
                        .map(|elems| elems.iter().map(|e| parse_element(e, is_map)).collect())
                        .unwrap_or_default();
                    listing.sets.insert(name, Set { elements });
                }
                _ => {}
            }
        }
        Ok(listing)
    }

    /// The base chains of `hook`, in the order netfilter runs them.
    fn hook_chains(&self, hook: &str) -> Vec<(&str, &Chain)> {
        let mut chains: Vec<(&str, &Chain)> = self
            .chains
            .iter()
            .filter(|(_, c)| c.hook.as_ref().is_some_and(|h| h.hook == hook))
            .map(|(name, c)| (name.as_str(), c))
            .collect();
        chains.sort_by_key(|(_, c)| c.hook.as_ref().map_or(0, |h| h.priority));
        chains
    }

    /// The live ClientIP affinity entries: (client, endpoint slot, seconds left).
    pub fn affinity_entries(&self) -> Vec<(IpAddr, u32, Option<u64>)> {
        self.sets
            .get(AFFINITY)
            .map(|set| {
                set.elements
                    .iter()
                    .filter_map(|e| match &e.key {
                        Expr::Concat(parts) => match parts.as_slice() {
                            [Expr::Text(addr), Expr::Number(slot)] => {
                                Some((addr.parse().ok()?, *slot as u32, e.expires))
                            }
                            _ => None,
                        },
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------
// Rendering (steps).

impl std::fmt::Display for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expr::Payload { protocol, field } => write!(f, "{protocol} {field}"),
            Expr::Meta(key) if key == "iifname" || key == "oifname" => write!(f, "{key}"),
            Expr::Meta(key) => write!(f, "meta {key}"),
            Expr::Ct(key) => write!(f, "ct {key}"),
            Expr::Fib { flags, result } => write!(f, "fib {} {result}", flags.join(" . ")),
            Expr::Numgen { modulus, offset } if *offset == 0 => {
                write!(f, "numgen random mod {modulus}")
            }
            Expr::Numgen { modulus, offset } => {
                write!(f, "numgen random mod {modulus} offset {offset}")
            }
            Expr::Concat(parts) => {
                let parts: Vec<String> = parts.iter().map(ToString::to_string).collect();
                write!(f, "{}", parts.join(" . "))
            }
            Expr::Binary { op, left, right } => {
                let op = match op {
                    '&' => "and",
                    '|' => "or",
                    _ => "xor",
                };
                match right.as_ref() {
                    // Marks read best in hex, as nft prints them.
                    Expr::Number(n) => write!(f, "{left} {op} {n:#x}"),
                    other => write!(f, "{left} {op} {other}"),
                }
            }
            Expr::Prefix(net) => write!(f, "{net}"),
            Expr::Range(low, high) => write!(f, "{low}-{high}"),
            Expr::SetRef(name) => write!(f, "@{name}"),
            Expr::AnonSet(items) => {
                let items: Vec<String> = items.iter().map(ToString::to_string).collect();
                write!(f, "{{ {} }}", items.join(", "))
            }
            Expr::AnonMap(elements) => {
                let items: Vec<String> = elements
                    .iter()
                    .map(|e| match &e.verdict {
                        Some(v) => format!("{} : {v}", e.key),
                        None => e.key.to_string(),
                    })
                    .collect();
                write!(f, "{{ {} }}", items.join(", "))
            }
            Expr::Text(s) => write!(f, "{s}"),
            Expr::Number(n) => write!(f, "{n}"),
            Expr::Unknown(json) => write!(f, "<{json}>"),
        }
    }
}

impl std::fmt::Display for RuleVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuleVerdict::Accept => write!(f, "accept"),
            RuleVerdict::Drop => write!(f, "drop"),
            RuleVerdict::Continue => write!(f, "continue"),
            RuleVerdict::Return => write!(f, "return"),
            RuleVerdict::Jump(t) => write!(f, "jump {t}"),
            RuleVerdict::Goto(t) => write!(f, "goto {t}"),
        }
    }
}

impl std::fmt::Display for Statement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Statement::Match {
                negate,
                left,
                right,
            } => {
                // nft spells out `==` after a computed value (`numgen … == 0`, `mark and
                // 0x4000 == 0`), and leaves it implicit after a field.
                let computed = matches!(left, Expr::Numgen { .. } | Expr::Binary { .. });
                let op = match (negate, computed) {
                    (true, _) => "!= ",
                    (false, true) => "== ",
                    (false, false) => "",
                };
                write!(f, "{left} {op}{right}")
            }
            Statement::Verdict(jump) => write!(f, "{jump}"),
            Statement::Vmap { key, map } => write!(f, "{key} vmap {map}"),
            Statement::Dnat { addr, port } => {
                let addr = addr.map_or_else(|| "?".to_string(), |a| a.to_string());
                match port {
                    Some(p) if addr.contains(':') => write!(f, "dnat to [{addr}]:{p}"),
                    Some(p) => write!(f, "dnat to {addr}:{p}"),
                    None => write!(f, "dnat to {addr}"),
                }
            }
            Statement::DnatMap { key, map } => write!(f, "dnat to {key} map @{map}"),
            Statement::Masquerade => write!(f, "masquerade"),
            Statement::Reject => write!(f, "reject"),
            Statement::SetMark(value) => write!(f, "meta mark set {value}"),
            Statement::SetUpdate { set, key, timeout } => match timeout {
                Some(t) => write!(f, "update @{set} {{ {key} timeout {t}s }}"),
                None => write!(f, "update @{set} {{ {key} }}"),
            },
            Statement::Other(json) => write!(f, "<{json}>"),
        }
    }
}

fn render_rule(rule: &Rule) -> String {
    let parts: Vec<String> = rule.statements.iter().map(ToString::to_string).collect();
    match &rule.comment {
        Some(c) => format!("{} comment \"{c}\"", parts.join(" ")),
        None => parts.join(" "),
    }
}

// ---------------------------------------------------------------------------------------
// The walk.

/// A value the packet gives an expression.
#[derive(Clone, Debug, PartialEq)]
enum Datum {
    Addr(IpAddr),
    Int(u64),
    Text(String),
    /// The input interface: the trace knows only whether it is a pod's (any name).
    Interface {
        pod: bool,
    },
    Tuple(Vec<Datum>),
    /// A field the packet does not have (`tcp dport` of a UDP packet): matches nothing.
    Absent,
}

/// What evaluating an expression gave.
enum Eval {
    Known(Datum),
    /// `numgen random mod N offset O` with N > 1: any of O..O+N.
    Random {
        modulus: u32,
        offset: u32,
    },
    Unknown,
}

/// Whether a match holds.
enum Truth {
    Yes,
    No,
    /// It depends on a random number: one in `modulus` packets.
    Random(u32),
}

/// One way through the table.
#[derive(Clone, Debug)]
struct Path {
    daddr: IpAddr,
    dport: u16,
    mark: u64,
    dnat: Option<SocketAddr>,
    masquerade: bool,
    steps: Vec<String>,
    frontend: Option<MatchedFrontend>,
    affinity_timeout: Option<u32>,
    /// The path followed a live affinity entry.
    pinned: bool,
    /// It went through a service port's Local-policy chain: the endpoint is on this node.
    local_policy: bool,
    /// The last rule matched only by chance (a `numgen random` branch taken): 1 in N.
    chance: Option<u32>,
}

impl Path {
    /// Notes that `rule` of `chain` decided something for this path.
    fn step(&mut self, chain: &str, rule: &Rule) {
        let chance = self
            .chance
            .take()
            .map(|n| format!(" (taken by 1 in {n} of the connections reaching it)"))
            .unwrap_or_default();
        self.steps
            .push(format!("{chain}: {}{chance}", render_rule(rule)));
    }
}

enum Outcome {
    /// Fell off the end of the chain, or returned.
    Continue(Path),
    /// Accepted: the base chain is done with it.
    Accept(Path),
    Drop(Path),
    Reject(Path),
}

/// The service port a per-service chain serves (`service-<hash>-ns/name/proto/port`, the
/// endpoint chains with `__<ip>/<port>` after it).
fn service_of_chain(chain: &str) -> Option<PortRef> {
    let (_, rest) = chain.split_once('-')?;
    let (_, readable) = rest.split_once('-')?;
    let readable = readable.split("__").next()?;
    let mut parts = readable.split('/');
    let (namespace, name, _proto, port) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    Some(PortRef {
        namespace: namespace.into(),
        name: name.into(),
        port_name: port.into(),
    })
}

/// The service port an element comment names ("ns/svc:port").
fn service_of_comment(comment: &str) -> Option<PortRef> {
    let (namespace, rest) = comment.split_once('/')?;
    let (name, port) = rest.split_once(':').unwrap_or((rest, ""));
    Some(PortRef {
        namespace: namespace.into(),
        name: name.into(),
        port_name: port.into(),
    })
}

fn protocol_number(name: &str) -> Option<u64> {
    match name {
        "tcp" => Some(u64::from(proto::TCP)),
        "udp" => Some(u64::from(proto::UDP)),
        "sctp" => Some(u64::from(proto::SCTP)),
        "icmp" => Some(1),
        "icmpv6" => Some(58),
        _ => name.parse().ok(),
    }
}

/// Whether `datum` is (or is inside) the element or literal `pattern`.
fn datum_matches(datum: &Datum, pattern: &Expr) -> bool {
    match (datum, pattern) {
        (d, Expr::AnonSet(items)) => items.iter().any(|i| datum_matches(d, i)),
        (Datum::Tuple(values), Expr::Concat(parts)) => {
            values.len() == parts.len()
                && values.iter().zip(parts).all(|(v, p)| datum_matches(v, p))
        }
        (Datum::Addr(a), Expr::Text(t)) => t.parse::<IpAddr>().is_ok_and(|b| b == *a),
        (Datum::Addr(a), Expr::Prefix(net)) => net.contains(a),
        (Datum::Addr(a), Expr::Range(low, high)) => match (low.as_ref(), high.as_ref()) {
            (Expr::Text(l), Expr::Text(h)) => match (l.parse::<IpAddr>(), h.parse::<IpAddr>()) {
                (Ok(l), Ok(h)) => l <= *a && *a <= h,
                _ => false,
            },
            _ => false,
        },
        (Datum::Int(n), Expr::Number(m)) => n == m,
        (Datum::Int(n), Expr::Text(t)) => protocol_number(t) == Some(*n),
        (Datum::Int(n), Expr::Range(low, high)) => match (low.as_ref(), high.as_ref()) {
            (Expr::Number(l), Expr::Number(h)) => l <= n && n <= h,
            _ => false,
        },
        (Datum::Text(s), Expr::Text(t)) => s == t,
        (Datum::Interface { pod }, Expr::Text(_)) => *pod,
        _ => false,
    }
}

struct Walker<'a> {
    listing: &'a Listing,
    q: &'a Question,
    node_addresses: &'a [IpAddr],
    /// The client's packets enter through prerouting (a pod or outside) rather than
    /// output (a process of the node).
    forwarded_in: bool,
}

/// Limit on nested jumps: a loop in a foreign ruleset must not hang the trace.
const MAX_DEPTH: usize = 32;

impl Walker<'_> {
    fn local(&self, ip: &IpAddr) -> bool {
        ip.is_loopback() || self.node_addresses.contains(ip)
    }

    fn eval(&self, expr: &Expr, path: &Path) -> Eval {
        let q = self.q;
        match expr {
            Expr::Payload { protocol, field } => match (protocol.as_str(), field.as_str()) {
                ("ip" | "ip6", "saddr") => Eval::Known(Datum::Addr(q.from)),
                ("ip" | "ip6", "daddr") => Eval::Known(Datum::Addr(path.daddr)),
                ("th", "dport") => Eval::Known(Datum::Int(u64::from(path.dport))),
                // `tcp dport` implies the protocol: another protocol has no such field.
                (l4, "dport") => match protocol_number(l4) {
                    Some(p) if p == u64::from(q.proto) => {
                        Eval::Known(Datum::Int(u64::from(path.dport)))
                    }
                    Some(_) => Eval::Known(Datum::Absent),
                    None => Eval::Unknown,
                },
                _ => Eval::Unknown,
            },
            Expr::Meta(key) => match key.as_str() {
                "l4proto" => Eval::Known(Datum::Int(u64::from(q.proto))),
                "mark" => Eval::Known(Datum::Int(path.mark)),
                "iifname" | "iif" => Eval::Known(Datum::Interface {
                    pod: self.forwarded_in && q.client == ClientKind::Pod,
                }),
                _ => Eval::Unknown,
            },
            // The trace follows a connection's first packet.
            Expr::Ct(key) if key == "state" => Eval::Known(Datum::Text("new".into())),
            // Postrouting's hairpin check: whether the connection was DNATed.
            Expr::Ct(key) if key == "status" => Eval::Known(Datum::Text(
                if path.dnat.is_some() { "dnat" } else { "none" }.into(),
            )),
            Expr::Fib { flags, result } if result == "type" => {
                let addr = if flags.iter().any(|f| f == "saddr") {
                    q.from
                } else if flags.iter().any(|f| f == "daddr") {
                    path.daddr
                } else {
                    return Eval::Unknown;
                };
                let kind = if self.local(&addr) {
                    "local"
                } else {
                    "unicast"
                };
                Eval::Known(Datum::Text(kind.into()))
            }
            Expr::Numgen { modulus, offset } if *modulus <= 1 => {
                Eval::Known(Datum::Int(u64::from(*offset)))
            }
            Expr::Numgen { modulus, offset } => Eval::Random {
                modulus: *modulus,
                offset: *offset,
            },
            Expr::Concat(parts) => {
                let mut values = Vec::with_capacity(parts.len());
                for part in parts {
                    match self.eval(part, path) {
                        Eval::Known(d) => values.push(d),
                        _ => return Eval::Unknown,
                    }
                }
                Eval::Known(Datum::Tuple(values))
            }
            Expr::Binary { op, left, right } => {
                match (self.eval(left, path), self.eval(right, path)) {
                    (Eval::Known(Datum::Int(a)), Eval::Known(Datum::Int(b))) => {
                        Eval::Known(Datum::Int(match op {
                            '&' => a & b,
                            '|' => a | b,
                            _ => a ^ b,
                        }))
                    }
                    _ => Eval::Unknown,
                }
            }
            Expr::Number(n) => Eval::Known(Datum::Int(*n)),
            _ => Eval::Unknown,
        }
    }

    /// The values `expr` can take, each as likely: one, or one per value of a `numgen
    /// random mod N` inside it (with N); `None` when the packet cannot tell.
    fn choices(&self, expr: &Expr, path: &Path) -> Option<(Vec<Datum>, u32)> {
        match self.eval(expr, path) {
            Eval::Known(datum) => Some((vec![datum], 1)),
            Eval::Random { modulus, offset } => Some((
                (offset..offset.saturating_add(modulus))
                    .map(|v| Datum::Int(u64::from(v)))
                    .collect(),
                modulus,
            )),
            Eval::Unknown => {
                let Expr::Concat(parts) = expr else {
                    return None;
                };
                let mut tuples = vec![Vec::with_capacity(parts.len())];
                let mut modulus = 1u32;
                for part in parts {
                    let (values, n) = self.choices(part, path)?;
                    modulus = modulus.saturating_mul(n);
                    tuples = tuples
                        .into_iter()
                        .flat_map(|t| {
                            values.iter().map(move |v| {
                                let mut t = t.clone();
                                t.push(v.clone());
                                t
                            })
                        })
                        .collect();
                }
                Some((tuples.into_iter().map(Datum::Tuple).collect(), modulus))
            }
        }
    }

    /// The element of set or map `name` the datum matches.
    fn lookup(&self, name: &str, datum: &Datum) -> Option<&Element> {
        self.listing
            .sets
            .get(name)?
            .elements
            .iter()
            .find(|e| datum_matches(datum, &e.key))
    }

    fn truth(&self, left: &Expr, right: &Expr, path: &Path) -> Truth {
        let yes = |b: bool| if b { Truth::Yes } else { Truth::No };
        match self.eval(left, path) {
            Eval::Known(datum) => match right {
                Expr::SetRef(name) => yes(self.lookup(name, &datum).is_some()),
                pattern => yes(datum_matches(&datum, pattern)),
            },
            Eval::Random { modulus, offset } => match right {
                Expr::Number(n)
                    if (u64::from(offset)..u64::from(offset) + u64::from(modulus)).contains(n) =>
                {
                    Truth::Random(modulus)
                }
                _ => Truth::No,
            },
            Eval::Unknown => Truth::No,
        }
    }

    /// Notes what a frontend lookup found: the kind of address and the service port.
    fn note_frontend(&self, path: &mut Path, map: &str, element: &Element) {
        if path.frontend.is_some() {
            return;
        }
        let target = match &element.verdict {
            Some(RuleVerdict::Goto(t) | RuleVerdict::Jump(t)) => Some(t.as_str()),
            _ => None,
        };
        let daddr = Datum::Addr(path.daddr);
        let key = Datum::Tuple(vec![
            daddr.clone(),
            Datum::Int(u64::from(self.q.proto)),
            Datum::Int(u64::from(path.dport)),
        ]);
        let kind = match map {
            SERVICE_NODEPORTS | NO_ENDPOINT_NODEPORTS => FrontendKind::NodePort,
            FIREWALL_IPS => FrontendKind::LoadBalancer,
            _ if self.lookup(CLUSTER_IPS, &daddr).is_some()
                && target.is_none_or(|t| !t.starts_with("external-")) =>
            {
                FrontendKind::ClusterIp
            }
            // Only loadBalancerSourceRanges tell an LB IP from an external IP here.
            _ if self.lookup(FIREWALL_IPS, &key).is_some() => FrontendKind::LoadBalancer,
            _ => FrontendKind::ExternalIp,
        };
        let service = target
            .filter(|t| super::is_port_chain(t))
            .and_then(service_of_chain)
            .or_else(|| element.comment.as_deref().and_then(service_of_comment));
        path.frontend = Some(MatchedFrontend {
            address: self.q.to.ip(),
            port: self.q.to.port(),
            protocol: proto_name(self.q.proto),
            kind,
            service,
            scope: "external",
        });
    }

    /// A lookup in the affinity set matched: the client is pinned to the endpoint chain the
    /// rule goes to, until the entry expires.
    fn note_affinity(&self, chain: &str, left: &Expr, right: &Expr, path: &mut Path) {
        let Expr::SetRef(set) = right else { return };
        if !set.starts_with(AFFINITY) {
            return;
        }
        let Eval::Known(key) = self.eval(left, path) else {
            return;
        };
        let expires = self.lookup(set, &key).and_then(|e| e.expires);
        path.pinned = true;
        let remaining = expires
            .map(|s| format!(", expiring in {s}s"))
            .unwrap_or_default();
        path.steps.push(format!(
            "{chain}: @{set} holds {}{remaining}",
            render_datum(&key)
        ));
    }

    /// Runs `chain` from rule `from_rule`, statement `from_statement`.
    fn run(
        &self,
        chain: &str,
        from_rule: usize,
        from_statement: usize,
        mut path: Path,
        depth: usize,
    ) -> Vec<Outcome> {
        let Some(rules) = self.listing.chains.get(chain).map(|c| &c.rules) else {
            path.steps
                .push(format!("chain {chain} is not in the table"));
            return vec![Outcome::Continue(path)];
        };
        if depth > MAX_DEPTH {
            path.steps
                .push(format!("{chain}: jumps nested too deep, not followed"));
            return vec![Outcome::Continue(path)];
        }
        let mut rule_index = from_rule;
        let mut statement_index = from_statement;
        'rules: while let Some(rule) = rules.get(rule_index) {
            let next_rule = rule_index + 1;
            let start = statement_index;
            statement_index = 0;
            for (s, statement) in rule.statements.iter().enumerate().skip(start) {
                match statement {
                    Statement::Match {
                        negate,
                        left,
                        right,
                    } => match (self.truth(left, right, &path), negate) {
                        (Truth::Yes, false) => self.note_affinity(chain, left, right, &mut path),
                        (Truth::No, true) => {}
                        (Truth::No, false) | (Truth::Yes, true) => {
                            rule_index = next_rule;
                            continue 'rules;
                        }
                        (Truth::Random(modulus), _) => {
                            // A branch: taken by 1 in `modulus` of what reaches it.
                            let mut taken = path.clone();
                            taken.chance = Some(modulus);
                            let mut out = self.run(chain, rule_index, s + 1, taken, depth);
                            out.extend(self.run(chain, next_rule, 0, path, depth));
                            return out;
                        }
                    },
                    Statement::Verdict(jump) => {
                        // Returning is not a decision worth a step.
                        if *jump != RuleVerdict::Return {
                            path.step(chain, rule);
                        }
                        return self.follow(chain, next_rule, jump, path, depth);
                    }
                    Statement::Vmap { key, map } => {
                        let elements: &[Element] = match map {
                            Expr::SetRef(name) => self
                                .listing
                                .sets
                                .get(name)
                                .map_or(&[], |set| set.elements.as_slice()),
                            Expr::AnonMap(elements) => elements,
                            _ => &[],
                        };
                        let found = |datum: &Datum| {
                            elements
                                .iter()
                                .find(|e| e.verdict.is_some() && datum_matches(datum, &e.key))
                        };
                        match self.eval(key, &path) {
                            Eval::Known(datum) => {
                                let Some(element) = found(&datum) else {
                                    rule_index = next_rule;
                                    continue 'rules;
                                };
                                return self.map_hit(
                                    chain, rule, next_rule, map, element, &datum, path, depth,
                                );
                            }
                            // `numgen random mod N vmap { 0 : ..., 1 : ... }` (upstream's
                            // endpoint choice): one branch per value.
                            Eval::Random { modulus, offset } => {
                                let mut out = Vec::new();
                                for value in offset..offset.saturating_add(modulus) {
                                    let datum = Datum::Int(u64::from(value));
                                    let mut branch = path.clone();
                                    branch.chance = Some(modulus);
                                    match found(&datum) {
                                        Some(element) => out.extend(self.map_hit(
                                            chain, rule, next_rule, map, element, &datum, branch,
                                            depth,
                                        )),
                                        None => {
                                            out.extend(self.run(chain, next_rule, 0, branch, depth))
                                        }
                                    }
                                }
                                return out;
                            }
                            Eval::Unknown => {
                                rule_index = next_rule;
                                continue 'rules;
                            }
                        }
                    }
                    Statement::Dnat { addr, port } => {
                        let addr = addr.unwrap_or(path.daddr);
                        let port = port.unwrap_or(path.dport);
                        path.step(chain, rule);
                        path.daddr = addr;
                        path.dport = port;
                        path.dnat = Some(SocketAddr::new(addr, port));
                        if chain.starts_with("local-") {
                            path.local_policy = true;
                        }
                        return vec![Outcome::Accept(path)];
                    }
                    Statement::DnatMap { key, map } => {
                        let Some((choices, modulus)) = self.choices(key, &path) else {
                            rule_index = next_rule;
                            continue 'rules;
                        };
                        let mut out = Vec::new();
                        for datum in choices {
                            let mut branch = path.clone();
                            let dest = self
                                .lookup(map, &datum)
                                .and_then(|e| e.data.as_ref())
                                .and_then(endpoint_of_data);
                            // A key the map lacks: the kernel's lookup breaks the rule.
                            let Some(dest) = dest else {
                                out.extend(self.run(chain, next_rule, 0, branch, depth));
                                continue;
                            };
                            let chance = if modulus > 1 {
                                format!(" (1 in {modulus} of the connections reaching it)")
                            } else {
                                String::new()
                            };
                            branch.chance = None;
                            branch.steps.push(format!(
                                "{chain}: {} finds {} : {dest}{chance}",
                                render_rule(rule),
                                render_datum(&datum)
                            ));
                            branch.daddr = dest.ip();
                            branch.dport = dest.port();
                            branch.dnat = Some(dest);
                            if chain.starts_with("local-") {
                                branch.local_policy = true;
                            }
                            out.push(Outcome::Accept(branch));
                        }
                        return out;
                    }
                    Statement::Masquerade => {
                        path.step(chain, rule);
                        path.masquerade = true;
                        return vec![Outcome::Accept(path)];
                    }
                    Statement::Reject => {
                        path.step(chain, rule);
                        return vec![Outcome::Reject(path)];
                    }
                    Statement::SetMark(value) => {
                        if let Eval::Known(Datum::Int(mark)) = self.eval(value, &path) {
                            path.mark = mark & u64::from(u32::MAX);
                            path.step(chain, rule);
                        }
                    }
                    Statement::SetUpdate { set, timeout, .. } => {
                        // Ours, or upstream's per-endpoint `affinity-<hash>-...` sets.
                        if set.starts_with(AFFINITY) {
                            path.affinity_timeout = timeout.and_then(|t| u32::try_from(t).ok());
                        }
                    }
                    Statement::Other(_) => {}
                }
            }
            rule_index = next_rule;
        }
        vec![Outcome::Continue(path)]
    }

    /// A verdict map's element matched: notes the frontend (the service maps), the step,
    /// and follows the element's verdict.
    #[allow(clippy::too_many_arguments)]
    fn map_hit(
        &self,
        chain: &str,
        rule: &Rule,
        next_rule: usize,
        map: &Expr,
        element: &Element,
        datum: &Datum,
        mut path: Path,
        depth: usize,
    ) -> Vec<Outcome> {
        let Some(jump) = &element.verdict else {
            return self.run(chain, next_rule, 0, path, depth);
        };
        if let Expr::SetRef(name) = map
            && [
                SERVICE_IPS,
                SERVICE_NODEPORTS,
                NO_ENDPOINT_SERVICES,
                NO_ENDPOINT_NODEPORTS,
                FIREWALL_IPS,
            ]
            .contains(&name.as_str())
        {
            self.note_frontend(&mut path, name, element);
        }
        let comment = element
            .comment
            .as_deref()
            .map(|c| format!(" ({c})"))
            .unwrap_or_default();
        let chance = path
            .chance
            .take()
            .map(|n| format!(", 1 in {n} of the connections reaching it"))
            .unwrap_or_default();
        let rendered = match map {
            // An anonymous map's elements are in the rule already.
            Expr::AnonMap(_) => {
                let key = match &rule.statements.iter().find_map(|s| match s {
                    Statement::Vmap { key, .. } => Some(key),
                    _ => None,
                }) {
                    Some(key) => key.to_string(),
                    None => String::new(),
                };
                format!("{key} vmap {{ … }}")
            }
            _ => render_rule(rule),
        };
        path.steps.push(format!(
            "{chain}: {rendered} finds {} : {jump}{comment}{chance}",
            render_datum(datum)
        ));
        self.follow(chain, next_rule, jump, path, depth)
    }

    /// Follows a verdict taken in `chain` (whose next rule is `next_rule`).
    fn follow(
        &self,
        chain: &str,
        next_rule: usize,
        jump: &RuleVerdict,
        mut path: Path,
        depth: usize,
    ) -> Vec<Outcome> {
        match jump {
            RuleVerdict::Accept => vec![Outcome::Accept(path)],
            RuleVerdict::Drop => vec![Outcome::Drop(path)],
            RuleVerdict::Return => vec![Outcome::Continue(path)],
            RuleVerdict::Continue => self.run(chain, next_rule, 0, path, depth),
            RuleVerdict::Goto(target) => {
                if target.starts_with("local-") {
                    path.local_policy = true;
                }
                self.run(target, 0, 0, path, depth + 1)
            }
            RuleVerdict::Jump(target) => {
                // A jump into a chain that decides nothing leaves no step.
                let before = path.steps.len();
                let mut out = Vec::new();
                for outcome in self.run(target, 0, 0, path, depth + 1) {
                    match outcome {
                        Outcome::Continue(mut back) => {
                            if back.steps.len() == before {
                                back.steps.pop();
                            }
                            out.extend(self.run(chain, next_rule, 0, back, depth));
                        }
                        ended => out.push(ended),
                    }
                }
                out
            }
        }
    }

    /// Runs the base chains of `hook` over every live path; the ended ones are returned
    /// with the base chain that ended them.
    fn hook(
        &self,
        hook: &str,
        paths: Vec<Path>,
        ended: &mut Vec<(Path, Action, &'static str)>,
    ) -> Vec<Path> {
        let mut live = paths;
        for (name, chain) in self.listing.hook_chains(hook) {
            let decided_by = BASE_CHAINS
                .iter()
                .find(|b| **b == name)
                .copied()
                .unwrap_or("filter");
            let policy_drop = chain.hook.as_ref().is_some_and(|h| h.policy_drop);
            let mut next = Vec::new();
            for path in live {
                for outcome in self.run(name, 0, 0, path, 0) {
                    match outcome {
                        Outcome::Continue(p) if policy_drop => {
                            ended.push((p, Action::Drop, decided_by));
                        }
                        Outcome::Continue(p) | Outcome::Accept(p) => next.push(p),
                        Outcome::Drop(p) => ended.push((p, Action::Drop, decided_by)),
                        Outcome::Reject(p) => ended.push((p, Action::Reject, decided_by)),
                    }
                }
            }
            live = next;
        }
        live
    }
}

/// The endpoint an element of a slot map names (`address . port`).
fn endpoint_of_data(data: &Expr) -> Option<SocketAddr> {
    let Expr::Concat(parts) = data else {
        return None;
    };
    match parts.as_slice() {
        [Expr::Text(addr), Expr::Number(port)] => Some(SocketAddr::new(
            addr.parse().ok()?,
            u16::try_from(*port).ok()?,
        )),
        _ => None,
    }
}

fn render_datum(datum: &Datum) -> String {
    match datum {
        Datum::Addr(a) => a.to_string(),
        Datum::Int(n) => n.to_string(),
        Datum::Text(t) => t.clone(),
        Datum::Interface { pod } => if *pod {
            "a pod interface"
        } else {
            "a non-pod interface"
        }
        .into(),
        Datum::Absent => "(none)".into(),
        Datum::Tuple(parts) => {
            let parts: Vec<String> = parts
                .iter()
                .enumerate()
                .map(|(i, d)| match d {
                    // The middle of `daddr . l4proto . dport` (or the head of `l4proto .
                    // dport`) is a protocol: print its name.
                    Datum::Int(p) if i + 1 < parts.len() && *p < 256 => {
                        proto_name(*p as u8).to_ascii_lowercase()
                    }
                    other => render_datum(other),
                })
                .collect();
            parts.join(" . ")
        }
    }
}

/// The steps all paths share, then one line per path for the rest.
fn merge_steps(paths: &[&Path]) -> Vec<String> {
    let Some(first) = paths.first() else {
        return Vec::new();
    };
    let common = (0..first.steps.len())
        .take_while(|i| paths.iter().all(|p| p.steps.get(*i) == first.steps.get(*i)))
        .count();
    let mut steps = first.steps[..common].to_vec();
    if paths.len() > 1 {
        for p in paths {
            steps.push(format!("branch: {}", p.steps[common..].join("; ")));
        }
    } else {
        steps.extend(first.steps[common..].iter().cloned());
    }
    steps
}

/// The trace of `q` through one family's table (`listing`, of the destination's family).
pub fn trace(listing: &Listing, node_addresses: &[IpAddr], q: &Question) -> Verdict {
    let node_client = q.client == ClientKind::Node;
    let decided_by = if node_client {
        NAT_OUTPUT
    } else {
        NAT_PREROUTING
    };
    let mut v = Verdict::untouched("nftables", q, decided_by);
    let wanted = if q.to.is_ipv6() {
        IpFamily::V6
    } else {
        IpFamily::V4
    };
    if listing.family != wanted || q.from.is_ipv6() != q.to.is_ipv6() {
        v.steps.push(format!(
            "the table read is {} {TABLE}; {} -> {} is not in its family",
            family_keyword(listing.family),
            q.from,
            q.to
        ));
        return v;
    }
    let walker = Walker {
        listing,
        q,
        node_addresses,
        forwarded_in: !node_client,
    };
    let start = Path {
        daddr: q.to.ip(),
        dport: q.to.port(),
        mark: 0,
        dnat: None,
        masquerade: false,
        steps: Vec::new(),
        frontend: None,
        affinity_timeout: None,
        pinned: false,
        local_policy: false,
        chance: None,
    };
    let mut ended = Vec::new();
    // Before routing: a node process's packet meets output, anything else prerouting.
    let first_hook = if node_client { "output" } else { "prerouting" };
    let routed = walker.hook(first_hook, vec![start], &mut ended);
    let mut delivered = Vec::new();
    for path in routed {
        let local = walker.local(&path.daddr);
        if node_client {
            // Output, postrouting, then (over loopback) input for a local destination.
            for p in walker.hook("postrouting", vec![path], &mut ended) {
                if local {
                    delivered.extend(walker.hook("input", vec![p], &mut ended));
                } else {
                    delivered.push(p);
                }
            }
        } else if local {
            delivered.extend(walker.hook("input", vec![path], &mut ended));
        } else {
            let forwarded = walker.hook("forward", vec![path], &mut ended);
            delivered.extend(walker.hook("postrouting", forwarded, &mut ended));
        }
    }

    let translated: Vec<&Path> = delivered.iter().filter(|p| p.dnat.is_some()).collect();
    if translated.is_empty() {
        if let Some((path, action, chain)) = ended.first() {
            v.steps = path.steps.clone();
            v.frontend = path.frontend.clone();
            v.action = *action;
            v.decided_by = chain;
            return v;
        }
        if let Some(path) = delivered.first() {
            v.steps = path.steps.clone();
            v.frontend = path.frontend.clone();
        }
        v.steps.push(format!("no rule translates {}", q.to));
        v.steps.push("passed on untouched".into());
        return v;
    }

    v.action = Action::Forward;
    v.steps = merge_steps(&translated);
    v.frontend = translated.iter().find_map(|p| p.frontend.clone());
    for p in &translated {
        let Some(dest) = p.dnat else { continue };
        match v
            .candidates
            .iter_mut()
            .find(|c| SocketAddr::new(c.address, c.port) == dest)
        {
            Some(c) => {
                c.masquerade |= p.masquerade;
                c.local |= p.local_policy;
            }
            None => v.candidates.push(Candidate {
                address: dest.ip(),
                port: dest.port(),
                local: p.local_policy,
                terminating: false,
                masquerade: p.masquerade,
            }),
        }
        if let Some(timeout) = p.affinity_timeout {
            let info = v.affinity.get_or_insert(AffinityInfo {
                timeout_seconds: timeout,
                pinned_backend: None,
            });
            if p.pinned {
                info.pinned_backend = Some(dest);
            }
        }
    }
    let steps = &mut v.steps;
    let dropped = ended.len();
    if dropped > 0 {
        steps.push(format!(
            "{dropped} other branch(es) end in DROP or REJECT before reaching an endpoint"
        ));
    }
    steps.push(match v.candidates.len() {
        1 => "1 endpoint reachable".to_string(),
        n => format!("{n} endpoints reachable (numgen random picks one)"),
    });
    if let Some(a) = &v.affinity {
        steps.push(match a.pinned_backend {
            Some(b) => format!(
                "sessionAffinity ClientIP ({}s): a live @{AFFINITY} entry pins this client to {b}",
                a.timeout_seconds
            ),
            None => format!(
                "sessionAffinity ClientIP ({}s): the endpoint chosen is remembered in @{AFFINITY} for this client",
                a.timeout_seconds
            ),
        });
    }
    v.explain_masquerade(
        q,
        node_addresses,
        node_client,
        "masquerade mark set: postrouting's masquerading chain SNATs to a node address",
    );
    v
}

#[cfg(test)]
mod tests;
