//! Symlink targets too long for the backing symlink (docs/FORMAT.md 10.1): their sealed bytes
//! live in `cloakfs.symlinks/<base64url SHA-256 of them>` in the root of the cipher directory,
//! and the backing symlink points to that name. A file there belongs to the symlinks (hard
//! links of one symlink) pointing to it; it is written and made durable before any of them
//! exists, and removed after the last of them is gone, so a crash can leave an unreferenced
//! file (which `fsck --repair` removes) but never a symlink without its target.

use crate::error::{Error, Result};
use crate::format::meta::{long_target_name, MetaCodec, SealedTarget, LONG_TARGETS_DIR};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, Mode, OFlags, Stat};
use std::io::Write;
use std::path::Path;

/// The plaintext target of a backing symlink whose target is `stored`, reading a long
/// target from the cipher directory whose root is `root` (any descriptor of it, `O_PATH` too).
pub fn read_target(meta: &MetaCodec, root: BorrowedFd<'_>, stored: &[u8]) -> Result<Vec<u8>> {
    let Some(name) = long_target_name(stored) else {
        return meta.decrypt_symlink(stored);
    };
    let sealed = read_file(root, name).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            Error::Tampered(format!("long symlink target {name} is missing"))
        }
        _ => Error::Io(e),
    })?;
    meta.open_long_target(name, &sealed)
}

/// [`read_target`] for the cipher directory at `cipherdir` (the offline tools).
pub fn read_target_at(meta: &MetaCodec, cipherdir: &Path, stored: &[u8]) -> Result<Vec<u8>> {
    if long_target_name(stored).is_none() {
        return meta.decrypt_symlink(stored);
    }
    let root = std::fs::File::open(cipherdir)?;
    read_target(meta, root.as_fd(), stored)
}

/// [`store`] for the cipher directory at `cipherdir` (the offline tools).
pub fn store_at(cipherdir: &Path, sealed: &SealedTarget) -> Result<()> {
    if let SealedTarget::Inline(_) = sealed {
        return Ok(());
    }
    let root = std::fs::File::open(cipherdir)?;
    store(root.as_fd(), sealed)
}

fn read_file(root: BorrowedFd<'_>, name: &str) -> std::io::Result<Vec<u8>> {
    let dir = open_dir(root)?;
    let fd = rustix::fs::openat(
        &dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut out)?;
    Ok(out)
}

fn open_dir(root: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        root,
        LONG_TARGETS_DIR,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Makes the target of `sealed` durable before a symlink points to it: a long target's file
/// is written and fsynced, with its directory (made on first use). Nothing to do inline.
pub fn store(root: BorrowedFd<'_>, sealed: &SealedTarget) -> Result<()> {
    let SealedTarget::Long { name, sealed } = sealed else {
        return Ok(());
    };
    let dir = match open_dir(root) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match rustix::fs::mkdirat(root, LONG_TARGETS_DIR, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(Error::Io(e.into())),
            }
            let d = open_dir(root)?;
            sync_root(root)?;
            d
        }
        Err(e) => return Err(Error::Io(e)),
    };
    let fd = rustix::fs::openat(
        &dir,
        name.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(std::io::Error::from)?;
    let mut f = std::fs::File::from(fd);
    let written = f.write_all(sealed).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = rustix::fs::unlinkat(&dir, name.as_str(), AtFlags::empty());
        return Err(Error::Io(e));
    }
    rustix::fs::fsync(&dir).map_err(std::io::Error::from)?;
    Ok(())
}

fn sync_root(root: BorrowedFd<'_>) -> std::io::Result<()> {
    let fd = rustix::fs::openat(
        root,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(rustix::fs::fsync(fd)?)
}

/// The long-target file name of backing symlink `name` in directory `dir` (whose `lstat` is
/// `st`), if it has one and this name is its last link: what to [`remove`] once the name is
/// gone.
pub fn last_link_target(dir: BorrowedFd<'_>, name: &str, st: &Stat) -> Option<String> {
    if st.st_mode & libc::S_IFMT != libc::S_IFLNK || st.st_nlink != 1 {
        return None;
    }
    let stored = rustix::fs::readlinkat(dir, name, Vec::new()).ok()?;
    long_target_name(stored.as_bytes()).map(str::to_string)
}

/// Removes long-target file `name` (its last symlink is gone). Best effort: a file left
/// behind is only unreferenced, and `fsck --repair` removes it.
pub fn remove(root: BorrowedFd<'_>, name: &str) {
    if let Ok(dir) = open_dir(root) {
        let _ = rustix::fs::unlinkat(dir.as_fd(), name, AtFlags::empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::secret::SecretBytes;
    use crate::format::meta::SYMLINK_MAX;

    #[test]
    fn stored_read_back_and_removed() {
        let meta = MetaCodec::new(
            SecretBytes::from_slice(&[5; 32]),
            SecretBytes::from_slice(&[6; 64]),
        );
        let root = tempfile::tempdir().unwrap();
        let rootfd = std::fs::File::open(root.path()).unwrap();
        let target = vec![b'q'; SYMLINK_MAX];
        let sealed = meta.encrypt_symlink(&target).unwrap();
        store(rootfd.as_fd(), &sealed).unwrap();
        let backing = sealed.backing_target();
        std::os::unix::fs::symlink(&backing, root.path().join("link")).unwrap();
        assert_eq!(
            read_target(&meta, rootfd.as_fd(), backing.as_bytes()).unwrap(),
            target
        );
        let st = rustix::fs::statat(rootfd.as_fd(), "link", AtFlags::SYMLINK_NOFOLLOW).unwrap();
        let name = last_link_target(rootfd.as_fd(), "link", &st).unwrap();
        std::fs::remove_file(root.path().join("link")).unwrap();
        remove(rootfd.as_fd(), &name);
        assert!(matches!(
            read_target(&meta, rootfd.as_fd(), backing.as_bytes()),
            Err(Error::Tampered(_))
        ));
        // A short target needs nothing stored.
        let short = meta.encrypt_symlink(b"a/b").unwrap();
        store(rootfd.as_fd(), &short).unwrap();
        assert_eq!(
            read_target(&meta, rootfd.as_fd(), short.backing_target().as_bytes()).unwrap(),
            b"a/b"
        );
    }
}
