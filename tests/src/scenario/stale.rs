// SPDX-License-Identifier: Apache-2.0
//! `cleanup-stale`: removes what crashed runs left behind (namespaces, cgroups, bpffs
//! pins, run directories), sparing runs whose runner process is still alive.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use super::{
    error::Result,
    netns,
    topology::{run_id_of, runs_dir},
};

fn runner_alive(run_dir: &Path) -> bool {
    fs::read_to_string(run_dir.join("runner.pid"))
        .ok()
        .and_then(|pid| pid.trim().parse::<u32>().ok())
        .is_some_and(|pid| pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists())
}

fn entries(dir: &Path) -> Vec<(String, PathBuf)> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect()
}

/// Removes leftovers; returns a line per thing removed.
pub fn cleanup_stale() -> Result<Vec<String>> {
    let live: BTreeSet<String> = entries(&runs_dir())
        .into_iter()
        .filter(|(_, path)| runner_alive(path))
        .map(|(name, _)| name)
        .collect();
    let stale = |name: &str| run_id_of(name).is_some_and(|id| !live.contains(id));
    let mut removed = Vec::new();

    let cgroup_root = netns::cgroup2_root()?;
    for (name, path) in entries(&cgroup_root) {
        if stale(&name) && path.is_dir() {
            match netns::remove_cgroup(&path) {
                Ok(()) => removed.push(format!("cgroup {}", path.display())),
                Err(err) => eprintln!("{err}"),
            }
        }
    }
    for name in netns::list_netns()? {
        if stale(&name) {
            match netns::delete_netns(&name) {
                Ok(()) => removed.push(format!("netns {name}")),
                Err(err) => eprintln!("{err}"),
            }
        }
    }
    for (dir, what) in [
        (PathBuf::from("/sys/fs/bpf"), "bpffs pins"),
        (runs_dir(), "run dir"),
    ] {
        for (name, path) in entries(&dir) {
            if stale(&name) && path.is_dir() {
                match fs::remove_dir_all(&path) {
                    Ok(()) => removed.push(format!("{what} {}", path.display())),
                    Err(err) => eprintln!("removing {}: {err}", path.display()),
                }
            }
        }
    }
    Ok(removed)
}
