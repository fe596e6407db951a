//! Test vectors of the on-disk format, and the committed tiny volume.
//!
//! Every value below is computed from fixed inputs with the public core API and compared with
//! (a) a constant committed in this file and (b) the text of `docs/FORMAT.md`, which must contain
//! every constant verbatim, so the specification cannot drift from the code.
//!
//! The tiny volume in `tests/vectors/volume/` (and its plaintext in
//! `tests/independent/expected/` at the repository root) is built deterministically by
//! [`build_volume`]; `cargo test -p cloakfs-core --test vectors -- --ignored generate` rewrites
//! both. Normal runs rebuild it into a temporary directory and require byte-identical files.
//!
//! After a deliberate format change, `PRINT_VECTORS=1 cargo test -p cloakfs-core --test vectors
//! -- --nocapture` prints the newly computed values, to be pasted here and into FORMAT.md.

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::Aes256Gcm;
use cloakfs_core::crypto::kdf::{self, Argon2Params};
use cloakfs_core::crypto::keys::{label, MasterKey};
use cloakfs_core::crypto::secret::{Passphrase, SecretBytes};
use cloakfs_core::format::config::{SlotRandomness, VolumeConfig, VolumeParams, CONFIG_FILE};
use cloakfs_core::format::content::{ContentCodec, ContentSuite, FileHeader, FileId};
use cloakfs_core::format::layout::Layout;
use cloakfs_core::format::meta::{MetaCodec, SealedTarget, SYMLINK_INLINE_MAX, SYMLINK_MAX};
use cloakfs_core::format::names::{DirId, NameCodec, StoredName, DIRID_FILE};
use cloakfs_core::io::file::ContentFile;
use cloakfs_core::text::b64;
use cloakfs_core::tools::paths;
use cloakfs_core::Volume;
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

// ---------------------------------------------------------------------------------------------
// Fixed inputs (FORMAT.md, "Test vectors": "Inputs").

/// `n` bytes counting up from `start` (wrapping).
fn seq<const N: usize>(start: u8) -> [u8; N] {
    std::array::from_fn(|i| start.wrapping_add(i as u8))
}

fn master_key() -> MasterKey {
    MasterKey::from_bytes(&seq::<32>(0x00))
}
fn volume_id() -> [u8; 16] {
    seq(0xa0)
}
fn file_id() -> FileId {
    FileId(seq(0xf0))
}
fn dir_id() -> DirId {
    DirId(seq(0xd0))
}
fn gcm_nonce() -> [u8; 12] {
    seq(0x60)
}
fn xchacha_nonce() -> [u8; 24] {
    seq(0x70)
}
fn symlink_nonce() -> [u8; 12] {
    seq(0x90)
}
fn xattr_nonce() -> [u8; 12] {
    seq(0xb0)
}
fn salt() -> [u8; 32] {
    seq(0x20)
}
fn wrap_nonce() -> [u8; 12] {
    seq(0x50)
}
/// Key file of the keyfile-slot vector: 64 bytes counting up from 0x40.
fn key_file() -> [u8; 64] {
    seq(0x40)
}
/// Recovery key of the recovery-slot vector.
fn recovery_key() -> [u8; 32] {
    seq(0x80)
}
/// y coordinates of the share-encoding vector (share x = 1 of the Shamir-slot vector).
fn share_y() -> [u8; 32] {
    seq(0xe0)
}
/// KEK of the Shamir-slot vector (slot 3, 2 of 3).
fn shamir_kek() -> [u8; 32] {
    seq(0x10)
}
/// KEK of the recipient-slot vector.
fn recipient_kek() -> [u8; 32] {
    seq(0xc0)
}
/// The age X25519 identity of the recipient-slot vector, and its public key.
const AGE_IDENTITY: &str =
    "AGE-SECRET-KEY-1XQCNYVE5X5MRWWPE8GANC0F78AQYZSJRG3Z5V36GF99YKNZDFE8SPETATX";
const AGE_RECIPIENT: &str = "age1xnjz6jh4a722q736sssphzyafng6ws7ty7c3k6ssgw9gl6uwtprss08l77";
/// `age` field of the recipient-slot vector: an age file made once by Debian's age
/// (`age -r AGE_RECIPIENT`, Go), whose plaintext is [`recipient_kek`]. age encryption is
/// randomized, so this is an input, not a computed value.
const AGE_FILE_B64: &str = "YWdlLWVuY3J5cHRpb24ub3JnL3YxCi0-IFgyNTUxOSBDdk11RHdjWEpNQjRQTiswZWcvUkp1bGpEcUpJZ1doejVUOHFPL3hjS1FFCllERlQxMkpLTmhKVE82ZlNMdksvdlgzWTYxaE83TG9Fd3RFNXhQNVVzaFEKLS0tICtieFVsU3Z2aUNtRDlIYS8ydGNITjU2b0lBSXhIUFY5dDdkdmUvVk5QY1kKFEE-wmVdXcNcfOg_hUfKEIapVGb_ixAobJ7CDuSyP4cdNKRm1DxjfWYJcj2i73pauO2dzBn63_hRGm22uEy4tQ";
const PASSPHRASE: &[u8] = b"correct horse battery staple";
const SLOT_LABEL: &str = "test";
const ARGON2: Argon2Params = Argon2Params {
    memory_kib: 64,
    iterations: 1,
    lanes: 1,
};
const BLOCK_SIZE: u64 = 4096;
const PARTIAL_PLAIN: &[u8] = b"cloakfs partial block\n";
/// A last data unit too short for XTS (block 1 of a 4101-byte file): 5 bytes.
const XTS_SHORT_PLAIN: &[u8] = b"tail\n";
/// The counter block of a short XTS block in a header of version 2 (FORMAT.md section 20).
const XTS_TAIL_COUNTER: [u8; 16] = [
    0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff,
];
const SHORT_NAME: &[u8] = b"hello.txt";
const SYMLINK_TARGET: &[u8] = b"sub/hello.txt";
const XATTR_NAME: &[u8] = b"user.comment";
const XATTR_VALUE: &[u8] = b"a plaintext comment";

/// Plaintext of the full-block vector: byte i = i mod 251.
fn full_plain() -> Vec<u8> {
    (0..BLOCK_SIZE as usize).map(|i| (i % 251) as u8).collect()
}

/// The 200-byte long name: `long-name-` twenty times.
fn long_name() -> Vec<u8> {
    b"long-name-".repeat(20)
}

fn params() -> VolumeParams {
    VolumeParams {
        volume_id: volume_id(),
        content: ContentSuite::Aes256Gcm,
        block_size: BLOCK_SIZE,
        long_name_max: 255,
        strict_holes: false,
        file_keys: Default::default(),
        shared_header_mac: false,
        adopted: false,
        listed: false,
        converted: false,
    }
}

fn config() -> VolumeConfig {
    let mut c = VolumeConfig::new(params());
    let rnd = SlotRandomness {
        salt: salt(),
        nonce: wrap_nonce(),
    };
    c.add_passphrase_slot(
        &master_key(),
        &Passphrase::new(PASSPHRASE.to_vec()),
        ARGON2,
        SLOT_LABEL,
        rnd,
    )
    .unwrap();
    c.seal(&master_key());
    c
}

// ---------------------------------------------------------------------------------------------
// Expected values (each must also appear verbatim in docs/FORMAT.md).

