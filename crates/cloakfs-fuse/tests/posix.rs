//! POSIX behaviour suite: one test per behaviour, each through a real FUSE mount.

mod common;

use common::*;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn create_write_read_at_any_offset() {
    let fs = TestFs::new();
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(fs.p("f"))
        .unwrap();
    let mut reference = vec![0u8; 0];
    // Offsets and sizes around block boundaries (4096) and inside blocks.
    for (off, len) in [
        (0, 10),
        (4090, 20),
        (8192, 4096),
        (100, 9000),
        (20_000, 1),
        (4096, 0),
    ] {
        let data = pattern(len, off as u8);
        f.write_all_at(&data, off).unwrap();
        let end = off as usize + len;
        if reference.len() < end {
            reference.resize(end, 0);
        }
        reference[off as usize..end].copy_from_slice(&data);
    }
    let mut buf = vec![0u8; 5000];
    f.read_exact_at(&mut buf, 3000).unwrap();
    assert_eq!(buf, reference[3000..8000]);
    assert_eq!(f.metadata().unwrap().len(), reference.len() as u64);
    drop(f);
    assert_eq!(fs::read(fs.p("f")).unwrap(), reference);
}

#[test]
fn data_reaches_backing_file_encrypted_with_expected_size() {
    let mut fs = TestFs::new();
    fs::write(fs.p("f"), pattern(10_000, 1)).unwrap();
    fs.unmount();
    // header 18 + two full blocks (4096+28) + 1808+28
    let len = fs::metadata(fs.backing("f")).unwrap().len();
    assert_eq!(len, 18 + 2 * 4124 + 1808 + 28);
    fs.mount();
    assert_eq!(fs::metadata(fs.p("f")).unwrap().len(), 10_000);
}

#[test]
fn sparse_file_reads_zeros_and_stays_sparse() {
    let mut fs = TestFs::new();
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(fs.p("sparse"))
        .unwrap();
    f.write_all_at(b"end", 1 << 30).unwrap();
    drop(f);
    assert_eq!(fs::metadata(fs.p("sparse")).unwrap().len(), (1 << 30) + 3);
    let f = File::open(fs.p("sparse")).unwrap();
    let mut buf = vec![1u8; 8192];
    f.read_exact_at(&mut buf, 500 << 20).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    let mut end = [0u8; 3];
    f.read_exact_at(&mut end, 1 << 30).unwrap();
    assert_eq!(&end, b"end");
    drop(f);
    fs.unmount();
    let m = fs::metadata(fs.backing("sparse")).unwrap();
    assert!(m.len() > 1 << 30);
    assert!(m.blocks() * 512 < 1 << 20, "backing file is not sparse");
}

#[test]
fn sizes_beyond_the_backing_limit_are_refused() {
    let fs = TestFs::new();
    // The backing file of a 2^62-byte file (blocks and their overhead) is within 2^62 + 2^60
    // bytes: a backing file system that holds that (tmpfs) leaves no limit to reach.
    let plain = File::create(fs.tmp.path().join("plain-huge")).unwrap();
    if plain.set_len((1 << 62) + (1 << 60)).is_ok() {
        eprintln!("skipped: the backing file system holds files past 2^62 bytes (tmpfs?)");
        return;
    }
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(fs.p("huge"))
        .unwrap();
    assert_eq!(errno(&f.set_len(1 << 62).unwrap_err()), libc::EFBIG);
    // Refused by the write itself (tests/reliability.rs has every other way).
    assert_eq!(
        errno(&f.write_all_at(b"x", 1 << 62).unwrap_err()),
        libc::EFBIG
    );
    f.set_len(1 << 40).unwrap();
}

#[test]
fn truncate_down_and_up() {
    let fs = TestFs::new();
    let data = pattern(20_000, 3);
    fs::write(fs.p("t"), &data).unwrap();
    let f = OpenOptions::new().write(true).open(fs.p("t")).unwrap();
    f.set_len(5000).unwrap();
    assert_eq!(fs::read(fs.p("t")).unwrap(), data[..5000]);
    f.set_len(12_000).unwrap();
    let got = fs::read(fs.p("t")).unwrap();
    assert_eq!(got.len(), 12_000);
    assert_eq!(got[..5000], data[..5000]);
    assert!(got[5000..].iter().all(|&b| b == 0));
    f.set_len(4096).unwrap();
    drop(f);
    // truncate(2) by path, with no open handle
    let c = cpath(&fs.p("t"));
    // SAFETY: a valid C string path.
    check(unsafe { libc::truncate(c.as_ptr(), 100) }).unwrap();
    assert_eq!(fs::read(fs.p("t")).unwrap(), data[..100]);
}

#[test]
fn shrink_after_large_write_keeps_last_block_valid() {
    // gocryptfs #1024: shrinking after a write of at least one block corrupted the block.
    let mut fs = TestFs::new();
    let data = pattern(4096 * 3 + 10, 9);
    fs::write(fs.p("g"), &data).unwrap();
    let f = OpenOptions::new().write(true).open(fs.p("g")).unwrap();
    f.set_len(4096 + 7).unwrap();
    drop(f);
    fs.remount();
    assert_eq!(fs::read(fs.p("g")).unwrap(), data[..4096 + 7]);
}

#[test]
fn open_with_o_trunc_empties_file() {
    let fs = TestFs::new();
    fs::write(fs.p("f"), vec![5u8; 9000]).unwrap();
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(fs.p("f"))
        .unwrap();
    assert_eq!(f.metadata().unwrap().len(), 0);
    f.write_all(b"new").unwrap();
    drop(f);
    assert_eq!(fs::read(fs.p("f")).unwrap(), b"new");
}

#[test]
fn write_only_handle_partial_block_write_after_remount() {
    // With the writeback cache the kernel reads the rest of a page through write-only handles.
    let mut fs = TestFs::new();
    fs::write(fs.p("w"), vec![b'x'; 8192]).unwrap();
    fs.remount();
    let f = OpenOptions::new().write(true).open(fs.p("w")).unwrap();
    f.write_all_at(b"HELLO", 100).unwrap();
    drop(f);
    let got = fs::read(fs.p("w")).unwrap();
    let mut want = vec![b'x'; 8192];
    want[100..105].copy_from_slice(b"HELLO");
    assert_eq!(got, want);
}

#[test]
fn o_append_writes_at_end() {
    let fs = TestFs::new();
    fs::write(fs.p("a"), b"one\n").unwrap();
    let mut f = OpenOptions::new().append(true).open(fs.p("a")).unwrap();
    f.write_all(b"two\n").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(b"three\n").unwrap();
    drop(f);
    assert_eq!(fs::read(fs.p("a")).unwrap(), b"one\ntwo\nthree\n");
}

#[test]
fn o_append_from_several_processes() {
    let fs = TestFs::new();
    let file = fs.p("log");
    fs::write(&file, b"").unwrap();
    let procs: Vec<_> = (0..4)
        .map(|p| {
            spawn(Command::new("sh").arg("-c").arg(format!(
                "i=0; while [ $i -lt 150 ]; do echo \"proc{p} line $i padding-padding-padding\" >> \"$0\"; i=$((i+1)); done"
            )).arg(&file))
        })
        .collect();
    for mut c in procs {
        assert!(c.wait().unwrap().success());
    }
    let text = fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 600);
    for p in 0..4 {
        for i in 0..150 {
            let want = format!("proc{p} line {i} padding-padding-padding");
            assert_eq!(lines.iter().filter(|l| **l == want).count(), 1, "{want}");
        }
    }
}

#[test]
fn fallocate_modes() {
    let fs = TestFs::new();
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(fs.p("fa"))
        .unwrap();
    fallocate(&f, 0, 0, 10_000).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 10_000);
    fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 10_000, 50_000).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 10_000);
    f.write_all_at(&vec![7u8; 30_000], 0).unwrap();
    fallocate(
        &f,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        1000,
        12_000,
    )
    .unwrap();
    let mut got = vec![0u8; 30_000];
    f.read_exact_at(&mut got, 0).unwrap();
    assert!(got[..1000].iter().all(|&b| b == 7));
    assert!(got[1000..13_000].iter().all(|&b| b == 0));
    assert!(got[13_000..].iter().all(|&b| b == 7));
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 29_000, 2000).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 31_000);
    let mut tail = vec![1u8; 2000];
    f.read_exact_at(&mut tail, 29_000).unwrap();
    assert!(tail.iter().all(|&b| b == 0));
    let e = fallocate(&f, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096).unwrap_err();
    assert_eq!(errno(&e), libc::EOPNOTSUPP);
}

#[test]
fn fsync_and_fdatasync_reach_backing_file() {
    let fs = TestFs::new();
    let mut f = File::create(fs.p("s")).unwrap();
    f.write_all(&vec![1u8; 5000]).unwrap();
    f.sync_all().unwrap();
    let backing = fs.backing("s");
    assert_eq!(fs::metadata(&backing).unwrap().len(), 18 + 4124 + 904 + 28);
    f.write_all(&vec![2u8; 5000]).unwrap();
    f.sync_data().unwrap();
    assert_eq!(
        fs::metadata(&backing).unwrap().len(),
        18 + 2 * 4124 + 1808 + 28
    );
    let d = File::open(&fs.mnt).unwrap();
    d.sync_all().unwrap();
}

