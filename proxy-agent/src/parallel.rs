// SPDX-License-Identifier: Apache-2.0
//! One big piece of work split over the machine's cores: what a cold start of a large
//! cluster (100,000 services) does to every object or service, where each one's work is
//! independent of the others' (decoding a manifest's objects, checking out each service's
//! endpoints, working out what each service should have in the maps).
//!
//! Why by hand and not rayon: rayon keeps a pool of threads for the life of the process,
//! each with its allocator's cache, while this agent works in parallel only during a cold
//! start or a change of thousands of services, and its memory is budgeted. Scoped threads
//! started for one split and gone after it cost tens of microseconds per split and nothing
//! between splits; the parts are contiguous, so results come back in the items' order
//! without sorting.

/// At most this many threads share one piece of work.
pub const MAX_WORKERS: usize = 4;

/// How many threads should share `len` items: one below `min` (a thread costs more than
/// what it would take over), otherwise one per core, up to [`MAX_WORKERS`].
pub fn workers_for(len: usize, min: usize) -> usize {
    if len < min {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_WORKERS))
}

/// Runs `f` on `workers` contiguous parts of `items` at once (the calling thread takes the
/// first part) and returns the parts' results in the parts' order. One worker, or no more
/// than one item, runs `f` once on the calling thread. A panic in a part is raised again on
/// the calling thread, as it would have been without the split.
pub fn map_parts<T: Send, R: Send>(
    items: &mut [T],
    workers: usize,
    f: impl Fn(&mut [T]) -> R + Sync,
) -> Vec<R> {
    if workers <= 1 || items.len() <= 1 {
        return vec![f(items)];
    }
    let share = items.len().div_ceil(workers);
    let f = &f;
    std::thread::scope(|scope| {
        let mut parts = items.chunks_mut(share);
        let first = parts.next().unwrap_or_default();
        let others: Vec<_> = parts.map(|part| scope.spawn(move || f(part))).collect();
        let mut out = Vec::with_capacity(others.len() + 1);
        out.push(f(first));
        for handle in others {
            match handle.join() {
                Ok(part) => out.push(part),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}

/// [`map_parts`] for work that yields one result per item: the results, in the items'
/// order.
pub fn map_each<T: Send, R: Send>(
    items: &mut [T],
    workers: usize,
    f: impl Fn(&mut T) -> R + Sync,
) -> Vec<R> {
    let parts = map_parts(items, workers, |part| {
        part.iter_mut().map(&f).collect::<Vec<R>>()
    });
    let mut out = Vec::with_capacity(items.len());
    for part in parts {
        out.extend(part);
    }
    out
}

/// Runs `a` and `b`, at once on two threads when `parallel` (the calling thread runs `a`),
/// one after the other otherwise: two big independent pieces of work, such as the
/// services and the endpoint slices of a cold start, which go to tables of their own.
/// A panic in `b` is raised again on the calling thread.
pub fn both<A: Send, B: Send>(
    parallel: bool,
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    if !parallel {
        let a = a();
        return (a, b());
    }
    std::thread::scope(|scope| {
        let b = scope.spawn(b);
        let a = a();
        match b.join() {
            Ok(b) => (a, b),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_the_items_order_whatever_the_split() {
        for workers in 1..=5 {
            for len in [0usize, 1, 2, 7, 1000] {
                let mut items: Vec<usize> = (0..len).collect();
                let doubled = map_each(&mut items, workers, |i| *i * 2);
                assert_eq!(doubled, (0..len).map(|i| i * 2).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn each_part_may_change_its_items() {
        let mut items: Vec<u32> = (0..100).collect();
        let sums = map_parts(&mut items, 3, |part| {
            part.iter_mut().for_each(|i| *i += 1);
            part.iter().sum::<u32>()
        });
        assert_eq!(sums.len(), 3);
        assert_eq!(sums.iter().sum::<u32>(), (1..=100).sum::<u32>());
        assert_eq!(items, (1..=100).collect::<Vec<_>>());
    }

    #[test]
    fn small_work_stays_on_the_calling_thread() {
        assert_eq!(workers_for(10, 4096), 1);
        assert!(workers_for(10_000, 4096) >= 1);
        assert!(workers_for(10_000, 4096) <= MAX_WORKERS);
        let caller = std::thread::current().id();
        let mut items = vec![1, 2, 3];
        let threads = map_parts(&mut items, 1, |_| std::thread::current().id());
        assert_eq!(threads, vec![caller]);
    }

    #[test]
    fn both_runs_each_once_on_its_own_thread_when_parallel() {
        let caller = std::thread::current().id();
        let (a, b) = both(
            true,
            || std::thread::current().id(),
            || std::thread::current().id(),
        );
        assert_eq!(a, caller);
        assert_ne!(b, caller);
        let (a, b) = both(
            false,
            || std::thread::current().id(),
            || std::thread::current().id(),
        );
        assert_eq!((a, b), (caller, caller));
        assert_eq!(both(false, || 1, || 2), (1, 2));
    }

    #[test]
    #[should_panic(expected = "second failed")]
    fn a_panic_in_the_second_reaches_the_caller() {
        both(true, || 1, || -> u32 { panic!("second failed") });
    }

    #[test]
    #[should_panic(expected = "part failed")]
    fn a_panic_in_a_part_reaches_the_caller() {
        let mut items: Vec<u32> = (0..10).collect();
        map_parts(&mut items, 2, |part| {
            if part.contains(&9) {
                panic!("part failed");
            }
        });
    }
}