const EXPECTED: &[(&str, &str)] = &[
    (
        "shared.key.block",
        "4cf8a2edaf5bf47cf256164a04713659092e8a8d20f6973d65b634efc3963eb3",
    ),
    (
        "shared.key.list",
        "36731638349736e8525919966b49128df31fca367f385cef04b64e160e4a67af",
    ),
    (
        "shared.v2.header.mac",
        "c9185f4d0812760e1a3c8cf76eba09f02e3fd695b91f9d89907e93c1f71af360",
    ),
    (
        "shared.v2.header.sha256",
        "8bf0cd8ae3b65c37c31031c72445f70ce00ddec562e8c7ded15a01358f085943",
    ),
    (
        "shared.wrapped",
        "49ec75737216b4bb7a0df8146cb4f59b05832586a18f17d1cb9b47a979a7582581f1442e4355c40063b326c7214a1aa4",
    ),
    (
        "shared.key.header",
        "b477a2769c0fe6642e4afd2656c5d35439670ca470d3a0ec78f8359e09b584bb",
    ),
    (
        "shared.header.volume_mac",
        "2063496573b8107122d18181427f9cf1b65fb9811d2f61712365bad46c831fce",
    ),
    (
        "shared.header-mac.sha256",
        "d2cd84ca4775eebdb250e3708b64bf36169b76580d6a0935b70700c2ded22a05",
    ),
    (
        "shared.header.mac",
        "e2b57316657e38a0424a27e12112b620eb9c4ec514562fa5ec2f5166a41be498",
    ),
    (
        "shared.header.sha256",
        "296d7cc9f73a6ffe690a5682f8301543b38a277c6860e7a3bd91205f9c7a93bd",
    ),
    (
        "shared.block0",
        "606162636465666768696a6b4a96c30a3809b523166356e68cda7eda66abf239541896a31c657e51bff891fff22d812cac29",
    ),
    ("key.xts-file", "4c2aeb86fc93341283f02c6904d479666312bb34bed09abb80367440861e8aaf8eac062f49921394d02f9cbbf1e3b025b645b1929cec98b7ce10d8b72d356b17"),
    ("key.xts-short", "37d6d940c6ceafd14cc109f3e0299be0656bc5f67f98104170ba874a8273a353"),
    ("xts.full.sha256", "99e94d028afb2c5ac4fbd813aea173d734425df00dfd3c152802ef8a21012bc9"),
    ("xts.full.head", "45666cd775e5b6d6d55cc6b85ea1de788b666552da918a664485bd1ad3fce0dc"),
    ("xts.partial", "d6b8dd4ece15efe0b8a618fae80b924b25ad08b71cf3"),
    ("xts.short", "deedc08a53"),
    ("xts.header.v2", "0002f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff00112233445566778899aabbccddeeff"),
    ("xts.short.v2", "e4dd2d652f"),
    ("header", "0001f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff"),
    ("aad.block0", "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff0000000000000000"),
    ("aad.block2", "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff0000000000000002"),
    ("block.full.sha256", "66786fe5ef0cb792bf50b44a1d2cf3fb69bf5b90489fa937fea205763a50f137"),
    ("block.full.head", "606162636465666768696a6bfa4c54726bfbc55ea25473207acaf6c3d1c586f1ff7f6044d33b37d94a7ec281"),
    ("block.full.tag", "a5d6a2ee4a11986cd64f4c4d7f76d009"),
    ("block.partial.gcm", "606162636465666768696a6b992139100498b079da3c0b5f1fa694eca3b8fb81806055127fb15fce433d7683bd8023033240"),
    ("block.partial.xchacha", "707172737475767778797a7b7c7d7e7f8081828384858687fd8079c316f8ac23cc2972e7632c8fd771605489e1cddd1d155d61b1d1d1165e762c66ef8135"),
    ("argon2id", "39464e7f7f5303adf5498b248a65db4579aef0059cfc1b0c7d46d739ca83801c"),
    ("slot.aad", "cloakfs slot v1\nvolume_id=oKGio6SlpqeoqaqrrK2urw\nargon2_iterations=1\nargon2_lanes=1\nargon2_memory_kib=64\nid=1\nkdf=argon2id\nkind=passphrase\nlabel=test\nsalt=ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8\n"),
    ("slot.wrapped", "UFFSU1RVVldYWVpb1voU2D3AB9rVNIZIDeFUNRuYiIhXoE1xMJ2HzN4NCD1pT0H-WGKtDQMzKfXsXTRh"),
    ("config.mac", "5VjPDtsQG2M2veUljHhApMKr2VyCeQX1qc3wILx-TAo"),
    ("key.content", "6d756b5d31e7b4dcf816660c544b920f0d110d316fe53e21bf8528476ac50a22"),
    ("key.names", "c53b6b81e731be7166c02b5b4a2683195ecb651d71bfe33eaf55483d718eca52ddf6e868707b73e72ac7a81f8a16737eace2198ec77622262c377bf41f2011da"),
    ("key.xattr-names", "910daff5fb0aa7d2e196704f82ab4c95add417ecea09b006851d22d44123cc0ec83e321ffecddb0db53b98291b32cc5ab6b2d90ed6d8938963fd9f9482a7cee6"),
    ("key.metadata", "af616f8f1301e176c1646251759231bb2aa8afc6ce8a398ea58553636ffd5b62"),
    ("key.config-mac", "79a34790abde1d9032db71316c5355ad9ef3e21148692125abe29382cd5698ee"),
    ("key.file", "408ab56ad7d4d1e160cbee9c5d4e8a72c7f72f6531541126a737621285836d3a"),
    ("name.dir", "j8Fm8j60YkFpxxHCLFWXK4D5aMmXQgFhNQ"),
    ("name.root", "0E4FfUCvsyzG0GugiOywBRWmBxXcc69hLg"),
    ("name.long.full", "-rd-ATICX8g5obgCqyyBbWBYnejV6GlMLPIldB-FVdoyo7GMtfS4Dz49C1HwNh23GU5v9ZlP3kJ3c1OB0VYG9ZGx5uB2idehgcXnckvhpZJYzeCb0WxzZFoRlvyyEBQSPA_eSGF4m_gPIZy1Lrx7_VADRT9t8AJ2oUjXS5ChOsoQ7ilRfXMawLOLBxTDhUjpgR0mX2-W1xR9qcX-YwnCeSI5-cMP2Fy8YUJTQzqRiXwLhMTUaU4VIGQULD0GvVYSF1ZUcA-4zCCdgltJUYJiii6wGBnXPuSv"),
    ("name.long.backing", "cloakfs.long.F26UnOr5oBYWRfDTJf4m4eGy3u0XMsLTmV8oerWz2kE"),
    ("symlink", "kJGSk5SVlpeYmZqbGy3JtWV6d0TDyyYpZrHb5T15ZbGtRh4b9RHCvTI"),
    ("xattr.name", "user.ktqbu3OlLXEsrBpiOowSBHmufY0UbTE"),
    ("xattr.value", "b0b1b2b3b4b5b6b7b8b9babba1702c8a45ef391ff135881d5daf5c66934d06867ff71665beb0bd0fca43837b0428f7"),
    ("keyfile.kek", "465f23e533674c05b41be6e6e23a2c9547ad9efdf9a6972dce3948b8d512055e"),
    ("recovery.bytes", "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fd267e1"),
    ("recovery.text", "G20R-50W4-GP38-F249-HA5R-S3CE-HY89-34MK-JJAS-D5WR-K6D9-Q74X-KTFX-4SZ1"),
    ("recovery.kek", "a48c67baf8ec350e31623067c4bc8020f9b3043aa9395b8421aa8ab4c03290c9"),
    ("share.text", "cloakfs-share:AaChoqOkpaanqKmqq6ytrq8AAAADAgMB4OHi4-Tl5ufo6err7O3u7_Dx8vP09fb3-Pn6-_z9_v-JyRKU"),
    ("shamir.share1.file", "# cloakfs key share 1 of 3: any 2 of them open key slot 3 of volume oKGio6SlpqeoqaqrrK2urw\ncloakfs-share:AaChoqOkpaanqKmqq6ytrq8AAAADAgMB4OHi4-Tl5ufo6err7O3u7_Dx8vP09fb3-Pn6-_z9_v-JyRKU\n"),
    ("shamir.share2.file", "# cloakfs key share 2 of 3: any 2 of them open key slot 3 of volume oKGio6SlpqeoqaqrrK2urw\ncloakfs-share:AaChoqOkpaanqKmqq6ytrq8AAAADAgMC7ezv7uno6-rl5Ofm4eDj4p2cn56ZmJualZSXlpGQk5LakGWk\n"),
    ("shamir.share3.file", "# cloakfs key share 3 of 3: any 2 of them open key slot 3 of volume oKGio6SlpqeoqaqrrK2urw\ncloakfs-share:AaChoqOkpaanqKmqq6ytrq8AAAADAgMDHRwfHhkYGxoVFBcWERATEk1MT05JSEtKRURHRkFAQ0IMZLBR\n"),
    ("slots.keyfile.wrapped", "UFFSU1RVVldYWVpbMpL9O8-ALxDpsBEq7-5wj7YGhdKolENRXXe7Q2Gp6VflWO9HjtpN6B7O-AYI1vHf"),
    ("slots.shamir.wrapped", "UFFSU1RVVldYWVpbcW83DtOyQZ9s_OHkfQsFLAeTpt0jDjD1kF0KD9HRo4wSNDW3pCxU4jPSy3Mf3WDz"),
    ("slots.recovery.wrapped", "UFFSU1RVVldYWVpbJT8VYgMQXJJPcnCP3FkNm69cKCoWkZWv9V6S8Xg0S5nNAYuTf2bHnSTMoecYceIW"),
    ("slots.recipient.wrapped", "UFFSU1RVVldYWVpbeDwY-25-C2J2mOkspTgf_vOj0-eAWOPDoC5DInjKlBV5Ndx0GtVc8CKSoqYspN_o"),
    ("slots.mac", "hTSVx8hg1K6zAIFw2HY0eDuX851ow2DzctYYcFH0F_Y"),
    // FORMAT.md 10.1: long symlink targets.
    ("symlink.long.backing", "cloakfs.symlink.jctorIge3Vdp9A3DVnGp8Fwf_NsJgW3tG1tsxQ6VONI"),
    ("symlink.long.file.sha256", "8dcb68ac881edd5769f40dc35671a9f05c1ffcdb09816ded1b5b6cc50e9538d2"),
    ("symlink.long.file.head", "909192939495969798999a9b586999a9392a2d1f94dc7d6123ba5da84e2d60eb16ff7f3cadd346a0b779aea8e1f37644"),
    ("reverse.key", "f74451dd4b7cda858e0b00eb4b282952f84b8d8bc9df5c90e371d4bdb40a770c"),
    ("reverse.dir.sub", "90a0aeaf7de60b5cdd27e536c0f84619"),
    ("reverse.file.sub/hello.txt", "91e4ff240190351119aca487e7b27b3b"),
    ("reverse.nonce.0", "9b6877fcec8a679c44609087"),
    ("reverse.symlink.nonce", "bd0b5c3f38cffea9ff0b8360"),
    ("reverse.symlink", "vQtcPzjP_qn_C4NgXqXc21F2ni9Jm7ZTDyL7xqRrULcCyduBBhPUPLA"),
    ("reverse.name", "hv631nmLUYoHbYQt8R29MR0HULnJGipapg"),
    ("reverse.backing", "000191e4ff240190351119aca487e7b27b3b9b6877fcec8a679c446090870b3191194d772684b2e33e77ea00ac19fb76d0e8ee0c6c4baccf31824f5171ea02e8e7ce7be9"),
    ("block.partial.gcm-siv", "606162636465666768696a6b2a9f9cdf191536108f4948aeb363d077715f0b42f2c07fc6aabf61a0a33b0cfd911692a18f0a"),
];

const EXPECTED_CANONICAL: &str = r#"cloakfs config v1
volume.block_size=4096
volume.content_cipher=aes-256-gcm
volume.format_version=1
volume.holes=sparse
volume.long_name_max=255
volume.name_cipher=aes-256-siv
volume.volume_id=oKGio6SlpqeoqaqrrK2urw
slot.0.argon2_iterations=1
slot.0.argon2_lanes=1
slot.0.argon2_memory_kib=64
slot.0.id=1
slot.0.kdf=argon2id
slot.0.kind=passphrase
slot.0.label=test
slot.0.salt=ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8
slot.0.wrapped=UFFSU1RVVldYWVpb1voU2D3AB9rVNIZIDeFUNRuYiIhXoE1xMJ2HzN4NCD1pT0H-WGKtDQMzKfXsXTRh
"#;

