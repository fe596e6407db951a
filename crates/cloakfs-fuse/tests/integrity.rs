//! What the cipher directory reveals, and what happens when someone changes it: tampered,
//! moved or foreign ciphertext is never served, and a damaged block fails alone.

mod common;

use common::*;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

const MARK: &[u8] = b"ZQXMARK";

/// Log lines of this test binary (all tests share one global subscriber).
fn captured_log() -> &'static std::sync::Mutex<Vec<u8>> {
    static LOG: std::sync::OnceLock<&'static std::sync::Mutex<Vec<u8>>> =
        std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log: &'static std::sync::Mutex<Vec<u8>> =
            Box::leak(Box::new(std::sync::Mutex::new(Vec::new())));
        struct W(&'static std::sync::Mutex<Vec<u8>>);
        impl std::io::Write for W {
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
            .with_writer(move || W(log))
            .init();
        log
    })
}

/// Captured log lines that mention `needle`.
fn log_lines_with(needle: &str) -> Vec<String> {
    String::from_utf8_lossy(&captured_log().lock().unwrap())
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn no_plaintext_name_or_content_in_cipher_dir() {
    let mut fs = TestFs::new();
    let content: Vec<u8> = MARK.iter().copied().cycle().take(3 * 4096 + 500).collect();
    fs::create_dir(fs.p("dir-ZQXMARK")).unwrap();
    fs::write(fs.p("dir-ZQXMARK/file-ZQXMARK.txt"), &content).unwrap();
    fs::write(fs.p("tiny-ZQXMARK"), b"small ZQXMARK").unwrap();
    fs::write(fs.p(&format!("long-ZQXMARK-{}", "l".repeat(230))), &content).unwrap();
    std::os::unix::fs::symlink("target-ZQXMARK", fs.p("link-ZQXMARK")).unwrap();
    setxattr(&fs.p("tiny-ZQXMARK"), "user.ZQXMARK", b"value ZQXMARK", 0).unwrap();
    let c = cpath(&fs.p("fifo-ZQXMARK"));
    // SAFETY: a valid C string path.
    check(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }).unwrap();
    fs.unmount();

    let mut checked = 0;
    for p in walk(&fs.cipher) {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            !contains(name.as_bytes(), MARK),
            "plaintext name {}",
            p.display()
        );
        let m = fs::symlink_metadata(&p).unwrap();
        if m.file_type().is_symlink() {
            let t = fs::read_link(&p).unwrap();
            assert!(
                !contains(t.to_string_lossy().as_bytes(), MARK),
                "symlink {}",
                p.display()
            );
        } else if m.is_file() {
            let bytes = fs::read(&p).unwrap();
            assert!(
                !contains(&bytes, MARK),
                "plaintext content in {}",
                p.display()
            );
            checked += 1;
        }
        if !m.file_type().is_symlink() {
            for x in listxattr(&p).unwrap() {
                assert!(!contains(&x, MARK), "xattr name on {}", p.display());
                let v = getxattr(&p, std::str::from_utf8(&x).unwrap(), false).unwrap();
                assert!(!contains(&v, MARK), "xattr value on {}", p.display());
            }
        }
    }
    // config, dirid, two content files, the long file, its sidecar
    assert!(checked >= 6, "walked only {checked} files");
}

#[test]
fn flipped_bit_fails_only_its_block() {
    let mut fs = TestFs::new();
    let data: Vec<u8> = (0..5 * 4096).map(|i| (i / 4096) as u8 + 1).collect();
    fs::write(fs.p("f"), &data).unwrap();
    fs.unmount();
    let backing = fs.backing("f");
    let raw = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&backing)
        .unwrap();
    let at = 18 + 2 * 4124 + 100;
    let mut b = [0u8; 1];
    raw.read_exact_at(&mut b, at).unwrap();
    raw.write_all_at(&[b[0] ^ 0x04], at).unwrap();
    drop(raw);
    fs.mount();

    captured_log();
    let backing_str = backing.to_string_lossy().into_owned();
    // Each block on its own (O_DIRECT: exactly that range reaches the daemon).
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(fs.p("f"))
        .unwrap();
    let mut buf = vec![0u8; 4096];
    for block in 0..5u64 {
        let r = f.read_exact_at(&mut buf, block * 4096);
        if block == 2 {
            assert_eq!(errno(&r.unwrap_err()), libc::EIO);
            // One error line, naming the backing file and the block.
            let lines = log_lines_with(&backing_str);
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(
                lines[0].contains("ERROR") && lines[0].contains("block 2"),
                "{}",
                lines[0]
            );
        } else {
            r.unwrap();
            assert!(buf.iter().all(|&x| x == block as u8 + 1), "block {block}");
        }
    }
    drop(f);
    // Through the page cache: the damaged block fails, the blocks after it still read.
    let f = File::open(fs.p("f")).unwrap();
    assert_eq!(
        errno(&f.read_exact_at(&mut buf, 2 * 4096).unwrap_err()),
        libc::EIO
    );
    f.read_exact_at(&mut buf, 4 * 4096).unwrap();
    assert!(buf.iter().all(|&x| x == 5));
    assert_eq!(errno(&fs::read(fs.p("f")).unwrap_err()), libc::EIO);
}

