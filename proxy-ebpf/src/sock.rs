// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Socket-level load balancing (cgroup sock_addr programs), after Cilium's bpf_sock.c:
//! connect() and sendmsg() rewrite a service frontend to a backend once per connection (per
//! datagram for unconnected UDP), so east-west traffic needs no per-packet NAT and no
//! conntrack entry. recvmsg() and getpeername() put the frontend back, from a per-socket
//! reverse entry written before the rewrite.
//!
//! Verdicts: a frontend without any endpoint (or a ClusterIP's unserved port) fails the
//! syscall as upstream's REJECT fails it: ECONNREFUSED, except for UDP from the node itself
//! to a frontend other than a NodePort, which upstream's nftables rejects in the output hook:
//! the datagram is dropped there and send() reports EPERM, so connect() or sendmsg() does too
//! (NodePorts are rejected in the input hook, after the datagram left, with ICMP). Cases that upstream DROPs (traffic-policy Local with endpoints only elsewhere, a
//! source outside loadBalancerSourceRanges, an unallocated service address) are left
//! untranslated: a socket program cannot drop silently, so the packet travels on and the tc
//! program on the node's device drops it, and the client sees silence as with upstream.
//! Every program returns 1 (proceed) except for REJECT.
//!
//! Which backend set a client gets: clients on the node itself always take a frontend's
//! internal scope (upstream short-circuits traffic from local addresses to the cluster-wide
//! endpoints); pods only when a local-traffic detector is configured (without one, upstream
//! cannot tell pods from outside and applies externalTrafficPolicy to them too).
//!
//! masqueradeAll: a socket program cannot change a connection's source address, and
//! rewriting only the destination would hand the backend the pod's address. So, with
//! masqueradeAll, a pod's connection that upstream masquerades (to a ClusterIP, or to an
//! external frontend of an eTP=Cluster service) is left untranslated here; the pod-side tc
//! program load-balances it per packet, with SNAT to the node and conntrack, as it does for
//! SCTP. Everything else keeps the per-connection path.
//!
//! socketLBHostNamespaceOnly: only the node's own namespace is translated here. A service
//! mesh's sidecar redirects a pod's connections to itself and reads the original
//! destination the socket asked for, which must still be the service; the pod-side tc
//! programs load-balance those connections per packet instead.

use aya_ebpf::{
    EbpfContext as _,
    bindings::bpf_sock_addr,
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, generated::bpf_set_retval},
    programs::SockAddrContext,
};
use proxy_common::{
    LB_CFG_HANDING_OVER, LB_CFG_LOOPBACK_NODEPORTS_REJECT4, LB_CFG_LOOPBACK_NODEPORTS_REJECT6,
    LB_CFG_MASQUERADE_ALL, LB_CFG_SOCKET_LB_HOST_NETNS_ONLY, SockFrontend, SockRevNat4Key,
    SockRevNat4Value, SockRevNat6Key, SockRevNat6Value, SvcValue,
    maps::{
        DROP_NO_LOCAL_ENDPOINTS, DROP_SOURCE_RANGE, DROP_UNALLOCATED_SERVICE_IP,
        REJECT_LOOPBACK_NODEPORT, REJECT_NO_ENDPOINTS, REJECT_UNSERVED_PORT,
    },
    proto, svc_flags,
};

use crate::{
    lb::{
        Client, ClientSide, Family, Frontend, MaglevHash, V4, V6, is_node_port, lookup_frontend,
        masquerade_flow, pods_are_local, select_backend,
    },
    maps::{LB_CONFIG_V1, SOCK_FRONTEND_V1, SOCK_REV_NAT4_V2, SOCK_REV_NAT6_V2, count_datapath},
};

const ECONNREFUSED: i32 = 111;