#[test]
fn mkdir_creates_durable_dir_id_and_no_leftovers() {
    let fs = TestFs::new();
    fs::create_dir(fs.p("d")).unwrap();
    let backing = fs.backing("d");
    let id = backing.join("cloakfs.dirid");
    assert_eq!(fs::read(&id).unwrap().len(), 16);
    assert_eq!(
        fs::metadata(&id).unwrap().permissions().mode() & 0o777,
        0o440
    );
    assert!(names(&fs.cipher)
        .iter()
        .all(|n| !n.starts_with("cloakfs.tmp.")));
    assert!(fs::metadata(fs.p("d")).unwrap().is_dir());
    // Mode as requested (the test process umask applies in the kernel).
    let c = cpath(&fs.p("m"));
    // SAFETY: a valid C string path.
    check(unsafe { libc::mkdir(c.as_ptr(), 0o510) }).unwrap();
    assert_eq!(
        fs::metadata(fs.p("m")).unwrap().permissions().mode() & 0o7777,
        0o510
    );
    let e = fs::create_dir(fs.p("d")).unwrap_err();
    assert_eq!(errno(&e), libc::EEXIST);
}

#[test]
fn new_modes_follow_the_callers_umask_not_the_daemons() {
    let fs = TestFs::new();
    assert!(sh_in_mount(
        &fs,
        "umask 002 && : > f && mkdir d && mkfifo p",
        None
    ));
    let mode = |n: &str| fs::symlink_metadata(fs.p(n)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode("f"), 0o664);
    assert_eq!(mode("d"), 0o775);
    assert_eq!(mode("p"), 0o664);
}

#[test]
fn rmdir_refuses_non_empty_and_ignores_internal_files() {
    let fs = TestFs::new();
    fs::create_dir(fs.p("d")).unwrap();
    fs::write(fs.p("d/f"), b"x").unwrap();
    let e = fs::remove_dir(fs.p("d")).unwrap_err();
    assert_eq!(errno(&e), libc::ENOTEMPTY);
    fs::remove_file(fs.p("d/f")).unwrap();
    let backing = fs.backing("d");
    // An orphan sidecar left by a crash is cloakfs's own: it does not keep the dir alive.
    fs::write(backing.join("cloakfs.long.orphan.name"), b"junk").unwrap();
    fs::remove_dir(fs.p("d")).unwrap();
    assert!(!backing.exists());
    assert!(!fs.p("d").exists());
    let e = fs::remove_dir(fs.p("d")).unwrap_err();
    assert_eq!(errno(&e), libc::ENOENT);
}

#[test]
fn unlink_removes_backing_file() {
    let fs = TestFs::new();
    fs::write(fs.p("u"), b"data").unwrap();
    let backing = fs.backing("u");
    assert!(backing.exists());
    fs::remove_file(fs.p("u")).unwrap();
    assert!(!backing.exists());
    assert_eq!(errno(&fs::metadata(fs.p("u")).unwrap_err()), libc::ENOENT);
}

#[test]
fn open_unlinked_file_stays_usable() {
    let fs = TestFs::new();
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(fs.p("gone"))
        .unwrap();
    f.write_all(b"before").unwrap();
    fs::remove_file(fs.p("gone")).unwrap();
    f.write_all(b" after").unwrap();
    let mut s = String::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "before after");
    assert_eq!(f.metadata().unwrap().nlink(), 0);
}

#[test]
fn removing_a_large_files_last_name_frees_its_data_unless_it_is_open() {
    let fs = TestFs::new();
    let data = Rng(7).bytes(3 << 20);
    for name in ["freed", "replaced", "kept", "linked"] {
        fs::write(fs.p(name), &data).unwrap();
    }
    fs::write(fs.p("new"), b"new").unwrap();
    fs::hard_link(fs.p("linked"), fs.p("linked2")).unwrap();
    let key = |name: &str| {
        let m = fs::metadata(fs.backing(name)).unwrap();
        (m.dev(), m.ino())
    };
    let gone = [key("freed"), key("replaced")];
    // O_PATH descriptors pin the kernel's inodes (so the daemon keeps its nodes) without
    // opening the files.
    let pinned: Vec<File> = ["freed", "replaced"]
        .iter()
        .map(|name| {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH)
                .open(fs.p(name))
                .unwrap()
        })
        .collect();
    let mut kept = File::open(fs.p("kept")).unwrap();
    for name in ["freed", "kept", "linked"] {
        fs::remove_file(fs.p(name)).unwrap();
    }
    fs::rename(fs.p("new"), fs.p("replaced")).unwrap();
    // The daemon runs in this process: its descriptors of the backing files (kept, since the
    // kernel still knows the nodes) show the data gone. The view's size is the kernel's own
    // (writeback cache), so it cannot tell.
    for key in gone {
        let sizes: Vec<u64> = fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter_map(|e| fs::metadata(e.path()).ok())
            .filter(|m| (m.dev(), m.ino()) == key)
            .map(|m| m.len())
            .collect();
        assert!(
            !sizes.is_empty() && sizes.iter().all(|&n| n == 0),
            "{key:?}: {sizes:?}"
        );
    }
    drop(pinned);
    assert_eq!(fs::read(fs.p("replaced")).unwrap(), b"new");
    let mut back = Vec::new();
    kept.read_to_end(&mut back).unwrap();
    assert!(back == data, "an open file keeps its data");
    assert!(
        fs::read(fs.p("linked2")).unwrap() == data,
        "another name keeps the data"
    );
}

#[test]
fn rename_file_within_and_across_directories() {
    let fs = TestFs::new();
    fs::create_dir(fs.p("a")).unwrap();
    fs::create_dir(fs.p("b")).unwrap();
    fs::write(fs.p("a/f"), b"content").unwrap();
    fs::rename(fs.p("a/f"), fs.p("a/g")).unwrap();
    assert_eq!(names(&fs.p("a")), vec!["g"]);
    fs::rename(fs.p("a/g"), fs.p("b/h")).unwrap();
    assert!(names(&fs.p("a")).is_empty());
    assert_eq!(fs::read(fs.p("b/h")).unwrap(), b"content");
    // Overwriting an existing target.
    fs::write(fs.p("b/x"), b"old").unwrap();
    fs::rename(fs.p("b/h"), fs.p("b/x")).unwrap();
    assert_eq!(fs::read(fs.p("b/x")).unwrap(), b"content");
    assert_eq!(names(&fs.p("b")), vec!["x"]);
}

#[test]
fn rename_directory_with_contents_across_directories() {
    let mut fs = TestFs::new();
    fs::create_dir_all(fs.p("src/tree/sub")).unwrap();
    fs::write(fs.p("src/tree/sub/file"), b"deep").unwrap();
    fs::create_dir(fs.p("dst")).unwrap();
    fs::rename(fs.p("src/tree"), fs.p("dst/moved")).unwrap();
    assert_eq!(fs::read(fs.p("dst/moved/sub/file")).unwrap(), b"deep");
    assert!(!fs.p("src/tree").exists());
    fs.remount();
    assert_eq!(fs::read(fs.p("dst/moved/sub/file")).unwrap(), b"deep");
    assert_eq!(names(&fs.p("dst/moved")), vec!["sub"]);
}

#[test]
fn rename_directory_over_empty_directory() {
    let fs = TestFs::new();
    fs::create_dir(fs.p("src")).unwrap();
    fs::write(fs.p("src/f"), b"f").unwrap();
    fs::create_dir(fs.p("empty")).unwrap();
    fs::create_dir(fs.p("full")).unwrap();
    fs::write(fs.p("full/g"), b"g").unwrap();
    let e = fs::rename(fs.p("src"), fs.p("full")).unwrap_err();
    assert_eq!(errno(&e), libc::ENOTEMPTY);
    assert_eq!(fs::read(fs.p("full/g")).unwrap(), b"g");
    fs::rename(fs.p("src"), fs.p("empty")).unwrap();
    assert_eq!(fs::read(fs.p("empty/f")).unwrap(), b"f");
    assert_eq!(names(&fs.mnt), vec!["empty", "full"]);
    // The failed attempt left the full directory's ID in place.
    fs::write(fs.p("full/h"), b"h").unwrap();
    assert_eq!(names(&fs.p("full")), vec!["g", "h"]);
}

