// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Connection tracking of translated north-south flows. Each flow has two entries with the
//! same value: the forward key (client -> frontend, as it arrives) and the reply key
//! (backend -> client, or backend -> SNAT address). Lifetimes are refreshed in place by
//! every packet; a FIN or RST shortens them; the LRU map evicts under pressure and the
//! agent deletes expired entries.

use aya_ebpf::helpers::{bpf_get_prandom_u32, bpf_ktime_get_coarse_ns};
use proxy_common::{
    CT_DIR_FORWARD, CT_DIR_REPLY, CT_F_CLOSING, CT_F_SNAT, CtValue, LbConfig, proto,
};

use super::{
    PacketFamily,
    parse::{TCP_FIN, TCP_RST},
};
use crate::{maps::LB_CONFIG_V1, packet::Packet};

const DEFAULT_TCP_LIFETIME: u32 = 21_600;
const DEFAULT_UDP_LIFETIME: u32 = 60;
const DEFAULT_CLOSING_LIFETIME: u32 = 10;

#[inline(always)]
pub fn now() -> u32 {
    // SAFETY: a helper without pointer arguments.
    (unsafe { bpf_ktime_get_coarse_ns() } / 1_000_000_000) as u32
}

static DEFAULT_CONFIG: LbConfig = LbConfig {
    host_netns_cookie: 0,
    masq4: 0,
    masq6: [0; 16],
    flags: 0,
    ct_tcp_lifetime: 0,
    ct_udp_lifetime: 0,
    ct_closing_lifetime: 0,
    snat_port_min: 0,
    snat_port_max: 0,
};

#[inline(always)]
pub fn config() -> &'static LbConfig {
    LB_CONFIG_V1.get(0).unwrap_or(&DEFAULT_CONFIG)
}

#[inline(always)]
fn or(v: u32, default: u32) -> u32 {
    if v == 0 { default } else { v }
}

/// Lifetime of a flow after a packet with `tcp_flags`.
#[inline(always)]
pub fn lifetime(cfg: &LbConfig, p: u8, closing: bool) -> u32 {
    if p == proto::TCP {
        if closing {
            or(cfg.ct_closing_lifetime, DEFAULT_CLOSING_LIFETIME)
        } else {
            or(cfg.ct_tcp_lifetime, DEFAULT_TCP_LIFETIME)
        }
    } else {
        or(cfg.ct_udp_lifetime, DEFAULT_UDP_LIFETIME)
    }
}

/// A live entry, refreshed for this packet; `None` when absent or expired. The reference
/// points into the map (no copy: the stack is small).
#[inline(always)]
pub fn touch<A>(
    entry: Option<*mut CtValue>,
    p: &Packet<A>,
    cfg: &LbConfig,
) -> Option<&'static CtValue> {
    let ptr = entry?;
    let t = now();
    // SAFETY: the pointer comes from a map lookup and stays valid for this program run.
    let value = unsafe { &mut *ptr };
    if value.expires < t {
        return None;
    }
    if p.tcp_flags & (TCP_FIN | TCP_RST) != 0 {
        value.flags |= CT_F_CLOSING;
    }
    value.expires = t + lifetime(cfg, p.proto, value.flags & CT_F_CLOSING != 0);
    Some(value)
}

/// The reply key of a flow: what the backend's answer looks like.
#[inline(always)]
pub fn reply_key<F: PacketFamily>(v: &CtValue, p: u8) -> F::CtKey {
    let (daddr, dport) = if v.flags & CT_F_SNAT != 0 {
        (F::from16(&v.snat_addr), v.snat_port)
    } else {
        (F::from16(&v.client_addr), v.client_port)
    };
    F::ct_key(
        F::from16(&v.backend_addr),
        daddr,
        v.backend_port,
        dport,
        p,
        CT_DIR_REPLY,
    )
}

#[inline(always)]
pub fn forward_key<F: PacketFamily>(v: &CtValue, p: u8) -> F::CtKey {
    F::ct_key(
        F::from16(&v.client_addr),
        F::from16(&v.frontend_addr),
        v.client_port,
        v.frontend_port,
        p,
        CT_DIR_FORWARD,
    )
}

/// Picks the SNAT port: a random one of the configured range that no flow to the same
/// backend uses. Never the client's own port, which may be one the kernel gives the node's
/// own sockets: a node process connecting to the same backend from it would have its
/// replies taken for the masqueraded flow's (the agent keeps the range outside the
/// kernel's `ip_local_port_range`). `None` when every try collides.
#[inline(never)]
pub fn snat_port<F: PacketFamily>(
    cfg: &LbConfig,
    flow: &CtValue,
    snat: F::Addr,
    p: u8,
) -> Option<u16> {
    let backend = F::from16(&flow.backend_addr);
    let backend_port = flow.backend_port;
    let free = |port: u16| {
        let key = F::ct_key(backend, snat, backend_port, port, p, CT_DIR_REPLY);
        F::ct_get(&key).is_none()
    };
    let (min, max) = if cfg.snat_port_min != 0 && cfg.snat_port_max > cfg.snat_port_min {
        (cfg.snat_port_min, cfg.snat_port_max)
    } else {
        (61_000, 65_535)
    };
    let span = (max - min) as u32 + 1;
    let mut i = 0;
    while i < 4 {
        // SAFETY: a helper without pointer arguments.
        let port = (min as u32 + unsafe { bpf_get_prandom_u32() } % span) as u16;
        let port = port.to_be();
        if free(port) {
            return Some(port);
        }
        i += 1;
    }
    None
}

/// Records a new flow (reply entry first, so an answer can never outrun it).
#[inline(never)]
pub fn create<F: PacketFamily>(v: &CtValue, p: u8) -> bool {
    F::ct_put(&reply_key::<F>(v, p), v) && F::ct_put(&forward_key::<F>(v, p), v)
}

/// Forgets a flow (both entries).
#[inline(always)]
pub fn forget<F: PacketFamily>(v: &CtValue, p: u8) {
    F::ct_del(&forward_key::<F>(v, p));
    F::ct_del(&reply_key::<F>(v, p));
}