#[test]
fn truncated_backing_file_fails_its_last_block() {
    let mut fs = TestFs::new();
    fs::write(fs.p("f"), vec![9u8; 4096 + 1000]).unwrap();
    fs.unmount();
    let backing = fs.backing("f");
    let raw = OpenOptions::new().write(true).open(&backing).unwrap();
    raw.set_len(18 + 4124 + 500).unwrap();
    drop(raw);
    fs.mount();
    // The cut last block looks like a shorter block, but does not authenticate.
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(fs.p("f"))
        .unwrap();
    assert_eq!(f.metadata().unwrap().len(), 4096 + 500 - 28);
    let mut buf = vec![0u8; 4096];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&x| x == 9));
    assert_eq!(errno(&f.read_at(&mut buf, 4096).unwrap_err()), libc::EIO);
    drop(f);
    // Cut inside the tag: the damaged tail does not count at all.
    fs.unmount();
    let raw = OpenOptions::new().write(true).open(&backing).unwrap();
    raw.set_len(18 + 4124 + 20).unwrap();
    drop(raw);
    fs.mount();
    assert_eq!(fs::metadata(fs.p("f")).unwrap().len(), 4096);
    assert_eq!(fs::read(fs.p("f")).unwrap(), vec![9u8; 4096]);
}

/// Creates `rel` with `data` in a fresh volume, unmounts, and returns it.
fn volume_with(files: &[(&str, &[u8])], dirs: &[&str]) -> TestFs {
    let mut fs = TestFs::new();
    for d in dirs {
        fs::create_dir(fs.p(d)).unwrap();
    }
    for (rel, data) in files {
        fs::write(fs.p(rel), data).unwrap();
    }
    fs.unmount();
    fs
}

#[test]
fn tampered_name_is_neither_listed_nor_served() {
    let long = "q".repeat(220);
    let mut fs = volume_with(&[("secret.txt", b"s"), ("kept", b"k"), (&long, b"l")], &[]);
    let b = fs.backing("secret.txt");
    let name = b.file_name().unwrap().to_str().unwrap().to_string();
    let mut t = name.clone().into_bytes();
    t[5] = if t[5] == b'A' { b'B' } else { b'A' };
    fs::rename(&b, b.with_file_name(String::from_utf8(t).unwrap())).unwrap();
    // A long name: change its sidecar.
    let lb = fs.backing(&long);
    let side = lb.with_file_name(format!(
        "{}.name",
        lb.file_name().unwrap().to_str().unwrap()
    ));
    let mut full = fs::read(&side).unwrap();
    full[3] = if full[3] == b'A' { b'B' } else { b'A' };
    fs::write(&side, &full).unwrap();
    fs.mount();
    captured_log();
    assert_eq!(names(&fs.mnt), vec!["kept"]);
    assert_eq!(
        errno(&fs::read(fs.p("secret.txt")).unwrap_err()),
        libc::ENOENT
    );
    // The long entry is found by the hash of its name, but it is not listed.
    assert_eq!(raw_names(&fs.mnt).len(), 3);
}