#[test]
fn rename_noreplace() {
    let fs = TestFs::new();
    fs::write(fs.p("a"), b"a").unwrap();
    fs::write(fs.p("b"), b"b").unwrap();
    let e = rename2(&fs.p("a"), &fs.p("b"), libc::RENAME_NOREPLACE).unwrap_err();
    assert_eq!(errno(&e), libc::EEXIST);
    assert_eq!(fs::read(fs.p("b")).unwrap(), b"b");
    rename2(&fs.p("a"), &fs.p("c"), libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(names(&fs.mnt), vec!["b", "c"]);
}

#[test]
fn rename_exchange() {
    let fs = TestFs::new();
    fs::create_dir(fs.p("d")).unwrap();
    fs::write(fs.p("file"), b"i am a file").unwrap();
    fs::write(fs.p("d/inner"), b"inner").unwrap();
    rename2(&fs.p("file"), &fs.p("d"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(fs.p("d")).unwrap(), b"i am a file");
    assert_eq!(fs::read(fs.p("file/inner")).unwrap(), b"inner");
    let e = rename2(&fs.p("file"), &fs.p("missing"), libc::RENAME_EXCHANGE).unwrap_err();
    assert_eq!(errno(&e), libc::ENOENT);
}

#[test]
fn hard_links_share_data_and_inode() {
    let mut fs = TestFs::new();
    fs::create_dir(fs.p("other")).unwrap();
    fs::write(fs.p("orig"), b"v1").unwrap();
    fs::hard_link(fs.p("orig"), fs.p("other/link")).unwrap();
    let a = fs::metadata(fs.p("orig")).unwrap();
    let b = fs::metadata(fs.p("other/link")).unwrap();
    assert_eq!(a.ino(), b.ino());
    assert_eq!(a.nlink(), 2);
    fs::write(fs.p("other/link"), b"version two").unwrap();
    assert_eq!(fs::read(fs.p("orig")).unwrap(), b"version two");
    fs::remove_file(fs.p("orig")).unwrap();
    assert_eq!(fs::metadata(fs.p("other/link")).unwrap().nlink(), 1);
    fs.remount();
    assert_eq!(fs::read(fs.p("other/link")).unwrap(), b"version two");
    let e = fs::hard_link(fs.p("other"), fs.p("dirlink")).unwrap_err();
    assert_eq!(errno(&e), libc::EPERM);
}

#[test]
fn symlinks_store_encrypted_targets() {
    let mut fs = TestFs::new();
    fs::write(fs.p("target-file"), b"pointed at").unwrap();
    std::os::unix::fs::symlink("target-file", fs.p("link")).unwrap();
    std::os::unix::fs::symlink("/nowhere/at/all", fs.p("dangling")).unwrap();
    assert_eq!(
        fs::read_link(fs.p("link")).unwrap(),
        Path::new("target-file")
    );
    assert_eq!(fs::read(fs.p("link")).unwrap(), b"pointed at");
    let lm = fs::symlink_metadata(fs.p("dangling")).unwrap();
    assert!(lm.file_type().is_symlink());
    assert_eq!(lm.len(), "/nowhere/at/all".len() as u64);
    // A hard link to a symlink is a symlink too.
    fs::hard_link(fs.p("link"), fs.p("link2")).unwrap();
    assert_eq!(
        fs::read_link(fs.p("link2")).unwrap(),
        Path::new("target-file")
    );
    fs.unmount();
    let stored = fs::read_link(fs.backing("dangling")).unwrap();
    assert!(!stored.to_string_lossy().contains("nowhere"));
}

/// A path of exactly `len` bytes, relative, of `NAME_MAX`-byte components (the shape a POSIX
/// conformance suite uses for its PATH_MAX checks of symlink(2)).
fn path_of_len(len: usize) -> String {
    let mut p = String::new();
    let mut c = b'a';
    while p.len() < len {
        if !p.is_empty() {
            p.push('/');
        }
        let n = (len - p.len()).min(255);
        p.extend(std::iter::repeat_n(c as char, n));
        c += 1;
    }
    p
}

/// symlink(2) at its limits: a target of PATH_MAX - 1 bytes, and a link whose own path is
/// PATH_MAX - 1 bytes, both work, are read back whole and can be removed; one byte more in
/// either is ENAMETOOLONG.
#[test]
fn symlink_target_and_link_path_up_to_path_max() {
    let mut fs = TestFs::new();
    let dir = File::open(&fs.mnt).unwrap();
    let at = |target: &str, link: &str| {
        let (t, l) = (cpath(Path::new(target)), cpath(Path::new(link)));
        // SAFETY: valid C strings and a directory descriptor open for the call.
        check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), l.as_ptr()) })
    };
    let longest = path_of_len(4095);
    assert_eq!(longest.len(), 4095);
    let parent = &longest[..longest.rfind('/').unwrap()];
    fs::create_dir_all(fs.p(parent)).unwrap();

    at(&longest, "n0").unwrap();
    assert_eq!(fs::read_link(fs.p("n0")).unwrap().as_os_str().len(), 4095);
    assert_eq!(fs::read_link(fs.p("n0")).unwrap(), Path::new(&longest));
    assert_eq!(fs::symlink_metadata(fs.p("n0")).unwrap().len(), 4095);
    fs::remove_file(fs.p("n0")).unwrap();

    at("n0", &longest).unwrap();
    let mut buf = [0u8; 64];
    let l = cpath(Path::new(&longest));
    // SAFETY: as above; readlinkat writes at most the buffer's length.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            l.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert_eq!(&buf[..n as usize], b"n0");
    // SAFETY: as above.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), l.as_ptr(), 0) }).unwrap();

    let too_long = format!("{longest}x");
    assert_eq!(errno(&at("n0", &too_long).unwrap_err()), libc::ENAMETOOLONG);
    assert_eq!(errno(&at(&too_long, "n0").unwrap_err()), libc::ENAMETOOLONG);

    // Kept across a remount, as a target stored apart.
    at(&longest, "kept").unwrap();
    drop(dir);
    fs.remount();
    assert_eq!(fs::read_link(fs.p("kept")).unwrap(), Path::new(&longest));
}

#[test]
fn fifo_and_unix_socket() {
    let fs = TestFs::new();
    let fifo = fs.p("fifo");
    let c = cpath(&fifo);
    // SAFETY: a valid C string path.
    check(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }).unwrap();
    assert!(fs::metadata(&fifo).unwrap().file_type().is_fifo());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || fs::read(fifo).unwrap())
    };
    fs::write(&fifo, b"through the pipe").unwrap();
    assert_eq!(reader.join().unwrap(), b"through the pipe");

    let sock = fs.p("sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    assert!(fs::metadata(&sock).unwrap().file_type().is_socket());
    let mut client = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    client.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    assert_eq!(names(&fs.mnt), vec!["fifo", "sock"]);
}

#[test]
fn device_nodes_as_root() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let fs = TestFs::new();
    let c = cpath(&fs.p("null"));
    let dev = libc::makedev(1, 3);
    // SAFETY: a valid C string path.
    check(unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, dev) }).unwrap();
    let m = fs::metadata(fs.p("null")).unwrap();
    assert!(m.file_type().is_char_device());
    assert_eq!(m.rdev(), dev);
    let c = cpath(&fs.p("blk"));
    let dev = libc::makedev(7, 0);
    // SAFETY: a valid C string path.
    check(unsafe { libc::mknod(c.as_ptr(), libc::S_IFBLK | 0o600, dev) }).unwrap();
    assert!(fs::metadata(fs.p("blk"))
        .unwrap()
        .file_type()
        .is_block_device());
}

#[test]
fn chmod_changes_mode() {
    let fs = TestFs::new();
    fs::write(fs.p("f"), b"x").unwrap();
    fs::set_permissions(fs.p("f"), fs::Permissions::from_mode(0o4751)).unwrap();
    assert_eq!(
        fs::metadata(fs.p("f")).unwrap().permissions().mode() & 0o7777,
        0o4751
    );
    fs::create_dir(fs.p("d")).unwrap();
    fs::set_permissions(fs.p("d"), fs::Permissions::from_mode(0o1700)).unwrap();
    assert_eq!(
        fs::metadata(fs.p("d")).unwrap().permissions().mode() & 0o7777,
        0o1700
    );
    assert_eq!(
        fs::metadata(fs.backing("f")).unwrap().permissions().mode() & 0o7777,
        0o4751
    );
}

#[test]
fn chown_changes_owner_as_root() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let fs = TestFs::new();
    fs::write(fs.p("f"), b"x").unwrap();
    std::os::unix::fs::chown(fs.p("f"), Some(1234), Some(4321)).unwrap();
    let m = fs::metadata(fs.p("f")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1234, 4321));
    std::os::unix::fs::symlink("f", fs.p("l")).unwrap();
    std::os::unix::fs::lchown(fs.p("l"), Some(55), None).unwrap();
    assert_eq!(fs::symlink_metadata(fs.p("l")).unwrap().uid(), 55);
    assert_eq!(fs::metadata(fs.p("f")).unwrap().uid(), 1234);
}

fn set_times(p: &Path, atime: libc::timespec, mtime: libc::timespec, flags: i32) {
    let c = cpath(p);
    let ts = [atime, mtime];
    // SAFETY: a valid C string path and a two-element timespec array.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), flags) }).unwrap();
}

fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

#[test]
fn utimens_sets_omits_and_nows() {
    let fs = TestFs::new();
    fs::write(fs.p("f"), b"x").unwrap();
    set_times(&fs.p("f"), ts(1_000_000_000, 5), ts(1_100_000_000, 7), 0);
    let m = fs::metadata(fs.p("f")).unwrap();
    assert_eq!((m.atime(), m.atime_nsec()), (1_000_000_000, 5));
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_100_000_000, 7));
    set_times(&fs.p("f"), ts(0, libc::UTIME_OMIT), ts(1_200_000_000, 0), 0);
    let m = fs::metadata(fs.p("f")).unwrap();
    assert_eq!(m.atime(), 1_000_000_000);
    assert_eq!(m.mtime(), 1_200_000_000);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    set_times(
        &fs.p("f"),
        ts(0, libc::UTIME_OMIT),
        ts(0, libc::UTIME_NOW),
        0,
    );
    assert!(fs::metadata(fs.p("f")).unwrap().mtime() >= before - 1);
    // Pre-1970 times survive too.
    set_times(&fs.p("f"), ts(-86_400, 0), ts(0, libc::UTIME_OMIT), 0);
    assert_eq!(fs::metadata(fs.p("f")).unwrap().atime(), -86_400);
}

