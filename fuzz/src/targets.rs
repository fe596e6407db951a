//! The targets: each takes any bytes, feeds them to the real parser entry points, and checks
//! what must hold for every input. A panic (a failed check included), a hang or an unbounded
//! allocation is a finding; an error is the expected answer to bad input.

use crate::fixture::{self, DIR_ID, VOLUME_ID};
use crate::records;
use cloakfs_core::error::{Error, Result};
use cloakfs_core::format::config::{KeySource, VolumeConfig, CONFIG_VERSION};
use cloakfs_core::format::content::{ContentCodec, ContentSuite, FileHeader};
use cloakfs_core::format::layout::{Layout, HEADER_LEN};
use cloakfs_core::format::meta::{long_target_file_name, SealedTarget};
use cloakfs_core::format::names::{self, EntryKind, StoredName, DIRID_FILE};
use cloakfs_core::io::file::ContentFile;
use cloakfs_core::slots::recovery::RecoveryKey;
use cloakfs_core::slots::shamir::Share;
use cloakfs_core::slots::{keyfile, kind, passphrase, recipient, recovery, shamir, Kek, KeySlot};
use cloakfs_core::text::b64;
use cloakfs_core::tools::blocks::{BlockReader, BlockState, CHUNK_BLOCKS};
use cloakfs_core::tools::{paths, rekey, walk};
use cloakfs_core::Volume;
use cloakfs_daemon::lines::{Line, LineReader};
use cloakfs_daemon::protocol::{Request, Response, MAX_MESSAGE};
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

thread_local! {
    // One scratch file and directory per thread, reused by every input.
    static SCRATCH: tempfile::TempDir = tempfile::Builder::new()
        .prefix("cloakfs-fuzz-")
        .tempdir()
        .expect("scratch directory");
}

fn with_scratch<T>(f: impl FnOnce(&Path) -> T) -> T {
    SCRATCH.with(|d| f(d.path()))
}

/// `cloakfs.conf` text: parse, write back, re-parse; then every slot's key derivation and
/// unwrap under the fixture secrets, and the unlock.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(c) = VolumeConfig::parse(text) else {
        return;
    };
    round_trip(&c);
    unlock(&c);
}

/// Key slots as binary records (see [`records`]) inside an otherwise valid config, sealed
/// with the fixture master key: slot field parsing, every kind's KEK, and the unwrap.
pub fn slots(data: &[u8]) {
    let volume =
        VolumeConfig::new(fixture::params(ContentSuite::Aes256Gcm, 4096, false)).volume_fields();
    let json = serde_json::json!({
        "cloakfs": CONFIG_VERSION,
        "volume": volume,
        "slots": records::decode(data),
        "mac": b64(&[0; 32]),
    });
    let Ok(mut c) = VolumeConfig::parse(&json.to_string()) else {
        return;
    };
    round_trip(&c);
    c.seal(&fixture::master_key());
    unlock(&c);
}

fn round_trip(c: &VolumeConfig) {
    let again = VolumeConfig::parse(&c.to_json()).expect("a parsed config re-parses");
    assert_eq!(&again, c, "a parsed config survives being written back");
    assert_eq!(again.canonical(), c.canonical());
}

/// Tries every slot with the fixture secrets, as `cloakfs mount` would with all of them given.
fn unlock(c: &VolumeConfig) {
    for slot in c.slots() {
        let _ = (slot.id(), slot.label(), slot.is_known_kind());
        let _ = cloakfs_core::slots::kind_fields(slot.kind());
        let _ = slot.argon2();
        let _ = slot.wrap_aad(&c.params.volume_id);
    }
    let reference = fixture::reference();
    let ids = fixture::identities();
    let rk = fixture::recovery_key();
    let unlocked = c.unlock_with(|slot: &KeySlot| -> Result<Option<Kek>> {
        match slot.kind() {
            kind::PASSPHRASE if fixture::is_cheap(&slot.argon2()?) => {
                passphrase::kek(slot, &fixture::passphrase()).map(Some)
            }
            kind::KEYFILE => keyfile::kek(slot, fixture::KEY_FILE).map(Some),
            kind::RECOVERY => recovery::kek(slot, &rk).map(Some),
            kind::RECIPIENT => recipient::kek(slot, &ids),
            kind::SHAMIR => shamir::kek(slot, &c.params.volume_id, &reference.1),
            _ => Ok(None),
        }
    });
    match unlocked {
        Ok(u) => {
            Volume::from_master_key(c.clone(), &u.master_key).expect("unlock verified the MAC");
        }
        Err(Error::NoUsableSlot(_)) => {
            if let KeySource::Passphrase { kdf, .. } = c.key_source() {
                if fixture::is_cheap(kdf) {
                    let _ = c.unlock_passphrase_full(&fixture::passphrase());
                }
            }
        }
        Err(_) => {}
    }
}

