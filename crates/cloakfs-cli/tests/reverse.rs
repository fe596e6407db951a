//! The reverse view (`cloakfs init --reverse`, `cloakfs reverse`) on real FUSE mounts: backed
//! up with rsync, the copy mounted as an ordinary volume and compared with `diff -r`, only the
//! changed file sent again, tampering read as EIO, and bad input refused in one line.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A plaintext tree, its reverse config (inside it, the default place) and the directories a
/// test needs: the view's mount point, the backup and the backup's mount point.
struct Reverse {
    f: Fixture,
    plain: PathBuf,
    view: PathBuf,
    backup: PathBuf,
}

impl Reverse {
    /// A plaintext tree of every entry type a volume holds, with a reverse config.
    fn new() -> Self {
        let f = Fixture::bare();
        let plain = f.tmp.path().join("plain");
        let view = f.tmp.path().join("view");
        let backup = f.tmp.path().join("backup");
        std::fs::create_dir_all(plain.join("sub/deeper")).unwrap();
        std::fs::create_dir(&view).unwrap();
        std::fs::write(plain.join("hello.txt"), "hello, backup\n").unwrap();
        std::fs::write(plain.join("empty"), "").unwrap();
        // Several blocks and a partial last one.
        let big: Vec<u8> = (0..3 * 4096 + 123).map(|i| (i % 251) as u8).collect();
        std::fs::write(plain.join("sub/big.bin"), &big).unwrap();
        std::fs::write(plain.join("sub/deeper/note"), "deep\n").unwrap();
        std::fs::write(plain.join("sub/twin"), "deep\n").unwrap();
        std::fs::write(plain.join("l".repeat(200)), "a long name\n").unwrap();
        std::os::unix::fs::symlink("sub/big.bin", plain.join("link")).unwrap();
        let r = Self {
            f,
            plain,
            view,
            backup,
        };
        let out = r.init(&[]);
        assert!(out.status.success(), "init --reverse: {}", stderr(&out));
        r
    }

    fn init(&self, extra: &[&str]) -> std::process::Output {
        self.f.run(
            &[
                &["init", "--reverse", "--passfile", s(&self.f.pass)],
                &CHEAP_KDF[..],
                extra,
                &[s(&self.plain)],
            ]
            .concat(),
        )
    }

    fn reverse(&self, extra: &[&str]) -> std::process::Output {
        self.f.run(
            &[
                &["reverse", "--passfile", s(&self.f.pass)],
                extra,
                &[s(&self.plain), s(&self.view)],
            ]
            .concat(),
        )
    }

    /// Mounts the view and asserts success.
    fn mounted(&self) -> MountGuard {
        let out = self.reverse(&[]);
        assert!(out.status.success(), "reverse: {}", stderr(&out));
        assert!(is_mounted(&self.view));
        MountGuard(self.view.clone())
    }

    /// `rsync -a VIEW/ BACKUP/`: the regular files it sent, of the tree and of the view's own
    /// (the config, directory IDs, long names' sidecars).
    fn rsync(&self) -> (u64, u64) {
        let out = Command::new("rsync")
            .args(["-a", "--itemize-changes"])
            .arg(format!("{}/", s(&self.view)))
            .arg(format!("{}/", s(&self.backup)))
            .output()
            .unwrap();
        assert!(out.status.success(), "rsync: {}", stderr(&out));
        let (own, tree): (Vec<&str>, Vec<&str>) = std::str::from_utf8(&out.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix(">f").and_then(|l| l.split_once(' ')))
            .map(|(_, path)| path)
            .partition(|path| {
                let name = path.rsplit('/').next().unwrap_or(path);
                name == "cloakfs.conf"
                    || name == "cloakfs.dirid"
                    || name.starts_with("cloakfs.long.") && name.ends_with(".name")
            });
        (tree.len() as u64, own.len() as u64)
    }