/// `touch -m` opens the file and sets only the mtime: opening must not count as a read and
/// move the access time (the backing file system's relatime would do so on any read).
#[test]
fn opening_and_setting_mtime_keeps_atime() {
    let fs = TestFs::new();
    fs::write(fs.p("f"), b"some content").unwrap();
    set_times(&fs.p("f"), ts(1_000_000_000, 0), ts(1_100_000_000, 0), 0);
    let f = OpenOptions::new().write(true).open(fs.p("f")).unwrap();
    let times = [ts(0, libc::UTIME_OMIT), ts(1_200_000_000, 0)];
    // SAFETY: futimens on an open descriptor with a valid two-element array.
    check(unsafe { libc::futimens(f.as_raw_fd(), times.as_ptr()) }).unwrap();
    drop(f);
    let m = fs::metadata(fs.p("f")).unwrap();
    assert_eq!(m.mtime(), 1_200_000_000);
    assert_eq!(m.atime(), 1_000_000_000, "atime moved by open");
}

#[test]
fn utimens_on_symlink_itself() {
    let fs = TestFs::new();
    fs::write(fs.p("f"), b"x").unwrap();
    set_times(&fs.p("f"), ts(1_000_000_000, 0), ts(1_000_000_000, 0), 0);
    std::os::unix::fs::symlink("f", fs.p("l")).unwrap();
    set_times(
        &fs.p("l"),
        ts(1_300_000_000, 0),
        ts(1_300_000_000, 0),
        libc::AT_SYMLINK_NOFOLLOW,
    );
    assert_eq!(
        fs::symlink_metadata(fs.p("l")).unwrap().mtime(),
        1_300_000_000
    );
    assert_eq!(fs::metadata(fs.p("f")).unwrap().mtime(), 1_000_000_000);
}

#[test]
fn statfs_reports_backing_space_and_name_limit() {
    let fs = TestFs::new();
    let c = cpath(&fs.mnt);
    // SAFETY: statvfs fills the zeroed struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string path and a valid out pointer.
    check(unsafe { libc::statvfs(c.as_ptr(), &mut st) }).unwrap();
    assert_eq!(st.f_namemax, 255);
    assert!(st.f_blocks > 0 && st.f_bsize > 0);
    assert!(st.f_bavail <= st.f_blocks);
}

#[test]
fn access_checks() {
    let fs = TestFs::new();
    fs::write(fs.p("f"), b"x").unwrap();
    let c = cpath(&fs.p("f"));
    // SAFETY: valid C string paths.
    unsafe {
        check(libc::access(c.as_ptr(), libc::R_OK | libc::W_OK)).unwrap();
        let e = check(libc::access(c.as_ptr(), libc::X_OK)).unwrap_err();
        assert_eq!(errno(&e), libc::EACCES);
        let missing = cpath(&fs.p("missing"));
        let e = check(libc::access(missing.as_ptr(), libc::F_OK)).unwrap_err();
        assert_eq!(errno(&e), libc::ENOENT);
    }
}

#[test]
fn user_xattrs_are_encrypted() {
    let mut fs = TestFs::new();
    fs::write(fs.p("f"), b"x").unwrap();
    fs::create_dir(fs.p("d")).unwrap();
    setxattr(&fs.p("f"), "user.colour", b"blue", 0).unwrap();
    setxattr(&fs.p("d"), "user.size", b"large", 0).unwrap();
    assert_eq!(getxattr(&fs.p("f"), "user.colour", true).unwrap(), b"blue");
    assert_eq!(
        listxattr(&fs.p("f")).unwrap(),
        vec![b"user.colour".to_vec()]
    );
    let e = setxattr(&fs.p("f"), "user.colour", b"red", libc::XATTR_CREATE).unwrap_err();
    assert_eq!(errno(&e), libc::EEXIST);
    let e = getxattr(&fs.p("f"), "user.missing", true).unwrap_err();
    assert_eq!(errno(&e), libc::ENODATA);
    fs.remount();
    assert_eq!(getxattr(&fs.p("d"), "user.size", true).unwrap(), b"large");
    let backing_names = listxattr(&fs.backing("f")).unwrap();
    assert_eq!(backing_names.len(), 1);
    assert!(!String::from_utf8_lossy(&backing_names[0]).contains("colour"));
    let raw = getxattr(
        &fs.backing("f"),
        std::str::from_utf8(&backing_names[0]).unwrap(),
        false,
    )
    .unwrap();
    assert!(!raw.windows(4).any(|w| w == b"blue"));
    removexattr(&fs.p("f"), "user.colour").unwrap();
    assert!(listxattr(&fs.p("f")).unwrap().is_empty());
}

/// The `open(2)` flags of this process's descriptors of `backing` (the server runs in the
/// test process, so its node descriptors are among them).
fn held_flags(backing: &Path) -> Vec<i32> {
    let mut flags = Vec::new();
    for e in fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if fs::read_link(e.path()).ok().as_deref() != Some(backing) {
            continue;
        }
        let info = fs::read_to_string(Path::new("/proc/self/fdinfo").join(e.file_name()));
        let Ok(info) = info else { continue };
        let line = info.lines().find_map(|l| l.strip_prefix("flags:")).unwrap();
        flags.push(i32::from_str_radix(line.trim(), 8).unwrap());
    }
    flags
}

#[test]
fn listed_nodes_are_held_readable_and_serve_xattrs() {
    let mut fs = TestFs::new();
    if !matches!(
        Command::new("stat").args(["-f", "-c", "%T"]).arg(&fs.cipher).output(),
        Ok(o) if matches!(String::from_utf8_lossy(&o.stdout).trim(), "ext2/ext3" | "tmpfs" | "xfs" | "btrfs")
    ) {
        eprintln!("skipped: the backing file system is not one where nodes are held readable");
        return;
    }
    fs::write(fs.p("run.sh"), b"#!/bin/sh\necho ran\n").unwrap();
    fs::set_permissions(fs.p("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    // Held since its creation, read-only: a writable hold would refuse exec (ETXTBSY).
    let out = Command::new(fs.p("run.sh")).output().unwrap();
    assert_eq!(out.stdout, b"ran\n", "{out:?}");
    fs::create_dir(fs.p("d")).unwrap();
    // SAFETY: a valid C string path.
    check(unsafe { libc::mkfifo(cpath(&fs.p("p")).as_ptr(), 0o644) }).unwrap();
    setxattr(&fs.p("run.sh"), "user.colour", b"blue", 0).unwrap();
    setxattr(&fs.p("d"), "user.size", b"large", 0).unwrap();
    fs.remount();

    // A listing looks every entry up (readdirplus) with the listing's file type.
    assert_eq!(names(&fs.mnt), ["d", "p", "run.sh"]);
    for (name, readable) in [("run.sh", true), ("d", true), ("p", false)] {
        let held = held_flags(&fs.backing(name));
        assert_eq!(held.len(), 1, "{name}: {held:?}");
        let path = held[0] & libc::O_PATH != 0;
        assert_eq!(!path, readable, "{name}: flags {:o}", held[0]);
        assert_eq!(held[0] & libc::O_ACCMODE, libc::O_RDONLY, "{name}");
    }
    assert_eq!(
        getxattr(&fs.p("run.sh"), "user.colour", true).unwrap(),
        b"blue"
    );
    assert_eq!(listxattr(&fs.p("d")).unwrap(), vec![b"user.size".to_vec()]);
    setxattr(&fs.p("d"), "user.shape", b"round", 0).unwrap();
    removexattr(&fs.p("d"), "user.size").unwrap();
    assert_eq!(listxattr(&fs.p("d")).unwrap(), vec![b"user.shape".to_vec()]);
    let e = getxattr(&fs.p("p"), "user.colour", true).unwrap_err();
    assert_eq!(errno(&e), libc::ENODATA);
    let e = getxattr(&fs.p("run.sh"), "system.posix_acl_access", true).unwrap_err();
    assert_eq!(errno(&e), libc::ENODATA);
    fs.remount();
    assert_eq!(getxattr(&fs.p("d"), "user.shape", true).unwrap(), b"round");
}

#[test]
fn posix_acl_xattr_passes_through() {
    let fs = TestFs::new();
    fs::write(fs.p("f"), b"x").unwrap();
    // version 2; USER_OBJ rw-, USER 1000 r--, GROUP_OBJ r--, MASK r--, OTHER --- (a named
    // user, so the backing file system must keep it as an xattr, not just as mode bits)
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 4, 1000),
        (0x04, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&id.to_le_bytes());
    }
    setxattr(&fs.p("f"), "system.posix_acl_access", &acl, 0).unwrap();
    assert_eq!(
        fs::metadata(fs.p("f")).unwrap().permissions().mode() & 0o777,
        0o640
    );
    let backing = getxattr(&fs.backing("f"), "system.posix_acl_access", false).unwrap();
    assert_eq!(backing, acl);
    assert_eq!(
        getxattr(&fs.p("f"), "system.posix_acl_access", true).unwrap(),
        acl
    );
}

