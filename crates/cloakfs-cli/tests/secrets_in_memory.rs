//! Secrets in memory, checked on the real processes: every command that reads a secret is
//! hardened (no core dump, not dumpable) before it reads it, and a mounted daemon keeps every
//! key and key schedule on locked pages (found by searching its memory for the keys).

mod common;
#[path = "../../cloakfs-core/tests/support/memscan.rs"]
mod memscan;

use cloakfs_core::crypto::keys::{label, INFO_PREFIX};
use cloakfs_core::crypto::locked::scrubbed;
use cloakfs_core::crypto::secret::{Passphrase, SecretBytes};
use cloakfs_core::format::content::FileHeader;
use cloakfs_core::format::names::DirId;
use cloakfs_core::tools::writer::Writer;
use cloakfs_core::Volume;
use common::*;
use hkdf::Hkdf;
use sha2::Sha256;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const PASS: &str = "correct horse battery";
/// The user the hardening checks run as: a process of root's is owned by root whether or
/// not it is dumpable, one of nobody's only when it is not.
const NOBODY: u32 = 65534;

/// A work directory that user nobody owns: home, cipher directory, passfiles, a FIFO.
struct Work {
    tmp: tempfile::TempDir,
}

impl Work {
    fn new() -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("cloakfs-locked-")
            .tempdir_in("/tmp")
            .unwrap();
        let w = Self { tmp };
        std::fs::create_dir(w.path("home")).unwrap();
        std::fs::create_dir(w.path("mnt")).unwrap();
        std::fs::write(w.path("pass"), format!("{PASS}\n")).unwrap();
        w.chown();
        w
    }

    fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    fn chown(&self) {
        let st = Command::new("chown")
            .arg("-R")
            .arg(format!("{NOBODY}:{NOBODY}"))
            .arg(self.tmp.path())
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// `cloakfs ARGS` as user nobody, with a home of its own.
    fn nobody(&self, args: &[&str]) -> Command {
        let mut c = self.unlimited_core();
        Self::as_nobody(&mut c, args);
        c
    }

    /// `cloakfs ARGS` as user nobody in a Unix session of its own (setsid): an attach is
    /// bound to its caller's session, and the test runner's may lie outside the daemon's
    /// pid namespace. setsid execs without forking (the child leads no process group), so
    /// the pid watched stays the command's.
    fn nobody_in_session(&self, args: &[&str]) -> Command {
        let mut c = self.unlimited_core();
        c.arg("setsid");
        Self::as_nobody(&mut c, args);
        c
    }

    fn as_nobody(c: &mut Command, args: &[&str]) {
        c.arg("setpriv")
            .arg(format!("--reuid={NOBODY}"))
            .arg(format!("--regid={NOBODY}"))
            .arg("--clear-groups")
            .arg(BIN)
            .args(args);
    }

    /// `cloakfs ARGS` as root (whose processes look the same dumpable or not).
    fn root(&self, args: &[&str]) -> Command {
        let mut c = self.unlimited_core();
        c.arg(BIN).args(args);
        c
    }

    /// A command line that starts with core dumps allowed, so that a limit of 0 is the
    /// command's own doing.
    fn unlimited_core(&self) -> Command {
        let mut c = Command::new("prlimit");
        c.arg("--core=unlimited:unlimited")
            .env("HOME", self.path("home"))
            .env_remove("XDG_STATE_HOME")
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("XDG_RUNTIME_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Runs `cmd`, whose passfile is the FIFO `self.path("fifo")`. While it waits for the
    /// passphrase, checks that it is already hardened (core limit 0; for a command run as
    /// nobody, not dumpable either); then feeds it and returns its output.
    fn through_fifo(&self, mut cmd: Command, what: &str) -> Output {
        let fifo = self.path("fifo");
        let _ = std::fs::remove_file(&fifo);
        let st = Command::new("mkfifo")
            .args(["-m", "0666"])
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(st.success());
        let child = cmd.spawn().unwrap();
        let pid = child.id();
        // If the command ends without opening the FIFO, open it here so the writer below
        // does not wait forever.
        let watcher = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let out = child.wait_with_output().unwrap();
                let _ = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&fifo);
                out
            })
        };
        // Returns once the command has opened the FIFO to read the passphrase.
        let mut writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let limits = std::fs::read_to_string(proc_dir.join("limits"));
        let cmdline = std::fs::read(proc_dir.join("cmdline")).unwrap_or_default();
        let Ok(limits) = limits.map_err(|_| ()).and_then(|l| {
            if cmdline.starts_with(BIN.as_bytes()) {
                Ok(l)
            } else {
                Err(())
            }
        }) else {
            let out = watcher.join().unwrap();
            panic!(
                "{what}: ended before reading its passphrase: {:?} {}",
                out.status,
                stderr(&out)
            );
        };
        let core: Vec<&str> = limits
            .lines()
            .find(|l| l.starts_with("Max core file size"))
            .unwrap()
            .split_whitespace()
            .skip(4)
            .take(2)
            .collect();
        assert_eq!(core, ["0", "0"], "{what}: core dumps still allowed");
        let status = std::fs::read_to_string(proc_dir.join("status")).unwrap();
        let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        if uid_line.split_whitespace().nth(1) != Some("0") {
            assert!(
                uid_line
                    .split_whitespace()
                    .all(|f| f == "Uid:" || f == "65534"),
                "{what}: {uid_line}"
            );
            // The files in /proc/PID of a process that is not dumpable belong to root.
            let owner = std::fs::metadata(proc_dir.join("environ")).unwrap().uid();
            assert_eq!(
                owner, 0,
                "{what}: still dumpable (/proc/{pid}/environ owned by {owner})"
            );
        }

        writer.write_all(format!("{PASS}\n").as_bytes()).unwrap();
        drop(writer);
        let out = watcher.join().unwrap();
        assert!(out.status.success(), "{what}: {}", stderr(&out));
        out
    }
}

