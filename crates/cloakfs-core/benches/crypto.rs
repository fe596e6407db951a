//! Micro-benchmarks of the crypto core: `cargo bench -p cloakfs-core --bench crypto`.
//!
//! Groups (throughput is printed in decimal MB/s, names in elem/s = names/s):
//! - `file_cipher/<suite>/{seal,seal_fixed_nonce,open}_4k`: one 4 KiB block through
//!   [`FileCipher`], single-threaded (= per core). `seal` draws a fresh random nonce per block
//!   (what a write does), `seal_fixed_nonce` is the AEAD alone: the difference is the cost of
//!   the nonce.
//! - `file_cipher/<suite>/{seal,open}_1MiB`: a 1 MiB run of 4 KiB blocks through
//!   [`FileCipher`], single-threaded, as one write or read request seals or opens it (no I/O):
//!   `seal` draws the 256 nonces in one OS call ([`FileCipher::fresh_nonces`]).
//! - `content_file/<suite>/{write,read}_1MiB`: one 1 MiB [`ContentFile::write_at`] (whole
//!   blocks, no read-modify-write) or `read_into` on a file in /dev/shm (tmpfs), i.e. the cost of
//!   the largest FUSE request in the core minus the disk (on the calling thread: below
//!   [`PARALLEL_MIN_BLOCKS`]).
//! - `content_file/<suite>/{write,read}_4MiB_{1core,<N>cores}`: the same for one 4 MiB call,
//!   large enough to be spread over rayon's pool, with the pool limited to one thread and with
//!   the default pool (all cores).
//! - `names/{encrypt,decrypt}`: [`NameCodec`] on a 21-byte name, in names/s.
//! - `aes256gcm_impl/{rustcrypto,ring,aws-lc-rs}/{seal,open}_4k`: the raw AEAD on a 4 KiB block
//!   with a 24-byte AAD (the shape of a cloakfs block), to pick the implementation by measurement.
//!
//! The default run is short (2 s per benchmark, 10 samples). For steadier figures:
//! `cargo bench -p cloakfs-core --bench crypto -- --measurement-time 10 --sample-size 50`.
//! Filter with a substring, e.g. `cargo bench -p cloakfs-core --bench crypto -- aes256gcm_impl`.

use cloakfs_core::crypto::secret::SecretBytes;
use cloakfs_core::format::content::{ContentCodec, ContentSuite, FileId};
use cloakfs_core::format::names::{DirId, NameCodec, StoredName};
use cloakfs_core::io::file::{ContentFile, PARALLEL_MIN_BLOCKS};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

const BLOCK: usize = 4096;
const REQUEST: usize = 1 << 20;
/// A call of this size goes to rayon's pool (4 KiB blocks).
const LARGE_CALL: usize = 4 << 20;
const _: () = assert!((LARGE_CALL / BLOCK) as u64 >= PARALLEL_MIN_BLOCKS);
const KEY: [u8; 32] = [0x42; 32];
const AAD: [u8; 24] = [0x24; 24];
const NONCE12: [u8; 12] = [0x01; 12];

const SUITES: [(ContentSuite, &str); 3] = [
    (ContentSuite::Aes256Gcm, "aes-256-gcm"),
    (ContentSuite::XChaCha20Poly1305, "xchacha20-poly1305"),
    // Size-preserving, no integrity: no nonce, no tag (its `seal` and `seal_fixed_nonce` are
    // the same work).
    (ContentSuite::Aes256Xts, "aes-256-xts"),
];

fn codec(suite: ContentSuite) -> Arc<ContentCodec> {
    Arc::new(ContentCodec::new(
        suite,
        BLOCK as u64,
        false,
        SecretBytes::from_slice(&KEY),
    ))
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 131 + 7) as u8).collect()
}

/// Room for a sealed block, page-aligned.
#[repr(C, align(4096))]
struct PageAligned([u8; 2 * BLOCK]);

/// A page-aligned copy of `data`, so copies between such buffers run at the same offset
/// within a page. On AMD Zen, glibc's 4 KiB memcpy (`rep movsb`) runs at about 2 GB/s instead
/// of 40+ when the destination lies 1-31 bytes past the source modulo 4 KiB: unaligned,
/// the open benchmarks measured where the allocator happened to put their buffers.
fn page_aligned(data: &[u8]) -> Box<PageAligned> {
    let mut b = Box::new(PageAligned([0; 2 * BLOCK]));
    b.0[..data.len()].copy_from_slice(data);
    b
}

