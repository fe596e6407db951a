//! The multi-user attach tree, mounted for real: routing, the gate, per-request credentials,
//! detach and node numbers. Needs root (real users, allow_other, credential switching).

mod common;

use cloakfs_fuse::{
    mount_tree, Access, AttachId, AttachSpec, Caller, Gate, MountOptions, Need, TreeHandle, Verdict,
};
use common::{create_volume, errno, eventually, is_root, names, spawn, unlock};
use std::collections::HashMap;
use std::fs;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

const ALICE: &str = "cloakfs-t-alice";
const BOB: &str = "cloakfs-t-bob";
/// A group both test users belong to, for supplementary-group checks.
const SHARE: &str = "cloakfs-t-share";

/// A test user.
#[derive(Debug, Clone)]
struct User {
    name: &'static str,
    uid: u32,
    gid: u32,
}

/// Runs `cmd` (under the harness's spawn lock) and returns its standard output.
fn output(cmd: &mut Command) -> (bool, String) {
    let out = spawn(cmd.stdin(Stdio::null()).stdout(Stdio::piped()))
        .wait_with_output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn id_of(flag: &str, name: &str) -> u32 {
    let (ok, out) = output(Command::new("id").arg(flag).arg(name));
    assert!(ok, "id {flag} {name}");
    out.trim().parse().unwrap()
}

/// Creates (once) the test users, each with a group of its own and in [`SHARE`].
fn user(name: &'static str) -> User {
    static SETUP: Mutex<()> = Mutex::new(());
    let _g = SETUP.lock().unwrap_or_else(|e| e.into_inner());
    // Failures are "already exists"; the lookups below catch real problems.
    let quiet = |c: &mut Command| {
        let _ = spawn(c.stdout(Stdio::null()).stderr(Stdio::null())).wait();
    };
    quiet(Command::new("groupadd").arg(SHARE));
    quiet(Command::new("useradd").args(["-M", "-U", "-s", "/bin/sh", name]));
    quiet(Command::new("usermod").args(["-a", "-G", SHARE, name]));
    User {
        name,
        uid: id_of("-u", name),
        gid: id_of("-g", name),
    }
}

fn share_gid() -> u32 {
    let (_, line) = output(Command::new("getent").args(["group", SHARE]));
    line.split(':').nth(2).unwrap().parse().unwrap()
}

/// `sh -c script` as `u` (with their groups), in `/`.
fn as_user(u: &User, script: &str) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid", u.name, "--regid", u.name, "--init-groups", "--"])
        .args(["sh", "-c", script])
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs `script` as `u`: (success, stdout, stderr).
fn run_as(u: &User, script: &str) -> (bool, String, String) {
    let out = spawn(&mut as_user(u, script)).wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A gate answering from a table the test changes: a verdict per uid (default Deny), and a
/// log of every question.
#[derive(Default)]
struct TestGate {
    rules: Mutex<HashMap<u32, Verdict>>,
    log: Mutex<Vec<(AttachId, u32, Need)>>,
}

impl TestGate {
    fn set(&self, uid: u32, v: Verdict) {
        self.rules.lock().unwrap().insert(uid, v);
    }

    fn asked(&self, uid: u32, need: Need) -> bool {
        self.log
            .lock()
            .unwrap()
            .iter()
            .any(|&(_, u, n)| u == uid && n == need)
    }
}

impl Gate for TestGate {
    fn check(&self, attach: AttachId, caller: &Caller, need: Need) -> Verdict {
        self.log.lock().unwrap().push((attach, caller.uid, need));
        let rules = self.rules.lock().unwrap();
        rules.get(&caller.uid).copied().unwrap_or(Verdict::Deny)
    }
}

const ALLOW: Verdict = Verdict::Allow { bypass: false };
const BYPASS: Verdict = Verdict::Allow { bypass: true };

/// A mounted tree in a temporary directory, served on a thread.
struct Tree {
    tmp: tempfile::TempDir,
    mnt: PathBuf,
    gate: Arc<TestGate>,
    handle: TreeHandle,
    server: Option<JoinHandle<io::Result<()>>>,
}

impl Tree {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        // The test users must reach the mount point.
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let mnt = tmp.path().join("crypt");
        fs::create_dir(&mnt).unwrap();
        let gate = Arc::new(TestGate::default());
        let opts = MountOptions::new(Path::new("cloakfs-test-tree"));
        let (mounted, handle) = mount_tree(&mnt, gate.clone(), &opts).expect("mount tree");
        let server = std::thread::spawn(move || mounted.run());
        Self {
            tmp,
            mnt,
            gate,
            handle,
            server: Some(server),
        }
    }

    /// The cipher directory of attach `name`.
    fn cipher(&self, name: &str) -> PathBuf {
        self.tmp.path().join(format!("{name}.cipher"))
    }

    /// Creates a volume owned by `owner` (backing root mode 0755) and attaches it.
    fn attach(&self, name: &str, owner: &User, hidden: bool) -> AttachId {
        let cipher = self.cipher(name);
        if !cipher.exists() {
            create_volume(&cipher);
            assert!(common::run(
                Command::new("chown")
                    .arg("-R")
                    .arg(format!("{}:{}", owner.uid, owner.gid))
                    .arg(&cipher)
            ));
            fs::set_permissions(&cipher, fs::Permissions::from_mode(0o755)).unwrap();
        }
        self.handle.attach(self.spec(name, owner, hidden)).unwrap()
    }

    fn spec(&self, name: &str, owner: &User, hidden: bool) -> AttachSpec {
        let cipher = self.cipher(name);
        let fd = rustix::fs::open(
            &cipher,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        AttachSpec {
            name: name.to_string(),
            volume: unlock(&cipher),
            cipherdir: fd,
            owner_uid: owner.uid,
            owner_gid: owner.gid,
            owner_groups: vec![owner.gid],
            hidden,
            read_only: false,
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// The backing path of `rel` inside attach `name`.
    fn backing(&self, name: &str, rel: &str) -> PathBuf {
        let cipher = self.cipher(name);
        cloakfs_core::tools::paths::encrypt_path(&unlock(&cipher), &cipher, Path::new(rel)).unwrap()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            let unmount = |args: &[&str]| {
                common::run(
                    Command::new("fusermount3")
                        .args(args)
                        .arg(&self.mnt)
                        .stderr(Stdio::null()),
                )
            };
            if unmount(&["-u"]) {
                let r = server.join().expect("server thread panicked");
                if !std::thread::panicking() {
                    r.expect("server ended with an error");
                }
            } else {
                let _ = unmount(&["-u", "-z"]);
            }
        }
    }
}

#[track_caller]
fn err_of<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    errno(&r.expect_err("expected an error"))
}

macro_rules! needs_root {
    () => {
        if !is_root() {
            eprintln!("skipped: needs root");
            return;
        }
    };
}

#[test]
fn root_lists_visible_attaches_and_refuses_creation() {
    needs_root!();
    let alice = user(ALICE);
    let t = Tree::new();
    t.gate.set(0, ALLOW);
    let pub_id = t.attach("pub", &alice, false);
    let hidden_id = t.attach("hid", &alice, true);
    assert_eq!(
        t.handle.names(),
        vec![(pub_id, "pub".to_string()), (hidden_id, "hid".to_string())]
    );

    // Listing: visible attaches only; the hidden one is reachable by its exact name.
    assert_eq!(names(&t.mnt), vec!["pub"]);
    assert!(fs::metadata(t.p("hid")).unwrap().is_dir());
    let (ok, ls) = output(Command::new("ls").arg("-la").arg(&t.mnt));
    assert!(ok);
    assert!(ls.contains("pub") && !ls.contains("hid"), "{ls}");

    // The root: root's read-only directory, node 1. An attach root: its owner's, 0700.
    let root = fs::metadata(&t.mnt).unwrap();
    assert_eq!(
        (root.ino(), root.mode() & 0o7777, root.uid()),
        (1, 0o555, 0)
    );
    let a = fs::metadata(t.p("pub")).unwrap();
    assert_eq!(a.ino(), (pub_id << 40) | 1);
    assert_eq!(
        (a.mode() & 0o7777, a.uid(), a.gid()),
        (0o700, alice.uid, alice.gid)
    );

    // Nobody, not even root, creates or changes anything in the root.
    assert_eq!(err_of(fs::write(t.p("x"), b"x")), libc::EACCES);
    assert_eq!(err_of(fs::create_dir(t.p("d"))), libc::EACCES);
    assert_eq!(
        err_of(std::os::unix::fs::symlink("pub", t.p("l"))),
        libc::EACCES
    );
    assert_eq!(err_of(fs::rename(t.p("pub"), t.p("pub2"))), libc::EACCES);
    assert_eq!(err_of(fs::remove_dir(t.p("pub"))), libc::EACCES);
    let perm = fs::Permissions::from_mode(0o777);
    assert_eq!(err_of(fs::set_permissions(&t.mnt, perm)), libc::EACCES);
    fs::write(t.p("pub/f"), b"x").unwrap();
    assert_eq!(err_of(fs::rename(t.p("pub/f"), t.p("f"))), libc::EACCES);
    assert_eq!(err_of(fs::hard_link(t.p("pub/f"), t.p("f"))), libc::EACCES);
    // Nor across attaches.
    assert_eq!(err_of(fs::rename(t.p("pub/f"), t.p("hid/f"))), libc::EXDEV);

    // Names.
    let dup = t.handle.attach(t.spec("pub", &alice, false)).unwrap_err();
    assert_eq!(dup.kind(), io::ErrorKind::AlreadyExists);
    for bad in ["", ".", "..", "a/b"] {
        let mut s = t.spec("pub", &alice, false);
        s.name = bad.to_string();
        let e = t.handle.attach(s).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
    }

    // Exec and access(2) reach the gate as such.
    fs::write(t.p("pub/s.sh"), b"#!/bin/sh\necho ran\n").unwrap();
    fs::set_permissions(t.p("pub/s.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(output(&mut Command::new(t.p("pub/s.sh"))).1, "ran\n");
    let exec = Need {
        access: Access::Exec,
        on_open_handle: false,
    };
    assert!(t.gate.asked(0, exec), "exec did not ask for Exec");

    // Denied: EACCES for a listed attach, ENOENT for a hidden one (no leak).
    t.gate.set(0, Verdict::Deny);
    assert_eq!(err_of(fs::metadata(t.p("pub"))), libc::EACCES);
    assert_eq!(err_of(fs::metadata(t.p("hid"))), libc::ENOENT);
    assert_eq!(err_of(fs::metadata(t.p("none"))), libc::ENOENT);
    assert_eq!(names(&t.mnt), vec!["pub"]);
}

#[test]
fn owner_works_and_the_gate_decides_for_others_even_from_a_cached_cwd() {
    needs_root!();
    let (alice, bob) = (user(ALICE), user(BOB));
    let t = Tree::new();
    t.gate.set(0, ALLOW);
    t.gate.set(alice.uid, ALLOW);
    let id = t.attach("a", &alice, false);
    let dir = t.p("a/d");
    let script = format!(
        "mkdir {d} && echo hello > {d}/f && cat {d}/f",
        d = dir.display()
    );
    let (ok, out, err) = run_as(&alice, &script);
    assert!(ok, "{err}");
    assert_eq!(out, "hello\n");
    let m = fs::metadata(t.p("a/d/f")).unwrap();
    assert_eq!((m.uid(), m.gid()), (alice.uid, alice.gid));
    let b = fs::metadata(t.backing("a", "d/f")).unwrap();
    assert_eq!((b.uid(), b.gid()), (alice.uid, alice.gid));
    // The open asked for a read, the reads came on the open handle.
    for on_open_handle in [false, true] {
        let n = Need {
            access: Access::Read,
            on_open_handle,
        };
        assert!(t.gate.asked(alice.uid, n), "{n:?}");
    }

    // Denied by the gate.
    t.gate.set(bob.uid, Verdict::Deny);
    let (ok, _, err) = run_as(&bob, &format!("cat {}/f", dir.display()));
    assert!(!ok);
    assert!(err.contains("Permission denied"), "{err}");
    let (ok, _, _) = run_as(&bob, &format!("ls {}", t.p("a").display()));
    assert!(!ok);

    // Allowed, then revoked while bob sits in the directory.
    t.gate.set(bob.uid, BYPASS);
    // A read marks the cached atime stale; the stat after it loads fresh attributes, which
    // the kernel would then serve from its cache without the invalidation.
    let script = "cd \"$0\" || exit 9
        cat f >/dev/null && test -f f && echo allowed
        read x
        if test -f f; then echo stat-ok; else echo stat-fail; fi
        if cat f >/dev/null 2>&1; then echo cat-ok; else echo cat-fail; fi
        if ls . >/dev/null 2>&1; then echo ls-ok; else echo ls-fail; fi";
    let mut cmd = as_user(&bob, script);
    cmd.arg(&dir).stdin(Stdio::piped()).stderr(Stdio::null());
    let mut child = spawn(&mut cmd);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "allowed\n");
    t.gate.set(bob.uid, Verdict::Deny);
    t.handle.invalidate(id);
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    child.wait().unwrap();
    assert_eq!(rest, "stat-fail\ncat-fail\nls-fail\n");

    // The owner still works.
    let (ok, out, err) = run_as(&alice, &format!("cat {}/f", dir.display()));
    assert!(ok, "{err}");
    assert_eq!(out, "hello\n");
}

#[test]
fn lower_checks_run_as_the_caller_unless_bypassed() {
    needs_root!();
    let (alice, bob) = (user(ALICE), user(BOB));
    let t = Tree::new();
    t.gate.set(0, ALLOW);
    t.gate.set(alice.uid, ALLOW);
    t.gate.set(bob.uid, ALLOW);
    t.attach("a", &alice, false);
    let a = t.p("a");
    let a = a.display();
    let script = format!(
        "umask 077 && mkdir {a}/priv && echo secret > {a}/priv/s && echo top > {a}/top \
         && echo shared > {a}/g && chgrp {SHARE} {a}/g && chmod 640 {a}/g"
    );
    let (ok, _, err) = run_as(&alice, &script);
    assert!(ok, "{err}");
    assert_eq!(fs::metadata(t.p("a/top")).unwrap().mode() & 0o777, 0o600);
    assert_eq!(fs::metadata(t.p("a/g")).unwrap().gid(), share_gid());

    // As bob himself: alice's private files are closed to him, the group's file is open
    // through his supplementary group, and he cannot write into alice's directory.
    for f in ["top", "priv/s"] {
        let (ok, _, err) = run_as(&bob, &format!("cat {a}/{f}"));
        assert!(!ok, "bob read {f}");
        assert!(err.contains("Permission denied"), "{f}: {err}");
    }
    let (ok, out, err) = run_as(&bob, &format!("cat {a}/g"));
    assert!(ok, "{err}");
    assert_eq!(out, "shared\n");
    let (ok, _, _) = run_as(&bob, &format!("echo x > {a}/bobfile"));
    assert!(!ok);
    assert!(!t.p("a/bobfile").exists());

    // Still closed while alice holds the file open (the shared open file is not reused
    // without a check).
    let mut cmd = as_user(&alice, &format!("exec 3<{a}/top && echo open && read x"));
    cmd.stdin(Stdio::piped());
    let mut holder = spawn(&mut cmd);
    let mut line = String::new();
    BufReader::new(holder.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "open\n");
    for script in [
        format!("cat {a}/top"),
        format!("echo x >> {a}/top"),
        format!("truncate -s 0 {a}/top"),
    ] {
        let (ok, _, _) = run_as(&bob, &script);
        assert!(!ok, "{script} succeeded");
    }
    holder.stdin.take().unwrap().write_all(b"\n").unwrap();
    holder.wait().unwrap();
    assert_eq!(fs::read(t.p("a/top")).unwrap(), b"top\n");

    // Bypassed: bob acts as alice; what he creates is hers.
    t.gate.set(bob.uid, BYPASS);
    let (ok, out, err) = run_as(&bob, &format!("cat {a}/priv/s && echo b > {a}/bobfile"));
    assert!(ok, "{err}");
    assert_eq!(out, "secret\n");
    let m = fs::metadata(t.p("a/bobfile")).unwrap();
    assert_eq!((m.uid(), m.gid()), (alice.uid, alice.gid));
    let b = fs::metadata(t.backing("a", "bobfile")).unwrap();
    assert_eq!((b.uid(), b.gid()), (alice.uid, alice.gid));
}

/// Descriptors of this process whose target lies under `dir`.
fn fds_under(dir: &Path) -> usize {
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.starts_with(dir))
        .count()
}

#[test]
fn detach_fails_later_requests_and_removes_the_name() {
    needs_root!();
    let alice = user(ALICE);
    let t = Tree::new();
    t.gate.set(0, ALLOW);
    let id = t.attach("d", &alice, false);
    fs::create_dir(t.p("d/sub")).unwrap();
    fs::write(t.p("d/sub/f"), b"data").unwrap();
    let mut f = fs::File::open(t.p("d/sub/f")).unwrap();
    let mut buf = Vec::new();
    io::Read::read_to_end(&mut f, &mut buf).unwrap();
    assert_eq!(buf, b"data");
    assert!(fds_under(&t.cipher("d")) > 0);

    t.handle.detach(id).unwrap();
    assert!(t.handle.names().is_empty());
    assert!(names(&t.mnt).is_empty());
    assert_eq!(err_of(fs::metadata(t.p("d"))), libc::ENOENT);
    // The open file: cached pages and attributes are gone, requests fail.
    let mut byte = [0u8; 1];
    assert_eq!(
        err_of(std::os::unix::fs::FileExt::read_at(&f, &mut byte, 0)),
        libc::EIO
    );
    assert_eq!(err_of(f.metadata()), libc::EIO);
    // Every backing descriptor is closed, though the kernel still has the file open.
    eventually("backing files closed", || fds_under(&t.cipher("d")) == 0);
    drop(f);

    assert_eq!(
        t.handle.detach(id).unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    t.handle.invalidate(id);

    // The name is free again; numbers are not reused.
    let again = t.attach("d", &alice, false);
    assert!(again > id);
    assert_eq!(fs::read(t.p("d/sub/f")).unwrap(), b"data");
    assert_eq!(fs::metadata(t.p("d")).unwrap().ino(), (again << 40) | 1);
}

#[test]
fn node_numbers_of_attaches_never_collide() {
    needs_root!();
    let alice = user(ALICE);
    let t = Tree::new();
    t.gate.set(0, ALLOW);
    let ids = [t.attach("x", &alice, false), t.attach("y", &alice, false)];
    let mut seen = HashMap::new();
    for (&id, name) in ids.iter().zip(["x", "y"]) {
        let root = fs::metadata(t.p(name)).unwrap().ino();
        assert_eq!(root, (id << 40) | 1);
        assert!(seen.insert(root, name.to_string()).is_none());
        for i in 0..20 {
            let rel = format!("{name}/f{i}");
            fs::write(t.p(&rel), rel.as_bytes()).unwrap();
            let ino = fs::metadata(t.p(&rel)).unwrap().ino();
            assert_eq!(ino >> 40, id, "{rel}: {ino:#x}");
            assert!(
                seen.insert(ino, rel.clone()).is_none(),
                "{rel} reuses {ino:#x}"
            );
        }
        // Listings report the same numbers.
        for e in fs::read_dir(t.p(name)).unwrap() {
            let e = e.unwrap();
            assert_eq!(e.ino(), e.metadata().unwrap().ino());
        }
    }
    for name in ["x", "y"] {
        for i in 0..20 {
            let rel = format!("{name}/f{i}");
            assert_eq!(fs::read(t.p(&rel)).unwrap(), rel.as_bytes());
        }
    }
}

use std::os::unix::fs::DirEntryExt as _;

/// Writes through a shared mapping reach the daemon from the kernel's writeback, with no
/// caller (uid 0, pid 0): they are admitted on the strength of the writable handle they
/// come on, which the gate admitted at open. The data is on disk after msync: read back
/// after a detach and a new attach (nothing from the kernel's cache).
#[test]
fn mapped_writes_are_admitted_on_their_handle() {
    needs_root!();
    let alice = user(ALICE);
    let t = Tree::new();
    // Only alice: root, the kernel's own requests included, is refused.
    t.gate.set(alice.uid, ALLOW);
    let id = t.attach("m", &alice, false);
    let file = t.p("m/mapped");
    let script = "import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 8192)
m = mmap.mmap(fd, 8192)
m[100:105] = b'hello'
m[5000:5005] = b'world'
m.flush()
m.close()
os.fsync(fd)
os.close(fd)
print('written')";
    let mut cmd = as_user(&alice, "exec python3 -c \"$0\" \"$1\"");
    cmd.arg(script).arg(&file);
    let out = spawn(&mut cmd).wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "written\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    t.handle.detach(id).unwrap();
    t.gate.set(0, ALLOW);
    t.attach("m", &alice, false);
    let data = fs::read(t.p("m/mapped")).unwrap();
    assert_eq!(data.len(), 8192);
    assert_eq!(&data[100..105], b"hello");
    assert_eq!(&data[5000..5005], b"world");
}

/// A detach writes what shared mappings of the attach had written and not yet synced before
/// the attach goes: the writer was told those stores succeeded.
#[test]
fn detach_keeps_written_mapped_pages() {
    needs_root!();
    let alice = user(ALICE);
    let t = Tree::new();
    t.gate.set(alice.uid, ALLOW);
    let id = t.attach("k", &alice, false);
    let script = "import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 8192)
m = mmap.mmap(fd, 8192)
m[10:16] = b'stored'
print('dirty', flush=True)
sys.stdin.readline()";
    let mut cmd = as_user(&alice, "exec python3 -c \"$0\" \"$1\"");
    cmd.arg(script)
        .arg(t.p("k/mapped"))
        .stdin(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = spawn(&mut cmd);
    let stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "dirty\n");
    t.handle.detach(id).unwrap();
    drop(stdin);
    child.wait().unwrap();
    t.gate.set(0, ALLOW);
    t.attach("k", &alice, false);
    let data = fs::read(t.p("k/mapped")).unwrap();
    assert_eq!(&data[10..16], b"stored");
}
