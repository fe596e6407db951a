//! Adopted plaintext trees (`cloakfs init --adopt`, `cloakfs encrypt`) on real FUSE mounts:
//! plaintext and encrypted entries side by side, plaintext files read as they are and
//! encrypted before any write (planted ones too), new files encrypted on disk, renames
//! between the kinds, the collision rule, FUSE passthrough in use, `encrypt` killed with
//! SIGKILL and resumed, a finished conversion refusing planted entries, only the entries
//! the tree held when adopted served (the manifest), and bad input in one line.

mod common;

use common::*;
use std::path::{Path, PathBuf};

/// A plaintext tree in `f.cipher`, adopted.
fn adopted() -> Fixture {
    adopted_with(|_| {})
}

/// The plaintext tree of [`adopted`], with what `prepare` adds to it, adopted.
fn adopted_with(prepare: impl FnOnce(&Path)) -> Fixture {
    let f = Fixture::bare();
    std::fs::create_dir_all(f.cipher.join("docs/deep")).unwrap();
    std::fs::write(f.cipher.join("notes.txt"), "plain notes\n").unwrap();
    std::fs::write(f.cipher.join("README"), "no dot, stored form\n").unwrap();
    std::fs::write(f.cipher.join("docs/deep/a.md"), "deep file\n").unwrap();
    std::os::unix::fs::symlink("notes.txt", f.cipher.join("link")).unwrap();
    prepare(&f.cipher);
    let out = f.init(&["--adopt"]);
    assert!(out.status.success(), "init --adopt: {}", stderr(&out));
    f
}

