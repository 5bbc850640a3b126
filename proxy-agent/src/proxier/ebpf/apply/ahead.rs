// SPDX-License-Identifier: Apache-2.0
//! Writes that go to the maps while the rest of their sync is still being planned.
//!
//! A cold sync of 100,000 services admits them on one core for about a second, then the
//! kernel takes two million entries on one core for about as long, while the other core
//! sits idle for half of each. Half of those entries are backends, and backend and
//! reverse-NAT entries may be written before anything else of their sync: the plan writes
//! them first anyway (nothing refers to them until the slots that follow), and an id handed
//! out in a sync was not in use before it (ids freed by a sync are not handed out again
//! until it is written, see `ids`). So admission sends them on, a chunk at a time, to a
//! thread that writes them as they come ([`AheadWriter`]), and the sync writes only what
//! that thread did not.
//!
//! Only partial syncs write ahead: a full sync plans its writes by comparing everything
//! with what the maps hold, after admission. A chunk the thread could not write (a map
//! full because the plan outgrew the estimate it was grown to, or any error) goes back
//! to the front of the sync's writes, with every chunk after it, in their order; writing
//! an entry twice is harmless. A chunk admission cannot send (the writer's thread is gone)
//! stays in the plan.
//!
//! When admission is over before the thread has written everything (the maps grew first,
//! for a few tenths of a second), the core admission used would only wait: what is left is
//! written in two halves at once, the order of these entries mattering to nothing.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
    mpsc,
};

use super::{Op, PlannedSync, execute};
use crate::proxier::ebpf::maps::{LbMaps, MapOpError};

/// Backend and reverse-NAT writes sent on at a time: a few batches of the kernel's.
const CHUNK: usize = 32_768;

/// Writes sent on at once; the last one is admission's last.
struct Chunk {
    ops: Vec<Op>,
    last: bool,
}

/// Admission's end of the channel.
pub struct AheadSender {
    chunks: mpsc::Sender<Chunk>,
    /// Set as the last chunk is sent.
    admitted: Arc<AtomicBool>,
    /// Writes sent on at a time.
    chunk: usize,
    /// The writer is gone (its thread panicked): what is left stays in the plan.
    closed: bool,
}

/// The writing end: [`AheadWriter::write`] on the maps, or [`AheadWriter::give_back`] when
/// they must not be written yet.
pub struct AheadWriter {
    chunks: mpsc::Receiver<Chunk>,
    /// Admission is over: its last chunk is sent, or about to be.
    admitted: Arc<AtomicBool>,
}

/// What an [`AheadWriter`] did: the entries it wrote, and the writes it leaves to the sync.
#[derive(Debug, Default)]
pub struct WrittenAhead {
    written: usize,
    unwritten: Vec<Op>,
}

/// A channel from admission to a writer.
pub fn channel() -> (AheadSender, AheadWriter) {
    channel_of(CHUNK)
}

/// A channel sending `chunk` writes at a time.
fn channel_of(chunk: usize) -> (AheadSender, AheadWriter) {
    let (chunks, receiver) = mpsc::channel();
    let admitted = Arc::new(AtomicBool::new(false));
    (
        AheadSender {
            chunks,
            admitted: admitted.clone(),
            chunk,
            closed: false,
        },
        AheadWriter {
            chunks: receiver,
            admitted,
        },
    )
}

impl AheadSender {
    /// Sends `backend_puts` and `rev_nat_puts` on (backends first, as the plan orders
    /// them) once they make a chunk, or whatever they hold when `last` (then always: the
    /// writer learns that admission is over). A chunk that cannot be sent goes back into
    /// `backend_puts`: the plan writes it first, as the puts sent after it would have been.
    pub(super) fn offer(
        &mut self,
        backend_puts: &mut Vec<Op>,
        rev_nat_puts: &mut Vec<Op>,
        last: bool,
    ) {
        let pending = backend_puts.len() + rev_nat_puts.len();
        if self.closed || (pending < self.chunk && !last) {
            return;
        }
        let mut ops = std::mem::take(backend_puts);
        ops.append(rev_nat_puts);
        if last {
            self.admitted.store(true, Ordering::Release);
        }
        if let Err(mpsc::SendError(chunk)) = self.chunks.send(Chunk { ops, last }) {
            *backend_puts = chunk.ops;
            self.closed = true;
        }
    }
}

