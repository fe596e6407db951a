//! `pam_cloakfs.so`: opens the user's cloakfs volumes at login with the login password, and
//! closes them when their last session ends (the EFS paper's PAM integration, eCryptfs's
//! pam_ecryptfs).
//!
//! - **auth** keeps the password that an earlier module (pam_unix) checked, as PAM data in
//!   locked memory, wiped when the session has used it or the PAM handle ends; never logged,
//!   never put in the environment.
//! - **session open** mounts each volume that `/etc/security/cloakfs.conf` lists for the
//!   user ([`config`]) by running `cloakfs mount --bind user --passfile -` as the user, the
//!   password on a pipe; a volume already mounted by an earlier session is shared.
//! - **session close** unmounts a volume when no other session holds it (the `sessions` module).
//! - **password** re-wraps the passphrase slot from the old login password to the new one
//!   (`cloakfs passwd`, both on pipes). Without the old one (root set the password) nothing
//!   can be re-wrapped: every login tells the user to run `cloakfs passwd`, until one whose
//!   password opens every volume (a login that shows no messages, as `ssh host command`,
//!   does not use the notice up).
//!
//! Nothing here blocks a login: a missing volume, a wrong password, a broken config line
//! each log one line (syslog, auth facility) and the module returns PAM_IGNORE (or the
//! result `on_error=` names).
//!
//! Module arguments: `config=FILE` (default /etc/security/cloakfs.conf), `cloakfs=PROGRAM`
//! (/usr/bin/cloakfs), `rundir=DIR` (/run/cloakfs-pam: who holds which mount),
//! `statedir=DIR` (/var/lib/cloakfs/pam: passwords changed without the old one),
//! `on_error=ignore|success|fail`.

mod account;
pub mod config;
mod helper;
mod secret;
mod sessions;

use account::Account;
use pam::constants::{PamFlag, PamResultCode, PAM_SILENT, PAM_TEXT_INFO};
use pam::conv::Conv;
use pam::items::{AuthTok, OldAuthTok, Service};
use pam::module::{PamHandle, PamHooks};
use secret::LockedBytes;
use std::ffi::{CStr, OsStr};
use std::path::{Path, PathBuf};

/// PAM data name under which auth leaves the password for the session.
const PASSWORD_DATA: &str = "cloakfs_login_password";
/// `pam_sm_chauthtok` flags (Linux-PAM's values): the first pass only checks, the second
/// changes.
const PAM_PRELIM_CHECK: PamFlag = 0x4000;
const PAM_UPDATE_AUTHTOK: PamFlag = 0x2000;

struct Options {
    config: PathBuf,
    cloakfs: PathBuf,
    rundir: PathBuf,
    statedir: PathBuf,
    on_error: PamResultCode,
}

impl Options {
    /// The module arguments; a bad one is logged and its default kept.
    fn parse(args: &[&CStr], log: &Log) -> Options {
        let mut o = Options {
            config: "/etc/security/cloakfs.conf".into(),
            cloakfs: "/usr/bin/cloakfs".into(),
            rundir: "/run/cloakfs-pam".into(),
            statedir: "/var/lib/cloakfs/pam".into(),
            on_error: PamResultCode::PAM_IGNORE,
        };
        for a in args {
            let a = a.to_string_lossy();
            match a.split_once('=') {
                Some(("config", v)) => o.config = v.into(),
                Some(("cloakfs", v)) => o.cloakfs = v.into(),
                Some(("rundir", v)) => o.rundir = v.into(),
                Some(("statedir", v)) => o.statedir = v.into(),
                Some(("on_error", "ignore")) => o.on_error = PamResultCode::PAM_IGNORE,
                Some(("on_error", "success")) => o.on_error = PamResultCode::PAM_SUCCESS,
                Some(("on_error", "fail")) => o.on_error = PamResultCode::PAM_SESSION_ERR,
                _ => log.warn(&format!("unknown module argument '{a}' ignored")),
            }
        }
        o
    }
}

/// One syslog line per event, facility auth, prefixed with the service and phase.
struct Log {
    prefix: String,
}

impl Log {
    fn new(pamh: &PamHandle, phase: &str) -> Log {
        let service = pamh
            .get_item::<Service>()
            .ok()
            .flatten()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "?".into());
        Log {
            prefix: format!("pam_cloakfs({service}:{phase})"),
        }
    }

    fn line(&self, level: libc::c_int, msg: &str) {
        let text = format!("{}: {}", self.prefix, msg.replace('\n', " "));
        if let Ok(c) = std::ffi::CString::new(text) {
            // SAFETY: syslog with a constant "%s" format and one valid C string argument.
            unsafe { libc::syslog(libc::LOG_AUTH | level, c"%s".as_ptr(), c.as_ptr()) };
        }
    }

    fn warn(&self, msg: &str) {
        self.line(libc::LOG_WARNING, msg)
    }

    fn info(&self, msg: &str) {
        self.line(libc::LOG_INFO, msg)
    }
}