fn backing_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn plaintext_and_encrypted_entries_live_side_by_side() {
    let f = adopted();
    let m = f.mounted(&[]);
    let mnt = &f.mnt;
    // Existing plaintext appears under its own names, as it is.
    assert_eq!(
        std::fs::read_to_string(mnt.join("notes.txt")).unwrap(),
        "plain notes\n"
    );
    assert_eq!(
        std::fs::read_to_string(mnt.join("README")).unwrap(),
        "no dot, stored form\n"
    );
    assert_eq!(
        std::fs::read_to_string(mnt.join("docs/deep/a.md")).unwrap(),
        "deep file\n"
    );
    assert_eq!(
        std::fs::read_link(mnt.join("link")).unwrap(),
        PathBuf::from("notes.txt")
    );
    // Written through the mount, a plaintext file is encrypted first.
    std::fs::write(mnt.join("notes.txt"), "changed in place\n").unwrap();
    assert!(!f.cipher.join("notes.txt").exists());
    assert_no_backing_file_holds(&f.cipher, &[b"changed in place"]);
    let mut a = std::fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("notes.txt"))
        .unwrap();
    std::io::Write::write_all(&mut a, b"appended\n").unwrap();
    drop(a);
    assert_eq!(
        std::fs::read_to_string(mnt.join("notes.txt")).unwrap(),
        "changed in place\nappended\n"
    );
    // New entries are encrypted: names and contents; the plaintext directory gets its ID.
    std::fs::write(mnt.join("docs/deep/secret.txt"), "TOP-SECRET-CONTENT").unwrap();
    std::fs::create_dir(mnt.join("docs/newdir")).unwrap();
    let deep = backing_names(&f.cipher.join("docs/deep"));
    assert!(deep.contains(&"cloakfs.dirid".to_string()), "{deep:?}");
    assert!(!deep.iter().any(|n| n.contains("secret")), "{deep:?}");
    for n in &deep {
        let b = std::fs::read(f.cipher.join("docs/deep").join(n)).unwrap();
        assert!(!contains(&b, b"TOP-SECRET"), "plaintext on disk in {n}");
    }
    assert_eq!(
        std::fs::read_to_string(mnt.join("docs/deep/secret.txt")).unwrap(),
        "TOP-SECRET-CONTENT"
    );
    let mut listed: Vec<String> = std::fs::read_dir(mnt.join("docs/deep"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    listed.sort();
    assert_eq!(listed, ["a.md", "secret.txt"]);
    // Renames: a plaintext file is encrypted first (its new name is not in the manifest); an
    // encrypted file renamed over a plaintext one replaces it (the editor's save).
    std::fs::rename(mnt.join("README"), mnt.join("README.old")).unwrap();
    assert_eq!(
        std::fs::read_to_string(mnt.join("README.old")).unwrap(),
        "no dot, stored form\n"
    );
    assert!(!f.cipher.join("README").exists() && !f.cipher.join("README.old").exists());
    assert_no_backing_file_holds(&f.cipher, &[b"no dot, stored form"]);
    std::fs::write(mnt.join("notes.tmp"), "saved by an editor\n").unwrap();
    std::fs::rename(mnt.join("notes.tmp"), mnt.join("notes.txt")).unwrap();
    assert_eq!(
        std::fs::read_to_string(mnt.join("notes.txt")).unwrap(),
        "saved by an editor\n"
    );
    assert!(
        !f.cipher.join("notes.txt").exists(),
        "the replaced plaintext is gone"
    );
    // Truncated through a handle, encrypted first; then unlinked.
    std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("README.old"))
        .unwrap()
        .set_len(2)
        .unwrap();
    assert_eq!(std::fs::read(mnt.join("README.old")).unwrap(), b"no");
    std::fs::remove_file(mnt.join("README.old")).unwrap();
    assert!(!mnt.join("README.old").exists());
    // A plaintext directory with an encrypted entry is not empty; emptied, it goes.
    let e = std::fs::remove_dir(mnt.join("docs/deep")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    std::fs::remove_file(mnt.join("docs/deep/secret.txt")).unwrap();
    std::fs::remove_file(mnt.join("docs/deep/a.md")).unwrap();
    std::fs::remove_dir(mnt.join("docs/deep")).unwrap();
    assert!(!f.cipher.join("docs/deep").exists());
    m.unmount();
    // Remounted, everything is still there.
    let m = f.mounted(&[]);
    assert_eq!(
        std::fs::read_to_string(mnt.join("notes.txt")).unwrap(),
        "saved by an editor\n"
    );
    assert!(mnt.join("docs/newdir").is_dir());
    m.unmount();
}

#[test]
fn collisions_refuse_new_names_and_show_the_encrypted_entry() {
    let f = adopted();
    let m = f.mounted(&[]);
    // Creating an encrypted entry over a plaintext name is EEXIST (mkdir over a file too).
    let e = std::fs::create_dir(f.mnt.join("notes.txt")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    let e = std::os::unix::fs::symlink("x", f.mnt.join("README")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    // Made outside the mount next to an encrypted entry of the same name: the encrypted
    // one is shown, once, and fsck reports the other. A listed one (left by an interrupted
    // `cloakfs encrypt`, here put back by hand) and one planted.
    std::fs::write(f.mnt.join("twin"), "encrypted twin\n").unwrap();
    m.unmount();
    std::fs::write(f.cipher.join("twin"), "plaintext twin\n").unwrap();
    std::fs::rename(f.cipher.join("README"), f.tmp.path().join("README")).unwrap();
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("README"), "encrypted README\n").unwrap();
    m.unmount();
    std::fs::rename(f.tmp.path().join("README"), f.cipher.join("README")).unwrap();
    let m = f.mounted(&[]);
    assert_eq!(
        std::fs::read_to_string(f.mnt.join("README")).unwrap(),
        "encrypted README\n"
    );
    assert_eq!(
        std::fs::read_to_string(f.mnt.join("twin")).unwrap(),
        "encrypted twin\n"
    );
    let twins = std::fs::read_dir(&f.mnt)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name() == "twin")
        .count();
    assert_eq!(twins, 1);
    m.unmount();
    let out = f.run(&["fsck", "--passfile", s(&f.pass), s(&f.cipher)]);
    let text = String::from_utf8_lossy(&out.stdout);
    let reported = |name: &str, what: &str| {
        text.lines()
            .any(|l| l.starts_with(name) && l.contains(what))
    };
    assert!(
        reported("README", "hidden by the encrypted entry"),
        "{text}"
    );
    assert!(reported("twin", "does not list"), "{text}");
    assert!(text.contains("/notes.txt: still plaintext"), "{text}");
    assert!(!out.status.success());
}

#[test]
fn passthrough_serves_plaintext_reads_without_the_daemon() {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        eprintln!("skipped: FUSE passthrough needs a root mount");
        return;
    }
    let big: Vec<u8> = (0..4 << 20).map(|i| (i % 253) as u8).collect();
    let f = adopted_with(|d| std::fs::write(d.join("big.bin"), &big).unwrap());
    // Written in an earlier mount, so that the logged mount has nothing of it cached.
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("enc.bin"), &big).unwrap();
    m.unmount();
    let log = f.tmp.path().join("daemon.log");
    let out = f
        .bin()
        .env("CLOAKFS_LOG", "fuser=debug,cloakfs_fuse=info")
        .args(["mount", "--passfile", s(&f.pass), "--log-file", s(&log)])
        .args([s(&f.cipher), s(&f.mnt)])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let m = MountGuard(f.mnt.clone());
    let plain_ino = std::fs::metadata(f.mnt.join("big.bin")).unwrap().ino();
    let enc_ino = std::fs::metadata(f.mnt.join("enc.bin")).unwrap().ino();
    assert_eq!(std::fs::read(f.mnt.join("big.bin")).unwrap(), big);
    assert_eq!(std::fs::read(f.mnt.join("enc.bin")).unwrap(), big);
    m.unmount();
    let log = std::fs::read_to_string(&log).unwrap();
    let requests = |ino: u64, op: &str| {
        let tag = format!("ino {ino:#018x} {op}");
        log.lines().filter(|l| l.contains(&tag)).count()
    };
    assert!(requests(plain_ino, "OPEN") >= 1, "{log}");
    assert_eq!(
        requests(plain_ino, "READ"),
        0,
        "plaintext reads reached the daemon"
    );
    assert!(
        requests(enc_ino, "READ") >= 1,
        "the encrypted file is read by the daemon"
    );
    assert!(!log.contains("passthrough refused"), "{log}");
}

