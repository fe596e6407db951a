//! Cryptographic building blocks: the key hierarchy, passphrase KDF, the keyed ciphers, locked
//! secret memory and the one randomness source.

pub(crate) mod gcm;
pub mod kdf;
pub mod keys;
pub mod locked;
pub mod prf;
pub mod random;
pub mod secret;
pub(crate) mod siv;
pub mod xts;