const EXPECTED_SLOTS_CONFIG_JSON: &str = r#"{
  "cloakfs": 1,
  "volume": {
    "block_size": "4096",
    "content_cipher": "aes-256-gcm",
    "format_version": "1",
    "holes": "sparse",
    "long_name_max": "255",
    "name_cipher": "aes-256-siv",
    "volume_id": "oKGio6SlpqeoqaqrrK2urw"
  },
  "slots": [
    {
      "argon2_iterations": "1",
      "argon2_lanes": "1",
      "argon2_memory_kib": "64",
      "id": "1",
      "kdf": "argon2id",
      "kind": "passphrase",
      "label": "test",
      "salt": "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8",
      "wrapped": "UFFSU1RVVldYWVpb1voU2D3AB9rVNIZIDeFUNRuYiIhXoE1xMJ2HzN4NCD1pT0H-WGKtDQMzKfXsXTRh"
    },
    {
      "id": "2",
      "kind": "keyfile",
      "label": "usb stick",
      "salt": "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8",
      "wrapped": "UFFSU1RVVldYWVpbMpL9O8-ALxDpsBEq7-5wj7YGhdKolENRXXe7Q2Gp6VflWO9HjtpN6B7O-AYI1vHf"
    },
    {
      "id": "3",
      "kind": "shamir",
      "label": "board",
      "shares": "3",
      "threshold": "2",
      "wrapped": "UFFSU1RVVldYWVpbcW83DtOyQZ9s_OHkfQsFLAeTpt0jDjD1kF0KD9HRo4wSNDW3pCxU4jPSy3Mf3WDz"
    },
    {
      "id": "4",
      "kind": "recovery",
      "label": "paper",
      "salt": "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8",
      "wrapped": "UFFSU1RVVldYWVpbJT8VYgMQXJJPcnCP3FkNm69cKCoWkZWv9V6S8Xg0S5nNAYuTf2bHnSTMoecYceIW"
    },
    {
      "age": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCi0-IFgyNTUxOSBDdk11RHdjWEpNQjRQTiswZWcvUkp1bGpEcUpJZ1doejVUOHFPL3hjS1FFCllERlQxMkpLTmhKVE82ZlNMdksvdlgzWTYxaE83TG9Fd3RFNXhQNVVzaFEKLS0tICtieFVsU3Z2aUNtRDlIYS8ydGNITjU2b0lBSXhIUFY5dDdkdmUvVk5QY1kKFEE-wmVdXcNcfOg_hUfKEIapVGb_ixAobJ7CDuSyP4cdNKRm1DxjfWYJcj2i73pauO2dzBn63_hRGm22uEy4tQ",
      "id": "5",
      "kind": "recipient",
      "label": "laptop",
      "recipient_types": "x25519",
      "wrapped": "UFFSU1RVVldYWVpbeDwY-25-C2J2mOkspTgf_vOj0-eAWOPDoC5DInjKlBV5Ndx0GtVc8CKSoqYspN_o"
    }
  ],
  "mac": "hTSVx8hg1K6zAIFw2HY0eDuX851ow2DzctYYcFH0F_Y"
}
"#;

const EXPECTED_CONFIG_JSON: &str = r#"{
  "cloakfs": 1,
  "volume": {
    "block_size": "4096",
    "content_cipher": "aes-256-gcm",
    "format_version": "1",
    "holes": "sparse",
    "long_name_max": "255",
    "name_cipher": "aes-256-siv",
    "volume_id": "oKGio6SlpqeoqaqrrK2urw"
  },
  "slots": [
    {
      "argon2_iterations": "1",
      "argon2_lanes": "1",
      "argon2_memory_kib": "64",
      "id": "1",
      "kdf": "argon2id",
      "kind": "passphrase",
      "label": "test",
      "salt": "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8",
      "wrapped": "UFFSU1RVVldYWVpb1voU2D3AB9rVNIZIDeFUNRuYiIhXoE1xMJ2HzN4NCD1pT0H-WGKtDQMzKfXsXTRh"
    }
  ],
  "mac": "5VjPDtsQG2M2veUljHhApMKr2VyCeQX1qc3wILx-TAo"
}
"#;

// ---------------------------------------------------------------------------------------------
// Helpers.

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn format_md() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/FORMAT.md");
    fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// Compares computed vectors with `EXPECTED` and with the text of FORMAT.md.