impl AheadWriter {
    /// Writes each chunk as it comes, until admission is over; what is left then goes in
    /// two halves at once. After a failed write it writes nothing more: those writes and
    /// the rest are left to the sync.
    pub fn write(self, maps: &mut LbMaps) -> WrittenAhead {
        let mut out = WrittenAhead::default();
        while let Ok(chunk) = self.chunks.recv() {
            if !out.unwritten.is_empty() {
                out.unwritten.extend(chunk.ops);
                continue;
            }
            if chunk.last || !self.admitted.load(Ordering::Acquire) {
                // No Maglev table is in a chunk: the table size is not used.
                if let Err(e) = execute(maps, &chunk.ops, 0).map(|(n, _)| out.written += n) {
                    tracing::debug!(error = %e, entries = chunk.ops.len(), "a write ahead of the plan failed: the sync writes it");
                    out.unwritten = chunk.ops;
                }
                continue;
            }
            // Everything up to the last chunk, which is sent or about to be.
            let mut ops = chunk.ops;
            for chunk in self.chunks.iter() {
                ops.extend(chunk.ops);
                if chunk.last {
                    break;
                }
            }
            if let Err(e) = write_in_halves(maps, &ops).map(|n| out.written += n) {
                tracing::debug!(error = %e, entries = ops.len(), "a write ahead of the plan failed: the sync writes it");
                out.unwritten = ops;
            }
        }
        out
    }

    /// Writes nothing: every chunk is left to the sync.
    pub fn give_back(self) -> WrittenAhead {
        WrittenAhead {
            written: 0,
            unwritten: self.chunks.into_iter().flat_map(|c| c.ops).collect(),
        }
    }
}

/// Writes `ops` (backend and reverse-NAT puts, see [`AheadSender::offer`]) in two halves
/// at once, each map's entries split in the middle; any other write goes in order after.
/// The entries written.
fn write_in_halves(maps: &mut LbMaps, ops: &[Op]) -> Result<usize, MapOpError> {
    let mut backends = Vec::with_capacity(ops.len());
    let mut rev_nats = Vec::new();
    let mut others = Vec::new();
    for op in ops {
        match op {
            Op::PutBackend(id, entry) => backends.push((*id, entry)),
            Op::PutRevNat(id, addr, port) => rev_nats.push((*id, *addr, *port)),
            other => others.push(other.clone()),
        }
    }
    let (first, second) = backends.split_at(backends.len() / 2);
    maps.put_backends_in_parts([first.iter().copied(), second.iter().copied()])?;
    let (first, second) = rev_nats.split_at(rev_nats.len() / 2);
    maps.put_rev_nats_in_parts([first.iter().copied(), second.iter().copied()])?;
    let (written, _) = execute(maps, &others, 0)?;
    Ok(backends.len() + rev_nats.len() + written)
}

impl PlannedSync {
    /// Takes back what `ahead` left unwritten (first, as it came first) and counts what it
    /// wrote among the sync's writes.
    pub fn take_back(&mut self, ahead: WrittenAhead) {
        self.written_ahead += ahead.written;
        if !ahead.unwritten.is_empty() {
            let rest = std::mem::take(&mut self.ops);
            self.ops = ahead.unwritten;
            self.ops.extend(rest);
        }
    }
}

#[cfg(test)]
mod tests {
    use proxy_common::maps::{BACKENDS4, REV_NAT4, SVC4};

    use super::*;
    use crate::{
        k8s::fixtures::{mk_endpoint, mk_endpointslice, mk_service},
        proxier::{
            SyncStats,
            ebpf::{
                apply_tests::Harness,
                desired::BackendAddr,
                entries::BackendEntry,
                maps::{LbMaps, Op as LoggedOp},
            },
        },
    };

    fn service(h: &mut Harness, n: usize, endpoints: usize) {
        let name = format!("svc-{n}");
        h.service(
            mk_service("ns", &name)
                .cluster_ip(&format!("172.30.0.{n}"))
                .port("http", 80, "TCP")
                .build(),
        );
        let mut slice =
            mk_endpointslice("ns", &format!("{name}-1"), &name, "IPv4").port("http", 8080, "TCP");
        for e in 0..endpoints {
            slice = slice.endpoint(mk_endpoint(&format!("10.1.{n}.{e}")).node("node-b").build());
        }
        h.slice(slice.build());
    }

    /// A partial sync whose backend and reverse-NAT entries are written ahead, `chunk` at
    /// a time, on another thread while the services are admitted: the logged writes and
    /// the stats.
    fn sync_writing_ahead(h: &mut Harness, chunk: usize) -> (Vec<LoggedOp>, SyncStats, usize) {
        let prepared = h.prepare_pending(false);
        h.log.lock().unwrap().clear();
        let (sender, writer) = channel_of(chunk);
        let Harness {
            cluster,
            node,
            apply,
            maps,
            ..
        } = h;
        let (mut planned, ahead) = std::thread::scope(|scope| {
            let writing = scope.spawn(|| writer.write(maps));
            let planned =
                apply.admit_writing_ahead(prepared, cluster.families(), node, Some(sender));
            (planned, writing.join().expect("the writer does not panic"))
        });
        let written_ahead = ahead.written;
        planned.take_back(ahead);
        let stats = apply.execute(maps, planned).expect("the sync is written");
        (h.log.lock().unwrap().clone(), stats, written_ahead)
    }

