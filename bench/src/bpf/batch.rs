// SPDX-License-Identifier: Apache-2.0
//! The batched map update the benchmark compares with one update per element: aya has
//! only the latter, so this one is a raw bpf() system call, hence the unsafe code.
#![allow(unsafe_code)]

use std::{io, os::fd::AsRawFd};

/// `BPF_MAP_UPDATE_BATCH` (Linux 5.6+): writes `keys[i] -> values[i]` for every `i` in
/// one system call; returns how many elements the kernel wrote (all of them on success).
/// aya offers only the one-element update; the benchmark compares the two (the agent
/// itself writes one element at a time). The map's key and value sizes are checked
/// against `K` and `V` first, so the kernel never reads past the slices.
pub fn map_update_batch<K: aya::Pod, V: aya::Pod>(
    map: &aya::maps::MapData,
    keys: &[K],
    values: &[V],
) -> io::Result<u32> {
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
    let info = map.info().map_err(io::Error::other)?;
    if info.key_size() as usize != std::mem::size_of::<K>()
        || info.value_size() as usize != std::mem::size_of::<V>()
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "key or value type does not match the map",
        ));
    }
    if keys.len() != values.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "as many keys as values are needed",
        ));
    }
    let count = u32::try_from(keys.len()).map_err(io::Error::other)?;
    let fd = map.fd().as_fd().as_raw_fd();
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: 0,
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count,
        map_fd: u32::try_from(fd).map_err(io::Error::other)?,
        elem_flags: 0,
        flags: 0,
    };
    // SAFETY: `attr` is a valid `bpf_attr.batch` for the call's duration; the kernel reads
    // `count` keys and values of the map's sizes, which were checked to be those of `K`
    // and `V`, from slices that hold `count` of each; it writes back only `attr.count`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_BATCH,
            (&mut attr as *mut BatchAttr).cast::<libc::c_void>(),
            std::mem::size_of::<BatchAttr>() as libc::c_uint,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr.count)
}