fn check(computed: &[(&str, String)]) {
    let doc = format_md();
    let expected: BTreeMap<&str, &str> = EXPECTED.iter().copied().collect();
    let mut failures = Vec::new();
    if std::env::var_os("PRINT_VECTORS").is_some() {
        for (name, value) in computed {
            eprintln!("VEC ({name:?}, {value:?}),");
        }
    }
    for (name, value) in computed {
        match expected.get(name) {
            Some(e) if e == value => {}
            Some(e) => failures.push(format!("{name}: computed {value}, committed {e}")),
            None => failures.push(format!("{name}: no committed value; computed {value}")),
        }
        if !doc.contains(value.as_str()) {
            failures.push(format!(
                "{name}: value {value} does not appear in docs/FORMAT.md"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn hkdf(ikm: &[u8], salt: Option<&[u8]>, info: &[u8], len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    Hkdf::<Sha256>::new(salt, ikm)
        .expand(info, &mut out)
        .unwrap();
    out
}

fn content_codec(suite: ContentSuite) -> ContentCodec {
    let key = master_key().subkey(&volume_id(), label::CONTENT);
    ContentCodec::new(suite, BLOCK_SIZE, false, key)
}

fn name_codec() -> NameCodec {
    NameCodec::new(master_key().subkey(&volume_id(), label::NAMES), 255)
}

fn meta_codec() -> MetaCodec {
    let mk = master_key();
    MetaCodec::new(
        mk.subkey(&volume_id(), label::METADATA),
        mk.subkey(&volume_id(), label::XATTR_NAMES),
    )
}

fn seal(suite: ContentSuite, block: u64, nonce: &[u8], plain: &[u8]) -> Vec<u8> {
    let cipher = content_codec(suite).file_cipher(file_id());
    let mut out = vec![0u8; plain.len() + suite.overhead() as usize];
    cipher.seal_with_nonce(block, nonce, plain, &mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// Vector tests.

#[test]
fn inputs_are_documented() {
    let doc = format_md();
    let inputs = [
        hex(master_key().expose()),
        hex(&volume_id()),
        b64(&volume_id()),
        hex(&file_id().0),
        hex(&dir_id().0),
        hex(&gcm_nonce()),
        hex(&xchacha_nonce()),
        hex(&symlink_nonce()),
        hex(&xattr_nonce()),
        hex(&salt()),
        hex(&wrap_nonce()),
        hex(&key_file()),
        hex(&recovery_key()),
        hex(&share_y()),
        hex(&shamir_kek()),
        hex(&recipient_kek()),
        AGE_IDENTITY.to_string(),
        AGE_RECIPIENT.to_string(),
        AGE_FILE_B64.to_string(),
        String::from_utf8(PASSPHRASE.to_vec()).unwrap(),
    ];
    for i in inputs {
        assert!(doc.contains(&i), "input {i} is not in docs/FORMAT.md");
    }
}

#[test]
fn key_hierarchy_vectors() {
    let mk = master_key();
    let vid = volume_id();
    let content: SecretBytes<32> = mk.subkey(&vid, label::CONTENT);
    let names: SecretBytes<64> = mk.subkey(&vid, label::NAMES);
    let xattr_names: SecretBytes<64> = mk.subkey(&vid, label::XATTR_NAMES);
    let metadata: SecretBytes<32> = mk.subkey(&vid, label::METADATA);
    let config_mac: SecretBytes<32> = mk.subkey(&vid, label::CONFIG_MAC);

    // The documented construction, done with the hkdf crate directly.
    for (l, key) in [
        ("content", &content.expose()[..]),
        ("names", &names.expose()[..]),
        ("xattr-names", &xattr_names.expose()[..]),
        ("metadata", &metadata.expose()[..]),
        ("config-mac", &config_mac.expose()[..]),
    ] {
        let info = format!("cloakfs v1 {l}");
        assert_eq!(
            hkdf(mk.expose(), Some(&vid), info.as_bytes(), key.len()),
            key,
            "{l}"
        );
    }

    // Per-file key: HKDF(ikm = content key, no salt, info = "cloakfs v1 file" || file ID).
    let info = [b"cloakfs v1 file".as_slice(), &file_id().0].concat();
    let file_key = hkdf(content.expose(), None, &info, 32);
    // It is the key the codec uses: seal with AES-256-GCM directly and compare.
    let plain = PARTIAL_PLAIN;
    let aad = [file_id().0.as_slice(), &2u64.to_be_bytes()].concat();
    let mut body = plain.to_vec();
    let tag = Aes256Gcm::new(file_key.as_slice().into())
        .encrypt_in_place_detached(&gcm_nonce().into(), &aad, &mut body)
        .unwrap();
    let direct = [gcm_nonce().as_slice(), &body, &tag].concat();
    assert_eq!(
        direct,
        seal(ContentSuite::Aes256Gcm, 2, &gcm_nonce(), plain)
    );

    check(&[
        ("key.content", hex(content.expose())),
        ("key.names", hex(names.expose())),
        ("key.xattr-names", hex(xattr_names.expose())),
        ("key.metadata", hex(metadata.expose())),
        ("key.config-mac", hex(config_mac.expose())),
        ("key.file", hex(&file_key)),
    ]);
}

#[test]
fn content_vectors() {
    let header = FileHeader { id: file_id() }.to_bytes();
    let aad0 = [file_id().0.as_slice(), &0u64.to_be_bytes()].concat();
    let aad2 = [file_id().0.as_slice(), &2u64.to_be_bytes()].concat();
    let full = seal(ContentSuite::Aes256Gcm, 0, &gcm_nonce(), &full_plain());
    assert_eq!(full.len(), 4096 + 28);
    let partial = seal(ContentSuite::Aes256Gcm, 2, &gcm_nonce(), PARTIAL_PLAIN);
    let xpartial = seal(
        ContentSuite::XChaCha20Poly1305,
        2,
        &xchacha_nonce(),
        PARTIAL_PLAIN,
    );
    assert_eq!(xpartial.len(), PARTIAL_PLAIN.len() + 40);

    // Round trips through the codec, and the hole rule.
    let c = content_codec(ContentSuite::Aes256Gcm).file_cipher(file_id());
    let mut out = vec![0u8; 4096];
    c.open(0, &full, &mut out).unwrap();
    assert_eq!(out, full_plain());
    assert!(c.open(1, &full, &mut out).is_err(), "block number is bound");
    c.open(0, &vec![0u8; 4096 + 28], &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 0), "all-zero block is a hole");

    check(&[
        ("header", hex(&header)),
        ("aad.block0", hex(&aad0)),
        ("aad.block2", hex(&aad2)),
        ("block.full.sha256", hex(&Sha256::digest(&full))),
        ("block.full.head", hex(&full[..44])),
        ("block.full.tag", hex(&full[full.len() - 16..])),
        ("block.partial.gcm", hex(&partial)),
        ("block.partial.xchacha", hex(&xpartial)),
    ]);
}

/// The size-preserving suite (FORMAT.md section 20): its keys from HKDF directly, its short
/// data units from one AES block of keystream computed here with the raw block cipher, and
/// blocks that keep their length.
#[test]
fn xts_vectors() {
    use aes::cipher::{BlockEncrypt, KeyInit as _};
    let content = master_key().subkey::<32>(&volume_id(), label::CONTENT);
    let info = [b"cloakfs v1 xts-file".as_slice(), &file_id().0].concat();
    let pair = hkdf(content.expose(), None, &info, 64);
    let info = [b"cloakfs v1 xts-short".as_slice(), &file_id().0].concat();
    let short_key = hkdf(content.expose(), None, &info, 32);

    let seal_xts = |block: u64, plain: &[u8]| seal(ContentSuite::Aes256Xts, block, &[], plain);
    let full = seal_xts(0, &full_plain());
    assert_eq!(full.len(), 4096);
    let partial = seal_xts(2, PARTIAL_PLAIN);
    assert_eq!(partial.len(), PARTIAL_PLAIN.len());
    let short = seal_xts(1, XTS_SHORT_PLAIN);
    // AES-256-CTR, initial counter block = u128le(1): the first keystream block is
    // AES(K_xts-short, 01 00 .. 00).
    let mut ks = [0u8; 16];
    ks[0] = 1;
    let mut ks = aes::Block::from(ks);
    aes::Aes256::new_from_slice(&short_key)
        .unwrap()
        .encrypt_block(&mut ks);
    let direct: Vec<u8> = XTS_SHORT_PLAIN.iter().zip(ks).map(|(p, k)| p ^ k).collect();
    assert_eq!(short, direct);

    let c = content_codec(ContentSuite::Aes256Xts).file_cipher(file_id());
    for (block, sealed, plain) in [
        (0, &full, full_plain()),
        (2, &partial, PARTIAL_PLAIN.to_vec()),
        (1, &short, XTS_SHORT_PLAIN.to_vec()),
    ] {
        let mut out = vec![0u8; plain.len()];
        c.open(block, sealed, &mut out).unwrap();
        assert_eq!(out, plain);
    }
    let mut out = vec![1u8; 4096];
    c.open(0, &[0u8; 4096], &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 0), "all-zero sector is a hole");

    // A header of version 2 holds the counter block of the short last block: AES-256-CTR from
    // initial counter block T, whatever the block number.
    let header_v2 = [&[0u8, 2][..], &file_id().0, &XTS_TAIL_COUNTER].concat();
    let c2 = content_codec(ContentSuite::Aes256Xts)
        .open_header(&header_v2)
        .unwrap()
        .cipher;
    let mut short_v2 = vec![0u8; XTS_SHORT_PLAIN.len()];
    c2.seal(1, XTS_SHORT_PLAIN, &mut short_v2);
    let mut ks = aes::Block::from(XTS_TAIL_COUNTER);
    aes::Aes256::new_from_slice(&short_key)
        .unwrap()
        .encrypt_block(&mut ks);
    let direct: Vec<u8> = XTS_SHORT_PLAIN.iter().zip(ks).map(|(p, k)| p ^ k).collect();
    assert_eq!(short_v2, direct);
    let mut out = vec![0u8; XTS_SHORT_PLAIN.len()];
    c2.open(7, &short_v2, &mut out).unwrap();
    assert_eq!(out, XTS_SHORT_PLAIN);
    let mut sealed = vec![0u8; PARTIAL_PLAIN.len()];
    c2.seal(2, PARTIAL_PLAIN, &mut sealed);
    assert_eq!(sealed, partial, "blocks of 16 bytes and more do not use it");

    check(&[
        ("key.xts-file", hex(&pair)),
        ("key.xts-short", hex(&short_key)),
        ("xts.full.sha256", hex(&Sha256::digest(&full))),
        ("xts.full.head", hex(&full[..32])),
        ("xts.partial", hex(&partial)),
        ("xts.short", hex(&short)),
        ("xts.header.v2", hex(&header_v2)),
        ("xts.short.v2", hex(&short_v2)),
    ]);
}

#[test]
fn size_vectors() {
    // The size lines are their own committed constants: FORMAT.md must contain each verbatim.
    let doc = format_md();
    for (suite, overhead) in [("aes-256-gcm", 28), ("xchacha20-poly1305", 40)] {
        let l = Layout::new(BLOCK_SIZE, overhead);
        for p in [0u64, 1, 4095, 4096, 4097, 10240] {
            let c = l.cipher_size(p);
            assert_eq!(l.plain_size(c), Ok(p));
            let line = format!("{suite}: plaintext {p} -> backing {c}");
            assert!(
                doc.contains(&line),
                "{line:?} does not appear in docs/FORMAT.md"
            );
        }
        // Invalid backing lengths: inside the header, or a last block of at most `overhead`.
        for c in [
            1,
            17,
            18 + 1,
            18 + overhead,
            18 + 4096 + overhead + overhead,
        ] {
            assert!(l.plain_size(c).is_err(), "{suite}: {c}");
        }
    }
}

#[test]
fn name_vectors() {
    let n = name_codec();
    let in_dir = n.encrypt(&dir_id(), SHORT_NAME).unwrap();
    let in_root = n.encrypt(&DirId(volume_id()), SHORT_NAME).unwrap();
    let StoredName::Short(in_dir) = in_dir else {
        panic!("short")
    };
    let StoredName::Short(in_root) = in_root else {
        panic!("short")
    };
    let StoredName::Long { backing, full } = n.encrypt(&dir_id(), &long_name()).unwrap() else {
        panic!("200 bytes must spill")
    };
    assert_eq!(n.decrypt(&dir_id(), &full).unwrap(), long_name());
    assert_eq!(
        backing,
        format!("cloakfs.long.{}", b64(&Sha256::digest(full.as_bytes())))
    );

    let m = meta_codec();
    let symlink = m
        .encrypt_symlink_with_nonce(&symlink_nonce(), SYMLINK_TARGET)
        .unwrap()
        .backing_target();
    assert_eq!(
        m.decrypt_symlink(symlink.as_bytes()).unwrap(),
        SYMLINK_TARGET
    );
    let xname = m.encrypt_xattr_name(XATTR_NAME).unwrap().unwrap();

    // xattr value, built from the documented construction and opened by the codec.
    let metadata: SecretBytes<32> = master_key().subkey(&volume_id(), label::METADATA);
    let aad = [b"xattr:".as_slice(), &xname].concat();
    let mut body = XATTR_VALUE.to_vec();
    let tag = Aes256Gcm::new(metadata.expose().into())
        .encrypt_in_place_detached(&xattr_nonce().into(), &aad, &mut body)
        .unwrap();
    let xvalue = [xattr_nonce().as_slice(), &body, &tag].concat();
    assert_eq!(m.decrypt_xattr_value(&xname, &xvalue).unwrap(), XATTR_VALUE);

    check(&[
        ("name.dir", in_dir),
        ("name.root", in_root),
        ("name.long.full", full),
        ("name.long.backing", backing),
        ("symlink", symlink),
        ("xattr.name", String::from_utf8(xname).unwrap()),
        ("xattr.value", hex(&xvalue)),
    ]);
}

/// A symlink target of PATH_MAX - 1 bytes: `0123456789/` over and over.
fn long_symlink_target() -> Vec<u8> {
    (0..SYMLINK_MAX).map(|i| b"0123456789/"[i % 11]).collect()
}

/// FORMAT.md 10.1: a long target's file holds nonce || AES-256-GCM(K_metadata, nonce, T,
/// "symlink") || tag, is named by the SHA-256 of those bytes, and the backing symlink points
/// to `cloakfs.symlink.` and that name.
#[test]
fn long_symlink_target_vectors() {
    let m = meta_codec();
    let target = long_symlink_target();
    let sealed = m
        .encrypt_symlink_with_nonce(&symlink_nonce(), &target)
        .unwrap();
    let SealedTarget::Long {
        name,
        sealed: bytes,
    } = &sealed
    else {
        panic!("4095 bytes are stored apart");
    };
    // Built from the documented construction.
    let metadata: SecretBytes<32> = master_key().subkey(&volume_id(), label::METADATA);
    let mut body = target.clone();
    let tag = Aes256Gcm::new(metadata.expose().into())
        .encrypt_in_place_detached(&symlink_nonce().into(), b"symlink", &mut body)
        .unwrap();
    let built = [symlink_nonce().as_slice(), &body, &tag].concat();
    assert_eq!(&built, bytes);
    assert_eq!(name, &b64(&Sha256::digest(&built)));
    assert_eq!(m.open_long_target(name, bytes).unwrap(), target);
    // The longest target stored inline, and the shortest stored apart.
    let inline = m
        .encrypt_symlink_with_nonce(&symlink_nonce(), &target[..SYMLINK_INLINE_MAX])
        .unwrap();
    assert!(matches!(inline, SealedTarget::Inline(ref t) if t.len() == 4038));
    let apart = m
        .encrypt_symlink_with_nonce(&symlink_nonce(), &target[..SYMLINK_INLINE_MAX + 1])
        .unwrap();
    assert!(matches!(apart, SealedTarget::Long { .. }));
    check(&[
        ("symlink.long.backing", sealed.backing_target()),
        ("symlink.long.file.sha256", hex(&Sha256::digest(&built))),
        ("symlink.long.file.head", hex(&built[..48])),
    ]);
}

#[test]
fn kdf_and_config_vectors() {
    let kek = kdf::derive(&Passphrase::new(PASSPHRASE.to_vec()), &salt(), &ARGON2).unwrap();
    let c = config();
    let canonical = c.canonical();
    let json = c.to_json();
    let parsed = VolumeConfig::parse(&json).unwrap();
    assert_eq!(parsed, c);
    let slot = &parsed.slots()[0];
    let wrapped = slot.fields()["wrapped"].clone();

    // Unwrap with the documented AAD, independently of the config code.
    let mut aad = String::from("cloakfs slot v1\n");
    aad.push_str(&format!("volume_id={}\n", b64(&volume_id())));
    for (k, v) in slot.fields().iter().filter(|(k, _)| *k != "wrapped") {
        aad.push_str(&format!("{k}={v}\n"));
    }
    let raw = cloakfs_core::text::unb64(wrapped.as_bytes()).unwrap();
    assert_eq!(raw.len(), 60);
    let mut mk = raw[12..44].to_vec();
    Aes256Gcm::new(kek.expose().into())
        .decrypt_in_place_detached(raw[..12].into(), aad.as_bytes(), &mut mk, raw[44..].into())
        .unwrap();
    assert_eq!(mk, master_key().expose());

    // The MAC, independently: HMAC-SHA256(config-mac key, canonical text).
    let key: SecretBytes<32> = master_key().subkey(&volume_id(), label::CONFIG_MAC);
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key.expose()).unwrap();
    m.update(canonical.as_bytes());
    let mac = b64(&m.finalize().into_bytes());
    assert!(json.contains(&format!("\"mac\": \"{mac}\"")));

    let (got, id) = parsed
        .unlock_passphrase(&Passphrase::new(PASSPHRASE.to_vec()))
        .unwrap();
    assert_eq!(got.expose(), master_key().expose());
    assert_eq!(id, 1);

    if std::env::var_os("PRINT_VECTORS").is_some() {
        eprintln!("CANON {canonical:?}");
        eprintln!("JSON {json:?}");
    }
    check(&[
        ("argon2id", hex(kek.expose())),
        ("slot.aad", aad),
        ("slot.wrapped", wrapped),
        ("config.mac", mac),
    ]);
    assert_eq!(canonical, EXPECTED_CANONICAL);
    assert_eq!(json, EXPECTED_CONFIG_JSON);
    let doc = format_md();
    assert!(doc.contains(&canonical), "canonical text not in FORMAT.md");
    assert!(doc.contains(&json), "config JSON not in FORMAT.md");
}

#[test]
fn slot_kind_vectors() {
    use cloakfs_core::slots::{keyfile, recovery, shamir};
    // keyfile: HKDF-SHA256(ikm = key file, salt = slot salt, info = "cloakfs v1 slot keyfile").
    let kf = keyfile::derive(&key_file(), &salt());
    assert_eq!(
        hkdf(&key_file(), Some(&salt()), b"cloakfs v1 slot keyfile", 32),
        kf.expose()
    );
    // recovery: HKDF-SHA256(ikm = recovery key, salt, info = "cloakfs v1 slot recovery").
    let rk = recovery::RecoveryKey::from_bytes(&recovery_key());
    let rkek = recovery::derive(&rk, &salt());
    assert_eq!(
        hkdf(
            &recovery_key(),
            Some(&salt()),
            b"cloakfs v1 slot recovery",
            32
        ),
        rkek.expose()
    );
    let text = rk.encode().to_string();
    assert_eq!(
        recovery::RecoveryKey::parse(&text.to_lowercase())
            .unwrap()
            .expose(),
        &recovery_key()
    );
    // The checksum, independently: SHA-256("cloakfs recovery key v1" || key)[..3].
    let digest = Sha256::digest([b"cloakfs recovery key v1".as_slice(), &recovery_key()].concat());
    let recovery_bytes = [recovery_key().as_slice(), &digest[..3]].concat();
    // Share encoding: volume ID of the inputs, slot 3, 2 of 3, share index 1.
    let share = shamir::Share::from_parts(volume_id(), 3, 2, 3, 1, &share_y());
    let share_text = share.encode().to_string();
    let raw = cloakfs_core::text::unb64(
        share_text
            .strip_prefix("cloakfs-share:")
            .unwrap()
            .as_bytes(),
    )
    .unwrap();
    let mut body = vec![1u8];
    body.extend_from_slice(&volume_id());
    body.extend_from_slice(&3u32.to_be_bytes());
    body.extend_from_slice(&[2, 3, 1]);
    body.extend_from_slice(&share_y());
    let digest = Sha256::digest([b"cloakfs share v1".as_slice(), &body].concat());
    body.extend_from_slice(&digest[..4]);
    assert_eq!(raw, body);
    let back = shamir::Share::parse(&share.file_text()).unwrap();
    assert_eq!(
        (back.volume_id, back.slot_id, back.index),
        (volume_id(), 3, 1)
    );
    check(&[
        ("keyfile.kek", hex(kf.expose())),
        ("recovery.bytes", hex(&recovery_bytes)),
        ("recovery.text", text),
        ("recovery.kek", hex(rkek.expose())),
        ("share.text", share_text),
    ]);
}

// ---------------------------------------------------------------------------------------------
// Shamir's field, and a config with one slot of each kind that opens without outside programs.

/// Product in GF(2^8) with bytes as polynomials over GF(2) (bit i = coefficient of x^i), reduced
/// by `poly` (0x11d for the shares, FORMAT.md 5.6). Written from the document, not from blahaj.
fn gf_mul(mut a: u8, mut b: u8, poly: u16) -> u8 {
    let mut r = 0u8;
    while b != 0 {
        if b & 1 == 1 {
            r ^= a;
        }
        b >>= 1;
        let carry = a & 0x80 != 0;
        a <<= 1;
        if carry {
            a ^= (poly & 0xff) as u8;
        }
    }
    r
}

fn gf_inv(a: u8, poly: u16) -> u8 {
    (1..=255u8).find(|&x| gf_mul(a, x, poly) == 1).unwrap()
}

/// Lagrange interpolation at `x` of the points `(x_j, y_j)`, bytewise.
fn interpolate(points: &[(u8, [u8; 32])], x: u8, poly: u16) -> [u8; 32] {
    std::array::from_fn(|i| {
        points.iter().fold(0u8, |acc, &(xj, ref yj)| {
            let l = points
                .iter()
                .filter(|(xm, _)| *xm != xj)
                .fold(1u8, |l, &(xm, _)| {
                    gf_mul(l, gf_mul(xm ^ x, gf_inv(xm ^ xj, poly), poly), poly)
                });
            acc ^ gf_mul(l, yj[i], poly)
        })
    })
}

/// The y bytes of a share, from its documented encoding (bytes 24..56).
fn share_bytes_y(share: &cloakfs_core::slots::shamir::Share) -> [u8; 32] {
    let text = share.encode();
    let raw =
        cloakfs_core::text::unb64(text.strip_prefix("cloakfs-share:").unwrap().as_bytes()).unwrap();
    raw[24..56].try_into().unwrap()
}

/// The three shares of the Shamir-slot vector: byte i of share x is `f_i(x) = k_i + c_i·x`,
/// where `k` is the KEK and `c_i = k_i + y1_i` so that share 1 is [`share_y`].
fn vector_shares() -> Vec<cloakfs_core::slots::shamir::Share> {
    let (k, y1) = (shamir_kek(), share_y());
    (1..=3u8)
        .map(|x| {
            let y: [u8; 32] = std::array::from_fn(|i| k[i] ^ gf_mul(k[i] ^ y1[i], x, 0x11d));
            cloakfs_core::slots::shamir::Share::from_parts(volume_id(), 3, 2, 3, x, &y)
        })
        .collect()
}

#[test]
fn shamir_field_vectors() {
    use cloakfs_core::slots::shamir;
    // The field facts FORMAT.md 5.6 gives to check an implementation.
    assert_eq!(gf_mul(0x80, 0x02, 0x11d), 0x1d);
    assert_eq!(gf_inv(0x03, 0x11d), 0xf4);
    assert_eq!(gf_inv(0x03, 0x11b), 0xf6, "the AES field differs");
    let mut g = 1u8;
    for n in 1..=255 {
        g = gf_mul(g, 0x02, 0x11d);
        assert_eq!(g == 1, n == 255, "0x02 generates the multiplicative group");
    }

    // blahaj's split: x = 1..N in order, points of polynomials of degree M-1 over this field
    // whose constant terms are the KEK bytes.
    let kek = cloakfs_core::slots::Kek::from_slice(&shamir_kek());
    let shares = shamir::split(&kek, volume_id(), 7, 3, 5).unwrap();
    let points: Vec<(u8, [u8; 32])> = shares.iter().map(|s| (s.index, share_bytes_y(s))).collect();
    assert_eq!(
        points.iter().map(|p| p.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    for pick in [[0, 1, 2], [4, 2, 0], [1, 3, 4]] {
        let three: Vec<_> = pick.iter().map(|&i| points[i]).collect();
        assert_eq!(interpolate(&three, 0, 0x11d), shamir_kek());
        for &(x, y) in &points {
            assert_eq!(
                interpolate(&three, x, 0x11d),
                y,
                "share {x} lies on the polynomial"
            );
        }
        if pick != [0, 1, 2] {
            // (For x = 1, 2, 3 every Lagrange coefficient at 0 is 1 in both fields.)
            assert_ne!(interpolate(&three, 0, 0x11b), shamir_kek());
        }
    }

    // The vector's shares: any two give the KEK, through cloakfs and through the document.
    let shares = vector_shares();
    let files: Vec<String> = shares.iter().map(|s| s.file_text().to_string()).collect();
    let parsed: Vec<shamir::Share> = files
        .iter()
        .map(|f| shamir::Share::parse(f).unwrap())
        .collect();
    let cfg = slots_config();
    let slot = cfg.slot(3).unwrap();
    for (a, b) in [(0, 1), (0, 2), (1, 2), (2, 0)] {
        let pair = [parsed[a].clone(), parsed[b].clone()];
        let got = shamir::kek(slot, &volume_id(), &pair).unwrap().unwrap();
        assert_eq!(got.expose(), &shamir_kek());
        let points = [
            (pair[0].index, share_bytes_y(&pair[0])),
            (pair[1].index, share_bytes_y(&pair[1])),
        ];
        assert_eq!(interpolate(&points, 0, 0x11d), shamir_kek());
        assert_ne!(interpolate(&points, 0, 0x11b), shamir_kek());
    }
    assert_eq!(share_bytes_y(&shares[0]), share_y());
    check(&[
        ("shamir.share1.file", files[0].clone()),
        ("shamir.share2.file", files[1].clone()),
        ("shamir.share3.file", files[2].clone()),
    ]);
}

/// The volume of the inputs with one slot of each kind that needs no outside program, each
/// wrapping the master key with the key-wrap nonce: 1 passphrase, 2 keyfile, 3 shamir (2 of
/// 3), 4 recovery, 5 recipient (one X25519 recipient).
fn slots_config() -> VolumeConfig {
    use cloakfs_core::slots::{keyfile, kind, recovery, Kek};
    let mk = master_key();
    let mut c = config();
    let (f, kek) = keyfile::new_slot(&key_file(), &salt()).unwrap();
    c.add_slot(&mk, kind::KEYFILE, "usb stick", f, &kek, wrap_nonce())
        .unwrap();
    let mut f = cloakfs_core::text::Fields::new();
    f.insert("threshold".into(), "2".into());
    f.insert("shares".into(), "3".into());
    let kek = Kek::from_slice(&shamir_kek());
    c.add_slot(&mk, kind::SHAMIR, "board", f, &kek, wrap_nonce())
        .unwrap();
    let rk = recovery::RecoveryKey::from_bytes(&recovery_key());
    let (f, kek) = recovery::new_slot(&rk, &salt());
    c.add_slot(&mk, kind::RECOVERY, "paper", f, &kek, wrap_nonce())
        .unwrap();
    let mut f = cloakfs_core::text::Fields::new();
    f.insert("recipient_types".into(), "x25519".into());
    f.insert("age".into(), AGE_FILE_B64.into());
    let kek = Kek::from_slice(&recipient_kek());
    c.add_slot(&mk, kind::RECIPIENT, "laptop", f, &kek, wrap_nonce())
        .unwrap();
    c.seal(&mk);
    c
}

#[test]
fn slot_kinds_config_vector() {
    use cloakfs_core::slots::{kind, recipient, recovery, shamir, KeySlot};
    let c = slots_config();
    let json = c.to_json();
    let parsed = VolumeConfig::parse(&json).unwrap();
    assert_eq!(parsed, c);
    assert_eq!(
        parsed.slots().iter().map(KeySlot::kind).collect::<Vec<_>>(),
        [
            kind::PASSPHRASE,
            kind::KEYFILE,
            kind::SHAMIR,
            kind::RECOVERY,
            kind::RECIPIENT
        ]
    );

    // The age X25519 identity is the one of the recipient, and the age file holds the KEK.
    let id: age::x25519::Identity = AGE_IDENTITY.parse().unwrap();
    assert_eq!(id.to_public().to_string(), AGE_RECIPIENT);
    let mut ids = recipient::Identities::new();
    ids.add_file(
        format!("# vector identity\n{AGE_IDENTITY}\n").as_bytes(),
        "vector",
        age::NoCallbacks,
    )
    .unwrap();

    // Each secret alone opens its slot (and only that one) through cloakfs's unlocking, and the
    // config MAC verifies under the master key it yields.
    let shares: Vec<shamir::Share> = vector_shares()[1..]
        .iter()
        .map(|s| shamir::Share::parse(&s.file_text()).unwrap())
        .collect();
    let recovery_text = recovery::RecoveryKey::from_bytes(&recovery_key())
        .encode()
        .to_string();
    let rk = recovery::RecoveryKey::parse(&recovery_text).unwrap();
    for (want_id, want_kind) in [
        (2, kind::KEYFILE),
        (3, kind::SHAMIR),
        (4, kind::RECOVERY),
        (5, kind::RECIPIENT),
    ] {
        let u = parsed
            .unlock_with(
                |slot| -> cloakfs_core::Result<Option<cloakfs_core::slots::Kek>> {
                    Ok(match (slot.kind(), want_kind) {
                        (kind::KEYFILE, kind::KEYFILE) => {
                            Some(cloakfs_core::slots::keyfile::kek(slot, &key_file())?)
                        }
                        (kind::SHAMIR, kind::SHAMIR) => shamir::kek(slot, &volume_id(), &shares)?,
                        (kind::RECOVERY, kind::RECOVERY) => Some(recovery::kek(slot, &rk)?),
                        (kind::RECIPIENT, kind::RECIPIENT) => {
                            let kek = recipient::kek(slot, &ids)?.unwrap();
                            assert_eq!(kek.expose(), &recipient_kek());
                            Some(kek)
                        }
                        _ => None,
                    })
                },
            )
            .unwrap();
        assert_eq!(u.slot_id, want_id);
        assert_eq!(u.master_key.expose(), master_key().expose());
    }

    // Each `wrapped`, independently: AES-256-GCM(KEK, nonce, MK, documented AAD).
    let keks: [(u32, Vec<u8>); 4] = [
        (
            2,
            hkdf(&key_file(), Some(&salt()), b"cloakfs v1 slot keyfile", 32),
        ),
        (3, shamir_kek().to_vec()),
        (
            4,
            hkdf(
                &recovery_key(),
                Some(&salt()),
                b"cloakfs v1 slot recovery",
                32,
            ),
        ),
        (5, recipient_kek().to_vec()),
    ];
    let mut computed = Vec::new();
    for (slot_id, kek) in keks {
        let slot = parsed.slot(slot_id).unwrap();
        let mut aad = format!("cloakfs slot v1\nvolume_id={}\n", b64(&volume_id()));
        for (k, v) in slot.fields().iter().filter(|(k, _)| *k != "wrapped") {
            aad.push_str(&format!("{k}={v}\n"));
        }
        let mut body = master_key().expose().to_vec();
        let tag = Aes256Gcm::new(kek[..].into())
            .encrypt_in_place_detached(&wrap_nonce().into(), aad.as_bytes(), &mut body)
            .unwrap();
        let wrapped = b64(&[wrap_nonce().as_slice(), &body, &tag].concat());
        assert_eq!(slot.fields()["wrapped"], wrapped);
        computed.push((format!("slots.{}.wrapped", slot.kind()), wrapped));
    }
    let mac_line = json.lines().find(|l| l.contains("\"mac\"")).unwrap();
    let mac = mac_line.split('"').nth(3).unwrap().to_string();
    computed.push(("slots.mac".into(), mac));
    let computed: Vec<(&str, String)> = computed
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    if std::env::var_os("PRINT_VECTORS").is_some() {
        eprintln!("SLOTS JSON\n{json}");
    }
    check(&computed);
    assert_eq!(json, EXPECTED_SLOTS_CONFIG_JSON);
    assert!(
        format_md().contains(&json),
        "slot-kinds config JSON not in FORMAT.md"
    );
    // The copy the independent decryptor's self-test reads.
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/slot-kinds.conf");
    assert_eq!(fs::read_to_string(committed).unwrap(), json);
}

// ---------------------------------------------------------------------------------------------
// The tiny volume.

/// One entry of the plaintext tree.
enum Node {
    File(Vec<u8>),
    Dir(DirId),
    Symlink(&'static [u8]),
}

fn hello_text(what: &str, len: usize) -> Vec<u8> {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < len {
        s.push_str(&format!("{i:04} cloakfs test volume, {what}\n"));
        i += 1;
    }
    s.truncate(len);
    s.into_bytes()
}

/// The plaintext tree of the tiny volume, parents before children.
fn plain_tree() -> Vec<(PathBuf, Node)> {
    let mut sparse = vec![0u8; BLOCK_SIZE as usize];
    sparse.extend_from_slice(b"after a one-block hole\n");
    vec![
        (
            "hello.txt".into(),
            Node::File(hello_text("hello.txt: 2.5 blocks of known text", 10240)),
        ),
        ("empty".into(), Node::File(Vec::new())),
        ("sparse.bin".into(), Node::File(sparse)),
        ("sub".into(), Node::Dir(dir_id())),
        (
            "sub/hello.txt".into(),
            Node::File(b"same name, other directory\n".to_vec()),
        ),
        (
            PathBuf::from(std::ffi::OsStr::from_bytes(&long_name())),
            Node::File(b"a file with a 200-byte name\n".to_vec()),
        ),
        ("link-to-hello".into(), Node::Symlink(SYMLINK_TARGET)),
    ]
}

fn derived(tag: &str, path: &Path, extra: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"cloakfs test volume ");
    h.update(tag.as_bytes());
    h.update(b" ");
    h.update(path.as_os_str().as_bytes());
    h.update(extra);
    h.finalize().into()
}

/// Writes the cipher directory of the tiny volume into `cipherdir` and its plaintext into
/// `plaindir`. Every "random" value comes from [`derived`], so the output is reproducible.
fn build_volume(cipherdir: &Path, plaindir: &Path) {
    fs::create_dir_all(cipherdir).unwrap();
    fs::create_dir_all(plaindir).unwrap();
    let cfg = config();
    fs::write(cipherdir.join(CONFIG_FILE), cfg.to_json()).unwrap();
    let vol = Volume::from_master_key(cfg, &master_key()).unwrap();
    let layout = vol.content().layout();
    let mut dir_ids: BTreeMap<PathBuf, (PathBuf, DirId)> = BTreeMap::new();
    dir_ids.insert(PathBuf::new(), (cipherdir.to_path_buf(), vol.root_dir_id()));
    for (path, node) in plain_tree() {
        let parent = path.parent().unwrap().to_path_buf();
        let (backing_parent, parent_id) = dir_ids[&parent].clone();
        let name = path.file_name().unwrap().as_bytes();
        let stored = vol.names().encrypt(&parent_id, name).unwrap();
        paths::write_sidecar(&backing_parent, &stored).unwrap();
        let backing = backing_parent.join(stored.backing());
        let plain = plaindir.join(&path);
        match node {
            Node::Dir(id) => {
                fs::create_dir(&backing).unwrap();
                fs::write(backing.join(DIRID_FILE), id.0).unwrap();
                fs::create_dir(&plain).unwrap();
                dir_ids.insert(path.clone(), (backing, id));
            }
            Node::Symlink(target) => {
                let nonce: [u8; 12] = derived("nonce", &path, b"")[..12].try_into().unwrap();
                let enc = vol
                    .meta()
                    .encrypt_symlink_with_nonce(&nonce, target)
                    .unwrap();
                assert!(matches!(enc, SealedTarget::Inline(_)), "short targets only");
                std::os::unix::fs::symlink(enc.backing_target(), &backing).unwrap();
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), &plain).unwrap();
            }
            Node::File(data) => {
                let mut out = Vec::new();
                if !data.is_empty() {
                    let id = FileId(derived("file id", &path, b"")[..16].try_into().unwrap());
                    out.extend_from_slice(&FileHeader { id }.to_bytes());
                    let cipher = vol.content().file_cipher(id);
                    for (n, chunk) in data.chunks(BLOCK_SIZE as usize).enumerate() {
                        let n = n as u64;
                        let start = out.len();
                        out.resize(start + chunk.len() + layout.overhead() as usize, 0);
                        if chunk.iter().all(|&b| b == 0) && chunk.len() == BLOCK_SIZE as usize {
                            continue; // a hole: all-zero backing block
                        }
                        let nonce = derived("nonce", &path, &n.to_be_bytes());
                        cipher.seal_with_nonce(n, &nonce[..12], chunk, &mut out[start..]);
                    }
                    assert_eq!(out.len() as u64, layout.cipher_size(data.len() as u64));
                }
                fs::write(&backing, out).unwrap();
                fs::write(&plain, &data).unwrap();
            }
        }
    }
}

fn committed_volume() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/volume")
}

fn committed_plaintext() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/independent/expected")
}

/// Every entry under `root`: relative path -> ("dir" | "file:<hex sha256>" | "symlink:<target>").
fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let md = fs::symlink_metadata(&p).unwrap();
            if md.is_dir() {
                out.insert(rel, "dir".into());
                walk(root, &p, out);
            } else if md.file_type().is_symlink() {
                let t = fs::read_link(&p).unwrap();
                out.insert(rel, format!("symlink:{}", t.display()));
            } else {
                out.insert(
                    rel,
                    format!("file:{}", hex(&Sha256::digest(fs::read(&p).unwrap()))),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Rewrites the committed volume and plaintext tree.
#[test]
#[ignore = "rewrites the committed test volume; run with --ignored generate"]
fn generate() {
    for d in [committed_volume(), committed_plaintext()] {
        if d.exists() {
            fs::remove_dir_all(&d).unwrap();
        }
    }
    build_volume(&committed_volume(), &committed_plaintext());
}

#[test]
fn committed_volume_is_reproducible() {
    let tmp = tempfile::tempdir().unwrap();
    let (c, p) = (tmp.path().join("cipher"), tmp.path().join("plain"));
    build_volume(&c, &p);
    assert_eq!(
        snapshot(&c),
        snapshot(&committed_volume()),
        "tests/vectors/volume differs from the generator (rerun with --ignored generate?)"
    );
    assert_eq!(snapshot(&p), snapshot(&committed_plaintext()));
    // FORMAT.md lists every backing entry of the committed volume.
    let doc = format_md();
    for path in snapshot(&c).keys() {
        let name = path.to_str().unwrap();
        assert!(
            doc.contains(&format!("`{name}`")),
            "{name} is not listed in docs/FORMAT.md"
        );
    }
    // The committed config is the config of the vectors above.
    assert_eq!(
        fs::read_to_string(committed_volume().join(CONFIG_FILE)).unwrap(),
        EXPECTED_CONFIG_JSON
    );
}

/// Decrypts backing directory `dir` (ID `id`) into `out`: plaintext path -> node description.
fn decrypt_tree(
    vol: &Volume,
    cipherdir: &Path,
    dir: &Path,
    id: &DirId,
    prefix: &Path,
    out: &mut BTreeMap<PathBuf, String>,
) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let entry = e.file_name().into_string().unwrap();
        let Some(name) = paths::decrypt_entry(vol, id, dir, &entry).unwrap() else {
            continue;
        };
        let rel = prefix.join(std::ffi::OsStr::from_bytes(&name));
        let backing = e.path();
        assert_eq!(paths::encrypt_path(vol, cipherdir, &rel).unwrap(), backing);
        let md = fs::symlink_metadata(&backing).unwrap();
        if md.is_dir() {
            out.insert(rel.clone(), "dir".into());
            let sub = paths::read_dir_id(vol, cipherdir, &backing).unwrap();
            decrypt_tree(vol, cipherdir, &backing, &sub, &rel, out);
        } else if md.file_type().is_symlink() {
            let t = fs::read_link(&backing).unwrap();
            let plain = cloakfs_core::io::long_targets::read_target_at(
                vol.meta(),
                cipherdir,
                t.as_os_str().as_bytes(),
            )
            .unwrap();
            out.insert(
                rel,
                format!("symlink:{}", String::from_utf8(plain).unwrap()),
            );
        } else {
            let f = ContentFile::open(Arc::clone(vol.content()), fs::File::open(&backing).unwrap())
                .unwrap();
            let mut buf = vec![0u8; f.size() as usize + 1];
            let n = f.read_at(0, &mut buf).unwrap();
            assert_eq!(n as u64, f.size());
            out.insert(rel, format!("file:{}", hex(&Sha256::digest(&buf[..n]))));
        }
    }
}

#[test]
fn committed_volume_unlocks_and_reads() {
    let dir = committed_volume();
    let vol = Volume::unlock(&dir, &Passphrase::new(PASSPHRASE.to_vec())).unwrap();
    assert!(Volume::unlock(&dir, &Passphrase::new(b"wrong".to_vec())).is_err());
    let mut got = BTreeMap::new();
    decrypt_tree(
        &vol,
        &dir,
        &dir,
        &vol.root_dir_id(),
        Path::new(""),
        &mut got,
    );

    let mut want = BTreeMap::new();
    for (path, node) in plain_tree() {
        let v = match node {
            Node::File(d) => format!("file:{}", hex(&Sha256::digest(&d))),
            Node::Dir(_) => "dir".into(),
            Node::Symlink(t) => format!("symlink:{}", String::from_utf8(t.to_vec()).unwrap()),
        };
        want.insert(path, v);
    }
    assert_eq!(got, want);
    assert_eq!(got, snapshot(&committed_plaintext()));
}

/// The AES-256-GCM-SIV suite and the derivations of a reverse view (FORMAT.md section 17),
/// each also computed from the document's construction with the hkdf, hmac and aes-gcm-siv
/// crates directly.
#[test]
fn reverse_view_vectors() {
    use aes_gcm_siv::Aes256GcmSiv;
    use cloakfs_core::format::reverse::ReverseKeys;

    let mk = master_key();
    let vid = volume_id();
    let k_reverse: SecretBytes<32> = mk.subkey(&vid, label::REVERSE);
    assert_eq!(
        hkdf(mk.expose(), Some(&vid), b"cloakfs v1 reverse", 32),
        k_reverse.expose()
    );
    let prf = |parts: &[&[u8]]| -> Vec<u8> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(k_reverse.expose()).unwrap();
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().to_vec()
    };
    let keys = ReverseKeys::new(&mk, &vid);
    let dir = keys.dir_id(b"sub");
    assert_eq!(dir.0[..], prf(&[b"dir\0", b"sub"])[..16]);
    assert_eq!(keys.dir_id(b"").0, vid, "the root's ID is the volume ID");
    let file = keys.file_id(b"sub/hello.txt");
    assert_eq!(file.0[..], prf(&[b"file\0", b"sub/hello.txt"])[..16]);
    let nonce0 = keys.block_nonce(&file, 0);
    assert_eq!(
        nonce0[..],
        prf(&[b"nonce\0", &file.0, &0u64.to_be_bytes()])[..12]
    );
    let link_nonce = keys.symlink_nonce(b"link", SYMLINK_TARGET);
    assert_eq!(
        link_nonce[..],
        prf(&[b"symlink\0", b"link", b"\0", SYMLINK_TARGET])[..12]
    );

    // The suite: AAD, per-file key and layout as every suite; the 12-byte nonce leads.
    let partial = seal(ContentSuite::Aes256GcmSiv, 2, &gcm_nonce(), PARTIAL_PLAIN);
    let content: SecretBytes<32> = mk.subkey(&vid, label::CONTENT);
    let info = [b"cloakfs v1 file".as_slice(), &file_id().0].concat();
    let file_key = hkdf(content.expose(), None, &info, 32);
    let aad = [file_id().0.as_slice(), &2u64.to_be_bytes()].concat();
    let mut body = PARTIAL_PLAIN.to_vec();
    let tag = Aes256GcmSiv::new(file_key.as_slice().into())
        .encrypt_in_place_detached(&gcm_nonce().into(), &aad, &mut body)
        .unwrap();
    assert_eq!(partial, [gcm_nonce().as_slice(), &body, &tag].concat());

    // The view's backing file of `sub/hello.txt` holding the partial-block plaintext: header,
    // then block 0 sealed under the derived nonce. A second derivation gives the same bytes.
    let cipher = content_codec(ContentSuite::Aes256GcmSiv).file_cipher(file);
    let mut block = vec![0u8; PARTIAL_PLAIN.len() + 28];
    cipher
        .seal_derived(0, &nonce0, PARTIAL_PLAIN, &mut block)
        .unwrap();
    let backing = [FileHeader { id: file }.to_bytes().as_slice(), &block].concat();
    let mut again = vec![0u8; block.len()];
    cipher
        .seal_derived(0, &keys.block_nonce(&file, 0), PARTIAL_PLAIN, &mut again)
        .unwrap();
    assert_eq!(block, again);
    let symlink = meta_codec()
        .encrypt_symlink_with_nonce(&link_nonce, SYMLINK_TARGET)
        .unwrap()
        .backing_target();
    let hello_in_sub = name_codec().encrypt(&dir, SHORT_NAME).unwrap();

    check(&[
        ("reverse.key", hex(k_reverse.expose())),
        ("reverse.dir.sub", hex(&dir.0)),
        ("reverse.file.sub/hello.txt", hex(&file.0)),
        ("reverse.nonce.0", hex(&nonce0)),
        ("reverse.symlink.nonce", hex(&link_nonce)),
        ("reverse.symlink", symlink),
        ("reverse.name", hello_in_sub.backing().to_string()),
        ("reverse.backing", hex(&backing)),
        ("block.partial.gcm-siv", hex(&partial)),
    ]);
}

// ---------------------------------------------------------------------------------------------
// Section 18: the shared file header of a sharing volume.

/// The file key `FK` of the shared-file vectors (section 18.6).
fn shared_file_key() -> [u8; 32] {
    seq(0x30)
}

/// The recipient key `W` of the version-3 shared-file vectors (section 18.6).
fn shared_recipient_key() -> [u8; 64] {
    seq(0x80)
}

/// A committed shared backing file: its header grants `FK` to the age recipient of 15.1, then
/// one partial block (the partial plaintext of 15.1 as block 0, AES-256-GCM nonce of 15.1).
/// Version 3 (`v3`): the entry is `tests/vectors/shared-recipient-key.age` (made once with
/// Debian's `age`, plaintext `W`) and FK wrapped under `W`; version 2: the entry is
/// `tests/vectors/shared-entry.age` (plaintext `FK`).
fn shared_file(v3: bool) -> (Vec<u8>, Vec<u8>) {
    use cloakfs_core::format::filekey::{kind, Grant, SharedHeader, Wrap};
    let wrap = if v3 {
        let sealed = fs::read(vectors_dir().join("shared-recipient-key.age")).unwrap();
        Wrap::Keyed {
            kind: kind::AGE,
            sealed,
            wrapped: siv_wrap(&shared_recipient_key(), &file_id().0, &shared_file_key()),
        }
    } else {
        Wrap::Direct {
            age: fs::read(vectors_dir().join("shared-entry.age")).unwrap(),
        }
    };
    let header = SharedHeader::seal_version(
        if v3 { 3 } else { 2 },
        &shared_file_key(),
        file_id(),
        vec![Grant {
            recipient: AGE_RECIPIENT.to_string(),
            wrap,
        }],
    )
    .unwrap();
    let bytes = header.to_bytes().unwrap();
    let codec = ContentCodec::new_wrapped(
        ContentSuite::Aes256Gcm,
        4096,
        false,
        None,
        header_key(false),
    );
    let cipher =
        codec.cipher_from_file_key(file_id(), &SecretBytes::from_slice(&shared_file_key()));
    let mut block = vec![0u8; PARTIAL_PLAIN.len() + 28];
    cipher.seal_with_nonce(0, &gcm_nonce(), PARTIAL_PLAIN, &mut block);
    (bytes, block)
}

/// The header key of the 15.1 volume (section 18.2), the volume MAC `required` or not.
fn header_key(required: bool) -> cloakfs_core::format::filekey::HeaderMacKey {
    cloakfs_core::format::filekey::HeaderMacKey::new(
        master_key().subkey(&volume_id(), "share-header"),
        required,
    )
}

/// AES-256-SIV (RFC 5297) of `fk` under `w` with the one header `id`, from RustCrypto's aes-siv.
fn siv_wrap(w: &[u8; 64], id: &[u8; 16], fk: &[u8; 32]) -> [u8; 48] {
    use aes_siv::{siv::Aes256Siv, KeyInit};
    Aes256Siv::new(w.into())
        .encrypt([id.as_slice()], fk)
        .unwrap()
        .try_into()
        .unwrap()
}

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

#[test]
fn shared_header_vectors() {
    for v3 in [true, false] {
        shared_header_vector(v3);
    }
}

/// Section 18.6: the version-3 header (written today) and the version-2 one (still read).
fn shared_header_vector(v3: bool) {
    use cloakfs_core::format::filekey::{FileKeySource, SharedHeader};
    let (header, block) = shared_file(v3);
    assert_eq!(header.len(), 4096);
    let fk = shared_file_key();
    let f = file_id().0;
    // Computed again from the primitives, as section 18 states them.
    let block_key = hkdf(&fk, None, &[b"cloakfs v1 file".as_slice(), &f].concat(), 32);
    let list_key = hkdf(
        &fk,
        None,
        &[b"cloakfs v1 share-list".as_slice(), &f].concat(),
        32,
    );
    let mut body = Vec::new();
    body.extend_from_slice(&(if v3 { 3u16 } else { 2 }).to_be_bytes());
    body.extend_from_slice(&f);
    body.extend_from_slice(&1u16.to_be_bytes());
    let wrapped = siv_wrap(&shared_recipient_key(), &f, &fk);
    let entry = if v3 {
        body.push(1);
        fs::read(vectors_dir().join("shared-recipient-key.age")).unwrap()
    } else {
        fs::read(vectors_dir().join("shared-entry.age")).unwrap()
    };
    body.extend_from_slice(&(AGE_RECIPIENT.len() as u16).to_be_bytes());
    body.extend_from_slice(AGE_RECIPIENT.as_bytes());
    body.extend_from_slice(&(entry.len() as u16).to_be_bytes());
    body.extend_from_slice(&entry);
    if v3 {
        body.extend_from_slice(&wrapped);
    }
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&list_key).unwrap();
    mac.update(if v3 {
        b"cloakfs shared header v3\n"
    } else {
        b"cloakfs shared header v2\n"
    });
    mac.update(&body);
    let mac = mac.finalize().into_bytes();
    assert_eq!(&header[..body.len()], &body[..]);
    assert_eq!(&header[body.len()..body.len() + 32], &mac[..]);
    assert!(header[body.len() + 32..].iter().all(|&b| b == 0));
    let gcm = Aes256Gcm::new_from_slice(&block_key).unwrap();
    let mut ct = PARTIAL_PLAIN.to_vec();
    let tag = gcm
        .encrypt_in_place_detached(
            (&gcm_nonce()).into(),
            &[f.as_slice(), &0u64.to_be_bytes()].concat(),
            &mut ct,
        )
        .unwrap();
    assert_eq!(block, [gcm_nonce().as_slice(), &ct, &tag].concat());

    // The identity of 15.1 opens the committed file through cloakfs's own reader.
    let codec = Arc::new(ContentCodec::new_wrapped(
        ContentSuite::Aes256Gcm,
        4096,
        false,
        Some(vector_member()),
        header_key(false),
    ));
    let name = if v3 {
        "shared-file.bin"
    } else {
        "shared-file-v2.bin"
    };
    committed_shared_file_opens(name, &[header.clone(), block.clone()].concat(), &codec);
    let FileKeySource::Wrapped(keys) = codec.key_source() else {
        panic!("wrapped")
    };
    assert_eq!(keys.unwrap_count(), 1);
    assert!(SharedHeader::parse(&header).unwrap().verify(&fk).is_ok());

    if v3 {
        shared_volume_mac_vector(&header, &block, &body, &mac);
        check(&[
            ("shared.key.block", hex(&block_key)),
            ("shared.key.list", hex(&list_key)),
            ("shared.wrapped", hex(&wrapped)),
            ("shared.header.mac", hex(&mac)),
            ("shared.header.sha256", hex(&Sha256::digest(&header))),
            ("shared.block0", hex(&block)),
        ]);
    } else {
        check(&[
            ("shared.v2.header.mac", hex(&mac)),
            ("shared.v2.header.sha256", hex(&Sha256::digest(&header))),
        ]);
    }
}

