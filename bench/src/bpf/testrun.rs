// SPDX-License-Identifier: Apache-2.0
//! Per-packet cost of the agent's tc and XDP programs with `BPF_PROG_TEST_RUN`: the live
//! programs of the run's agent (pinned by id beside the run's pins), each run by the
//! kernel `repeat` times on one frame, with the kernel's own average time per run.
//! `tc_pod_ingress` (on every packet a pod sends) gets a TCP segment of an established
//! pod-to-pod flow no program translated: it parses it, looks its tuple up in the
//! conntrack map (a miss) and lets it pass. `tc_uplink_ingress` and `xdp_uplink` (on a
//! veth uplink the benchmark gives the node) get a TCP segment from an outside client to
//! an address of no service: reply and forward conntrack lookups (misses), the frontend
//! lookup (a miss), pass. The frames pass unchanged, so every repetition takes the same
//! path. Measured with the conntrack map empty and holding 1,000,000 flows (written into
//! the agent's pinned map, then removed again).
//!
//! The same runs with the kernel's run-time statistics switched on, alternating off and
//! on (ABBA), give what the statistics add to every call (two clock reads and the
//! counters): the overhead to subtract from the statistics-based costs of [`progs`](super::progs).

use std::{
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
};

use aya::{
    maps::{Map, MapData},
    programs::{SchedClassifier, TestRun, TestRunOptions, TestRunResult, Xdp},
};
use aya_obj::programs::XdpAttachType;
use proxy_common::{Ct4Key, CtValue};

use crate::{
    error::{Error, Result},
    net::{CLIENT_IP, SERVER_IP},
    rows::Row,
    signals,
};

use super::{BENCH, batch::map_update_batch, progs::StatsGuard};

pub const PROGRAM: &str = "tc_pod_ingress";
pub const MODE_TEST_RUN: &str = "test-run";
pub const MODE_TEST_RUN_STATS: &str = "test-run+stats";
pub const METRIC_NS: &str = "tc_pod_ingress_ns_per_packet";
/// Measured on `tc_pod_ingress`: the reference subtracted from the statistics' figures.
pub const METRIC_STATS_OVERHEAD: &str = "stats_overhead_ns_per_call";
/// The conntrack map of IPv4 flows, as the agent pins it.
const CT_MAP: &str = "CT4_V1";
/// The uplink's address, and the outside client the uplink frame comes from.
pub const UPLINK_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 2);
const OUTSIDE_CLIENT: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);
const TC_ACT_OK: u32 = 0;
const XDP_PASS: u32 = 2;