/// The socket-address side of a family: where the destination sits in `bpf_sock_addr` and
/// how reverse entries are keyed.
pub trait SockFamily: Family {
    fn dst(sa: *mut bpf_sock_addr) -> (Self::Addr, u16);
    fn set_dst(sa: *mut bpf_sock_addr, addr: Self::Addr, port: u16);
    /// The address the socket is bound to, if any (0 / :: when unbound).
    fn bound_src(sa: *mut bpf_sock_addr) -> Self::Addr;
    /// The source address given to sendmsg() (IP_PKTINFO), if any.
    fn msg_src(sa: *mut bpf_sock_addr) -> Self::Addr;
    fn save_rev(cookie: u64, backend: (Self::Addr, u16), frontend: (Self::Addr, u16), id: u32);
    /// The frontend a socket's reverse entry names for this backend.
    fn load_rev(cookie: u64, backend: (Self::Addr, u16)) -> Option<(Self::Addr, u16, u32)>;
    fn forget_rev(cookie: u64, backend: (Self::Addr, u16));
    /// A loopback address (127.0.0.0/8, ::1): a pod's is its own, never the node's.
    fn is_loopback(addr: Self::Addr) -> bool;
    /// The family's `LB_CFG_LOOPBACK_NODEPORTS_REJECT*` bit.
    const LOOPBACK_NODEPORTS_REJECT: u32;
}

impl SockFamily for V4 {
    const LOOPBACK_NODEPORTS_REJECT: u32 = LB_CFG_LOOPBACK_NODEPORTS_REJECT4;
    #[inline(always)]
    fn dst(sa: *mut bpf_sock_addr) -> (u32, u16) {
        // SAFETY: the context's sock_addr is valid for the program's run.
        unsafe { ((*sa).user_ip4, (*sa).user_port as u16) }
    }
    #[inline(always)]
    fn set_dst(sa: *mut bpf_sock_addr, addr: u32, port: u16) {
        // SAFETY: the context's sock_addr is valid for the program's run.
        unsafe {
            (*sa).user_ip4 = addr;
            (*sa).user_port = port as u32;
        }
    }
    #[inline(always)]
    fn bound_src(sa: *mut bpf_sock_addr) -> u32 {
        // SAFETY: the context's sock_addr is valid for the program's run.
        unsafe {
            let sk = (*sa).__bindgen_anon_1.sk;
            if sk.is_null() { 0 } else { (*sk).src_ip4 }
        }
    }
    #[inline(always)]
    fn msg_src(sa: *mut bpf_sock_addr) -> u32 {
        // SAFETY: the context's sock_addr is valid for the program's run.
        unsafe { (*sa).msg_src_ip4 }
    }
    #[inline(always)]
    fn save_rev(cookie: u64, backend: (u32, u16), frontend: (u32, u16), id: u32) {
        let key = SockRevNat4Key {
            cookie,
            addr: backend.0,
            port: backend.1,
            _pad: 0,
        };
        let value = SockRevNat4Value {
            addr: frontend.0,
            port: frontend.1,
            _pad: 0,
            rev_nat_id: id,
        };
        // An identical entry (a UDP socket sending again) is left alone: no write per datagram.
        // SAFETY: only compared at once, never kept.
        if unsafe { SOCK_REV_NAT4_V2.get(key) } != Some(&value) {
            let _ = SOCK_REV_NAT4_V2.insert(key, value, 0);
        }
    }
    #[inline(always)]
    fn load_rev(cookie: u64, backend: (u32, u16)) -> Option<(u32, u16, u32)> {
        let key = SockRevNat4Key {
            cookie,
            addr: backend.0,
            port: backend.1,
            _pad: 0,
        };
        // SAFETY: the value is copied out before any other map operation.
        unsafe {
            SOCK_REV_NAT4_V2
                .get(key)
                .map(|v| (v.addr, v.port, v.rev_nat_id))
        }
    }
    #[inline(always)]
    fn forget_rev(cookie: u64, backend: (u32, u16)) {
        let key = SockRevNat4Key {
            cookie,
            addr: backend.0,
            port: backend.1,
            _pad: 0,
        };
        let _ = SOCK_REV_NAT4_V2.remove(key);
    }
    #[inline(always)]
    fn is_loopback(addr: u32) -> bool {
        // Network byte order in memory: the first byte is the first octet.
        addr.to_ne_bytes()[0] == 127
    }
}

// The context holds IPv6 addresses as four u32 words in network byte order; the maps hold
// the same 16 bytes. A whole-array reinterpretation keeps each address in two registers:
// a byte-by-byte copy put sixteen bytes in sixteen spill slots and took sock_connect6 to 544
// bytes of combined stack, which kernels before about 6.8 refuse (over 512).
#[inline(always)]
fn words_to_bytes(w: [u32; 4]) -> [u8; 16] {
    // SAFETY: both are 16 bytes of plain integers; any bit pattern is valid for either.
    unsafe { core::mem::transmute::<[u32; 4], [u8; 16]>(w) }
}