/// A planted backing file: `flags(1) || zero tail(2) || write offset(4) || write length(2) ||
/// file bytes`. `flags` picks the suite, hole mode and block size ([`fixture::geometry`]);
/// the file gets 8 x `zero tail` more zero bytes (a sparse extension). Checks the header
/// parser and the layout arithmetic, then reads the blocks with the FUSE path
/// ([`ContentFile`]) and the tools' path ([`BlockReader`]), which must agree; then a write,
/// which must read back.
pub fn file(data: &[u8]) {
    let Some((head, bytes)) = data.split_first_chunk::<9>() else {
        return;
    };
    let flags = head[0];
    // Up to 512 KiB: enough blocks for the paths that open them on all cores.
    let tail = 8 * u64::from(u16::from_le_bytes([head[1], head[2]]));
    let write_off = u64::from(u32::from_le_bytes([head[3], head[4], head[5], head[6]]));
    let write_len = usize::from(u16::from_le_bytes([head[7], head[8]]));
    if let Ok(h) = FileHeader::parse(bytes) {
        assert_eq!(&h.to_bytes()[..], &bytes[..HEADER_LEN as usize]);
    }
    let volume = fixture::volume(flags);
    let codec = volume.content();
    let layout = codec.layout();
    let len = bytes.len() as u64 + tail;
    check_layout(layout, len);
    with_scratch(|dir| {
        let path = dir.join("backing");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("scratch file");
        f.write_all_at(bytes, 0).expect("scratch write");
        f.set_len(len).expect("scratch length");
        read_and_write(codec, f, write_off, write_len);
    });
}

fn check_layout(l: Layout, len: u64) {
    match l.plain_size(len) {
        Ok(size) => {
            // A header-only file is an empty file too.
            let canonical = if len == HEADER_LEN { 0 } else { len };
            assert_eq!(l.cipher_size(size), canonical);
            assert_eq!(l.plain_size_lenient(len), size);
        }
        Err(_) => {
            let size = l.plain_size_lenient(len);
            assert!(l.cipher_size(size) < len);
            assert_eq!(size % l.block_size(), 0);
        }
    }
}