    fn put_into(map: &'static str) -> impl Fn(&LoggedOp) -> bool {
        move |op| matches!(op, LoggedOp::Put { map: m, .. } if *m == map)
    }

    /// The same changes, synced plainly and written ahead in chunks of three.
    #[test]
    fn writes_ahead_leave_the_maps_as_a_plain_sync_does_and_come_before_any_slot() {
        let mut plain = Harness::new();
        let mut ahead = Harness::new();
        let steps: [&dyn Fn(&mut Harness); 3] = [
            // A cold start: several chunks of new backends and frontends.
            &|h| (1..=6).for_each(|n| service(h, n, 3)),
            // Scaled up and down, one service gone, one new: puts and deletes.
            &|h| {
                service(h, 1, 5);
                service(h, 2, 1);
                h.delete_service(
                    mk_service("ns", "svc-3")
                        .cluster_ip("172.30.0.3")
                        .port("http", 80, "TCP")
                        .build(),
                );
                service(h, 7, 4);
            },
            // No change: nothing to send ahead.
            &|h| service(h, 4, 3),
        ];
        for (i, step) in steps.iter().enumerate() {
            step(&mut plain);
            step(&mut ahead);
            let (_, plain_stats) = plain.sync_with_stats(false);
            let (log, stats, written_ahead) = sync_writing_ahead(&mut ahead, 3);
            // Six services of three backends and a reverse-NAT entry each; then svc-1's
            // two new backends and svc-7's four and its reverse-NAT entry; then nothing.
            assert_eq!(
                written_ahead,
                [24, 7, 0][i],
                "step {i}: entries written ahead"
            );
            assert_eq!(
                ahead.maps.snapshot().unwrap(),
                plain.maps.snapshot().unwrap(),
                "step {i}: the maps hold the same"
            );
            assert_eq!(
                stats.written, plain_stats.written,
                "step {i}: writes counted"
            );
            assert_eq!(
                stats.deleted, plain_stats.deleted,
                "step {i}: deletes counted"
            );
            if let Some(first_slot) = log.iter().position(put_into(SVC4)) {
                for map in [BACKENDS4, REV_NAT4] {
                    if let Some(last) = log.iter().rposition(put_into(map)) {
                        assert!(
                            last < first_slot,
                            "step {i}: {map} written after a slot: {log:#?}"
                        );
                    }
                }
            }
        }
        assert!(
            ahead
                .backends_of("172.30.0.1", 80, proxy_common::SCOPE_EXTERNAL)
                .len()
                == 5
        );
    }

    /// The same changes, synced plainly and written ahead only once admission is over:
    /// every chunk is queued by then, and they go in two halves at once.
    #[test]
    fn what_is_left_when_admission_is_over_goes_in_halves_and_leaves_the_same_maps() {
        let mut plain = Harness::new();
        let mut ahead = Harness::new();
        for h in [&mut plain, &mut ahead] {
            (1..=6).for_each(|n| service(h, n, 3));
        }
        let (_, plain_stats) = plain.sync_with_stats(false);

        let prepared = ahead.prepare_pending(false);
        ahead.log.lock().unwrap().clear();
        let (sender, writer) = channel_of(3);
        let mut planned = ahead.apply.admit_writing_ahead(
            prepared,
            ahead.cluster.families(),
            &ahead.node,
            Some(sender),
        );
        let queued: Vec<Chunk> = writer.chunks.try_iter().collect();
        assert!(queued.len() > 2, "several chunks wait");
        assert_eq!(
            queued.iter().map(|c| c.last).collect::<Vec<_>>(),
            [vec![false; queued.len() - 1], vec![true]].concat(),
            "the last chunk says so"
        );
        let (resend, writer) = channel_of(3);
        for chunk in queued {
            resend.chunks.send(chunk).unwrap();
        }
        // As the writer finds it when admission ended while it was busy.
        resend.admitted.store(true, Ordering::Release);
        drop(resend);
        let written = writer.write(&mut ahead.maps);
        // Six services of three backends and a reverse-NAT entry each.
        assert_eq!(written.written, 24);
        assert!(written.unwritten.is_empty());
        // Each map's entries together (chunk by chunk, a chunk's reverse-NAT entries
        // came before the next chunk's backends).
        let log = ahead.log.lock().unwrap().clone();
        let last_backend = log.iter().rposition(put_into(BACKENDS4)).unwrap();
        let first_rev_nat = log.iter().position(put_into(REV_NAT4)).unwrap();
        assert!(last_backend < first_rev_nat, "{log:#?}");
        planned.take_back(written);
        let stats = ahead.apply.execute(&mut ahead.maps, planned).unwrap();
        assert_eq!(
            ahead.maps.snapshot().unwrap(),
            plain.maps.snapshot().unwrap()
        );
        assert_eq!(stats.written, plain_stats.written);
    }