    /// Mounts the backup as an ordinary volume at the fixture's mount point.
    fn mount_backup(&self) -> MountGuard {
        let out = self.f.run(&[
            "mount",
            "--passfile",
            s(&self.f.pass),
            s(&self.backup),
            s(&self.f.mnt),
        ]);
        assert!(
            out.status.success(),
            "mount of the backup: {}",
            stderr(&out)
        );
        MountGuard(self.f.mnt.clone())
    }
}

/// Every file and symlink under `root` (relative path -> content or target).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                out.insert(rel, b"<dir>".to_vec());
                todo.push(p);
            } else if t.is_symlink() {
                let target = std::fs::read_link(&p).unwrap();
                out.insert(rel, target.into_os_string().into_encoded_bytes());
            } else {
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

#[test]
fn reverse_view_backed_up_with_rsync_mounts_as_the_original_tree() {
    let r = Reverse::new();
    let view = r.mounted();
    // The config inside the plaintext directory is not part of the view.
    let names: Vec<String> = std::fs::read_dir(&r.view)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.iter().any(|n| n == "cloakfs.conf"), "{names:?}");
    assert!(!names
        .iter()
        .any(|n| n.contains("hello") || n.contains("reverse")));
    assert_eq!(names.len(), 7, "{names:?}"); // conf, 5 entries, one long-name sidecar
                                             // conf, sidecar, 6 plaintext files, 2 cloakfs.dirid
    assert_eq!(
        r.rsync(),
        (6, 4),
        "the tree's six files; conf, sidecar, 2 directory IDs"
    );
    view.unmount();

    let m = r.mount_backup();
    let diff = Command::new("diff")
        .args([
            "-r",
            "--no-dereference",
            "--exclude",
            ".cloakfs.reverse.conf",
        ])
        .arg(&r.plain)
        .arg(&r.f.mnt)
        .output()
        .unwrap();
    assert!(
        diff.status.success(),
        "diff -r: {}{}",
        String::from_utf8_lossy(&diff.stdout),
        stderr(&diff)
    );
    m.unmount();

    // `cloakfs cat` decrypts from the copy without a mount.
    let cat = r.f.run(&[
        "cat",
        "--passfile",
        s(&r.f.pass),
        s(&r.backup),
        "sub/deeper/note",
    ]);
    assert!(cat.status.success(), "cat: {}", stderr(&cat));
    assert_eq!(cat.stdout, b"deep\n");
    // And fsck finds an ordinary, sound volume.
    let fsck = r.f.run(&["fsck", "--passfile", s(&r.f.pass), s(&r.backup)]);
    assert!(
        fsck.status.success(),
        "fsck: {}{}",
        stderr(&fsck),
        String::from_utf8_lossy(&fsck.stdout)
    );
}

#[test]
fn reverse_view_is_deterministic_and_rsync_sends_only_what_changed() {
    let r = Reverse::new();
    let view = r.mounted();
    let first = snapshot(&r.view);
    assert_eq!(
        r.rsync(),
        (6, 4),
        "the tree's six files; conf, sidecar, 2 directory IDs"
    );
    view.unmount();

    let view = r.mounted();
    assert_eq!(snapshot(&r.view), first, "a second mount shows other bytes");
    // Equal files in different places differ in the view (their IDs come from their paths).
    let backing: Vec<&Vec<u8>> = first
        .values()
        .filter(|v| v.len() == 18 + 5 + 16 + 12)
        .collect();
    assert_eq!(backing.len(), 2, "note and twin");
    assert_ne!(backing[0], backing[1]);
    assert_eq!(r.rsync(), (0, 0), "nothing changed");

    // Changes while the view stays mounted and was just listed: the next backup sees the
    // tree as it is now, sizes and times included (an append keeps the name and type).
    std::fs::write(r.plain.join("sub/deeper/note"), "changed\n").unwrap();
    assert_eq!(r.rsync(), (1, 0), "only the changed file");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(r.plain.join("hello.txt"))
        .unwrap();
    std::io::Write::write_all(&mut f, b"x\n").unwrap();
    drop(f);
    assert_eq!(r.rsync(), (1, 0), "the appended file");
    std::fs::rename(r.plain.join("empty"), r.plain.join("renamed")).unwrap();
    // The view's own files keep their times when their directory changes (its time set
    // apart from the rename's second, as a later rename would): not sent again.
    let touched = Command::new("touch")
        .args(["-m", "-d", "@1000000000"])
        .arg(&r.plain)
        .status()
        .unwrap();
    assert!(touched.success());
    assert_eq!(r.rsync(), (1, 0), "the renamed file, under its new name");
    view.unmount();

    let m = r.mount_backup();
    assert_eq!(
        std::fs::read(r.f.mnt.join("sub/deeper/note")).unwrap(),
        b"changed\n"
    );
    assert_eq!(
        std::fs::read(r.f.mnt.join("hello.txt")).unwrap(),
        b"hello, backup\nx\n"
    );
    assert!(r.f.mnt.join("renamed").exists());
    m.unmount();
}

