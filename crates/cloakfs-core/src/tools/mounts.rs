//! The mount table as cloakfs's tools read it (`/proc/self/mountinfo`): which mount holds a
//! directory, what is mounted at a path, where a cipher directory is mounted.

use crate::error::{Error, Result};
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// File system type of every cloakfs mount.
pub const CLOAKFS_TYPE: &str = "fuse.cloakfs";

/// One line of the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted.
    pub point: PathBuf,
    /// Its file system type, e.g. `ext4`, `fuse.cloakfs`.
    pub fstype: String,
    /// What is mounted (a device, `host:/export`; a cloakfs mount's cipher directory).
    pub source: PathBuf,
}

/// The mounts of this process's mount namespace, in the order they were made.
pub fn current() -> std::io::Result<Vec<Mount>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// The lines of a mountinfo text that parse (others are skipped).
pub fn parse(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            Some(Mount {
                point: unescape(f.get(4)?).into(),
                fstype: (*f.get(sep + 1)?).to_string(),
                source: unescape(f.get(sep + 2)?).into(),
            })
        })
        .collect()
}

/// The mount that holds `dir` (an absolute, canonical path): the one with the deepest mount
/// point above it, the last one made there if several are.
pub fn holding<'a>(mounts: &'a [Mount], dir: &Path) -> Option<&'a Mount> {
    let mut best: Option<&Mount> = None;
    for m in mounts.iter().filter(|m| dir.starts_with(&m.point)) {
        if best.is_none_or(|b| m.point.components().count() >= b.point.components().count()) {
            best = Some(m);
        }
    }
    best
}

/// The mount whose mount point is `point` itself (the last one made there), if any.
pub fn at<'a>(mounts: &'a [Mount], point: &Path) -> Option<&'a Mount> {
    mounts.iter().rev().find(|m| m.point == point)
}

/// mountinfo escapes space, tab, newline and backslash as three octal digits.
fn unescape(s: &str) -> OsString {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            out.push(u8::from_str_radix(&s[i + 1..i + 4], 8).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    OsString::from_vec(out)
}

/// The mount point of a cloakfs mount of `cipherdir` (its FUSE source, or fsname, is the
/// cipher directory), per /proc/self/mountinfo. A mount given another `fsname=` is not found.
pub fn mounted_at(cipherdir: &Path) -> std::io::Result<Option<PathBuf>> {
    let want = std::fs::canonicalize(cipherdir)?;
    Ok(current()?
        .into_iter()
        .find(|m| m.fstype == CLOAKFS_TYPE && m.source == want)
        .map(|m| m.point))
}

/// Refuses a volume that is mounted.
pub fn check_not_mounted(cipherdir: &Path) -> Result<()> {
    if let Some(m) = mounted_at(cipherdir)? {
        return Err(Error::Busy(format!(
            "{} is mounted on {}: unmount it first",
            cipherdir.display(),
            m.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /srv/team rw,relatime shared:2 - fuse.glusterfs 10.0.0.1:vol rw,user_id=0
41 40 0:36 / /srv/team/local\\040disk rw - ext4 /dev/sdb1 rw
50 22 0:40 / /mnt/nas rw - nfs4 nas:/export rw
60 22 0:41 / /home/u/Private rw - fuse.cloakfs /home/u/.Private\\040x rw
61 22 0:42 / /home/u/Private rw - fuse.cloakfs /home/u/other rw
";

    #[test]
    fn the_deepest_mount_above_the_directory_holds_it() {
        let m = parse(MOUNTINFO);
        let t = |p: &str| holding(&m, Path::new(p)).map(|m| m.fstype.as_str());
        assert_eq!(t("/srv/team/crypt"), Some("fuse.glusterfs"));
        assert_eq!(t("/srv/team/local disk/c"), Some("ext4"));
        assert_eq!(t("/srv/teamx"), Some("ext4"));
        assert_eq!(t("/mnt/nas/c"), Some("nfs4"));
    }

    #[test]
    fn the_last_mount_at_a_point_is_the_one_seen_there() {
        let m = parse(MOUNTINFO);
        let top = at(&m, Path::new("/home/u/Private")).unwrap();
        assert_eq!(top.source, Path::new("/home/u/other"));
        assert_eq!(m[4].source, Path::new("/home/u/.Private x"));
        assert!(at(&m, Path::new("/home/u")).is_none());
    }
}