#[test]
fn security_labels_are_refused_and_capabilities_pass_through() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let fs = TestFs::new();
    fs::write(fs.p("f"), b"x").unwrap();
    // A label on the backing file is the ciphertext's: neither shown nor settable.
    setxattr(&fs.backing("f"), "security.selinux", b"label\0", 0).unwrap();
    let e = getxattr(&fs.p("f"), "security.selinux", true).unwrap_err();
    assert_eq!(errno(&e), libc::EOPNOTSUPP);
    let e = setxattr(&fs.p("f"), "security.SMACK64", b"x", 0).unwrap_err();
    assert_eq!(errno(&e), libc::EOPNOTSUPP);
    // File capabilities are the kernel's to use on exec.
    let caps = net_raw_capability();
    setxattr(&fs.p("f"), "security.capability", &caps, 0).unwrap();
    assert_eq!(
        getxattr(&fs.p("f"), "security.capability", true).unwrap(),
        caps
    );
    assert_eq!(
        getxattr(&fs.backing("f"), "security.capability", false).unwrap(),
        caps
    );
    let names = listxattr(&fs.p("f")).unwrap();
    assert_eq!(names, vec![b"security.capability".to_vec()]);
}

/// A `security.capability` value (v2: CAP_NET_RAW permitted).
fn net_raw_capability() -> Vec<u8> {
    let mut caps = 0x0200_0000u32.to_le_bytes().to_vec();
    for word in [1u32 << 13, 0, 0, 0] {
        caps.extend_from_slice(&word.to_le_bytes());
    }
    caps
}

/// The kernel asks for `security.capability` before the first write after a CREATE; the
/// daemon answers it for a file the CREATE made from what it knows, until the creating handle
/// closes. What is set through the mount shows at once, what is set on the backing file
/// directly after that close, and a file that existed (a CREATE under a stale negative
/// entry) is asked of the backing file.
#[test]
fn a_new_files_capability_is_known_absent_while_its_creator_has_it_open() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    const CAP: &str = "security.capability";
    let absent = |p: &Path| errno(&getxattr(p, CAP, true).unwrap_err()) == libc::ENODATA;
    let fs = TestFs::new();
    let caps = net_raw_capability();

    let mut f = File::create(fs.p("f")).unwrap();
    f.write_all(b"data").unwrap();
    assert!(absent(&fs.p("f")));
    setxattr(&fs.p("f"), CAP, &caps, 0).unwrap();
    assert_eq!(getxattr(&fs.p("f"), CAP, true).unwrap(), caps);
    removexattr(&fs.p("f"), CAP).unwrap();
    assert!(absent(&fs.p("f")));
    drop(f);

    let g = File::create(fs.p("g")).unwrap();
    setxattr(&fs.backing("g"), CAP, &caps, 0).unwrap();
    drop(g);
    wait_released(&fs.backing("g"));
    assert_eq!(getxattr(&fs.p("g"), CAP, true).unwrap(), caps);

    // "h" is looked up (the kernel keeps the negative entry), then made in the cipher
    // directory behind the mount's back, with a capability: the open that creates it through
    // the mount opens the existing file instead, contents and capability included.
    fs::write(fs.p("src"), b"old").unwrap();
    assert!(!fs.p("h").exists());
    fs::copy(fs.backing("src"), fs.backing("h")).unwrap();
    setxattr(&fs.backing("h"), CAP, &caps, 0).unwrap();
    let mut h = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(fs.p("h"))
        .unwrap();
    let mut text = String::new();
    h.read_to_string(&mut text).unwrap();
    assert_eq!(text, "old");
    assert_eq!(getxattr(&fs.p("h"), CAP, true).unwrap(), caps);
    drop(h);
    assert!(!fs.p("i").exists());
    fs::copy(fs.backing("src"), fs.backing("i")).unwrap();
    let e = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(fs.p("i"))
        .unwrap_err();
    assert_eq!(errno(&e), libc::EEXIST);
}

/// An append to a file with a capability drops it, as any write does: an appending handle
/// alone on its file writes around the page cache (the kernel does not ask for the capability
/// then, the backing write drops it), one opened beside a cached handle through the cache
/// (the kernel asks, and removes it through the mount). Both append at the end.
#[test]
fn an_append_drops_a_files_capability_cached_or_not() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    const CAP: &str = "security.capability";
    let fs = TestFs::new();
    let caps = net_raw_capability();
    for (name, beside) in [("alone", false), ("beside", true)] {
        fs::write(fs.p(name), b"one\n").unwrap();
        setxattr(&fs.p(name), CAP, &caps, 0).unwrap();
        let reader = beside.then(|| File::open(fs.p(name)).unwrap());
        let mut f = OpenOptions::new().append(true).open(fs.p(name)).unwrap();
        f.write_all(b"two\n").unwrap();
        drop(f);
        drop(reader);
        let e = getxattr(&fs.p(name), CAP, true).unwrap_err();
        assert_eq!(errno(&e), libc::ENODATA, "{name}");
        assert_eq!(fs::read(fs.p(name)).unwrap(), b"one\ntwo\n", "{name}");
    }
}

/// Bytes written through a shared mapping reach the file, and survive a remount. The mapping
/// is made in a process of its own ([`in_own_process`]).
#[test]
fn mmap_shared_writable() {
    const LEN: usize = 3 * 4096 + 100;
    if let Some(dir) = own_process_dir() {
        return write_through_a_mapping(&dir.join("m"), LEN);
    }
    let mut fs = TestFs::new();
    fs::write(fs.p("m"), vec![b'a'; LEN]).unwrap();
    in_own_process("mmap_shared_writable", &fs.mnt);
    let check_content = |got: Vec<u8>| {
        assert_eq!(got.len(), LEN);
        assert_eq!(got[0], b'X');
        assert_eq!(got[4096 + 7], b'Y');
        assert_eq!(got[LEN - 1], b'Z');
        assert_eq!(got.iter().filter(|&&b| b == b'a').count(), LEN - 3);
    };
    check_content(fs::read(fs.p("m")).unwrap());
    fs.remount();
    check_content(fs::read(fs.p("m")).unwrap());
}

/// Where [`mmap_shared_writable`] maps `path` (`len` bytes of `a`) and writes three bytes.
fn write_through_a_mapping(path: &Path, len: usize) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let p = map_shared(&f, len, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: a shared mapping of an open file of `len` bytes, written within bounds and
    // unmapped before the file is closed.
    unsafe {
        let s = std::slice::from_raw_parts_mut(p, len);
        assert_eq!(s[5000], b'a');
        s[0] = b'X';
        s[4096 + 7] = b'Y';
        s[len - 1] = b'Z';
        check(libc::msync(p.cast(), len, libc::MS_SYNC)).unwrap();
        check(libc::munmap(p.cast(), len)).unwrap();
    }
}

/// A new file's writes through its handle and a shared mapping of it stay coherent, as on
/// ext4 (xfstests generic/346, `holetest -w`): one thread writes 8 bytes into each page with
/// pwrite while another writes into the same pages through the mapping, in a file just
/// created and grown by ftruncate or posix_fallocate. When a new file's handle bypassed the
/// page cache, a page the mapping faulted in or dirtied while a direct write was under way
/// kept the old bytes and went back over the written ones: 1 to 3 of 12 runs of holetest
/// lost a write. A new file's writes go through the cache.
#[test]
fn a_new_files_writes_and_a_shared_mapping_of_it_stay_coherent() {
    if let Some(dir) = own_process_dir() {
        return mapped_writers(&dir);
    }
    let fs = TestFs::new();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(fs.p("new"))
        .unwrap();
    f.write_all_at(&[1; 8192], 0).unwrap();
    assert!(
        page_cached(&f, 1),
        "a new file's write bypassed the page cache"
    );
    drop(f);
    in_own_process(
        "a_new_files_writes_and_a_shared_mapping_of_it_stay_coherent",
        &fs.mnt,
    );
}

/// `holetest -w` in `dir`: 24 rounds of a new 4 MiB file, grown by ftruncate or
/// posix_fallocate, written by pwrite and through a shared mapping at once.
fn mapped_writers(dir: &Path) {
    const PAGE: usize = 4096;
    const PAGES: usize = 1024;
    let mut lost = Vec::new();
    for round in 0..24u64 {
        let p = dir.join("mapped");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
            .unwrap();
        let len = PAGES * PAGE;
        if round % 2 == 0 {
            f.set_len(len as u64).unwrap();
        } else {
            // SAFETY: an open descriptor and a range within i64.
            let r = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, len as i64) };
            assert_eq!(
                r,
                0,
                "posix_fallocate: {}",
                std::io::Error::from_raw_os_error(r)
            );
        }
        let m = map_shared(&f, len, libc::PROT_READ | libc::PROT_WRITE) as usize;
        let (by_write, by_map) = (round * 2 + 1, round * 2 + 2);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..PAGES {
                    f.write_all_at(&by_write.to_ne_bytes(), (i * PAGE + 1024) as u64)
                        .unwrap();
                }
            });
            s.spawn(|| {
                for i in 0..PAGES {
                    // SAFETY: within the mapping of `len` bytes, which outlives this scope;
                    // this thread alone writes these 8 bytes.
                    unsafe {
                        ((m + i * PAGE + 3072) as *mut u64).write_unaligned(by_map);
                    }
                }
            });
        });
        for i in 0..PAGES {
            // SAFETY: within the mapping; both writers have finished.
            let (w, v) = unsafe {
                (
                    ((m + i * PAGE + 1024) as *const u64).read_unaligned(),
                    ((m + i * PAGE + 3072) as *const u64).read_unaligned(),
                )
            };
            if (w, v) != (by_write, by_map) {
                lost.push((round, i, w, v));
            }
        }
        // SAFETY: the mapping made above, no longer used.
        check(unsafe { libc::munmap(m as *mut libc::c_void, len) }).unwrap();
        drop(f);
        fs::remove_file(&p).unwrap();
    }
    assert!(
        lost.is_empty(),
        "writes lost (round, page, pwrite's, the mapping's): {lost:?}"
    );
}

