//! Many threads and processes at once, random operation sequences against a plain reference
//! file, and persistence across mounts.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const BLOCKS: u64 = 64;
const BS: u64 = 4096;

/// The byte that ends up at `off` of the concurrency test file.
fn expected(off: u64) -> u8 {
    ((off / BS) as u8).wrapping_mul(37) ^ (off as u8) | 1
}

#[test]
fn concurrent_readers_and_writers_see_consistent_data() {
    let fs = TestFs::new();
    let path = fs.p("shared");
    File::create(&path).unwrap().set_len(BLOCKS * BS).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let path = path.clone();
            std::thread::spawn(move || {
                let f = OpenOptions::new().write(true).open(&path).unwrap();
                let mut rng = Rng(w + 1);
                // Each writer owns 16 blocks and writes them in random pieces, several times.
                for _ in 0..3 {
                    let mut off = w * 16 * BS;
                    let end = (w + 1) * 16 * BS;
                    while off < end {
                        let len = (1 + rng.below(3 * BS)).min(end - off);
                        let data: Vec<u8> = (off..off + len).map(expected).collect();
                        f.write_all_at(&data, off).unwrap();
                        off += len;
                    }
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..4u64)
        .map(|r| {
            let path = path.clone();
            let done = done.clone();
            std::thread::spawn(move || {
                let f = File::open(&path).unwrap();
                let mut rng = Rng(100 + r);
                let mut buf = vec![0u8; 3 * BS as usize];
                let mut reads = 0;
                while !done.load(Ordering::Relaxed) || reads < 50 {
                    let off = rng.below(BLOCKS * BS - buf.len() as u64);
                    f.read_exact_at(&mut buf, off).unwrap();
                    for (i, &b) in buf.iter().enumerate() {
                        let want = expected(off + i as u64);
                        // Either not written yet (a hole) or exactly what was written.
                        assert!(
                            b == 0 || b == want,
                            "offset {}: {b} != {want}",
                            off + i as u64
                        );
                    }
                    reads += 1;
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    let all = fs::read(&path).unwrap();
    let want: Vec<u8> = (0..BLOCKS * BS).map(expected).collect();
    assert!(all == want, "final content differs");
}

#[test]
fn concurrent_unaligned_direct_writes_into_shared_blocks() {
    // O_DIRECT sends each write as it is to the daemon, so threads really do read-modify-write
    // the same blocks at the same time.
    let mut fs = TestFs::new();
    let path = fs.p("records");
    File::create(&path).unwrap();
    const THREADS: u64 = 6;
    const PER: u64 = 150;
    const REC: u64 = 100;
    let record = |t: u64, i: u64| -> Vec<u8> {
        (0..REC)
            .map(|j| (t as u8 + 1).wrapping_mul(17) ^ (i as u8) ^ (j as u8))
            .collect()
    };
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&path)
                    .unwrap();
                for i in 0..PER {
                    let off = (i * THREADS + t) * REC;
                    f.write_all_at(&record(t, i), off).unwrap();
                    if i % 10 == 0 {
                        let mut back = vec![0u8; REC as usize];
                        f.read_exact_at(&mut back, off).unwrap();
                        assert_eq!(back, record(t, i));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    fs.remount();
    let all = fs::read(&path).unwrap();
    assert_eq!(all.len() as u64, THREADS * PER * REC);
    for i in 0..PER {
        for t in 0..THREADS {
            let off = ((i * THREADS + t) * REC) as usize;
            assert_eq!(
                &all[off..off + REC as usize],
                &record(t, i)[..],
                "record {t}/{i}"
            );
        }
    }
}

#[derive(Debug)]
enum Op {
    Write(u64, usize),
    Read(u64, usize),
    SetLen(u64),
    Sync,
}

fn random_op(rng: &mut Rng) -> Op {
    match rng.below(10) {
        0..=4 => Op::Write(rng.below(120_000), 1 + rng.below(20_000) as usize),
        5..=7 => Op::Read(rng.below(140_000), 1 + rng.below(30_000) as usize),
        8 => Op::SetLen(rng.below(130_000)),
        _ => Op::Sync,
    }
}

/// Applies `ops` to a file in the mount and to a plain file, comparing every read.
fn run_against_reference(seed: u64, mount_file: &File, plain: &File, ops: usize) {
    let mut rng = Rng(seed);
    for n in 0..ops {
        let op = random_op(&mut rng);
        match op {
            Op::Write(off, len) => {
                let data = rng.bytes(len);
                mount_file.write_all_at(&data, off).unwrap();
                plain.write_all_at(&data, off).unwrap();
            }
            Op::Read(off, len) => {
                let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
                let na = read_full(mount_file, &mut a, off);
                let nb = read_full(plain, &mut b, off);
                assert_eq!(na, nb, "seed {seed} op {n} {op:?}: lengths");
                assert!(a[..na] == b[..nb], "seed {seed} op {n} {op:?}: data");
            }
            Op::SetLen(len) => {
                mount_file.set_len(len).unwrap();
                plain.set_len(len).unwrap();
            }
            Op::Sync => mount_file.sync_data().unwrap(),
        }
        assert_eq!(
            mount_file.metadata().unwrap().len(),
            plain.metadata().unwrap().len(),
            "seed {seed} op {n} {op:?}: size"
        );
    }
}

#[test]
fn random_operations_match_plain_reference_file() {
    let mut fs = TestFs::new();
    let refdir = tempfile::tempdir().unwrap();
    for seed in [1u64, 2, 3] {
        let name = format!("rand{seed}");
        let open = |p: &std::path::Path, direct: bool| {
            let mut o = OpenOptions::new();
            o.create(true).truncate(false).read(true).write(true);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(p).unwrap()
        };
        let plain = open(&refdir.path().join(&name), false);
        // Seed 3 bypasses the page cache, so the daemon sees the raw offsets and sizes.
        let m = open(&fs.p(&name), seed == 3);
        run_against_reference(seed, &m, &plain, 150);
        drop(m);
        fs.remount();
        let m = open(&fs.p(&name), false);
        run_against_reference(seed + 1000, &m, &plain, 100);
        drop(m);
        assert!(fs::read(fs.p(&name)).unwrap() == fs::read(refdir.path().join(&name)).unwrap());
    }
}

#[test]
fn tree_survives_unmount_and_remount() {
    let mut fs = TestFs::new();
    let mut want: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut rng = Rng(77);
    for d in ["a", "a/b", "a/b/c", "empty", "x"] {
        fs::create_dir(fs.p(d)).unwrap();
    }
    for i in 0..40 {
        let dir = ["a", "a/b", "a/b/c", "x", ""][i % 5];
        let rel = if dir.is_empty() {
            format!("file{i}")
        } else {
            format!("{dir}/file{i}")
        };
        let len = rng.below(70_000) as usize;
        let data = rng.bytes(len);
        fs::write(fs.p(&rel), &data).unwrap();
        want.insert(rel, data);
    }
    std::os::unix::fs::symlink("a/b/file1", fs.p("sym")).unwrap();
    setxattr(&fs.p("a/b"), "user.k", b"v", 0).unwrap();
    fs.remount();
    for (rel, data) in &want {
        assert!(fs::read(fs.p(rel)).unwrap() == *data, "{rel}");
    }
    assert_eq!(
        fs::read_link(fs.p("sym")).unwrap().to_str(),
        Some("a/b/file1")
    );
    assert_eq!(getxattr(&fs.p("a/b"), "user.k", true).unwrap(), b"v");
    assert!(names(&fs.p("empty")).is_empty());
    // a, empty, x, eight files, sym
    assert_eq!(names(&fs.mnt).len(), 3 + 8 + 1);
}

#[test]
fn parallel_directory_operations_in_one_directory() {
    let fs = TestFs::new();
    fs::create_dir(fs.p("d")).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let dir = fs.p("d");
            std::thread::spawn(move || {
                for i in 0..100 {
                    let p = dir.join(format!("t{t}-{i}"));
                    fs::write(&p, format!("{t}/{i}")).unwrap();
                    if i % 2 == 0 {
                        fs::rename(&p, dir.join(format!("t{t}-{i}-renamed"))).unwrap();
                    }
                    if i % 4 == 1 {
                        fs::remove_file(&p).unwrap();
                    }
                    if i % 10 == 0 {
                        fs::create_dir(dir.join(format!("sub{t}-{i}"))).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut want = Vec::new();
    for t in 0..4 {
        for i in 0..100 {
            if i % 2 == 0 {
                want.push(format!("t{t}-{i}-renamed"));
            } else if i % 4 != 1 {
                want.push(format!("t{t}-{i}"));
            }
            if i % 10 == 0 {
                want.push(format!("sub{t}-{i}"));
            }
        }
    }
    want.sort();
    assert_eq!(names(&fs.p("d")), want);
    assert_eq!(fs::read_to_string(fs.p("d/t2-3")).unwrap(), "2/3");
}

/// The descriptor table is grown once before serving starts: every node the kernel knows
/// holds a descriptor, and each doubling of the table in a process of several threads waits
/// for an RCU grace period, stalling every request that opens a descriptor (10-25 ms at the
/// 256th, 512th, 1024th... node).
#[test]
fn the_descriptor_table_is_grown_before_serving() {
    let fs = TestFs::new();
    // A served request: the serving threads run.
    fs::metadata(fs.p("")).unwrap();
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let size: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("FDSize:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("FDSize in /proc/self/status");
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    assert!(
        size >= limit.min(65_536),
        "descriptor table of {size} entries, limit {limit}"
    );
}
