//! Tests of [`ContentFile`]: reads and writes against a reference, holes, truncation, failed
//! writes on a full disk, tampering, shared files. `flip_byte` serves other modules' tests.

use super::*;
use crate::crypto::secret::SecretBytes;
use crate::format::content::{ContentSuite, FileHeader, FileId};
use crate::format::layout::HEADER_LEN;
use proptest::prelude::*;
use std::os::unix::fs::FileExt;

fn codec(strict: bool) -> Arc<ContentCodec> {
    suite_codec(ContentSuite::Aes256Gcm, strict)
}

fn suite_codec(suite: ContentSuite, strict: bool) -> Arc<ContentCodec> {
    Arc::new(ContentCodec::new(
        suite,
        4096,
        strict,
        SecretBytes::from_slice(&[9; 32]),
    ))
}

fn new_file(strict: bool) -> (ContentFile, tempfile::NamedTempFile) {
    new_suite_file(ContentSuite::Aes256Gcm, strict)
}

fn new_suite_file(suite: ContentSuite, strict: bool) -> (ContentFile, tempfile::NamedTempFile) {
    let t = tempfile::NamedTempFile::new().unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.path())
        .unwrap();
    (ContentFile::open(suite_codec(suite, strict), f).unwrap(), t)
}

#[test]
fn xts_backing_files_have_the_plaintext_size_and_reopen() {
    let sizes = [
        1u64,
        15,
        16,
        17,
        4095,
        4096,
        4097,
        4111,
        4112,
        (1 << 20) + 5,
    ];
    for size in sizes {
        let (f, t) = new_suite_file(ContentSuite::Aes256Xts, false);
        let data: Vec<u8> = (0..size).map(|i| (i % 253) as u8 + 1).collect();
        f.write_at(0, &data).unwrap();
        assert_eq!(std::fs::metadata(t.path()).unwrap().len(), size);
        let backing = std::fs::read(t.path()).unwrap();
        assert_ne!(backing, data, "encrypted ({size})");
        let g = ContentFile::open(suite_codec(ContentSuite::Aes256Xts, false), clone(&t)).unwrap();
        assert_eq!(read_all(&g), data, "{size}");
        // The ID is in the xattr: without it the data cannot be read.
        rustix::fs::removexattr(t.path(), "user.cloakfs.id").unwrap();
        let h = ContentFile::open(suite_codec(ContentSuite::Aes256Xts, false), clone(&t)).unwrap();
        assert!(matches!(
            h.read_at(0, &mut [0u8; 4]),
            Err(Error::Tampered(_))
        ));
    }
}
fn read_all(f: &ContentFile) -> Vec<u8> {
    let mut v = vec![0u8; f.size() as usize + 10];
    let n = f.read_at(0, &mut v).unwrap();
    v.truncate(n);
    v
}

#[test]
fn basic_io_and_reopen() {
    let (f, t) = new_file(false);
    f.write_at(0, b"hello world").unwrap();
    f.write_at(6, b"there, world").unwrap();
    assert_eq!(read_all(&f), b"hello there, world");
    let g = ContentFile::open(codec(false), std::fs::File::open(t.path()).unwrap()).unwrap();
    assert_eq!(read_all(&g), b"hello there, world");
    assert_eq!(std::fs::metadata(t.path()).unwrap().len(), 18 + 18 + 28);
}

#[test]
fn calls_large_enough_for_the_pool_match_block_by_block_io() {
    // Unaligned at both ends, so the pool's share sits between two read-modify-writes.
    let bs = 4096usize;
    let off = 1000u64;
    let n = (PARALLEL_MIN_BLOCKS as usize + 3) * bs + 777;
    let data: Vec<u8> = (0..n).map(|i| (i * 7 % 253) as u8).collect();
    let (f, _t) = new_file(false);
    f.write_at(0, &vec![0xA5; 2 * bs]).unwrap();
    f.write_at(off, &data).unwrap();
    let (g, _u) = new_file(false);
    g.write_at(0, &vec![0xA5; 2 * bs]).unwrap();
    for (i, piece) in data.chunks(bs).enumerate() {
        g.write_at(off + (i * bs) as u64, piece).unwrap();
    }
    assert_eq!(read_all(&f), read_all(&g));
    let mut whole = vec![0u8; n];
    assert_eq!(f.read_at(off, &mut whole).unwrap(), n);
    assert_eq!(whole, data);
    assert_eq!(read_all(&f)[..off as usize], vec![0xA5; off as usize]);
}

