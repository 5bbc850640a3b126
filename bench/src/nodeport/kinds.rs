// SPDX-License-Identifier: Apache-2.0
//! What a NodePort benchmark sample is of: the attachment on the uplink, where the
//! backend lives, and the kind of traffic.

/// Where the agent's north-south program sits on the uplink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    /// tc only (`ebpf.xdpMode: off`).
    Tc,
    XdpGeneric,
    XdpNative,
}

impl Attach {
    pub const ALL: [Attach; 3] = [Attach::Tc, Attach::XdpGeneric, Attach::XdpNative];

    pub fn as_str(self) -> &'static str {
        match self {
            Attach::Tc => "tc",
            Attach::XdpGeneric => "xdp-generic",
            Attach::XdpNative => "xdp-native",
        }
    }

    /// The agent's `ebpf.xdpMode`.
    pub fn xdp_mode(self) -> &'static str {
        match self {
            Attach::Tc => "off",
            Attach::XdpGeneric => "generic",
            Attach::XdpNative => "native",
        }
    }
}

impl std::str::FromStr for Attach {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Attach::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| format!("unknown attachment {s:?} (tc, xdp-generic, xdp-native)"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A pod behind the node itself.
    Local,
    /// A pod behind another node: the NodePort's traffic is masqueraded and leaves again
    /// through the uplink.
    Remote,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::Remote => "remote",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "local" => Ok(Backend::Local),
            "remote" => Ok(Backend::Remote),
            other => Err(format!("unknown backend {other:?} (local, remote)")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    /// Connections: connect, 1-byte request, 1-byte answer, close.
    Tcp,
    /// Small datagrams, a window of them in flight, each answered.
    Udp,
}

impl Traffic {
    pub fn as_str(self) -> &'static str {
        match self {
            Traffic::Tcp => "tcp",
            Traffic::Udp => "udp",
        }
    }
}
