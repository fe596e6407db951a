//! `cloakfs share`: who a file of a sharing volume is readable by. On a mounted path the
//! running mount does the work (through reserved `user.cloakfs.share.*` xattrs, so open files
//! and caches stay coherent); with `--volume CIPHERDIR` it is done offline on the cipher
//! directory, PATH being the file's path inside the volume.

use crate::args::UnlockArgs;
use crate::commands::slots::recipients_text;
use crate::failure::{code, Failure, Result};
use clap::{Args, Subcommand};
use cloakfs_core::tools::{mounts, rekey, share, translate};
use cloakfs_core::Volume;
use std::path::{Path, PathBuf};

/// The reserved xattr names a mount answers (FORMAT.md section 18.4).
pub mod xattr {
    /// Set: grant the file to the recipients in the value (one per line).
    pub const ADD: &str = "user.cloakfs.share.add";
    /// Get: the file's recipients, one per line.
    pub const LIST: &str = "user.cloakfs.share.list";
    /// Set: withdraw the file from the recipient in the value (a fresh file key, the file
    /// re-encrypted; EBUSY while a handle has the file open).
    pub const REMOVE: &str = "user.cloakfs.share.remove";
    /// Set or get a directory's default recipients (an empty value clears them).
    pub const DEFAULT: &str = "user.cloakfs.share.default";
}

#[derive(Debug, Subcommand)]
pub enum ShareCommand {
    /// Grant a file to more public keys (anyone who can open the file may).
    Add(ChangeArgs),
    /// Withdraw a file from a public key: the file gets a fresh key and is re-encrypted.
    Remove(ChangeArgs),
    /// Show the public keys a file is granted to.
    List(ListArgs),
    /// Set (or, without --recipient, show) the keys new files in a directory are granted to,
    /// besides their creator; directories made below inherit them.
    Default(DefaultArgs),
    /// Write a file's plaintext as a standard age file for someone without cloakfs.
    Export(ExportArgs),
}

#[derive(Debug, Args)]
pub struct DefaultArgs {
    #[command(flatten)]
    pub target: Target,
    /// An age (age1...) or ssh public key, or a file of them (repeatable).
    #[arg(long, value_name = "KEY|FILE", conflicts_with = "clear")]
    pub recipient: Vec<String>,
    /// An OpenPGP key in your gpg keyring (any ID gpg takes; repeatable): its holder reads
    /// with --gpg.
    #[arg(long, value_name = "ID", conflicts_with = "clear")]
    pub gpg_recipient: Vec<String>,
    /// Remove the directory's default recipients.
    #[arg(long)]
    pub clear: bool,
}

/// Where the file is: a path in a mount, or (`--volume`) a path inside a cipher directory.
#[derive(Debug, Args)]
pub struct Target {
    /// Work offline on this cipher directory (PATH is then the file's path inside the volume).
    #[arg(long, value_name = "CIPHERDIR")]
    pub volume: Option<PathBuf>,
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// The file.
    pub path: PathBuf,
}

#[derive(Debug, Args)]
pub struct ChangeArgs {
    #[command(flatten)]
    pub target: Target,
    /// An age (age1...) or ssh public key, or a file of them (repeatable).
    #[arg(
        long,
        value_name = "KEY|FILE",
        required_unless_present = "gpg_recipient"
    )]
    pub recipient: Vec<String>,
    /// An OpenPGP key in your gpg keyring (any ID gpg takes; repeatable): its holder reads
    /// with --gpg.
    #[arg(long, value_name = "ID")]
    pub gpg_recipient: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub target: Target,
    /// Print a JSON object instead of one key per line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub target: Target,
    /// The outsider's age or ssh public key, or a file of them (repeatable).
    #[arg(long, value_name = "KEY|FILE", required = true)]
    pub recipient: Vec<String>,
    /// Where to write the age file ("-" for standard output).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// ASCII-armored output (`age -a`).
    #[arg(long)]
    pub armor: bool,
}

pub fn run(cmd: ShareCommand) -> Result<()> {
    match cmd {
        ShareCommand::Add(a) => change(a, true),
        ShareCommand::Remove(a) => change(a, false),
        ShareCommand::List(a) => list(a),
        ShareCommand::Default(a) => default(a),
        ShareCommand::Export(a) => export(a),
    }
}