/// FORMAT.md 9.1: each name has one stored form, and the mount refuses the other one.
#[test]
fn name_in_the_other_stored_form_is_neither_listed_nor_served() {
    use cloakfs_core::format::names;
    // With long_name_max 100, a 70-byte name is stored long (115 characters), a 40-byte one
    // short (75 characters).
    let mut fs = TestFs::with_params(|p| p.long_name_max = 100);
    let (long, short) = ("l".repeat(70), "s".repeat(40));
    for n in [long.as_str(), short.as_str(), "kept"] {
        fs::write(fs.p(n), n).unwrap();
    }
    fs.unmount();
    // The long name into the short form: its full encrypted name as the backing name.
    let lb = fs.backing(&long);
    let side = lb.with_file_name(names::sidecar_name(
        lb.file_name().unwrap().to_str().unwrap(),
    ));
    let full = fs::read_to_string(&side).unwrap();
    fs::rename(&lb, fs.cipher.join(&full)).unwrap();
    fs::remove_file(&side).unwrap();
    // The short name into the long form: a sidecar holding it, the entry under its hash.
    let sb = fs.backing(&short);
    let e = sb.file_name().unwrap().to_str().unwrap().to_string();
    let as_long = names::long_backing_name(&e);
    fs::write(fs.cipher.join(names::sidecar_name(&as_long)), &e).unwrap();
    fs::rename(&sb, fs.cipher.join(&as_long)).unwrap();

    fs.mount();
    captured_log();
    assert_eq!(names(&fs.mnt), vec!["kept"]);
    for n in [&long, &short] {
        assert_eq!(errno(&fs::read(fs.p(n)).unwrap_err()), libc::ENOENT);
    }
    // A warning names each refused backing entry (never its plaintext name).
    for b in [&full, &as_long] {
        let lines = log_lines_with(b);
        assert!(!lines.is_empty(), "no warning names {b}");
        assert!(lines
            .iter()
            .all(|l| !l.contains(&long) && !l.contains(&short)));
    }
}

#[test]
fn file_moved_to_another_backing_directory_is_not_listed() {
    let mut fs = volume_with(&[("a/f", b"from a")], &["a", "b"]);
    let from = fs.backing("a/f");
    let to = fs.backing("b").join(from.file_name().unwrap());
    fs::rename(&from, &to).unwrap();
    fs.mount();
    // Its only entry does not decrypt: the listing is an error, not an empty directory.
    assert_eq!(errno(&list_error(&fs.p("b"))), libc::EIO);
    assert!(names(&fs.p("a")).is_empty());
    assert_eq!(errno(&fs::read(fs.p("b/f")).unwrap_err()), libc::ENOENT);
    assert_eq!(errno(&fs::read(fs.p("a/f")).unwrap_err()), libc::ENOENT);
}

#[test]
fn a_planted_file_of_holes_never_lends_its_id_to_new_data() {
    // Someone who can write the cipher directory copies a real file's header into another
    // file and gives it holes only, sparse or as zero bytes: nothing authenticates that ID.
    let data: Vec<u8> = (0..3 * 4096).map(|i| (i % 251) as u8).collect();
    let mut fs = volume_with(
        &[
            ("orig", &data),
            ("sparse", b""),
            ("zeros", b""),
            ("mine", &data),
        ],
        &[],
    );
    let orig = fs.backing("orig");
    let header = fs::read(&orig).unwrap()[..18].to_vec();
    let cbs = 4096 + 28;
    for (name, sparse) in [("sparse", true), ("zeros", false)] {
        let f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(fs.backing(name))
            .unwrap();
        f.write_all_at(&header, 0).unwrap();
        if sparse {
            f.set_len(18 + 3 * cbs).unwrap();
        } else {
            f.write_all_at(&vec![0u8; 3 * cbs as usize], 18).unwrap();
        }
    }
    let mine_header = fs::read(fs.backing("mine")).unwrap()[..18].to_vec();
    fs.mount();
    for name in ["sparse", "zeros", "mine"] {
        let f = OpenOptions::new().write(true).open(fs.p(name)).unwrap();
        f.write_all_at(&[0x5a; 4096], 4096).unwrap();
        f.sync_all().unwrap();
    }
    fs.unmount();
    for name in ["sparse", "zeros"] {
        let planted = fs::read(fs.backing(name)).unwrap();
        assert_ne!(
            planted[..18],
            header[..],
            "{name}: new data under the planted ID"
        );
        // Its new block moved over the original's block 1 does not authenticate there.
        let o = OpenOptions::new().write(true).open(&orig).unwrap();
        let block1 = &planted[18 + cbs as usize..18 + 2 * cbs as usize];
        o.write_all_at(block1, 18 + cbs).unwrap();
    }
    // A file with data of its own keeps its ID.
    assert_eq!(fs::read(fs.backing("mine")).unwrap()[..18], mine_header[..]);
    fs.mount();
    let mut expect = vec![0u8; 3 * 4096];
    expect[4096..8192].fill(0x5a);
    assert_eq!(fs::read(fs.p("sparse")).unwrap(), expect);
    assert_eq!(fs::read(fs.p("zeros")).unwrap(), expect);
    let mut mine = data.clone();
    mine[4096..8192].fill(0x5a);
    assert_eq!(fs::read(fs.p("mine")).unwrap(), mine);
    assert_eq!(errno(&fs::read(fs.p("orig")).unwrap_err()), libc::EIO);
}

