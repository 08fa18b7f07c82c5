//! Batched map operations (`BPF_MAP_LOOKUP_BATCH`, `BPF_MAP_UPDATE_BATCH`,
//! kernel 5.6+), which aya does not wrap: one syscall for many elements
//! instead of one (update) or two (lookup: next key, then value) per element.
//! The service sync reads and writes 10⁵ elements at 10k Services; element by
//! element that is most of its time (docs/benchmarks.md, "Services").
//!
//! Callers fall back to element-wise operations when [`unsupported`] says the
//! kernel or the map type has no batch operations.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd};

use aya::Pod;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
/// Elements asked for per lookup call at first (doubled when a hash bucket
/// does not fit).
const LOOKUP_CHUNK: usize = 4096;
/// The kernel's internal "not supported" (not in libc).
const ENOTSUPP: i32 = 524;

/// `union bpf_attr` for the `BPF_MAP_*_BATCH` commands.
#[repr(C)]
#[derive(Default)]
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

fn sys_bpf(cmd: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
    // SAFETY: `attr` is a valid, initialised `BatchAttr` of the size passed;
    // the buffers it points at are live for the call and as large as `count`
    // elements of the map's key and value size (checked by the callers).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut BatchAttr,
            size_of::<BatchAttr>(),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether `e` means "no batch operations here" (old kernel, map type).
pub fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) | Some(ENOTSUPP)
    )
}

/// Reads `T`s packed in `buf` (the kernel's output).
fn unpack<T: Pod>(buf: &[u8], n: usize) -> impl Iterator<Item = T> + '_ {
    buf.chunks_exact(size_of::<T>()).take(n).map(|c| {
        // SAFETY: `c` holds `size_of::<T>()` bytes the kernel wrote as a map
        // key or value of this type; `T: Pod` is valid for any bytes, and
        // `read_unaligned` needs no alignment.
        unsafe { std::ptr::read_unaligned(c.as_ptr().cast::<T>()) }
    })
}

/// Every element of the hash (or LRU hash) map `fd`, whose key and value
/// types are `K` and `V` (the caller's typed map checked their sizes).
pub fn lookup_all<K: Pod, V: Pod>(fd: BorrowedFd<'_>) -> io::Result<Vec<(K, V)>> {
    let mut out = Vec::new();
    let mut chunk = LOOKUP_CHUNK;
    // The batch token is opaque (a u32 bucket index for hash maps); room
    // for the largest any map type uses (its key).
    let token_len = size_of::<K>().max(8).div_ceil(8);
    let mut in_token = vec![0u64; token_len];
    let mut out_token = vec![0u64; token_len];
    let mut first = true;
    loop {
        let mut keys = vec![0u8; chunk * size_of::<K>()];
        let mut values = vec![0u8; chunk * size_of::<V>()];
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { in_token.as_ptr() as u64 },
            out_batch: out_token.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: u32::try_from(chunk).unwrap_or(u32::MAX),
            map_fd: u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX),
            ..BatchAttr::default()
        };
        let res = sys_bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let n = (attr.count as usize).min(chunk);
        out.extend(unpack::<K>(&keys, n).zip(unpack::<V>(&values, n)));
        match res {
            Ok(()) => {
                in_token.copy_from_slice(&out_token);
                first = false;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            // A bucket larger than the buffer and nothing returned: retry
            // from the same point with a larger buffer.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && n == 0 && chunk < (1 << 24) => {
                chunk *= 2;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Writes `keys[i]` → `values[i]` into map `fd` in order (`BPF_ANY`). On an
/// error, how many elements were written before it (the kernel stops at the
/// first failing element), and the error.
pub fn update<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> Result<(), (usize, io::Error)> {
    if keys.len() != values.len() {
        return Err((0, io::Error::from_raw_os_error(libc::EINVAL)));
    }
    if keys.is_empty() {
        return Ok(());
    }
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: u32::try_from(keys.len())
            .map_err(|_| (0, io::Error::from_raw_os_error(libc::E2BIG)))?,
        map_fd: u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX),
        ..BatchAttr::default()
    };
    match sys_bpf(BPF_MAP_UPDATE_BATCH, &mut attr) {
        Ok(()) => Ok(()),
        Err(e) => Err(((attr.count as usize).min(keys.len()), e)),
    }
}