/// The user of the PAM transaction, their account, and the volumes the config gives them.
struct Login {
    account: Account,
    volumes: Vec<config::Volume>,
}

impl Login {
    /// None (after logging why, if it is worth a line) when there is nothing to do. A
    /// `quiet` look (at session close) reports nothing that session open reported already.
    fn of(pamh: &mut PamHandle, o: &Options, log: &Log, quiet: bool) -> Option<Login> {
        let user = pamh.get_user(None).ok()?;
        let text = match std::fs::read_to_string(&o.config) {
            Ok(t) => t,
            // Not configured: nothing to do, nothing to say.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                if !quiet {
                    log.warn(&format!("cannot read {}: {e}", o.config.display()));
                }
                return None;
            }
        };
        let Some(account) = Account::lookup(&user) else {
            log.warn(&format!("user {user}: not in the user database"));
            return None;
        };
        let groups = account.group_names();
        let who = config::Who {
            name: &account.name,
            home: &account.home,
            groups: &groups,
        };
        let (volumes, bad) = config::volumes_for(&text, &who);
        for b in bad.into_iter().filter(|_| !quiet) {
            log.warn(&format!(
                "{} line {}: {} (line skipped)",
                o.config.display(),
                b.line,
                b.why
            ));
        }
        (!volumes.is_empty()).then_some(Login { account, volumes })
    }
}

/// The flag left when a password was changed without the old one.
fn stale_flag(o: &Options, uid: u32) -> PathBuf {
    o.statedir.join(format!("{uid}.password-changed"))
}

struct CloakFsPam;
pam::pam_hooks!(CloakFsPam);

impl PamHooks for CloakFsPam {
    fn sm_authenticate(pamh: &mut PamHandle, args: Vec<&CStr>, _flags: PamFlag) -> PamResultCode {
        let log = Log::new(pamh, "auth");
        let _ = Options::parse(&args, &log);
        let kept = match pamh.get_item::<AuthTok>() {
            Ok(Some(tok)) => LockedBytes::copy_of(tok.as_bytes()),
            _ => None,
        };
        if let Some(secret) = kept {
            if pamh
                .set_data::<LockedBytes>(PASSWORD_DATA, Box::new(secret))
                .is_err()
            {
                log.warn("cannot keep the login password for the session");
            }
        }
        // Authentication is not this module's to decide.
        PamResultCode::PAM_IGNORE
    }

    fn sm_setcred(_pamh: &mut PamHandle, _args: Vec<&CStr>, _flags: PamFlag) -> PamResultCode {
        PamResultCode::PAM_IGNORE
    }

    fn sm_open_session(pamh: &mut PamHandle, args: Vec<&CStr>, flags: PamFlag) -> PamResultCode {
        let log = Log::new(pamh, "session");
        let o = Options::parse(&args, &log);
        let password = take_password(pamh);
        let Some(login) = Login::of(pamh, &o, &log, false) else {
            return PamResultCode::PAM_IGNORE;
        };
        let user = login.account.name.clone();
        let Some(me) = sessions::Holder::this_process() else {
            log.warn(&format!(
                "user {user}: cannot identify this session's process"
            ));
            return o.on_error;
        };
        let mut failed = false;
        for v in &login.volumes {
            match open_volume(&o, &login.account, v, password.as_ref(), me) {
                Ok(Some(what)) => log.info(&format!("user {user}: {what}")),
                Ok(None) => {}
                Err(why) => {
                    log.warn(&format!("user {user}: {why}"));
                    failed = true;
                }
            }
        }
        let flag = stale_flag(&o, login.account.uid);
        if flag.exists() {
            if !failed && password.is_some() {
                // The login password opens every volume: `cloakfs passwd` was run.
                let _ = std::fs::remove_file(&flag);
            } else if flags & PAM_SILENT == 0 {
                let dirs: Vec<String> = login
                    .volumes
                    .iter()
                    .map(|v| v.cipherdir.display().to_string())
                    .collect();
                // Said at every login until then: a login program may take the message and
                // show it nowhere (sshd running a command without a terminal).
                tell(
                    pamh,
                    &format!(
                        "cloakfs: your login password was set without the old one, so {} \
                         still opens with your previous password. Run `cloakfs passwd {}` \
                         (previous password first, then your login password).",
                        dirs.join(", "),
                        dirs[0]
                    ),
                );
            }
        }
        if failed {
            o.on_error
        } else {
            PamResultCode::PAM_SUCCESS
        }
    }

