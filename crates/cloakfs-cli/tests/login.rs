//! Unlocked at login: pam_cloakfs.so driven by real PAM (pamtester, with a service file of
//! the test's own in /etc/pam.d) and by a real sshd on 127.0.0.1 (its own config, port and
//! throwaway host key) with password logins through sshpass. Users are real (useradd, names
//! starting with cfsl); each test works in a private view of the machine (common/machine.rs),
//! whose /dev/log is read to check the module's one-line reports.

mod common;

use common::machine::{mounted_here, wait_exit, Machine, TestUser};
use common::{s, BIN};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const PASSWORD: &str = "Tangerine-Voyage-83";
const NEW_PASSWORD: &str = "Copper-Lantern-57";
/// syslog's auth facility.
const LOG_AUTH: u32 = 4;

/// The module installed for one test: the cloakfs binary and the module where every user
/// can run them, a PAM service file of its own, and the module's config.
struct Pam {
    m: Machine,
    service: String,
    conf: PathBuf,
    bin: PathBuf,
}

impl Pam {
    fn new(tag: &str) -> Pam {
        let m = Machine::enter();
        let bin = m.path("cloakfs");
        std::fs::copy(BIN, &bin).unwrap();
        let module = PathBuf::from(BIN).with_file_name("libpam_cloakfs.so");
        assert!(
            module.exists(),
            "{} is missing: build it with cargo build --release -p pam-cloakfs",
            module.display()
        );
        let so = m.path("pam_cloakfs.so");
        std::fs::copy(&module, &so).unwrap();
        let conf = m.path("cloakfs.conf");
        std::fs::write(&conf, "* ~/.Private.enc ~/Private\n").unwrap();
        std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o644)).unwrap();
        let service = format!("cfsl-{tag}-{}", std::process::id());
        let args = format!(
            "config={} cloakfs={} rundir={} statedir={}",
            s(&conf),
            s(&bin),
            s(&m.path("run")),
            s(&m.path("state"))
        );
        let so = s(&so);
        // As pam-auth-update lays the stacks out: the module after pam_unix, which must
        // succeed first.
        std::fs::write(
            format!("/etc/pam.d/{service}"),
            format!(
                "auth     requisite pam_unix.so\n\
                 auth     optional  {so} {args}\n\
                 account  required  pam_unix.so\n\
                 session  required  pam_unix.so\n\
                 session  optional  {so} {args}\n\
                 password requisite pam_unix.so\n\
                 password optional  {so} {args}\n"
            ),
        )
        .unwrap();
        Pam {
            m,
            service,
            conf,
            bin,
        }
    }

    /// A user with a login password and a private directory made by `setup-private`.
    fn user(&self, name: &str) -> TestUser {
        let u = self.m.user(name, PASSWORD);
        let pw = self.m.path(&format!("{name}.pw"));
        std::fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
        let out = u
            .command(&self.bin)
            .args(["setup-private", "--passfile", s(&pw)])
            .args(["--kdf-memory", "64", "--kdf-iterations", "1"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "setup-private: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains(&format!("\n{name} ~/.Private.enc ~/Private\n")),
            "{text}"
        );
        assert!(u.home.join(".Private.enc/cloakfs.conf").is_file());
        assert!(u.home.join("Private").is_dir());
        u
    }

    /// pamtester OPS for `user` with `input` on its standard input, run by `as_uid` (None:
    /// root; Some: with that real uid, set-user-ID root, as passwd runs).
    fn pamtester(
        &self,
        user: &TestUser,
        ops: &[&str],
        input: &str,
        as_uid: Option<u32>,
    ) -> (bool, String) {
        let mut c = match as_uid {
            None => Command::new("pamtester"),
            Some(uid) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--ruid={uid}")).arg("pamtester");
                c
            }
        };
        let mut child = c
            .arg("-v")
            .arg(&self.service)
            .arg(&user.name)
            .args(ops)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// authenticate and open_session (and close_session if `close`) with `password`.
    fn login(&self, u: &TestUser, password: &str, close: bool) -> String {
        let mut ops = vec!["authenticate", "open_session"];
        if close {
            ops.push("close_session");
        }
        let (ok, out) = self.pamtester(u, &ops, &format!("{password}\n"), None);
        assert!(ok, "pamtester: {out}");
        out
    }

    /// The module's syslog lines since the last call; each must be of the auth facility.
    fn module_log(&self) -> Vec<String> {
        self.m
            .syslog_with("pam_cloakfs(")
            .into_iter()
            .map(|(facility, line)| {
                assert_eq!(facility, LOG_AUTH, "{line}");
                line
            })
            .collect()
    }
}

