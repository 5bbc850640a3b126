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

/// Hands the memory the allocator holds free back to the kernel at once, after a sync that
/// built and dropped large temporaries (a full sync's snapshot of every map entry, the
/// plan of a cold sync).
///
/// The agent's binary runs on jemalloc (`tikv-jemallocator`, the global allocator of
/// `main.rs`), not glibc's malloc, for its resident memory: the agent keeps one large
/// model built once and changed a little at a time, and its peaks (ingesting every object,
/// planning a cold sync) interleave short-lived blocks with the records it keeps. glibc
/// could hand back only whole free pages at the top of its heap or inside its free lists
/// (`malloc_trim`); at 50,000 services × 4 the agent stayed at 290 MiB resident for 150
/// MiB of live heap. jemalloc keeps blocks of one size class together and returns the
/// dirty pages of its runs; its background thread does so after `dirty_decay_ms`
/// (10 s), and this call at once: 180 MiB resident in the same run. Operators can
/// tune it with `_RJEM_MALLOC_CONF`.
pub fn release_free_memory() {
    // "arena.<MALLCTL_ARENAS_ALL>.purge": every arena, no argument and no result.
    const PURGE_ALL_ARENAS: &std::ffi::CStr = c"arena.4096.purge";
    // SAFETY: a void mallctl (both pointers null, length 0) that only makes jemalloc
    // release the unused pages of its arenas; it may be called from any thread. Where
    // jemalloc is linked but not the allocator (unit tests) its arenas are just empty.
    let failed = unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL_ARENAS.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if failed != 0 {
        tracing::debug!(errno = failed, "jemalloc did not purge its arenas");
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
    let rc = unsafe { bpf_batch(BPF_MAP_UPDATE_BATCH, &mut attr) };
    if rc != 0 {
        return Err((io::Error::last_os_error(), attr.count));
    }
    Ok(attr.count)
}

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

/// Runs bpf(2) batch command `cmd` with `attr` (the kernel writes `attr.count` back).
///
/// # Safety
///
/// `attr`'s buffers must be valid for what `cmd` reads and writes through them: see the
/// callers.
unsafe fn bpf_batch(cmd: libc::c_long, attr: &mut BatchAttr) -> libc::c_long {
    // SAFETY: the caller vouches for the buffers; `attr` itself is a live `bpf_attr.batch`.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut BatchAttr).cast::<libc::c_void>(),
            std::mem::size_of::<BatchAttr>() as libc::c_uint,
        )
    }
}

/// `BPF_MAP_LOOKUP_BATCH` (Linux 5.6+, hash and LRU hash maps): every entry of the map,
/// read `chunk` at a time. Reading a map one entry at a time takes two system calls per
/// entry (next key, then lookup): about 6 s for the 2.2 million entries of 100,000
/// services, at every periodic full sync. An error is the kernel's for the first call it
/// refused: EINVAL or ENOTSUPP where the map or kernel has no batches, ENOSPC when one
/// hash bucket holds more than `chunk` entries; the caller reads entry by entry then.
/// Entries added or removed meanwhile may or may not be seen, as with the other way.
pub fn map_lookup_all<K: aya::Pod, V: aya::Pod>(
    map: &aya::maps::MapData,
    chunk: u32,
) -> io::Result<Vec<(K, V)>> {
    use std::os::fd::AsFd;
    const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_owned());
    let info = map.info().map_err(io::Error::other)?;
    if info.key_size() as usize != std::mem::size_of::<K>()
        || info.value_size() as usize != std::mem::size_of::<V>()
    {
        return Err(invalid("key or value type does not match the map"));
    }
    let map_fd = u32::try_from(map.fd().as_fd().as_raw_fd()).map_err(|_| invalid("map fd"))?;
    let room = usize::try_from(chunk).map_err(|_| invalid("chunk"))?.max(1);
    // SAFETY: `aya::Pod` types are plain data, for which all-zero bytes are a value.
    let (zero_key, zero_value): (K, V) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    let mut keys = vec![zero_key; room];
    let mut values = vec![zero_value; room];
    // The position between calls: a bucket number for hash maps, a key for the others.
    let token_len = (info.key_size() as usize).max(8);
    let (mut token_in, mut token_out) = (vec![0u8; token_len], vec![0u8; token_len]);
    let mut all = Vec::new();
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { token_in.as_ptr() as u64 },
            out_batch: token_out.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: u32::try_from(room).unwrap_or(u32::MAX),
            map_fd,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: `attr` is a valid `bpf_attr.batch` for the call's duration; the kernel
        // writes at most `count` keys and values of the map's sizes, checked to be those of
        // `K` and `V`, into buffers of `room` each, its position into `token_out` (at least
        // a key's size), and the number read into `attr.count`.
        let rc = unsafe { bpf_batch(BPF_MAP_LOOKUP_BATCH, &mut attr) };
        let error = (rc != 0).then(io::Error::last_os_error);
        let read = (attr.count as usize).min(room);
        all.extend(
            keys[..read]
                .iter()
                .copied()
                .zip(values[..read].iter().copied()),
        );
        match error {
            // The end of the map (the last call's entries are in `read`).
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(all),
            Some(e) => return Err(e),
            None if read == 0 => return Ok(all),
            None => {}
        }
        std::mem::swap(&mut token_in, &mut token_out);
        first = false;
    }
}

/// An inotify instance as a descriptor tokio polls (tokio's `AsyncFd` takes any raw
/// descriptor, hence unsafe; this one owns its descriptor).
pub struct InotifyFd(nix::sys::inotify::Inotify);

impl InotifyFd {
    /// Reads the queued events (`WouldBlock` when there are none: the instance is
    /// non-blocking).
    pub fn read_events(&self) -> io::Result<Vec<nix::sys::inotify::InotifyEvent>> {
        self.0.read_events().map_err(io::Error::from)
    }
}

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd as _;
        self.0.as_fd().as_raw_fd()
    }
}

/// Registers a non-blocking inotify instance with tokio's reactor, for readability.
pub fn async_inotify(
    inotify: nix::sys::inotify::Inotify,
) -> io::Result<tokio::io::unix::AsyncFd<InotifyFd>> {
    // SAFETY: `InotifyFd` owns the inotify descriptor and returns that same descriptor
    // from every `as_raw_fd` call; it stays open until the `AsyncFd` that owns it drops.
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(
            InotifyFd(inotify),
            tokio::io::Interest::READABLE,
        )
    }
    .map_err(io::Error::from)
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