/// Section 18.2 and 18.6: the volume MAC of the version-3 header under the 15.1 master key, the
/// committed file that carries it, and a volume that requires it refusing the header without.
fn shared_volume_mac_vector(header: &[u8], block: &[u8], body: &[u8], mac: &[u8]) {
    use cloakfs_core::format::filekey::SharedHeader;
    let key = hkdf(
        master_key().expose(),
        Some(&volume_id()),
        b"cloakfs v1 share-header",
        32,
    );
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&key).unwrap();
    m.update(b"cloakfs shared header volume mac\n");
    m.update(body);
    m.update(mac);
    let volume_mac = m.finalize().into_bytes();
    let parsed = SharedHeader::parse(header).unwrap();
    assert_eq!(header_key(true).compute(&parsed).unwrap(), volume_mac[..]);
    let mut with_mac = header.to_vec();
    let at = body.len() + 32;
    with_mac[at..at + 32].copy_from_slice(&volume_mac);
    let codec = Arc::new(ContentCodec::new_wrapped(
        ContentSuite::Aes256Gcm,
        4096,
        false,
        Some(vector_member()),
        header_key(true),
    ));
    let whole = [with_mac.clone(), block.to_vec()].concat();
    committed_shared_file_opens("shared-file-mac.bin", &whole, &codec);
    // The same header without the volume MAC, and with a flipped one: tampering.
    for bad in [header.to_vec(), {
        let mut b = with_mac.clone();
        b[at] ^= 1;
        b
    }] {
        assert!(matches!(
            codec.open_header(&bad),
            Err(cloakfs_core::Error::Tampered(_))
        ));
    }
    check(&[
        ("shared.key.header", hex(&key)),
        ("shared.header.volume_mac", hex(&volume_mac)),
        ("shared.header-mac.sha256", hex(&Sha256::digest(&with_mac))),
    ]);
}

