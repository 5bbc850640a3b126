// SPDX-License-Identifier: Apache-2.0
//! What one measured step costs: wall time, and CPU time of the thread that ran it plus
//! that of the child processes it waited for (iptables-restore, iptables-save, iptables).
//! Both sides of a comparison run on such a thread, so the baseline's own spawning and
//! writing of the input counts as the proxier's does.

use std::{
    fs::File,
    path::Path,
    time::{Duration, Instant},
};

use nix::{
    sched::{CloneFlags, setns},
    sys::resource::{UsageWho, getrusage},
};

use super::super::error::{Error, Result};

/// The cost of one step.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Cost {
    pub wall: Duration,
    /// The measuring thread's user + system time.
    pub cpu_self: Duration,
    /// User + system time of the child processes that ended during the step.
    pub cpu_children: Duration,
}

impl Cost {
    pub fn cpu(&self) -> Duration {
        self.cpu_self + self.cpu_children
    }
}

fn cpu_of(who: UsageWho) -> Duration {
    match getrusage(who) {
        Ok(usage) => {
            let to = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
                    + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
            };
            to(usage.user_time()) + to(usage.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// The calling thread's CPU time, to the nanosecond (getrusage counts in scheduler ticks,
/// too coarse for a one-service sync of a fraction of a millisecond).
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or(Duration::ZERO)
}

/// Runs `step` on the calling thread and measures it. Children are counted process-wide:
/// the caller must be the only thread of the process that waits for children meanwhile
/// (the benchmark runs one step at a time).
pub fn measure<T>(step: impl FnOnce() -> T) -> (T, Cost) {
    let self_before = thread_cpu();
    let children_before = cpu_of(UsageWho::RUSAGE_CHILDREN);
    let started = Instant::now();
    let out = step();
    let wall = started.elapsed();
    let cost = Cost {
        wall,
        cpu_self: thread_cpu().saturating_sub(self_before),
        cpu_children: cpu_of(UsageWho::RUSAGE_CHILDREN).saturating_sub(children_before),
    };
    (out, cost)
}

/// Runs `body` on a scoped thread inside the network namespace at `ns_path` (so it may
/// borrow), and returns its result. The processes it starts inherit the namespace.
pub fn in_netns_scoped<T: Send>(ns_path: &Path, body: impl FnOnce() -> T + Send) -> Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let file = File::open(ns_path)
                    .map_err(Error::io(format!("opening {}", ns_path.display())))?;
                setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| {
                    Error::Setup(format!("entering {}: {source}", ns_path.display()))
                })?;
                Ok(body())
            })
            .join()
            .map_err(|_| Error::Setup("a namespaced benchmark thread panicked".into()))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_thread_and_its_children() {
        let ((), busy) = measure(|| {
            let until = Instant::now() + Duration::from_millis(60);
            let mut x = 0u64;
            while Instant::now() < until {
                x = x.wrapping_add(1);
            }
            std::hint::black_box(x);
        });
        assert!(busy.wall >= Duration::from_millis(60));
        // However busy the machine, the spinning thread got some CPU, and never more
        // than the time that passed (one thread, one CPU at a time).
        assert!(busy.cpu_self > Duration::ZERO, "{busy:?}");
        assert!(
            busy.cpu_self <= busy.wall + Duration::from_millis(10),
            "{busy:?}"
        );
        let ((), child) = measure(|| {
            let status = std::process::Command::new("sh")
                .args(["-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"])
                .status()
                .unwrap();
            assert!(status.success());
        });
        assert!(child.cpu_children > Duration::ZERO, "{child:?}");
        assert_eq!(child.cpu(), child.cpu_self + child.cpu_children);
    }
}
