//! Per-file keys of a sharing volume (FORMAT.md section 18): the recipient list is
//! authenticated (a forged or moved entry is refused, never opened to garbage), an opened file
//! key is kept (one public-key operation per file), and what a shared file costs against a
//! normal one, in public-key operations, header bytes and CPU time (printed, not asserted).

use age::secrecy::ExposeSecret;
use cloakfs_core::crypto::kdf::Argon2Params;
use cloakfs_core::crypto::secret::Passphrase;
use cloakfs_core::format::config::VolumeParams;
use cloakfs_core::format::filekey::{grant, FileKeySource, Member, SharedHeader};
use cloakfs_core::io::file::ContentFile;
use cloakfs_core::slots::recipient::Identities;
use cloakfs_core::tools::writer::Writer;
use cloakfs_core::{Error, Volume};
use std::os::unix::fs::FileExt;
use std::path::Path;

struct Person {
    id: age::x25519::Identity,
}

impl Person {
    fn new() -> Self {
        Self {
            id: age::x25519::Identity::generate(),
        }
    }
    fn public(&self) -> String {
        self.id.to_public().to_string()
    }
    fn member(&self) -> Member {
        let mut ids = Identities::new();
        ids.add_file(
            self.id.to_string().expose_secret().as_bytes(),
            "id",
            age::NoCallbacks,
        )
        .unwrap();
        Member::new(ids, self.public()).unwrap()
    }
}

fn volume(dir: &Path, sharing: bool) -> Volume {
    let pass = Passphrase::new(b"pw".to_vec());
    let mut params = VolumeParams::new();
    if sharing {
        params.make_sharing();
    }
    drop(Volume::create(dir, params, &pass, Argon2Params::LEAST).unwrap());
    Volume::unlock(dir, &pass).unwrap()
}

fn open_as(dir: &Path, who: &Person) -> Volume {
    Volume::unlock(dir, &Passphrase::new(b"pw".to_vec()))
        .unwrap()
        .join_as(who.member())
        .unwrap()
}

fn read_all(v: &Volume, backing: &Path) -> Result<Vec<u8>, Error> {
    let cf = ContentFile::open(v.content().clone(), std::fs::File::open(backing)?)?;
    let mut out = vec![0u8; cf.size() as usize];
    cf.read_at(0, &mut out)?;
    Ok(out)
}

fn header(backing: &Path) -> SharedHeader {
    let b = std::fs::read(backing).unwrap();
    SharedHeader::parse(&b[..4096]).unwrap()
}

fn put_header(backing: &Path, h: &SharedHeader) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(backing)
        .unwrap();
    f.write_all_at(&h.to_bytes().unwrap(), 0).unwrap();
}

/// Adds to `backing`'s list an entry for `who` under a file key of their own choosing (they
/// do not hold the real one).
fn add_forged_entry(backing: &Path, who: &Person) {
    let mut forged = header(backing);
    let id = forged.id;
    forged
        .grants
        .push(grant(&who.public(), &id, &[9u8; 32]).unwrap());
    put_header(backing, &forged);
}

#[test]
fn a_header_changed_after_an_open_is_checked_again() {
    let tmp = tempfile::tempdir().unwrap();
    let (alice, bob) = (Person::new(), Person::new());
    drop(volume(tmp.path(), true));
    let va = open_as(tmp.path(), &alice);
    let w = Writer::new(&va, tmp.path());
    let b = w.write_file(Path::new("b"), b"file b").unwrap();
    let original = std::fs::read(&b).unwrap()[..4096].to_vec();
    // Opened twice by one reader: the second open finds the same header bytes, verified.
    assert_eq!(read_all(&va, &b).unwrap(), b"file b");
    assert_eq!(read_all(&va, &b).unwrap(), b"file b");
    // Bob adds himself with a key of his own choosing: the same reader refuses the change.
    add_forged_entry(&b, &bob);
    let err = read_all(&va, &b).unwrap_err();
    assert!(matches!(err, Error::Tampered(_)), "{err}");
    // The original header with one byte of its padding set: not the bytes verified either.
    let mut padded = original.clone();
    padded[4095] = 1;
    let f = std::fs::OpenOptions::new().write(true).open(&b).unwrap();
    f.write_all_at(&padded, 0).unwrap();
    let err = read_all(&va, &b).unwrap_err();
    assert!(matches!(err, Error::Tampered(_)), "{err}");
    // Put back, it opens again.
    f.write_all_at(&original, 0).unwrap();
    assert_eq!(read_all(&va, &b).unwrap(), b"file b");
}

#[test]
fn a_forged_or_moved_entry_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (alice, bob, carol) = (Person::new(), Person::new(), Person::new());
    drop(volume(tmp.path(), true));
    let va = open_as(tmp.path(), &alice);
    let w = Writer::new(&va, tmp.path());
    let a = w.write_file(Path::new("a"), b"file a").unwrap();
    let b = w.write_file(Path::new("b"), b"file b").unwrap();
    cloakfs_core::tools::share::add(&va, &a, &carol.public()).unwrap();
    assert_eq!(
        read_all(&open_as(tmp.path(), &carol), &a).unwrap(),
        b"file a"
    );

    // Bob holds the volume key (he is a member) but not b's file key: he adds himself to b
    // with a key of his own choosing. Alice's (authentic) entry then fails the list MAC.
    add_forged_entry(&b, &bob);
    let err = read_all(&open_as(tmp.path(), &alice), &b).unwrap_err();
    assert!(matches!(err, Error::Tampered(_)), "{err}");
    // And his entry opens nothing either: the list MAC under his key fails too.
    let err = read_all(&open_as(tmp.path(), &bob), &b).unwrap_err();
    assert!(matches!(err, Error::Tampered(_)), "{err}");

    // Carol's entry of a, moved into b (whose list is otherwise b's own): refused for carol,
    // not opened under a's key.
    let b2 = w.write_file(Path::new("b2"), b"file b2").unwrap();
    let mut moved = header(&b2);
    moved.grants.push(header(&a).grants[1].clone());
    put_header(&b2, &moved);
    let err = read_all(&open_as(tmp.path(), &carol), &b2).unwrap_err();
    assert!(matches!(err, Error::Tampered(_)), "{err}");
    // A removed entry (the list cut short) is refused the same way.
    let mut cut = header(&a);
    cut.grants.truncate(1);
    put_header(&a, &cut);
    let err = read_all(&open_as(tmp.path(), &alice), &a).unwrap_err();
    assert!(matches!(err, Error::Tampered(_)), "{err}");

    // A member without an entry: AccessDenied (EACCES), not an authentication failure.
    let c = w.write_file(Path::new("c"), b"file c").unwrap();
    let err = read_all(&open_as(tmp.path(), &bob), &c).unwrap_err();
    assert!(matches!(err, Error::AccessDenied(_)), "{err}");
    assert_eq!(err.errno(), libc::EACCES);
}