/// The programs measured: name, whether it is XDP, its frame, the verdict that frame gets.
pub fn measured_programs() -> [(&'static str, bool, Vec<u8>, u32); 3] {
    let uplink = tcp_ack_frame((OUTSIDE_CLIENT, 40_000), (UPLINK_IP, 9_000));
    [
        (PROGRAM, false, measured_frame(), TC_ACT_OK),
        ("tc_uplink_ingress", false, uplink.clone(), TC_ACT_OK),
        ("xdp_uplink", true, uplink, XDP_PASS),
    ]
}

/// A pinned program of the run's agent, opened.
pub enum Prog {
    Tc(SchedClassifier),
    Xdp(Xdp),
}

impl Prog {
    fn test_run(&self, opts: TestRunOptions<'_>) -> std::result::Result<TestRunResult, String> {
        match self {
            Prog::Tc(p) => p.test_run(opts).map_err(|e| e.to_string()),
            Prog::Xdp(p) => p.test_run(opts).map_err(|e| e.to_string()),
        }
    }
}

/// A directory of the benchmark's own pins; removed (with the pins) on drop.
pub struct PinDir {
    dir: PathBuf,
}

impl PinDir {
    pub fn create(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        Ok(PinDir {
            dir: dir.to_path_buf(),
        })
    }

    /// Pins program `id` as `name` (`bpftool prog pin`) and opens it.
    pub fn open(&self, id: u32, name: &str, xdp: bool) -> Result<Prog> {
        let path = self.dir.join(name);
        let out = Command::new("bpftool")
            .args(["prog", "pin", "id", &id.to_string()])
            .arg(&path)
            .output()
            .map_err(Error::io("running bpftool prog pin"))?;
        if !out.status.success() {
            return Err(Error::Setup(format!(
                "bpftool prog pin id {id}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let opened = if xdp {
            Xdp::from_pin(&path, XdpAttachType::Interface).map(Prog::Xdp)
        } else {
            SchedClassifier::from_pin(&path).map(Prog::Tc)
        };
        opened.map_err(|e| Error::Setup(format!("opening {}: {e}", path.display())))
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        if let Err(err) = fs::remove_dir_all(&self.dir) {
            eprintln!("cleanup: removing {}: {err}", self.dir.display());
        }
    }
}

/// RFC 1071 checksum of an IPv4 header.
fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Ethernet, IPv4 and TCP (ACK) headers of a segment from `src` to `dst`.
pub fn tcp_ack_frame(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16)) -> Vec<u8> {
    let mut frame = Vec::with_capacity(54);
    frame.extend([0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00]);
    let mut ip = vec![0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0];
    ip.extend(src.0.octets());
    ip.extend(dst.0.octets());
    let sum = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    frame.extend(ip);
    frame.extend(src.1.to_be_bytes());
    frame.extend(dst.1.to_be_bytes());
    frame.extend(1u32.to_be_bytes());
    frame.extend(1u32.to_be_bytes());
    // Data offset 5 words, ACK, window, checksum (not checked on this path), urgent.
    frame.extend([0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
    frame
}

/// The frame the cost is measured on: the client pod answering the server pod, on a flow
/// of no service.
pub fn measured_frame() -> Vec<u8> {
    tcp_ack_frame((CLIENT_IP, 40_000), (SERVER_IP, 9_000))
}

/// The kernel's average nanoseconds per run over `repeat` runs of `program` on `frame`,
/// which must get `verdict` (the frame passed, as the path measured here must).
pub fn ns_per_run(
    (name, program): (&str, &Prog),
    frame: &[u8],
    verdict: u32,
    repeat: u32,
) -> Result<f64> {
    let mut out = vec![0u8; frame.len() + 256];
    let result = program
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            repeat,
            ..TestRunOptions::default()
        })
        .map_err(|e| Error::Setup(format!("BPF_PROG_TEST_RUN of {name}: {e}")))?;
    if result.return_value != verdict {
        return Err(Error::Setup(format!(
            "{name} returned {} on the measured frame, not {verdict}",
            result.return_value
        )));
    }
    Ok(result.duration.as_nanos() as f64)
}

/// `count` conntrack keys of flows between addresses no bench namespace uses (so none
/// matches the measured frame).
fn ct_keys(count: u32) -> Vec<Ct4Key> {
    (0..count)
        .map(|i| Ct4Key {
            saddr: u32::from_ne_bytes(Ipv4Addr::from(0x0a40_0000 + (i >> 8)).octets()),
            daddr: u32::from_ne_bytes(Ipv4Addr::new(10, 250, 0, 1).octets()),
            sport: (1024 + (i & 0xff) as u16).to_be(),
            dport: 80u16.to_be(),
            proto: 6,
            dir: 0,
            _pad: [0; 2],
        })
        .collect()
}

/// Writes `count` flows into the agent's conntrack map (pinned under `maps_dir`), in
/// batches; returns how many the map took.
pub fn fill_conntrack(maps_dir: &Path, count: u32) -> Result<u64> {
    let path = maps_dir.join(CT_MAP);
    let data = MapData::from_pin(&path)
        .map_err(|e| Error::Setup(format!("opening {}: {e}", path.display())))?;
    let keys = ct_keys(count);
    let value = CtValue {
        expires: u32::MAX,
        ..CtValue::default()
    };
    let mut written = 0u64;
    for chunk in keys.chunks(4096) {
        signals::check()?;
        let values = vec![value; chunk.len()];
        written += u64::from(
            map_update_batch(&data, chunk, &values)
                .map_err(Error::io(format!("filling {}", path.display())))?,
        );
    }
    Ok(written)
}

/// Removes the flows [`fill_conntrack`] wrote.
pub fn clear_conntrack(maps_dir: &Path, count: u32) -> Result<()> {
    let path = maps_dir.join(CT_MAP);
    let data = MapData::from_pin(&path)
        .map_err(|e| Error::Setup(format!("opening {}: {e}", path.display())))?;
    let mut map: aya::maps::HashMap<_, Ct4Key, CtValue> =
        aya::maps::HashMap::try_from(Map::LruHashMap(data))
            .map_err(|e| Error::Setup(format!("{CT_MAP}: {e}")))?;
    for key in ct_keys(count) {
        // A flow the LRU already evicted is gone anyway.
        let _ = map.remove(&key);
    }
    Ok(())
}

/// `reps` reps of one program at one conntrack fill: in each, the program with the
/// statistics off and on (order alternating, ABBA); rows of both and, for
/// [`PROGRAM`], of their difference.
pub fn measure(
    (name, program): (&str, &Prog),
    (frame, verdict): (&[u8], u32),
    ct_entries: u64,
    (reps, repeat): (u32, u32),
) -> Result<Vec<Row>> {
    let run = || ns_per_run((name, program), frame, verdict, repeat);
    let metric_ns = format!("{name}_ns_per_packet");
    // Untimed: caches, the branch predictor and the CPU's clock settle.
    run()?;
    let mut rows = Vec::new();
    let row = |mode: &str, rep: u32, metric: &str, value: f64, ratio| Row {
        bench: BENCH,
        mode: mode.into(),
        n: ct_entries,
        rep: rep.to_string(),
        metric: metric.into(),
        value,
        unit: "ns",
        ratio,
    };
    for rep in 0..reps {
        signals::check()?;
        let mut off = 0.0;
        let mut on = 0.0;
        for stats_on in [false, true, true, false] {
            let stats_on = if rep.is_multiple_of(2) {
                stats_on
            } else {
                !stats_on
            };
            let ns = if stats_on {
                let _stats = StatsGuard::enable()?;
                run()?
            } else {
                run()?
            };
            if stats_on {
                on += ns / 2.0;
            } else {
                off += ns / 2.0;
            }
        }
        rows.push(row(MODE_TEST_RUN, rep, &metric_ns, off, None));
        let ratio = (off > 0.0).then(|| on / off);
        rows.push(row(MODE_TEST_RUN_STATS, rep, &metric_ns, on, ratio));
        if name == PROGRAM {
            let overhead = on - off;
            rows.push(row(
                MODE_TEST_RUN_STATS,
                rep,
                METRIC_STATS_OVERHEAD,
                overhead,
                None,
            ));
        }
    }
    Ok(rows)
}

/// Whether some other holder keeps the run-time statistics on (then "off" is not off).
pub fn stats_forced_on() -> bool {
    fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|v| v.trim() == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_well_formed() {
        let frame = measured_frame();
        assert_eq!(frame.len(), 54);
        assert_eq!(&frame[12..14], &[0x08, 0x00]);
        // A header with its checksum sums to 0xffff (its complement is 0).
        assert_eq!(ipv4_checksum(&frame[14..34]), 0);
        assert_eq!(&frame[26..30], &CLIENT_IP.octets());
        assert_eq!(u16::from_be_bytes([frame[36], frame[37]]), 9_000);
        let keys = ct_keys(1_000);
        let unique: std::collections::HashSet<_> =
            keys.iter().map(|k| (k.saddr, k.sport)).collect();
        assert_eq!(unique.len(), 1_000);
    }
}