#[inline(always)]
fn bytes_to_words(b: [u8; 16]) -> [u32; 4] {
    // SAFETY: as above.
    unsafe { core::mem::transmute::<[u8; 16], [u32; 4]>(b) }
}

impl SockFamily for V6 {
    const LOOPBACK_NODEPORTS_REJECT: u32 = LB_CFG_LOOPBACK_NODEPORTS_REJECT6;
    #[inline(always)]
    fn dst(sa: *mut bpf_sock_addr) -> ([u8; 16], u16) {
        // SAFETY: the context's sock_addr is valid for the program's run.
        unsafe {
            let w = [
                (*sa).user_ip6[0],
                (*sa).user_ip6[1],
                (*sa).user_ip6[2],
                (*sa).user_ip6[3],
            ];
            (words_to_bytes(w), (*sa).user_port as u16)
        }
    }
    #[inline(always)]
    fn set_dst(sa: *mut bpf_sock_addr, addr: [u8; 16], port: u16) {
        let w = bytes_to_words(addr);
        // SAFETY: the context's sock_addr is valid for the program's run.
        unsafe {
            (*sa).user_ip6[0] = w[0];
            (*sa).user_ip6[1] = w[1];
            (*sa).user_ip6[2] = w[2];
            (*sa).user_ip6[3] = w[3];
            (*sa).user_port = port as u32;
        }
    }
    #[inline(always)]
    fn bound_src(sa: *mut bpf_sock_addr) -> [u8; 16] {
        // SAFETY: the context's sock_addr is valid for the program's run.
        unsafe {
            let sk = (*sa).__bindgen_anon_1.sk;
            if sk.is_null() {
                return [0; 16];
            }
            let w = [
                (*sk).src_ip6[0],
                (*sk).src_ip6[1],
                (*sk).src_ip6[2],
                (*sk).src_ip6[3],
            ];
            words_to_bytes(w)
        }
    }
    #[inline(always)]
    fn msg_src(sa: *mut bpf_sock_addr) -> [u8; 16] {
        // SAFETY: the context's sock_addr is valid for the program's run.
        unsafe {
            let w = [
                (*sa).msg_src_ip6[0],
                (*sa).msg_src_ip6[1],
                (*sa).msg_src_ip6[2],
                (*sa).msg_src_ip6[3],
            ];
            words_to_bytes(w)
        }
    }
    #[inline(always)]
    fn save_rev(cookie: u64, backend: ([u8; 16], u16), frontend: ([u8; 16], u16), id: u32) {
        let key = SockRevNat6Key {
            cookie,
            addr: backend.0,
            port: backend.1,
            _pad: [0; 6],
        };
        let value = SockRevNat6Value {
            addr: frontend.0,
            port: frontend.1,
            _pad: 0,
            rev_nat_id: id,
        };
        // SAFETY: only compared at once, never kept.
        if unsafe { SOCK_REV_NAT6_V2.get(key) } != Some(&value) {
            let _ = SOCK_REV_NAT6_V2.insert(key, value, 0);
        }
    }
    #[inline(always)]
    fn load_rev(cookie: u64, backend: ([u8; 16], u16)) -> Option<([u8; 16], u16, u32)> {
        let key = SockRevNat6Key {
            cookie,
            addr: backend.0,
            port: backend.1,
            _pad: [0; 6],
        };
        // SAFETY: the value is copied out before any other map operation.
        unsafe {
            SOCK_REV_NAT6_V2
                .get(key)
                .map(|v| (v.addr, v.port, v.rev_nat_id))
        }
    }
    #[inline(always)]
    fn forget_rev(cookie: u64, backend: ([u8; 16], u16)) {
        let key = SockRevNat6Key {
            cookie,
            addr: backend.0,
            port: backend.1,
            _pad: [0; 6],
        };
        let _ = SOCK_REV_NAT6_V2.remove(key);
    }
    #[inline(always)]
    fn is_loopback(addr: [u8; 16]) -> bool {
        addr == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]
    }
}

/// `in_output_hook`: upstream's REJECT for this frontend and client sits in the output hook.
/// Counted under `reason` (a `proxy_common::maps::REJECT_*` slot).
#[inline(always)]
fn reject(protocol: u8, in_output_hook: bool, reason: u32) -> i32 {
    count_datapath(reason);
    if protocol == proto::UDP && in_output_hook {
        // The default error of a refusing program: EPERM.
        return 0;
    }
    // The syscall fails with ECONNREFUSED instead of the default EPERM.
    // SAFETY: a helper without pointer arguments.
    unsafe { bpf_set_retval(-ECONNREFUSED) };
    0
}

