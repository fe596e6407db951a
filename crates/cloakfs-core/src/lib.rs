//! cloakfs core: everything that defines a cloakfs volume, with no FUSE in it.
//!
//! - [`config`]: the volume config file and the config MAC;
//! - [`slots`]: key slots of every kind (passphrase, key file, recovery key, age/ssh
//!   recipients, Shamir shares; PKCS#11 and GnuPG slots get their KEK in the CLI);
//! - [`keys`], [`kdf`], [`secret`]: the key hierarchy and secret handling;
//! - [`content`], [`layout`], [`file`](mod@file): file content encryption and plaintext I/O
//!   (with `gcm`: the AES-256-GCM key; `stream`: streams reach the disk while they come, and
//!   leave no ciphertext cached);
//! - [`names`], [`meta`]: name, symlink and xattr encryption;
//! - [`volume`], [`paths`]: an unlocked volume and offline path translation.
//! - offline tools: [`walk`] (cipher-tree walker), [`translate`] (names both ways),
//!   [`blocks`] (verified block reader), [`fsck`], [`export`], [`rekey`], [`writer`]
//!   (building volumes without a mount), [`xattrs`].
//!
//! The on-disk format is specified byte for byte in `docs/FORMAT.md`.

#![warn(missing_docs)]

pub mod blocks;
pub mod config;
pub mod content;
pub mod encoding;
pub mod error;
pub mod export;
pub mod file;
pub mod fsck;
mod gcm;
pub mod kdf;
pub mod keys;
pub mod layout;
pub mod meta;
pub mod names;
pub mod paths;
pub mod random;
pub mod rekey;
pub mod secret;
pub mod slots;
mod stream;
pub mod translate;
pub mod volume;
pub mod walk;
pub mod writer;
pub mod xattrs;

pub use error::{Error, Result};
pub use volume::Volume;
