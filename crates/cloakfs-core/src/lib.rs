//! cloakfs core: everything that defines a cloakfs volume, with no FUSE in it.
//!
//! - [`crypto`]: the key hierarchy, the passphrase KDF, locked secret memory, randomness;
//! - [`format`](mod@format): the config, file layout, content blocks, names, symlink and xattr blobs;
//! - [`slots`]: key slots of every kind (passphrase, key file, recovery key, age/ssh
//!   recipients, Shamir shares; PKCS#11 and GnuPG slots get their KEK in the CLI);
//! - [`text`]: the text forms of stored values (base64url, string-field maps and their
//!   parsers), which both `format` and `slots` use;
//! - [`io`]: plaintext reads and writes of one backing file, and backing xattrs;
//! - [`volume`]: an unlocked volume; [`known_volumes`]: key pinning, the volumes this machine
//!   has opened;
//! - [`tools`]: offline tools (walk, translate, fsck, export, rekey, writer).
//!
//! The on-disk format is specified byte for byte in `docs/FORMAT.md`.

#![warn(missing_docs)]

pub mod crypto;
pub mod error;
pub mod format;
pub mod io;
pub mod known_volumes;
pub mod slots;
pub mod sync_folder;
pub mod text;
pub mod tools;
pub mod volume;

pub use error::{Error, Result};
pub use volume::Volume;