/// A packet upstream's rules drop: left to the tc program, which drops it, except a
/// datagram the node itself sends. Dropped by a netfilter rule in the output hook, its
/// send() fails with EPERM, which a refusing program gives too; a TCP SYN dropped there
/// is retransmitted until connect() times out, as after the tc program's drop.
/// Counted under `reason` when refused here (the tc program counts what it drops).
#[inline(always)]
fn dropped(protocol: u8, from_host: bool, reason: u32) -> i32 {
    if protocol == proto::UDP && from_host {
        count_datapath(reason);
        return 0;
    }
    1
}

/// A destination no frontend holds (the caller runs in the node's namespace): refused when
/// it is a NodePort on a loopback address that the configuration refuses (nftables mode's
/// `localhost-nodeport-reject`, in its input hook: ECONNREFUSED for TCP and UDP alike);
/// left alone otherwise.
#[inline(always)]
fn loopback_node_port<F: SockFamily>(
    addr: F::Addr,
    port: u16,
    protocol: u8,
    cfg_flags: u32,
) -> i32 {
    if cfg_flags & F::LOOPBACK_NODEPORTS_REJECT != 0
        && F::is_loopback(addr)
        && is_node_port::<F>(port, protocol)
    {
        return reject(protocol, false, REJECT_LOOPBACK_NODEPORT);
    }
    1
}

/// The node's network-namespace cookie and the configuration flags.
#[inline(always)]
fn host_and_flags() -> (u64, u32) {
    LB_CONFIG_V1
        .get(0)
        .map(|c| (c.host_netns_cookie, c.flags))
        .unwrap_or((0, 0))
}

/// Whether loadBalancerSourceRanges let this socket through. Socket programs usually do not
/// know the source address yet: a bound (or IP_PKTINFO) address is checked exactly; otherwise
/// the agent's per-frontend verdicts for the node's own namespace and for pods apply.
#[inline(always)]
fn source_allowed<F: SockFamily, const SENDMSG: bool>(
    sa: *mut bpf_sock_addr,
    svc: &SvcValue,
    from_host: bool,
) -> bool {
    // msg_src_* exists only in the sendmsg context (the verifier refuses it elsewhere).
    let mut src = if SENDMSG { F::msg_src(sa) } else { F::zero() };
    if src == F::zero() {
        src = F::bound_src(sa);
    }
    if src != F::zero() {
        return F::source_allowed(svc.rev_nat_id, src);
    }
    if from_host {
        svc.flags & svc_flags::SRC_RANGE_HOST_ALLOWED != 0
    } else {
        svc.flags & svc_flags::SRC_RANGE_PODS_ALLOWED != 0
    }
}