    /// Eight backends left when admission is over, for a map with room for five: the
    /// halves fail, and all eight go back to the sync (an entry written twice is harmless).
    #[test]
    fn halves_that_fail_go_back_whole() {
        let (mut maps, _) = LbMaps::in_memory_with(|name| if name == BACKENDS4 { 5 } else { 1024 });
        let (mut sender, writer) = channel_of(2);
        let puts: Vec<Op> = (1..=8).map(backend_put).collect();
        for (i, pair) in puts.chunks(2).enumerate() {
            sender.offer(&mut pair.to_vec(), &mut Vec::new(), i == 3);
        }
        drop(sender);
        let ahead = writer.write(&mut maps);
        assert_eq!(ahead.written, 0);
        assert_eq!(ahead.unwritten, puts);
    }

    fn backend_put(id: u32) -> Op {
        Op::PutBackend(
            id,
            BackendEntry {
                addr: BackendAddr {
                    addr: format!("10.2.0.{id}").parse().unwrap(),
                    port: 8080,
                    proto: 6,
                },
                local: false,
                terminating: false,
            },
        )
    }

    /// Four chunks of two into a backend map with room for five: the third chunk fails at
    /// its second entry, and it goes back whole, with the fourth, in front of the sync's
    /// own writes.
    #[test]
    fn a_chunk_that_fails_goes_back_whole_with_every_chunk_after_it() {
        let (mut maps, _) = LbMaps::in_memory_with(|name| if name == BACKENDS4 { 5 } else { 1024 });
        let (mut sender, writer) = channel_of(2);
        let puts: Vec<Op> = (1..=8).map(backend_put).collect();
        for pair in puts.chunks(2) {
            sender.offer(&mut pair.to_vec(), &mut Vec::new(), false);
        }
        drop(sender);
        let ahead = writer.write(&mut maps);
        assert_eq!(ahead.written, 4);
        assert_eq!(ahead.unwritten, puts[4..]);

        let mut h = Harness::new();
        service(&mut h, 1, 2);
        let mut planned = h.plan_pending(false);
        let own = planned.ops.clone();
        planned.take_back(ahead);
        assert_eq!(planned.ops[..4], puts[4..]);
        assert_eq!(planned.ops[4..], own[..]);
        assert_eq!(planned.written_ahead, 4);
    }

    #[test]
    fn writes_given_back_are_all_left_to_the_sync_in_their_order() {
        let (mut sender, writer) = channel_of(2);
        let puts: Vec<Op> = (1..=5).map(backend_put).collect();
        // Below a chunk: kept where they are until there is one.
        let mut backends = puts[..1].to_vec();
        sender.offer(&mut backends, &mut Vec::new(), false);
        assert_eq!(backends, puts[..1]);
        backends.extend_from_slice(&puts[1..3]);
        sender.offer(&mut backends, &mut Vec::new(), false);
        assert!(backends.is_empty());
        // The last offer sends what is left, backends before reverse-NAT entries.
        let (mut backends, mut rev_nat) = (puts[3..4].to_vec(), puts[4..].to_vec());
        sender.offer(&mut backends, &mut rev_nat, true);
        assert!(backends.is_empty() && rev_nat.is_empty());
        drop(sender);
        let ahead = writer.give_back();
        assert_eq!(ahead.written, 0);
        assert_eq!(ahead.unwritten, puts);
    }

    /// With the writer gone, nothing is lost: the chunk stays in the plan's backend puts,
    /// in order, and no more is sent.
    #[test]
    fn a_chunk_that_cannot_be_sent_stays_in_the_plan() {
        let (mut sender, writer) = channel_of(2);
        drop(writer);
        let puts: Vec<Op> = (1..=4).map(backend_put).collect();
        let (mut backends, mut rev_nat) = (puts[..2].to_vec(), puts[2..3].to_vec());
        sender.offer(&mut backends, &mut rev_nat, false);
        assert_eq!(backends, puts[..3]);
        assert!(rev_nat.is_empty());
        backends.push(puts[3].clone());
        sender.offer(&mut backends, &mut rev_nat, true);
        assert_eq!(backends, puts);
    }
}
