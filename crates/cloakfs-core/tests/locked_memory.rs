//! Keys and key schedules live in locked memory: checked on this process's own pages
//! (/proc/self/smaps), and by searching all of its memory for the keys themselves.

#[path = "support/memscan.rs"]
mod memscan;

use cloakfs_core::crypto::kdf::Argon2Params;
use cloakfs_core::crypto::keys::{label, MasterKey, INFO_PREFIX};
use cloakfs_core::crypto::locked::scrubbed;
use cloakfs_core::crypto::secret::{Passphrase, SecretBytes};
use cloakfs_core::format::config::VolumeParams;
use cloakfs_core::format::content::{ContentSuite, FileId};
use cloakfs_core::format::names::DirId;
use cloakfs_core::Volume;
use hkdf::Hkdf;
use sha2::Sha256;

/// Whether AES runs on AES-NI, whose key schedules begin with the key itself.
fn aes_ni() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("aes");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

fn page_of(addr: usize) -> usize {
    addr & !(rustix::param::page_size() - 1)
}

/// The finding of issue 21: munlock works per page, so dropping one key must not unlock
/// another key on the same page.
#[test]
fn dropping_one_of_two_keys_on_a_page_leaves_the_other_locked() {
    let mut keys: Vec<Option<SecretBytes<32>>> =
        (0..64).map(|_| Some(SecretBytes::random())).collect();
    let addr = |k: &Option<SecretBytes<32>>| k.as_ref().unwrap().expose().as_ptr() as usize;
    // Some two of 64 slots of 64 bytes share a page, whatever else the process holds.
    let (a, b) = (0..keys.len())
        .flat_map(|i| (i + 1..keys.len()).map(move |j| (i, j)))
        .find(|&(i, j)| page_of(addr(&keys[i])) == page_of(addr(&keys[j])))
        .expect("two keys on one page");
    let kept = addr(&keys[b]);
    let before = memscan::vma_of("self", kept).unwrap();
    assert!(before.locked() && before.dont_dump(), "{before:?}");
    keys[a] = None;
    let after = memscan::vma_of("self", kept).unwrap();
    assert!(after.locked(), "the other key lost its lock: {after:?}");
    assert!(after.dont_dump(), "{after:?}");
    assert!(after.locked_kb >= 4, "{after:?}");
    assert!(
        keys[b].as_ref().unwrap().expose() != &[0u8; 32],
        "the kept key was wiped"
    );
}

/// The keys of one unlocked volume, derived here (in locked memory, scrubbed) to search for.
struct Needles {
    names: Vec<String>,
    keys: Vec<SecretBytes<32>>,
}

impl Needles {
    fn add(&mut self, name: &str, key: &[u8; 32]) {
        self.names.push(name.to_string());
        self.keys.push(SecretBytes::from_slice(key));
    }

    fn refs(&self) -> Vec<&[u8; 32]> {
        self.keys.iter().map(|k| k.expose()).collect()
    }

    /// Hits outside the needles' own storage.
    fn find(&self) -> Vec<memscan::Hit> {
        let own: Vec<usize> = self
            .keys
            .iter()
            .map(|k| k.expose().as_ptr() as usize)
            .collect();
        memscan::find("self", &self.refs())
            .into_iter()
            .filter(|h| !own.contains(&h.addr))
            .collect()
    }

    fn name(&self, h: &memscan::Hit) -> &str {
        &self.names[h.needle]
    }
}

fn needles(volume: &Volume, file: FileId) -> Needles {
    let mk: &MasterKey = volume.master_key();
    let vid = volume.config().params.volume_id;
    let mut n = Needles {
        names: Vec::new(),
        keys: Vec::new(),
    };
    n.add("master key", mk.expose());
    let (_, kek) = volume.unlocked_slot().expect("unlocked through a slot");
    n.add("key-encryption key", kek.expose());
    for (what, l) in [("names", label::NAMES), ("xattr names", label::XATTR_NAMES)] {
        let k: SecretBytes<64> = mk.subkey(&vid, l);
        n.add(
            &format!("{what} CMAC key"),
            k.expose()[..32].try_into().unwrap(),
        );
        n.add(
            &format!("{what} CTR key"),
            k.expose()[32..].try_into().unwrap(),
        );
    }
    let content: SecretBytes<32> = mk.subkey(&vid, label::CONTENT);
    n.add("content key", content.expose());
    let metadata: SecretBytes<32> = mk.subkey(&vid, label::METADATA);
    n.add("metadata key", metadata.expose());
    let mac: SecretBytes<32> = mk.subkey(&vid, label::CONFIG_MAC);
    n.add("config MAC key", mac.expose());
    let mut file_key = SecretBytes::<32>::zero();
    scrubbed(|| {
        Hkdf::<Sha256>::new(None, content.expose())
            .expand_multi_info(
                &[INFO_PREFIX.as_bytes(), label::FILE.as_bytes(), &file.0],
                file_key.expose_mut(),
            )
            .unwrap()
    });
    n.add("file key", file_key.expose());
    let xts_key = |l: &str, key: &mut [u8]| {
        scrubbed(|| {
            Hkdf::<Sha256>::new(None, content.expose())
                .expand_multi_info(&[INFO_PREFIX.as_bytes(), l.as_bytes(), &file.0], key)
                .unwrap()
        })
    };
    let mut pair = SecretBytes::<64>::zero();
    xts_key(label::XTS_FILE, pair.expose_mut());
    n.add("xts data key", pair.expose()[..32].try_into().unwrap());
    n.add("xts tweak key", pair.expose()[32..].try_into().unwrap());
    let mut short = SecretBytes::<32>::zero();
    xts_key(label::XTS_SHORT, short.expose_mut());
    n.add("xts short-block key", short.expose());
    n
}