/// connect() and sendmsg(): frontend -> backend.
#[inline(always)]
pub fn translate<F: SockFamily, const SENDMSG: bool>(ctx: &SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: the context's sock_addr is valid for the program's run.
    let protocol = unsafe { (*sa).protocol } as u8;
    if protocol != proto::TCP && protocol != proto::UDP && protocol != proto::SCTP {
        return 1;
    }
    let (addr, port) = F::dst(sa);
    let udp_connect = !SENDMSG && protocol == proto::UDP;
    if udp_connect {
        // A connected UDP socket's (cookie, peer) entry says "translated, from this
        // frontend" (written below when this connect is translated): the agent finds the
        // sockets to terminate when a backend leaves by it, and sock_diag reports cookie
        // and peer on every kernel (unlike socket storage, which 6.18 no longer reports
        // for UDP). A socket connecting to this address without translation (a pod
        // directly) must not keep one left by an earlier translated datagram to it.
        // SAFETY: the context pointer is valid for the program's run.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        F::forget_rev(cookie, (addr, port));
    }
    // SAFETY: the context pointer is valid for the program's run.
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let (host_netns, cfg_flags) = host_and_flags();
    if cfg_flags & LB_CFG_HANDING_OVER != 0 {
        // A netfilter mode taking the node over translates new connections with its rules
        // (and getpeername() then needs no program); the sockets translated before keep
        // their reverse entries until the programs go.
        return 1;
    }
    let from_host = netns == host_netns;
    if !from_host && (cfg_flags & LB_CFG_SOCKET_LB_HOST_NETNS_ONLY != 0 || F::is_loopback(addr)) {
        // Pods keep the address they asked for (see the module's notes); a pod's loopback
        // is its own, whatever NodePorts the node serves on its loopback.
        return 1;
    }
    let internal = from_host || pods_are_local(cfg_flags);
    let (svc, key) = match lookup_frontend::<F>(addr, port, protocol, internal) {
        Frontend::Service { svc, key } => (svc, key),
        Frontend::Reject => return reject(protocol, from_host, REJECT_UNSERVED_PORT),
        Frontend::Drop => return dropped(protocol, from_host, DROP_UNALLOCATED_SERVICE_IP),
        Frontend::None => return loopback_node_port::<F>(addr, port, protocol, cfg_flags),
    };
    if svc.flags & svc_flags::SOURCE_RANGES != 0
        && !source_allowed::<F, SENDMSG>(sa, &svc, from_host)
    {
        return dropped(protocol, from_host, DROP_SOURCE_RANGE);
    }
    if svc.count == 0 {
        if svc.flags & svc_flags::DROP_NO_ENDPOINTS != 0 {
            return dropped(protocol, from_host, DROP_NO_LOCAL_ENDPOINTS);
        }
        return reject(
            protocol,
            from_host && svc.flags & svc_flags::NODE_PORT == 0,
            REJECT_NO_ENDPOINTS,
        );
    }
    if !from_host
        && cfg_flags & LB_CFG_MASQUERADE_ALL != 0
        && masquerade_flow::<F>(&svc, cfg_flags, &F::zero(), ClientSide::Pod)
    {
        // The pod-side tc program translates it, with SNAT (see the module's notes).
        return 1;
    }
    let Some((_, backend)) =
        select_backend::<F>(&svc, &key, Client::Netns(netns), MaglevHash::NONE)
    else {
        return 1;
    };
    let target = F::backend_target(&backend);
    if SENDMSG || udp_connect {
        // Unconnected UDP: one socket may talk to many backends. Connected UDP: see above.
        // SAFETY: the context pointer is valid for the program's run.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        F::save_rev(cookie, target, (addr, port), svc.rev_nat_id);
    }
    if !SENDMSG {
        // A connected socket has one peer: its translation lives in the socket itself and
        // goes with it.
        // SAFETY: the context's socket is valid for the duration of the program.
        let slot = unsafe { SOCK_FRONTEND_V1.get_or_insert_ptr_mut(ctx, None) };
        if !slot.is_null() {
            // SAFETY: a non-null pointer from sk_storage_get is the socket's own value.
            unsafe {
                *slot = SockFrontend {
                    frontend_addr: F::to16(addr),
                    backend_addr: F::to16(target.0),
                    frontend_port: port,
                    backend_port: target.1,
                    rev_nat_id: svc.rev_nat_id,
                };
            }
        }
    }
    F::set_dst(sa, target.0, target.1);
    1
}

/// recvmsg() and getpeername(): backend -> frontend, when the socket was translated and the
/// frontend still exists under the same id.
#[inline(always)]
pub fn restore<F: SockFamily>(ctx: &SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    let peer = F::dst(sa);
    // SAFETY: the context's socket is valid for the duration of the program.
    let own = unsafe { SOCK_FRONTEND_V1.get_ptr_mut(ctx) };
    if !own.is_null() {
        // SAFETY: a non-null pointer from sk_storage_get is the socket's own value.
        let f = unsafe { &*own };
        if F::from16(&f.backend_addr) == peer.0 && f.backend_port == peer.1 {
            let frontend = (F::from16(&f.frontend_addr), f.frontend_port);
            if F::rev_nat(f.rev_nat_id) == Some(frontend) {
                F::set_dst(sa, frontend.0, frontend.1);
            }
            return 1;
        }
    }
    // SAFETY: the context pointer is valid for the program's run.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if let Some((addr, port, id)) = F::load_rev(cookie, peer) {
        match F::rev_nat(id) {
            Some((a, p)) if a == addr && p == port => F::set_dst(sa, addr, port),
            // The frontend went away or its id now names another one: never show a
            // frontend the application did not ask for.
            _ => F::forget_rev(cookie, peer),
        }
    }
    1
}
