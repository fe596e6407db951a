//! Shared harness for CLI tests: runs the real `cloakfs` binary and mounts for real.

#![allow(dead_code)]

pub mod daemon;
pub mod gocryptfs;
pub mod gpg;
pub mod machine;
pub mod syncthing;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_cloakfs");

/// Where the tests' `cloakfs` keeps its record of known volumes (key pinning): under the
/// build's temporary directory, not the machine's own record.
pub const STATE_DIR: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/known-volumes");

/// The `cloakfs` binary, with the tests' state directory.
pub fn bin() -> Command {
    let mut c = Command::new(BIN);
    c.env("CLOAKFS_STATE_DIR", STATE_DIR);
    c
}

/// Cheap KDF flags: tests measure behaviour, not brute-force cost.
pub const CHEAP_KDF: [&str; 4] = ["--kdf-memory", "64", "--kdf-iterations", "1"];

/// A volume in a temporary directory, with a passfile and a mount point.
pub struct Fixture {
    pub tmp: tempfile::TempDir,
    pub cipher: PathBuf,
    pub mnt: PathBuf,
    pub pass: PathBuf,
    /// The record of known volumes its commands use (key pinning): the tests' shared one
    /// unless a test gives the fixture a machine of its own.
    pub state: PathBuf,
}

impl Fixture {
    /// Creates the directories and the passfile; no volume yet.
    pub fn bare() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let cipher = tmp.path().join("cipher");
        let mnt = tmp.path().join("mnt");
        let pass = tmp.path().join("pass");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::write(&pass, "correct horse battery\n").unwrap();
        Self {
            tmp,
            cipher,
            mnt,
            pass,
            state: PathBuf::from(STATE_DIR),
        }
    }

    /// The `cloakfs` binary with this fixture's record of known volumes.
    pub fn bin(&self) -> Command {
        let mut c = bin();
        c.env("CLOAKFS_STATE_DIR", &self.state);
        c
    }

    /// Runs `cloakfs ARGS` with this fixture's record of known volumes.
    pub fn run(&self, args: &[&str]) -> Output {
        self.bin()
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    }

    /// A fixture with an initialized volume.
    pub fn new() -> Self {
        let f = Self::bare();
        let out = f.init(&[]);
        assert!(out.status.success(), "init failed: {}", stderr(&out));
        f
    }

    pub fn init(&self, extra: &[&str]) -> Output {
        self.run(
            &[
                &["init", "--passfile", s(&self.pass)],
                &CHEAP_KDF[..],
                extra,
                &[s(&self.cipher)],
            ]
            .concat(),
        )
    }

    /// `cloakfs mount` (daemonized), returning its output.
    pub fn mount(&self, extra: &[&str]) -> Output {
        self.run(
            &[
                &["mount", "--passfile", s(&self.pass)],
                extra,
                &[s(&self.cipher), s(&self.mnt)],
            ]
            .concat(),
        )
    }

    /// Mounts and asserts success.
    pub fn mounted(&self, extra: &[&str]) -> MountGuard {
        let out = self.mount(extra);
        assert!(out.status.success(), "mount failed: {}", stderr(&out));
        assert!(
            is_mounted(&self.mnt),
            "mount returned 0 but nothing is mounted"
        );
        MountGuard(self.mnt.clone())
    }

    pub fn write_pass(&self, p: &str) -> PathBuf {
        let path = self.tmp.path().join(format!("pass-{}", p.len()));
        std::fs::write(&path, format!("{p}\n")).unwrap();
        path
    }
}

/// Unmounts on drop, so a failing test leaves nothing behind.
pub struct MountGuard(pub PathBuf);

impl MountGuard {
    pub fn unmount(self) {
        let out = cloakfs(&["unmount", s(&self.0)]);
        assert!(out.status.success(), "unmount failed: {}", stderr(&out));
        assert!(!is_mounted(&self.0));
        std::mem::forget(self);
    }
}

impl MountGuard {
    /// Unmounts any FUSE mount (`fusermount3 -u`), such as a peer's.
    pub fn unmount_fuse(self) {
        let out = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.0)
            .output()
            .unwrap();
        assert!(out.status.success(), "fusermount3 -u: {}", stderr(&out));
        assert!(!is_mounted(&self.0));
        std::mem::forget(self);
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = Command::new("fusermount3").arg("-uz").arg(&self.0).status();
        }
    }
}

/// A mount a test made beneath a cloakfs volume (a bind or tmpfs store), detached on drop
/// (`umount -l`): after `cloakfs unmount` returns, the daemon may still hold the store while
/// its last syncfs runs, and a plain umount then fails as busy and leaves the mount behind.
pub struct Detach(pub PathBuf);

impl Drop for Detach {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Whether the long variants run (`CLOAKFS_SLOW_TESTS=1`, as in scripts/test.sh).
pub fn slow() -> bool {
    std::env::var_os("CLOAKFS_SLOW_TESTS").is_some_and(|v| v == "1")
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

pub fn cloakfs(args: &[&str]) -> Output {
    bin()
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// Starts `cmd` with stdin closed and stdout piped, and returns it with the first line it
/// prints: a foreground mount and the daemon print one when they are ready.
pub fn start_until_first_line(cmd: &mut Command) -> (std::process::Child, String) {
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    (child, line)
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Whether `p` is a mount point (per /proc/self/mountinfo).
pub fn is_mounted(p: &Path) -> bool {
    let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(s(&p)))
}

/// Asserts a failed run: exit code, one-line error on stderr containing `needle`.
pub fn assert_fails(out: &Output, code: i32, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(needle), "expected {needle:?} in {err:?}");
    assert_eq!(err.trim_end().lines().count(), 1, "one-line error: {err:?}");
    assert!(!err.contains("panicked"), "{err}");
}
