//! `cloakfs unmount`: unmount a plaintext view. The kernel writes back all cached data to the
//! daemon before the unmount completes.

use crate::failure::{Failure, Result};
use clap::Args;
use cloakfs_core::tools::mounts;
use std::path::Path;
use std::path::PathBuf;
use std::process::Command;

#[derive(Debug, Args)]
pub struct UnmountArgs {
    /// Detach now even if busy; the file system goes away when no longer used.
    #[arg(short = 'z', long)]
    pub lazy: bool,
    /// The mount point.
    pub mountpoint: PathBuf,
}

pub fn run(args: UnmountArgs) -> Result<()> {
    let mnt = std::fs::canonicalize(&args.mountpoint)
        .map_err(|e| Failure::usage(format!("{}: {e}", args.mountpoint.display())))?;
    if !is_cloakfs_mount(&mnt)? {
        return Err(Failure::usage(format!(
            "{} is not a cloakfs mount point",
            mnt.display()
        )));
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg(if args.lazy { "-uz" } else { "-u" }).arg(&mnt);
    let out = cmd
        .output()
        .map_err(|e| Failure::mount(format!("cannot run fusermount3: {e}")))?;
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stderr);
        return Err(Failure::mount(format!(
            "unmount of {} failed: {}",
            mnt.display(),
            msg.trim()
        )));
    }
    Ok(())
}

/// Whether `mnt` is the mount point of a cloakfs file system, per /proc/self/mountinfo.
pub fn is_cloakfs_mount(mnt: &Path) -> Result<bool> {
    let mounts = mounts::current()?;
    Ok(mounts::at(&mounts, mnt).is_some_and(|m| m.fstype == mounts::CLOAKFS_TYPE))
}
