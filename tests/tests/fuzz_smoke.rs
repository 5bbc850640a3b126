// SPDX-License-Identifier: Apache-2.0
//! A short, deterministic stand-in for the cargo-fuzz targets of `tests/fuzz/`: the seed
//! corpus and a few thousand mutations of it go through the same entry points
//! (`proxy_agent::fuzz`), which panic when an invariant of the object -> model or
//! configuration path breaks. The long runs are cargo-fuzz's (see tests/fuzz/README.md).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proxy_agent::fuzz::{self, Outcome};
use serde_json::Value;

/// Mutated inputs per target.
const MUTATIONS: usize = 2000;
/// Upper bound on one target's mutation phase (a slow machine stops early).
const TIME_BUDGET: Duration = Duration::from_secs(30);

fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect()
}

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Values that sit on the edges the conversion checks.
fn interesting_values() -> Vec<Value> {
    let long = "x".repeat(70_000);
    [
        "0",
        "-1",
        "1",
        "65535",
        "65536",
        "2147483647",
        "-2147483648",
        "86400",
        "86401",
        "null",
        "true",
        "\"\"",
        "\"None\"",
        "\"TCP\"",
        "\"UDP\"",
        "\"SCTP\"",
        "\"tcp\"",
        "\"IPv4\"",
        "\"IPv6\"",
        "\"FQDN\"",
        "\"10.0.0.1\"",
        "\"010.000.000.001\"",
        "\"10.0.0.256\"",
        "\"::ffff:10.0.0.1\"",
        "\"fd00::1\"",
        "\"fd00::/129\"",
        "\"10.0.0.0/33\"",
        "\" 10.0.0.1\"",
        "\"Local\"",
        "\"Cluster\"",
        "\"ClientIP\"",
        "\"LoadBalancer\"",
        "\"NodePort\"",
        "\"ExternalName\"",
        "\"Proxy\"",
        "\"VIP\"",
        "\"1s\"",
        "\"-1s\"",
        "\"1h2m3.5s\"",
        "\"9999999999h\"",
        "\"0.0.0.0:10256\"",
        "\"[::1]:99999\"",
        "\"primary\"",
        "\"ebpf\"",
        "\"iptables\"",
        "\"ipvs\"",
        "\"nftables\"",
        "\"☃\"",
        "\"\\u0000\"",
        "[]",
        "{}",
        "[\"10.0.0.1\",\"fd00::1\"]",
    ]
    .iter()
    .map(|text| serde_json::from_str(text).unwrap())
    .chain([Value::String(long)])
    .collect()
}

/// Every path to a node of `value` (object keys and array indexes).
fn paths(value: &Value, prefix: &mut Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
    out.push(prefix.clone());
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                prefix.push(PathStep::Key(key.clone()));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                prefix.push(PathStep::Index(index));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone)]
enum PathStep {
    Key(String),
    Index(usize),
}

fn node_mut<'a>(value: &'a mut Value, path: &[PathStep]) -> &'a mut Value {
    path.iter().fold(value, |node, step| match step {
        PathStep::Key(key) => &mut node[key.as_str()],
        PathStep::Index(index) => &mut node[*index],
    })
}

/// One structural mutation of a JSON document: replace a node, drop a key, duplicate an
/// array item, or grow an array to hundreds of copies (two grown arrays multiply: a
/// slice's ports times its endpoints).
fn mutate_json(rng: &mut Rng, doc: &Value, interesting: &[Value]) -> Value {
    let mut doc = doc.clone();
    let mut all = Vec::new();
    paths(&doc, &mut Vec::new(), &mut all);
    for _ in 0..=rng.below(3) {
        let path = rng.pick(&all).clone();
        let node = node_mut(&mut doc, &path);
        match rng.below(5) {
            0 | 1 => *node = rng.pick(interesting).clone(),
            2 => {
                if let Value::Object(map) = node
                    && !map.is_empty()
                {
                    let key = map.keys().nth(rng.below(map.len())).unwrap().clone();
                    map.remove(&key);
                }
            }
            3 => {
                if let Value::Array(items) = node
                    && !items.is_empty()
                {
                    let item = items[rng.below(items.len())].clone();
                    items.push(item);
                }
            }
            _ => {
                if let Value::Array(items) = node
                    && !items.is_empty()
                    && items.len() < 10
                {
                    let item = items[0].clone();
                    items.resize(300, item);
                }
            }
        }
        // Paths may be stale after a change; re-collect.
        all.clear();
        paths(&doc, &mut Vec::new(), &mut all);
    }
    doc
}