/// Checks the committed `tests/vectors/NAME` against `whole` (or writes it, with
/// `GENERATE_SHARED_VECTOR`), and that `codec` opens it to the partial plaintext of 15.1.
fn committed_shared_file_opens(name: &str, whole: &[u8], codec: &Arc<ContentCodec>) {
    if std::env::var_os("GENERATE_SHARED_VECTOR").is_some() {
        fs::write(vectors_dir().join(name), whole).unwrap();
    } else {
        let committed = fs::read(vectors_dir().join(name)).unwrap();
        assert_eq!(committed, whole, "tests/vectors/{name}");
    }
    let file = fs::File::open(vectors_dir().join(name)).unwrap();
    let cf = ContentFile::open(codec.clone(), file).unwrap();
    let mut out = vec![0u8; PARTIAL_PLAIN.len()];
    assert_eq!(cf.read_at(0, &mut out).unwrap(), PARTIAL_PLAIN.len());
    assert_eq!(out, PARTIAL_PLAIN);
}

/// The member of the shared-file vectors: the age identity of 15.1.
fn vector_member() -> cloakfs_core::format::filekey::Member {
    let mut ids = cloakfs_core::slots::recipient::Identities::new();
    ids.add_file(AGE_IDENTITY.as_bytes(), "vector", age::NoCallbacks)
        .unwrap();
    cloakfs_core::format::filekey::Member::new(ids, AGE_RECIPIENT.to_string()).unwrap()
}