/// Whether page `index` of `f` is in the page cache (`mincore` of a mapping that touches
/// nothing).
fn page_cached(f: &File, index: usize) -> bool {
    let len = (index + 1) * 4096;
    let mut vec = vec![0u8; index + 1];
    let m = map_shared(f, len, libc::PROT_READ);
    // SAFETY: a mapping of `len` bytes, never accessed, queried with a vector of one byte
    // per page, and unmapped.
    unsafe {
        check(libc::mincore(m.cast(), len, vec.as_mut_ptr())).unwrap();
        check(libc::munmap(m.cast(), len)).unwrap();
    }
    vec[index] & 1 == 1
}

#[test]
fn o_direct_is_accepted() {
    let fs = TestFs::new();
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(fs.p("direct"))
        .unwrap();
    let data = pattern(10_000, 4);
    f.write_all_at(&data, 3).unwrap();
    let mut got = vec![0u8; 10_000];
    f.read_exact_at(&mut got, 3).unwrap();
    assert_eq!(got, data);
    drop(f);
    let all = fs::read(fs.p("direct")).unwrap();
    assert_eq!(&all[3..], &data[..]);
}

/// Linux AIO as libaio (and fio's libaio engine) drives it: one context, requests submitted
/// with io_submit and reaped with io_getevents (no such calls in the libc crate).
struct Aio(libc::c_ulong);

/// The kernel's `struct iocb` (linux/aio_abi.h, little-endian layout).
#[repr(C)]
#[derive(Default)]
struct Iocb {
    data: u64,
    key: u32,
    rw_flags: i32,
    opcode: u16,
    reqprio: i16,
    fildes: u32,
    buf: u64,
    nbytes: u64,
    offset: i64,
    reserved2: u64,
    flags: u32,
    resfd: u32,
}

/// The kernel's `struct io_event`.
#[repr(C)]
#[derive(Default)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

impl Aio {
    fn new() -> Aio {
        let mut ctx: libc::c_ulong = 0;
        // SAFETY: io_setup writes the new context's id to `ctx`, which outlives the call.
        let rc = unsafe { libc::syscall(libc::SYS_io_setup, 1 as libc::c_long, &mut ctx) };
        assert_eq!(rc, 0, "io_setup: {}", std::io::Error::last_os_error());
        Aio(ctx)
    }

    /// Writes `buf` at `offset` of `fd` as one asynchronous request (IOCB_CMD_PWRITE) and
    /// waits for its completion; returns the bytes written.
    fn pwrite(&self, fd: std::os::fd::RawFd, buf: &[u8], offset: i64) -> std::io::Result<usize> {
        let mut cb = Iocb {
            opcode: 1,
            fildes: fd as u32,
            buf: buf.as_ptr() as u64,
            nbytes: buf.len() as u64,
            offset,
            ..Iocb::default()
        };
        let mut list = [&mut cb as *mut Iocb];
        // SAFETY: `cb` and `buf` outlive the request: it is reaped below before they go.
        let n = unsafe {
            libc::syscall(
                libc::SYS_io_submit,
                self.0,
                1 as libc::c_long,
                list.as_mut_ptr(),
            )
        };
        if n != 1 {
            return Err(std::io::Error::last_os_error());
        }
        let mut ev = IoEvent::default();
        // SAFETY: room for the one event asked for; no timeout.
        let n = unsafe {
            libc::syscall(
                libc::SYS_io_getevents,
                self.0,
                1 as libc::c_long,
                1 as libc::c_long,
                &mut ev,
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
        if n != 1 {
            return Err(std::io::Error::last_os_error());
        }
        if ev.res < 0 {
            return Err(std::io::Error::from_raw_os_error(-ev.res as i32));
        }
        Ok(ev.res as usize)
    }
}

impl Drop for Aio {
    fn drop(&mut self) {
        // SAFETY: destroys this context, which has no request in flight.
        unsafe { libc::syscall(libc::SYS_io_destroy, self.0) };
    }
}

/// xfstests generic/451's pattern on file `path` in `dir`: a file of `len` bytes rewritten
/// `rounds` times over its whole length, with a byte alternating between rounds, each time
/// by one AIO write through an O_DIRECT descriptor, while two threads read it through the
/// page cache (open, pread, close) without pause. After each completion a buffered read must
/// show the new bytes. Returns the first round that showed other bytes, with the byte seen.
fn stale_round_after_aio_direct_writes(
    path: &Path,
    len: usize,
    rounds: usize,
) -> Option<(usize, u8)> {
    use std::sync::atomic::{AtomicBool, Ordering};
    // O_DIRECT on ext4 wants the buffer aligned to the block size.
    let storage = vec![0u8; len + 4096];
    let start = storage.as_ptr().align_offset(4096);
    let mut storage = storage;
    let buf = &mut storage[start..start + len];
    buf.fill(0x55);
    fs::write(path, &buf[..]).unwrap();
    File::open(path).unwrap().sync_all().unwrap();
    let aio = Aio::new();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                let mut seen = vec![0u8; len];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(f) = File::open(path) {
                        let _ = f.read_exact_at(&mut seen, 0);
                    }
                }
            });
        }
        let mut stale = None;
        let mut back = vec![0u8; len];
        for round in 0..rounds {
            let byte = if round % 2 == 0 { 0xaa } else { 0x55 };
            buf.fill(byte);
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .unwrap();
            assert_eq!(aio.pwrite(f.as_raw_fd(), buf, 0).unwrap(), len);
            drop(f);
            File::open(path)
                .unwrap()
                .read_exact_at(&mut back, 0)
                .unwrap();
            if let Some(other) = back.iter().find(|&&b| b != byte) {
                stale = Some((round, *other));
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        stale
    })
}

#[test]
fn a_buffered_read_after_an_aio_direct_write_sees_the_new_data() {
    // xfstests generic/451: buffered readers racing AIO O_DIRECT writes must not leave the
    // old bytes in the page cache once the write has completed. On ext4 first (the plain
    // directory beside the cipher directory), then through the mount.
    let fs = TestFs::new();
    let plain = fs.tmp.path().join("plain");
    fs::create_dir(&plain).unwrap();
    const LEN: usize = 640 << 10;
    const ROUNDS: usize = 400;
    assert_eq!(
        stale_round_after_aio_direct_writes(&plain.join("f"), LEN, ROUNDS),
        None,
        "ext4"
    );
    assert_eq!(
        stale_round_after_aio_direct_writes(&fs.p("f"), LEN, ROUNDS),
        None,
        "cloakfs"
    );
}