    fn sm_close_session(pamh: &mut PamHandle, args: Vec<&CStr>, _flags: PamFlag) -> PamResultCode {
        let log = Log::new(pamh, "session");
        let o = Options::parse(&args, &log);
        drop(take_password(pamh));
        let Some(login) = Login::of(pamh, &o, &log, true) else {
            return PamResultCode::PAM_IGNORE;
        };
        let Some(me) = sessions::Holder::this_process() else {
            return PamResultCode::PAM_IGNORE;
        };
        let mut failed = false;
        for v in &login.volumes {
            match close_volume(&o, &login.account, v, me) {
                Ok(Some(what)) => log.info(&format!("user {}: {what}", login.account.name)),
                Ok(None) => {}
                Err(why) => {
                    log.warn(&format!("user {}: {why}", login.account.name));
                    failed = true;
                }
            }
        }
        if failed {
            o.on_error
        } else {
            PamResultCode::PAM_SUCCESS
        }
    }

    fn sm_chauthtok(pamh: &mut PamHandle, args: Vec<&CStr>, flags: PamFlag) -> PamResultCode {
        if flags & PAM_PRELIM_CHECK != 0 || flags & PAM_UPDATE_AUTHTOK == 0 {
            return PamResultCode::PAM_IGNORE;
        }
        let log = Log::new(pamh, "password");
        let o = Options::parse(&args, &log);
        let Some(login) = Login::of(pamh, &o, &log, false) else {
            return PamResultCode::PAM_IGNORE;
        };
        let user = login.account.name.clone();
        let new = pamh
            .get_item::<AuthTok>()
            .ok()
            .flatten()
            .and_then(|t| LockedBytes::copy_of(t.as_bytes()));
        let old = pamh
            .get_item::<OldAuthTok>()
            .ok()
            .flatten()
            .and_then(|t| LockedBytes::copy_of(t.as_bytes()));
        let Some(new) = new else {
            log.warn(&format!(
                "user {user}: no new password given to re-wrap with"
            ));
            return o.on_error;
        };
        let mut failed = false;
        for v in login.volumes.iter().filter(|v| has_volume(&v.cipherdir)) {
            let dir = v.cipherdir.display();
            let outcome = match &old {
                None => Err(
                    "the password was set without the old one: the volume still opens \
                     with the previous password; the user is told at the next login"
                        .to_string(),
                ),
                Some(old) => helper::run_as(
                    &o.cloakfs,
                    &login.account,
                    &[
                        OsStr::new("passwd"),
                        OsStr::new("--passfile"),
                        OsStr::new("-"),
                        OsStr::new("--new-passfile"),
                        OsStr::new("/dev/fd/3"),
                        v.cipherdir.as_os_str(),
                    ],
                    Some(old.expose()),
                    Some(new.expose()),
                )
                .map_err(|e| format!("cannot run {}: {e}", o.cloakfs.display()))
                .and_then(|r| if r.ok() { Ok(()) } else { Err(r.last_error) }),
            };
            match outcome {
                Ok(()) => log.info(&format!(
                    "user {user}: passphrase of {dir} changed along with the login password"
                )),
                Err(why) => {
                    log.warn(&format!("user {user}: {dir}: {why}"));
                    mark_stale(&o, login.account.uid, &log);
                    failed = true;
                }
            }
        }
        if failed {
            o.on_error
        } else {
            PamResultCode::PAM_SUCCESS
        }
    }
}

/// The password auth kept, as a copy; the kept one is wiped.
fn take_password(pamh: &mut PamHandle) -> Option<LockedBytes> {
    // SAFETY: data under this name is only ever set by this module, as a LockedBytes.
    let copy = unsafe { pamh.get_data::<LockedBytes>(PASSWORD_DATA) }
        .ok()
        .and_then(|p| LockedBytes::copy_of(p.expose()));
    if copy.is_some() {
        // Replacing the data runs the old one's cleanup, which zeroes it. The new value is
        // of the same type (get_data above relies on it), and empty.
        if let Some(empty) = LockedBytes::copy_of(b"") {
            let _ = pamh.set_data::<LockedBytes>(PASSWORD_DATA, Box::new(empty));
        }
    }
    copy.filter(|p| !p.expose().is_empty())
}

/// Gives `msg` to the login program to show the user (which may not show it).
fn tell(pamh: &PamHandle, msg: &str) {
    if let Ok(Some(conv)) = pamh.get_item::<Conv>() {
        let _ = conv.send(PAM_TEXT_INFO, msg);
    }
}