#[test]
fn a_file_key_is_unwrapped_once_per_volume() {
    let tmp = tempfile::tempdir().unwrap();
    let alice = Person::new();
    drop(volume(tmp.path(), true));
    let va = open_as(tmp.path(), &alice);
    let w = Writer::new(&va, tmp.path());
    let f = w.write_file(Path::new("f"), b"x").unwrap();
    let vb = open_as(tmp.path(), &alice);
    for _ in 0..10 {
        assert_eq!(read_all(&vb, &f).unwrap(), b"x");
    }
    let FileKeySource::Wrapped(keys) = vb.content().key_source() else {
        panic!("not wrapped")
    };
    assert_eq!(keys.unwrap_count(), 1);
    // The writer's own volume made the key: it never unwrapped it.
    let FileKeySource::Wrapped(keys) = va.content().key_source() else {
        panic!("not wrapped")
    };
    assert_eq!(keys.unwrap_count(), 0);
}

fn thread_cpu() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The cost of a shared file against a normal one, measured side by side: CPU time of
/// creating and of first reading N small files, public-key operations and header bytes. Only
/// the counts are asserted; the times are printed for docs/PERFORMANCE.md.
#[test]
fn cost_of_a_shared_file_against_a_normal_one() {
    const N: usize = 200;
    let data = vec![7u8; 4096];
    let (alice, bob, carol) = (Person::new(), Person::new(), Person::new());
    let mut rows = Vec::new();
    for sharing in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let v = volume(tmp.path(), sharing);
        let v = if sharing {
            v.join_as(alice.member()).unwrap()
        } else {
            v
        };
        let w = Writer::new(&v, tmp.path());
        let t0 = thread_cpu();
        let mut files = Vec::new();
        for i in 0..N {
            let f = w.write_file(Path::new(&format!("f{i}")), &data).unwrap();
            if sharing {
                cloakfs_core::tools::share::add(
                    &v,
                    &f,
                    &format!("{}\n{}", bob.public(), carol.public()),
                )
                .unwrap();
            }
            files.push(f);
        }
        let create = thread_cpu() - t0;
        let reader = if sharing {
            open_as(tmp.path(), &bob)
        } else {
            Volume::unlock(tmp.path(), &Passphrase::new(b"pw".to_vec())).unwrap()
        };
        let t1 = thread_cpu();
        for f in &files {
            assert_eq!(read_all(&reader, f).unwrap(), data);
        }
        let first_read = thread_cpu() - t1;
        let t2 = thread_cpu();
        for f in &files {
            assert_eq!(read_all(&reader, f).unwrap(), data);
        }
        let again = thread_cpu() - t2;
        let size = std::fs::metadata(&files[0]).unwrap().len();
        if let FileKeySource::Wrapped(k) = reader.content().key_source() {
            // Every file's entry for bob carries alice's volume's one recipient key for him.
            assert_eq!(
                k.unwrap_count(),
                1,
                "one unwrap per recipient key, then cached"
            );
            assert_eq!(size, 4096 + 4096 + 28);
            assert_eq!(header(&files[0]).grants.len(), 3);
        } else {
            assert_eq!(size, 18 + 4096 + 28);
        }
        rows.push((sharing, create, first_read, again, size));
    }
    for (sharing, create, first, again, size) in &rows {
        eprintln!(
            "{}: create+grant {:?}/file, first read {:?}/file, later reads {:?}/file, backing {} bytes",
            if *sharing { "shared, 3 recipients" } else { "normal" },
            *create / N as u32,
            *first / N as u32,
            *again / N as u32,
            size
        );
    }
}

/// The multi-user daemon builds a member from identity texts, where nobody can type a
/// passphrase: an age identity works, a passphrase-protected ssh key is refused in one line.
#[test]
fn a_member_from_texts_refuses_a_key_needing_a_passphrase() {
    let alice = Person::new();
    let text = alice.id.to_string().expose_secret().to_string();
    let m = Member::from_texts(&[("alice.key".into(), text.as_bytes())], alice.public()).unwrap();
    assert_eq!(m.recipient(), alice.public());

    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("enc_ed25519");
    let st = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "secret-words", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(st.success());
    let raw = std::fs::read(&key).unwrap();
    let public = std::fs::read_to_string(dir.path().join("enc_ed25519.pub")).unwrap();
    let err = Member::from_texts(&[("enc_ed25519".into(), &raw[..])], public).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("passphrase-protected ssh key"), "{msg}");
    assert!(msg.contains("enc_ed25519") && !msg.contains('\n'), "{msg}");
}
