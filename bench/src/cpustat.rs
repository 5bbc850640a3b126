// SPDX-License-Identifier: Apache-2.0
//! CPU time stolen by the hypervisor while a rep ran, from /proc/stat: on a shared virtual
//! machine it is the main source of noise, and a reader of the results needs to know it.

use std::fs;

/// Jiffies of some CPUs: all of them, and the stolen ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub total: u64,
    pub steal: u64,
}

/// Sums the `cpuN` lines of /proc/stat text for `cpus` (the aggregate `cpu` line when
/// `cpus` is empty). `None` when a CPU is missing.
pub fn parse_proc_stat(text: &str, cpus: &[usize]) -> Option<CpuTimes> {
    let wanted: Vec<String> = if cpus.is_empty() {
        vec!["cpu".to_string()]
    } else {
        cpus.iter().map(|c| format!("cpu{c}")).collect()
    };
    let mut sum = CpuTimes::default();
    for name in &wanted {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
        let fields: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        // user nice system idle iowait irq softirq steal [guest guest_nice]; guest time
        // is already counted in user and nice.
        sum.total += fields.iter().take(8).sum::<u64>();
        sum.steal += fields.get(7).copied().unwrap_or(0);
    }
    Some(sum)
}

pub fn read(cpus: &[usize]) -> Option<CpuTimes> {
    parse_proc_stat(&fs::read_to_string("/proc/stat").ok()?, cpus)
}

/// Percent of the time between two readings that was stolen.
pub fn steal_percent(before: CpuTimes, after: CpuTimes) -> Option<f64> {
    let total = after.total.checked_sub(before.total)?;
    let steal = after.steal.checked_sub(before.steal)?;
    (total > 0).then(|| 100.0 * steal as f64 / total as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 0 50 800 10 0 5 35 7 0\n\
                        cpu0 60 0 20 400 5 0 5 10 7 0\n\
                        cpu1 40 0 30 400 5 0 0 25 0 0\n\
                        intr 12345\n";

    #[test]
    fn sums_the_chosen_cpus() {
        assert_eq!(
            parse_proc_stat(STAT, &[]),
            Some(CpuTimes {
                total: 1000,
                steal: 35
            })
        );
        assert_eq!(
            parse_proc_stat(STAT, &[1]),
            Some(CpuTimes {
                total: 500,
                steal: 25
            })
        );
        assert_eq!(parse_proc_stat(STAT, &[0, 1]), parse_proc_stat(STAT, &[]));
        assert_eq!(parse_proc_stat(STAT, &[2]), None);
    }

    #[test]
    fn steal_share_between_readings() {
        let before = CpuTimes {
            total: 1000,
            steal: 35,
        };
        let after = CpuTimes {
            total: 1400,
            steal: 135,
        };
        assert_eq!(steal_percent(before, after), Some(25.0));
        assert_eq!(steal_percent(before, before), None);
        assert_eq!(steal_percent(after, before), None);
        assert!(read(&[]).is_some());
    }
}