#[test]
fn encrypt_killed_then_resumed_leaves_every_file_whole() {
    let f = Fixture::bare();
    std::fs::create_dir_all(f.cipher.join("d")).unwrap();
    let content = |i: usize| -> Vec<u8> {
        (0..300_000 + i)
            .map(|j| ((i * 7 + j) % 251) as u8)
            .collect()
    };
    const N: usize = 40;
    for i in 0..N {
        std::fs::write(f.cipher.join(format!("d/f{i:02}.dat")), content(i)).unwrap();
    }
    assert!(f.init(&["--adopt"]).status.success());
    let m = f.mounted(&[]);
    // `d` itself is encrypted (renamed) by the run too, first: a listing of the cipher
    // directory racing that rename may see neither name, so `d` is counted through a
    // descriptor that follows it. Inside it, a converted file's plaintext name goes by unlink.
    let d = std::fs::File::open(f.cipher.join("d")).unwrap();
    let d_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&d));
    let plain_left = || {
        std::fs::read_dir(&d_path)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".dat")
            })
            .count()
    };
    let mut child = f
        .bin()
        .args(["encrypt", "-r", s(&f.mnt.join("d"))])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once some but (most likely) not all files are converted.
    while plain_left() == N && child.try_wait().unwrap().is_none() {
        std::thread::yield_now();
    }
    let _ = child.kill();
    let _ = child.wait();
    let left = plain_left();
    assert!(
        left > 0 && left < N,
        "killed mid-run: {left} of {N} files left"
    );
    for i in 0..N {
        let p = f.mnt.join(format!("d/f{i:02}.dat"));
        assert_eq!(
            std::fs::read(&p).unwrap(),
            content(i),
            "f{i:02} after the kill"
        );
    }
    let out = f.run(&["encrypt", "-r", s(&f.mnt.join("d"))]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(plain_left(), 0);
    for i in 0..N {
        let p = f.mnt.join(format!("d/f{i:02}.dat"));
        assert_eq!(
            std::fs::read(&p).unwrap(),
            content(i),
            "f{i:02} after the resume"
        );
    }
    m.unmount();
    let out = f.run(&["fsck", "--passfile", s(&f.pass), s(&f.cipher)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("still plaintext"), "{text}");
}

#[test]
fn bad_input_is_one_line() {
    let f = Fixture::bare();
    let out = f.init(&["--adopt"]);
    assert_fails(&out, 2, "cannot adopt");
    std::fs::create_dir(&f.cipher).unwrap();
    std::fs::write(f.cipher.join("cloakfs.mine"), "x").unwrap();
    assert_fails(&f.init(&["--adopt"]), 2, "reserves");
    std::fs::remove_file(f.cipher.join("cloakfs.mine")).unwrap();
    // What an `init --adopt` interrupted before its config leaves is written again.
    std::fs::create_dir(f.cipher.join("sub")).unwrap();
    std::fs::write(f.cipher.join("sub/cloakfs.dirid"), [7u8; 16]).unwrap();
    std::fs::write(f.cipher.join("cloakfs.adopted"), "half written").unwrap();
    assert!(f.init(&["--adopt"]).status.success());
    let out = f.run(&["fsck", "--passfile", s(&f.pass), s(&f.cipher)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_fails(&f.init(&["--adopt"]), 2, "already holds a cloakfs volume");
    // Its manifest is under the volume key: no rekey before the conversion finished.
    let out = f.run(&["rekey", "--passfile", s(&f.pass), s(&f.cipher)]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("encrypt them first"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    // encrypt: not on a mount, a directory without -r, a missing path.
    std::fs::write(f.tmp.path().join("loose"), "x").unwrap();
    assert_fails(
        &f.run(&["encrypt", s(&f.tmp.path().join("loose"))]),
        5,
        "not on a cloakfs mount",
    );
    assert_fails(&f.run(&["encrypt", s(f.tmp.path())]), 2, "use -r");
    assert_fails(
        &f.run(&["encrypt", s(&f.tmp.path().join("missing"))]),
        2,
        "No such file",
    );
    // A normal volume's mount does not encrypt in place.
    let n = Fixture::new();
    let m = n.mounted(&[]);
    std::fs::write(n.mnt.join("file"), "x").unwrap();
    assert_fails(
        &n.run(&["encrypt", s(&n.mnt.join("file"))]),
        5,
        "not on a mount of an adopted tree",
    );
    m.unmount();
}

/// `getfattr`'s value of xattr `name` of `path` ("" when it has none).
fn xattr(path: &Path, name: &str) -> String {
    let out = std::process::Command::new("getfattr")
        .args(["--only-values", "-n", name])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

fn set_xattr(path: &Path, name: &str, value: &str) {
    let st = std::process::Command::new("setfattr")
        .args(["-n", name, "-v", value])
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success(), "setfattr {name} on {}", path.display());
}

/// Fails if the xattrs (all namespaces) of a backing entry directly in `dir` contain any of
/// `words`.
fn assert_no_backing_xattr_shows(dir: &Path, words: &[&str]) {
    for n in backing_names(dir) {
        let dump = std::process::Command::new("getfattr")
            .args(["-d", "-m", "-"])
            .arg(dir.join(&n))
            .output()
            .unwrap();
        let dump = String::from_utf8_lossy(&dump.stdout);
        assert!(!words.iter().any(|w| dump.contains(w)), "{n}: {dump}");
    }
}

#[test]
fn plaintext_entries_keep_their_xattrs_as_they_are() {
    let f = adopted();
    set_xattr(&f.cipher.join("notes.txt"), "user.note", "kept");
    let _m = f.mounted(&[]);
    let mnt = &f.mnt;
    // An xattr the plaintext file had is seen through the mount, by its own name.
    assert_eq!(xattr(&mnt.join("notes.txt"), "user.note"), "kept");
    let listed = std::process::Command::new("getfattr")
        .arg("-d")
        .arg(mnt.join("notes.txt"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("user.note=\"kept\""),
        "{}",
        String::from_utf8_lossy(&listed.stdout)
    );
    // One set through the mount on a plaintext file stays plaintext on disk.
    set_xattr(&mnt.join("notes.txt"), "user.added", "through the mount");
    assert_eq!(
        xattr(&f.cipher.join("notes.txt"), "user.added"),
        "through the mount"
    );
    // An encrypted file's xattrs are encrypted, names and values.
    std::fs::write(mnt.join("new.txt"), "encrypted").unwrap();
    set_xattr(&mnt.join("new.txt"), "user.secret", "hidden-value");
    assert_eq!(xattr(&mnt.join("new.txt"), "user.secret"), "hidden-value");
    assert_no_backing_xattr_shows(&f.cipher, &["user.secret", "hidden-value"]);
    // `cloakfs encrypt` carries a plaintext file's xattrs over, encrypted like the rest.
    let out = f
        .bin()
        .args(["encrypt", s(&mnt.join("notes.txt"))])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(xattr(&mnt.join("notes.txt"), "user.note"), "kept");
    assert_eq!(
        xattr(&mnt.join("notes.txt"), "user.added"),
        "through the mount"
    );
    assert!(!f.cipher.join("notes.txt").exists());
    assert_no_backing_xattr_shows(&f.cipher, &["user.note", "kept"]);
}

#[test]
fn export_copies_plaintext_entries_as_they_are_and_decrypts_the_rest() {
    let f = adopted();
    set_xattr(&f.cipher.join("notes.txt"), "user.note", "kept");
    let m = f.mounted(&[]);
    std::fs::write(
        f.mnt.join("docs/new.txt"),
        "encrypted inside a plaintext dir",
    )
    .unwrap();
    std::fs::create_dir(f.mnt.join("fresh")).unwrap();
    std::fs::write(f.mnt.join("fresh/x"), "encrypted dir").unwrap();
    m.unmount();
    let dest = f.tmp.path().join("exported");
    let out = f.run(&["export", "--passfile", s(&f.pass), s(&f.cipher), s(&dest)]);
    assert!(out.status.success(), "export: {}", stderr(&out));
    let read = |p: &str| std::fs::read_to_string(dest.join(p)).unwrap();
    assert_eq!(read("notes.txt"), "plain notes\n");
    assert_eq!(xattr(&dest.join("notes.txt"), "user.note"), "kept");
    assert_eq!(read("README"), "no dot, stored form\n");
    assert_eq!(read("docs/deep/a.md"), "deep file\n");
    assert_eq!(read("docs/new.txt"), "encrypted inside a plaintext dir");
    assert_eq!(read("fresh/x"), "encrypted dir");
    assert_eq!(
        std::fs::read_link(dest.join("link")).unwrap(),
        Path::new("notes.txt")
    );
    assert!(!stderr(&out).contains("not exported"), "{}", stderr(&out));
}

/// Fails if any regular file below backing directory `dir` (cloakfs's own included) holds
/// any of `secrets`.
fn assert_no_backing_file_holds(dir: &Path, secrets: &[&[u8]]) {
    for n in backing_names(dir) {
        let p = dir.join(&n);
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            assert_no_backing_file_holds(&p, secrets);
        } else if m.is_file() {
            let b = std::fs::read(&p).unwrap();
            for s in secrets {
                assert!(
                    !contains(&b, s),
                    "{} holds {:?} in plaintext",
                    p.display(),
                    String::from_utf8_lossy(s)
                );
            }
        }
    }
}

#[test]
fn a_planted_plaintext_file_never_receives_the_users_writes() {
    // Planted by the storage before the adoption, under a name the user will write: the
    // manifest lists it as the user's, so writing encrypts it first.
    let f = adopted_with(|d| std::fs::write(d.join("docs/journal.txt"), "planted\n").unwrap());
    // Planted after: not shown at all, and the user's new file is encrypted beside it.
    std::fs::write(f.cipher.join("passwords.txt"), "").unwrap();
    let m = f.mounted(&[]);
    assert!(!f.mnt.join("passwords.txt").exists());
    std::fs::write(f.mnt.join("passwords.txt"), "hunter2 SECRET-ONE").unwrap();
    let mut a = std::fs::OpenOptions::new()
        .append(true)
        .open(f.mnt.join("docs/journal.txt"))
        .unwrap();
    std::io::Write::write_all(&mut a, b"SECRET-TWO\n").unwrap();
    drop(a);
    assert_eq!(
        std::fs::read_to_string(f.mnt.join("passwords.txt")).unwrap(),
        "hunter2 SECRET-ONE"
    );
    assert_eq!(
        std::fs::read_to_string(f.mnt.join("docs/journal.txt")).unwrap(),
        "planted\nSECRET-TWO\n"
    );
    m.unmount();
    assert_no_backing_file_holds(&f.cipher, &[b"SECRET-ONE", b"SECRET-TWO"]);
    assert_eq!(std::fs::read(f.cipher.join("passwords.txt")).unwrap(), b"");
    assert!(!f.cipher.join("docs/journal.txt").exists());
    // The files are the user's, encrypted, after a remount too.
    let m = f.mounted(&[]);
    assert_eq!(
        std::fs::read_to_string(f.mnt.join("passwords.txt")).unwrap(),
        "hunter2 SECRET-ONE"
    );
    m.unmount();
}

/// The backing name of the entry that `make` adds to the root of `f`'s cipher directory.
fn backing_of_new(f: &Fixture, make: impl FnOnce()) -> String {
    let before = backing_names(&f.cipher);
    make();
    let mut added: Vec<String> = backing_names(&f.cipher)
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    assert_eq!(added.len(), 1, "{added:?}");
    added.remove(0)
}

#[test]
fn a_name_the_volume_knows_as_encrypted_is_never_served_as_plaintext() {
    let f = adopted();
    let m = f.mounted(&[]);
    let backing = backing_of_new(&f, || {
        std::fs::write(f.mnt.join("secret.txt"), "the user's first line\n").unwrap()
    });
    // A listed plaintext file encrypted through the mount.
    let out = f.run(&["encrypt", s(&f.mnt.join("notes.txt"))]);
    assert!(out.status.success(), "{}", stderr(&out));
    let notes = backing_names(&f.cipher)
        .into_iter()
        .find(|n| {
            !n.starts_with("cloakfs.")
                && n != &backing
                && n.len() > 20
                && std::fs::symlink_metadata(f.cipher.join(n)).is_ok_and(|m| m.is_file())
        })
        .expect("the encrypted notes.txt");
    m.unmount();
    // The storage swaps both encrypted files for plaintext under their plaintext names.
    let swap = |backing: &str, name: &str| {
        std::fs::remove_file(f.cipher.join(backing)).unwrap();
        std::fs::write(f.cipher.join(name), "attacker's line\n").unwrap();
    };
    swap(&backing, "secret.txt");
    swap(&notes, "notes.txt");
    let check = |f: &Fixture, opts: &[&str]| {
        let m = f.mounted(opts);
        for name in ["secret.txt", "notes.txt"] {
            let e = std::fs::symlink_metadata(f.mnt.join(name)).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{name} is served");
            let listed = std::fs::read_dir(&f.mnt)
                .unwrap()
                .any(|e| e.unwrap().file_name() == name);
            assert!(!listed, "{name} is listed");
        }
        // The user's next write goes into an encrypted file.
        std::fs::write(f.mnt.join("secret.txt"), "SECRET-THREE\n").unwrap();
        m.unmount();
        assert_no_backing_file_holds(&f.cipher, &[b"SECRET-THREE"]);
        assert_eq!(
            std::fs::read_to_string(f.cipher.join("secret.txt")).unwrap(),
            "attacker's line\n"
        );
        let out = f.run(&["fsck", "--passfile", s(&f.pass), s(&f.cipher)]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("does not list"), "{text}");
        assert!(!out.status.success());
    };
    check(&f, &[]);
    // A retired entry stays retired where the volume's records are deleted: this machine
    // keeps its own copy.
    std::fs::remove_dir_all(f.cipher.join("cloakfs.adopted.retired")).unwrap();
    let m = f.mounted(&[]);
    assert!(
        !f.mnt.join("notes.txt").exists(),
        "served once the records went"
    );
    m.unmount();
}

#[test]
fn a_plaintext_file_that_cannot_be_encrypted_is_not_opened_for_writing() {
    let f = adopted_with(|d| {
        std::fs::hard_link(d.join("notes.txt"), d.join("notes.bak")).unwrap();
        std::fs::write(d.join("open.txt"), "kept\n").unwrap();
    });
    let m = f.mounted(&[]);
    let write = |name: &str| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(f.mnt.join(name))
            .map(drop)
    };
    // Its other name would keep the plaintext.
    let e = write("notes.txt").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EMLINK), "{e}");
    // Open elsewhere: that handle would go on with the plaintext.
    let reader = std::fs::File::open(f.mnt.join("open.txt")).unwrap();
    let e = write("open.txt").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBUSY), "{e}");
    drop(reader);
    write("open.txt").unwrap();
    assert!(!f.cipher.join("open.txt").exists());
    assert_eq!(
        std::fs::read_to_string(f.mnt.join("open.txt")).unwrap(),
        "kept\n"
    );
    assert_eq!(
        std::fs::read_to_string(f.cipher.join("notes.txt")).unwrap(),
        "plain notes\n"
    );
    m.unmount();
}