impl Drop for Pam {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(format!("/etc/pam.d/{}", self.service));
    }
}

fn private(u: &TestUser) -> PathBuf {
    u.home.join("Private")
}

/// Unmounts what a failed test left (as the user: their daemon serves it).
fn unmount_left(u: &TestUser, bin: &std::path::Path) {
    if mounted_here(&private(u)) {
        let _ = u
            .command(bin)
            .arg("unmount")
            .arg("-z")
            .arg(private(u))
            .output();
    }
}

#[test]
fn pamtester_login_mounts_and_the_last_logout_unmounts() {
    let pam = Pam::new("pt");
    let u = pam.user("cfsl-pt1");
    pam.module_log();
    pam.login(&u, PASSWORD, false);
    assert!(mounted_here(&private(&u)), "not mounted after login");
    let log = pam.module_log();
    assert!(
        log.iter()
            .any(|l| l.contains("mounted ") && l.contains(".Private.enc")),
        "{log:?}"
    );
    // The plaintext is in ~/Private for the user, only ciphertext in ~/.Private.enc.
    let (rc, out) = u.sh("echo 'dear diary' > ~/Private/diary && cat ~/Private/diary");
    assert_eq!((rc, out.as_str()), (0, "dear diary\n"));
    let (rc, _) = u.sh("grep -rq 'dear diary' ~/.Private.enc");
    assert_ne!(rc, 0, "plaintext in the cipher directory");
    // Root is not the user: the mount is bound to them.
    assert!(std::fs::read_dir(private(&u)).is_err());
    // A second session joins, then closes: the first one's process (pamtester) is gone,
    // so this close is the last and unmounts.
    pam.login(&u, PASSWORD, true);
    assert!(
        !mounted_here(&private(&u)),
        "still mounted after the last logout"
    );
    let log = pam.module_log();
    assert!(
        log.iter().any(|l| l.contains("shared with this session")),
        "{log:?}"
    );
    assert!(log.iter().any(|l| l.contains("unmounted")), "{log:?}");
    // What was written is in the volume for the next login.
    pam.login(&u, PASSWORD, false);
    assert_eq!(u.sh("cat ~/Private/diary").1, "dear diary\n");
    pam.login(&u, PASSWORD, true);
    assert!(!mounted_here(&private(&u)));
}

#[test]
fn a_login_is_never_blocked_and_each_problem_is_one_line() {
    let pam = Pam::new("nb");
    let u = pam.user("cfsl-nb1");
    pam.module_log();

    // The volume does not open with the login password.
    u.set_password(NEW_PASSWORD);
    let out = pam.login(&u, NEW_PASSWORD, false);
    assert!(out.contains("successfully opened a session"), "{out}");
    assert!(!mounted_here(&private(&u)));
    let log = pam.module_log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(
        log[0].contains("not mounted") && log[0].contains("wrong"),
        "{log:?}"
    );
    assert!(!log[0].contains(NEW_PASSWORD) && !log[0].contains(PASSWORD));

    // A broken config line (reported, skipped) and a volume that is not there.
    std::fs::write(&pam.conf, "* ~/.Private.enc\n* ~/missing.enc ~/Missing\n").unwrap();
    u.set_password(PASSWORD);
    let out = pam.login(&u, PASSWORD, true);
    assert!(out.contains("successfully opened a session"), "{out}");
    let log = pam.module_log();
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(
        log[0].contains("line 1") && log[0].contains("2 fields"),
        "{log:?}"
    );
    assert!(log[1].contains("no cloakfs volume in"), "{log:?}");

    // A config that cannot be read at all.
    std::fs::remove_file(&pam.conf).unwrap();
    std::fs::create_dir(&pam.conf).unwrap();
    let out = pam.login(&u, PASSWORD, true);
    assert!(out.contains("successfully opened a session"), "{out}");
    let log = pam.module_log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(log[0].contains("cannot read"), "{log:?}");
}

