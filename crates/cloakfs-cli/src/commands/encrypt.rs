//! `cloakfs encrypt PATH... [-r]`: encrypts plaintext files of an adopted tree in place,
//! through its mount. Each file is converted atomically by the daemon (ENCRYPT_IOCTL): an
//! interrupted run leaves every file either plaintext or encrypted, and running it again
//! finishes the rest.

use crate::commands::fsck::Bar;
use crate::failure::{Failure, Result};
use clap::Args;
use cloakfs_fuse::{Encrypted, ENCRYPT_IOCTL, ENCRYPT_IOCTL_ARG};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct EncryptArgs {
    /// Encrypt the files below directories too.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// Plaintext files (or with -r directories) on a mount of an adopted tree.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

/// Asks the mount to encrypt `file` in place.
fn encrypt_one(file: &Path) -> Result<Encrypted> {
    let fail = |what: String| Failure::other(format!("{}: {what}", file.display()));
    let name = file
        .file_name()
        .ok_or_else(|| fail("not a file name".into()))?;
    if name.len() >= ENCRYPT_IOCTL_ARG {
        return Err(fail("name too long".into()));
    }
    let parent = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = std::fs::File::open(parent).map_err(|e| fail(e.to_string()))?;
    let mut arg = [0u8; ENCRYPT_IOCTL_ARG];
    arg[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: ENCRYPT_IOCTL is _IOW with a 256-byte argument, and `arg` is 256 bytes that
    // live across the call; the kernel only reads them.
    let r = unsafe { libc::ioctl(dir.as_raw_fd(), ENCRYPT_IOCTL as _, arg.as_ptr()) };
    match r {
        0 => Ok(Encrypted::Now),
        1 => Ok(Encrypted::Already),
        2 => Ok(Encrypted::NotAFile),
        -1 => {
            let e = std::io::Error::last_os_error();
            Err(fail(match e.raw_os_error() {
                Some(libc::ENOTTY) | Some(libc::EINVAL) => "not on a cloakfs mount".to_string(),
                Some(libc::EOPNOTSUPP) => {
                    "not on a mount of an adopted tree (cloakfs init --adopt)".to_string()
                }
                Some(libc::EBUSY) => "open by a process; close it and run again".to_string(),
                Some(libc::EMLINK) => "has other hard links; not encrypted".to_string(),
                _ => e.to_string(),
            }))
        }
        other => Err(fail(format!("unexpected answer {other} from the mount"))),
    }
}

/// The regular files of `paths`, directories expanded with `recursive`, and their total size.
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
        } else if m.is_file() {
            total += m.len();
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
            Ok(Encrypted::NotAFile) => {}
            Err(e) => {
                bar.finish();
                return Err(e);
            }
        }
        bar.advance(size, 1);
    }
    bar.finish();
    println!("Encrypted {now} files ({already} already encrypted).");
    Ok(())
}
