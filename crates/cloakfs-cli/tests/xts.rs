//! The size-preserving suite (`cloakfs init --cipher aes-256-xts`) on real FUSE mounts: backing
//! files of exactly the plaintext size, holes, random 4 KiB reads and writes, truncate, no
//! integrity said by init, info and fsck, the refusal of a file system without user xattrs,
//! and bad input refused in one line.

mod common;

use common::*;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

const ID_XATTR: &str = "user.cloakfs.id";

fn xts_fixture() -> Fixture {
    let f = Fixture::bare();
    let out = f.init(&["--cipher", "aes-256-xts"]);
    assert!(out.status.success(), "init: {}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("aes-256-xts has no integrity"), "{said}");
    f
}

/// Every backing file that holds data: the ones with a header xattr.
fn backing_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = p.symlink_metadata().unwrap();
            if m.is_dir() {
                todo.push(p);
            } else if m.is_file() && rustix::fs::getxattr(&p, ID_XATTR, &mut [0u8; 64]).is_ok() {
                out.push(p);
            }
        }
    }
    out
}

/// The one backing file with data (a test that writes one file).
fn only_backing_file(dir: &Path) -> PathBuf {
    let files = backing_files(dir);
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

fn pattern(len: u64, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn backing_files_have_exactly_the_plaintext_size() {
    let f = xts_fixture();
    let sizes = [
        0u64,
        1,
        15,
        16,
        17,
        4095,
        4096,
        4097,
        4111,
        4112,
        (1 << 20) + 5,
    ];
    let m = f.mounted(&[]);
    for (i, &size) in sizes.iter().enumerate() {
        std::fs::write(f.mnt.join(format!("f{size}")), pattern(size, i as u64)).unwrap();
    }
    m.unmount();
    let mut backing: Vec<u64> = backing_files(&f.cipher)
        .iter()
        .map(|p| p.metadata().unwrap().len())
        .collect();
    backing.sort_unstable();
    let nonempty: Vec<u64> = sizes.iter().copied().filter(|&s| s > 0).collect();
    assert_eq!(backing, nonempty);
    let m = f.mounted(&[]);
    for (i, &size) in sizes.iter().enumerate() {
        let p = f.mnt.join(format!("f{size}"));
        assert_eq!(std::fs::metadata(&p).unwrap().len(), size);
        assert_eq!(
            std::fs::read(&p).unwrap(),
            pattern(size, i as u64),
            "{size}"
        );
    }
    m.unmount();
}

#[test]
fn holes_stay_holes_and_read_as_zeros() {
    let f = xts_fixture();
    let m = f.mounted(&[]);
    let p = f.mnt.join("sparse");
    let file = std::fs::File::create(&p).unwrap();
    file.write_all_at(b"start", 0).unwrap();
    let size = 64 * 4096 + 5;
    file.set_len(size).unwrap();
    file.write_all_at(b"middle", 40 * 4096 + 3).unwrap();
    drop(file);
    let all = std::fs::read(&p).unwrap();
    assert_eq!(all.len() as u64, size);
    assert_eq!(&all[..5], b"start");
    assert_eq!(&all[40 * 4096 + 3..40 * 4096 + 9], b"middle");
    let zeros = all[5..40 * 4096 + 3].iter().chain(&all[40 * 4096 + 9..]);
    assert!(zeros.into_iter().all(|&b| b == 0));
    m.unmount();
    let backing = only_backing_file(&f.cipher);
    let meta = backing.metadata().unwrap();
    assert_eq!(meta.len(), size);
    assert!(
        meta.blocks() * 512 < size / 2,
        "the gaps take no space: {} of {size} bytes allocated",
        meta.blocks() * 512
    );
    // An all-zero sector written over data reads as a hole: zeros.
    let raw = std::fs::OpenOptions::new()
        .write(true)
        .open(&backing)
        .unwrap();
    raw.write_all_at(&[0u8; 4096], 0).unwrap();
    drop(raw);
    let _m = f.mounted(&[]);
    assert_eq!(std::fs::read(&p).unwrap()[..4096], [0u8; 4096]);
}

#[test]
fn random_4k_reads_and_writes_and_truncates_match_a_model() {
    let f = xts_fixture();
    let m = f.mounted(&[]);
    let p = f.mnt.join("db");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    let mut model = pattern(256 * 1024, 1);
    file.write_all_at(&model, 0).unwrap();
    let mut rng = 7u64;
    let mut next = |n: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) % n
    };
    for i in 0..300 {
        // Mostly aligned 4 KiB pages, as a database or VM image writes; some unaligned.
        let (off, len) = if i % 4 == 0 {
            (next(model.len() as u64), 1 + next(9000))
        } else {
            (next(64) * 4096, 4096)
        };
        let data = pattern(len, i + 100);
        file.write_all_at(&data, off).unwrap();
        let end = (off + len) as usize;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[off as usize..end].copy_from_slice(&data);
        let roff = next(model.len() as u64) / 4096 * 4096;
        let mut buf = vec![0u8; 4096];
        let n = file.read_at(&mut buf, roff).unwrap();
        let want = &model[roff as usize..(roff as usize + 4096).min(model.len())];
        assert_eq!(&buf[..n], want, "read at {roff} after write {i}");
    }
    // Truncate down into every kind of tail and up again.
    for size in [300_000u64, 5000, 4111, 4097, 17, 15, 1, 0, 8193, 20_000] {
        file.set_len(size).unwrap();
        model.resize(size as usize, 0);
        let mut all = vec![0u8; model.len() + 10];
        let n = file.read_at(&mut all, 0).unwrap();
        assert_eq!(&all[..n], &model[..], "after truncate to {size}");
        if size == 4097 {
            // Past 4096 the next write appends to a 1-byte last block.
            file.write_all_at(b"xy", 4097).unwrap();
            model.extend_from_slice(b"xy");
        }
    }
    drop(file);
    m.unmount();
    assert_eq!(
        only_backing_file(&f.cipher).metadata().unwrap().len(),
        model.len() as u64
    );
    let _m = f.mounted(&[]);
    assert_eq!(std::fs::read(&p).unwrap(), model);
}

