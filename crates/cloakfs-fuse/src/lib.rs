//! cloakfs FUSE front end: the plaintext view of a cipher directory, as a thin adapter from
//! FUSE requests to `cloakfs-core`. Nothing here knows how bytes are encrypted.

use cloakfs_core::Volume;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Read-only mount (`-o ro`).
    pub read_only: bool,
    /// Let other users access the mount (`-o allow_other`; needs user_allow_other or root).
    pub allow_other: bool,
    /// Let root access the mount (`-o allow_root`).
    pub allow_root: bool,
    /// Let the kernel check permissions from the reported modes (`-o default_permissions`).
    pub default_permissions: bool,
    /// Other options passed to the kernel as they are (nosuid, nodev, noexec, noatime, ...).
    pub kernel_options: Vec<String>,
    /// `fsname` shown in /proc/mounts (normally the cipher directory).
    pub fsname: String,
    /// Worker threads serving FUSE requests.
    pub threads: usize,
    /// How long the kernel may cache attributes and directory entries.
    pub cache_timeout: Duration,
}

impl MountOptions {
    /// Defaults for mounting `cipherdir`.
    pub fn new(cipherdir: &Path) -> Self {
        Self {
            read_only: false,
            allow_other: false,
            allow_root: false,
            default_permissions: false,
            kernel_options: Vec::new(),
            fsname: cipherdir.display().to_string(),
            threads: 8,
            cache_timeout: Duration::from_secs(1),
        }
    }
}

/// A mounted but not yet served file system. Created before daemonizing (so mount errors
/// reach the user), served after.
pub struct Mounted {
    _private: (),
    /// Where it is mounted.
    pub mountpoint: PathBuf,
}

/// Mounts the plaintext view of `cipherdir` at `mountpoint`. Performs the mount syscall (or
/// runs fusermount3) but starts no thread, so the caller may fork afterwards.
pub fn mount(
    _volume: Volume,
    _cipherdir: &Path,
    _mountpoint: &Path,
    _opts: &MountOptions,
) -> io::Result<Mounted> {
    Err(io::Error::other("FUSE front end not implemented yet"))
}

impl Mounted {
    /// Serves requests until the file system is unmounted; returns after every pending write
    /// reached the cipher directory.
    pub fn run(self) -> io::Result<()> {
        Ok(())
    }
}
