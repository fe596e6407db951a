//! `cloakfs unmount`: unmount a plaintext view. The kernel writes back all cached data to the
//! daemon before the unmount completes.

use crate::failure::{Failure, Result};
use clap::Args;
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
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = mnt.to_string_lossy();
    Ok(info.lines().any(|l| {
        let fields: Vec<&str> = l.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            return false;
        };
        fields.get(4).map(|p| unescape(p)) == Some(want.to_string())
            && fields.get(sep + 1) == Some(&"fuse.cloakfs")
    }))
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = u8::from_str_radix(&s[i + 1..i + 4], 8).unwrap_or(b'?');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