/// seal / open of one 4 KiB block with cloakfs's `FileCipher`.
fn file_cipher(c: &mut Criterion) {
    let mut g = c.benchmark_group("file_cipher");
    g.throughput(Throughput::BytesDecimal(BLOCK as u64));
    for (suite, name) in SUITES {
        let cipher = codec(suite).file_cipher(FileId([7; 16]));
        let plain = pattern(BLOCK);
        let sealed_len = BLOCK + suite.overhead() as usize;
        let mut sealed_page = page_aligned(&[]);
        let sealed = &mut sealed_page.0[..sealed_len];
        let nonce = vec![0x5a; suite.nonce_len()];

        g.bench_function(BenchmarkId::new(name, "seal_4k"), |b| {
            b.iter(|| cipher.seal(black_box(3), black_box(&plain), sealed))
        });
        g.bench_function(BenchmarkId::new(name, "seal_fixed_nonce_4k"), |b| {
            b.iter(|| cipher.seal_with_nonce(black_box(3), &nonce, black_box(&plain), sealed))
        });
        cipher.seal(3, &plain, sealed);
        let mut out_page = page_aligned(&[]);
        let out = &mut out_page.0[..BLOCK];
        cipher.open(3, sealed, out).expect("block opens");
        assert_eq!(out, &plain[..]);
        g.bench_function(BenchmarkId::new(name, "open_4k"), |b| {
            b.iter(|| {
                cipher
                    .open(black_box(3), black_box(sealed), out)
                    .expect("block opens")
            })
        });
    }
    g.finish();
}

/// seal / open of a 1 MiB run of 4 KiB blocks with `FileCipher`, single-threaded, the way one
/// write or read request does it (no I/O).
fn file_cipher_run(c: &mut Criterion) {
    let mut g = c.benchmark_group("file_cipher");
    g.throughput(Throughput::BytesDecimal(REQUEST as u64));
    let blocks = REQUEST / BLOCK;
    for (suite, name) in SUITES {
        let cipher = codec(suite).file_cipher(FileId([7; 16]));
        let plain = pattern(REQUEST);
        let cbs = BLOCK + suite.overhead() as usize;
        let mut sealed = vec![0u8; blocks * cbs];
        g.bench_function(BenchmarkId::new(name, "seal_1MiB"), |b| {
            b.iter(|| {
                let nonces = cipher.fresh_nonces(blocks);
                for (i, ((p, s), nonce)) in plain
                    .chunks(BLOCK)
                    .zip(sealed.chunks_mut(cbs))
                    .zip(nonces)
                    .enumerate()
                {
                    cipher.seal_fresh(black_box(i as u64), nonce, black_box(p), s);
                }
            })
        });
        for (i, (p, s)) in plain.chunks(BLOCK).zip(sealed.chunks_mut(cbs)).enumerate() {
            cipher.seal(i as u64, p, s);
        }
        let mut out = vec![0u8; REQUEST];
        let open_all = |out: &mut [u8]| {
            for (i, (s, o)) in sealed.chunks(cbs).zip(out.chunks_mut(BLOCK)).enumerate() {
                cipher
                    .open(black_box(i as u64), black_box(s), o)
                    .expect("block opens");
            }
        };
        open_all(&mut out);
        assert_eq!(out, plain);
        g.bench_function(BenchmarkId::new(name, "open_1MiB"), |b| {
            b.iter(|| open_all(&mut out))
        });
    }
    g.finish();
}

/// A fresh backing file on tmpfs (falls back to the temp dir where /dev/shm is missing).
fn shm_file() -> (std::fs::File, tempfile::NamedTempFile) {
    let t = tempfile::Builder::new()
        .prefix("cloakfs-bench.")
        .tempfile_in("/dev/shm")
        .or_else(|_| tempfile::NamedTempFile::new())
        .expect("temporary file");
    let f = t.reopen().expect("reopen temporary file");
    (f, t)
}

/// A `ContentFile` on tmpfs holding `len` bytes of `pattern`, checked by reading them back;
/// the temporary file goes when the second value is dropped.
fn written_file(
    suite: ContentSuite,
    len: usize,
) -> (ContentFile, tempfile::NamedTempFile, Vec<u8>) {
    let (f, keep) = shm_file();
    let file = ContentFile::open(codec(suite), f).expect("open backing file");
    let data = pattern(len);
    file.write_at(0, &data).expect("initial write");
    let mut back = vec![0u8; len];
    assert_eq!(file.read_at(0, &mut back).expect("read"), len);
    assert_eq!(back, data);
    (file, keep, data)
}