/// The error of listing `dir` (read_dir itself, or its first entry).
fn list_error(dir: &Path) -> std::io::Error {
    match fs::read_dir(dir) {
        Err(e) => e,
        Ok(mut r) => match r.next() {
            Some(Err(e)) => e,
            other => panic!("{} listed: {other:?}", dir.display()),
        },
    }
}

#[test]
fn a_directory_where_no_name_decrypts_is_eio_not_empty() {
    // A config replaced by one with another master key: the tree looks like that to the
    // mount (in a test of the daemon alone, without the key pinning of the command line).
    let mut fs = volume_with(&[("a", b"1"), ("b", b"2"), ("d/c", b"3")], &["d"]);
    // Same volume ID (so the directory IDs are the same), another key.
    let ours = cloakfs_core::format::config::VolumeConfig::load(&fs.cipher).unwrap();
    let mk = cloakfs_core::crypto::keys::MasterKey::generate();
    let mut fresh = cloakfs_core::format::config::VolumeConfig::new(ours.params.clone());
    fresh
        .add_passphrase_slot(
            &mk,
            &cloakfs_core::crypto::secret::Passphrase::new(PASS.to_vec()),
            kdf(),
            "",
            cloakfs_core::format::config::SlotRandomness::fresh(),
        )
        .unwrap();
    fresh.seal(&mk);
    fresh.save(&fs.cipher).unwrap();
    captured_log();
    fs.mount();
    assert_eq!(errno(&list_error(&fs.mnt)), libc::EIO);
    let root = fs.cipher.to_string_lossy().into_owned();
    let lines = log_lines_with("none of its 3 entries decrypts");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("ERROR") && l.contains(&root)),
        "{lines:?}"
    );
    fs.unmount();
    // An empty directory is still just empty.
    let empty = TestFs::new();
    assert!(names(&empty.mnt).is_empty());
}

#[test]
fn file_copied_from_another_volume_is_not_listed() {
    let other = volume_with(&[("foreign", b"other volume")], &[]);
    let mut fs = volume_with(&[("mine", b"mine")], &[]);
    let src = other.backing("foreign");
    fs::copy(&src, fs.cipher.join(src.file_name().unwrap())).unwrap();
    fs.mount();
    assert_eq!(names(&fs.mnt), vec!["mine"]);
    assert_eq!(errno(&fs::read(fs.p("foreign")).unwrap_err()), libc::ENOENT);
}

#[test]
fn directory_without_id_fails_with_eio() {
    let mut fs = volume_with(&[("d/f", b"x")], &["d"]);
    fs::remove_file(fs.backing("d").join("cloakfs.dirid")).unwrap();
    fs.mount();
    assert!(fs::metadata(fs.p("d")).unwrap().is_dir());
    assert_eq!(
        errno(
            &fs::read_dir(fs.p("d"))
                .and_then(|mut r| r.next().unwrap())
                .unwrap_err()
        ),
        libc::EIO
    );
    assert_eq!(errno(&fs::read(fs.p("d/f")).unwrap_err()), libc::EIO);
}

#[test]
fn unsupported_file_header_version_fails_with_eio() {
    let mut fs = volume_with(&[("f", b"hello")], &[]);
    let raw = OpenOptions::new()
        .write(true)
        .open(fs.backing("f"))
        .unwrap();
    raw.write_all_at(&[0, 9], 0).unwrap();
    drop(raw);
    fs.mount();
    // The header is read on first use (not at open, which must not touch the access time).
    assert_eq!(errno(&fs::read(fs.p("f")).unwrap_err()), libc::EIO);
    // Still removable.
    fs::remove_file(fs.p("f")).unwrap();
}

/// A small tmpfs mounted for one test, unmounted on drop.
struct SmallTmpfs(std::path::PathBuf);

impl SmallTmpfs {
    fn mount(at: &Path, size: &str) -> Option<Self> {
        fs::create_dir_all(at).unwrap();
        let (src, dir) = (cpath(Path::new("tmpfs")), cpath(at));
        let opts = std::ffi::CString::new(format!("size={size}")).unwrap();
        // SAFETY: valid C strings; mounting a fresh tmpfs on our own temporary directory.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                dir.as_ptr(),
                src.as_ptr(),
                0,
                opts.as_ptr().cast(),
            )
        };
        (rc == 0).then(|| Self(at.to_path_buf()))
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let dir = cpath(&self.0);
        // SAFETY: unmounting the tmpfs this test mounted.
        unsafe { libc::umount2(dir.as_ptr(), libc::MNT_DETACH) };
    }
}

