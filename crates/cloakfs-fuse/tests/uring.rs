//! FUSE over io_uring: where the kernel offers it, a mount serves its requests through the
//! rings, and files, names, xattrs and listings come out as through /dev/fuse; where it does
//! not (or io_uring is turned off), /dev/fuse serves, and the log says which and why.
//!
//! The kernel offers it only while /sys/module/fuse/parameters/enable_uring is Y: these tests
//! need root to set it, and put back what they found. The rest of the suite runs through
//! /dev/fuse (the parameter's default, N).

mod common;

use common::*;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// The kernel parameter, set for a test and put back as found when it ends (also on a
/// failure). Tests holding it run one at a time: the parameter and the served-requests
/// count are process-wide.
struct UringParam {
    previous: String,
    _serial: MutexGuard<'static, ()>,
}

impl UringParam {
    /// None (the test is skipped) without root or without the parameter.
    fn set(on: bool) -> Option<Self> {
        static SERIAL: Mutex<()> = Mutex::new(());
        if !is_root() || !Path::new(PARAM).exists() {
            eprintln!("skipped: needs root and a kernel with FUSE over io_uring ({PARAM})");
            return None;
        }
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let previous = fs::read_to_string(PARAM).unwrap().trim().to_string();
        fs::write(PARAM, if on { "Y" } else { "N" }).unwrap();
        Some(Self {
            previous,
            _serial: serial,
        })
    }
}

impl Drop for UringParam {
    fn drop(&mut self) {
        let _ = fs::write(PARAM, &self.previous);
    }
}

/// `kernel.io_uring_disabled`, set for a test and put back as found when it ends.
struct IoUringDisabled(String);

const DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";

impl IoUringDisabled {
    fn set(value: &str) -> Self {
        let previous = fs::read_to_string(DISABLED).unwrap().trim().to_string();
        fs::write(DISABLED, value).unwrap();
        Self(previous)
    }
}

impl Drop for IoUringDisabled {
    fn drop(&mut self) {
        let _ = fs::write(DISABLED, &self.0);
    }
}

/// Log lines of this test binary (all tests share one global subscriber).
fn captured_log() -> &'static Mutex<Vec<u8>> {
    static LOG: std::sync::OnceLock<&'static Mutex<Vec<u8>>> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        struct W(&'static Mutex<Vec<u8>>);
        impl Write for W {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || W(log))
            .init();
        log
    })
}

/// Captured log lines about mount point `mnt` that mention `needle`.
fn log_lines(mnt: &Path, needle: &str) -> Vec<String> {
    let mnt = mnt.display().to_string();
    String::from_utf8_lossy(&captured_log().lock().unwrap())
        .lines()
        .filter(|l| l.contains(&mnt) && l.contains(needle))
        .map(str::to_string)
        .collect()
}

/// Runs `f` with the served-requests count before and after.
fn served_during(f: impl FnOnce()) -> u64 {
    let before = cloakfs_fuse::io_uring_requests_served();
    f();
    cloakfs_fuse::io_uring_requests_served() - before
}

