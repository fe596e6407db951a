//! Failures and the exit codes they map to (documented in cloakfs(1), from `MEANINGS`).

use std::fmt;

/// Exit codes of the `cloakfs` command.
pub mod code {
    /// Wrong passphrase or key.
    pub const WRONG_SECRET: u8 = 1;
    /// Bad command line (clap uses 2 as well).
    pub const USAGE: u8 = 2;
    /// No volume, or its config is damaged, tampered with, of an unknown version, or opens to
    /// another master key than this machine remembers (it may have been replaced).
    pub const VOLUME: u8 = 3;
    /// The mount failed (mount point, /dev/fuse, fusermount3, kernel).
    pub const MOUNT: u8 = 4;
    /// Any other error (I/O, permissions, ...).
    pub const OTHER: u8 = 5;
    /// fsck found problems it did not repair; export or cat skipped unreadable data; a
    /// tampered block or name stopped an offline tool.
    pub const PROBLEMS: u8 = 6;
    /// fsck --repair repaired every problem it found (the volume is clean now).
    pub const REPAIRED: u8 = 7;
    /// The volume is mounted, locked by another cloakfs process, or in the middle of an
    /// interrupted rekey (finish it with `cloakfs rekey --resume` or `--rollback`).
    pub const BUSY: u8 = 8;
    /// `rekey` stopped by SIGINT or SIGTERM.
    pub const INTERRUPTED: u8 = 130;

    /// Each exit code and what it means, for the EXIT STATUS section of cloakfs(1).
    pub const MEANINGS: &[(u8, &str)] = &[
        (0, "success"),
        (
            WRONG_SECRET,
            "wrong passphrase, key, PIN, identity or share: no key slot accepts the secrets given",
        ),
        (
            USAGE,
            "bad command line or options (also: empty passphrase, no terminal to prompt on)",
        ),
        (
            VOLUME,
            "no volume, or its config is damaged, tampered with, of an unknown version, or it \
             opens to another master key than this machine remembers (see cloakfs-known(1))",
        ),
        (
            MOUNT,
            "the mount failed (mount point missing or not empty, /dev/fuse or fusermount3 \
             missing, kernel refusal)",
        ),
        (OTHER, "any other error (I/O, permissions)"),
        (
            PROBLEMS,
            "fsck found problems it did not repair; export skipped unreadable entries; cat met \
             a tampered block or a cut file",
        ),
        (
            REPAIRED,
            "fsck --repair repaired every problem it found (the volume is clean now)",
        ),
        (
            BUSY,
            "the volume is busy: mounted (for rekey, fsck --repair), locked by another cloakfs \
             process, or in an unfinished rekey",
        ),
        (
            INTERRUPTED,
            "rekey stopped by SIGINT or SIGTERM (the volume is consistent: finish with --resume \
             or --rollback)",
        ),
    ];
}

/// An error with the exit code it should produce. Shown as one line.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(code::USAGE, message)
    }

    pub fn mount(message: impl Into<String>) -> Self {
        Self::new(code::MOUNT, message)
    }

    pub fn other(message: impl Into<String>) -> Self {
        Self::new(code::OTHER, message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<cloakfs_core::Error> for Failure {
    fn from(e: cloakfs_core::Error) -> Self {
        use cloakfs_core::Error as E;
        let code = match &e {
            E::WrongSecret | E::NoUsableSlot(_) | E::InvalidSecret(_) => code::WRONG_SECRET,
            E::Refused(_) => code::USAGE,
            E::Busy(_) => code::BUSY,
            E::NotAVolume(..)
            | E::ConfigDamaged(_)
            | E::ConfigTampered
            | E::UnsupportedVersion { .. }
            | E::KeyChanged(_) => code::VOLUME,
            _ => code::OTHER,
        };
        Self::new(code, e.to_string())
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Self::other(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Failure>;