#[test]
fn reads_large_enough_for_the_pool_open_holes_and_offsets() {
    let far = (PARALLEL_MIN_BLOCKS + 10) * 4096 + 5;
    for strict in [false, true] {
        let (f, _t) = new_file(strict);
        f.write_at(0, b"start").unwrap();
        f.write_at(far, b"end").unwrap();
        let all = read_all(&f);
        assert_eq!(all.len() as u64, far + 3);
        assert_eq!(&all[..5], b"start");
        assert!(all[5..far as usize].iter().all(|&b| b == 0));
        assert_eq!(&all[far as usize..], b"end");
        let mut buf = Vec::new();
        let got = f.read_into(3, far as usize, &mut buf).unwrap();
        assert_eq!(got.len() as u64, far);
        assert_eq!(&buf[got.clone()][..2], b"rt");
        assert_eq!(&buf[got][far as usize - 3..], b"end");
    }
}

#[test]
fn first_write_carries_a_fresh_header() {
    // A header-only file, and one whose bytes after the header make no block (a torn
    // first write): both get a new file ID and only the new data.
    for junk in [0usize, 5, 28] {
        let (f, t) = new_file(false);
        f.write_at(0, b"old").unwrap();
        f.truncate(0).unwrap();
        let planted = FileHeader {
            id: FileId([0x55; 16]),
        }
        .to_bytes();
        let raw = std::fs::OpenOptions::new()
            .write(true)
            .open(t.path())
            .unwrap();
        raw.write_all_at(&planted, 0).unwrap();
        raw.write_all_at(&vec![0xaa; junk], HEADER_LEN).unwrap();
        let f2 = ContentFile::open(codec(false), clone(&t)).unwrap();
        assert_eq!(f2.size(), 0, "junk {junk}");
        f2.write_at(0, b"new").unwrap();
        let bytes = std::fs::read(t.path()).unwrap();
        assert_eq!(bytes.len(), 18 + 3 + 28, "junk {junk}");
        assert_ne!(bytes[..18], planted[..], "junk {junk}");
        let g = ContentFile::open(codec(false), clone(&t)).unwrap();
        assert_eq!(read_all(&g), b"new");
        drop(f);
    }
}

#[test]
fn a_file_of_holes_gets_a_fresh_id_before_anything_is_sealed() {
    let planted = FileHeader {
        id: FileId([0x55; 16]),
    }
    .to_bytes();
    // Every way of sealing: a write, a truncate to inside a block, a truncate up.
    type Change = fn(&ContentFile);
    let changes: [(&str, Change); 3] = [
        ("write", |f| {
            f.write_at(5000, b"new").unwrap();
        }),
        ("shrink", |f| f.truncate(6000).unwrap()),
        ("grow", |f| f.truncate(3 * 4096 + 7).unwrap()),
    ];
    for (what, change) in changes {
        let (_, t) = new_file(false);
        let raw = std::fs::OpenOptions::new()
            .write(true)
            .open(t.path())
            .unwrap();
        raw.write_all_at(&planted, 0).unwrap();
        raw.set_len(HEADER_LEN + 2 * 4124).unwrap();
        let f = ContentFile::open(codec(false), clone(&t)).unwrap();
        assert_eq!(f.size(), 8192);
        change(&f);
        let bytes = std::fs::read(t.path()).unwrap();
        assert_ne!(bytes[..18], planted[..], "{what}");
        let g = ContentFile::open(codec(false), clone(&t)).unwrap();
        assert_eq!(g.file_id().unwrap(), f.file_id().unwrap(), "{what}");
        let back = read_all(&g);
        assert!(back.len() >= 6000, "{what}");
    }
    // On a strict volume an all-zero block is tampering, not a reason for a new ID.
    let (_, t) = new_file(true);
    let raw = std::fs::OpenOptions::new()
        .write(true)
        .open(t.path())
        .unwrap();
    raw.write_all_at(&planted, 0).unwrap();
    raw.set_len(HEADER_LEN + 4124).unwrap();
    let f = ContentFile::open(codec(true), clone(&t)).unwrap();
    assert!(matches!(f.write_at(4096, b"x"), Err(Error::Tampered(_))));
    assert_eq!(std::fs::read(t.path()).unwrap()[..18], planted[..]);
}