/// Uses every codec of `volume`, on another thread and then on this one, and returns the
/// cipher of one file, still alive. Operations come after the keys were built, so what they
/// leave on a stack is still there when the memory is searched.
fn exercise(volume: &Volume, file: FileId) -> cloakfs_core::format::content::FileCipher {
    let work = || {
        let cipher = volume.content().file_cipher(file);
        let over = volume.content().suite().overhead() as usize;
        let mut sealed = vec![0u8; 100 + over];
        cipher.seal(0, &[1u8; 100], &mut sealed);
        let mut plain = [0u8; 100];
        cipher.open(0, &sealed, &mut plain).unwrap();
        assert_eq!(plain, [1u8; 100]);
        // A short last block (AES-256-CTR in an XTS volume).
        let mut sealed = vec![0u8; 5 + over];
        cipher.seal(1, &[2u8; 5], &mut sealed);
        let mut plain = [0u8; 5];
        cipher.open(1, &sealed, &mut plain).unwrap();
        assert_eq!(plain, [2u8; 5]);
        let meta = volume.meta();
        let link = meta.encrypt_symlink(b"../target").unwrap().backing_target();
        assert_eq!(meta.decrypt_symlink(link.as_bytes()).unwrap(), b"../target");
        let xname = meta.encrypt_xattr_name(b"user.note").unwrap().unwrap();
        assert_eq!(meta.decrypt_xattr_name(&xname).unwrap(), b"user.note");
        let value = meta.encrypt_xattr_value(&xname, b"v").unwrap();
        assert_eq!(meta.decrypt_xattr_value(&xname, &value).unwrap(), b"v");
        let dir = DirId([7; 16]);
        let stored = volume.names().encrypt(&dir, b"a name").unwrap();
        assert_eq!(
            volume.names().decrypt(&dir, stored.backing()).unwrap(),
            b"a name"
        );
        cipher
    };
    std::thread::scope(|s| s.spawn(work).join().unwrap());
    work()
}

fn describe(n: &Needles, hits: &[memscan::Hit]) -> String {
    hits.iter()
        .map(|h| {
            format!(
                "{} at {:#x} in {:#x}-{:#x} {} {:?}",
                n.name(h),
                h.addr,
                h.vma.start,
                h.vma.end,
                h.vma.name,
                h.vma.flags
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_key_and_key_schedule_of_a_volume_is_on_locked_pages_and_gone_after_it() {
    for suite in [
        ContentSuite::Aes256Gcm,
        ContentSuite::XChaCha20Poly1305,
        ContentSuite::Aes256Xts,
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let pass = Passphrase::new(b"a passphrase".to_vec());
        let params = VolumeParams {
            content: suite,
            ..VolumeParams::new()
        };
        drop(Volume::create(tmp.path(), params, &pass, Argon2Params::LEAST).unwrap());
        let volume = Volume::unlock(tmp.path(), &pass).unwrap();
        let file = FileId([3; 16]);
        let n = needles(&volume, file);
        let cipher = exercise(&volume, file);

        let hits = n.find();
        let unlocked: Vec<_> = hits
            .into_iter()
            .filter(|h| !(h.vma.locked() && h.vma.dont_dump()))
            .collect();
        assert!(
            unlocked.is_empty(),
            "{suite:?}: keys outside locked memory:\n{}",
            describe(&n, &unlocked)
        );
        // The search finds what it looks for: keys kept as bytes, and (with AES-NI, whose
        // schedules begin with the key itself) the AES schedules.
        let found = |name: &str| n.find().iter().any(|h| n.name(h) == name);
        let mut expected = vec![
            "master key",
            "key-encryption key",
            "names CTR key",
            "xattr names CTR key",
        ];
        if aes_ni() {
            expected.extend(["names CMAC key", "xattr names CMAC key", "metadata key"]);
        }
        if suite == ContentSuite::XChaCha20Poly1305
            || (suite == ContentSuite::Aes256Gcm && aes_ni())
        {
            expected.push("file key");
        }
        if suite == ContentSuite::Aes256Xts {
            // Kept as bytes; the XTS pair lives only as AES schedules.
            expected.push("xts short-block key");
            if aes_ni() {
                expected.extend(["xts data key", "xts tweak key"]);
            }
        }
        for name in expected {
            assert!(found(name), "{suite:?}: {name} not found in memory at all");
        }

        drop(cipher);
        drop(volume);
        let left = n.find();
        assert!(
            left.is_empty(),
            "{suite:?}: copies left after the volume was dropped:\n{}",
            describe(&n, &left)
        );
    }
}
