//! The multi-user daemon under test: the real `cloakfs daemon` as root, real users made with
//! useradd, real Unix sessions (setsid), every command run as its user.
//!
//! Each user works in a `Shell`: one long-lived `sh` that is the leader of its own session,
//! fed commands on stdin, so "the same session" and "another session" are real.

use super::{is_mounted, s, start_until_first_line, BIN, CHEAP_KDF};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a condition may take before a test gives up.
pub const DEADLINE: Duration = Duration::from_secs(30);

pub struct User {
    pub name: &'static str,
    pub uid: u32,
    pub gid: u32,
}

/// The test user `name`, created on first use. Creation is serialized: concurrent useradds
/// can lose each other's entries, and a test that read a uid meanwhile could get another
/// user's (seen on a fresh machine: cfs-alice read as cfs-bob's uid).
pub fn user(name: &'static str) -> User {
    static SETUP: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = SETUP.lock().unwrap_or_else(|e| e.into_inner());
    let id = |flag: &str| -> Option<u32> {
        let o = Command::new("id").args([flag, name]).output().ok()?;
        String::from_utf8_lossy(&o.stdout).trim().parse().ok()
    };
    if id("-u").is_none() {
        let st = Command::new("useradd")
            .args([
                "--system",
                "--user-group",
                "--no-create-home",
                "--shell",
                "/bin/sh",
                name,
            ])
            .status()
            .unwrap();
        assert!(st.success(), "useradd {name} failed");
    }
    User {
        name,
        uid: id("-u").unwrap(),
        gid: id("-g").unwrap(),
    }
}

/// One running daemon with its own tree root and socket, and a work area users can reach.
/// Its log (at `info`) goes to `log`, and is printed if the test fails.
pub struct Daemon {
    pub child: Child,
    pub root: PathBuf,
    pub socket: PathBuf,
    pub work: tempfile::TempDir,
    pub bin_dir: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A daemon with `extra` options.
    pub fn start_with(extra: &[&str]) -> Self {
        let work = tempfile::Builder::new()
            .prefix("cloakfs-mu-")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // The test binary's directory may not be reachable by other users.
        let bin_dir = work.path().join("bin");
        std::fs::create_dir(&bin_dir).unwrap();
        std::fs::copy(BIN, bin_dir.join("cloakfs")).unwrap();
        // Where every user may leave files for the test to read (like /tmp).
        let drop_box = work.path().join("shared");
        std::fs::create_dir(&drop_box).unwrap();
        std::fs::set_permissions(&drop_box, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let root = work.path().join("crypt");
        let socket = work.path().join("control.sock");
        let log = work.path().join("daemon.log");
        let (mut child, line) = start_until_first_line(
            Command::new(BIN)
                .args(["daemon", "--root", s(&root), "--socket", s(&socket)])
                .args(["--max-wait", "20s", "--log-file", s(&log)])
                .args(extra)
                .env("CLOAKFS_LOG", "info")
                .stderr(Stdio::inherit()),
        );
        assert!(
            line.contains("ready"),
            "daemon did not start: {line:?} ({:?})",
            child.try_wait()
        );
        Daemon {
            child,
            root,
            socket,
            work,
            bin_dir,
            log,
        }
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's resident and locked memory, in KiB.
    pub fn memory_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in the daemon's status"))
        };
        (field("VmRSS:"), field("VmLck:"))
    }

    /// Pidfds the daemon holds.
    pub fn pidfds(&self) -> usize {
        let dir = format!("/proc/{}/fdinfo", self.child.id());
        std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
            .filter(|info| info.lines().any(|l| l.starts_with("Pid:")))
            .count()
    }

    /// A directory owned by `u`, mode 0700, with a passfile.
    pub fn home(&self, u: &User) -> PathBuf {
        let home = self.work.path().join(u.name);
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(home.join("pass"), "correct horse battery\n").unwrap();
        chown_r(&home, u);
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
        home
    }

    /// A shell of `u` in a new Unix session.
    pub fn shell(&self, u: &User) -> Shell {
        Shell::new(u, self)
    }