/// A 1 MiB tmpfs, unmounted on drop; `None` when not root (mount(2) needs it).
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn mount() -> Option<Self> {
        let d = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "cloakfs-test"])
            .arg(d.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Self(d))
    }

    /// Fills the disk but for about `room` bytes.
    fn fill(&self, room: u64) {
        let mut f = File::create(self.0.path().join("filler")).unwrap();
        while std::io::Write::write_all(&mut f, &[1u8; 16 * 1024]).is_ok() {}
        f.set_len(f.metadata().unwrap().len().saturating_sub(room))
            .unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_write_that_runs_out_of_space_leaves_the_plaintext_as_it_was() {
    let Some(disk) = SmallDisk::mount() else {
        eprintln!("skipped: cannot mount a tmpfs (needs root)");
        return;
    };
    let path = disk.0.path().join("f");
    let open = || open_on(&path, codec(false));
    let f = open();
    // 50 blocks and a partial one, then a hole of 40 blocks and a partial last block.
    let mut want: Vec<u8> = (0..205_000u32).map(|i| (i % 251) as u8).collect();
    f.write_at(0, &want).unwrap();
    want.resize(400_000, 0);
    f.write_at(399_999, &[0]).unwrap();
    disk.fill(64 * 1024);
    let no_space = |r: Result<usize>| match r {
        Err(Error::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}"),
        r => panic!("expected ENOSPC: {r:?}"),
    };
    // Into the hole (space is reserved first), past the end from the partial last block
    // (which is put back), and past the end after a gap (cut back).
    no_space(f.write_at(210_000, &[0xCD; 150_000]));
    no_space(f.write_at(400_000, &[0xCD; 300_000]));
    no_space(f.write_at(500_000, &[0xCD; 300_000]));
    // From inside the partial last block past the end, as a page-cache append writes.
    let bs = f.layout().block_size();
    no_space(f.write_at(399_999 / bs * bs + 1, &[0xCD; 300_000]));
    for g in [&f, &open()] {
        assert_eq!(g.size(), want.len() as u64);
        assert_eq!(read_all(g), want);
    }
}

/// An XTS write that fails after its short last block drew a new counter block puts the
/// old block back together with the header that holds the counter block it is sealed
/// under.
#[test]
fn an_xts_write_that_runs_out_of_space_puts_its_tail_header_back() {
    let Some(disk) = SmallDisk::mount() else {
        eprintln!("skipped: cannot mount a tmpfs (needs root)");
        return;
    };
    let path = disk.0.path().join("f");
    let open = || open_on(&path, suite_codec(ContentSuite::Aes256Xts, false));
    let f = open();
    let bs = f.layout().block_size();
    let want: Vec<u8> = (0..50 * bs + 5).map(|i| (i % 251) as u8 + 1).collect();
    f.write_at(0, &want).unwrap();
    let header = xts_header(&path);
    disk.fill(64 * 1024);
    // From inside the 5-byte last block to a new 10-byte one, 73 blocks on.
    match f.write_at(50 * bs + 1, &vec![0xCD; (73 * bs + 9) as usize]) {
        Err(Error::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}"),
        r => panic!("expected ENOSPC: {r:?}"),
    }
    assert_eq!(xts_header(&path), header);
    for g in [&f, &open()] {
        assert_eq!(g.size(), want.len() as u64);
        assert_eq!(read_all(g), want);
    }
}

/// The file at `path` (created if missing) opened for reading and writing under `codec`.
fn open_on(path: &std::path::Path, codec: Arc<ContentCodec>) -> ContentFile {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    ContentFile::open(codec, f).unwrap()
}

/// The value of an XTS backing file's header xattr.
fn xts_header(path: &std::path::Path) -> Vec<u8> {
    let mut v = [0u8; 64];
    let n = rustix::fs::getxattr(path, "user.cloakfs.id", &mut v).unwrap();
    v[..n].to_vec()
}

/// A file written before headers held a counter block (version 1: its short last block
/// is keyed by its position) still reads; the next short block written draws a counter
/// block and the header becomes version 2.
#[test]
fn an_xts_file_with_a_version_1_header_reads_and_moves_to_version_2() {
    let codec = suite_codec(ContentSuite::Aes256Xts, false);
    let (_, t) = new_suite_file(ContentSuite::Aes256Xts, false);
    let id = FileId([0x42; 16]);
    let cipher = codec.file_cipher(id);
    let plain: Vec<u8> = (0..4096 + 7).map(|i| (i % 249) as u8).collect();
    let mut sealed = vec![0u8; plain.len()];
    cipher.seal(0, &plain[..4096], &mut sealed[..4096]);
    cipher.seal(1, &plain[4096..], &mut sealed[4096..]);
    // The short block under the version-1 rule: AES-256-CTR from u128le(1).
    let mut again = sealed[4096..].to_vec();
    cipher.open(1, &sealed[4096..], &mut again).unwrap();
    assert_eq!(again, plain[4096..]);
    std::fs::write(t.path(), &sealed).unwrap();
    let v1 = FileHeader { id }.to_bytes();
    rustix::fs::setxattr(
        t.path(),
        "user.cloakfs.id",
        &v1,
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let f = ContentFile::open(codec.clone(), clone(&t)).unwrap();
    assert_eq!(read_all(&f), plain);
    f.write_at(4096 + 7, b"more").unwrap();
    let v2 = xts_header(t.path());
    assert_eq!(v2.len(), 34);
    assert_eq!(v2[..18], [&2u16.to_be_bytes()[..], &id.0].concat()[..]);
    let mut want = plain.clone();
    want.extend_from_slice(b"more");
    for g in [&f, &ContentFile::open(codec.clone(), clone(&t)).unwrap()] {
        assert_eq!(read_all(g), want);
    }
}

#[test]
fn a_truncate_that_cannot_grow_the_file_leaves_it_as_it_was() {
    let Some(disk) = SmallDisk::mount() else {
        eprintln!("skipped: cannot mount a tmpfs (needs root)");
        return;
    };
    let path = disk.0.path().join("f");
    let open = |strict| open_on(&path, codec(strict));
    // A strict volume writes sealed zeros: the partial last block is completed first,
    // then the disk fills up somewhere in the zeros.
    let f = open(true);
    f.write_at(0, b"kept").unwrap();
    disk.fill(64 * 1024);
    match f.truncate(4 << 20) {
        Err(Error::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}"),
        r => panic!("expected ENOSPC: {r:?}"),
    }
    for g in [&f, &open(true)] {
        assert_eq!(g.size(), 4);
        assert_eq!(read_all(g), b"kept");
    }
}

fn clone(t: &tempfile::NamedTempFile) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.path())
        .unwrap()
}