fn read_and_write(codec: &Arc<ContentCodec>, f: File, off: u64, len: usize) {
    let layout = codec.layout();
    let blocks = BlockReader::open(codec, f.try_clone().expect("dup")).ok();
    let content = ContentFile::open(codec.clone(), f).expect("open a planted file");
    let mut states = Vec::new();
    let mut plain = Vec::new();
    if let Some(r) = &blocks {
        assert_eq!(r.size(), content.size());
        let (mut out, mut sealed) = (Vec::new(), Vec::new());
        let mut b = 0;
        // Chunk sizes as the tools use them (on all cores from 16 blocks) and small ones.
        for max in [CHUNK_BLOCKS, 1, 2, 3].into_iter().cycle() {
            if b >= r.block_count() {
                break;
            }
            let chunk = r
                .read_chunk(b, max, &mut out, &mut sealed)
                .expect("read a chunk of a file that does not change");
            assert!(!chunk.states.is_empty());
            b += chunk.states.len() as u64;
            states.extend(chunk.states);
            plain.extend_from_slice(&out);
        }
        assert_eq!(plain.len() as u64, r.size());
    }
    let size = content.size();
    let bs = layout.block_size();
    let mut buf = vec![0u8; bs as usize];
    for b in 0..layout.block_count(size) {
        let n = layout.block_len(b, size) as usize;
        let got = content.read_at(layout.plain_offset(b), &mut buf[..n]);
        if blocks.is_none() {
            assert!(
                got.is_err(),
                "a header BlockReader refuses is refused by reads too"
            );
            continue;
        }
        let at = (b * bs) as usize;
        match (got, states[b as usize]) {
            (Ok(got), BlockState::Data | BlockState::Hole) => {
                assert_eq!(got, n);
                assert_eq!(&buf[..n], &plain[at..at + n], "block {b}");
            }
            (Err(_), BlockState::Failed) => {}
            (got, state) => panic!("block {b}: read {got:?} but the tools' reader says {state:?}"),
        }
    }
    // Runs of blocks opened in place in one buffer: the whole file, and the range of the
    // write below (before it is written).
    if blocks.is_some() {
        let span = |from: u64, to: u64| {
            let first = (from / bs) as usize;
            let last = to.div_ceil(bs) as usize;
            &states[first..last.max(first)]
        };
        let range = (off % (size + 1), len as u64 % (size + 1));
        for (from, n) in [(0, size), (range.0, range.1.min(size - range.0))] {
            let mut buf = vec![0u8; n as usize];
            let got = content.read_at(from, &mut buf);
            if n > 0 && span(from, from + n).contains(&BlockState::Failed) {
                assert!(got.is_err(), "a run with a failed block fails");
            } else {
                assert_eq!(got.expect("a run of good blocks reads"), n as usize);
                assert_eq!(buf, plain[from as usize..(from + n) as usize]);
            }
        }
    }
    // A write inside or just past the end, then the same range must read back.
    let off = off % (size + 2 * bs);
    let len = len % (2 * bs as usize + 1);
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
    // (An empty write succeeds without looking at the file; an empty read does not.)
    if !data.is_empty() && content.write_at(off, &data).is_ok() {
        let mut back = vec![0u8; len];
        let n = content
            .read_at(off, &mut back)
            .expect("read what was written");
        assert_eq!(n, len);
        assert_eq!(back, data);
    }
}

/// Names: `mode(1) || payload`. Mode 0: the payload is a backing name (short and long form,
/// and as a sidecar name); 1: a plaintext name to encrypt and decrypt; 2: the content of a
/// long-name sidecar file; 3: the content of a `cloakfs.dirid` file.
pub fn names(data: &[u8]) {
    let Some((&mode, payload)) = data.split_first() else {
        return;
    };
    let volume = fixture::volume(0);
    let codec = volume.names();
    match mode % 4 {
        0 => {
            let Ok(text) = std::str::from_utf8(payload) else {
                return;
            };
            let _ = names::classify(text);
            let _ = walk::sidecar_entry(text);
            let _ = codec.decrypt(&DIR_ID, text);
            if let Ok(plain) = codec.decrypt_short(&DIR_ID, text) {
                let again = codec
                    .encrypt(&DIR_ID, &plain)
                    .expect("a decrypted name encrypts");
                assert_eq!(
                    again,
                    StoredName::Short(text.into()),
                    "one stored form per name"
                );
            }
            let backing = names::long_backing_name(text);
            if let Ok(plain) = codec.decrypt_long(&DIR_ID, &backing, text) {
                let again = codec
                    .encrypt(&DIR_ID, &plain)
                    .expect("a decrypted name encrypts");
                assert_eq!(again.backing(), backing, "one stored form per name");
            }
        }
        1 => {
            if let Ok(stored) = codec.encrypt(&DIR_ID, payload) {
                let back = match (&stored, names::classify(stored.backing())) {
                    (StoredName::Short(s), EntryKind::Encrypted(_)) => {
                        codec.decrypt_short(&DIR_ID, s)
                    }
                    (StoredName::Long { backing, full }, EntryKind::Long(_)) => {
                        codec.decrypt_long(&DIR_ID, backing, full)
                    }
                    (s, k) => panic!("{s:?} is classified as {k:?}"),
                };
                assert_eq!(back.expect("own name decrypts"), payload);
            }
        }
        2 => with_scratch(|dir| {
            let name = long_name_entry(codec);
            std::fs::write(dir.join(names::sidecar_name(&name)), payload).expect("sidecar");
            let _ = walk::decrypt_name(&volume, &DIR_ID, dir, OsStr::new(&name));
            let _ = paths::decrypt_entry(&volume, &DIR_ID, dir, &name);
        }),
        _ => with_scratch(|dir| {
            let _ = paths::parse_dir_id(payload);
            let sub = dir.join("d");
            let _ = std::fs::create_dir(&sub);
            std::fs::write(sub.join(DIRID_FILE), payload).expect("dirid");
            let _ = walk::read_dir_id(&sub);
            let _ = paths::read_dir_id(&volume, dir, &sub);
        }),
    }
}

