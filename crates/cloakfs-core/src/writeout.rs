//! Streams through the backing file: their write-out starts while they are still coming, and
//! what is on disk leaves the backing file's page cache.
//!
//! Through FUSE a stream lands in two page caches: the plaintext view's (the kernel's
//! writeback cache) and the backing file's. Left alone, the backing file's dirty pages wait for
//! the final fsync (or the kernel's 30 s expiry), so `dd conv=fsync` through the mount costs
//! the FUSE transfer *plus* the disk write, where on a plain directory it costs the copy plus
//! the disk write. [`WriteOut`] notes where large writes went and, every [`BATCH`] bytes,
//! yields a [`Kick`]: start the write-out of the batch (`sync_file_range(2)` with
//! `SYNC_FILE_RANGE_WRITE`, which does not wait for the disk) and drop the previous batch,
//! written out since, from the backing cache (`posix_fadvise(2)` `POSIX_FADV_DONTNEED`, which
//! leaves pages that are still dirty or in flight alone). The plaintext stays cached in the
//! view; the ciphertext copy was only a second copy.
//!
//! The kernel's writeback sends one stream's requests out of order (from several threads), so a
//! batch is the hull of its writes, not a run. Small writes are not counted: they are not
//! streams, and starting their write-out early would only cost more disk writes.

use std::fs::File;
use std::num::NonZeroU64;
use std::os::unix::io::AsRawFd;

/// Backing bytes written by large requests after which their write-out is started.
pub const BATCH: u64 = 8 << 20;
/// Smallest write request (in backing bytes) counted as part of a stream.
pub const MIN_STREAM_WRITE: u64 = 256 << 10;

/// A range `[from, to)` of backing-file offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub from: u64,
    pub to: u64,
}

impl Span {
    fn hull(self, other: Span) -> Span {
        Span {
            from: self.from.min(other.from),
            to: self.to.max(other.to),
        }
    }
}

/// Where a file's large writes went since their write-out was last started.
#[derive(Debug, Default)]
pub struct WriteOut {
    batch: Option<Span>,
    bytes: u64,
    previous: Option<Span>,
}

/// What to do about a finished batch, once the file's lock is released.
#[derive(Debug, PartialEq, Eq)]
pub struct Kick {
    /// Start writing this out.
    pub write: Span,
    /// Drop this (the batch before, on disk by now or soon) from the backing cache.
    pub evict: Option<Span>,
}

impl WriteOut {
    /// Notes that backing bytes `[from, to)` were written; returns a kick when a batch is full.
    pub fn wrote(&mut self, from: u64, to: u64) -> Option<Kick> {
        if to.saturating_sub(from) < MIN_STREAM_WRITE {
            return None;
        }
        let span = Span { from, to };
        let batch = self.batch.map_or(span, |b| b.hull(span));
        self.bytes += to - from;
        if self.bytes < BATCH {
            self.batch = Some(batch);
            return None;
        }
        self.batch = None;
        self.bytes = 0;
        Some(Kick {
            write: batch,
            evict: self.previous.replace(batch),
        })
    }
}

impl Kick {
    /// Best effort: a failure only means the data reaches the disk at the next fsync, or the
    /// pages stay cached.
    pub fn run(&self, file: &File) {
        let Span { from, to } = self.write;
        // SAFETY: sync_file_range on a valid, owned descriptor with integer arguments; it
        // reads no memory of ours.
        let r = unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                from as libc::off64_t,
                (to - from) as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        if r != 0 {
            tracing::debug!("sync_file_range: {}", std::io::Error::last_os_error());
        }
        if let Some(Span { from, to }) = self.evict {
            let len = NonZeroU64::new(to - from);
            if let Err(e) = rustix::fs::fadvise(file, from, len, rustix::fs::Advice::DontNeed) {
                tracing::debug!("posix_fadvise: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn small_writes_never_kick() {
        let mut w = WriteOut::default();
        for i in 0..10_000 {
            assert_eq!(w.wrote(i * 4096, (i + 1) * 4096), None);
        }
    }

    #[test]
    fn a_batch_is_the_hull_of_out_of_order_writes_and_evicts_the_one_before() {
        let mut w = WriteOut::default();
        let order = [1, 0, 3, 2, 5, 4, 7, 6];
        for (n, i) in order.iter().enumerate() {
            let k = w.wrote(i * MIB, (i + 1) * MIB);
            assert_eq!(k.is_some(), n == order.len() - 1);
            if let Some(k) = k {
                assert_eq!(
                    k.write,
                    Span {
                        from: 0,
                        to: 8 * MIB
                    }
                );
                assert_eq!(k.evict, None);
            }
        }
        let mut last = None;
        for i in 8..16 {
            last = w.wrote(i * MIB, (i + 1) * MIB).or(last);
        }
        let k = last.expect("second batch");
        assert_eq!(
            k.write,
            Span {
                from: 8 * MIB,
                to: 16 * MIB
            }
        );
        assert_eq!(
            k.evict,
            Some(Span {
                from: 0,
                to: 8 * MIB
            })
        );
    }

    /// Resident bytes of `path` in the page cache, from util-linux's fincore.
    fn resident(path: &std::path::Path) -> u64 {
        let out = std::process::Command::new("fincore")
            .args(["--bytes", "--noheadings", "--output", "RES"])
            .arg(path)
            .output()
            .expect("fincore (util-linux) runs");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    #[test]
    fn kicks_keep_the_bytes_and_evict_the_batch_before() {
        use std::io::Read;
        use std::os::unix::fs::FileExt;
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let mut f = tmp.reopen().unwrap();
        let data: Vec<u8> = (0..(2 * BATCH)).map(|i| (i % 251) as u8).collect();
        let mut w = WriteOut::default();
        let mut kicks = Vec::new();
        for (i, chunk) in data.chunks(MIB as usize).enumerate() {
            let off = i as u64 * MIB;
            f.write_all_at(chunk, off).unwrap();
            if let Some(k) = w.wrote(off, off + chunk.len() as u64) {
                if kicks.is_empty() {
                    k.run(&f);
                    // The first batch is on disk (clean) when the second kick evicts it.
                    f.sync_all().unwrap();
                    assert!(resident(tmp.path()) >= BATCH, "not cached before");
                } else {
                    k.run(&f);
                }
                kicks.push(k);
            }
        }
        assert_eq!(kicks.len(), 2);
        assert_eq!(kicks[1].evict, Some(kicks[0].write));
        // tmpfs has no backing store to evict to.
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        if rustix::fs::fstatfs(&f).unwrap().f_type as i64 != TMPFS_MAGIC {
            assert!(
                resident(tmp.path()) <= BATCH,
                "the first batch is still cached"
            );
        }
        let mut back = Vec::new();
        f.read_to_end(&mut back).unwrap();
        assert!(back == data);
    }
}
