//! Passphrase challenge-response (the `passphrase` authentication method).
//!
//! The granting client derives K = Argon2id(passphrase, salt, params) and hands K to the
//! daemon at `authz add`; the passphrase never leaves a client. To authenticate, the daemon
//! sends a fresh random challenge; the client derives K again and answers
//! HMAC-SHA256(K, AUTH_CONTEXT || u32be(len(name)) || name || u32be(authz) || challenge).
//! The daemon compares in constant time and accepts one answer per challenge, so a recorded
//! answer is worthless.

use crate::protocol::{AuthMethod, AUTH_CONTEXT};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use cloakfs_core::crypto::kdf::{derive, Argon2Params};
use cloakfs_core::crypto::secret::{Passphrase, SecretBytes};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Length of a challenge, in bytes.
pub const CHALLENGE_LEN: usize = 32;
/// Length of a verifier salt made by [`passphrase_method`].
pub const SALT_LEN: usize = 16;

/// The answer to `challenge` for authorization `authz` of attach `name`, keyed by K.
pub fn challenge_answer(key: &[u8; 32], name: &str, authz: u32, challenge: &[u8]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(AUTH_CONTEXT);
    mac.update(&(name.len() as u32).to_be_bytes());
    mac.update(name.as_bytes());
    mac.update(&authz.to_be_bytes());
    mac.update(challenge);
    mac.finalize().into_bytes().into()
}

/// Checks `answer` in constant time.
pub fn verify_answer(
    key: &[u8; 32],
    name: &str,
    authz: u32,
    challenge: &[u8],
    answer: &[u8],
) -> bool {
    let want = challenge_answer(key, name, authz, challenge);
    answer.len() == want.len() && bool::from(want.ct_eq(answer))
}

/// K = Argon2id(passphrase, salt, params): the verifier key of a passphrase authorization.
pub fn verifier_key(
    passphrase: &Passphrase,
    salt: &[u8],
    params: &Argon2Params,
) -> cloakfs_core::Result<SecretBytes<32>> {
    derive(passphrase, salt, params)
}

/// The [`AuthMethod::Passphrase`] of an `authz add` request: a fresh random salt and K for
/// `passphrase` (the client side of granting).
pub fn passphrase_method(
    passphrase: &Passphrase,
    params: &Argon2Params,
) -> cloakfs_core::Result<AuthMethod> {
    let salt: [u8; SALT_LEN] = cloakfs_core::crypto::random::array();
    let key = verifier_key(passphrase, &salt, params)?;
    Ok(AuthMethod::Passphrase {
        salt: B64.encode(salt),
        memory_kib: params.memory_kib,
        iterations: params.iterations,
        parallelism: params.lanes,
        key: B64.encode(key.expose()),
    })
}

/// The client side of a challenge: the base64url answer to send as
/// [`crate::protocol::Request::AuthAnswer`], from the fields of
/// [`crate::protocol::Response::Challenge`].
#[allow(clippy::too_many_arguments)]
pub fn answer_challenge(
    passphrase: &Passphrase,
    name: &str,
    authz: u32,
    challenge_b64: &str,
    salt_b64: &str,
    memory_kib: u32,
    iterations: u32,
    parallelism: u32,
) -> cloakfs_core::Result<String> {
    let bad = |what: &str| cloakfs_core::Error::ConfigDamaged(format!("bad {what} from daemon"));
    let challenge = B64.decode(challenge_b64).map_err(|_| bad("challenge"))?;
    let salt = B64.decode(salt_b64).map_err(|_| bad("salt"))?;
    let params = Argon2Params {
        memory_kib,
        iterations,
        lanes: parallelism,
    };
    let key = verifier_key(passphrase, &salt, &params)?;
    Ok(B64.encode(challenge_answer(key.expose(), name, authz, &challenge)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_binds_everything() {
        let k = [7u8; 32];
        let c = [1u8; CHALLENGE_LEN];
        let a = challenge_answer(&k, "proj", 2, &c);
        assert!(verify_answer(&k, "proj", 2, &c, &a));
        assert!(!verify_answer(&k, "proj", 3, &c, &a));
        assert!(!verify_answer(&k, "proj2", 2, &c, &a));
        assert!(!verify_answer(&k, "proj", 2, &[2u8; CHALLENGE_LEN], &a));
        assert!(!verify_answer(&[8u8; 32], "proj", 2, &c, &a));
        assert!(!verify_answer(&k, "proj", 2, &c, &a[..31]));
        // Name length framing: ("ab", c) and ("a", "b"||c) differ.
        assert_ne!(
            challenge_answer(&k, "ab", 1, &c),
            challenge_answer(&k, "a", 1, &[b"b".as_slice(), &c].concat())
        );
    }

    #[test]
    fn client_and_verifier_agree() {
        let params = Argon2Params::LEAST;
        let pass = Passphrase::new(b"hunter2".to_vec());
        let AuthMethod::Passphrase { salt, key, .. } = passphrase_method(&pass, &params).unwrap()
        else {
            panic!("not a passphrase method");
        };
        let key: [u8; 32] = B64.decode(key).unwrap().try_into().unwrap();
        let c = [9u8; CHALLENGE_LEN];
        let ans = answer_challenge(&pass, "n", 4, &B64.encode(c), &salt, 64, 1, 1).unwrap();
        assert!(verify_answer(&key, "n", 4, &c, &B64.decode(ans).unwrap()));
        let wrong = Passphrase::new(b"hunter3".to_vec());
        let ans = answer_challenge(&wrong, "n", 4, &B64.encode(c), &salt, 64, 1, 1).unwrap();
        assert!(!verify_answer(&key, "n", 4, &c, &B64.decode(ans).unwrap()));
    }
}