/// The backing entry of a long name in [`DIR_ID`].
fn long_name_entry(codec: &names::NameCodec) -> String {
    match codec.encrypt(&DIR_ID, &[b'n'; 200]).expect("a long name") {
        StoredName::Long { backing, .. } => backing,
        StoredName::Short(_) => unreachable!("200 bytes make a long name"),
    }
}

/// Symlink targets and xattrs: `mode(1) || payload`. Mode 0: a stored symlink target; 1: a
/// stored xattr name; 2: `name length(1) || stored xattr name || sealed value`. Each also goes
/// through encryption, which must decrypt back.
pub fn meta(data: &[u8]) {
    let Some((&mode, payload)) = data.split_first() else {
        return;
    };
    let volume = fixture::volume(0);
    let m = volume.meta();
    match mode % 3 {
        0 => {
            if let Ok(target) = m.decrypt_symlink(payload) {
                let stored = m
                    .encrypt_symlink(&target)
                    .expect("a decrypted target encrypts")
                    .backing_target();
                assert_eq!(m.decrypt_symlink(stored.as_bytes()).unwrap(), target);
            }
            // The payload as the content of a long target's file, under its own name.
            if let Ok(target) = m.open_long_target(&long_target_file_name(payload), payload) {
                let SealedTarget::Long { name, sealed } = m
                    .encrypt_symlink(&target)
                    .expect("a decrypted long target encrypts")
                else {
                    panic!("a long target is stored apart");
                };
                assert_eq!(m.open_long_target(&name, &sealed).unwrap(), target);
            }
            match m.encrypt_symlink(payload) {
                Ok(SealedTarget::Inline(stored)) => {
                    assert_eq!(m.decrypt_symlink(stored.as_bytes()).unwrap(), payload)
                }
                Ok(SealedTarget::Long { name, sealed }) => {
                    assert_eq!(m.open_long_target(&name, &sealed).unwrap(), payload)
                }
                Err(_) => {}
            }
        }
        1 => {
            if let Ok(name) = m.decrypt_xattr_name(payload) {
                let stored = m.encrypt_xattr_name(&name);
                match stored.expect("a decrypted xattr name encrypts") {
                    Some(stored) => assert_eq!(stored, payload, "one stored form per name"),
                    None => assert_eq!(name, payload, "other namespaces pass through"),
                }
            }
            if let Ok(Some(stored)) = m.encrypt_xattr_name(payload) {
                assert_eq!(m.decrypt_xattr_name(&stored).unwrap(), payload);
            }
        }
        _ => {
            let Some((&n, rest)) = payload.split_first() else {
                return;
            };
            let (name, sealed) = rest.split_at(usize::from(n).min(rest.len()));
            let _ = m.decrypt_xattr_value(name, sealed);
            if let Ok(stored) = m.encrypt_xattr_value(name, sealed) {
                assert_eq!(m.decrypt_xattr_value(name, &stored).unwrap(), sealed);
            }
        }
    }
}