fn default(a: DefaultArgs) -> Result<()> {
    let t = &a.target;
    let set = !a.recipient.is_empty() || !a.gpg_recipient.is_empty() || a.clear;
    let text = if a.clear || !set {
        String::new()
    } else {
        recipients(&a.recipient, &a.gpg_recipient)?
    };
    let shown: Vec<String> = match &t.volume {
        Some(c) => {
            rekey::check_not_rekeying(c)?;
            let volume = crate::unlock::unlock(&t.unlock, c)?;
            if !volume.is_sharing() {
                return Err(not_sharing(c));
            }
            let dir =
                translate::lookup(&volume, c, &t.path, true).map_err(|e| located(&t.path, e))?;
            if !dir.is_dir() {
                return Err(Failure::usage(format!(
                    "{}: not a directory",
                    t.path.display()
                )));
            }
            if set {
                let lines = if a.clear {
                    Vec::new()
                } else {
                    cloakfs_core::format::filekey::recipient_lines(&text)?
                };
                share::write_default(&volume, &dir, &lines).map_err(|e| located(&t.path, e))?;
                share::AllowedDefaults::for_volume(&volume).allow(&lines)?;
                return Ok(());
            }
            let all = share::read_default(&volume, &dir).map_err(|e| located(&t.path, e))?;
            let (applied, shown) = share::AllowedDefaults::for_volume(&volume).split(all);
            applied
                .into_iter()
                .chain(
                    shown
                        .into_iter()
                        .map(|r| format!("{r}\t{}", share::NOT_APPLIED)),
                )
                .collect()
        }
        None => {
            let path = mounted(&t.path)?;
            if !path.is_dir() {
                return Err(Failure::usage(format!(
                    "{}: not a directory",
                    t.path.display()
                )));
            }
            if set {
                rustix::fs::setxattr(
                    &path,
                    xattr::DEFAULT,
                    text.as_bytes(),
                    rustix::fs::XattrFlags::empty(),
                )
                .map_err(|e| mount_failure(&t.path, e.into()))?;
                return Ok(());
            }
            let mut buf = vec![0u8; 65536];
            let n = rustix::fs::getxattr(&path, xattr::DEFAULT, &mut buf)
                .map_err(|e| mount_failure(&t.path, e.into()))?;
            String::from_utf8_lossy(&buf[..n])
                .lines()
                .map(String::from)
                .collect()
        }
    };
    for r in shown {
        println!("{r}");
    }
    Ok(())
}

/// Says at mount which keys the root directory of a sharing volume grants new files to by
/// default, and which of them this mount does not apply (set by someone else): a default
/// recipient never goes unnoticed.
pub fn note_root_defaults(volume: &Volume, cipherdir: &Path) {
    if !volume.is_sharing() {
        return;
    }
    let Ok(all) = share::read_default(volume, cipherdir) else {
        return;
    };
    let (applied, shown) = share::AllowedDefaults::for_volume(volume).split(all);
    if !applied.is_empty() {
        eprintln!(
            "cloakfs: new files in the volume's root are also granted to {}",
            applied.join(", ")
        );
    }
    if !shown.is_empty() {
        eprintln!(
            "cloakfs: warning: the volume's root names {} as default recipients; new files \
             are not granted to them {}",
            shown.join(", "),
            share::NOT_APPLIED
        );
    }
}

/// The recipients given, checked (one clear line for a bad one) before anything happens:
/// `--recipient` values as `slots add` takes them, and each `--gpg-recipient` ID as
/// `gpg:FINGERPRINT` of the one key it names in the gpg keyring.
fn recipients(values: &[String], gpg_ids: &[String]) -> Result<String> {
    let mut text = recipients_text(values)?;
    for id in gpg_ids {
        let fpr = cloakfs_core::slots::gpg::resolve(id)
            .map_err(|e| Failure::usage(format!("--gpg-recipient: {e}")))?;
        text.push_str(&format!(
            "{}{fpr}\n",
            cloakfs_core::format::filekey::GPG_PREFIX
        ));
    }
    cloakfs_core::format::filekey::recipient_lines(&text)
        .map_err(|e| Failure::usage(e.to_string()))?;
    Ok(text)
}

