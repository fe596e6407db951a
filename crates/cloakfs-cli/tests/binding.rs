//! Key binding (Cryptfs): `cloakfs mount --bind user|session` refuses every other uid (root
//! too, even with allow_other) and every process outside the mounting Unix session;
//! `cloakfs run` shows the view to one command and its children only. Real users (useradd,
//! cfsl prefix), real sessions (setsid), in a private view of the machine
//! (common/machine.rs) where users may mount FUSE and use allow_other.

mod common;

use common::machine::{mounted_here, Machine, TestUser};
use common::{s, BIN, CHEAP_KDF};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::Stdio;

const PASSWORD: &str = "Juniper-Falcon-29";

/// A user with a volume holding `note` (text "bound\n"), an empty mount point, a passfile.
struct Setup {
    m: Machine,
    u: TestUser,
    bin: PathBuf,
    cipher: PathBuf,
    mnt: PathBuf,
    pass: PathBuf,
}

impl Setup {
    fn new(name: &str) -> Setup {
        let m = Machine::enter();
        let bin = m.path("cloakfs");
        std::fs::copy(BIN, &bin).unwrap();
        let u = m.user(name, PASSWORD);
        let pass = m.path("pass");
        std::fs::write(&pass, format!("{PASSWORD}\n")).unwrap();
        let (cipher, mnt) = (u.home.join("vault.enc"), u.home.join("vault"));
        let setup = Setup {
            m,
            u,
            bin,
            cipher,
            mnt,
            pass,
        };
        let (rc, out) = setup.sh(&format!(
            "{b} init --passfile {p} {kdf} {c} >/dev/null && mkdir {mnt} && \
             {b} mount --passfile {p} {c} {mnt} && echo bound > {mnt}/note && \
             chmod 644 {mnt}/note && {b} unmount {mnt}",
            b = s(&setup.bin),
            p = s(&setup.pass),
            kdf = CHEAP_KDF.join(" "),
            c = s(&setup.cipher),
            mnt = s(&setup.mnt)
        ));
        assert_eq!(rc, 0, "{out}");
        // Others may walk to the mount point; the volume's own modes decide the rest.
        std::fs::set_permissions(
            &setup.u.home,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        setup
    }

    fn sh(&self, script: &str) -> (i32, String) {
        self.u.sh(script)
    }

    /// `cloakfs run` of the volume at the mount point, as the user, running `command`.
    fn run(&self, command: &[&str]) -> std::process::Command {
        let mut c = self.u.command(&self.bin);
        c.args([
            "run",
            "--passfile",
            s(&self.pass),
            s(&self.cipher),
            s(&self.mnt),
            "--",
        ])
        .args(command);
        c
    }

    fn mount(&self, opts: &str) {
        let (rc, out) = self.sh(&format!(
            "{} mount --passfile {} {opts} {} {}",
            s(&self.bin),
            s(&self.pass),
            s(&self.cipher),
            s(&self.mnt)
        ));
        assert_eq!(rc, 0, "mount {opts}: {out}");
        assert!(mounted_here(&self.mnt));
    }

    fn unmount(&self) {
        let (rc, out) = self.sh(&format!("{} unmount {}", s(&self.bin), s(&self.mnt)));
        assert_eq!(rc, 0, "{out}");
        assert!(!mounted_here(&self.mnt));
    }

    fn note(&self) -> PathBuf {
        self.mnt.join("note")
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if mounted_here(&self.mnt) {
            let _ = self
                .u
                .command(&self.bin)
                .args(["unmount", "-z"])
                .arg(&self.mnt)
                .output();
        }
    }
}

/// `cat FILE` as `u`: (status, output).
fn cat_as(u: &TestUser, f: &std::path::Path) -> (i32, String) {
    u.sh(&format!("cat {}", s(f)))
}

#[test]
fn bind_user_refuses_root_and_other_users_even_with_allow_other() {
    let t = Setup::new("cfsl-bu1");
    let other = t.m.user("cfsl-bu2", PASSWORD);
    t.m.allow_other_for_users();
    t.m.syslog();

    // Without binding, allow_other lets root and the other user in: the control.
    t.mount("-o allow_other");
    assert_eq!(std::fs::read_to_string(t.note()).unwrap(), "bound\n");
    assert_eq!(cat_as(&other, &t.note()), (0, "bound\n".into()));
    t.unmount();

    // Bound to the user: root and the other user are refused, the user is served.
    t.mount("-o allow_other,bind=user");
    let e = std::fs::read_to_string(t.note()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "root: {e}");
    assert!(std::fs::read_dir(&t.mnt).is_err(), "root listed the mount");
    let (rc, out) = cat_as(&other, &t.note());
    assert_ne!(rc, 0);
    assert!(out.contains("Permission denied"), "{out}");
    assert_eq!(cat_as(&t.u, &t.note()), (0, "bound\n".into()));
    // Writes by the user (cached, written back by the kernel later) still land.
    let (rc, out) = t.sh(&format!(
        "echo more >> {n} && sync && cat {n}",
        n = s(&t.note())
    ));
    assert_eq!((rc, out.as_str()), (0, "bound\nmore\n"));
    // The daemon says once per refused caller why.
    let log: Vec<String> =
        t.m.syslog_with("refused uid")
            .into_iter()
            .map(|(_, l)| l)
            .collect();
    assert!(log.iter().any(|l| l.contains("refused uid 0 ")), "{log:?}");
    assert!(
        log.iter()
            .any(|l| l.contains(&format!("refused uid {} ", other.uid))),
        "{log:?}"
    );
    t.unmount();
}

#[test]
fn bind_session_refuses_the_users_other_sessions() {
    let t = Setup::new("cfsl-bs1");
    // One shell leads its own session; it mounts, bound to that session.
    let mut shell =
        t.u.command("setsid")
            .args(["sh", "-s"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
    let mut input = shell.stdin.take().unwrap();
    let mut output = BufReader::new(shell.stdout.take().unwrap());
    let mut ask = |cmd: &str| {
        writeln!(input, "{cmd} 2>&1; echo \"__rc=$?\"").unwrap();
        let mut text = String::new();
        loop {
            let mut line = String::new();
            assert!(
                output.read_line(&mut line).unwrap() > 0,
                "shell died: {text}"
            );
            if let Some(rc) = line.trim_end().strip_prefix("__rc=") {
                return (rc.parse::<i32>().unwrap(), text);
            }
            text.push_str(&line);
        }
    };
    let (rc, out) = ask(&format!(
        "{} mount --passfile {} --bind session {} {}",
        s(&t.bin),
        s(&t.pass),
        s(&t.cipher),
        s(&t.mnt)
    ));
    assert_eq!(rc, 0, "{out}");
    assert_eq!(ask(&format!("cat {}", s(&t.note()))), (0, "bound\n".into()));
    // The same user in another session (setsid) is refused, even what the bound session
    // has just looked at (nothing of it comes from the kernel's caches)...
    let (rc, out) = t.sh(&format!("setsid -w stat -c %s {}", s(&t.note())));
    assert_ne!(rc, 0, "{out}");
    assert!(out.contains("Permission denied"), "{out}");
    let (rc, out) = t.sh(&format!("setsid -w cat {}", s(&t.note())));
    assert_ne!(rc, 0);
    assert!(out.contains("Permission denied"), "{out}");
    // ...as is a process the test runs as that user outside any of the shell's sessions.
    assert_ne!(cat_as(&t.u, &t.note()).0, 0);
    // Children of the mounting session are served.
    assert_eq!(
        ask(&format!("sh -c 'cat {}'", s(&t.note()))),
        (0, "bound\n".into())
    );
    let (rc, out) = ask(&format!("{} unmount {}", s(&t.bin), s(&t.mnt)));
    assert_eq!(rc, 0, "{out}");
    drop(input);
    let _ = shell.wait();
}

#[test]
fn bind_session_refuses_everyone_once_the_sessions_leader_has_exited() {
    // A session ID is a number: after the leader exits, a process of the user can fork until
    // a child gets that pid and setsid() into "the" session. The binding holds the leader
    // itself, so once it is gone nobody is served, not even a process left in the session.
    let t = Setup::new("cfsl-bs2");
    let (go, res) = (t.u.home.join("go"), t.u.home.join("res"));
    let (rc, out) = t.sh(&format!("mkfifo {} {}", s(&go), s(&res)));
    assert_eq!(rc, 0, "{out}");
    // The leader mounts, leaves a member waiting to read the note, and exits.
    let (rc, out) = t.sh(&format!(
        "setsid -w sh -c '{b} mount --passfile {p} --bind session {c} {m} && cat {n}; \
         (read x < {go}; cat {n} > {res} 2>&1) >/dev/null 2>&1 &'",
        b = s(&t.bin),
        p = s(&t.pass),
        c = s(&t.cipher),
        m = s(&t.mnt),
        n = s(&t.note()),
        go = s(&go),
        res = s(&res)
    ));
    assert_eq!((rc, out.as_str()), (0, "bound\n"), "{out}");
    assert!(mounted_here(&t.mnt));
    std::fs::write(&go, "\n").unwrap();
    let seen = std::fs::read_to_string(&res).unwrap();
    assert!(seen.contains("Permission denied"), "{seen}");
    t.unmount();
}

#[test]
fn bad_binding_options_are_refused() {
    let f = common::Fixture::new();
    let out = f.mount(&["--bind", "everyone"]);
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert!(!common::is_mounted(&f.mnt));
    common::assert_fails(
        &f.mount(&["-o", "bind=everyone"]),
        2,
        "bind must be user or session",
    );
    common::assert_fails(
        &f.mount(&["-o", "bind"]),
        2,
        "mount option bind needs a value",
    );
}

/// `cloakfs run` for a user (inside a user namespace): the command sees the view, nobody
/// else does, and it is gone when the command exits.
#[test]
fn run_shows_the_view_to_the_command_only() {
    let t = Setup::new("cfsl-run1");
    let mut child = t
        .run(&[
            "sh",
            "-c",
            &format!("cat {n}; read x; echo $x >> {n}; cat {n}", n = s(&t.note())),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(first, "bound\n");
    // Meanwhile, outside: an empty directory, for root and for the user alike.
    assert!(!mounted_here(&t.mnt));
    assert_eq!(std::fs::read_dir(&t.mnt).unwrap().count(), 0);
    assert_eq!(t.sh(&format!("ls -A {}", s(&t.mnt))), (0, String::new()));
    writeln!(child.stdin.take().unwrap(), "appended").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert_eq!(rest, "bound\nappended\n");
    let st = child.wait().unwrap();
    assert!(st.success(), "{st}");
    assert_eq!(std::fs::read_dir(&t.mnt).unwrap().count(), 0);
    // What the command wrote is in the volume.
    let (rc, text) = t.sh(&format!(
        "{} cat --passfile {} {} note",
        s(&t.bin),
        s(&t.pass),
        s(&t.cipher)
    ));
    assert_eq!((rc, text.as_str()), (0, "bound\nappended\n"));

    // The command's status is passed on; a command that cannot start is 127.
    let run = |cmd: &[&str]| t.run(cmd).output().unwrap();
    assert_eq!(run(&["sh", "-c", "exit 3"]).status.code(), Some(3));
    let o = run(&["/nonexistent/program"]);
    assert_eq!(o.status.code(), Some(127));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot run /nonexistent/program"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!mounted_here(&t.mnt));
}

/// `cloakfs run` serves COMMAND's process tree only: a process of the same user outside it
/// is refused, whether it reaches the view through `/proc/PID/root` of COMMAND, `nsenter`
/// into COMMAND's namespaces, or `/proc/PID/cwd` of a process COMMAND left behind in a
/// session of its own; that one keeps the view, and `cloakfs run` ends when it has gone.
#[test]
fn run_serves_only_the_commands_process_tree() {
    let t = Setup::new("cfsl-run2");
    let (pid_fifo, go_fifo) = (t.u.home.join("pid.fifo"), t.u.home.join("go.fifo"));
    let (rc, out) = t.sh(&format!("mkfifo -m 600 {} {}", s(&pid_fifo), s(&go_fifo)));
    assert_eq!(rc, 0, "{out}");
    // COMMAND prints its pid, leaves a process behind in a session of its own (its working
    // directory in the view; it says its pid, then waits for the go), reads the note when
    // told, and exits.
    let script = format!(
        "echo $$; cat {mnt}/note; setsid sh -c 'cd {mnt} && echo $$ > {pid} && \
         read x < {go}' </dev/null >/dev/null 2>&1 & read x; cat {mnt}/note",
        mnt = s(&t.mnt),
        pid = s(&pid_fifo),
        go = s(&go_fifo)
    );
    let mut child = t
        .run(&["sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let command: u32 = line.trim().parse().unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "bound\n");
    let escapee: u32 = std::fs::read_to_string(&pid_fifo)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let refused = |how: &str, cmd: String| {
        let (rc, said) = t.sh(&cmd);
        assert!(
            rc != 0 && said.contains("Permission denied") && !said.contains("bound"),
            "{how}: {rc} {said}"
        );
    };
    let note = s(&t.note()).to_string();
    refused(
        "/proc/PID/root",
        format!("cat /proc/{command}/root{note} 2>&1"),
    );
    refused(
        "nsenter",
        format!("nsenter -t {command} -U -m --preserve-credentials cat {note} 2>&1"),
    );
    refused(
        "/proc/PID/cwd",
        format!("cat /proc/{escapee}/cwd/note 2>&1"),
    );
    // Nothing COMMAND looked at is answered from the kernel's cache either.
    refused(
        "stat through /proc/PID/root",
        format!("stat -c %s /proc/{command}/root{note} 2>&1"),
    );
    // COMMAND itself reads the view, then exits; the process it left behind keeps the view
    // (outsiders still refused) until it goes.
    let exited = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(command as i32).unwrap(),
        rustix::process::PidfdFlags::empty(),
    )
    .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    drop(stdin);
    let mut rest = String::new();
    out.read_line(&mut rest).unwrap();
    assert_eq!(rest, "bound\n");
    // A pidfd polls readable once its process has exited.
    let mut fds = [rustix::event::PollFd::new(
        &exited,
        rustix::event::PollFlags::IN,
    )];
    rustix::event::poll(&mut fds, None).unwrap();
    refused(
        "/proc/PID/cwd after COMMAND",
        format!("cat /proc/{escapee}/cwd/note 2>&1"),
    );
    std::fs::write(&go_fifo, "go\n").unwrap();
    let st = child.wait().unwrap();
    assert!(st.success(), "{st}");
    assert!(!mounted_here(&t.mnt));
}

#[test]
fn run_as_root_and_its_usage_errors() {
    let f = common::Fixture::new();
    let run = |extra: &[&str]| {
        f.bin()
            .args(["run", "--passfile", s(&f.pass), s(&f.cipher), s(&f.mnt)])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let o = run(&[
        "--",
        "sh",
        "-c",
        &format!("echo x > {}/f && cat {}/f", s(&f.mnt), s(&f.mnt)),
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "x\n");
    assert!(!common::is_mounted(&f.mnt));
    assert_eq!(std::fs::read_dir(&f.mnt).unwrap().count(), 0);
    // No command; a binding of its own.
    assert_eq!(run(&[]).status.code(), Some(2));
    common::assert_fails(
        &run(&["-o", "bind=user", "--", "true"]),
        2,
        "does not apply",
    );
    // A wrong passphrase, before anything is mounted.
    let wrong = f.write_pass("not the passphrase");
    let o = f
        .bin()
        .args([
            "run",
            "--passfile",
            s(&wrong),
            s(&f.cipher),
            s(&f.mnt),
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    common::assert_fails(&o, 1, "");
}