#[test]
fn full_disk_reports_enospc_and_keeps_written_data() {
    if !is_root() {
        eprintln!("skipped: needs root to mount a small tmpfs");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(_tmpfs) = SmallTmpfs::mount(&tmp.path().join("small"), "1m") else {
        eprintln!("skipped: cannot mount tmpfs");
        return;
    };
    let cipher = tmp.path().join("small/cipher");
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    create_volume(&cipher);
    let holder = tempfile::tempdir().unwrap();
    let mut fs = TestFs::mount_existing(holder, cipher, mnt, |_| {});
    let keep: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let mut f = File::create(fs.p("keep")).unwrap();
    f.write_all(&keep).unwrap();
    f.sync_all().unwrap();
    drop(f);

    let mut big = File::create(fs.p("big")).unwrap();
    let r = (|| {
        for _ in 0..16 {
            big.write_all(&vec![0xAB; 256 * 1024])?;
        }
        big.sync_all()
    })();
    assert_eq!(errno(&r.unwrap_err()), libc::ENOSPC);
    drop(big);
    assert_eq!(fs::read(fs.p("keep")).unwrap(), keep);
    // The writes that failed left no torn block: the file reads back after a remount. The
    // kernel sends its cached pages in concurrent requests that may arrive out of order, so a
    // range whose write failed can lie in a hole and read as zeros.
    fs.remount();
    let back = fs::read(fs.p("big")).unwrap();
    assert!(back.len() <= 16 * 256 * 1024);
    assert!(back.iter().all(|&b| b == 0xAB || b == 0));
    fs::remove_file(fs.p("big")).unwrap();
    fs.remount();
    assert_eq!(fs::read(fs.p("keep")).unwrap(), keep);

    // An append to a partial last block that runs out of space keeps the old bytes. The kernel
    // sends it page-aligned, so it starts inside the file and is reserved first; the core test
    // `a_write_that_runs_out_of_space_leaves_the_plaintext_as_it_was` covers the put-back.
    let filler = tmp.path().join("small/filler");
    let mut fill = File::create(&filler).unwrap();
    while fill.write_all(&[0u8; 64 * 1024]).is_ok() {}
    fill.set_len(fill.metadata().unwrap().len() - 64 * 1024)
        .unwrap();
    drop(fill);
    let mut k = OpenOptions::new().append(true).open(fs.p("keep")).unwrap();
    let r = k.write_all(&[0xCD; 1 << 20]).and_then(|_| k.sync_all());
    assert_eq!(errno(&r.unwrap_err()), libc::ENOSPC);
    drop(k);
    fs.remount();
    let back = fs::read(fs.p("keep")).unwrap();
    assert_eq!(back[..keep.len()], keep[..]);
    assert!(back[keep.len()..].iter().all(|&b| b == 0xCD || b == 0));
    fs::remove_file(&filler).unwrap();
    fs.unmount();
}

/// A bind mount of a directory onto itself, removed on drop.
struct SelfBind(std::path::PathBuf);

impl SelfBind {
    fn mount(dir: &Path) -> Option<Self> {
        let d = cpath(dir);
        // SAFETY: valid C strings; bind-mounting a test directory onto itself.
        let rc = unsafe {
            libc::mount(
                d.as_ptr(),
                d.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        (rc == 0).then(|| Self(dir.to_path_buf()))
    }
}

impl Drop for SelfBind {
    fn drop(&mut self) {
        let d = cpath(&self.0);
        // SAFETY: unmounting the bind mount this test made.
        unsafe { libc::umount2(d.as_ptr(), libc::MNT_DETACH) };
    }
}

#[test]
fn failed_rmdir_restores_the_same_directory_id() {
    if !is_root() {
        eprintln!("skipped: needs root for a bind mount");
        return;
    }
    let fs = TestFs::new();
    fs::create_dir(fs.p("d")).unwrap();
    let backing = fs.backing("d");
    let id = fs::read(backing.join("cloakfs.dirid")).unwrap();
    {
        // A mount point cannot be removed: the backing rmdir fails after the ID is gone.
        let Some(_bind) = SelfBind::mount(&backing) else {
            eprintln!("skipped: cannot bind mount");
            return;
        };
        let e = fs::remove_dir(fs.p("d")).unwrap_err();
        assert_eq!(errno(&e), libc::EBUSY);
    }
    assert_eq!(fs::read(backing.join("cloakfs.dirid")).unwrap(), id);
    fs::write(fs.p("d/still-works"), b"yes").unwrap();
    assert_eq!(names(&fs.p("d")), vec!["still-works"]);
}
