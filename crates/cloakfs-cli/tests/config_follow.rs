//! A mount follows its volume's config (`cloakfs.conf`) changed under it, as a sync client
//! delivers another device's `passwd` or `rekey`: device A mounts its cipher directory,
//! device B is a copy of it changed offline, and B's files are copied over A's as a sync
//! client would (each file written aside and renamed into place, what B no longer has
//! removed).

mod common;

use common::*;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Longest wait for the mount to notice a change (it looks at most once a second).
const NOTICE: Duration = Duration::from_secs(20);

/// Device A: a volume mounted with a log file, holding a few files; and B, a copy of its
/// cipher directory.
struct Devices {
    a: Fixture,
    b: PathBuf,
    log: PathBuf,
}

/// Plaintext files of the volume and their contents.
const FILES: [(&str, &str); 3] = [
    ("top.txt", "at the top\n"),
    ("docs/one.txt", "one in docs\n"),
    ("docs/two.txt", "two in docs\n"),
];

impl Devices {
    fn new() -> (Self, MountGuard) {
        let a = Fixture::new();
        let log = a.tmp.path().join("mount.log");
        let b = a.tmp.path().join("device-b");
        let devices = Self { a, b, log };
        let m = devices.mount(&devices.a.pass);
        std::fs::create_dir(devices.a.mnt.join("docs")).unwrap();
        for (path, content) in FILES {
            std::fs::write(devices.a.mnt.join(path), content).unwrap();
        }
        let out = std::process::Command::new("cp")
            .arg("-a")
            .arg(&devices.a.cipher)
            .arg(&devices.b)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        (devices, m)
    }

    /// Mounts A with passfile `pass`, logging (info and up) to `self.log`.
    fn mount(&self, pass: &Path) -> MountGuard {
        let out = self
            .a
            .bin()
            .env("CLOAKFS_LOG", "warn,cloakfs_fuse=info")
            .args(["mount", "--passfile", s(pass), "--log-file", s(&self.log)])
            .args([s(&self.a.cipher), s(&self.a.mnt)])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "mount: {}", stderr(&out));
        MountGuard(self.a.mnt.clone())
    }

    /// Runs `cloakfs ARGS... B` on device B.
    fn on_b(&self, args: &[&str]) {
        let out = self.a.run(&[args, &[s(&self.b)]].concat());
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }

    /// Log lines of A's mount that contain `needle`.
    fn logged(&self, needle: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Asks A's mount for a change that uses no key (its root's times) until `done` holds:
    /// the mount looks at its config before a change, at most once a second.
    fn touch_until(&self, what: &str, mut done: impl FnMut(&std::io::Result<()>) -> bool) {
        let start = Instant::now();
        loop {
            let r = std::fs::File::open(&self.a.mnt)
                .and_then(|d| d.set_modified(std::time::SystemTime::now()));
            if done(&r) {
                return;
            }
            assert!(start.elapsed() < NOTICE, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Makes `dst` hold what `src` holds, as a sync client would: every file of `src` copied
/// aside and renamed into place (the config last, like any other file), every entry that
/// `src` does not have removed. Directories are kept where both have them.
fn mirror(src: &Path, dst: &Path) {
    let names = |d: &Path| -> Vec<std::ffi::OsString> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect()
    };
    let theirs = names(src);
    for name in names(dst) {
        if !theirs.contains(&name) {
            let p = dst.join(&name);
            if p.symlink_metadata().unwrap().is_dir() {
                std::fs::remove_dir_all(&p).unwrap();
            } else {
                std::fs::remove_file(&p).unwrap();
            }
        }
    }
    let mut theirs = theirs;
    theirs.sort_by_key(|n| n == "cloakfs.conf");
    for name in theirs {
        let (from, to) = (src.join(&name), dst.join(&name));
        let meta = from.symlink_metadata().unwrap();
        if meta.is_dir() {
            if !to.is_dir() {
                std::fs::create_dir(&to).unwrap();
            }
            mirror(&from, &to);
        } else {
            replace_file(&to, &std::fs::read(&from).unwrap());
        }
    }
}

/// Every path under `dir`, relative to it, sorted.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        for e in std::fs::read_dir(dir.join(&rel)).unwrap() {
            let e = e.unwrap();
            let p = rel.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                pending.push(p.clone());
            }
            all.push(p);
        }
    }
    all.sort();
    all
}