#[test]
fn tampering_goes_unnoticed_as_documented_and_info_and_fsck_say_so() {
    let f = xts_fixture();
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("doc"), pattern(10_000, 3)).unwrap();
    std::fs::write(f.mnt.join("tiny"), b"abc").unwrap();
    m.unmount();
    let doc = backing_files(&f.cipher)
        .into_iter()
        .find(|p| p.metadata().unwrap().len() == 10_000)
        .unwrap();
    let raw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&doc)
        .unwrap();
    let mut b = [0u8];
    raw.read_exact_at(&mut b, 5000).unwrap();
    raw.write_all_at(&[!b[0]], 5000).unwrap();
    drop(raw);

    let info = f.run(&["info", s(&f.cipher)]);
    assert!(info.status.success());
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(info.contains("content cipher:  aes-256-xts"), "{info}");
    assert!(info.contains("integrity:       none"), "{info}");

    let fsck = f.run(&["fsck", "--passfile", s(&f.pass), s(&f.cipher)]);
    let text = String::from_utf8_lossy(&fsck.stdout);
    assert!(fsck.status.success(), "{text}{}", stderr(&fsck));
    assert!(text.contains("file contents cannot be checked"), "{text}");
    assert!(text.contains("no problems"), "{text}");

    let _m = f.mounted(&[]);
    let back = std::fs::read(f.mnt.join("doc")).unwrap();
    assert_eq!(back.len(), 10_000);
    assert_ne!(
        back,
        pattern(10_000, 3),
        "the change went through, silently"
    );
    // Only the 16-byte XTS block that holds the flipped byte changed (and nothing else does).
    let want = pattern(10_000, 3);
    let differ: Vec<usize> = (0..10_000).filter(|&i| back[i] != want[i]).collect();
    assert!(differ.iter().all(|&i| i / 16 == 5000 / 16), "{differ:?}");
    assert_eq!(std::fs::read(f.mnt.join("tiny")).unwrap(), b"abc");
    // User xattrs work next to the header xattr, which the view does not list.
    let p = f.mnt.join("tiny");
    rustix::fs::setxattr(&p, "user.note", b"v", rustix::fs::XattrFlags::empty()).unwrap();
    let mut names = [0u8; 256];
    let n = rustix::fs::listxattr(&p, &mut names[..]).unwrap();
    assert_eq!(&names[..n], b"user.note\0");
}

#[test]
fn a_backing_file_without_its_header_xattr_is_an_io_error_not_a_panic() {
    let f = xts_fixture();
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("a"), pattern(5000, 9)).unwrap();
    m.unmount();
    rustix::fs::removexattr(only_backing_file(&f.cipher).as_path(), ID_XATTR).ok();
    let _m = f.mounted(&[]);
    let e = std::fs::read(f.mnt.join("a")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
}

#[test]
fn bad_input_is_refused_in_one_line() {
    let f = Fixture::bare();
    let out = f.init(&["--cipher", "aes-256-xts", "--strict-holes"]);
    assert_fails(&out, 2, "--strict-holes needs an authenticated cipher");
    assert!(!f.cipher.join("cloakfs.conf").exists());
    let out = f.init(&["--cipher", "aes-256-xts", "--sharing"]);
    assert_fails(&out, 2, "--sharing needs an authenticated cipher");
    assert!(!f.cipher.join("cloakfs.conf").exists());
}