#[test]
fn tampered_backup_reads_eio() {
    let r = Reverse::new();
    let view = r.mounted();
    r.rsync();
    view.unmount();
    // The largest backing file is sub/big.bin's: flip one byte of its second block.
    let big = snapshot(&r.backup)
        .into_iter()
        .max_by_key(|(_, v)| v.len())
        .unwrap()
        .0;
    let path = r.backup.join(big);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[18 + 4096 + 28 + 100] ^= 1;
    std::fs::write(&path, bytes).unwrap();

    let m = r.mount_backup();
    let err = std::fs::read(r.f.mnt.join("sub/big.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert_eq!(
        std::fs::read(r.f.mnt.join("hello.txt")).unwrap(),
        b"hello, backup\n"
    );
    m.unmount();
}

#[test]
fn reverse_view_is_read_only() {
    let r = Reverse::new();
    let _view = r.mounted();
    let err = std::fs::write(r.view.join("new"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let err = std::fs::OpenOptions::new()
        .write(true)
        .open(r.view.join("cloakfs.conf"))
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
}

#[test]
fn reverse_config_elsewhere_with_config_flag() {
    let r = Reverse::new();
    let conf = r.f.tmp.path().join("view.conf");
    let other = r.f.tmp.path().join("plain2");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("x"), "x").unwrap();
    let out = r.f.run(
        &[
            &["init", "--reverse", "--passfile", s(&r.f.pass)],
            &CHEAP_KDF[..],
            &["--long-name-max", "100", "--config", s(&conf), s(&other)],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&conf).unwrap();
    assert!(text.contains(r#""long_name_max": "100""#), "{text}");
    assert!(!other.join(".cloakfs.reverse.conf").exists());
    let out = r.f.run(&[
        "reverse",
        "--passfile",
        s(&r.f.pass),
        "--config",
        s(&conf),
        s(&other),
        s(&r.view),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let _view = MountGuard(r.view.clone());
    assert_eq!(std::fs::read_dir(&r.view).unwrap().count(), 2); // conf and x
}

#[test]
fn reverse_bad_input_is_refused_in_one_line() {
    let r = Reverse::new();
    // init --reverse: a config already there, a cipher without derived nonces, no directory.
    assert_fails(&r.init(&[]), 3, "already exists");
    let conf = r.f.tmp.path().join("c.conf");
    assert_fails(
        &r.init(&["--config", s(&conf), "--cipher", "aes-256-gcm"]),
        2,
        "only aes-256-gcm-siv",
    );
    let missing = r.f.tmp.path().join("missing");
    let out = r.f.run(
        &[
            &["init", "--reverse", "--passfile", s(&r.f.pass)],
            &CHEAP_KDF[..],
            &[s(&missing)],
        ]
        .concat(),
    );
    assert_fails(&out, 2, "is not a directory");

    // reverse: the view inside the plaintext, no config, an ordinary volume's config, a
    // wrong passphrase.
    let inside = r.plain.join("sub");
    let out = r.f.run(&[
        "reverse",
        "--passfile",
        s(&r.f.pass),
        s(&r.plain),
        s(&inside),
    ]);
    assert_fails(&out, 2, "may not lie inside");
    let gone = r.f.tmp.path().join("gone");
    let out =
        r.f.run(&["reverse", "--passfile", s(&r.f.pass), s(&gone), s(&r.view)]);
    assert_fails(&out, 3, "plaintext directory");
    let out =
        r.f.run(&["reverse", "--passfile", s(&r.f.pass), s(&r.plain), s(&gone)]);
    assert_fails(&out, 4, "view mount point");
    let out = r.f.run(&[
        "reverse",
        "--passfile",
        s(&r.f.pass),
        "--config",
        s(&conf),
        s(&r.plain),
        s(&r.view),
    ]);
    assert_fails(&out, 3, "make one with cloakfs init --reverse");
    let normal = Fixture::new();
    let out = r.f.run(&[
        "reverse",
        "--passfile",
        s(&r.f.pass),
        "--config",
        s(&normal.cipher.join("cloakfs.conf")),
        s(&r.plain),
        s(&r.view),
    ]);
    assert_fails(&out, 3, "is not a reverse config");
    let wrong = r.f.write_pass("not the passphrase");
    let out =
        r.f.run(&["reverse", "--passfile", s(&wrong), s(&r.plain), s(&r.view)]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!is_mounted(&r.view));
}

#[test]
fn reverse_view_reports_what_it_cannot_show() {
    let r = Reverse::new();
    // A symlink target an ordinary volume stores apart (FORMAT 10.1: over 3000 bytes), which
    // the view cannot show.
    let far = format!("/{}", "d/".repeat(1600));
    std::os::unix::fs::symlink(&far, r.plain.join("far")).unwrap();
    let _view = r.mounted();
    let stored = std::fs::read_dir(&r.view)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.symlink_metadata().is_err())
        .expect("the too-long symlink is listed, and its lstat fails");
    let err = stored.symlink_metadata().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENAMETOOLONG), "{err}");

    // A plaintext file that shrinks while the view reads it: EIO, never a mix of sizes.
    let big_view = std::fs::read_dir(&r.view)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap();
    let backing = std::fs::read_dir(&big_view)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| p.metadata().unwrap().len())
        .unwrap();
    let mut f = std::fs::File::open(&backing).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(r.plain.join("sub/big.bin"))
        .unwrap()
        .set_len(100)
        .unwrap();
    let mut buf = Vec::new();
    let err = std::io::Read::read_to_end(&mut f, &mut buf).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
}

#[test]
fn long_names_created_or_renamed_under_a_mounted_view() {
    let r = Reverse::new();
    let _view = r.mounted();
    let long_entries = || -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&r.view)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let n = p.file_name().unwrap().to_str().unwrap();
                n.starts_with("cloakfs.long.") && !n.ends_with(".name")
            })
            .collect();
        v.sort();
        v
    };
    let before = long_entries();
    assert_eq!(before.len(), 1);
    assert_eq!(std::fs::read(&before[0]).unwrap().len(), 18 + 12 + 28);

    // A second long name appears after the view learned the directory's long names.
    std::fs::write(r.plain.join("m".repeat(190)), "another\n").unwrap();
    let after = long_entries();
    assert_eq!(after.len(), 2);
    for p in &after {
        assert!(std::fs::metadata(p).unwrap().len() > 18, "{p:?}");
    }
    // The first one is renamed away: its old backing name is gone.
    std::fs::rename(r.plain.join("l".repeat(200)), r.plain.join("short")).unwrap();
    let gone = before[0].clone();
    // The kernel may still hold the name, but the view no longer serves its bytes.
    assert!(
        std::fs::read(&gone).is_err(),
        "a renamed long name still served"
    );
    assert_eq!(long_entries().len(), 1);
}