/// Key pinning holds for PAM mounts: the user's record of known volumes refuses a volume
/// whose config was replaced by one of a volume this user never opened here (made with the
/// same password by whoever can write the directory).
#[test]
fn a_replaced_config_is_refused_at_login() {
    let pam = Pam::new("kp");
    let u = pam.user("cfsl-kp1");
    let pw = pam.m.path("cfsl-kp1.pw");
    let (rc, out) = u.sh(&format!(
        "CLOAKFS_STATE_DIR=~/elsewhere {b} init --passfile {pw} --kdf-memory 64 \
         --kdf-iterations 1 ~/other.enc >/dev/null && \
         cp ~/other.enc/cloakfs.conf ~/.Private.enc/cloakfs.conf",
        b = s(&pam.bin),
        pw = s(&pw)
    ));
    assert_eq!(rc, 0, "{out}");
    pam.module_log();
    pam.login(&u, PASSWORD, false);
    assert!(!mounted_here(&private(&u)));
    let log = pam.module_log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(log[0].contains("not mounted"), "{log:?}");
    assert!(
        log[0].contains("another volume") || log[0].contains("replaced"),
        "{log:?}"
    );
}

#[test]
fn a_password_change_rewraps_the_volume() {
    let pam = Pam::new("pw");
    let u = pam.user("cfsl-pw1");
    pam.module_log();
    // The user changes their password, as passwd runs: their real uid, set-user-ID root.
    let (ok, out) = pam.pamtester(
        &u,
        &["chauthtok"],
        &format!("{PASSWORD}\n{NEW_PASSWORD}\n{NEW_PASSWORD}\n"),
        Some(u.uid),
    );
    assert!(ok, "chauthtok: {out}");
    let log = pam.module_log();
    assert!(
        log.iter()
            .any(|l| l.contains("changed along with the login password")),
        "{log:?}"
    );
    // The volume opens with the new password only.
    let test = |p: &str| {
        let f = pam.m.path("try.pw");
        std::fs::write(&f, format!("{p}\n")).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        u.sh(&format!(
            "{} slots test --passfile {} ~/.Private.enc",
            s(&pam.bin),
            s(&f)
        ))
        .0
    };
    assert_eq!(test(NEW_PASSWORD), 0);
    assert_eq!(test(PASSWORD), 1);
    // The next login (new password) mounts.
    pam.login(&u, NEW_PASSWORD, false);
    assert!(mounted_here(&private(&u)));
    pam.login(&u, NEW_PASSWORD, true);
    assert!(!mounted_here(&private(&u)));
    unmount_left(&u, &pam.bin);
}

