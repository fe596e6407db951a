//! `cloakfs unmount`: unmount a plaintext view. The kernel writes back all cached data to the
//! daemon before the unmount completes.

use crate::failure::{Failure, Result};
use clap::Args;
use cloakfs_core::tools::mounts;
use std::path::Path;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

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
    // Busy with no holder: processes that just exited may not have had their files released
    // yet (the kernel closes some in the background, e.g. an io_uring's), so try again for a
    // while; a holder that exists is named instead.
    let deadline = Instant::now() + RELEASE_WAIT;
    let mut pause = Duration::from_millis(10);
    loop {
        let msg = match fusermount(&mnt, args.lazy)? {
            None => return Ok(()),
            Some(msg) => msg,
        };
        if !msg.contains("busy") {
            return Err(failed(&mnt, &msg));
        }
        let holders = crate::holders::of(&mnt);
        if !holders.is_empty() {
            return Err(failed(
                &mnt,
                &format!(
                    "it is in use: {} (close them, or detach it now with `cloakfs unmount -z`)",
                    crate::holders::describe(&holders)
                ),
            ));
        }
        if Instant::now() >= deadline {
            return Err(failed(
                &mnt,
                "it is busy, though no process holds a file or directory in it (the kernel may \
                 still be releasing files of processes that ended: try again, or detach it now \
                 with `cloakfs unmount -z`)",
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// How long an unmount that is busy without a holder is retried.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// Runs fusermount3; `None` on success, else what it said.
fn fusermount(mnt: &Path, lazy: bool) -> Result<Option<String>> {
    let out = Command::new("fusermount3")
        .arg(if lazy { "-uz" } else { "-u" })
        .arg(mnt)
        .output()
        .map_err(|e| Failure::mount(format!("cannot run fusermount3: {e}")))?;
    Ok((!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).trim().to_string()))
}

fn failed(mnt: &Path, why: &str) -> Failure {
    Failure::mount(format!("unmount of {} failed: {why}", mnt.display()))
}

/// Whether `mnt` is the mount point of a cloakfs file system, per /proc/self/mountinfo.
pub fn is_cloakfs_mount(mnt: &Path) -> Result<bool> {
    let mounts = mounts::current()?;
    Ok(mounts::at(&mounts, mnt).is_some_and(|m| m.fstype == mounts::CLOAKFS_TYPE))
}
