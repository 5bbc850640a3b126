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

/// `BPF_MAP_UPDATE_BATCH` (Linux 5.6+, hash maps): writes `keys[i] -> values[i]` for every
/// `i` in one system call, in order (the kernel updates the elements one after the other,
/// so a program sees them appear in the order of the slices, as with one call each).
/// Returns how many the kernel wrote: all of them on success; on failure, the error and
/// how many were written before it. The map's key and value sizes are checked against
/// `K` and `V` first, so the kernel never reads past the slices.
pub fn map_update_batch<K: aya::Pod, V: aya::Pod>(
    map: &aya::maps::MapData,
    keys: &[K],
    values: &[V],
) -> Result<u32, (io::Error, u32)> {
    use std::os::fd::AsFd;
    /// The `batch` member of `union bpf_attr` (include/uapi/linux/bpf.h).
    #[repr(C)]
    struct BatchAttr {
        in_batch: u64,
        out_batch: u64,
        keys: u64,
        values: u64,
        count: u32,
        map_fd: u32,
        elem_flags: u64,
        flags: u64,
    }
    const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
    let invalid = |what: &str| {
        (
            io::Error::new(io::ErrorKind::InvalidInput, what.to_owned()),
            0,
        )
    };
    let info = map.info().map_err(|e| (io::Error::other(e), 0))?;
    if info.key_size() as usize != std::mem::size_of::<K>()
        || info.value_size() as usize != std::mem::size_of::<V>()
    {
        return Err(invalid("key or value type does not match the map"));
    }
    if keys.len() != values.len() {
        return Err(invalid("as many keys as values are needed"));
    }
    let count = u32::try_from(keys.len()).map_err(|_| invalid("too many elements"))?;
    let map_fd = u32::try_from(map.fd().as_fd().as_raw_fd()).map_err(|_| invalid("map fd"))?;
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: 0,
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count,
        map_fd,
        elem_flags: 0,
        flags: 0,
    };
    // SAFETY: `attr` is a valid `bpf_attr.batch` for the call's duration; the kernel reads
    // `count` keys and values of the map's sizes, checked to be those of `K` and `V`, from
    // slices holding `count` of each, and writes back only `attr.count`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_BATCH,
            (&mut attr as *mut BatchAttr).cast::<libc::c_void>(),
            std::mem::size_of::<BatchAttr>() as libc::c_uint,
        )
    };
    if rc != 0 {
        return Err((io::Error::last_os_error(), attr.count));
    }
    Ok(attr.count)
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