#[test]
fn holes_and_truncate() {
    for strict in [false, true] {
        let (f, t) = new_file(strict);
        f.write_at(10_000, b"x").unwrap();
        let all = read_all(&f);
        assert_eq!(all.len(), 10_001);
        assert!(all[..10_000].iter().all(|&b| b == 0));
        f.truncate(5000).unwrap();
        assert_eq!(read_all(&f), vec![0u8; 5000]);
        f.truncate(20_000).unwrap();
        assert_eq!(read_all(&f), vec![0u8; 20_000]);
        f.truncate(0).unwrap();
        assert_eq!(std::fs::metadata(t.path()).unwrap().len(), 0);
    }
}

/// Inverts one byte of a file (writing a fixed value would leave a byte that already
/// had it unchanged).
pub(crate) fn flip_byte(path: &std::path::Path, off: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, off).unwrap();
    f.write_all_at(&[!b[0]], off).unwrap();
}

#[test]
fn tamper_is_detected() {
    let (f, t) = new_file(false);
    f.write_at(0, &[7u8; 9000]).unwrap();
    flip_byte(t.path(), 18 + 4124 + 40);
    let mut buf = vec![0u8; 9000];
    assert!(f.read_at(0, &mut buf).is_err());
    assert_eq!(f.read_at(0, &mut buf[..4096]).unwrap(), 4096);
}

#[test]
fn an_append_opens_the_partial_last_block_it_keeps() {
    // The append reuses the bytes read to put the block back on failure: they are
    // authenticated all the same.
    let (f, t) = new_file(false);
    f.write_at(0, &[7u8; 9000]).unwrap();
    flip_byte(t.path(), 18 + 2 * 4124 + 40);
    assert!(matches!(
        f.write_at(9000, b"more"),
        Err(crate::Error::Tampered(_))
    ));
    // Untouched, it keeps the old bytes before the new ones.
    let (g, _t) = new_file(false);
    g.write_at(0, &[7u8; 9000]).unwrap();
    g.write_at(9000, b"more").unwrap();
    g.write_at(9004, &[8u8; 5000]).unwrap();
    let mut want = vec![7u8; 9000];
    want.extend_from_slice(b"more");
    want.extend_from_slice(&[8u8; 5000]);
    assert_eq!(read_all(&g), want);
}

