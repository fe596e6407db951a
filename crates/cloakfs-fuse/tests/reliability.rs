//! No acknowledged write is lost (issue 23): writes the backing file system refuses are refused
//! at write(2) time, and a write that fails after the kernel acknowledged it (a shared
//! mapping's writeback, the writeback cache) or a failed fsync is reported by every fsync and
//! close until it is handled. Real mounts on real backing file systems: the tempdir's ext4, and
//! small tmpfs mounts (root only) for ENOSPC.

mod common;

use common::*;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Largest plaintext file on ext4 with 4 KiB blocks: its backing file then has the largest
/// size ext4 allows, (2^32 - 1) * 4096 bytes.
const EXT4_PLAIN_MAX: u64 = 17_472_743_458_050;

fn fsync(f: &File) -> Result<(), i32> {
    f.sync_all().map_err(|e| errno(&e))
}

/// close(2) of `f`, with its result (dropping a File ignores it).
fn close(f: File) -> Result<(), i32> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` is an open descriptor this function now owns, closed exactly once.
    check(unsafe { libc::close(fd) }).map_err(|e| errno(&e))
}

fn backing_is_ext4_4k(p: &Path) -> bool {
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs on a NUL-terminated path into a zeroed struct of the right type.
    let rc = unsafe { libc::statfs(cpath(p).as_ptr(), &mut st) };
    rc == 0 && st.f_type == 0xEF53 && st.f_bsize == 4096
}

fn open_rw(p: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .unwrap()
}

#[test]
fn every_way_to_grow_a_file_past_the_largest_size_is_refused_at_once() {
    let mut fs = TestFs::new();
    let f = open_rw(&fs.p("huge"));
    f.write_all_at(b"kept", 0).unwrap();
    // Beyond the backing file system's limit (ext4: 16 TiB; not tmpfs, which holds files
    // past 2^62 bytes: the backing file of a 2^62-byte file is within 2^62 + 2^60), and
    // beyond the daemon's own (its backing file would pass 2^63 bytes).
    let plain = File::create(fs.tmp.path().join("plain-huge")).unwrap();
    let backing_limited = plain.set_len((1 << 62) + (1 << 60)).is_err();
    let offsets: &[u64] = if backing_limited {
        &[1 << 62, (1 << 63) - 4096]
    } else {
        &[(1 << 63) - 4096]
    };
    for &off in offsets {
        let e = f.write_all_at(b"x", off).unwrap_err();
        assert_eq!(errno(&e), libc::EFBIG, "pwrite at {off}");
        assert_eq!(
            errno(&f.set_len(off).unwrap_err()),
            libc::EFBIG,
            "ftruncate {off}"
        );
        // SAFETY: fallocate on an open descriptor with plain integer arguments.
        let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, off as i64, 4096) };
        assert_eq!(
            check(rc).map_err(|e| errno(&e)),
            Err(libc::EFBIG),
            "fallocate {off}"
        );
        let src = open_rw(&fs.p("src"));
        src.write_all_at(b"copy me", 0).unwrap();
        let mut off_in: i64 = 0;
        let mut off_out = off as i64;
        // SAFETY: copy_file_range between two open descriptors with valid offset pointers.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                f.as_raw_fd(),
                &mut off_out,
                7,
                0,
            )
        };
        assert_eq!(n, -1, "copy_file_range to {off}");
        assert_eq!(errno(&std::io::Error::last_os_error()), libc::EFBIG);
        assert_eq!(f.metadata().unwrap().len(), 4, "nothing was acknowledged");
    }
    // Nothing to report later: the file is as it was.
    fsync(&f).unwrap();
    close(f).unwrap();
    fs.remount();
    assert_eq!(fs::read(fs.p("huge")).unwrap(), b"kept");
}

#[test]
fn the_backing_file_systems_own_limit_is_refused_at_write_time() {
    let mut fs = TestFs::new();
    if !backing_is_ext4_4k(&fs.cipher) {
        eprintln!("skipped: the temporary directory is not on ext4 with 4 KiB blocks");
        return;
    }
    let f = open_rw(&fs.p("edge"));
    // The last byte that fits is accepted (a sparse file of 16 TiB), the next one refused.
    f.write_all_at(b"z", EXT4_PLAIN_MAX - 1).unwrap();
    let e = f.write_all_at(b"z", EXT4_PLAIN_MAX).unwrap_err();
    assert_eq!(errno(&e), libc::EFBIG);
    assert_eq!(
        errno(&f.set_len(EXT4_PLAIN_MAX + 1).unwrap_err()),
        libc::EFBIG
    );
    assert_eq!(f.metadata().unwrap().len(), EXT4_PLAIN_MAX);
    fsync(&f).unwrap();
    close(f).unwrap();
    fs.remount();
    let f = File::open(fs.p("edge")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), EXT4_PLAIN_MAX);
    let mut b = [0u8; 2];
    assert_eq!(f.read_at(&mut b, EXT4_PLAIN_MAX - 2).unwrap(), 2);
    assert_eq!(b, [0, b'z']);
    fs::remove_file(fs.p("edge")).unwrap();
}

/// A tmpfs of `size` mounted at `dir`, unmounted on drop; `None` when not root.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: PathBuf, size: &str) -> Option<Self> {
        if !is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return None;
        }
        fs::create_dir_all(&dir).unwrap();
        let ok = run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "reliab-test"])
            .arg(&dir));
        assert!(ok, "mount tmpfs");
        Some(Self(dir))
    }

    /// Fills the file system but for about `room` bytes.
    fn fill(&self, room: u64) {
        fill(&self.0, room)
    }
}

/// Fills the file system mounted at `dir` but for about `room` bytes.
fn fill(dir: &Path, room: u64) {
    let mut f = File::create(dir.join("filler")).unwrap();
    while f.write_all(&[1u8; 16 * 1024]).is_ok() {}
    f.set_len(f.metadata().unwrap().len().saturating_sub(room))
        .unwrap();
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Under the spawn lock, like every child: one forked meanwhile would hold another
        // test's open files and make its unmount fail as busy.
        let _ = run(Command::new("umount").arg("-l").arg(&self.0));
    }
}

/// A volume whose cipher directory is on a small tmpfs. Let the pair drop together (the
/// tmpfs first, as bindings drop in reverse): the tmpfs is detached before the volume's
/// temporary directory, which holds its mount point, is removed.
fn volume_on_tmpfs(size: &str, writeback: bool) -> Option<(TestFs, Tmpfs)> {
    let tmp = tempfile::tempdir().unwrap();
    let disk = Tmpfs::mount(tmp.path().join("disk"), size)?;
    let cipher = disk.0.join("cipher");
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    create_volume(&cipher);
    let fs = TestFs::mount_existing(tmp, cipher, mnt, |o| o.writeback_cache = writeback);
    Some((fs, disk))
}

#[test]
fn a_full_disk_is_reported_by_the_write_itself() {
    let Some((fs, disk)) = volume_on_tmpfs("2m", false) else {
        return;
    };
    let keep: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(fs.p("keep"), &keep).unwrap();
    disk.fill(16 * 1024);
    let mut f = OpenOptions::new().append(true).open(fs.p("keep")).unwrap();
    let mut written = 0usize;
    let err = loop {
        match f.write(&[0x5a; 8192]) {
            Ok(n) => written += n,
            Err(e) => break e,
        }
        assert!(written < 1 << 20, "a full disk must refuse writes");
    };
    assert_eq!(errno(&err), libc::ENOSPC, "{err}");
    // What write(2) acknowledged is there; nothing is left to report at fsync or close.
    fsync(&f).unwrap();
    close(f).unwrap();
    let back = fs::read(fs.p("keep")).unwrap();
    assert_eq!(back.len(), keep.len() + written);
    assert_eq!(&back[..keep.len()], &keep[..]);
}

/// A write through a shared mapping is acknowledged by the kernel; when its writeback finds the
/// disk full, every fsync and close reports it until every handle is closed, and the next
/// open starts clean. The mapping is made in a process of its own ([`in_own_process`]).
#[test]
fn a_lost_mapped_write_is_reported_by_every_fsync_and_close() {
    if let Some(mnt) = own_process_dir() {
        return lose_a_mapped_write(&mnt);
    }
    for writeback in [false, true] {
        let Some((fs, _disk)) = volume_on_tmpfs("2m", writeback) else {
            return;
        };
        eprintln!("writeback cache {writeback}:");
        in_own_process(
            "a_lost_mapped_write_is_reported_by_every_fsync_and_close",
            &fs.mnt,
        );
    }
}

/// Where [`a_lost_mapped_write_is_reported_by_every_fsync_and_close`] works: in the mount
/// `mnt` of [`volume_on_tmpfs`], whose tmpfs is `disk` beside it.
fn lose_a_mapped_write(mnt: &Path) {
    let len = 256 * 1024;
    let path = mnt.join("mapped");
    let f = open_rw(&path);
    f.set_len(len as u64).unwrap(); // a hole: writing it needs new space
    let other = open_rw(&path);
    fill(&mnt.parent().unwrap().join("disk"), 8 * 1024);
    let p = map_shared(&f, len, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: a shared mapping of `len` bytes of an open file of that size, written within
    // bounds and unmapped before the file is closed.
    unsafe {
        std::ptr::write_bytes(p, 0x77, len);
        let _ = libc::msync(p.cast(), len, libc::MS_SYNC);
        libc::munmap(p.cast(), len);
    }
    for i in 0..3 {
        let r = fsync(&f);
        assert!(
            matches!(r, Err(libc::ENOSPC) | Err(libc::EIO)),
            "fsync {i}: {r:?}"
        );
    }
    assert!(fsync(&other).is_err(), "another handle's fsync");
    assert!(close(other).is_err(), "close of another handle");
    assert!(close(f).is_err(), "close of the writer");
    // Handled: every handle was told. A new open sees what is stored, and no error.
    let again = open_rw(&path);
    fsync(&again).unwrap();
    close(again).unwrap();
}

/// Truncating the file to nothing handles a lost write too (no lost byte is part of it).
#[test]
fn truncating_to_nothing_handles_a_lost_write() {
    let Some((fs, disk)) = volume_on_tmpfs("2m", true) else {
        return;
    };
    let f = open_rw(&fs.p("f"));
    disk.fill(8 * 1024);
    let _ = f.write_all_at(&[1u8; 512 * 1024], 0);
    assert!(fsync(&f).is_err());
    assert!(fsync(&f).is_err(), "still not handled");
    f.set_len(0).unwrap();
    fsync(&f).unwrap();
    close(f).unwrap();
}