#[test]
fn a_password_set_by_root_is_told_at_each_login_until_fixed() {
    let pam = Pam::new("rs");
    let u = pam.user("cfsl-rs1");
    let sshd = Sshd::start(&pam);
    pam.module_log();
    // Root sets the password: no old one, nothing can be re-wrapped.
    let (ok, out) = pam.pamtester(
        &u,
        &["chauthtok"],
        &format!("{NEW_PASSWORD}\n{NEW_PASSWORD}\n"),
        None,
    );
    assert!(ok, "chauthtok: {out}");
    let log = pam.module_log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(log[0].contains("without the old one"), "{log:?}");
    // A login that shows no messages (ssh running a command) does not use the notice up.
    let quiet = sshd.login(&pam, &u, NEW_PASSWORD, "echo in; read x; true");
    assert_eq!(quiet.first, "in");
    assert!(!quiet.logout().contains("cloakfs passwd"));
    // Each login says so until it is fixed; the volume still has the old password.
    for _ in 0..2 {
        let out = pam.login(&u, NEW_PASSWORD, true);
        assert!(out.contains("cloakfs passwd"), "{out}");
        assert!(!mounted_here(&private(&u)));
    }
    // Following the advice fixes it.
    let (old, new) = (pam.m.path("old.pw"), pam.m.path("new.pw"));
    for (f, p) in [(&old, PASSWORD), (&new, NEW_PASSWORD)] {
        std::fs::write(f, format!("{p}\n")).unwrap();
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let (rc, out) = u.sh(&format!(
        "{} passwd --passfile {} --new-passfile {} ~/.Private.enc",
        s(&pam.bin),
        s(&old),
        s(&new)
    ));
    assert_eq!(rc, 0, "{out}");
    let out = pam.login(&u, NEW_PASSWORD, false);
    assert!(mounted_here(&private(&u)));
    assert!(!out.contains("cloakfs passwd"), "{out}");
    let out = pam.login(&u, NEW_PASSWORD, true);
    assert!(!out.contains("cloakfs passwd"), "{out}");
    unmount_left(&u, &pam.bin);
}

/// A real sshd on 127.0.0.1, started and stopped by the test, whose PAM service is the
/// test's (sshd takes its program name as the service name: it runs through a link).
struct Sshd {
    child: Child,
    port: u16,
}

impl Sshd {
    fn start(pam: &Pam) -> Sshd {
        let link = pam.m.path(&pam.service);
        std::os::unix::fs::symlink("/usr/sbin/sshd", &link).unwrap();
        let key = pam.m.path("host_ed25519");
        let st = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key)
            .status()
            .unwrap();
        assert!(st.success());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = pam.m.path("sshd_config");
        std::fs::write(
            &config,
            format!(
                "ListenAddress 127.0.0.1\nPort {port}\nHostKey {}\nPidFile none\n\
                 UsePAM yes\nPasswordAuthentication yes\nKbdInteractiveAuthentication no\n\
                 PubkeyAuthentication no\nPermitRootLogin no\nStrictModes no\nPrintMotd no\n\
                 PrintLastLog no\nAllowUsers cfsl-*\n",
                s(&key)
            ),
        )
        .unwrap();
        // -D: stays in the foreground. It logs to syslog, as installed: with -e (standard
        // error) its log calls leave the C library's syslog connection, which PAM modules
        // share, to dangle across its fork and descriptor changes.
        let child = Command::new(&link)
            .args(["-D", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        assert!(
            pam.m
                .wait_for_syslog(&format!("Server listening on 127.0.0.1 port {port}"), 30),
            "sshd did not start"
        );
        Sshd { child, port }
    }

    /// Logs `u` in with `password` and runs `command`; the client's stdin stays open
    /// until the returned session is ended.
    fn login(&self, pam: &Pam, u: &TestUser, password: &str, command: &str) -> SshSession {
        let pw = pam.m.path("ssh.pw");
        std::fs::write(&pw, format!("{password}\n")).unwrap();
        let before = self.connections();
        let mut child = Command::new("sshpass")
            .arg("-f")
            .arg(&pw)
            .args(["ssh", "-p", &self.port.to_string()])
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
                "-o",
                "PreferredAuthentications=password",
                "-o",
                "PubkeyAuthentication=no",
            ])
            .arg(format!("{}@127.0.0.1", u.name))
            .arg(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        // Logged in and the command ran: its connection's privileged process exists.
        let after = self.connections();
        let new: Vec<i32> = after.into_iter().filter(|p| !before.contains(p)).collect();
        assert_eq!(new.len(), 1, "first line {first:?}: connections {new:?}");
        SshSession {
            child,
            out,
            first: first.trim_end().to_string(),
            monitor: new[0],
        }
    }

    /// The privileged processes of the connections (sshd's children that run PAM).
    fn connections(&self) -> Vec<i32> {
        let me = self.child.id() as i32;
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| {
                let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                let ppid: i32 = stat
                    .rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()?;
                let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).ok()?;
                (ppid == me && cmd.contains("[priv]")).then_some(pid)
            })
            .collect()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        // SAFETY: kill on the sshd this test started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

struct SshSession {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    /// The command's first line of output.
    first: String,
    /// sshd's privileged process of the connection: it closes the PAM session and exits.
    monitor: i32,
}

impl SshSession {
    /// Ends the command (EOF on its standard input) and logs out; returns the rest of the
    /// command's output once the server has closed the PAM session.
    fn logout(mut self) -> String {
        drop(self.child.stdin.take());
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.out, &mut rest).unwrap();
        assert!(self.child.wait().unwrap().success());
        assert!(wait_exit(self.monitor, 30), "sshd's session did not end");
        rest
    }
}

