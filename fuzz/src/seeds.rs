//! Valid inputs for each target, made with the real writers under the fixture keys: the
//! starting corpus of a fuzz run and the inputs that CI mutates.

use crate::fixture::{self, DIR_ID, VOLUME_ID};
use crate::records;
use cloakfs_core::crypto::keys::MasterKey;
use cloakfs_core::format::config::{VolumeConfig, VolumeParams};
use cloakfs_core::format::content::ContentSuite;
use cloakfs_core::format::names::StoredName;
use cloakfs_core::io::file::ContentFile;
use cloakfs_core::slots::shamir::Share;
use cloakfs_core::text::b64;
use cloakfs_daemon::protocol::{
    AttachRequest, AuthMethod, AuthzAddRequest, Entity, Naming, OnTimeout, Request, Response,
    SessionInfo,
};

/// Configs: the reference config (every slot kind), one without a stored key, and variants.
pub fn config() -> Vec<Vec<u8>> {
    let reference = fixture::reference();
    let mut out = vec![reference.0.to_json().into_bytes()];
    let (c, _) = VolumeConfig::new_no_stored_key(
        fixture::params(ContentSuite::XChaCha20Poly1305, 1024, true),
        &fixture::passphrase(),
        fixture::cheap_kdf(),
        [9; 32],
    )
    .expect("config without a stored key");
    out.push(c.to_json().into_bytes());
    let mut bare = VolumeConfig::new(VolumeParams {
        volume_id: VOLUME_ID,
        ..VolumeParams::new()
    });
    bare.seal(&MasterKey::from_bytes(&[1; 32]));
    out.push(bare.to_json().into_bytes());
    out
}

/// Slot records of every slot of the reference config, alone and all together.
pub fn slots() -> Vec<Vec<u8>> {
    let reference = fixture::reference();
    let all: Vec<_> = reference.0.slots().iter().map(|s| s.fields()).collect();
    let mut out: Vec<Vec<u8>> = all.iter().map(|f| records::encode(&[f])).collect();
    out.push(records::encode(&all));
    out
}

/// Backing files written by [`ContentFile`] in several geometries, with and without holes.
pub fn file() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let dir = tempfile::tempdir().expect("temporary directory");
    for flags in [0u8, 1, 2, 4, 9, 14] {
        let volume = fixture::volume(flags);
        let bs = volume.content().layout().block_size() as usize;
        for (size, hole) in [
            (0, false),
            (1, false),
            (bs, false),
            (bs + 1, false),
            (3 * bs + 5, true),
        ] {
            let path = dir.path().join(format!("f{flags}-{size}"));
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .expect("seed file");
            let cf = ContentFile::open(volume.content().clone(), f).expect("seed file");
            let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            cf.write_at(0, &data).expect("seed write");
            if hole {
                cf.punch_hole(bs as u64, bs as u64).expect("seed hole");
            }
            drop(cf);
            // Files with a hole also get a sparse tail of 8 x 0x1000 zero bytes.
            let tail: u16 = if hole { 0x1000 } else { 0 };
            let mut seed = vec![flags];
            seed.extend_from_slice(&tail.to_le_bytes());
            seed.extend_from_slice(&(size as u32 / 2).to_le_bytes());
            seed.extend_from_slice(&(bs as u16 / 3).to_le_bytes());
            seed.extend_from_slice(&std::fs::read(&path).expect("seed bytes"));
            out.push(seed);
        }
    }
    out
}

/// Short and long stored names, plaintext names, a sidecar and a directory ID.
pub fn names() -> Vec<Vec<u8>> {
    let volume = fixture::volume(0);
    let codec = volume.names();
    let mut out = Vec::new();
    for plain in [&b"hello.txt"[..], &[b'n'; 200], "\u{e9}t\u{e9}".as_bytes()] {
        let (full, backing) = match codec.encrypt(&DIR_ID, plain).expect("seed name") {
            StoredName::Short(s) => (s.clone(), s),
            StoredName::Long { backing, full } => (full, backing),
        };
        for (mode, payload) in [
            (0u8, full.as_bytes()),
            (0, backing.as_bytes()),
            (2, full.as_bytes()),
        ] {
            out.push([&[mode][..], payload].concat());
        }
        out.push([&[1u8][..], plain].concat());
    }
    out.push([&[3u8][..], &[7; 16]].concat());
    out
}