fn mark_stale(o: &Options, uid: u32, log: &Log) {
    use std::os::unix::fs::DirBuilderExt;
    let r = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&o.statedir)
        .and_then(|()| std::fs::write(stale_flag(o, uid), b""));
    if let Err(e) = r {
        log.warn(&format!(
            "cannot record the password change in {}: {e}",
            o.statedir.display()
        ));
    }
}

fn has_volume(cipherdir: &Path) -> bool {
    cipherdir.join("cloakfs.conf").is_file()
}

/// Mounts `v` for this session, or joins the mount an earlier session made. What happened,
/// worth an info line; or why not, worth a warning.
fn open_volume(
    o: &Options,
    account: &Account,
    v: &config::Volume,
    password: Option<&LockedBytes>,
    me: sessions::Holder,
) -> Result<Option<String>, String> {
    if !has_volume(&v.cipherdir) {
        return Err(format!("no cloakfs volume in {}", v.cipherdir.display()));
    }
    let mp = sessions::resolve_mountpoint(&v.mountpoint)
        .map_err(|e| format!("mount point {}: {e}", v.mountpoint.display()))?;
    let mut state = sessions::State::lock(&o.rundir, account.uid)
        .map_err(|e| format!("session records in {}: {e}", o.rundir.display()))?;
    let what = if sessions::cloakfs_mounted_at(&mp) {
        if !state.marked(&mp) {
            // The user mounted it: theirs to unmount.
            return Ok(None);
        }
        state.hold(me, &mp);
        format!("{} already mounted: shared with this session", mp.display())
    } else {
        let Some(password) = password else {
            return Err(format!(
                "no login password to unlock {} with (a key or token login?): run cloakfs \
                 mount by hand",
                v.cipherdir.display()
            ));
        };
        let mut args = vec![
            OsStr::new("mount"),
            OsStr::new("--bind"),
            OsStr::new("user"),
            OsStr::new("--passfile"),
            OsStr::new("-"),
        ];
        if !v.options.is_empty() {
            args.extend([OsStr::new("-o"), OsStr::new(&v.options)]);
        }
        args.extend([v.cipherdir.as_os_str(), mp.as_os_str()]);
        let r = helper::run_as(&o.cloakfs, account, &args, Some(password.expose()), None)
            .map_err(|e| format!("cannot run {}: {e}", o.cloakfs.display()))?;
        if !r.ok() {
            return Err(format!(
                "{} not mounted: {}",
                v.cipherdir.display(),
                r.last_error
            ));
        }
        state.mark(&mp);
        state.hold(me, &mp);
        format!("mounted {} on {}", v.cipherdir.display(), mp.display())
    };
    state
        .save()
        .map_err(|e| format!("session records in {}: {e}", o.rundir.display()))?;
    Ok(Some(what))
}

/// Ends this session's hold on `v`; unmounts it when no session holds it any more.
fn close_volume(
    o: &Options,
    account: &Account,
    v: &config::Volume,
    me: sessions::Holder,
) -> Result<Option<String>, String> {
    let mp = match sessions::resolve_mountpoint(&v.mountpoint) {
        Ok(p) => p,
        Err(_) => return Ok(None),
    };
    let mut state = sessions::State::lock(&o.rundir, account.uid)
        .map_err(|e| format!("session records in {}: {e}", o.rundir.display()))?;
    if !state.marked(&mp) {
        return Ok(None);
    }
    let left = state.release(me, &mp);
    let mut what = None;
    let mut failure = None;
    if left == 0 {
        if sessions::cloakfs_mounted_at(&mp) {
            let unmount = |lazy: bool| {
                let mut args = vec![OsStr::new("unmount")];
                if lazy {
                    args.push(OsStr::new("-z"));
                }
                args.push(mp.as_os_str());
                helper::run_as(&o.cloakfs, account, &args, None, None)
            };
            match unmount(false) {
                Ok(r) if r.ok() => what = Some(format!("unmounted {}", mp.display())),
                _ => match unmount(true) {
                    Ok(r) if r.ok() => {
                        what = Some(format!(
                            "{} busy at the last logout: detached (it ends when its last \
                             open file is closed)",
                            mp.display()
                        ))
                    }
                    Ok(r) => {
                        failure = Some(format!("{} not unmounted: {}", mp.display(), r.last_error))
                    }
                    Err(e) => failure = Some(format!("cannot run {}: {e}", o.cloakfs.display())),
                },
            }
        }
        state.unmark(&mp);
    }
    state
        .save()
        .map_err(|e| format!("session records in {}: {e}", o.rundir.display()))?;
    match failure {
        Some(f) => Err(f),
        None => Ok(what),
    }
}