#[test]
fn ssh_logins_share_the_mount_until_the_last_logout() {
    let pam = Pam::new("ssh");
    let u = pam.user("cfsl-ssh1");
    let sshd = Sshd::start(&pam);
    pam.module_log();

    let a = sshd.login(
        &pam,
        &u,
        PASSWORD,
        "echo hello > ~/Private/hello && cat ~/Private/hello; read x; true",
    );
    assert_eq!(a.first, "hello");
    assert!(mounted_here(&private(&u)));
    let b = sshd.login(
        &pam,
        &u,
        PASSWORD,
        "cat ~/Private/hello; read x; cat ~/Private/hello",
    );
    assert_eq!(b.first, "hello");

    // The first logout leaves the mount to the second session.
    a.logout();
    assert!(
        mounted_here(&private(&u)),
        "unmounted while a session remains"
    );
    // The last one unmounts (after its command read the file once more).
    assert_eq!(b.logout(), "hello\n");
    assert!(
        !mounted_here(&private(&u)),
        "still mounted after the last logout"
    );
    let log = pam.module_log();
    assert!(
        log.iter().any(|l| l.contains("shared with this session")),
        "{log:?}"
    );
    assert!(log.iter().any(|l| l.contains("unmounted")), "{log:?}");
    assert!(u.home.join("Private").read_dir().unwrap().next().is_none());

    // After a password change through PAM, the next ssh login mounts with the new one.
    let (ok, out) = pam.pamtester(
        &u,
        &["chauthtok"],
        &format!("{PASSWORD}\n{NEW_PASSWORD}\n{NEW_PASSWORD}\n"),
        Some(u.uid),
    );
    assert!(ok, "chauthtok: {out}");
    let c = sshd.login(&pam, &u, NEW_PASSWORD, "cat ~/Private/hello");
    assert_eq!(c.first, "hello");
    c.logout();
    assert!(!mounted_here(&private(&u)));
    unmount_left(&u, &pam.bin);
}

#[test]
fn setup_private_refuses_what_it_cannot_do() {
    let pam = Pam::new("sp");
    let u = pam.user("cfsl-sp1");
    let pw = pam.m.path("cfsl-sp1.pw");
    // Already set up: the volume is there.
    let (rc, out) = u.sh(&format!(
        "{} setup-private --passfile {}",
        s(&pam.bin),
        s(&pw)
    ));
    assert_eq!(rc, 3, "{out}");
    assert!(out.contains("already holds a cloakfs volume"), "{out}");
    // Not the login password.
    let v = pam.m.user("cfsl-sp2", PASSWORD);
    let wrong = pam.m.path("wrong.pw");
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (rc, out) = v.sh(&format!(
        "{} setup-private --passfile {} --kdf-memory 64 --kdf-iterations 1",
        s(&pam.bin),
        s(&wrong)
    ));
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("not your login password"), "{out}");
    assert_eq!(out.trim_end().lines().count(), 1, "{out}");
    assert!(!v.home.join(".Private.enc").exists());
}
