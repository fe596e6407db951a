//! Fixed keys and volumes the targets decrypt under: every key is derived the real way
//! ([`Volume::from_master_key`]) from a fixed master key, so a corpus file stays meaningful
//! across runs and builds. None of these is a secret: they exist only for fuzzing.

use cloakfs_core::crypto::kdf::Argon2Params;
use cloakfs_core::crypto::keys::MasterKey;
use cloakfs_core::crypto::secret::Passphrase;
use cloakfs_core::format::config::{SlotRandomness, VolumeConfig, VolumeParams};
use cloakfs_core::format::content::ContentSuite;
use cloakfs_core::format::names::{DirId, LONG_NAME_MAX_DEFAULT};
use cloakfs_core::slots::recovery::RecoveryKey;
use cloakfs_core::slots::shamir::Share;
use cloakfs_core::slots::{keyfile, kind, recipient, recovery, shamir, Kek};
use cloakfs_core::text::Fields;
use cloakfs_core::Volume;
use std::rc::Rc;

/// The master key of every fixture volume.
pub const MASTER_KEY: [u8; 32] = [0x42; 32];
/// The volume ID of every fixture volume.
pub const VOLUME_ID: [u8; 16] = [0x11; 16];
/// The directory ID names are bound to.
pub const DIR_ID: DirId = DirId([0x22; 16]);
/// The passphrase of the reference config's passphrase slot.
pub const PASSPHRASE: &[u8] = b"fuzz passphrase";
/// The key file of the reference config's keyfile slot.
pub const KEY_FILE: &[u8] = b"fuzz key file: not random, only for the fuzz fixture volume.";
/// The recovery key of the reference config's recovery slot.
pub const RECOVERY_KEY: [u8; 32] = [0x24; 32];
/// The age identity of the reference config's recipient slot.
pub const AGE_IDENTITY: &str =
    "AGE-SECRET-KEY-1M6ZXU0C204FCPA6LNAUQDCSMHVDA3JCMDRQ266TUF5QFS8PDS7AQCHDNNE";
/// The KEK of the reference config's shamir slot (2 of 3).
pub const SHAMIR_KEK: [u8; 32] = [0x33; 32];
/// Block sizes the file target picks from (small ones, so short inputs span blocks).
pub const BLOCK_SIZES: [u64; 3] = [512, 1024, 4096];

/// The cheapest Argon2id parameters a config may carry.
pub fn cheap_kdf() -> Argon2Params {
    Argon2Params {
        memory_kib: 64,
        iterations: 1,
        lanes: 1,
    }
}

/// Whether deriving a key with `p` is cheap enough to do on every input. A config may ask for
/// 4 GiB and 1000 passes; the targets skip such derivations (their cost is bounded by
/// `Argon2Params::validate`, and is the config's to choose).
pub fn is_cheap(p: &Argon2Params) -> bool {
    u64::from(p.memory_kib) * u64::from(p.iterations) <= 256
}

/// The fixture master key.
pub fn master_key() -> MasterKey {
    MasterKey::from_bytes(&MASTER_KEY)
}

/// Volume parameters with the fixture volume ID.
pub fn params(suite: ContentSuite, block_size: u64, strict_holes: bool) -> VolumeParams {
    VolumeParams {
        volume_id: VOLUME_ID,
        content: suite,
        block_size,
        long_name_max: LONG_NAME_MAX_DEFAULT,
        strict_holes,
        file_keys: Default::default(),
        shared_header_mac: false,
        adopted: false,
        listed: false,
        converted: false,
    }
}

/// The suite, block size and hole mode selected by the low 4 bits of `flags`.
pub fn geometry(flags: u8) -> (ContentSuite, u64, bool) {
    let suite = if flags & 1 == 0 {
        ContentSuite::Aes256Gcm
    } else {
        ContentSuite::XChaCha20Poly1305
    };
    let block = BLOCK_SIZES[usize::from((flags >> 2) & 3) % BLOCK_SIZES.len()];
    (suite, block, flags & 2 != 0)
}