#[test]
fn names_up_to_255_bytes() {
    let mut fs = TestFs::new();
    let long = "n".repeat(255);
    let long_utf8 = format!("{}x", "é".repeat(127)); // 255 bytes
    assert_eq!(long_utf8.len(), 255);
    fs::write(fs.p(&long), b"long name").unwrap();
    fs::create_dir(fs.p(&long_utf8)).unwrap();
    fs::write(fs.p(&format!("{long_utf8}/{long}")), b"nested").unwrap();
    let mut want = vec![long.clone(), long_utf8.clone()];
    want.sort();
    assert_eq!(names(&fs.mnt), want);
    let e = fs::write(fs.p(&"z".repeat(256)), b"").unwrap_err();
    assert_eq!(errno(&e), libc::ENAMETOOLONG);
    // Long to long, long to short and back, hard link: sidecars follow the names.
    let long2 = "m".repeat(200);
    fs::rename(fs.p(&long), fs.p(&long2)).unwrap();
    fs::hard_link(fs.p(&long2), fs.p("short")).unwrap();
    fs::rename(fs.p("short"), fs.p(&"s".repeat(240))).unwrap();
    fs.remount();
    assert_eq!(fs::read(fs.p(&long2)).unwrap(), b"long name");
    assert_eq!(fs::read(fs.p(&"s".repeat(240))).unwrap(), b"long name");
    assert_eq!(
        fs::read(fs.p(&format!("{long_utf8}/{long}"))).unwrap(),
        b"nested"
    );
    fs::remove_file(fs.p(&long2)).unwrap();
    fs::remove_file(fs.p(&"s".repeat(240))).unwrap();
    fs::remove_file(fs.p(&format!("{long_utf8}/{long}"))).unwrap();
    fs::remove_dir(fs.p(&long_utf8)).unwrap();
    // Nothing left behind: no long-name entries, no sidecars.
    let left: Vec<String> = names(&fs.cipher)
        .into_iter()
        .filter(|n| n != "cloakfs.conf")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn deep_tree_beyond_backing_path_max() {
    let fs = TestFs::new();
    // 150 levels: the backing path (about 25 bytes per level) exceeds PATH_MAX, which
    // fd-relative calls never see.
    let mut rel = String::new();
    for i in 0..150 {
        if i > 0 {
            rel.push('/');
        }
        rel.push_str("dd");
        fs::create_dir(fs.p(&rel)).unwrap();
    }
    fs::write(fs.p(&format!("{rel}/leaf")), b"bottom").unwrap();
    assert_eq!(fs::read(fs.p(&format!("{rel}/leaf"))).unwrap(), b"bottom");
    fs::rename(fs.p("dd"), fs.p("top")).unwrap();
    let moved = format!("top{}/leaf", &rel[2..]);
    assert_eq!(fs::read(fs.p(&moved)).unwrap(), b"bottom");
    fs::remove_dir_all(fs.p("top")).unwrap();
    assert!(names(&fs.mnt).is_empty());
}

#[test]
fn readdir_lists_dot_entries_and_every_name_once() {
    let fs = TestFs::new();
    fs::create_dir(fs.p("big")).unwrap();
    for i in 0..1500 {
        File::create(fs.p(&format!("big/file-{i:04}"))).unwrap();
    }
    let raw = raw_names(&fs.p("big"));
    assert_eq!(raw.len(), 1502);
    assert_eq!(raw[0], b".");
    assert_eq!(raw[1], b"..");
    // Changes during a listing: entries present throughout appear exactly once.
    let mut it = fs::read_dir(fs.p("big")).unwrap();
    let mut seen: Vec<String> = it
        .by_ref()
        .take(100)
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    for i in 0..50 {
        File::create(fs.p(&format!("big/new-{i}"))).unwrap();
    }
    seen.extend(it.map(|e| e.unwrap().file_name().into_string().unwrap()));
    for i in 0..1500 {
        let n = format!("file-{i:04}");
        assert_eq!(seen.iter().filter(|s| **s == n).count(), 1, "{n}");
    }
    assert_eq!(names(&fs.p("big")).len(), 1550);
}

#[test]
fn telldir_position_resumes_in_a_new_handle() {
    let mut fs = TestFs::new();
    for i in 0..400 {
        File::create(fs.p(&format!("e{i}"))).unwrap();
    }
    fs.remount();
    let c = cpath(&fs.mnt);
    let mut seen = Vec::new();
    // SAFETY: valid C string; DIR pointers are checked and closed; each dirent is read
    // before the next readdir call.
    unsafe {
        let read_one = |d: *mut libc::DIR| {
            let e = libc::readdir(d);
            (!e.is_null()).then(|| {
                std::ffi::CStr::from_ptr((*e).d_name.as_ptr())
                    .to_string_lossy()
                    .into_owned()
            })
        };
        let d = libc::opendir(c.as_ptr());
        assert!(!d.is_null());
        for _ in 0..150 {
            seen.push(read_one(d).unwrap());
        }
        let pos = libc::telldir(d);
        libc::closedir(d);
        let d = libc::opendir(c.as_ptr());
        assert!(!d.is_null());
        libc::seekdir(d, pos);
        while let Some(n) = read_one(d) {
            seen.push(n);
        }
        libc::closedir(d);
    }
    seen.sort();
    let mut want: Vec<String> = (0..400).map(|i| format!("e{i}")).collect();
    want.push(".".into());
    want.push("..".into());
    want.sort();
    assert_eq!(seen, want);
}

#[test]
fn listing_with_attributes_reports_plaintext_sizes() {
    let mut fs = TestFs::new();
    fs::create_dir(fs.p("d")).unwrap();
    for i in 0..300u64 {
        fs::write(fs.p(&format!("d/f{i}")), vec![1u8; (i * 37) as usize]).unwrap();
    }
    std::os::unix::fs::symlink("some/target", fs.p("d/link")).unwrap();
    fs::create_dir(fs.p("d/sub")).unwrap();
    fs.remount();
    // ls -l: list, then stat every entry (the kernel answers from readdirplus replies).
    let mut seen = 0;
    for e in fs::read_dir(fs.p("d")).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        let m = e.path().symlink_metadata().unwrap();
        match name.as_str() {
            "link" => assert_eq!(m.len(), "some/target".len() as u64),
            "sub" => assert!(m.is_dir()),
            f => {
                let i: u64 = f[1..].parse().unwrap();
                assert_eq!(m.len(), i * 37, "{f}");
            }
        }
        seen += 1;
    }
    assert_eq!(seen, 302);
    // Twice, so the second pass may come from the kernel's cache.
    assert_eq!(names(&fs.p("d")).len(), 302);
}

#[test]
fn flock_and_ofd_locks_conflict() {
    let fs = TestFs::new();
    fs::write(fs.p("lock"), b"x").unwrap();
    let a = File::open(fs.p("lock")).unwrap();
    let b = OpenOptions::new()
        .read(true)
        .write(true)
        .open(fs.p("lock"))
        .unwrap();
    // SAFETY: flock on open descriptors.
    unsafe {
        check(libc::flock(a.as_raw_fd(), libc::LOCK_EX)).unwrap();
        let e = check(libc::flock(b.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB)).unwrap_err();
        assert_eq!(errno(&e), libc::EWOULDBLOCK);
        check(libc::flock(a.as_raw_fd(), libc::LOCK_UN)).unwrap();
        check(libc::flock(b.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB)).unwrap();
    }
    let mut lk = libc::flock {
        l_type: libc::F_WRLCK as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 10,
        l_pid: 0,
    };
    // SAFETY: fcntl with a valid flock struct on open descriptors.
    unsafe {
        check(libc::fcntl(b.as_raw_fd(), libc::F_OFD_SETLK, &lk)).unwrap();
        lk.l_type = libc::F_RDLCK as i16;
        let e = check(libc::fcntl(a.as_raw_fd(), libc::F_OFD_SETLK, &lk)).unwrap_err();
        assert_eq!(errno(&e), libc::EAGAIN);
        check(libc::fcntl(a.as_raw_fd(), libc::F_OFD_GETLK, &mut lk)).unwrap();
        assert_eq!(lk.l_type, libc::F_WRLCK as i16);
    }
}

#[test]
fn read_only_mount_refuses_writes() {
    let mut fs = TestFs::new();
    fs::write(fs.p("f"), b"kept").unwrap();
    fs::create_dir(fs.p("d")).unwrap();
    fs.unmount();
    fs.opts.read_only = true;
    fs.mount();
    assert_eq!(fs::read(fs.p("f")).unwrap(), b"kept");
    for e in [
        fs::write(fs.p("new"), b"x").unwrap_err(),
        OpenOptions::new().write(true).open(fs.p("f")).unwrap_err(),
        fs::create_dir(fs.p("d2")).unwrap_err(),
        fs::remove_file(fs.p("f")).unwrap_err(),
        fs::rename(fs.p("f"), fs.p("g")).unwrap_err(),
        setxattr(&fs.p("f"), "user.a", b"b", 0).unwrap_err(),
    ] {
        assert_eq!(errno(&e), libc::EROFS);
    }
}

#[test]
fn new_objects_belong_to_their_creator_under_allow_other() {
    let Some(fs) = mount_for_other_users() else {
        return;
    };
    fs::create_dir(fs.p("pub")).unwrap();
    fs::set_permissions(fs.p("pub"), fs::Permissions::from_mode(0o777)).unwrap();
    assert!(sh_in_mount(
        &fs,
        "echo hi > pub/f && mkdir pub/d && ln -s f pub/l && mkfifo pub/p",
        Some(OTHER_USER)
    ));
    for name in ["pub/f", "pub/d", "pub/l", "pub/p"] {
        let m = fs::symlink_metadata(fs.p(name)).unwrap();
        assert_eq!((m.uid(), m.gid()), OTHER_USER, "{name}");
        let b = fs::symlink_metadata(fs.backing(name)).unwrap();
        assert_eq!((b.uid(), b.gid()), OTHER_USER, "backing of {name}");
    }
    assert_eq!(fs::read(fs.p("pub/f")).unwrap(), b"hi\n");
}

/// A user and group nobody on the test machine has, for the mounts other users may use.
const OTHER_USER: (u32, u32) = (4242, 4343);

