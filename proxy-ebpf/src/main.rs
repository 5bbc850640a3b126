// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! The service proxy's eBPF programs. Entry points only; the logic is in the modules.
#![no_std]
#![no_main]

mod lb;
mod maps;
mod northsouth;
mod packet;
mod sock;

use aya_ebpf::{
    macros::{cgroup_sock_addr, classifier, xdp},
    programs::{SockAddrContext, TcContext, XdpContext},
};

use crate::lb::{V4, V6};

#[cgroup_sock_addr(connect4)]
pub fn sock_connect4(ctx: SockAddrContext) -> i32 {
    sock::translate::<V4, false>(&ctx)
}

#[cgroup_sock_addr(connect6)]
pub fn sock_connect6(ctx: SockAddrContext) -> i32 {
    sock::translate::<V6, false>(&ctx)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn sock_sendmsg4(ctx: SockAddrContext) -> i32 {
    sock::translate::<V4, true>(&ctx)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn sock_sendmsg6(ctx: SockAddrContext) -> i32 {
    sock::translate::<V6, true>(&ctx)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn sock_recvmsg4(ctx: SockAddrContext) -> i32 {
    sock::restore::<V4>(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn sock_recvmsg6(ctx: SockAddrContext) -> i32 {
    sock::restore::<V6>(&ctx)
}

#[cgroup_sock_addr(getpeername4)]
pub fn sock_getpeername4(ctx: SockAddrContext) -> i32 {
    sock::restore::<V4>(&ctx)
}

#[cgroup_sock_addr(getpeername6)]
pub fn sock_getpeername6(ctx: SockAddrContext) -> i32 {
    sock::restore::<V6>(&ctx)
}

#[classifier]
pub fn tc_uplink_ingress(ctx: TcContext) -> i32 {
    northsouth::ingress::handle(&ctx)
}

/// The uplink ingress translation, earlier: what it does not finish goes on to tc.
#[xdp]
pub fn xdp_uplink(ctx: XdpContext) -> u32 {
    let verdict = northsouth::ingress::handle(&ctx) as u32;
    maps::count_xdp(verdict);
    verdict
}

#[classifier]
pub fn tc_uplink_egress(ctx: TcContext) -> i32 {
    northsouth::egress::handle(&ctx)
}

#[classifier]
pub fn tc_pod_ingress(ctx: TcContext) -> i32 {
    northsouth::pod::handle(&ctx)
}

#[classifier]
pub fn tc_pod_egress(ctx: TcContext) -> i32 {
    northsouth::pod::handle_egress(&ctx)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual BSD/GPL\0";