thread_local! {
    static VOLUMES: Vec<Rc<Volume>> = (0..16u8)
        .map(|flags| {
            let (suite, block, strict) = geometry(flags);
            let mk = master_key();
            let mut c = VolumeConfig::new(params(suite, block, strict));
            c.seal(&mk);
            Rc::new(Volume::from_master_key(c, &mk).expect("fixture volume"))
        })
        .collect();
    static REFERENCE: Rc<(VolumeConfig, Vec<Share>)> = Rc::new(build_reference());
    static REFERENCE_VOLUME: Rc<Volume> = Rc::new(
        Volume::from_master_key(REFERENCE.with(|r| r.0.clone()), &master_key())
            .expect("reference volume"),
    );
    static IDENTITIES: Rc<recipient::Identities> = {
        let mut ids = recipient::Identities::new();
        ids.add_file(AGE_IDENTITY.as_bytes(), "fixture", age::NoCallbacks)
            .expect("fixture identity");
        Rc::new(ids)
    };
}

/// The fixture volume with the geometry `flags` selects (see [`geometry`]).
pub fn volume(flags: u8) -> Rc<Volume> {
    VOLUMES.with(|v| v[usize::from(flags & 15)].clone())
}

/// The reference config (one slot of every kind, sealed with [`MASTER_KEY`]) and the shares of
/// its shamir slot.
pub fn reference() -> Rc<(VolumeConfig, Vec<Share>)> {
    REFERENCE.with(Rc::clone)
}

/// The reference config's volume.
pub fn reference_volume() -> Rc<Volume> {
    REFERENCE_VOLUME.with(Rc::clone)
}

/// The identities holding [`AGE_IDENTITY`].
pub fn identities() -> Rc<recipient::Identities> {
    IDENTITIES.with(Rc::clone)
}

/// The recovery key of the reference config.
pub fn recovery_key() -> RecoveryKey {
    RecoveryKey::from_bytes(&RECOVERY_KEY)
}

/// The passphrase of the reference config.
pub fn passphrase() -> Passphrase {
    Passphrase::new(PASSPHRASE.to_vec())
}

fn rnd(n: u8) -> SlotRandomness {
    SlotRandomness {
        salt: [n; 32],
        nonce: [n; 12],
    }
}

fn build_reference() -> (VolumeConfig, Vec<Share>) {
    let mk = master_key();
    let mut c = VolumeConfig::new(params(ContentSuite::Aes256Gcm, 4096, false));
    c.add_passphrase_slot(&mk, &passphrase(), cheap_kdf(), "main", rnd(1))
        .expect("passphrase slot");
    let (f, kek) = keyfile::new_slot(KEY_FILE, &[2; 32]).expect("keyfile slot");
    c.add_slot(&mk, kind::KEYFILE, "usb", f, &kek, [2; 12])
        .expect("keyfile slot");
    let (f, kek) = recovery::new_slot(&recovery_key(), &[3; 32]);
    c.add_slot(&mk, kind::RECOVERY, "paper", f, &kek, [3; 12])
        .expect("recovery slot");
    let identity: age::x25519::Identity = AGE_IDENTITY.parse().expect("fixture identity");
    let recipients =
        recipient::Recipients::parse(&identity.to_public().to_string()).expect("recipient");
    let (f, kek) = recipient::new_slot(&recipients, false).expect("recipient slot");
    c.add_slot(&mk, kind::RECIPIENT, "age", f, &kek, [4; 12])
        .expect("recipient slot");
    let shamir_id = c.next_slot_id();
    let kek = Kek::from_slice(&SHAMIR_KEK);
    let shares = shamir::split(&kek, VOLUME_ID, shamir_id, 2, 3).expect("shares");
    let mut f = Fields::new();
    f.insert("threshold".into(), "2".into());
    f.insert("shares".into(), "3".into());
    c.add_slot(&mk, kind::SHAMIR, "board", f, &kek, [5; 12])
        .expect("shamir slot");
    // Kinds the core cannot unlock itself (the CLI does), and one from a newer cloakfs.
    for (k, fields) in [
        (
            kind::PKCS11,
            &[
                ("pkcs11_token", "fuzz token"),
                ("pkcs11_object", "cloakfs"),
                ("salt", "BgYGBgYGBgYGBgYGBgYGBgYGBgYGBgYGBgYGBgYGBgY"),
            ][..],
        ),
        (
            kind::GPG,
            &[("gpg_recipients", "ABCDEF0123456789"), ("gpg", "hQEMAw")][..],
        ),
        ("quantum-token", &[("qubits", "7")][..]),
    ] {
        let f: Fields = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        c.add_slot(&mk, k, k, f, &Kek::from_slice(&[6; 32]), [6; 12])
            .expect("slot");
    }
    c.seal(&mk);
    (c, shares)
}