#[test]
fn shared_appends_land_at_the_end_another_client_left() {
    // Two open descriptions of one file stand for two clients: each appends after the
    // other's last append, which its own cached size does not know of.
    let (a, t) = new_file(false);
    let a = a.with_sharing(Sharing::Shared);
    let b = ContentFile::open(codec(false), clone(&t))
        .unwrap()
        .with_sharing(Sharing::Shared);
    let mut want = Vec::new();
    for i in 0..12u8 {
        let f = if i % 2 == 0 { &a } else { &b };
        let record = vec![b'a' + i; 1000 + 700 * usize::from(i)];
        assert_eq!(f.append(&record).unwrap(), want.len() as u64, "append {i}");
        want.extend_from_slice(&record);
    }
    a.settle().unwrap();
    b.settle().unwrap();
    let c = ContentFile::open(codec(false), clone(&t)).unwrap();
    assert_eq!(read_all(&c), want);
}

#[test]
fn shared_a_header_on_the_store_is_never_written_again() {
    // A new file made with its header (as a shared-storage create makes it), then
    // written and emptied: the header stays what it was, whoever writes.
    let t = tempfile::NamedTempFile::new().unwrap();
    let header = new_file_header(&codec(false), &[]).unwrap().unwrap();
    std::fs::write(t.path(), &header).unwrap();
    for sharing in [Sharing::Shared, Sharing::Unlocked] {
        let a = ContentFile::open(codec(false), clone(&t))
            .unwrap()
            .with_sharing(sharing);
        let b = ContentFile::open(codec(false), clone(&t))
            .unwrap()
            .with_sharing(sharing);
        a.write_at(8192, &[1u8; 100]).unwrap();
        a.settle().unwrap();
        b.write_at(0, &[2u8; 100]).unwrap();
        b.truncate(0).unwrap();
        b.write_at(0, &[3u8; 5000]).unwrap();
        b.settle().unwrap();
        assert_eq!(
            std::fs::read(t.path()).unwrap()[..HEADER_LEN as usize],
            header
        );
        assert_eq!(read_all(&a), vec![3u8; 5000]);
        a.truncate(0).unwrap();
        a.settle().unwrap();
        assert_eq!(std::fs::read(t.path()).unwrap(), header, "{sharing:?}");
    }
    // Alone, an emptied file has no header, and a header-only file gets a fresh ID.
    let a = ContentFile::open(codec(false), clone(&t)).unwrap();
    a.write_at(0, b"x").unwrap();
    assert_ne!(
        std::fs::read(t.path()).unwrap()[..HEADER_LEN as usize],
        header
    );
    a.truncate(0).unwrap();
    assert_eq!(std::fs::metadata(t.path()).unwrap().len(), 0);
}

#[test]
fn a_block_left_holding_a_shorter_one_is_mended() {
    // What two clients writing a new file at once without locks can leave: one sealed
    // 5000 bytes (block 1 short, the file's last as it saw it), the other's write further
    // on lengthened the file meanwhile (zeros after the short block).
    let (f, t) = new_file(false);
    f.write_at(0, &[1u8; 5000]).unwrap();
    let layout = codec(false).layout();
    clone(&t).set_len(layout.cipher_size(3 * 4096)).unwrap();
    let alone = ContentFile::open(codec(false), clone(&t)).unwrap();
    let mut buf = vec![0u8; 3 * 4096];
    assert!(matches!(
        alone.read_at(0, &mut buf),
        Err(crate::Error::Tampered(_))
    ));
    // fsck's question, then a reader on a store without locks mends it.
    assert_eq!(alone.mend_blocks(&[1, 2], false).unwrap(), 1);
    let reader = ContentFile::open(codec(false), clone(&t))
        .unwrap()
        .with_sharing(Sharing::Unlocked);
    let mut want = vec![1u8; 5000];
    want.resize(3 * 4096, 0);
    assert_eq!(read_all(&reader), want);
    let again = ContentFile::open(codec(false), clone(&t)).unwrap();
    assert_eq!(read_all(&again), want);
    assert_eq!(again.mend_blocks(&[1], false).unwrap(), 0);
    // A block damaged otherwise is not mended.
    flip_byte(t.path(), layout.cipher_offset(1) + 100);
    assert_eq!(again.mend_blocks(&[1], true).unwrap(), 0);
}