/// Writes `bytes` aside and renames them over `path`.
fn replace_file(path: &Path, bytes: &[u8]) {
    let aside = path.with_file_name(".sync-tmp");
    std::fs::write(&aside, bytes).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

/// `passwd` on B and its config delivered to A: only key slots changed, so A's mount says so
/// once and goes on writing; a remount with the new passphrase reads what it wrote.
#[test]
fn a_mount_goes_on_writing_when_only_key_slots_changed() {
    let (dev, m) = Devices::new();
    let new_pass = dev.a.write_pass("a new passphrase for b");
    dev.on_b(&[
        "passwd",
        "--passfile",
        s(&dev.a.pass),
        "--new-passfile",
        s(&new_pass),
    ]);
    let conf = std::fs::read(dev.b.join("cloakfs.conf")).unwrap();
    replace_file(&dev.a.cipher.join("cloakfs.conf"), &conf);
    dev.touch_until("the mount noticed the new slots", |r| {
        r.is_ok() && dev.logged("key slots changed") > 0
    });
    std::fs::write(dev.a.mnt.join("docs/after.txt"), "written after\n").unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(dev.a.mnt.join("top.txt"))
        .unwrap()
        .write_all(b"and more\n")
        .unwrap();
    m.unmount();
    assert_eq!(dev.logged("key slots changed"), 1);
    assert_eq!(dev.logged("writes are refused"), 0);

    // A's volume now opens with B's new passphrase, and holds what was written after.
    let _m = dev.mount(&new_pass);
    assert_eq!(
        std::fs::read_to_string(dev.a.mnt.join("top.txt")).unwrap(),
        "at the top\nand more\n"
    );
    assert_eq!(
        std::fs::read_to_string(dev.a.mnt.join("docs/after.txt")).unwrap(),
        "written after\n"
    );
}

/// `rekey` (and `passwd`) on B, and B's files and config delivered to A: A's mount, still
/// holding the old master key, refuses every change with EROFS and says once why, never
/// writing under the old key; files it holds open still read. A remount with the new
/// passphrase reads everything.
#[test]
fn a_mount_stops_writing_when_the_volume_was_rekeyed_elsewhere() {
    let (dev, m) = Devices::new();
    let mut open_before = std::fs::File::open(dev.a.mnt.join("docs/one.txt")).unwrap();
    let mut writer = std::fs::OpenOptions::new()
        .write(true)
        .open(dev.a.mnt.join("top.txt"))
        .unwrap();
    let new_pass = dev.a.write_pass("a new passphrase after the rekey");
    dev.on_b(&["rekey", "--passfile", s(&dev.a.pass)]);
    dev.on_b(&[
        "passwd",
        "--passfile",
        s(&dev.a.pass),
        "--new-passfile",
        s(&new_pass),
    ]);
    mirror(&dev.b, &dev.a.cipher);
    dev.touch_until("the mount refused writes", |r| {
        r.as_ref()
            .is_err_and(|e| e.raw_os_error() == Some(libc::EROFS))
    });
    let erofs = |r: std::io::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
    };
    erofs(
        std::fs::write(dev.a.mnt.join("new.txt"), "under the old key?\n"),
        "create",
    );
    erofs(std::fs::create_dir(dev.a.mnt.join("newdir")), "mkdir");
    erofs(
        writer.write_all(b"edited").and_then(|()| writer.sync_all()),
        "write to a file open before",
    );
    let mut text = String::new();
    open_before.seek(SeekFrom::Start(0)).unwrap();
    open_before.read_to_string(&mut text).unwrap();
    assert_eq!(text, "one in docs\n", "a file open before reads on");
    drop((writer, open_before));
    m.unmount();
    let log = std::fs::read_to_string(&dev.log).unwrap();
    assert_eq!(
        dev.logged("rekeyed on another device"),
        1,
        "one line says why: {log}"
    );
    assert!(log.contains("remount"), "{log}");
    assert!(!log.contains("panicked"), "{log}");

    assert_eq!(
        entries(&dev.a.cipher),
        entries(&dev.b),
        "A's mount wrote into the cipher directory after the rekey arrived"
    );
    let _m = dev.mount(&new_pass);
    for (path, content) in FILES {
        assert_eq!(
            std::fs::read_to_string(dev.a.mnt.join(path)).unwrap(),
            content,
            "{path}"
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(&dev.a.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["docs", "top.txt"]);
}

/// A config cut short (a sync client's half-written copy) placed under the mount: nothing is
/// refused and nothing panics; it is reported once, and the mount goes on when the whole
/// config arrives.
#[test]
fn a_partial_config_under_a_mount_refuses_nothing() {
    let (dev, m) = Devices::new();
    let conf_path = dev.a.cipher.join("cloakfs.conf");
    let conf = std::fs::read(&conf_path).unwrap();
    replace_file(&conf_path, &conf[..conf.len() / 2]);
    dev.touch_until("the mount noticed the partial config", |r| {
        r.is_ok() && dev.logged("not a config now") > 0
    });
    std::fs::write(dev.a.mnt.join("docs/during.txt"), "while it was partial\n").unwrap();
    // The whole config arrives.
    replace_file(&conf_path, &conf);
    std::fs::write(dev.a.mnt.join("docs/after.txt"), "once it was whole\n").unwrap();
    m.unmount();
    assert_eq!(dev.logged("not a config now"), 1);
    assert_eq!(dev.logged("writes are refused"), 0);
    let log = std::fs::read_to_string(&dev.log).unwrap();
    assert!(!log.contains("panicked"), "{log}");

    let _m = dev.mount(&dev.a.pass);
    for (path, content) in [
        ("docs/during.txt", "while it was partial\n"),
        ("docs/after.txt", "once it was whole\n"),
    ] {
        assert_eq!(
            std::fs::read_to_string(dev.a.mnt.join(path)).unwrap(),
            content
        );
    }
}

/// A rekey interrupted on B (its journal and its first re-encrypted file delivered to A, the
/// config not yet): A's mount stops writing at the journal, and says so once.
#[test]
fn a_mount_stops_writing_when_a_rekey_journal_arrives() {
    let (dev, m) = Devices::new();
    let out = dev
        .a
        .bin()
        .args(["rekey", "--passfile", s(&dev.a.pass), s(&dev.b)])
        .env("CLOAKFS_REKEY_CRASH_AFTER", "2")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "the rekey was to be interrupted");
    assert!(dev.b.join("cloakfs.rekey").exists());
    mirror(&dev.b, &dev.a.cipher);
    dev.touch_until("the mount refused writes", |r| {
        r.as_ref()
            .is_err_and(|e| e.raw_os_error() == Some(libc::EROFS))
    });
    let e = std::fs::write(dev.a.mnt.join("new.txt"), "under the old key?\n").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    m.unmount();
    assert_eq!(dev.logged("a rekey of the volume is under way"), 1);
    assert_eq!(entries(&dev.a.cipher), entries(&dev.b));
}