/// Symlink targets, xattr names and values.
pub fn meta() -> Vec<Vec<u8>> {
    let volume = fixture::volume(0);
    let m = volume.meta();
    let target = m
        .encrypt_symlink(b"../some/where")
        .expect("seed symlink")
        .backing_target();
    let name = m
        .encrypt_xattr_name(b"user.comment")
        .expect("seed xattr name")
        .expect("a user xattr");
    let value = m
        .encrypt_xattr_value(&name, b"a value")
        .expect("seed xattr value");
    vec![
        [&[0u8][..], target.as_bytes()].concat(),
        [&[1u8][..], &name].concat(),
        [&[1u8][..], b"security.selinux"].concat(),
        [&[2u8, name.len() as u8][..], &name, &value].concat(),
    ]
}

/// Rekey journals: one of a rekey that had finished (its new config is the one on disk), one
/// of another volume, one of a newer cloakfs.
pub fn rekey_journal() -> Vec<Vec<u8>> {
    let reference = fixture::reference();
    let other = config().pop().expect("a config");
    let journal = |version: u64, config: &str| {
        serde_json::json!({
            "cloakfs_rekey": version,
            "volume_id": b64(&VOLUME_ID),
            "new_key": b64(&[7; 60]),
            "new_config": config,
        })
        .to_string()
        .into_bytes()
    };
    let done = reference.0.to_json();
    vec![
        journal(1, &done),
        journal(1, std::str::from_utf8(&other).expect("JSON")),
        journal(2, &done),
    ]
}

/// The reference shamir slot's shares, as share files and bare.
pub fn share() -> Vec<Vec<u8>> {
    let reference = fixture::reference();
    let mut out: Vec<Vec<u8>> = reference
        .1
        .iter()
        .map(|s| s.file_text().as_bytes().to_vec())
        .collect();
    let other = Share::from_parts([5; 16], 9, 1, 1, 1, &[8; 32]);
    out.push(other.encode().as_bytes().to_vec());
    out
}

/// The reference recovery key, typed neatly and sloppily.
pub fn recovery_key() -> Vec<Vec<u8>> {
    let text = fixture::recovery_key().encode();
    vec![
        text.as_bytes().to_vec(),
        text.to_lowercase().replace('-', " ").into_bytes(),
    ]
}

/// One line of every request and response the protocol has.
pub fn control() -> Vec<Vec<u8>> {
    let requests = [
        Request::Attach(AttachRequest {
            cipherdir: "/srv/cipher".into(),
            naming: Naming::Given("work".into()),
            hidden: true,
            read_only: false,
            master_key: "QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkI".into(),
            key_ttl: Some(60),
            callback: Some("logger timeout".into()),
            member: Some(cloakfs_daemon::protocol::MemberKeys {
                identities: vec!["AGE-SECRET-KEY-1QQQQ".into()],
                recipient: "age1qqqq".into(),
                gpg: true,
                gnupghome: Some("/home/u/.gnupg".into()),
            }),
        }),
        Request::Detach {
            name: "work".into(),
        },
        Request::Status,
        Request::AuthzAdd(AuthzAddRequest {
            name: "work".into(),
            entity: Entity::User(1000),
            perms: vec!["read".into(), "write".into()],
            auth: AuthMethod::Passphrase {
                salt: "c2FsdA".into(),
                memory_kib: 64,
                iterations: 1,
                parallelism: 1,
                key: "a2V5".into(),
            },
            expires: Some(3600),
            session_ttl: None,
            idle: Some(60),
            on_timeout: OnTimeout::SleepNew,
            callback: None,
            any_uid: false,
        }),
        Request::Auth {
            name: "work".into(),
            authz: Some(2),
        },
        Request::AuthAnswer {
            answer: "YW5zd2Vy".into(),
        },
        Request::Revoke {
            name: "work".into(),
            session: 3,
        },
    ];
    let responses = [
        Response::Error {
            message: "no".into(),
        },
        Response::Sessions {
            sessions: vec![SessionInfo {
                id: 1,
                attach: "work".into(),
                authz: 1,
                entity: Entity::Session(7),
                uid: 1000,
                state: "active".into(),
                expires: None,
                perms: vec!["read".into()],
                waiting: 0,
            }],
        },
    ];
    let mut out: Vec<Vec<u8>> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let line = serde_json::to_string(r).expect("request");
        out.push([&[i as u8][..], line.as_bytes(), b"\n"].concat());
    }
    for r in &responses {
        let line = serde_json::to_string(r).expect("response");
        out.push([&[3u8][..], line.as_bytes(), b"\r\n"].concat());
    }
    // Several requests on one connection.
    out.push(
        [
            &[3u8][..],
            b"{\"op\":\"status\"}\n{\"op\":\"detach\",\"name\":\"x\"}\n",
        ]
        .concat(),
    );
    out
}