/// One byte-level mutation: flip, insert, delete or splice.
fn mutate_bytes(rng: &mut Rng, data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    for _ in 0..=rng.below(4) {
        let at = if out.is_empty() {
            0
        } else {
            rng.below(out.len())
        };
        match rng.below(4) {
            0 if !out.is_empty() => out[at] ^= 1 << rng.below(8),
            1 => out.insert(at, *rng.pick(b"0123456789:.-/\"{}[],x\xff\xc3 \n")),
            2 if !out.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at..end);
            }
            _ => {
                let end = (at + rng.below(32)).min(out.len());
                let chunk = out[at..end].to_vec();
                let to = rng.below(out.len() + 1);
                out.splice(to..to, chunk);
            }
        }
    }
    out
}

/// Runs the seeds (checking each lands where expected) and then mutations of them.
fn run(target: &str, entry: fn(&[u8]) -> Outcome, expect: &dyn Fn(&str, Outcome)) {
    let seeds = seeds(target);
    assert!(!seeds.is_empty(), "{target}: no seeds");
    for (name, data) in &seeds {
        expect(name, entry(data));
    }
    let docs: Vec<Value> = seeds
        .iter()
        .map(|(_, data)| {
            serde_json::from_slice(data)
                .or_else(|_| serde_yaml::from_slice(data))
                .unwrap()
        })
        .collect();
    let interesting = interesting_values();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ target.len() as u64);
    let started = Instant::now();
    let mut counts = [0usize; 3];
    let mut slowest = Duration::ZERO;
    let mut done = 0;
    while done < MUTATIONS && started.elapsed() < TIME_BUDGET {
        let index = rng.below(seeds.len());
        let input = if rng.below(3) == 0 {
            mutate_bytes(&mut rng, &seeds[index].1)
        } else {
            let doc = mutate_json(&mut rng, &docs[index], &interesting);
            if target == "config_text" && rng.below(2) == 0 {
                serde_yaml::to_string(&doc).unwrap().into_bytes()
            } else {
                serde_json::to_vec(&doc).unwrap()
            }
        };
        let one = Instant::now();
        let outcome = entry(&input);
        slowest = slowest.max(one.elapsed());
        match outcome {
            Outcome::Undecodable => counts[0] += 1,
            Outcome::Rejected => counts[1] += 1,
            Outcome::Accepted(_) => counts[2] += 1,
        }
        done += 1;
    }
    eprintln!(
        "{target}: {done} mutations in {:?} (slowest {slowest:?}): {} undecodable, {} rejected, {} accepted",
        started.elapsed(),
        counts[0],
        counts[1],
        counts[2]
    );
    assert!(done >= 300, "{target}: only {done} mutations ran");
    // The mutations reach past decoding, into both refusal and acceptance.
    assert!(counts[1] > 0 && counts[2] > 0, "{target}: {counts:?}");
}

#[test]
fn service_json_seeds_and_mutations() {
    run("service_json", fuzz::service_json, &|name, outcome| {
        let want = match name {
            "cluster_ip.json" | "non_canonical.json" | "unicode.json" => Outcome::Accepted(1),
            "load_balancer_local.json" => Outcome::Accepted(1),
            // Three ports, in each family.
            "dual_stack_nodeport.json" => Outcome::Accepted(6),
            "headless.json" | "external_name.json" => Outcome::Accepted(0),
            _ => Outcome::Rejected,
        };
        assert_eq!(outcome, want, "{name}");
    });
}

#[test]
fn endpoint_slice_json_seeds_and_mutations() {
    run(
        "endpoint_slice_json",
        fuzz::endpoint_slice_json,
        &|name, outcome| {
            let want = match name {
                "ipv4.json" | "unicode.json" => Outcome::Accepted(1),
                "ipv6.json" => Outcome::Accepted(2),
                // Both ports share a name: one service port (upstream merges them).
                "duplicate_ports.json" => Outcome::Accepted(1),
                "fqdn.json" | "no_label.json" => Outcome::Accepted(0),
                _ => Outcome::Rejected,
            };
            assert_eq!(outcome, want, "{name}");
        },
    );
}

#[test]
fn config_text_seeds_and_mutations() {
    run("config_text", fuzz::config_text, &|name, outcome| {
        let want = match name {
            "bad_fields.yaml" => Outcome::Rejected,
            _ => Outcome::Accepted(1),
        };
        assert_eq!(outcome, want, "{name}");
    });
}
