//! `cloakfs encrypt PATH... [-r]`: encrypts plaintext entries of an adopted tree in place,
//! through its mount. Each entry is converted atomically by the daemon (ENCRYPT_IOCTL): an
//! interrupted run leaves every entry either plaintext or encrypted, and running it again
//! finishes the rest. Once `-r` of the mount's root has converted everything, the mount is
//! asked to record that the tree is converted (after which it serves no plaintext entry).

use crate::commands::fsck::Bar;
use crate::failure::{Failure, Result};
use clap::Args;
use cloakfs_fuse::{Encrypted, ENCRYPT_IOCTL, ENCRYPT_IOCTL_ARG};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct EncryptArgs {
    /// Encrypt the directories and everything below them too.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// Plaintext files, symlinks (or with -r directories) on a mount of an adopted tree.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

/// Sends ENCRYPT_IOCTL with `name` (empty: the conversion is finished) to directory `dir`;
/// `what` names the request in errors.
fn ask_mount(dir: &Path, name: &[u8], what: &Path) -> Result<i32> {
    let fail = |why: String| Failure::other(format!("{}: {why}", what.display()));
    if name.len() >= ENCRYPT_IOCTL_ARG {
        return Err(fail("name too long".into()));
    }
    let dir = std::fs::File::open(dir).map_err(|e| fail(e.to_string()))?;
    let mut arg = [0u8; ENCRYPT_IOCTL_ARG];
    arg[..name.len()].copy_from_slice(name);
    // SAFETY: ENCRYPT_IOCTL is _IOW with a 256-byte argument, and `arg` is 256 bytes that
    // live across the call; the kernel only reads them.
    let r = unsafe { libc::ioctl(dir.as_raw_fd(), ENCRYPT_IOCTL as _, arg.as_ptr()) };
    if r != -1 {
        return Ok(r);
    }
    let e = std::io::Error::last_os_error();
    Err(fail(match e.raw_os_error() {
        Some(libc::ENOTTY) | Some(libc::EINVAL) => "not on a cloakfs mount".to_string(),
        Some(libc::EOPNOTSUPP) => {
            "not on a mount of an adopted tree (cloakfs init --adopt)".to_string()
        }
        Some(libc::EBUSY) => "open by a process; close it and run again".to_string(),
        Some(libc::EMLINK) => "has other hard links; not encrypted".to_string(),
        Some(libc::EXDEV) => "a directory with extended attributes is not encrypted in \
                              place; copy it through the mount (cp -a) and remove it"
            .to_string(),
        Some(libc::ENOTEMPTY) => "plaintext entries are left that this run did not see (the \
                                  mount's log names the first; cloakfs fsck lists them): \
                                  the conversion is not recorded as finished"
            .to_string(),
        _ => e.to_string(),
    }))
}

/// Asks the mount to encrypt `entry` in place.
fn encrypt_one(entry: &Path) -> Result<Encrypted> {
    let name = entry
        .file_name()
        .ok_or_else(|| Failure::other(format!("{}: not a file name", entry.display())))?;
    let parent = match entry.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match ask_mount(parent, name.as_bytes(), entry)? {
        0 => Ok(Encrypted::Now),
        1 => Ok(Encrypted::Already),
        other => Err(Failure::other(format!(
            "{}: unexpected answer {other} from the mount",
            entry.display()
        ))),
    }
}

/// Whether `dir` is the root of a mount (its parent lies on another file system).
fn is_mount_root(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(dir), std::fs::metadata(dir.join(".."))) {
        (Ok(d), Ok(p)) => d.dev() != p.dev() || d.ino() == p.ino(),
        _ => false,
    }
}

/// The entries of `paths` (directories only with `recursive`, then with everything below
/// them), and the total size of their files.
fn collect(paths: &[PathBuf], recursive: bool) -> Result<(Vec<PathBuf>, u64)> {
    let mut files = Vec::new();
    let mut total = 0;
    let mut pending: Vec<PathBuf> = paths.iter().rev().cloned().collect();
    while let Some(p) = pending.pop() {
        let m = std::fs::symlink_metadata(&p)
            .map_err(|e| Failure::usage(format!("{}: {e}", p.display())))?;
        if m.is_dir() {
            if !recursive {
                return Err(Failure::usage(format!(
                    "{} is a directory (use -r)",
                    p.display()
                )));
            }
            let mut entries = std::fs::read_dir(&p)
                .and_then(|it| {
                    it.map(|e| e.map(|e| e.path()))
                        .collect::<Vec<_>>()
                        .into_iter()
                        .collect::<std::io::Result<Vec<_>>>()
                })
                .map_err(|e| Failure::other(format!("{}: {e}", p.display())))?;
            entries.sort();
            pending.extend(entries.into_iter().rev());
            if !is_mount_root(&p) {
                files.push(p);
            }
        } else {
            if m.is_file() {
                total += m.len();
            }
            files.push(p);
        }
    }
    Ok((files, total))
}

pub fn run(args: EncryptArgs) -> Result<()> {
    let (files, total) = collect(&args.paths, args.recursive)?;
    let bar = Bar::new("encrypting");
    bar.catch_signals();
    use cloakfs_core::tools::walk::Progress;
    bar.start(total, files.len() as u64);
    let (mut now, mut already) = (0u64, 0u64);
    for f in &files {
        if bar.stopped() {
            bar.finish();
            return Err(Failure::other(format!(
                "stopped after {now} files; run it again to encrypt the rest"
            )));
        }
        let size = std::fs::symlink_metadata(f).map(|m| m.len()).unwrap_or(0);
        match encrypt_one(f) {
            Ok(Encrypted::Now) => now += 1,
            Ok(Encrypted::Already) => already += 1,
            Err(e) => {
                bar.finish();
                return Err(e);
            }
        }
        bar.advance(size, 1);
    }
    bar.finish();
    println!("Encrypted {now} entries ({already} already encrypted).");
    for root in args
        .paths
        .iter()
        .filter(|p| args.recursive && is_mount_root(p))
    {
        ask_mount(root, b"", root)?;
        println!(
            "{}: no plaintext entry is left; from now on the volume serves none (unless \
             mounted with --accept-plaintext)",
            root.display()
        );
    }
    Ok(())
}
