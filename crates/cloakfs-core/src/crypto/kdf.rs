//! Passphrase key derivation: Argon2id (RFC 9106), version 0x13, 32-byte output.
//!
//! Parameters are stored per key slot; [`Argon2Params::calibrate`] picks an iteration count so
//! that one derivation takes about the requested time on this machine.

use crate::crypto::locked::scrubbed;
use crate::crypto::secret::{Passphrase, SecretBytes};
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// Length of the random salt stored with each passphrase slot.
pub const SALT_LEN: usize = 32;
/// Memory cost used by calibration, in KiB (64 MiB).
pub const DEFAULT_MEMORY_KIB: u32 = 64 * 1024;
/// Smallest memory cost accepted from a config (below this Argon2id offers little).
pub const MIN_MEMORY_KIB: u32 = 64;
/// Largest memory cost accepted from a config, so a damaged config cannot exhaust RAM (4 GiB).
pub const MAX_MEMORY_KIB: u32 = 4 * 1024 * 1024;
/// Largest iteration count accepted from a config.
pub const MAX_ITERATIONS: u32 = 1000;
/// Largest lane count accepted from a config.
pub const MAX_LANES: u32 = 64;

/// Argon2id cost parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Argon2Params {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Iterations (passes over memory).
    pub iterations: u32,
    /// Lanes (parallelism parameter).
    pub lanes: u32,
}

impl Argon2Params {
    /// The lowest cost [`Self::validate`] accepts: a derivation takes well under a millisecond
    /// and resists guessing hardly at all. For tests about everything but the KDF; a volume's
    /// slots take [`Self::calibrate`]'s.
    pub const LEAST: Self = Self {
        memory_kib: MIN_MEMORY_KIB,
        iterations: 1,
        lanes: 1,
    };

    /// Checks that the parameters are within the ranges this build accepts.
    pub fn validate(&self) -> Result<()> {
        let ok = (MIN_MEMORY_KIB..=MAX_MEMORY_KIB).contains(&self.memory_kib)
            && (1..=MAX_ITERATIONS).contains(&self.iterations)
            && (1..=MAX_LANES).contains(&self.lanes)
            && self.memory_kib >= 8 * self.lanes;
        if ok {
            Ok(())
        } else {
            Err(Error::ConfigDamaged(format!(
                "Argon2id parameters out of range (m={} KiB, t={}, p={})",
                self.memory_kib, self.iterations, self.lanes
            )))
        }
    }

    /// Picks the iteration count for `DEFAULT_MEMORY_KIB` so one derivation takes about
    /// `target` here (at least 2 iterations).
    pub fn calibrate(target: Duration) -> Self {
        let probe = Self {
            memory_kib: DEFAULT_MEMORY_KIB,
            iterations: 1,
            lanes: 1,
        };
        let start = Instant::now();
        let _ = derive(
            &Passphrase::new(b"calibration".to_vec()),
            &[0u8; SALT_LEN],
            &probe,
        );
        let one = start.elapsed().as_secs_f64().max(1e-4);
        let iterations = ((target.as_secs_f64() / one).round() as u32).clamp(2, MAX_ITERATIONS);
        Self {
            iterations,
            ..probe
        }
    }
}

/// Derives a 32-byte key from `secret` and `salt` with Argon2id.
pub fn derive(secret: &Passphrase, salt: &[u8], params: &Argon2Params) -> Result<SecretBytes<32>> {
    params.validate()?;
    let p = argon2::Params::new(params.memory_kib, params.iterations, params.lanes, Some(32))
        .map_err(|e| Error::ConfigDamaged(format!("Argon2id parameters: {e}")))?;
    let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, p);
    let mut out = SecretBytes::<32>::zero();
    // Argon2's BLAKE2b hashes the passphrase in a block buffer on the stack: scrub it.
    scrubbed(|| a.hash_password_into(secret.expose(), salt, out.expose_mut()))
        .map_err(|e| Error::ConfigDamaged(format!("Argon2id: {e}")))?;
    Ok(out)
}