/// A ramfs (no user xattrs), unmounted on drop; `None` when not root.
struct Ramfs(PathBuf);

impl Ramfs {
    fn mount(at: PathBuf) -> Option<Self> {
        std::fs::create_dir_all(&at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "ramfs", "cloakfs-xts-test"])
            .arg(&at)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Self(at))
    }
}

impl Drop for Ramfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_file_system_without_user_xattrs_is_refused_at_init_and_mount() {
    let f = xts_fixture();
    let Some(ram) = Ramfs::mount(f.tmp.path().join("ramfs")) else {
        eprintln!("skipped: cannot mount a ramfs (needs root)");
        return;
    };
    let nox = ram.0.join("cipher");
    let out = f.run(
        &[
            &["init", "--cipher", "aes-256-xts", "--passfile", s(&f.pass)],
            &CHEAP_KDF[..],
            &[s(&nox)],
        ]
        .concat(),
    );
    assert_fails(&out, 2, "does not support user xattrs");
    assert!(!nox.join("cloakfs.conf").exists());
    // The same volume copied there (cp keeps no xattrs on a ramfs) is refused at mount.
    let st = Command::new("cp")
        .arg("-r")
        .arg(&f.cipher)
        .arg(&nox)
        .status()
        .unwrap();
    assert!(st.success());
    let out = f.run(&["mount", "--passfile", s(&f.pass), s(&nox), s(&f.mnt)]);
    assert_fails(&out, 2, "does not support user xattrs");
    assert!(!is_mounted(&f.mnt));
    // And at attach to the multi-user daemon, before any secret is asked for or a daemon is
    // reached.
    let out = f.run(&[
        "attach",
        "--passfile",
        s(&f.pass),
        "--socket",
        s(&f.tmp.path().join("no-daemon.sock")),
        s(&nox),
        "vol",
    ]);
    assert_fails(&out, 2, "does not support user xattrs");
    // An authenticated suite keeps its header in the file and needs no xattrs.
    let gcm = ram.0.join("gcm");
    let out = f.run(
        &[
            &["init", "--passfile", s(&f.pass)],
            &CHEAP_KDF[..],
            &[s(&gcm)],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn offline_cat_and_export_read_an_xts_volume() {
    let f = xts_fixture();
    let m = f.mounted(&[]);
    let doc = pattern(3 * 4096 + 7, 5);
    std::fs::write(f.mnt.join("doc"), &doc).unwrap();
    std::fs::write(f.mnt.join("tiny"), b"abc").unwrap();
    rustix::fs::setxattr(
        f.mnt.join("doc"),
        "user.note",
        b"kept",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    m.unmount();
    let out = f.run(&["cat", "--passfile", s(&f.pass), s(&f.cipher), "/doc"]);
    assert!(out.status.success(), "cat: {}", stderr(&out));
    assert_eq!(out.stdout, doc);
    let dest = f.tmp.path().join("export");
    let out = f.run(&["export", "--passfile", s(&f.pass), s(&f.cipher), s(&dest)]);
    assert!(out.status.success(), "export: {}", stderr(&out));
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(!said.contains("does not decrypt"), "{said}");
    assert_eq!(std::fs::read(dest.join("doc")).unwrap(), doc);
    assert_eq!(std::fs::read(dest.join("tiny")).unwrap(), b"abc");
    let mut v = [0u8; 16];
    let n = rustix::fs::getxattr(dest.join("doc"), "user.note", &mut v).unwrap();
    assert_eq!(&v[..n], b"kept");
    let mut names = [0u8; 256];
    let n = rustix::fs::listxattr(dest.join("doc"), &mut names[..]).unwrap();
    assert_eq!(
        &names[..n],
        b"user.note\0",
        "the header xattr is not exported"
    );
}

/// Storage attack: file A's `user.cloakfs.id` copied onto non-empty file B. B's next short
/// tail, written through the mount, must not reuse A's tail keystream: it did (AES-256-CTR
/// under A's key and the tail's block number), and the XOR of the two backing tails was the
/// XOR of the two plaintext tails, so knowing one tail gave the other.
#[test]
fn a_transplanted_id_does_not_make_the_next_short_tail_a_two_time_pad() {
    let f = xts_fixture();
    let size = 4096 + 15;
    let a_plain = pattern(size, 1);
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("a"), &a_plain).unwrap();
    m.unmount();
    let a = only_backing_file(&f.cipher);
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("b"), pattern(size, 2)).unwrap();
    m.unmount();
    let b = backing_files(&f.cipher)
        .into_iter()
        .find(|p| *p != a)
        .unwrap();
    let mut id = [0u8; 64];
    let n = rustix::fs::getxattr(&a, ID_XATTR, &mut id).unwrap();
    rustix::fs::setxattr(&b, ID_XATTR, &id[..n], rustix::fs::XattrFlags::empty()).unwrap();

    let b_tail = *b"fifteen bytes!!";
    let m = f.mounted(&[]);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(f.mnt.join("b"))
        .unwrap();
    file.write_all_at(&b_tail, 4096).unwrap();
    drop(file);
    m.unmount();
    let backing_xor = xor(&backing_tail(&a), &backing_tail(&b));
    assert_ne!(
        backing_xor,
        xor(&a_plain[4096..], &b_tail),
        "B's new tail was encrypted with A's tail keystream"
    );
    // B reads its new tail (its older block decrypts under A's ID: garbage, as documented).
    let m = f.mounted(&[]);
    assert_eq!(std::fs::read(f.mnt.join("b")).unwrap()[4096..], b_tail);
    // What remains (THREAT-MODEL B3): B's sectors are now XTS under A's keys, so a sector
    // written with A's plaintext shows as A's ciphertext.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(f.mnt.join("b"))
        .unwrap();
    file.write_all_at(&a_plain[..4096], 0).unwrap();
    drop(file);
    m.unmount();
    let sector = |p: &Path| std::fs::read(p).unwrap()[..4096].to_vec();
    assert_eq!(sector(&a), sector(&b));
}

/// Whoever sees a short tail before and after it is rewritten does not learn the XOR of the
/// two versions: each is encrypted under a counter block of its own.
#[test]
fn a_rewritten_short_tail_does_not_show_the_xor_of_its_versions() {
    let f = xts_fixture();
    let first = pattern(4096 + 15, 3);
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("t"), &first).unwrap();
    m.unmount();
    let backing = only_backing_file(&f.cipher);
    let before = backing_tail(&backing);
    let second = *b"another 15 byte";
    let m = f.mounted(&[]);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(f.mnt.join("t"))
        .unwrap();
    file.write_all_at(&second, 4096).unwrap();
    drop(file);
    m.unmount();
    assert_ne!(
        xor(&before, &backing_tail(&backing)),
        xor(&first[4096..], &second),
        "the tail's two versions share a keystream"
    );
    let _m = f.mounted(&[]);
    assert_eq!(std::fs::read(f.mnt.join("t")).unwrap()[4096..], second);
}

/// A copy of the whole cipher directory with `cp -a` (xattrs kept, new inodes) mounts and
/// reads as the original, and a tail written in the copy leaves the original as it was.
#[test]
fn a_copy_of_the_cipher_directory_made_with_cp_a_mounts_reads_and_writes() {
    let f = xts_fixture();
    let sizes = [3u64, 15, 17, 4096 + 7, 2 * 4096];
    let m = f.mounted(&[]);
    for &size in &sizes {
        std::fs::write(f.mnt.join(format!("f{size}")), pattern(size, size)).unwrap();
    }
    // A tail rewritten after the file was made: its header holds a later counter block.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(f.mnt.join("f15"))
        .unwrap();
    file.write_all_at(b"xyz", 12).unwrap();
    drop(file);
    m.unmount();
    let mut want: Vec<(String, Vec<u8>)> = sizes
        .iter()
        .map(|&size| (format!("f{size}"), pattern(size, size)))
        .collect();
    want[1].1[12..].copy_from_slice(b"xyz");

    let copy = Fixture::bare();
    let st = Command::new("cp")
        .args(["-a", s(&f.cipher), s(&copy.cipher)])
        .status()
        .unwrap();
    assert!(st.success());
    let m = copy.mounted(&[]);
    for (name, data) in &want {
        assert_eq!(&std::fs::read(copy.mnt.join(name)).unwrap(), data, "{name}");
    }
    std::fs::OpenOptions::new()
        .append(true)
        .open(copy.mnt.join("f3"))
        .unwrap()
        .write_all_at(b"!", 3)
        .unwrap();
    assert_eq!(std::fs::read(copy.mnt.join("f3")).unwrap()[3..], *b"!");
    m.unmount();
    let _m = f.mounted(&[]);
    for (name, data) in &want {
        assert_eq!(&std::fs::read(f.mnt.join(name)).unwrap(), data, "{name}");
    }
}

/// The bytes of a backing file past its first 4 KiB block: a short tail in these tests.
fn backing_tail(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()[4096..].to_vec()
}

fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x ^ y).collect()
}