/// An offline target: the unlocked volume (joined as the member) and the backing file.
fn offline(t: &Target, cipherdir: &Path) -> Result<(Volume, PathBuf)> {
    rekey::check_not_rekeying(cipherdir)?;
    let volume = crate::unlock::unlock(&t.unlock, cipherdir)?;
    if !volume.is_sharing() {
        return Err(not_sharing(cipherdir));
    }
    let backing =
        translate::lookup(&volume, cipherdir, &t.path, true).map_err(|e| located(&t.path, e))?;
    match std::fs::symlink_metadata(&backing) {
        Ok(m) if m.is_file() => Ok((volume, backing)),
        Ok(_) => Err(Failure::usage(format!(
            "{}: not a regular file",
            t.path.display()
        ))),
        Err(_) => Err(Failure::other(format!(
            "{}: no such file in the volume",
            t.path.display()
        ))),
    }
}

fn located(path: &Path, e: cloakfs_core::Error) -> Failure {
    let mut f = Failure::from(e);
    f.message = format!("{}: {}", path.display(), f.message);
    f
}

fn not_sharing(where_: &Path) -> Failure {
    Failure::new(
        code::VOLUME,
        format!(
            "{}: not a sharing volume (made without `cloakfs init --sharing`)",
            where_.display()
        ),
    )
}

/// The cloakfs mount holding `path`, or a clear failure.
fn mounted(path: &Path) -> Result<PathBuf> {
    let abs = std::fs::canonicalize(path)
        .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    let all =
        mounts::current().map_err(|e| Failure::other(format!("/proc/self/mountinfo: {e}")))?;
    match mounts::holding(&all, &abs) {
        Some(m) if m.fstype == mounts::CLOAKFS_TYPE => Ok(abs),
        _ => Err(Failure::usage(format!(
            "{} is not inside a cloakfs mount (give --volume CIPHERDIR for a path inside a \
             cipher directory)",
            path.display()
        ))),
    }
}

/// What a mount's errno means for a share request.
fn mount_failure(path: &Path, e: std::io::Error) -> Failure {
    let p = path.display();
    match e.raw_os_error() {
        Some(libc::EACCES) => Failure::other(format!(
            "{p}: permission denied: the file is not shared with the identity this mount runs as"
        )),
        Some(libc::EOPNOTSUPP) => Failure::new(
            code::VOLUME,
            format!("{p}: not a sharing volume (made without `cloakfs init --sharing`)"),
        ),
        Some(libc::EISDIR) | Some(libc::EPERM) => {
            Failure::usage(format!("{p}: not a regular file"))
        }
        Some(libc::ENOSPC) | Some(libc::E2BIG) => {
            Failure::other(format!("{p}: too many recipients for the file header"))
        }
        _ => Failure::other(format!("{p}: {e}")),
    }
}

