//! gocryptfs (Debian's package, default settings: encrypted names, `-plaintextnames` off)
//! on a test fixture, for the comparisons in docs/COMPARISON.md: making a volume, mounting it,
//! and what its backing folder holds, counted by contents.

use super::{is_mounted, s, Fixture, MountGuard};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Whether gocryptfs is installed; says why not where it is not.
pub fn available() -> bool {
    let ok = Command::new("gocryptfs")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: gocryptfs is not installed (scripts/install-deps.sh installs it)");
    }
    ok
}

/// `gocryptfs -version`'s first line.
pub fn version() -> String {
    let out = Command::new("gocryptfs").arg("-version").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn run(args: &[&str]) -> Output {
    Command::new("gocryptfs")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The text a run printed, both streams.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// All regular files below `dir` that read as text, by contents (unreadable ones and
/// unlistable directories count as nothing).
pub fn contents(dir: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for e in entries.filter_map(Result::ok) {
        let path = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => found.extend(contents(&path)),
            Ok(t) if t.is_file() => found.extend(std::fs::read_to_string(&path).ok()),
            _ => {}
        }
    }
    found
}

impl Fixture {
    /// `gocryptfs -init` with the fixture's passfile: a volume of default settings in
    /// `self.cipher` (made here, empty).
    pub fn gocryptfs_init(&self) {
        std::fs::create_dir_all(&self.cipher).unwrap();
        let out = run(&["-init", "-q", "-passfile", s(&self.pass), s(&self.cipher)]);
        assert!(out.status.success(), "gocryptfs -init: {}", text(&out));
    }

    /// `gocryptfs -passfile P [EXTRA] CIPHER MNT` (it goes to the background once mounted).
    pub fn gocryptfs_mounted(&self, extra: &[&str]) -> MountGuard {
        self.gocryptfs_mounted_at(&self.cipher, &self.mnt, extra)
    }

    fn gocryptfs_mounted_at(&self, cipher: &Path, mnt: &Path, extra: &[&str]) -> MountGuard {
        let out = run(&[
            &["-q", "-passfile", s(&self.pass)],
            extra,
            &[s(cipher), s(mnt)],
        ]
        .concat());
        assert!(out.status.success(), "gocryptfs mount: {}", text(&out));
        assert!(
            is_mounted(mnt),
            "gocryptfs returned 0 but nothing is mounted"
        );
        MountGuard(mnt.to_path_buf())
    }

    /// `gocryptfs -fsck`: its exit code and its summary line.
    pub fn gocryptfs_fsck(&self) -> (i32, String) {
        let out = run(&["-fsck", "-q", "-passfile", s(&self.pass), s(&self.cipher)]);
        let summary = text(&out)
            .lines()
            .find(|l| l.starts_with("fsck summary"))
            .unwrap_or("no summary")
            .to_string();
        (out.status.code().unwrap_or(-1), summary)
    }

    /// The contents of every file the backing folder holds, whatever its name: a scratch copy
    /// with each backing file but the config and the directory IVs renamed to a name that
    /// cannot decrypt, mounted read-only with `-badname '*'`, which shows such names. File
    /// contents do not depend on the name (gocryptfs binds them to the file's header ID), so
    /// this reads every version on disk, also those whose names no longer decrypt.
    pub fn gocryptfs_on_disk(&self) -> BTreeSet<String> {
        fn rename_files(dir: &Path, n: &mut usize) {
            let entries: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .map(Result::unwrap)
                .collect();
            for e in entries {
                let name = e.file_name().into_string().unwrap();
                if e.file_type().unwrap().is_dir() {
                    rename_files(&e.path(), n);
                } else if name != "gocryptfs.conf" && name != "gocryptfs.diriv" {
                    *n += 1;
                    std::fs::rename(e.path(), dir.join(format!("recovered.{n}"))).unwrap();
                }
            }
        }
        let scratch = tempfile::tempdir().unwrap();
        let (cipher, mnt) = (scratch.path().join("cipher"), scratch.path().join("mnt"));
        std::fs::create_dir(&mnt).unwrap();
        let out = Command::new("cp")
            .arg("-a")
            .arg(&self.cipher)
            .arg(&cipher)
            .output()
            .unwrap();
        assert!(out.status.success(), "cp -a: {out:?}");
        rename_files(&cipher, &mut 0);
        let guard = self.gocryptfs_mounted_at(&cipher, &mnt, &["-ro", "-badname", "*"]);
        let found = contents(&mnt);
        guard.unmount_fuse();
        found
    }
}
