//! The attacks that worked on the multi-user daemon (issue 22), each performed against the
//! real daemon by real users made with useradd, each working from its own Unix session, and
//! each now shown to do no harm. Users: cfsd-owner (owns the attach), cfsd-mallory and
//! cfsd-carol (attackers), cfsd-bob (a grantee).

mod common;

use common::daemon::{user, wait_for, Daemon, Shell, User};
use common::{is_mounted, s, Detach, CHEAP_KDF};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

fn owner() -> User {
    user("cfsd-owner")
}

fn mallory() -> User {
    user("cfsd-mallory")
}

/// The owner's volume, attached as `name` from `sh` (which becomes the owner's session).
fn attach_owner(d: &Daemon, sh: &mut Shell, name: &str, extra: &str) -> PathBuf {
    d.attach(&owner(), sh, "cipher", name, extra)
}

/// A Python program run as a user (in a session of its own), fed lines on stdin, answering
/// lines on stdout.
struct Helper {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Helper {
    fn start(d: &Daemon, u: &User, script: &str, args: &[&str]) -> Helper {
        let path = d.work.path().join(format!("helper-{}.py", script.len()));
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        Self::spawn(d.command_as(u, "/usr/bin/python3").arg(&path).args(args))
    }

    fn spawn(cmd: &mut Command) -> Helper {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Helper { child, stdin, out }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        l.trim_end().to_string()
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn authz_add_json(name: &str, uid: u32, perms: &[&str]) -> String {
    serde_json::json!({
        "op": "authz-add",
        "name": name,
        "entity": {"kind": "user", "id": uid},
        "perms": perms,
        "auth": {"method": "none"},
    })
    .to_string()
}

/// Mallory's part of the pid-reuse attack: a child connects (and is answered, so the
/// daemon has taken it in), exits and is reaped; the parent keeps the connection, prints
/// the child's pid, then sends each line it is given and prints the answer ("EOF" once the
/// daemon has closed the connection).
const REUSE: &str = r#"
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
f = s.makefile("r")
pid = os.fork()
if pid == 0:
    s.connect(sys.argv[1])
    s.sendall(b'{"op":"status"}\n')
    f.readline()
    os._exit(0)
os.waitpid(pid, 0)
print(pid, flush=True)
for line in sys.stdin:
    try:
        s.sendall(line.encode())
        print(f.readline().strip() or "EOF", flush=True)
    except OSError:
        print("EOF", flush=True)
"#;

/// Finding 1: the daemon used to look up a connection's session by its pid at every
/// request, so a connection kept past its process's exit spoke for whoever got the pid
/// next. Here the pid is handed to the owner's session leader deterministically (through
/// /proc/sys/kernel/ns_last_pid), and the old connection asks for an authorization.
#[test]
fn a_reused_pid_gives_an_old_connection_nothing() {
    let d = Daemon::start();
    let (o, m) = (owner(), mallory());
    let home = d.home(&o);
    let cipher = home.join("cipher");
    let mut prep = d.shell(&o);
    prep.ok(&format!(
        "cloakfs init --passfile {h}/pass {kdf} {c} && chmod 700 {c}",
        h = s(&home),
        kdf = CHEAP_KDF.join(" "),
        c = s(&cipher)
    ));
    drop(prep);
    // Other processes on the machine may take the pid first: try again then.
    let mut attempt = 0;
    let (mut attacker, mut sh) = loop {
        attempt += 1;
        assert!(attempt <= 50, "no pid could be handed over in 50 attempts");
        let mut attacker = Helper::start(&d, &m, REUSE, &[s(&d.socket)]);
        let pid: u32 = attacker.line().parse().unwrap();
        let sh = Shell::spawn(&o, &d, |cmd| {
            std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", pid - 1)).unwrap();
            cmd.spawn().unwrap()
        });
        if sh.child.id() == pid {
            assert_eq!(sh.sid, pid, "the owner's shell leads its session");
            break (attacker, sh);
        }
    };
    // The owner attaches from the shell that now has the attacker's old pid.
    sh.ok(&format!(
        "cloakfs attach --passfile {h}/pass {c} proj && echo top secret > {p}/secret.txt",
        h = s(&home),
        c = s(&cipher),
        p = s(&d.root.join("proj"))
    ));
    // The old connection asks for read access for mallory, as the owner's session.
    attacker.send(&authz_add_json("proj", m.uid, &["read", "bypass"]));
    let answer = attacker.line();
    assert!(answer.contains("\"error\""), "{answer}");
    assert!(answer.contains("has exited"), "{answer}");
    // Not one more answer on that connection.
    attacker.send(r#"{"op":"status"}"#);
    assert_eq!(attacker.line(), "EOF");
    // Nothing was granted, and mallory reads nothing.
    let list = sh.ok("cloakfs authz list --json proj");
    let list: Vec<serde_json::Value> = serde_json::from_str(&list).unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    let mut ms = d.shell(&m);
    ms.fails("cloakfs auth proj");
    assert!(ms
        .fails(&format!("cat {}/secret.txt", s(&d.root.join("proj"))))
        .contains("ermission denied"));
    assert!(d.log().contains("the connecting process has exited"));
}

/// Finding 2: `authz add --user B --callback CMD` ran CMD as B, and `--user root` ran the
/// granter's command as root. Now it runs as the granter, whoever's session timed out.
#[test]
fn callbacks_run_as_the_user_who_set_them() {
    use cloakfs_daemon::client::Client;
    use cloakfs_daemon::protocol::{Request, Response};
    let d = Daemon::start();
    let (o, bob) = (owner(), user("cfsd-bob"));
    let mut sh = d.shell(&o);
    attach_owner(&d, &mut sh, "proj", "");
    let out = d.work.path().join("shared");
    let cb = |who: &str| {
        format!(
            "--callback 'id -u > {o}/{who}.uid; cat /etc/shadow > {o}/{who}.shadow; \
             echo > {o}/{who}.done'",
            o = s(&out)
        )
    };
    sh.ok(&format!(
        "cloakfs authz add proj --user root --perms read --session-ttl 2s {}",
        cb("root")
    ));
    sh.ok(&format!(
        "cloakfs authz add proj --user cfsd-bob --perms read --session-ttl 2s {}",
        cb("bob")
    ));
    // Root (this test) and bob authenticate; both sessions time out.
    let r = Client::connect(&d.socket)
        .unwrap()
        .call(&Request::Auth {
            name: "proj".into(),
            authz: Some(2),
        })
        .unwrap();
    assert!(matches!(r, Response::Authenticated { .. }), "{r:?}");
    d.shell(&bob).ok("cloakfs auth proj");
    for who in ["root", "bob"] {
        let uid_file = out.join(format!("{who}.uid"));
        let done = out.join(format!("{who}.done"));
        wait_for("the callback", || done.exists());
        // Run as the owner, who set it: not as root, not as bob.
        assert_eq!(
            std::fs::read_to_string(&uid_file).unwrap().trim(),
            o.uid.to_string(),
            "{who}'s callback"
        );
        let shadow = std::fs::read_to_string(out.join(format!("{who}.shadow"))).unwrap();
        assert!(shadow.is_empty(), "the callback read /etc/shadow");
    }
}

/// Flooding the control socket: `n` connections held idle until told "go", then each
/// trickles one byte every 0.3 s (a request that never ends) for at most 20 s. Prints
/// "ready A R" (accepted, refused at once), then after the trickle one line per accepted
/// connection: the bytes it had sent when the daemon closed it, or "open".
const FLOOD: &str = r#"
import socket, sys, time, select
path, n = sys.argv[1], int(sys.argv[2])
conns = []
for i in range(n):
    c = socket.socket(socket.AF_UNIX)
    c.connect(path)
    conns.append(c)
# A refused connection is answered at once and closed; an accepted one says nothing. The
# answer on one more connection (refused too) comes after every one before it.
c = socket.socket(socket.AF_UNIX)
c.connect(path)
try:
    c.sendall(b'{"op":"status"}\n')
except OSError:
    pass
c.makefile("r").readline()
c.close()
accepted, refused = [], 0
for c in conns:
    r, _, _ = select.select([c], [], [], 0)
    if r and c.recv(4096):
        refused += 1
    else:
        accepted.append(c)
print("ready", len(accepted), refused, flush=True)
sys.stdin.readline()
sent = {c: 0 for c in accepted}
open_ = set(accepted)
done = {}
deadline = time.time() + 20
while open_ and time.time() < deadline:
    for c in list(open_):
        try:
            c.sendall(b"{"[:1] if sent[c] == 0 else b" ")
            sent[c] += 1
        except OSError:
            done[c] = sent[c]; open_.discard(c); continue
        r, _, _ = select.select([c], [], [], 0)
        if r and not c.recv(4096):
            done[c] = sent[c]; open_.discard(c)
    time.sleep(0.3)
for c in accepted:
    print(done.get(c, "open"), flush=True)
"#;

/// Finding 3: one user holding 64 slow connections locked everyone out of the socket. Now
/// each user holds at most their share, a request must arrive whole within the request
/// timeout however slowly it trickles, and owners always find room.
#[test]
fn a_connection_flood_locks_nobody_out() {
    let d = Daemon::start_with(&[
        "--max-connections",
        "8",
        "--max-connections-per-user",
        "4",
        "--request-timeout",
        "2s",
    ]);
    let (o, m, carol, bob) = (owner(), mallory(), user("cfsd-carol"), user("cfsd-bob"));
    let mut sh = d.shell(&o);
    attach_owner(&d, &mut sh, "proj", "");
    sh.ok("cloakfs authz add proj --user cfsd-bob --perms read");
    // Every connection holds a pidfd of its peer: the owner's are closed.
    let settle = |n: usize| wait_for("connections to settle", || d.pidfds() == 1 + n);
    settle(0);
    // Mallory asks for 20 connections and gets her 4.
    let mut flood_m = Helper::start(&d, &m, FLOOD, &[s(&d.socket), "20"]);
    assert_eq!(flood_m.line(), "ready 4 16");
    // Bob still gets in.
    let mut b = d.shell(&bob);
    b.ok("cloakfs auth proj");
    settle(4);
    // Carol takes the other 4 that all users share.
    let mut flood_c = Helper::start(&d, &carol, FLOOD, &[s(&d.socket), "20"]);
    assert_eq!(flood_c.line(), "ready 4 16");
    assert!(b.fails("cloakfs status").contains("busy"));
    // The owner still sees, lists and revokes: room is kept for owners.
    sh.ok("cloakfs status");
    let sessions = sh.ok("cloakfs sessions --json proj");
    let sessions: Vec<serde_json::Value> = serde_json::from_str(&sessions).unwrap();
    let bobs = sessions.iter().find(|s| s["uid"] == bob.uid).unwrap()["id"]
        .as_u64()
        .unwrap();
    sh.ok(&format!("cloakfs revoke proj {bobs}"));
    // Now the connections trickle: each is cut at the request timeout, not kept alive by
    // its bytes.
    for f in [&mut flood_m, &mut flood_c] {
        f.send("go");
        for _ in 0..4 {
            let l = f.line();
            let sent: u32 = l
                .parse()
                .unwrap_or_else(|_| panic!("a trickling connection stayed open: {l}"));
            assert!(sent >= 1, "cut before its first byte");
        }
    }
    wait_for("bob to get in again", || b.run("cloakfs status").0 == 0);
}

/// Mallory's quota attack, from her own attaching session: `n` `authz add` requests for
/// her attach `name`, each with a callback of `len` bytes, on one connection. Prints the
/// number accepted and the distinct errors.
const AUTHZ_FLOOD: &str = r#"
import json, socket, sys
path, name, n, length, uid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
s = socket.socket(socket.AF_UNIX)
s.connect(path)
f = s.makefile("r")
line = (json.dumps({"op": "authz-add", "name": name, "entity": {"kind": "user", "id": uid},
        "perms": ["read"], "auth": {"method": "none"}, "callback": "x" * length}) + "\n").encode()
ok, errors = 0, set()
for i in range(n):
    s.sendall(line)
    a = json.loads(f.readline())
    if a["result"] == "authz-added":
        ok += 1
    else:
        errors.add(a["message"])
print(ok, json.dumps(sorted(errors)))
"#;

/// Finding 4: 20,000 `authz add` with 60 KB callbacks took the daemon to 1.19 GB. Now
/// quotas bound it, and memory comes back on detach.
#[test]
fn the_quota_attack_is_bounded_and_memory_comes_back() {
    let d = Daemon::start();
    let m = mallory();
    let mut sh = d.shell(&m);
    d.attach(&m, &mut sh, "cipher", "mine", "");
    let script = d.work.path().join("authz-flood.py");
    std::fs::write(&script, AUTHZ_FLOOD).unwrap();
    let flood = |sh: &mut Shell, n: u32, len: usize| -> String {
        sh.ok(&format!(
            "python3 {} {} mine {n} {len} {}",
            s(&script),
            s(&d.socket),
            m.uid
        ))
    };
    let (rss0, _) = d.memory_kib();
    // The issue's attack: every one refused, nothing kept.
    let out = flood(&mut sh, 20_000, 60_000);
    assert!(out.starts_with("0 "), "{out}");
    assert!(out.contains("callback longer than 1024 bytes"), "{out}");
    let (rss1, lck1) = d.memory_kib();
    // The most that is allowed: 127 beside the owner's authorization, then the quota.
    let out = flood(&mut sh, 20_000, 1024);
    assert!(out.starts_with("127 "), "{out}");
    assert!(out.contains("holds 128 authorizations"), "{out}");
    let (rss2, lck2) = d.memory_kib();
    sh.ok("cloakfs detach mine");
    let (rss3, lck3) = d.memory_kib();
    eprintln!(
        "daemon memory (KiB): before {rss0}; after 20,000 x 60 KB {rss1} (locked {lck1}); \
         after 20,000 x 1 KB {rss2} (locked {lck2}); after detach {rss3} (locked {lck3})"
    );
    // The old daemon grew by 1.18 GB here; a bound far below that, far above noise.
    for rss in [rss1, rss2, rss3] {
        assert!(
            rss < rss0 + 32 * 1024,
            "daemon RSS {rss} KiB from {rss0} KiB"
        );
    }
}

/// Finding 5: a cipher directory inside the tree made the tree wait on itself. It is now
/// refused by the device of the opened directory (here reached through a bind mount, a
/// path outside the tree).
#[test]
fn a_cipher_directory_in_the_tree_is_refused() {
    use cloakfs_daemon::client::Client;
    use cloakfs_daemon::protocol::{Request, Response};
    let d = Daemon::start();
    let (o, m) = (owner(), mallory());
    let mut sh = d.shell(&o);
    let plain = attach_owner(&d, &mut sh, "proj", "");
    sh.ok("cloakfs authz add proj --user cfsd-mallory --perms read,write,exec,bypass");
    sh.ok("cloakfs authz add proj --user root --perms read,bypass");
    // Root holds a session on the attach, so the daemon's own requests into it pass the
    // gate (as in the issue: the nested attach then served, and hung the tree).
    let r = Client::connect(&d.socket)
        .unwrap()
        .call(&Request::Auth {
            name: "proj".into(),
            authz: Some(3),
        })
        .unwrap();
    assert!(matches!(r, Response::Authenticated { .. }), "{r:?}");
    let mut ms = d.shell(&m);
    ms.ok("cloakfs auth proj");
    let inner = plain.join("inner");
    ms.ok(&format!(
        "echo pw > {h}/mpass && cloakfs init --passfile {h}/mpass {kdf} {i}",
        h = s(&d.home(&m)),
        kdf = CHEAP_KDF.join(" "),
        i = s(&inner)
    ));
    let attach = |ms: &mut Shell, dir: &Path, name: &str| {
        ms.fails(&format!(
            "cloakfs attach --passfile {}/mpass {} {name}",
            s(&d.home(&m)),
            s(dir)
        ))
    };
    let out = attach(&mut ms, &inner, "evil");
    assert!(out.contains("daemon's own tree"), "{out}");
    // The same directory by another path: root binds the attach elsewhere.
    let bind = d.work.path().join("bind");
    std::fs::create_dir(&bind).unwrap();
    let st = Command::new("mount")
        .arg("--bind")
        .arg(&plain)
        .arg(&bind)
        .status()
        .unwrap();
    assert!(st.success());
    let _unbind = Detach(bind.clone());
    let out = attach(&mut ms, &bind.join("inner"), "evil2");
    assert!(out.contains("daemon's own tree"), "{out}");
    assert_eq!(d.ls_root(), vec!["proj"]);
    // The tree serves on: parallel reads (a hung tree fails here instead of hanging).
    let p = s(&plain);
    let out = sh.ok(&format!(
        "for i in 1 2 3 4 5 6 7 8; do timeout -s KILL 60 cat {p}/secret.txt & done; wait"
    ));
    assert_eq!(out.matches("top secret").count(), 8, "{out}");
}

/// Finding 5, the other half: SIGTERM ends the daemon cleanly however the tree is held
/// (a process working in it, a file open in it).
#[test]
fn sigterm_ends_the_daemon_while_the_tree_is_in_use() {
    let mut d = Daemon::start_with(&["--stop-timeout", "1s"]);
    let (o, bob) = (owner(), user("cfsd-bob"));
    let mut sh = d.shell(&o);
    let plain = attach_owner(&d, &mut sh, "proj", "");
    sh.ok("cloakfs authz add proj --user cfsd-bob --perms read,bypass");
    let mut b = d.shell(&bob);
    b.ok(&format!(
        "cloakfs auth proj && cd {} && exec 3< secret.txt",
        s(&plain)
    ));
    assert_eq!(b.ok("cat secret.txt"), "top secret\n");
    // SAFETY: kill on the daemon's own pid.
    unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    let mut status = None;
    wait_for("the daemon to exit", || {
        status = d.child.try_wait().unwrap();
        status.is_some()
    });
    assert!(status.unwrap().success(), "{status:?}");
    assert!(!is_mounted(&d.root));
    assert!(!d.socket.exists());
    b.fails("cat <&3");
    b.fails("cat secret.txt");
    assert!(d.log().contains("aborting its FUSE connection"));
}

/// Finding 6: a setuid program of another user, run from the owner's attaching session,
/// read the owner's plaintext (and could have used the owner's management rights).
#[test]
fn a_setuid_program_in_the_owners_session_gets_nothing() {
    let d = Daemon::start();
    let (o, m) = (owner(), mallory());
    let mut sh = d.shell(&o);
    let plain = attach_owner(&d, &mut sh, "proj", "");
    // Mallory's setuid copies of cat and cloakfs, and a file only she may read.
    let bin = d.work.path().join("mallory-bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::copy("/bin/cat", bin.join("mcat")).unwrap();
    std::fs::copy(d.bin_dir.join("cloakfs"), bin.join("mcloakfs")).unwrap();
    let hers = bin.join("hers.txt");
    std::fs::write(&hers, "mallory's\n").unwrap();
    common::daemon::chown_r(&bin, &m);
    for (f, mode) in [("mcat", 0o4755), ("mcloakfs", 0o4755), ("hers.txt", 0o600)] {
        std::fs::set_permissions(bin.join(f), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let (mcat, mcloakfs) = (bin.join("mcat"), bin.join("mcloakfs"));
    // It runs as mallory...
    assert_eq!(sh.ok(&format!("{} {}", s(&mcat), s(&hers))), "mallory's\n");
    // ...and gets nothing of the owner's, though it runs in the owner's session.
    let secret = plain.join("secret.txt");
    assert!(sh
        .fails(&format!("{} {}", s(&mcat), s(&secret)))
        .contains("ermission denied"));
    sh.fails(&format!(
        "{} authz add proj --user cfsd-mallory --perms read",
        s(&mcloakfs)
    ));
    sh.fails(&format!("{} sessions proj", s(&mcloakfs)));
    assert_eq!(sh.ok(&format!("cat {}", s(&secret))), "top secret\n");
    // A session grant names a session's leader; --any-uid only means something for one.
    assert!(sh
        .fails(
            "(sleep 60 & cloakfs authz add proj --session $! --perms read; r=$?; kill $!; exit $r)"
        )
        .contains("does not lead a Unix session"));
    assert!(sh
        .fails("cloakfs authz add proj --user cfsd-mallory --any-uid --perms read")
        .contains("--any-uid needs --pid or --session"));
    // Unless the owner says so: a grant for the session's processes of any uid.
    let out = sh.ok(&format!(
        "cloakfs authz add proj --session {} --any-uid --perms read,bypass",
        sh.sid
    ));
    let id = out.split_whitespace().nth(2).unwrap().to_string();
    sh.ok(&format!("cloakfs auth proj --authz {id}"));
    assert_eq!(
        sh.ok(&format!("{} {}", s(&mcat), s(&secret))),
        "top secret\n"
    );
}

/// Finding 7: one wrong answer per second per connection, so 40 connections guessed 40
/// times as fast. Now attempts are booked per authorization and per user before they are
/// checked, with a growing wait, and logged.
#[test]
fn guessing_is_slowed_per_authorization_and_per_user() {
    let d = Daemon::start();
    let (o, m) = (owner(), mallory());
    let mut sh = d.shell(&o);
    attach_owner(&d, &mut sh, "proj", "");
    let home = d.home(&o);
    sh.ok(&format!("echo swordfish > {}/authpass", s(&home)));
    for _ in 0..2 {
        sh.ok(&format!(
            "cloakfs authz add proj --user cfsd-mallory --perms read --auth passphrase \
             --passfile {}/authpass --kdf-memory 64 --kdf-iterations 1",
            s(&home)
        ));
    }
    let mut ms = d.shell(&m);
    ms.ok(&format!(
        "echo guess > {h}/wrong && echo swordfish > {h}/right && chmod 644 {h}/right",
        h = s(&d.home(&m))
    ));
    // Eight guesses at once, on two authorizations, each on its own connection.
    let out = ms.run(&format!(
        "for i in 1 2 3 4; do for z in 2 3; do \
         cloakfs auth proj --authz $z --passfile {}/wrong & done; done; wait",
        s(&d.home(&m))
    ));
    let checked = out.1.matches("authentication failed").count();
    let refused = out.1.matches("too many failed attempts").count();
    assert_eq!(checked + refused, 8, "{}", out.1);
    // A guess is checked only once the wait after the one before has passed (2 s, then
    // 4 s, ...): on a machine that does not stall for seconds, one of eight.
    assert!(
        checked <= 3,
        "{} of 8 guesses were checked: {}",
        checked,
        out.1
    );
    let log = d.log();
    assert!(log.contains("authentication failed") && log.contains("failures_of_uid"));
    assert!(log.contains("refused: too many failed attempts") || log.contains("refused unchecked"));
    // The right passphrase gets in once the wait is over, and the count starts afresh.
    let right = format!(
        "cloakfs auth proj --authz 2 --passfile {}/right",
        s(&d.home(&m))
    );
    loop {
        let (rc, out) = ms.run(&right);
        if rc == 0 {
            break;
        }
        assert!(
            out.contains("too many failed attempts: try again in"),
            "{out}"
        );
        let secs: f64 = out
            .split("try again in ")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(secs <= 16.0, "{out}");
        // The wait is what is under test: let it pass.
        std::thread::sleep(std::time::Duration::from_secs_f64(secs));
    }
}

/// Finding 8: `auth`, `sessions` and `attach` told a hidden name from a missing one.
#[test]
fn a_hidden_attach_answers_like_a_missing_one() {
    let d = Daemon::start();
    let (o, m) = (owner(), mallory());
    let mut sh = d.shell(&o);
    attach_owner(&d, &mut sh, "ghost-x7", "--hidden");
    d.attach(&o, &mut sh, "cipher2", "shown", "");
    let mut ms = d.shell(&m);
    let ask = |ms: &mut Shell, name: &str| -> Vec<(i32, String)> {
        [
            format!("cloakfs auth {name}"),
            format!("cloakfs auth {name} --authz 1"),
            format!("cloakfs sessions {name}"),
            format!("cloakfs authz list {name}"),
            format!("cloakfs authz add {name} --user cfsd-mallory --perms read"),
            format!("cloakfs authz del {name} 1"),
            format!("cloakfs revoke {name} 1"),
            format!("cloakfs detach {name}"),
            format!("ls /x/{name}"),
        ]
        .iter()
        .map(|c| {
            let c = c.replace("/x/", &format!("{}/", s(&d.root)));
            let (rc, out) = ms.run(&c);
            (rc, out.replace(name, "NAME"))
        })
        .collect()
    };
    let hidden = ask(&mut ms, "ghost-x7");
    let missing = ask(&mut ms, "ghost-x8");
    assert_eq!(hidden, missing);
    assert!(hidden.iter().all(|(rc, _)| *rc != 0));
    // Taking the name answers as for any taken name (and counts as a guess: the next
    // given name must wait).
    d.attach(&m, &mut ms, "mcipher", "mine", "");
    let mhome = s(&d.home(&m)).to_string();
    let take = |ms: &mut Shell, name: &str| {
        ms.fails(&format!(
            "cloakfs attach --passfile {mhome}/pass {mhome}/mcipher {name}"
        ))
        .replace(name, "NAME")
    };
    let shown = take(&mut ms, "shown");
    let ghost = take(&mut ms, "ghost-x7");
    assert!(shown.contains("NAME is taken"), "{shown}");
    assert_eq!(ghost, shown);
    assert!(take(&mut ms, "ghost-x9").contains("too many failed attempts"));
    // The owner, entitled to know, is told.
    assert!(sh.ok("cloakfs sessions ghost-x7").contains("ghost-x7"));
}

/// Finding 9: requests for attaches that do not exist made the daemon open pidfds of
/// arbitrary processes (and deleted authorizations kept theirs).
#[test]
fn no_pidfd_is_held_for_refused_or_deleted_requests() {
    let d = Daemon::start();
    let (o, m) = (owner(), mallory());
    let mut sh = d.shell(&o);
    attach_owner(&d, &mut sh, "proj", "");
    // Each connection holds a pidfd of its peer until it closes; the owner's session
    // leader is watched.
    let settle = |n: usize| {
        let start = std::time::Instant::now();
        loop {
            let held = d.pidfds();
            if held == n {
                break;
            }
            assert!(
                start.elapsed() < common::daemon::DEADLINE,
                "the daemon holds {held} pidfds, not {n}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    settle(1);
    // Mallory names processes in requests she may not make, for attaches that do not exist.
    let script = r#"
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("r")
errors = 0
for pid in [int(p) for p in sys.argv[2].split(",")]:
    for name, kind in (("nosuch", "pid"), ("proj", "pid"), ("nosuch", "session"), ("proj", "session")):
        s.sendall((json.dumps({"op": "authz-add", "name": name, "entity": {"kind": kind, "id": pid},
            "perms": ["read"], "auth": {"method": "none"}}) + "\n").encode())
        errors += json.loads(f.readline())["result"] == "error"
print(errors, flush=True)
sys.stdin.readline()
"#;
    let pids = format!("1,{},{},{}", sh.sid, d.child.id(), std::process::id());
    let mut h = Helper::start(&d, &m, script, &[s(&d.socket), &pids]);
    assert_eq!(h.line(), "16");
    // Mallory's connection is all she holds.
    settle(2);
    drop(h);
    settle(1);
    // The owner grants and deletes pid authorizations for 20 processes: none stays held.
    let mut sleepers: Vec<Child> = (0..20)
        .map(|_| Command::new("sleep").arg("600").spawn().unwrap())
        .collect();
    for p in &sleepers {
        sh.ok(&format!(
            "cloakfs authz add proj --pid {} --perms read",
            p.id()
        ));
    }
    settle(21);
    for id in 2..22 {
        sh.ok(&format!("cloakfs authz del proj {id}"));
    }
    settle(1);
    for p in &mut sleepers {
        let _ = p.kill();
        let _ = p.wait();
    }
}

/// Finding 10: `" "`, `"proja "` beside `proja`, `"*"` were accepted as attach names.
#[test]
fn lookalike_names_are_refused() {
    let d = Daemon::start();
    let o = owner();
    let mut sh = d.shell(&o);
    attach_owner(&d, &mut sh, "proja", "");
    let home = s(&d.home(&o)).to_string();
    for bad in [
        " ",
        "proja ",
        " proja",
        "*",
        "pr\u{043e}ja",
        "pro\u{200b}ja",
        "proja\u{202e}",
        "-proja",
        ".proja",
        "a\tb",
    ] {
        let out = sh.fails(&format!(
            "cloakfs attach --passfile {home}/pass {home}/cipher -- '{bad}'"
        ));
        assert_eq!(out.lines().count(), 1, "{bad:?}: {out}");
        assert!(out.contains("attach name"), "{bad:?}: {out}");
    }
    assert_eq!(d.ls_root(), vec!["proja"]);
}

/// The daemon's new options refuse what would disable them.
#[test]
fn zero_timeouts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for opt in ["--request-timeout", "--idle-timeout"] {
        let out = common::cloakfs(&[
            "daemon",
            "--root",
            s(&dir.path().join("crypt")),
            "--socket",
            s(&dir.path().join("sock")),
            opt,
            "0",
        ]);
        common::assert_fails(&out, 2, "must be longer than zero");
        assert!(!dir.path().join("crypt").exists());
    }
}

/// Issue 40, key pinning: the daemon's attach checks the volume against the owner's record of
/// known volumes by the path as named, so a symlink planted where the volume was (by whoever
/// writes its parent directory: an NFS, sshfs or SMB server) to a volume of the attacker's
/// that the owner's secret opens is refused, not taken as a first use.
#[test]
fn a_symlink_planted_where_an_attached_volume_was_is_refused() {
    let d = Daemon::start();
    let o = owner();
    let mut sh = d.shell(&o);
    attach_owner(&d, &mut sh, "pinned", "");
    sh.ok("cloakfs detach pinned");
    let home = d.home(&o);
    let cipher = home.join("cipher");
    std::fs::rename(&cipher, home.join("cipher.real")).unwrap();
    let forged = home.join("cipher2");
    let attackers_machine = d.work.path().join("attackers-machine");
    let st = Command::new(common::BIN)
        .args(["init", "--passfile", s(&home.join("pass"))])
        .args(CHEAP_KDF)
        .arg(&forged)
        .env("CLOAKFS_STATE_DIR", &attackers_machine)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    common::daemon::chown_r(&forged, &o);
    std::os::unix::fs::symlink(&forged, &cipher).unwrap();
    let out = sh.fails(&format!(
        "cloakfs attach --passfile {h}/pass {c} pinned2",
        h = s(&home),
        c = s(&cipher)
    ));
    assert!(
        out.contains("held volume") && out.contains("cloakfs known accept"),
        "{out}"
    );
    assert!(d.ls_root().is_empty(), "{:?}", d.ls_root());
}
