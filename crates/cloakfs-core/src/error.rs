//! Errors of the core library. Every variant renders as one line that a user can act on.

use std::io;

/// What went wrong, in terms a user of the volume understands.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No key slot accepted the secret.
    #[error("wrong passphrase or key: no key slot of this volume accepts it")]
    WrongSecret,
    /// The configuration file is missing.
    #[error("no cloakfs volume at {0} (missing {1})")]
    NotAVolume(String, &'static str),
    /// The configuration file cannot be parsed or has an invalid field.
    #[error("damaged volume config: {0}")]
    ConfigDamaged(String),
    /// The configuration's MAC did not verify after a successful unlock.
    #[error("volume config was modified without the key (MAC mismatch): refusing to use it")]
    ConfigTampered,
    /// A format element carries a version this build does not know.
    #[error("unsupported {what} version {found} (this cloakfs supports {supported})")]
    UnsupportedVersion {
        /// Which element (config, file header, ...).
        what: &'static str,
        /// The version found on disk.
        found: u64,
        /// The version this build understands.
        supported: u64,
    },
    /// Authentication of ciphertext failed: tampered, truncated or from another volume.
    #[error("authentication failed: {0}")]
    Tampered(String),
    /// A plaintext name is not acceptable (empty, too long, contains '/' or NUL, '.' or '..').
    #[error("invalid name")]
    InvalidName,
    /// A plaintext name or target is longer than the format can store.
    #[error("name or symlink target too long")]
    NameTooLong,
    /// The secrets given match no key slot of this volume (e.g. a key file for a volume that
    /// has only passphrase slots).
    #[error("{0}")]
    NoUsableSlot(String),
    /// A secret given by the user is malformed (a recovery key with a typo, a damaged share).
    #[error("{0}")]
    InvalidSecret(String),
    /// The operation is not possible on this volume or with these arguments.
    #[error("{0}")]
    Refused(String),
    /// The volume is in use: mounted, locked by another cloakfs process, or in the middle of
    /// an interrupted rekey.
    #[error("{0}")]
    Busy(String),
    /// The volume opens to another master key than the one this machine remembers for it
    /// (key pinning): its config may have been replaced.
    #[error("{0}")]
    KeyChanged(String),
    /// A shared file that the identity in use has no entry for (or a sharing volume opened
    /// without an identity): EACCES, whatever the Unix permissions say.
    #[error("permission denied: {0}")]
    AccessDenied(String),
    /// An operating-system error.
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl Error {
    /// The errno a file system call should report for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::InvalidName => libc::EINVAL,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::AccessDenied(_) => libc::EACCES,
            _ => libc::EIO,
        }
    }
}

/// Result with the core [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