/// `write_at` / `read_at` through `ContentFile` on tmpfs: a request's size, and a call large
/// enough for rayon's pool.
fn content_file(c: &mut Criterion) {
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("rayon pool");
    let all = rayon::ThreadPoolBuilder::new().build().expect("rayon pool");
    let cores = all.current_num_threads();
    let mut g = c.benchmark_group("content_file");
    g.throughput(Throughput::BytesDecimal(REQUEST as u64));
    for (suite, name) in SUITES {
        let (file, _keep, data) = written_file(suite, REQUEST);
        let mut buf = Vec::new();
        g.bench_function(BenchmarkId::new(name, "write_1MiB"), |b| {
            b.iter(|| file.write_at(0, black_box(&data)).expect("write"))
        });
        g.bench_function(BenchmarkId::new(name, "read_1MiB"), |b| {
            b.iter(|| {
                file.read_into(0, REQUEST, black_box(&mut buf))
                    .expect("read")
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("content_file");
    g.throughput(Throughput::BytesDecimal(LARGE_CALL as u64));
    for (suite, name) in SUITES {
        let (file, _keep, data) = written_file(suite, LARGE_CALL);
        let mut buf = Vec::new();
        for (pool, threads) in [(&one, "1core".to_string()), (&all, format!("{cores}cores"))] {
            g.bench_function(
                BenchmarkId::new(name, format!("write_4MiB_{threads}")),
                |b| b.iter(|| pool.install(|| file.write_at(0, black_box(&data)).expect("write"))),
            );
            g.bench_function(
                BenchmarkId::new(name, format!("read_4MiB_{threads}")),
                |b| {
                    b.iter(|| {
                        pool.install(|| file.read_into(0, LARGE_CALL, black_box(&mut buf)))
                            .expect("read")
                    })
                },
            );
        }
    }
    g.finish();
}

/// Name encryption and decryption (AES-256-SIV + base64url), in names/s.
fn names(c: &mut Criterion) {
    let codec = NameCodec::new(SecretBytes::from_slice(&[0x33; 64]), 255);
    let dir = DirId([9; 16]);
    let name = b"report-2026-final.txt";
    let StoredName::Short(enc) = codec.encrypt(&dir, name).expect("encrypt") else {
        panic!("a 21-byte name is short")
    };
    let mut g = c.benchmark_group("names");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encrypt", |b| {
        b.iter(|| {
            codec
                .encrypt(black_box(&dir), black_box(name))
                .expect("encrypt")
        })
    });
    g.bench_function("decrypt", |b| {
        b.iter(|| {
            codec
                .decrypt(black_box(&dir), black_box(&enc))
                .expect("decrypt")
        })
    });
    g.finish();
}

/// Raw AES-256-GCM on a 4 KiB block, three implementations. Open includes copying the sealed
/// block into the work buffer (page-aligned, see [`page_aligned`]), for all three alike.
fn aes256gcm_impl(c: &mut Criterion) {
    let mut g = c.benchmark_group("aes256gcm_impl");
    g.throughput(Throughput::BytesDecimal(BLOCK as u64));
    let plain = pattern(BLOCK);
    let mut reference = plain.clone(); // ciphertext || tag, to cross-check the implementations

    // RustCrypto aes-gcm 0.10 (what cloakfs-core used first).
    {
        use aes_gcm::aead::{AeadInPlace, KeyInit};
        let key = aes_gcm::Aes256Gcm::new(&KEY.into());
        let mut buf = plain.clone();
        g.bench_function("rustcrypto/seal_4k", |b| {
            b.iter(|| {
                key.encrypt_in_place_detached(&NONCE12.into(), &AAD, black_box(&mut buf))
                    .expect("seal")
            })
        });
        let mut sealed = plain.clone();
        let tag = key
            .encrypt_in_place_detached(&NONCE12.into(), &AAD, &mut sealed)
            .expect("seal");
        reference.copy_from_slice(&sealed);
        reference.extend_from_slice(&tag);
        let sealed = page_aligned(&sealed);
        let mut work = page_aligned(&[]);
        let (sealed, work) = (&sealed.0[..BLOCK], &mut work.0[..BLOCK]);
        g.bench_function("rustcrypto/open_4k", |b| {
            b.iter(|| {
                work.copy_from_slice(black_box(sealed));
                key.decrypt_in_place_detached(&NONCE12.into(), &AAD, work, &tag)
                    .expect("open")
            })
        });
        assert_eq!(work, &plain[..]);
    }

    // ring 0.17 and aws-lc-rs (AWS-LC, BoringSSL-derived assembly) share one AEAD API.
    macro_rules! ring_api_aes_gcm {
        ($label:literal, $krate:ident) => {{
            use $krate::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
            let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &KEY).expect("key"));
            let mut buf = plain.clone();
            g.bench_function(concat!($label, "/seal_4k"), |b| {
                b.iter(|| {
                    key.seal_in_place_separate_tag(
                        Nonce::assume_unique_for_key(NONCE12),
                        Aad::from(AAD),
                        black_box(&mut buf),
                    )
                    .expect("seal")
                })
            });
            let mut sealed = plain.clone();
            let tag = key
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(NONCE12),
                    Aad::from(AAD),
                    &mut sealed,
                )
                .expect("seal");
            sealed.extend_from_slice(tag.as_ref());
            assert_eq!(sealed, reference, "same ciphertext and tag as RustCrypto");
            let len = sealed.len();
            let sealed = page_aligned(&sealed);
            let mut work = page_aligned(&[]);
            let (sealed, work) = (&sealed.0[..len], &mut work.0[..len]);
            g.bench_function(concat!($label, "/open_4k"), |b| {
                b.iter(|| {
                    work.copy_from_slice(black_box(sealed));
                    key.open_in_place(
                        Nonce::assume_unique_for_key(NONCE12),
                        Aad::from(AAD),
                        &mut *work,
                    )
                    .expect("open")
                    .len()
                })
            });
            assert_eq!(&work[..BLOCK], &plain[..]);
        }};
    }
    ring_api_aes_gcm!("ring", ring);
    ring_api_aes_gcm!("aws-lc-rs", aws_lc_rs);
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10)
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = file_cipher, file_cipher_run, content_file, names, aes256gcm_impl
}
criterion_main!(benches);