/// A planted rekey journal next to the reference config: `cloakfs rekey --rollback` reads
/// and checks it. Only a journal whose new config is the config on disk (a rekey that had
/// finished) is accepted, and then removed; none of these opens with the volume's key, so no
/// rekey runs.
pub fn rekey_journal(data: &[u8]) {
    let reference = fixture::reference();
    let volume = fixture::reference_volume();
    with_scratch(|dir| {
        let cipherdir = dir.join("volume");
        if !cipherdir.exists() {
            std::fs::create_dir(&cipherdir).expect("scratch volume");
            reference.0.save(&cipherdir).expect("scratch config");
        }
        let journal = rekey::journal_path(&cipherdir);
        std::fs::write(&journal, data).expect("scratch journal");
        let rolled_back = rekey::rollback(&volume, &cipherdir, None, &walk::NoProgress);
        assert_eq!(rolled_back.is_ok(), !journal.exists());
        let on_disk = VolumeConfig::load(&cipherdir).expect("the config is left alone");
        assert_eq!(on_disk, reference.0);
    });
}

/// A share file: parse, re-encode, and combine with the reference shamir slot's shares.
pub fn share(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(share) = Share::parse(text) else {
        return;
    };
    let encoded = share.encode();
    let again = Share::parse(&encoded).expect("an encoded share parses");
    assert_eq!(again.encode(), encoded);
    let again = Share::parse(&share.file_text()).expect("a share file parses");
    assert_eq!(again.encode(), encoded);
    let reference = fixture::reference();
    let (c, shares) = (&reference.0, &reference.1);
    let slot = c
        .slots()
        .iter()
        .find(|s| s.kind() == kind::SHAMIR)
        .expect("a shamir slot");
    for others in [&shares[..0], &shares[..1], &shares[1..]] {
        let mut given = vec![share.clone()];
        given.extend_from_slice(others);
        if let Ok(Some(kek)) = shamir::kek(slot, &VOLUME_ID, &given) {
            let _ = slot.open(&VOLUME_ID, &kek);
        }
    }
}

/// A typed recovery key: parse, re-encode, and unwrap the reference recovery slot with it.
pub fn recovery_key(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(key) = RecoveryKey::parse(text) else {
        return;
    };
    let again = RecoveryKey::parse(&key.encode()).expect("an encoded key parses");
    assert_eq!(again.expose(), key.expose());
    let reference = fixture::reference();
    let slot = reference
        .0
        .slots()
        .iter()
        .find(|s| s.kind() == kind::RECOVERY)
        .expect("a recovery slot");
    let kek = recovery::kek(slot, &key).expect("the reference slot has a salt");
    let opened = slot.open(&VOLUME_ID, &kek);
    assert_eq!(opened.is_some(), key.expose() == &fixture::RECOVERY_KEY);
}

/// The daemon's control stream: `limit(1) || bytes`, framed into lines by the daemon's reader
/// (line limit picked by `limit`), each line parsed as a request (and as a response, what the
/// client parses); a parsed message must survive being sent again.
pub fn control(data: &[u8]) {
    let Some((&limit, stream)) = data.split_first() else {
        return;
    };
    let max = [1, 64, 4096, MAX_MESSAGE][usize::from(limit % 4)];
    let mut reader = LineReader::new(stream, max);
    // Every message takes at least its newline, but for the last: a bound on the loop.
    for _ in 0..=stream.len() + 1 {
        let msg = match reader.next_line().expect("reading a slice does not fail") {
            Line::Message(m) => m,
            Line::Eof | Line::TooLong => return,
        };
        assert!(msg.len() <= max, "a message longer than the limit");
        let Ok(text) = std::str::from_utf8(&msg) else {
            continue;
        };
        if let Ok(req) = serde_json::from_str::<Request>(text) {
            let sent = serde_json::to_string(&req).expect("a request serializes");
            serde_json::from_str::<Request>(&sent).expect("a sent request parses");
        }
        if let Ok(resp) = serde_json::from_str::<Response>(text) {
            let sent = serde_json::to_string(&resp).expect("a response serializes");
            serde_json::from_str::<Response>(&sent).expect("a sent response parses");
        }
    }
    panic!("the line reader does not make progress");
}