    /// A volume of `u`'s in HOME/`dir` (mode 0700), attached from `sh` as `name` with
    /// `extra` options and holding `secret.txt`; returns its plaintext directory.
    pub fn attach(&self, u: &User, sh: &mut Shell, dir: &str, name: &str, extra: &str) -> PathBuf {
        let home = self.home(u);
        let cipher = home.join(dir);
        // 0700: without `bypass`, nobody else passes the lower file system's checks.
        sh.ok(&format!(
            "cloakfs init --passfile {h}/pass {kdf} {c} && chmod 700 {c}",
            h = s(&home),
            kdf = CHEAP_KDF.join(" "),
            c = s(&cipher)
        ));
        sh.ok(&format!(
            "cloakfs attach --passfile {h}/pass {extra} {c} {name}",
            h = s(&home),
            c = s(&cipher)
        ));
        let plain = self.root.join(name);
        sh.ok(&format!("echo top secret > {}/secret.txt", s(&plain)));
        plain
    }

    /// A command run as `u` in a new Unix session of its own (setsid), with the
    /// environment of a [`Shell`].
    pub fn command_as(&self, u: &User, program: &str) -> Command {
        let mut c = Command::new("setsid");
        c.arg("--wait")
            .arg("setpriv")
            .arg(format!("--reuid={}", u.uid))
            .arg(format!("--regid={}", u.gid))
            .arg("--init-groups")
            .arg(program)
            .env_clear()
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin:/usr/sbin:/sbin", s(&self.bin_dir)),
            )
            .env("CLOAKFS_SOCKET", &self.socket)
            .env("HOME", self.work.path().join(u.name))
            .env("LC_ALL", "C")
            .current_dir("/");
        c
    }

    pub fn ls_root(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- daemon log ---\n{}--- end ---", self.log());
        }
        // Not once reaped: its pid may be another process's by now.
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: kill on the daemon's own pid (a zombie at worst, never reused).
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        }
        // A daemon that does not stop (a regression) is killed, so no test leaves one.
        let start = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) {
            if start.elapsed() > DEADLINE {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.wait();
        if is_mounted(&self.root) {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.root)
                .status();
        }
    }
}

pub fn chown_r(p: &Path, u: &User) {
    let st = Command::new("chown")
        .arg("-R")
        .arg(format!("{}:{}", u.uid, u.gid))
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success());
}

/// A user's shell, leader of its own session, driven through its standard input.
pub struct Shell {
    pub child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    /// The Unix session ID (the shell is its leader).
    pub sid: u32,
}

impl Shell {
    pub fn new(u: &User, d: &Daemon) -> Self {
        Self::spawn(u, d, |c| c.spawn().unwrap())
    }

    /// A shell started by `spawn` (which may pick the moment of the fork).
    pub fn spawn(u: &User, d: &Daemon, spawn: impl FnOnce(&mut Command) -> Child) -> Self {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={}", u.uid))
            .arg(format!("--regid={}", u.gid))
            .arg("--init-groups")
            .args(["setsid", "sh", "-s"])
            .env_clear()
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin:/usr/sbin:/sbin", s(&d.bin_dir)),
            )
            .env("CLOAKFS_SOCKET", &d.socket)
            .env("HOME", d.work.path().join(u.name))
            .env("LC_ALL", "C")
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = spawn(&mut cmd);
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut sh = Shell {
            sid: 0,
            child,
            stdin,
            out,
        };
        let (rc, sid) = sh.run("cut -d' ' -f6 /proc/$$/stat");
        assert_eq!(rc, 0);
        sh.sid = sid.trim().parse().unwrap();
        sh
    }

    /// Runs `cmd` (stdout and stderr together); returns its status and output.
    pub fn run(&mut self, cmd: &str) -> (i32, String) {
        writeln!(self.stdin, "{{ {cmd}\n}} 2>&1; echo \"__rc=$?\"").unwrap();
        self.stdin.flush().unwrap();
        let mut out = String::new();
        loop {
            let mut line = String::new();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(
                n > 0,
                "shell died while running {cmd:?}; output so far: {out}"
            );
            if let Some(rc) = line.trim_end().strip_prefix("__rc=") {
                return (rc.parse().unwrap(), out);
            }
            out.push_str(&line);
        }
    }

    /// Runs `cmd` and asserts it succeeded; returns its output.
    pub fn ok(&mut self, cmd: &str) -> String {
        let (rc, out) = self.run(cmd);
        assert_eq!(rc, 0, "{cmd:?} failed: {out}");
        out
    }

    /// Runs `cmd` and asserts it failed; returns its output.
    pub fn fails(&mut self, cmd: &str) -> String {
        let (rc, out) = self.run(cmd);
        assert_ne!(rc, 0, "{cmd:?} should have failed: {out}");
        out
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `cond` until it holds; panics with `what` at the deadline.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