/// Runs each command that reads a secret with its passphrase coming through a FIFO.
#[test]
fn every_command_that_reads_a_secret_is_hardened_before_reading_it() {
    let w = Work::new();
    let cipher = w.path("cipher");
    let c = s(&cipher);
    let fifo = w.path("fifo");
    let fifo = s(&fifo);

    let init = [&["init", "--passfile", fifo][..], &CHEAP_KDF[..], &[c]].concat();
    w.through_fifo(w.nobody(&init), "init");
    {
        let volume = Volume::unlock(&cipher, &Passphrase::new(PASS.as_bytes().to_vec())).unwrap();
        Writer::new(&volume, &cipher)
            .write_file(Path::new("hello.txt"), b"hello\n")
            .unwrap();
    }
    w.chown();

    let out = w.through_fifo(
        w.nobody(&["cat", "--passfile", fifo, c, "hello.txt"]),
        "cat",
    );
    assert_eq!(out.stdout, b"hello\n");
    let out = w.through_fifo(
        w.nobody(&["name", "--passfile", fifo, c, "hello.txt"]),
        "name",
    );
    assert!(!out.stdout.is_empty());
    w.through_fifo(w.nobody(&["fsck", "--passfile", fifo, c]), "fsck");
    let dest = w.path("export");
    w.through_fifo(
        w.nobody(&["export", "--passfile", fifo, c, s(&dest)]),
        "export",
    );
    assert_eq!(std::fs::read(dest.join("hello.txt")).unwrap(), b"hello\n");
    let pass = w.path("pass");
    let pass = s(&pass);
    w.through_fifo(
        w.nobody(&[
            "slots",
            "add",
            c,
            "--passfile",
            fifo,
            "--new-passfile",
            pass,
        ]),
        "slots add",
    );
    w.through_fifo(
        w.nobody(&["passwd", c, "--passfile", fifo, "--new-passfile", pass]),
        "passwd",
    );
    w.through_fifo(
        w.nobody(&["rekey", "--passfile", fifo, "--drop-other-slots", c]),
        "rekey",
    );

    // As root: a user's mount needs an open /dev/fuse or fusermount3 set up for it.
    let mnt = w.path("mnt");
    w.through_fifo(w.root(&["mount", "--passfile", fifo, c, s(&mnt)]), "mount");
    let guard = MountGuard(mnt.clone());
    assert_eq!(std::fs::read(mnt.join("hello.txt")).unwrap(), b"hello\n");
    guard.unmount();
}

