//! Streams through a backing file: their write-out starts while they are still coming, and
//! neither direction leaves the ciphertext behind in the backing file's page cache.
//!
//! Through FUSE a stream lands in two page caches: the plaintext view's (the kernel's cache of
//! the mount) and the backing file's. Left alone, a written stream's dirty backing pages wait
//! for the final fsync (or the kernel's 30 s expiry), so `dd conv=fsync` through the mount
//! costs the FUSE transfer *plus* the disk write, where on a plain directory it costs the copy
//! plus the disk write; and a stream read or written once occupies memory twice.
//!
//! [`Batches`] gathers one direction's large requests on one file into batches of [`BATCH`]
//! bytes. When one is full ([`Finished`]):
//! - after writes, its write-out starts (`sync_file_range(2)` with `SYNC_FILE_RANGE_WRITE`,
//!   which does not wait for the disk), and the batch before, written out since, leaves the
//!   backing cache (`posix_fadvise(2)` `POSIX_FADV_DONTNEED`, which leaves pages that are still
//!   dirty or in flight alone);
//! - after reads, the batch before leaves the backing cache (the view caches the plaintext;
//!   the batch just read is kept, since requests of it may still be reading).
//!
//! The kernel sends one stream's requests out of order (from several threads), so a batch is
//! the hull of its requests, not a run. Small requests are not counted: they are not streams,
//! and early write-out of them would only cost more disk writes.

use std::fs::File;
use std::num::NonZeroU64;
use std::os::unix::io::AsRawFd;

/// Backing bytes of large requests in one batch.
pub const BATCH: u64 = 8 << 20;
/// Smallest request (in backing bytes) counted as part of a stream.
pub const MIN_STREAM_REQUEST: u64 = 256 << 10;

/// Whether a request on backing bytes `[from, to)` counts as part of a stream.
pub fn is_stream_request(from: u64, to: u64) -> bool {
    to.saturating_sub(from) >= MIN_STREAM_REQUEST
}

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

/// Where one direction's large requests on one file went since the last finished batch.
#[derive(Debug, Default)]
pub struct Batches {
    batch: Option<Span>,
    bytes: u64,
    previous: Option<Span>,
}

/// A full batch and the one before it; acted on once the file's locks are released.
#[derive(Debug, PartialEq, Eq)]
pub struct Finished {
    pub batch: Span,
    pub before: Option<Span>,
}

impl Batches {
    /// Notes a request on backing bytes `[from, to)`; returns the batch it completes, if any.
    pub fn add(&mut self, from: u64, to: u64) -> Option<Finished> {
        if !is_stream_request(from, to) {
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
        Some(Finished {
            batch,
            before: self.previous.replace(batch),
        })
    }
}

// Both are best effort: a failure only means that the data reaches the disk at the next fsync,
// or that pages stay cached.
impl Finished {
    /// After writes: starts writing the batch out and evicts the batch before.
    pub fn write_out(&self, file: &File) {
        let Span { from, to } = self.batch;
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
        self.evict_before(file);
    }

    /// After reads, or writes: drops the batch before from the backing file's page cache.
    pub fn evict_before(&self, file: &File) {
        if let Some(Span { from, to }) = self.before {
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
    fn small_requests_never_finish_a_batch() {
        let mut w = Batches::default();
        for i in 0..10_000 {
            assert_eq!(w.add(i * 4096, (i + 1) * 4096), None);
        }
    }

    #[test]
    fn a_batch_is_the_hull_of_out_of_order_requests_and_names_the_one_before() {
        let mut w = Batches::default();
        let order = [1, 0, 3, 2, 5, 4, 7, 6];
        for (n, i) in order.iter().enumerate() {
            let k = w.add(i * MIB, (i + 1) * MIB);
            assert_eq!(k.is_some(), n == order.len() - 1);
            if let Some(k) = k {
                assert_eq!(
                    k.batch,
                    Span {
                        from: 0,
                        to: 8 * MIB
                    }
                );
                assert_eq!(k.before, None);
            }
        }
        let mut last = None;
        for i in 8..16 {
            last = w.add(i * MIB, (i + 1) * MIB).or(last);
        }
        let k = last.expect("second batch");
        assert_eq!(
            k.batch,
            Span {
                from: 8 * MIB,
                to: 16 * MIB
            }
        );
        assert_eq!(
            k.before,
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
    fn write_out_keeps_the_bytes_and_evicts_the_batch_before() {
        use std::io::Read;
        use std::os::unix::fs::FileExt;
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let mut f = tmp.reopen().unwrap();
        let data: Vec<u8> = (0..(2 * BATCH)).map(|i| (i % 251) as u8).collect();
        let mut w = Batches::default();
        let mut kicks = Vec::new();
        for (i, chunk) in data.chunks(MIB as usize).enumerate() {
            let off = i as u64 * MIB;
            f.write_all_at(chunk, off).unwrap();
            if let Some(k) = w.add(off, off + chunk.len() as u64) {
                if kicks.is_empty() {
                    k.write_out(&f);
                    // The first batch is on disk (clean) when the second kick evicts it.
                    f.sync_all().unwrap();
                    assert!(resident(tmp.path()) >= BATCH, "not cached before");
                } else {
                    k.write_out(&f);
                }
                kicks.push(k);
            }
        }
        assert_eq!(kicks.len(), 2);
        assert_eq!(kicks[1].before, Some(kicks[0].batch));
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

    #[test]
    fn reading_a_stream_evicts_the_batch_before() {
        use std::os::unix::fs::FileExt;
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let f = tmp.reopen().unwrap();
        f.write_all_at(&vec![7u8; (3 * BATCH) as usize], 0).unwrap();
        f.sync_all().unwrap();
        let mut r = Batches::default();
        let mut buf = vec![0u8; MIB as usize];
        let mut finished = 0;
        for i in 0..3 * BATCH / MIB {
            f.read_exact_at(&mut buf, i * MIB).unwrap();
            if let Some(done) = r.add(i * MIB, (i + 1) * MIB) {
                done.evict_before(&f);
                finished += 1;
            }
        }
        assert_eq!(finished, 3);
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        if rustix::fs::fstatfs(&f).unwrap().f_type as i64 != TMPFS_MAGIC {
            // The first two batches are gone; the last one stays.
            let res = resident(tmp.path());
            assert!(res <= BATCH, "{res} bytes still cached");
            assert!(res > 0, "the last batch was evicted too");
        }
    }
}
