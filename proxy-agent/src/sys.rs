// SPDX-License-Identifier: Apache-2.0
//! The agent's only unsafe code: system calls that no safe wrapper in our dependencies
//! offers. Each one is a few lines with its safety argument next to it.
#![allow(unsafe_code)]

use std::{io, os::fd::AsRawFd};

/// The cookie of the network namespace `socket` lives in (`SO_NETNS_COOKIE`, Linux 5.14+):
/// the value `bpf_get_netns_cookie()` returns for sockets of that namespace.
pub fn netns_cookie(socket: &impl AsRawFd) -> io::Result<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `len` are valid for writes of the sizes passed, and the fd is
    // borrowed from a live socket for the duration of the call.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// The cookie of the calling thread's current network namespace.
pub fn current_netns_cookie() -> io::Result<u64> {
    let socket =
        std::net::UdpSocket::bind("0.0.0.0:0").or_else(|_| std::net::UdpSocket::bind("[::]:0"))?;
    netns_cookie(&socket)
}

/// Large blocks at and above this size get their own mapping, returned to the kernel
/// when freed (see [`tune_allocator`]).
const MMAP_THRESHOLD_BYTES: libc::c_int = 256 * 1024;

/// Sets glibc's allocator up for a long-running process whose memory is mostly one large
/// model built once and changed a little at a time, with short-lived peaks at full syncs
/// (a snapshot of every map entry):
/// - one arena: with glibc's default of one per thread (up to 8 per core), the blocks a
///   full sync freed on one thread stay in that thread's arena, fragmented, unusable by
///   the others; at 50,000 services that was 270 MiB of resident memory above the 300
///   MiB in use. The agent's threads rarely allocate at the same time, so the shared
///   arena's lock costs nothing measurable.
/// - a fixed mmap threshold: glibc raises its threshold to the size of every mapped block
///   freed (up to 32 MiB), after which the snapshots of later full syncs come from the
///   heap and fragment it too.
///
/// An operator's `MALLOC_ARENA_MAX` or `MALLOC_MMAP_THRESHOLD_` wins. Call before any
/// thread starts.
pub fn tune_allocator() {
    let unset = |name: &str| std::env::var_os(name).is_none();
    // SAFETY: mallopt only changes the allocator's parameters; called before other
    // threads exist, it races with no allocation.
    unsafe {
        if unset("MALLOC_ARENA_MAX") {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
        if unset("MALLOC_MMAP_THRESHOLD_") {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        }
    }
}

/// Hands the heap's free memory back to the kernel (glibc's `malloc_trim`): after a full
/// sync has dropped a snapshot of every map entry, the agent's resident set returns to
/// what it holds.
pub fn trim_heap() {
    // SAFETY: malloc_trim only walks and releases the allocator's own free memory; it
    // takes no pointers and may be called at any time from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_current_namespace_has_a_nonzero_cookie() {
        let cookie = super::current_netns_cookie().expect("SO_NETNS_COOKIE works on Linux 5.14+");
        assert_ne!(cookie, 0);
        assert_eq!(super::current_netns_cookie().ok(), Some(cookie));
    }
}