/// `cloakfs attach` (a client of the multi-user daemon) is hardened too.
#[test]
fn attach_is_hardened_before_reading_its_secret() {
    let w = Work::new();
    let cipher = w.path("cipher");
    let out = w
        .nobody(
            &[
                &["init", "--passfile", s(&w.path("pass"))][..],
                &CHEAP_KDF[..],
                &[s(&cipher)],
            ]
            .concat(),
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let root = w.path("tree");
    let socket = w.path("control.sock");
    let (mut daemon, line) = start_until_first_line(
        Command::new(BIN)
            .args(["daemon", "--root", s(&root), "--socket", s(&socket)])
            .stderr(Stdio::inherit()),
    );
    struct Stop(std::process::Child, PathBuf);
    impl Drop for Stop {
        fn drop(&mut self) {
            // SAFETY: kill(2) on the daemon this test started.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let _ = self.0.wait();
            if is_mounted(&self.1) {
                let _ = Command::new("fusermount3").arg("-uz").arg(&self.1).status();
            }
        }
    }
    assert!(
        line.contains("ready"),
        "daemon: {line:?} {:?}",
        daemon.try_wait()
    );
    let daemon = Stop(daemon, root.clone());
    let fifo = w.path("fifo");
    w.through_fifo(
        w.nobody_in_session(&[
            "attach",
            "--socket",
            s(&socket),
            "--passfile",
            s(&fifo),
            s(&cipher),
            "hardened",
        ]),
        "attach",
    );
    // Listed in the tree (its contents are the owner's: root holds no authorization).
    let listed: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(listed, ["hardened"]);
    drop(daemon);
}

/// The keys of a volume, derived here (in locked memory) to search for.
struct Needles {
    names: Vec<&'static str>,
    keys: Vec<SecretBytes<32>>,
}

impl Needles {
    fn add(&mut self, name: &'static str, key: &[u8]) {
        self.names.push(name);
        self.keys
            .push(SecretBytes::from_slice(key.try_into().unwrap()));
    }

    fn refs(&self) -> Vec<&[u8; 32]> {
        self.keys.iter().map(|k| k.expose()).collect()
    }
}

/// The pid of the daemon serving `mnt`.
fn daemon_of(mnt: &Path) -> u32 {
    let mnt = mnt.as_os_str().as_encoded_bytes();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if args.first() == Some(&BIN.as_bytes()) && args.contains(&mnt) {
            found.push(pid);
        }
    }
    assert_eq!(found.len(), 1, "daemons of the mount: {found:?}");
    found[0]
}