fn change(a: ChangeArgs, add: bool) -> Result<()> {
    let text = recipients(&a.recipient, &a.gpg_recipient)?;
    let t = &a.target;
    if let Some(c) = &t.volume {
        let (volume, backing) = offline(t, c)?;
        let p = &t.path;
        if add {
            let n = share::add(&volume, &backing, &text).map_err(|e| located(p, e))?;
            println!("Granted {} to {n} more key(s).", p.display());
        } else {
            share::remove(&volume, &backing, &text).map_err(|e| located(p, e))?;
            println!(
                "Withdrew {} from that key; it has a fresh file key.",
                p.display()
            );
        }
        return Ok(());
    }
    let path = mounted(&t.path)?;
    if !add {
        withdraw_mounted(&path, &t.path, &text)?;
        println!(
            "Withdrew {} from that key; it has a fresh file key.",
            t.path.display()
        );
        return Ok(());
    }
    rustix::fs::setxattr(
        &path,
        xattr::ADD,
        text.as_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(|e| mount_failure(&t.path, e.into()))?;
    println!("Granted {}.", t.path.display());
    Ok(())
}

/// The recipients of the mounted file at `path`, as its mount reports them.
fn mounted_recipients(path: &Path, shown: &Path) -> Result<Vec<String>> {
    let mut buf = vec![0u8; 65536];
    let n = rustix::fs::getxattr(path, xattr::LIST, &mut buf)
        .map_err(|e| mount_failure(shown, e.into()))?;
    Ok(String::from_utf8_lossy(&buf[..n])
        .lines()
        .map(String::from)
        .collect())
}

/// Asks the mount holding `path` to withdraw the file from `text` (one recipient), after
/// checking what it can say clearly itself: the mount answers a refusal with EINVAL alone.
fn withdraw_mounted(path: &Path, shown: &Path, text: &str) -> Result<()> {
    use cloakfs_core::format::filekey::{recipient_lines, same_key};
    let p = shown.display();
    let target = recipient_lines(text)?;
    let [target] = &target[..] else {
        return Err(Failure::usage(format!("{p}: give one recipient to remove")));
    };
    let current = mounted_recipients(path, shown)?;
    if !current.iter().any(|r| same_key(r, target)) {
        return Err(Failure::usage(format!(
            "{p}: that key is not a recipient of this file"
        )));
    }
    if current.len() == 1 {
        return Err(Failure::usage(format!(
            "{p}: that is the file's only recipient: nobody could open it afterwards"
        )));
    }
    if std::fs::metadata(path).is_ok_and(|m| std::os::unix::fs::MetadataExt::nlink(&m) > 1) {
        return Err(Failure::usage(format!(
            "{p}: the file has several names (hard links): withdrawing it is not supported"
        )));
    }
    let ask = || {
        rustix::fs::setxattr(
            path,
            xattr::REMOVE,
            text.as_bytes(),
            rustix::fs::XattrFlags::empty(),
        )
    };
    // The kernel tells a mount that a handle was closed after close(2) has returned, so a file
    // written just before (`echo plan > f; cloakfs share remove f ...`) may still count as
    // open for a moment: asked again for up to a second before the handle is reported.
    let mut answer = ask();
    for _ in 0..50 {
        if answer != Err(rustix::io::Errno::BUSY) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        answer = ask();
    }
    answer.map_err(|e| match e {
        rustix::io::Errno::BUSY => Failure::other(format!(
            "{p}: the file is open in its mount: close it there, then withdraw (the open \
             handle would go on with the old file)"
        )),
        rustix::io::Errno::INVAL => Failure::other(format!(
            "{p}: the mount refused the withdrawal (a file with several names, or its \
             recipients changed meanwhile; see its log)"
        )),
        e => mount_failure(shown, e.into()),
    })
}

fn list(a: ListArgs) -> Result<()> {
    let t = &a.target;
    let (recipients, verified) = match &t.volume {
        Some(c) => {
            let (volume, backing) = offline(t, c)?;
            let l = share::list(&volume, &backing).map_err(|e| located(&t.path, e))?;
            (l.recipients, l.verified)
        }
        None => {
            let path = mounted(&t.path)?;
            let mut buf = vec![0u8; 65536];
            let n = rustix::fs::getxattr(&path, xattr::LIST, &mut buf)
                .map_err(|e| mount_failure(&t.path, e.into()))?;
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            (text.lines().map(String::from).collect(), true)
        }
    };
    if a.json {
        let v = serde_json::json!({
            "path": t.path.display().to_string(),
            "recipients": recipients,
            "verified": verified,
        });
        println!("{v}");
    } else {
        for r in &recipients {
            println!("{r}");
        }
        if !verified {
            eprintln!(
                "cloakfs: the list is as the file claims: your identity has no entry, so it \
                 could not be authenticated"
            );
        }
    }
    Ok(())
}

fn export(a: ExportArgs) -> Result<()> {
    let text = recipients(&a.recipient, &[])?;
    cloakfs_core::slots::recipient::Recipients::parse(&text)
        .map_err(|e| Failure::usage(e.to_string()))?;
    let t = &a.target;
    let mut out: Box<dyn std::io::Write> = if a.output == Path::new("-") {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            std::fs::File::create(&a.output)
                .map_err(|e| Failure::other(format!("{}: {e}", a.output.display())))?,
        )
    };
    match &t.volume {
        Some(c) => {
            let (volume, backing) = offline(t, c)?;
            share::export(&volume, &backing, &text, a.armor, &mut out)
                .map_err(|e| located(&t.path, e))?;
        }
        None => {
            // Through the mount: its plaintext, read like any program reads it.
            let path = mounted(&t.path)?;
            let mut f = std::fs::File::open(&path).map_err(|e| mount_failure(&t.path, e))?;
            let r = cloakfs_core::slots::recipient::Recipients::parse(&text)?;
            cloakfs_core::slots::recipient::encrypt_stream(&r, a.armor, &mut out, &mut |w| {
                std::io::copy(&mut f, w)?;
                Ok(())
            })
            .map_err(|e| located(&t.path, e))?;
        }
    }
    Ok(())
}