#[test]
fn after_encrypt_r_no_plaintext_entry_is_accepted_unless_the_user_says_so() {
    // A long symlink target and long names: stored apart (FORMAT 9.3, 10.1).
    let long_target = "t".repeat(300);
    let long_dir = "d".repeat(200);
    let f = adopted_with(|d| {
        let st = std::process::Command::new("mkfifo")
            .arg(d.join("pipe"))
            .status()
            .unwrap();
        assert!(st.success());
        std::os::unix::fs::symlink(&long_target, d.join("docs/longlink")).unwrap();
        std::fs::create_dir(d.join("docs").join(&long_dir)).unwrap();
        std::fs::write(d.join("docs").join(&long_dir).join("in.txt"), "in\n").unwrap();
    });
    let m = f.mounted(&[]);
    let backing = backing_of_new(&f, || {
        std::fs::write(f.mnt.join("secret.txt"), "the user's secret\n").unwrap()
    });
    let out = f.run(&["encrypt", "-r", s(&f.mnt)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("no plaintext entry is left"), "{said}");
    // The mount wrote the converted config itself, and takes it as its own: it writes on.
    std::fs::write(f.mnt.join("after.txt"), "after the conversion\n").unwrap();
    std::fs::remove_file(f.mnt.join("after.txt")).unwrap();
    // Files, directories, the symlink and the fifo are encrypted entries now, unchanged.
    let read = |p: &str| std::fs::read_to_string(f.mnt.join(p)).unwrap();
    assert_eq!(read("notes.txt"), "plain notes\n");
    assert_eq!(read("docs/deep/a.md"), "deep file\n");
    assert_eq!(
        std::fs::read_link(f.mnt.join("link")).unwrap(),
        PathBuf::from("notes.txt")
    );
    assert_eq!(
        std::fs::read_link(f.mnt.join("docs/longlink")).unwrap(),
        PathBuf::from(&long_target)
    );
    assert_eq!(read(&format!("docs/{long_dir}/in.txt")), "in\n");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(f.mnt.join("pipe"))
        .unwrap()
        .file_type()
        .is_fifo());
    m.unmount();
    for n in backing_names(&f.cipher) {
        assert!(
            n.starts_with("cloakfs.") || !n.contains('.') && n.len() > 20,
            "plaintext name left: {n}"
        );
    }
    let out = f.run(&["fsck", "--passfile", s(&f.pass), s(&f.cipher)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The storage swaps the encrypted file for plaintext and plants more.
    std::fs::remove_file(f.cipher.join(&backing)).unwrap();
    std::fs::write(f.cipher.join("secret.txt"), "attacker's secret\n").unwrap();
    std::fs::write(f.cipher.join("passwords.txt"), "").unwrap();
    std::fs::create_dir(f.cipher.join("planted")).unwrap();
    std::fs::write(f.cipher.join("planted/x.txt"), "planted\n").unwrap();
    let m = f.mounted(&[]);
    for p in ["secret.txt", "passwords.txt", "planted"] {
        let e = std::fs::symlink_metadata(f.mnt.join(p)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{p}");
    }
    let mut listed: Vec<String> = std::fs::read_dir(&f.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    listed.sort();
    assert_eq!(listed, ["README", "docs", "link", "notes.txt", "pipe"]);
    std::fs::write(f.mnt.join("passwords.txt"), "SECRET-FOUR").unwrap();
    assert_eq!(read("passwords.txt"), "SECRET-FOUR");
    m.unmount();
    assert_no_backing_file_holds(&f.cipher, &[b"SECRET-FOUR"]);
    let out = f.run(&["fsck", "--passfile", s(&f.pass), s(&f.cipher)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    for planted in ["secret.txt", "passwords.txt", "planted"] {
        assert!(text.contains(planted), "{planted} not reported: {text}");
    }
    // The user's explicit opt-in serves them, and encrypts them again.
    let m = f.mounted(&["--accept-plaintext"]);
    assert_eq!(read("secret.txt"), "attacker's secret\n");
    assert_eq!(read("planted/x.txt"), "planted\n");
    let out = f.run(&["encrypt", "-r", s(&f.mnt.join("planted"))]);
    assert!(out.status.success(), "{}", stderr(&out));
    m.unmount();
    assert!(!f.cipher.join("planted").exists());
    // Recorded under the config MAC.
    let config = std::fs::read_to_string(f.cipher.join("cloakfs.conf")).unwrap();
    assert!(
        config.contains("\"plaintext_entries\": \"converted\""),
        "{config}"
    );
}

#[test]
fn encrypt_r_records_no_conversion_while_plaintext_is_left() {
    use std::os::unix::ffi::OsStrExt;
    // A name that is not UTF-8 is not served, so encrypt -r cannot see it.
    let odd = std::ffi::OsStr::from_bytes(b"caf\xe9.txt");
    let f = adopted_with(|d| std::fs::write(d.join(odd), "unseen\n").unwrap());
    let m = f.mounted(&[]);
    let out = f.run(&["encrypt", "-r", s(&f.mnt)]);
    assert_fails(&out, 5, "plaintext entries are left");
    m.unmount();
    let config = std::fs::read_to_string(f.cipher.join("cloakfs.conf")).unwrap();
    assert!(config.contains("\"listed\""), "{config}");
    // A directory with extended attributes is not renamed into an encrypted one.
    let f = adopted_with(|d| {
        std::fs::create_dir(d.join("tagged")).unwrap();
        set_xattr(&d.join("tagged"), "user.tag", "x");
    });
    let m = f.mounted(&[]);
    let out = f.run(&["encrypt", "-r", s(&f.mnt)]);
    assert_fails(&out, 5, "extended attributes");
    m.unmount();
    assert_eq!(xattr(&f.cipher.join("tagged"), "user.tag"), "x");
}

#[test]
fn a_plaintext_file_planted_after_adoption_is_never_shown() {
    let f = adopted();
    // Planted by the storage: a file under a name the user will use, one in a listed
    // plaintext directory, and a directory of its own.
    std::fs::write(f.cipher.join("passwords.txt"), "attacker's bytes\n").unwrap();
    std::fs::write(f.cipher.join("docs/deep/b.md"), "attacker's bytes\n").unwrap();
    std::fs::create_dir(f.cipher.join("planted")).unwrap();
    std::fs::write(f.cipher.join("planted/x.txt"), "attacker's bytes\n").unwrap();
    let m = f.mounted(&[]);
    assert_eq!(
        backing_names(&f.mnt),
        ["README", "docs", "link", "notes.txt"]
    );
    assert_eq!(backing_names(&f.mnt.join("docs/deep")), ["a.md"]);
    for p in [
        "passwords.txt",
        "docs/deep/b.md",
        "planted",
        "planted/x.txt",
    ] {
        let e = std::fs::symlink_metadata(f.mnt.join(p)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{p} is served");
    }
    // The user's file of that name is a new encrypted one.
    std::fs::write(f.mnt.join("passwords.txt"), "SECRET-FIVE").unwrap();
    assert_eq!(
        std::fs::read_to_string(f.mnt.join("passwords.txt")).unwrap(),
        "SECRET-FIVE"
    );
    m.unmount();
    assert_no_backing_file_holds(&f.cipher, &[b"SECRET-FIVE"]);
    let out = f.run(&["fsck", "--passfile", s(&f.pass), s(&f.cipher)]);
    let text = String::from_utf8_lossy(&out.stdout);
    for p in ["passwords.txt", "b.md", "planted"] {
        assert!(
            text.lines()
                .any(|l| l.contains(p) && l.contains("does not list")),
            "{p} not reported: {text}"
        );
    }
    assert!(!out.status.success());
    let dest = f.tmp.path().join("exported");
    let out = f.run(&["export", "--passfile", s(&f.pass), s(&f.cipher), s(&dest)]);
    assert!(out.status.success(), "export: {}", stderr(&out));
    assert!(!dest.join("planted").exists());
    assert_eq!(
        std::fs::read_to_string(dest.join("passwords.txt")).unwrap(),
        "SECRET-FIVE"
    );
    // A conversion of everything shown finishes: the planted entries are not the user's.
    let m = f.mounted(&[]);
    let out = f.run(&["encrypt", "-r", s(&f.mnt)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(backing_names(&f.mnt.join("docs/deep")), ["a.md"]);
    m.unmount();
    let config = std::fs::read_to_string(f.cipher.join("cloakfs.conf")).unwrap();
    assert!(config.contains("\"converted\""), "{config}");
}

#[test]
fn renamed_plaintext_entries_are_encrypted_and_stay_readable() {
    let f = adopted();
    let m = f.mounted(&[]);
    std::fs::create_dir(f.mnt.join("archive")).unwrap();
    // A file into another directory, a directory with its entries, a symlink.
    std::fs::rename(f.mnt.join("notes.txt"), f.mnt.join("archive/notes.txt")).unwrap();
    std::fs::rename(f.mnt.join("docs"), f.mnt.join("papers")).unwrap();
    std::fs::rename(f.mnt.join("link"), f.mnt.join("archive/link")).unwrap();
    let check = |mnt: &Path| {
        assert_eq!(
            std::fs::read_to_string(mnt.join("archive/notes.txt")).unwrap(),
            "plain notes\n"
        );
        assert_eq!(
            std::fs::read_to_string(mnt.join("papers/deep/a.md")).unwrap(),
            "deep file\n"
        );
        assert_eq!(
            std::fs::read_link(mnt.join("archive/link")).unwrap(),
            PathBuf::from("notes.txt")
        );
        assert!(!mnt.join("notes.txt").exists() && !mnt.join("docs").exists());
    };
    check(&f.mnt);
    // Written again under its new name: the write reaches the file.
    std::fs::write(f.mnt.join("archive/notes.txt"), "plain notes\n").unwrap();
    m.unmount();
    let names = backing_names(&f.cipher);
    for gone in ["notes.txt", "docs", "papers", "link", "archive"] {
        assert!(!names.contains(&gone.to_string()), "{gone}: {names:?}");
    }
    assert_no_backing_file_holds(&f.cipher, &[b"plain notes"]);
    let m = f.mounted(&[]);
    check(&f.mnt);
    m.unmount();
    let out = f.run(&["fsck", "--passfile", s(&f.pass), s(&f.cipher)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("does not list"), "{text}");
}

#[test]
fn upgrade_lists_an_older_adopted_tree() {
    // Made as cloakfs made adopted trees before manifests.
    let f = Fixture::bare();
    std::fs::create_dir_all(f.cipher.join("docs")).unwrap();
    std::fs::write(f.cipher.join("docs/a.md"), "mine\n").unwrap();
    let out = f
        .bin()
        .env("CLOAKFS_TEST_ADOPT_UNLISTED", "1")
        .args(["init", "--passfile", s(&f.pass)])
        .args(CHEAP_KDF)
        .args(["--adopt", s(&f.cipher)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let config = std::fs::read_to_string(f.cipher.join("cloakfs.conf")).unwrap();
    assert!(config.contains("\"adopted\""), "{config}");
    // Such a tree serves what is planted, and says so.
    std::fs::write(f.cipher.join("early.txt"), "planted before the upgrade\n").unwrap();
    let out = f.mount(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let m = MountGuard(f.mnt.clone());
    assert!(
        stderr(&out).contains("run `cloakfs upgrade`"),
        "{}",
        stderr(&out)
    );
    assert!(f.mnt.join("early.txt").exists());
    m.unmount();
    let out = f.run(&["fsck", "--passfile", s(&f.pass), s(&f.cipher)]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("cloakfs upgrade"));
    let out = f.run(&["upgrade", "--passfile", s(&f.pass), s(&f.cipher)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("listed its 3 plaintext entries"), "{said}");
    let out = f.run(&["upgrade", "--passfile", s(&f.pass), s(&f.cipher)]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("current format already"));
    // What it held is served; what is planted from now on is not.
    std::fs::write(f.cipher.join("late.txt"), "planted after\n").unwrap();
    let out = f.mount(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let m = MountGuard(f.mnt.clone());
    assert!(!stderr(&out).contains("Warning"), "{}", stderr(&out));
    assert_eq!(backing_names(&f.mnt), ["docs", "early.txt"]);
    assert_eq!(
        std::fs::read_to_string(f.mnt.join("docs/a.md")).unwrap(),
        "mine\n"
    );
    m.unmount();
}

#[test]
fn a_changed_manifest_shows_no_plaintext_until_the_user_accepts_it() {
    let f = adopted();
    let other = adopted();
    // Another volume's manifest (a valid one, under another key), then a cut one.
    for bad in [
        std::fs::read(other.cipher.join("cloakfs.adopted")).unwrap(),
        std::fs::read(f.cipher.join("cloakfs.adopted")).unwrap()[..40].to_vec(),
    ] {
        std::fs::write(f.cipher.join("cloakfs.adopted"), &bad).unwrap();
        let out = f.mount(&[]);
        assert!(out.status.success(), "{}", stderr(&out));
        let m = MountGuard(f.mnt.clone());
        assert!(
            stderr(&out).contains("no plaintext entry is shown"),
            "{}",
            stderr(&out)
        );
        assert_eq!(backing_names(&f.mnt), Vec::<String>::new());
        // A conversion is not recorded as finished: the entries are hidden, not gone.
        let out = f.run(&["encrypt", "-r", s(&f.mnt)]);
        assert!(!out.status.success());
        m.unmount();
        let out = f.run(&["fsck", "--passfile", s(&f.pass), s(&f.cipher)]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("cloakfs.adopted"), "{text}");
        assert!(!out.status.success());
    }
    // The user's explicit opt-in serves them all.
    let m = f.mounted(&["--accept-plaintext"]);
    assert_eq!(
        std::fs::read_to_string(f.mnt.join("notes.txt")).unwrap(),
        "plain notes\n"
    );
    m.unmount();
    let config = std::fs::read_to_string(f.cipher.join("cloakfs.conf")).unwrap();
    assert!(config.contains("\"listed\""), "{config}");
}