#[test]
fn punch_hole_zeroes() {
    let (f, _t) = new_file(false);
    f.write_at(0, &[1u8; 20_000]).unwrap();
    f.punch_hole(100, 12_000).unwrap();
    let all = read_all(&f);
    assert_eq!(all.len(), 20_000);
    assert!(all[..100].iter().all(|&b| b == 1));
    assert!(all[100..12_100].iter().all(|&b| b == 0));
    assert!(all[12_100..].iter().all(|&b| b == 1));
}

#[derive(Debug, Clone)]
enum Op {
    Write(u64, Vec<u8>),
    Truncate(u64),
    Read(u64, usize),
}

/// Makes the write or truncate `change` to both `f` and its `reference` contents.
fn apply(f: &ContentFile, reference: &mut Vec<u8>, change: Op) {
    match change {
        Op::Write(o, d) => {
            f.write_at(o, &d).unwrap();
            let end = o as usize + d.len();
            if reference.len() < end {
                reference.resize(end, 0);
            }
            reference[o as usize..end].copy_from_slice(&d);
        }
        Op::Truncate(n) => {
            f.truncate(n).unwrap();
            reference.resize(n as usize, 0);
        }
        Op::Read(..) => unreachable!("a read changes nothing"),
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            0u64..40_000,
            proptest::collection::vec(any::<u8>(), 1..9000)
        )
            .prop_map(|(o, d)| Op::Write(o, d)),
        (0u64..40_000).prop_map(Op::Truncate),
        (0u64..45_000, 1usize..20_000).prop_map(|(o, l)| Op::Read(o, l)),
    ]
}

/// Writes and truncates around the short last blocks of an XTS file (1..15 bytes past a
/// block boundary).
fn tail_op() -> impl Strategy<Value = Op> {
    let near = prop_oneof![0u64..40, 4080u64..4130, 8180u64..8210];
    prop_oneof![
        (near.clone(), proptest::collection::vec(any::<u8>(), 1..40))
            .prop_map(|(o, d)| Op::Write(o, d)),
        near.prop_map(Op::Truncate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// No two different short last blocks are ever sealed under one counter block: after
    /// each operation, the counter block in the header and the backing tail are recorded,
    /// and a counter block seen again comes with the same tail at the same place. A fresh
    /// open reads what the file holds (header and blocks agree on disk).
    #[test]
    fn xts_short_blocks_never_share_a_counter_block(ops in proptest::collection::vec(tail_op(), 1..30)) {
        let (f, t) = new_suite_file(ContentSuite::Aes256Xts, false);
        let bs = f.layout().block_size();
        let mut seen: std::collections::HashMap<Vec<u8>, (u64, Vec<u8>)> = Default::default();
        let mut reference: Vec<u8> = Vec::new();
        for op in ops {
            match op {
                Op::Read(..) => unreachable!("not generated"),
                change => apply(&f, &mut reference, change),
            }
            let size = reference.len() as u64;
            if (1..16).contains(&(size % bs)) {
                let header = xts_header(t.path());
                prop_assert_eq!(header.len(), 34);
                let tail = std::fs::read(t.path()).unwrap()[(size / bs * bs) as usize..].to_vec();
                let at = (size / bs, tail);
                let before = seen.entry(header[18..].to_vec()).or_insert_with(|| at.clone());
                prop_assert_eq!(&*before, &at, "a counter block sealed two tails");
            }
            let g = ContentFile::open(suite_codec(ContentSuite::Aes256Xts, false), clone(&t)).unwrap();
            prop_assert_eq!(read_all(&g), reference.clone());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn matches_reference(ops in proptest::collection::vec(op(), 1..25), strict in any::<bool>(), xts in any::<bool>()) {
        let (f, t) = if xts {
            new_suite_file(ContentSuite::Aes256Xts, false)
        } else {
            new_file(strict)
        };
        let mut reference: Vec<u8> = Vec::new();
        for op in ops {
            match op {
                change @ (Op::Write(..) | Op::Truncate(_)) => apply(&f, &mut reference, change),
                Op::Read(o, l) => {
                    let mut buf = vec![0u8; l];
                    let n = f.read_at(o, &mut buf).unwrap();
                    let start = (o as usize).min(reference.len());
                    let end = (o as usize + l).min(reference.len());
                    prop_assert_eq!(&buf[..n], &reference[start..end]);
                }
            }
            prop_assert_eq!(f.size(), reference.len() as u64);
            if xts {
                prop_assert_eq!(std::fs::metadata(t.path()).unwrap().len(), f.size());
            }
        }
        prop_assert_eq!(read_all(&f), reference);
    }
}