/// A mount other users may use (allow_other, the kernel checking modes), its scratch directory
/// open to them; `None` (test skipped) without root.
fn mount_for_other_users() -> Option<TestFs> {
    if !is_root() {
        eprintln!("skipped: needs root");
        return None;
    }
    let fs = TestFs::with(|o| {
        o.allow_other = true;
        o.default_permissions = true;
    });
    fs::set_permissions(fs.tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    Some(fs)
}

/// Runs `script` with `sh -c` in the mount, as `user` (uid, gid) if given, else as ourselves;
/// whether it succeeded.
fn sh_in_mount(fs: &TestFs, script: &str, user: Option<(u32, u32)>) -> bool {
    use std::os::unix::process::CommandExt as _;
    let mut c = Command::new("sh");
    c.arg("-c").arg(script).current_dir(&fs.mnt);
    if let Some((uid, gid)) = user {
        c.uid(uid).gid(gid);
    }
    run(&mut c)
}

#[test]
fn writes_and_truncates_by_others_clear_setuid_and_setgid() {
    // The mount asks the kernel to leave clearing these to it (FUSE_HANDLE_KILLPRIV_V2), and a
    // root daemon holds CAP_FSETID, so the backing file system would keep them: cloakfs must
    // clear them as the kernel would for a caller without CAP_FSETID.
    let Some(fs) = mount_for_other_users() else {
        return;
    };
    for name in ["w", "t", "o", "g", "r"] {
        fs::write(fs.p(name), b"data").unwrap();
        std::os::unix::fs::chown(fs.p(name), Some(OTHER_USER.0), Some(OTHER_USER.1)).unwrap();
        let mode = if name == "g" { 0o6745 } else { 0o6755 };
        fs::set_permissions(fs.p(name), fs::Permissions::from_mode(mode)).unwrap();
    }
    assert!(sh_in_mount(
        &fs,
        "echo x >> w && truncate -s 1 t && : > o && echo x >> g",
        Some(OTHER_USER)
    ));
    // Root writes with CAP_FSETID: the bits stay.
    assert!(sh_in_mount(&fs, "echo x >> r", None));
    let mode = |name: &str| fs::metadata(fs.p(name)).unwrap().mode() & 0o7777;
    assert_eq!(mode("w"), 0o755, "written by the owner");
    assert_eq!(mode("t"), 0o755, "truncate(2)");
    assert_eq!(mode("o"), 0o755, "open with O_TRUNC");
    // Set-group-ID without group execute is no privilege (mandatory-lock mark): it stays.
    assert_eq!(mode("g"), 0o2745);
    assert_eq!(mode("r"), 0o6755, "written by root");
    for name in ["w", "t", "o"] {
        let b = fs::metadata(fs.backing(name)).unwrap().mode() & 0o7777;
        assert_eq!(b, 0o755, "backing of {name}");
    }
    assert_eq!(fs::read(fs.p("w")).unwrap(), b"datax\n");
    assert_eq!(fs::read(fs.p("t")).unwrap(), b"d");
    assert_eq!(fs::read(fs.p("o")).unwrap(), b"");
}

#[test]
fn fallocate_and_direct_writes_by_others_clear_setuid_and_show_it_at_once() {
    // xfstests generic/683-685 (fallocate, punch hole, zero range on a root-owned 4777 file by
    // another user) and 355 (an O_DIRECT write): ext4 clears the bits, and `stat` right after
    // must show it, not the mode the kernel cached (30 s here).
    let Some(fs) = mount_for_other_users() else {
        return;
    };
    let names = ["alloc", "punch", "zero", "direct"];
    for name in names {
        fs::write(fs.p(name), vec![1u8; 3 * 4096]).unwrap();
        fs::set_permissions(fs.p(name), fs::Permissions::from_mode(0o6777)).unwrap();
        // Cached now, with the bits.
        assert_eq!(fs::metadata(fs.p(name)).unwrap().mode() & 0o7777, 0o6777);
    }
    assert!(sh_in_mount(
        &fs,
        "fallocate -o 0 -l 65536 alloc && fallocate -p -o 4096 -l 4096 punch && \
         fallocate -z -o 0 -l 4096 zero && \
         dd if=/dev/zero of=direct bs=4096 count=1 oflag=direct conv=notrunc status=none",
        Some(OTHER_USER)
    ));
    for name in names {
        let shown = fs::metadata(fs.p(name)).unwrap().mode() & 0o7777;
        let stored = fs::metadata(fs.backing(name)).unwrap().mode() & 0o7777;
        assert_eq!(
            (shown, stored),
            (0o777, 0o777),
            "{name}: shown {shown:o}, stored {stored:o}"
        );
    }
    // Root (CAP_FSETID) keeps them, as on ext4.
    fs::set_permissions(fs.p("alloc"), fs::Permissions::from_mode(0o6777)).unwrap();
    assert!(sh_in_mount(&fs, "fallocate -p -o 0 -l 4096 alloc", None));
    assert_eq!(fs::metadata(fs.p("alloc")).unwrap().mode() & 0o7777, 0o6777);
}

#[test]
fn set_gid_without_group_execute_goes_when_the_writer_is_not_in_the_group() {
    // xfstests generic/683-685 (tests 1 and 3): another user's fallocate, punch hole, zero
    // range or write on a 6666 file of root's clears set-gid as well as set-uid, since that
    // user is not in the file's group; in the group, set-gid stays (ext4's
    // setattr_should_drop_sgid). In a plain directory on the backing ext4 first.
    let Some(fs) = mount_for_other_users() else {
        return;
    };
    let plain = fs.tmp.path().join("plain");
    fs::create_dir(&plain).unwrap();
    let all_ops = [
        ("alloc", "fallocate -o 0 -l 65536"),
        ("punch", "fallocate -p -o 4096 -l 4096"),
        ("zero", "fallocate -z -o 0 -l 4096"),
        (
            "direct",
            "dd if=/dev/zero bs=4096 count=1 oflag=direct conv=notrunc status=none of=",
        ),
        (
            "write",
            "dd if=/dev/zero bs=100 count=1 conv=notrunc status=none of=",
        ),
    ];
    // What the backing file system does at all (tmpfs: no zero range).
    let sep = |cmd: &str| if cmd.ends_with('=') { "" } else { " " };
    let ops: Vec<(&str, &str)> = all_ops
        .into_iter()
        .filter(|(_, cmd)| {
            fs::write(plain.join("probe"), vec![1u8; 3 * 4096]).unwrap();
            let done = run(Command::new("sh")
                .arg("-c")
                .arg(format!("{cmd}{}probe 2>/dev/null", sep(cmd)))
                .current_dir(&plain));
            fs::remove_file(plain.join("probe")).unwrap();
            done || {
                eprintln!("not on this backing file system: {cmd}");
                false
            }
        })
        .collect();
    let modes_after = |dir: &Path| -> Vec<(String, String)> {
        let mut script = String::new();
        for &(name, cmd) in &ops {
            for (file, group) in [(name.to_string(), 0), (format!("{name}.in"), OTHER_USER.1)] {
                let p = dir.join(&file);
                fs::write(&p, vec![1u8; 3 * 4096]).unwrap();
                std::os::unix::fs::chown(&p, Some(0), Some(group)).unwrap();
                fs::set_permissions(&p, fs::Permissions::from_mode(0o6666)).unwrap();
                // Cached now, with the bits.
                assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o6666);
                script.push_str(&format!("{cmd}{}{file} && ", sep(cmd)));
            }
        }
        script.push_str("true");
        let mut c = Command::new("sh");
        std::os::unix::process::CommandExt::uid(&mut c, OTHER_USER.0);
        std::os::unix::process::CommandExt::gid(&mut c, OTHER_USER.1);
        assert!(run(c.arg("-c").arg(&script).current_dir(dir)), "{script}");
        let mut modes = Vec::new();
        for &(name, _) in &ops {
            for file in [name.to_string(), format!("{name}.in")] {
                let mode = fs::metadata(dir.join(&file)).unwrap().mode() & 0o7777;
                modes.push((file, format!("{mode:o}")));
            }
        }
        modes
    };
    let on_ext4 = modes_after(&plain);
    for (file, mode) in &on_ext4 {
        let want = if file.ends_with(".in") { "2666" } else { "666" };
        assert_eq!(mode, want, "ext4: {file}");
    }
    assert_eq!(modes_after(&fs.mnt), on_ext4, "through the mount");
}

#[test]
fn a_direct_write_by_the_owner_clears_setuid_and_stat_shows_it_at_once() {
    // xfstests generic/355: the owner's O_DIRECT write clears set-user-ID always and
    // set-group-ID where the group may execute; `stat` right after shows the new mode.
    let Some(fs) = mount_for_other_users() else {
        return;
    };
    fs::write(fs.p("t"), b"this is a test\n").unwrap();
    std::os::unix::fs::chown(fs.p("t"), Some(OTHER_USER.0), Some(OTHER_USER.1)).unwrap();
    for (before, after) in [
        (0o6644, 0o2644),
        (0o6744, 0o2744),
        (0o6654, 0o654),
        (0o6754, 0o754),
    ] {
        fs::set_permissions(fs.p("t"), fs::Permissions::from_mode(before)).unwrap();
        assert_eq!(fs::metadata(fs.p("t")).unwrap().mode() & 0o7777, before);
        assert!(sh_in_mount(
            &fs,
            "dd if=/dev/zero of=t bs=4096 count=1 oflag=direct conv=notrunc status=none",
            Some(OTHER_USER)
        ));
        let shown = fs::metadata(fs.p("t")).unwrap().mode() & 0o7777;
        assert_eq!(shown, after, "{before:o}: shown {shown:o}");
    }
}

#[test]
fn a_stream_larger_than_several_write_out_batches_reads_back_after_remount() {
    // Large writes start the backing file's write-out every 8 MiB and evict the batch before
    // (cloakfs_core's stream); reading it back evicts batches too: the bytes must survive
    // that, through fresh caches.
    let mut fs = TestFs::new();
    let data = pattern(40 << 20, 7);
    let mut f = File::create(fs.p("stream")).unwrap();
    for chunk in data.chunks(1 << 20) {
        f.write_all(chunk).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    fs.remount();
    if is_root() {
        // Only root may set these: an 8 MiB readahead window (more reads in flight when
        // streaming) and 5% of the dirty-page limit (instead of FUSE's 1%).
        let dev = fs::metadata(&fs.mnt).unwrap().dev();
        let bdi = format!("/sys/class/bdi/{}:{}", libc::major(dev), libc::minor(dev));
        for (knob, want) in [("read_ahead_kb", "8192"), ("max_ratio", "5")] {
            let got = fs::read_to_string(format!("{bdi}/{knob}")).unwrap();
            assert_eq!(got.trim(), want, "{bdi}/{knob}");
        }
    }
    let back = fs::read(fs.p("stream")).unwrap();
    assert!(back == data, "stream differs after remount");
}