/// The finding of issue 21: a key schedule sat on an unlocked heap page of a running daemon.
/// The daemon forks after unlocking (memory locks are not inherited), then serves names,
/// symlinks, xattrs and an open file; every copy of every key in its memory must be on a
/// locked page left out of core dumps.
#[test]
fn a_mounted_daemon_keeps_every_key_and_key_schedule_on_locked_pages() {
    let f = Fixture::new();
    let m = f.mounted(&[]);
    let pid = daemon_of(&f.mnt);
    std::fs::create_dir(f.mnt.join("dir")).unwrap();
    std::fs::write(f.mnt.join("dir/other"), b"other").unwrap();
    std::os::unix::fs::symlink("dir/other", f.mnt.join("link")).unwrap();
    assert_eq!(
        std::fs::read_link(f.mnt.join("link")).unwrap(),
        Path::new("dir/other")
    );
    let mut open = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(f.mnt.join("kept-open"))
        .unwrap();
    open.write_all(b"data of a file kept open").unwrap();
    open.sync_all().unwrap();
    let path = std::ffi::CString::new(s(&f.mnt.join("kept-open"))).unwrap();
    // SAFETY: setxattr with valid NUL-terminated strings and a buffer of the given length.
    let xattrs = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"user.note".as_ptr(),
            b"v".as_ptr().cast(),
            1,
            0,
        )
    } == 0;
    assert_eq!(std::fs::read_dir(&f.mnt).unwrap().count(), 3);
    let mut back = Vec::new();
    std::fs::File::open(f.mnt.join("kept-open"))
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert_eq!(back, b"data of a file kept open");

    let volume = Volume::unlock(&f.cipher, &Passphrase::new(PASS.as_bytes().to_vec())).unwrap();
    let mk = volume.master_key();
    let vid = volume.config().params.volume_id;
    let mut n = Needles {
        names: Vec::new(),
        keys: Vec::new(),
    };
    n.add("master key", mk.expose());
    if let Some((_, kek)) = volume.unlocked_slot() {
        n.add("key-encryption key", kek.expose());
    }
    let names: SecretBytes<64> = mk.subkey(&vid, label::NAMES);
    n.add("names CMAC key", &names.expose()[..32]);
    n.add("names CTR key", &names.expose()[32..]);
    let xattr_names: SecretBytes<64> = mk.subkey(&vid, label::XATTR_NAMES);
    n.add("xattr names CMAC key", &xattr_names.expose()[..32]);
    n.add("xattr names CTR key", &xattr_names.expose()[32..]);
    let metadata: SecretBytes<32> = mk.subkey(&vid, label::METADATA);
    n.add("metadata key", metadata.expose());
    let content: SecretBytes<32> = mk.subkey(&vid, label::CONTENT);
    n.add("content key", content.expose());
    let config_mac: SecretBytes<32> = mk.subkey(&vid, label::CONFIG_MAC);
    n.add("config MAC key", config_mac.expose());
    let stored = volume.names().encrypt(&DirId(vid), b"kept-open").unwrap();
    let header = std::fs::read(f.cipher.join(stored.backing())).unwrap();
    let id = FileHeader::parse(&header).unwrap().id;
    let mut file_key = SecretBytes::<32>::zero();
    scrubbed(|| {
        Hkdf::<Sha256>::new(None, content.expose())
            .expand_multi_info(
                &[INFO_PREFIX.as_bytes(), label::FILE.as_bytes(), &id.0],
                file_key.expose_mut(),
            )
            .unwrap()
    });
    n.add("file key", file_key.expose());

    let hits = memscan::find(&pid.to_string(), &n.refs());
    let outside: Vec<String> = hits
        .iter()
        .filter(|h| !(h.vma.locked() && h.vma.dont_dump()))
        .map(|h| {
            format!(
                "{} at {:#x} in {:#x}-{:#x} {} {:?}",
                n.names[h.needle], h.addr, h.vma.start, h.vma.end, h.vma.name, h.vma.flags
            )
        })
        .collect();
    assert!(
        outside.is_empty(),
        "keys outside locked memory in the daemon:\n{}",
        outside.join("\n")
    );
    let mut expected = vec!["master key", "names CTR key"];
    if xattrs {
        expected.push("xattr names CTR key");
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("aes") {
        // AES-NI schedules begin with the key itself.
        expected.extend(["names CMAC key", "metadata key", "file key"]);
        if xattrs {
            expected.push("xattr names CMAC key");
        }
    }
    for name in expected {
        assert!(
            hits.iter().any(|h| n.names[h.needle] == name),
            "{name} not found in the daemon's memory at all"
        );
    }
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    assert!(
        limits.lines().any(
            |l| l.starts_with("Max core file size") && l.split_whitespace().nth(4) == Some("0")
        ),
        "{limits}"
    );
    drop(open);
    m.unmount();
}
