//! `cloakfs setup-private`: the user's private directory, opened at login (as eCryptfs's
//! `ecryptfs-setup-private`): a volume in `~/.Private.enc` whose passphrase is the login
//! password, an empty `~/Private` to mount it on, and the line that tells pam_cloakfs.

use crate::args::NewPassArgs;
use crate::commands::init::{self, InitArgs};
use crate::commands::slots::KdfArgs;
use crate::failure::{Failure, Result};
use crate::secret_input::{read_passphrase_from, Confirm};
use clap::Args;
use cloakfs_core::crypto::secret::Passphrase;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where the config line goes.
const PAM_CONFIG: &str = "/etc/security/cloakfs.conf";

#[derive(Debug, Args)]
#[command(after_long_help = "\
pam_cloakfs mounts the volumes that /etc/security/cloakfs.conf lists for a user when they \
log in, unlocked with the login password, and unmounts them when their last session ends. \
One line per rule: WHO CIPHERDIR MOUNTPOINT [MOUNT-OPTIONS]. WHO is a user name, @group or \
*; a leading ~ is the user's home and %u the user name. Every line that names the user \
applies; of two lines for one mount point the first wins. For example:

    *        ~/.Private.enc   ~/Private
    @staff   /srv/enc/%u      /srv/plain/%u   noexec

Enable the module with `pam-auth-update --enable cloakfs` (it adds pam_cloakfs.so to the \
auth, session and password stacks after pam_unix). Mounts made at login are bound to their \
user (`cloakfs mount --bind user`) and shared by the user's sessions. A changed login \
password (passwd) re-wraps the volume's passphrase; a password set by root without the old \
one cannot, and the next login says to run `cloakfs passwd`. Module arguments: \
config=FILE, cloakfs=PROGRAM, rundir=DIR, statedir=DIR, on_error=ignore|success|fail. \
Problems (no volume, wrong password, a broken line) never block a login: each is one line \
in the system log (auth facility).")]
pub struct SetupPrivateArgs {
    /// Read the login password from the first line of FILE ("-" for standard input) instead
    /// of asking for it twice.
    #[arg(long, value_name = "FILE")]
    pub passfile: Option<PathBuf>,
    /// Argon2id cost of the passphrase slot (default: calibrated to 500 ms here).
    #[command(flatten)]
    pub kdf: KdfArgs,
}

pub fn run(args: SetupPrivateArgs) -> Result<()> {
    let me = Account::current()?;
    let cipherdir = Path::new(&me.home).join(".Private.enc");
    let mountpoint = Path::new(&me.home).join("Private");
    init::precheck(&cipherdir)?;
    match std::fs::read_dir(&mountpoint).map(|mut d| d.next().is_some()) {
        Ok(true) => {
            return Err(Failure::usage(format!(
                "{} is not empty: the private directory is mounted there",
                mountpoint.display()
            )))
        }
        Ok(false) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Failure::other(format!("{}: {e}", mountpoint.display()))),
    }
    let pass = read_passphrase_from(
        args.passfile.as_deref(),
        None,
        "Login password: ",
        Confirm::Twice,
    )?;
    check_login_password(&me.name, &pass)?;
    let kdf = args.kdf.resolve(None)?;
    let init_args = InitArgs {
        secret: NewPassArgs::default(),
        no_stored_key: false,
        cipher: None,
        reverse: false,
        sharing: false,
        adopt: false,
        config: None,
        strict_holes: false,
        long_name_max: cloakfs_core::format::names::LONG_NAME_MAX_DEFAULT,
        kdf_time: 500,
        kdf_memory: Some(kdf.memory_kib),
        kdf_iterations: Some(kdf.iterations),
        cipherdir: cipherdir.clone(),
    };
    create_private_dir(&cipherdir)?;
    init::create(&init_args, &pass)?;
    create_private_dir(&mountpoint)?;
    println!(
        "Made {} (the volume) and {} (where it is mounted at login).",
        cipherdir.display(),
        mountpoint.display()
    );
    println!("For pam_cloakfs to mount it when you log in, {PAM_CONFIG} needs this line:");
    println!();
    println!("{} ~/.Private.enc ~/Private", me.name);
    println!();
    println!(
        "(or `* ~/.Private.enc ~/Private` for every user), and the module must be enabled: \
         pam-auth-update --enable cloakfs (both as root)."
    );
    Ok(())
}

/// A directory only its owner may use (mode 0700), made if missing.
fn create_private_dir(p: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| Failure::other(format!("{}: {e}", p.display())))
        }
        Err(e) => Err(Failure::other(format!("{}: {e}", p.display()))),
    }
}

/// Checks `pass` against the user's login password with PAM's own checker (unix_chkpwd),
/// which answers for the user who runs it. A password it cannot check (another source of
/// accounts, no helper) is taken with a warning.
fn check_login_password(user: &str, pass: &Passphrase) -> Result<()> {
    let helper = ["/usr/sbin/unix_chkpwd", "/sbin/unix_chkpwd"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let status = helper.and_then(|h| {
        let mut child = Command::new(h)
            .args([user, "nullok"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut stdin = child.stdin.take()?;
        // The checker reads NUL-terminated passwords.
        let _ = stdin
            .write_all(pass.expose())
            .and_then(|()| stdin.write_all(b"\0"));
        drop(stdin);
        child.wait().ok()
    });
    /// unix_chkpwd's exit status for a wrong password (PAM_AUTH_ERR).
    const AUTH_ERR: i32 = 7;
    match status.and_then(|s| s.code()) {
        Some(0) => Ok(()),
        Some(AUTH_ERR) => Err(Failure::new(
            crate::failure::code::WRONG_SECRET,
            "that is not your login password: the volume must open with it at login",
        )),
        _ => {
            eprintln!(
                "cloakfs: warning: cannot check that this is your login password; pam_cloakfs \
                 can only open the volume with the password you log in with"
            );
            Ok(())
        }
    }
}

/// The account running this command.
struct Account {
    name: String,
    home: String,
}

impl Account {
    fn current() -> Result<Account> {
        // SAFETY: getuid has no preconditions; getpwuid returns a pointer into static
        // storage (or null) that is read at once, before any other passwd call.
        let (name, home) = unsafe {
            let pw = libc::getpwuid(libc::getuid());
            if pw.is_null() || (*pw).pw_name.is_null() || (*pw).pw_dir.is_null() {
                return Err(Failure::other("this user is not in the user database"));
            }
            (
                std::ffi::CStr::from_ptr((*pw).pw_name)
                    .to_string_lossy()
                    .into_owned(),
                std::ffi::CStr::from_ptr((*pw).pw_dir)
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        Ok(Account { name, home })
    }
}
