// SPDX-License-Identifier: Apache-2.0
//! Who lists and destroys the sockets: the agent itself, or the `socket-terminator`
//! sidecar of the DaemonSet.
//!
//! Entering the pods' namespaces needs CAP_SYS_ADMIN, which the agent's container does not
//! get (deploy/daemonset.yaml keeps the long-running agent, the process that talks to the
//! API server and serves metrics, to the capabilities the dataplane needs). The DaemonSet
//! therefore runs the same binary as a small sidecar, `proxy-agent socket-terminator`,
//! with CAP_SYS_ADMIN and CAP_NET_ADMIN only, no network listener and no API access: it
//! answers two requests on a unix socket in a volume only the pod's containers share,
//! "list the connected UDP sockets of every namespace" and "destroy these sockets", one
//! JSON line each way. It touches no BPF map: which sockets our programs translated, and
//! which of those to destroy, is decided in the agent.
//!
//! [`Auto`] uses the sidecar when its socket exists and the agent's own threads
//! otherwise (a privileged agent, the test harness, `--source` demos).

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::{
        fs::PermissionsExt as _,
        net::{UnixListener, UnixStream},
    },
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::{
    diag::SockId,
    namespaces::{self, Destroyed, Listing, Netns},
};

/// Where the DaemonSet's sidecar listens (an emptyDir both containers mount).
pub const SIDECAR_SOCKET: &str = "/run/kube-proxy-ebpf/socket-terminator/socket";
/// Where the host's named network namespaces are (containerd, CRI-O, `ip netns`).
pub const NETNS_DIR: &str = "/run/netns";

/// How long the agent waits for the sidecar's answer (a sync waits with it).
const SIDECAR_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ReachError {
    #[error("the socket-terminator sidecar at {path}: {source}")]
    Sidecar {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the socket-terminator sidecar's answer: {0}")]
    Answer(String),
}

pub type Result<T, E = ReachError> = std::result::Result<T, E>;

/// Lists connected UDP sockets and destroys them, wherever they are.
pub trait SocketReach: Send {
    fn list(&mut self) -> Result<Listing>;
    fn destroy(&mut self, targets: Vec<(Netns, SockId)>) -> Result<Destroyed>;
    /// Who does it, for the log.
    fn describe(&self) -> String;
}

/// The agent's own threads.
pub struct Local {
    pub netns_dir: PathBuf,
}

impl SocketReach for Local {
    fn list(&mut self) -> Result<Listing> {
        Ok(namespaces::list_connected(&self.netns_dir))
    }

    fn destroy(&mut self, targets: Vec<(Netns, SockId)>) -> Result<Destroyed> {
        Ok(namespaces::destroy(targets))
    }

    fn describe(&self) -> String {
        format!("the agent (namespaces under {})", self.netns_dir.display())
    }
}

/// One request to the sidecar.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    List,
    Destroy { targets: Vec<(Netns, SockId)> },
}

/// The sidecar's answer.
#[derive(Debug, Serialize, Deserialize)]
pub enum Response {
    Listed(Listing),
    Destroyed(Destroyed),
    Refused(String),
}

/// The sidecar, reached over its unix socket.
pub struct Sidecar {
    pub socket: PathBuf,
}

impl Sidecar {
    fn ask(&self, request: &Request) -> Result<Response> {
        let io = |source| ReachError::Sidecar {
            path: self.socket.clone(),
            source,
        };
        let mut stream = UnixStream::connect(&self.socket).map_err(io)?;
        stream.set_read_timeout(Some(SIDECAR_TIMEOUT)).map_err(io)?;
        stream
            .set_write_timeout(Some(SIDECAR_TIMEOUT))
            .map_err(io)?;
        let mut line =
            serde_json::to_vec(request).map_err(|e| ReachError::Answer(e.to_string()))?;
        line.push(b'\n');
        stream.write_all(&line).map_err(io)?;
        let mut answer = String::new();
        BufReader::new(stream).read_line(&mut answer).map_err(io)?;
        serde_json::from_str(&answer).map_err(|e| ReachError::Answer(format!("{e}: {answer:?}")))
    }
}

impl SocketReach for Sidecar {
    fn list(&mut self) -> Result<Listing> {
        match self.ask(&Request::List)? {
            Response::Listed(listing) => Ok(listing),
            other => Err(ReachError::Answer(format!("{other:?}"))),
        }
    }

    fn destroy(&mut self, targets: Vec<(Netns, SockId)>) -> Result<Destroyed> {
        match self.ask(&Request::Destroy { targets })? {
            Response::Destroyed(done) => Ok(done),
            other => Err(ReachError::Answer(format!("{other:?}"))),
        }
    }

    fn describe(&self) -> String {
        format!("the socket-terminator sidecar at {}", self.socket.display())
    }
}

/// The sidecar when its socket exists, the agent's own threads otherwise (decided at each
/// call: the sidecar may start after the agent, or go away).
pub struct Auto {
    pub sidecar_socket: PathBuf,
    pub netns_dir: PathBuf,
}

impl Auto {
    fn pick(&self) -> Box<dyn SocketReach> {
        if self.sidecar_socket.exists() {
            Box::new(Sidecar {
                socket: self.sidecar_socket.clone(),
            })
        } else {
            Box::new(Local {
                netns_dir: self.netns_dir.clone(),
            })
        }
    }
}

impl SocketReach for Auto {
    fn list(&mut self) -> Result<Listing> {
        self.pick().list()
    }

    fn destroy(&mut self, targets: Vec<(Netns, SockId)>) -> Result<Destroyed> {
        self.pick().destroy(targets)
    }

    fn describe(&self) -> String {
        self.pick().describe()
    }
}

/// Answers one request (the sidecar's work, also reachable without a socket for tests).
pub fn answer(request: Request, netns_dir: &Path) -> Response {
    match request {
        Request::List => Response::Listed(namespaces::list_connected(netns_dir)),
        Request::Destroy { targets } => Response::Destroyed(namespaces::destroy(targets)),
    }
}

/// The sidecar: serves requests on `socket` (mode 0600) until an I/O error on it.
pub fn serve(socket: &Path, netns_dir: &Path) -> std::io::Result<()> {
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // A socket file left by an earlier run refuses the bind.
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(socket)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    info!(socket = %socket.display(), netns_dir = %netns_dir.display(), "socket terminator listening");
    for stream in listener.incoming() {
        let stream = stream?;
        if let Err(e) = serve_one(stream, netns_dir) {
            warn!(error = %e, "a socket-terminator request failed");
        }
    }
    Ok(())
}

fn serve_one(stream: UnixStream, netns_dir: &Path) -> std::io::Result<()> {
    stream.set_read_timeout(Some(SIDECAR_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let response = match serde_json::from_str::<Request>(&line) {
        Ok(request) => answer(request, netns_dir),
        Err(e) => Response::Refused(format!("not a request: {e}")),
    };
    let mut out = serde_json::to_vec(&response).map_err(std::io::Error::other)?;
    out.push(b'\n');
    (&stream).write_all(&out)
}