/// Every kind of request with a payload either way: writes of one byte to several MiB
/// (more than one request each), reads, names (lookups, creates, renames, links), xattrs,
/// listings, attributes, and several writers at once. Checks every result.
fn workload(fs: &TestFs) {
    let mut rng = Rng(0x5eed);
    let sizes = [
        0usize,
        1,
        4095,
        4096,
        4097,
        100_000,
        1 << 20,
        (3 << 20) + 17,
    ];
    for (i, &n) in sizes.iter().enumerate() {
        let data = rng.bytes(n);
        fs::write(fs.p(&format!("file-{i}")), &data).unwrap();
        assert_eq!(
            fs::read(fs.p(&format!("file-{i}"))).unwrap(),
            data,
            "size {n}"
        );
    }
    // In-place writes and reads at offsets.
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(fs.p("file-6"))
        .unwrap();
    f.write_all_at(b"middle", 500_000).unwrap();
    let mut buf = [0u8; 6];
    f.read_exact_at(&mut buf, 500_000).unwrap();
    assert_eq!(&buf, b"middle");
    f.set_len(123_456).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 123_456);
    drop(f);
    let mut a = fs::OpenOptions::new()
        .append(true)
        .open(fs.p("file-1"))
        .unwrap();
    a.write_all(b"tail").unwrap();
    drop(a);
    assert_eq!(fs::read(fs.p("file-1")).unwrap().len(), 5);

    // Names.
    fs::create_dir_all(fs.p("d/e/f")).unwrap();
    let long = "n".repeat(200);
    fs::write(fs.p(&format!("d/e/f/{long}")), b"deep").unwrap();
    assert_eq!(fs::read(fs.p(&format!("d/e/f/{long}"))).unwrap(), b"deep");
    fs::rename(fs.p("file-2"), fs.p("d/renamed")).unwrap();
    assert!(!fs.p("file-2").exists());
    fs::hard_link(fs.p("d/renamed"), fs.p("d/linked")).unwrap();
    assert_eq!(fs::metadata(fs.p("d/linked")).unwrap().len(), 4095);
    std::os::unix::fs::symlink("renamed", fs.p("d/sym")).unwrap();
    assert_eq!(fs::read_link(fs.p("d/sym")).unwrap(), Path::new("renamed"));
    fs::set_permissions(fs.p("d/renamed"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        fs::metadata(fs.p("d/renamed"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    fs::remove_file(fs.p("d/linked")).unwrap();
    fs::remove_dir(fs.p("d/e/f")).expect_err("a directory with an entry is not removed");

    // Listings: many entries, more than one READDIRPLUS reply.
    fs::create_dir(fs.p("many")).unwrap();
    for i in 0..300 {
        fs::write(fs.p(&format!("many/entry-{i:04}")), i.to_string()).unwrap();
    }
    let mut names = names(&fs.p("many"));
    names.sort();
    let want: Vec<String> = (0..300).map(|i| format!("entry-{i:04}")).collect();
    assert_eq!(names, want);

    // Xattrs: a value in a request's payload, one in a reply's.
    setxattr(&fs.p("file-0"), "user.colour", b"blue", 0).unwrap();
    assert_eq!(
        getxattr(&fs.p("file-0"), "user.colour", true).unwrap(),
        b"blue"
    );
    assert!(listxattr(&fs.p("file-0"))
        .unwrap()
        .contains(&b"user.colour".to_vec()));

    // Several writers and readers at once, so several ring entries serve together.
    let writers: Vec<_> = (0..6)
        .map(|t| {
            let dir = fs.p("");
            std::thread::spawn(move || {
                let data = vec![t as u8; 300_000 + t * 1000];
                let path = dir.join(format!("par-{t}"));
                let mut f = fs::File::create(&path).unwrap();
                f.write_all(&data).unwrap();
                f.seek(SeekFrom::Start(0)).unwrap();
                drop(f);
                let mut back = Vec::new();
                fs::File::open(&path)
                    .unwrap()
                    .read_to_end(&mut back)
                    .unwrap();
                assert_eq!(back, data);
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
}

#[test]
fn serves_through_io_uring_when_the_kernel_offers_it() {
    let Some(_param) = UringParam::set(true) else {
        return;
    };
    captured_log();
    let mut fs = TestFs::new();
    let served = served_during(|| workload(&fs));
    // Some requests of the first moments may still come through /dev/fuse (the kernel
    // starts using the rings once every queue has an entry); nearly all must not.
    assert!(served > 500, "only {served} requests came through io_uring");
    assert_eq!(
        log_lines(&fs.mnt, "FUSE requests through io_uring").len(),
        1,
        "{:?}",
        log_lines(&fs.mnt, "FUSE requests")
    );
    // What went in through the rings is on disk: a fresh mount reads it back.
    let expect = fs::read(fs.p("file-7")).unwrap();
    fs.remount();
    assert_eq!(fs::read(fs.p("file-7")).unwrap(), expect);
    assert_eq!(
        fs::read(fs.p("d/e/f").join("n".repeat(200))).unwrap(),
        b"deep"
    );
    fs.unmount();
}

#[test]
fn busy_polling_serves_the_same_and_can_be_turned_off() {
    let Some(_param) = UringParam::set(true) else {
        return;
    };
    for busy_poll in [true, false] {
        let mut fs = TestFs::with(|o| o.busy_poll = busy_poll);
        let (polls_before, caught_before) = cloakfs_fuse::io_uring_busy_polls();
        let served = served_during(|| workload(&fs));
        let (polls, caught) = cloakfs_fuse::io_uring_busy_polls();
        let (polls, caught) = (polls - polls_before, caught - caught_before);
        assert!(served > 500, "only {served} requests came through io_uring");
        if busy_poll {
            // Whether a poll sees the next request come is a matter of timing; that the
            // threads poll after replies is not.
            assert!(polls > 0, "no busy poll in {served} requests");
            assert!(caught <= polls);
        } else {
            assert_eq!((polls, caught), (0, 0));
        }
        fs.unmount();
    }
}

#[test]
fn uses_dev_fuse_when_io_uring_is_turned_off() {
    let Some(_param) = UringParam::set(true) else {
        return;
    };
    captured_log();
    let mut fs = TestFs::with(|o| o.io_uring = false);
    let served = served_during(|| workload(&fs));
    assert_eq!(served, 0);
    assert_eq!(
        log_lines(
            &fs.mnt,
            "FUSE requests through /dev/fuse (io_uring turned off"
        )
        .len(),
        1
    );
    fs.unmount();
}

#[test]
fn uses_dev_fuse_when_the_kernel_does_not_offer_io_uring() {
    let Some(_param) = UringParam::set(false) else {
        return;
    };
    captured_log();
    let mut fs = TestFs::new();
    let served = served_during(|| workload(&fs));
    assert_eq!(served, 0);
    assert_eq!(
        log_lines(
            &fs.mnt,
            "FUSE requests through /dev/fuse (the kernel does not offer"
        )
        .len(),
        1
    );
    fs.unmount();
}

#[test]
fn uses_dev_fuse_when_the_process_may_not_set_up_a_ring() {
    let Some(_param) = UringParam::set(true) else {
        return;
    };
    captured_log();
    let mut fs = {
        // Only while mounting: the handshake checks whether a ring can be made, and asks the
        // kernel for the rings only then (else every request would wait for them).
        let _disabled = IoUringDisabled::set("2");
        TestFs::new()
    };
    let served = served_during(|| workload(&fs));
    assert_eq!(served, 0);
    assert_eq!(
        log_lines(
            &fs.mnt,
            "FUSE requests through /dev/fuse (this process may not set up an io_uring"
        )
        .len(),
        1,
        "{:?}",
        log_lines(&fs.mnt, "FUSE requests")
    );
    fs.unmount();
}

/// A READ is answered from its ring entry's buffer, where the blocks around the range are read
/// and opened (the reply is not copied). With blocks larger than a page, the kernel's reads
/// start inside a block, and direct reads start anywhere and take up to 1 MiB: the entry's
/// room past the payload must hold the blocks around, and the plaintext must move to the
/// buffer's start. Every range comes back as written.
#[test]
fn reads_answered_from_the_ring_entry_are_right_at_any_offset() {
    let Some(_param) = UringParam::set(true) else {
        return;
    };
    let mut fs = TestFs::with_params(|p| p.block_size = 64 << 10);
    let data = Rng(0xb10c).bytes((2 << 20) + 12_345);
    fs::write(fs.p("f"), &data).unwrap();
    fs.remount();
    let len = data.len();
    let served = served_during(|| {
        let f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(fs.p("f"))
            .unwrap();
        let ranges = [
            (0, 1 << 20),
            (1, 1 << 20),
            (4096, 1 << 20),
            ((64 << 10) - 1, 1 << 20),
            ((1 << 20) + 3, 1 << 20),
            (70_000, 5),
            (len - 10, 100),
            (len, 10),
        ];
        for (off, n) in ranges {
            let mut buf = vec![0u8; n];
            let got = read_full(&f, &mut buf, off as u64);
            let want = &data[off.min(len)..(off + n).min(len)];
            assert!(&buf[..got] == want, "{n} bytes at {off}");
        }
        // Through the page cache: page-sized reads inside the blocks, and readahead.
        let f = fs::File::open(fs.p("f")).unwrap();
        let mut page = [0u8; 10];
        assert_eq!(read_full(&f, &mut page, 70_000), 10);
        assert_eq!(page, data[70_000..70_010]);
        assert!(fs::read(fs.p("f")).unwrap() == data);
    });
    assert!(served > 0, "no request came through io_uring");
    fs.unmount();
}
