// SPDX-License-Identifier: Apache-2.0
//! Small python3 programs run inside a test topology's namespaces, for tests that need
//! long-lived TCP connections the scenario runner's one-shot probes don't give: a line-echo
//! backend, and how to start and watch such programs.

use std::{
    io::{BufRead, BufReader},
    net::IpAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
};

use crate::scenario::topology::Topology;

/// A line-echo server on port 9000 of `argv[1]`: every line comes back with the server's
/// address in front. Prints `ready` once it listens.
pub const STREAM_ECHO: &str = r#"
import socket, sys, threading
def serve(c):
    own = "%s:%d" % c.getsockname()[:2]
    f = c.makefile("rwb", buffering=0)
    for line in f:
        f.write(("%s %s" % (own, line.decode())).encode())
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], 9000)); l.listen(16); print("ready", flush=True)
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// `python3 -c script args...` where the pod (or client) with address `ip` lives.
pub fn python(topology: &Topology, ip: &str, script: &str, args: &[&str]) -> Command {
    let ip: IpAddr = ip.parse().expect("a test address");
    let mut all = vec!["-c".to_string(), script.to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    topology
        .client_place(ip)
        .command(Path::new("python3"), &all)
}

/// Starts a [`STREAM_ECHO`] backend on `ip` and waits until it listens.
pub fn start_backend(topology: &Topology, ip: &str) -> Child {
    start_ready(topology, ip, STREAM_ECHO)
}

/// Starts `script` where `ip` lives, with `ip` as its argument, and waits for the `ready`
/// line it prints once it listens.
pub fn start_ready(topology: &Topology, ip: &str, script: &str) -> Child {
    let mut child = python(topology, ip, script, &[ip])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 starts");
    let mut line = String::new();
    if let Some(stdout) = child.stdout.as_mut() {
        let _ = BufReader::new(stdout).read_line(&mut line);
    }
    assert_eq!(line.trim(), "ready", "the backend on {ip} started");
    child
}

/// Starts `command` and forwards each line it prints.
pub fn watch(mut command: Command) -> (Child, mpsc::Receiver<String>) {
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .expect("the watched program starts");
    let (tx, rx) = mpsc::channel::<String>();
    if let Some(stdout) = child.stdout.take() {
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
    }
    (child, rx)
}
