//! XTS-AES-256 (IEEE 1619-2018, NIST SP 800-38E) over RustCrypto's `aes`, which uses AES-NI
//! where the CPU has it.
//!
//! The mode is the standard one, data unit by data unit, with ciphertext stealing for a last
//! partial AES block. What this module adds over the `xts-mode` crate is only the batching: it
//! hands the block cipher 16 AES blocks per call, so AES-NI works on several at once,
//! where `xts-mode` encrypts one block per call and waits out each block's full latency (about
//! a tenth of the speed on a 4 KiB data unit, docs/PERFORMANCE.md). The tests check every
//! length against `xts-mode` and the IEEE 1619 vectors.

use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};
use aes::Aes256;
use zeroize::Zeroize;

/// AES blocks per call of the block cipher: a multiple of AES-NI's 8-block pipeline.
const BATCH: usize = 16;
/// The AES block.
const AES_BLOCK: usize = 16;

type Block = GenericArray<u8, aes::cipher::consts::U16>;

/// An XTS-AES-256 key: the data key's and the tweak key's schedules (wiped on drop by the
/// `aes` crate's zeroize feature).
pub struct Xts256 {
    data: Aes256,
    tweak: Aes256,
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Encrypt,
    Decrypt,
}

impl Xts256 {
    /// The key pair: `key` is the data key followed by the tweak key (IEEE 1619's Key1 || Key2).
    pub fn new(key: &[u8; 64]) -> Self {
        let (data, tweak) = key.split_at(32);
        Self {
            data: Aes256::new(GenericArray::from_slice(data)),
            tweak: Aes256::new(GenericArray::from_slice(tweak)),
        }
    }

    /// Encrypts data unit `unit` (its tweak value, as a 128-bit little-endian integer) in place.
    ///
    /// # Panics
    /// If `data` is shorter than one AES block (XTS is not defined there).
    pub fn encrypt(&self, unit: u128, data: &mut [u8]) {
        self.run(unit, data, Direction::Encrypt)
    }

    /// Decrypts data unit `unit` in place. Panics as [`Xts256::encrypt`].
    pub fn decrypt(&self, unit: u128, data: &mut [u8]) {
        self.run(unit, data, Direction::Decrypt)
    }

    fn run(&self, unit: u128, data: &mut [u8], dir: Direction) {
        assert!(
            data.len() >= AES_BLOCK,
            "an XTS data unit has a whole AES block"
        );
        let mut t = Block::from(unit.to_le_bytes());
        self.tweak.encrypt_block(&mut t);
        let mut tweak = u128::from_le_bytes(t.into());
        t.as_mut_slice().zeroize();

        let partial = data.len() % AES_BLOCK;
        // With stealing, the last whole block and the partial one are done together below.
        let bulk_len = data.len() - partial - if partial > 0 { AES_BLOCK } else { 0 };
        let (bulk, tail) = data.split_at_mut(bulk_len);
        for chunk in bulk.chunks_mut(BATCH * AES_BLOCK) {
            tweak = self.batch(chunk, tweak, dir);
        }
        if partial > 0 {
            // Ciphertext stealing (IEEE 1619 5.3.2, 5.4.2): the last whole block is processed
            // with the later tweak when decrypting, the earlier one when encrypting.
            let (first, second) = match dir {
                Direction::Encrypt => (tweak, double(tweak)),
                Direction::Decrypt => (double(tweak), tweak),
            };
            let (whole, part) = tail.split_at_mut(AES_BLOCK);
            let mut x = [0u8; AES_BLOCK];
            x.copy_from_slice(whole);
            self.batch(&mut x, first, dir);
            let mut y = x;
            y[..partial].copy_from_slice(part);
            part.copy_from_slice(&x[..partial]);
            self.batch(&mut y, second, dir);
            whole.copy_from_slice(&y);
            x.zeroize();
            y.zeroize();
        }
        tweak.zeroize();
    }

    /// Processes up to [`BATCH`] whole blocks (XOR, AES, XOR) whose first tweak is `tweak`;
    /// returns the tweak of the block after them.
    fn batch(&self, chunk: &mut [u8], mut tweak: u128, dir: Direction) -> u128 {
        let mut tweaks = [0u128; BATCH];
        let mut blocks = [Block::default(); BATCH];
        let n = chunk.len() / AES_BLOCK;
        for (i, b) in chunk.chunks_exact(AES_BLOCK).enumerate() {
            tweaks[i] = tweak;
            blocks[i] = Block::from((le(b) ^ tweak).to_le_bytes());
            tweak = double(tweak);
        }
        match dir {
            Direction::Encrypt => self.data.encrypt_blocks(&mut blocks[..n]),
            Direction::Decrypt => self.data.decrypt_blocks(&mut blocks[..n]),
        }
        for (i, b) in chunk.chunks_exact_mut(AES_BLOCK).enumerate() {
            b.copy_from_slice(&(le(&blocks[i]) ^ tweaks[i]).to_le_bytes());
        }
        tweaks.zeroize();
        blocks.iter_mut().for_each(|b| b.as_mut_slice().zeroize());
        tweak
    }
}

/// A 16-byte slice as a little-endian integer (XTS's byte order for tweaks).
fn le(b: &[u8]) -> u128 {
    u128::from_le_bytes(b.try_into().expect("one AES block"))
}

/// Multiplication by the primitive element x in GF(2^128) mod x^128 + x^7 + x^2 + x + 1, in
/// XTS's little-endian convention; branch-free.
fn double(t: u128) -> u128 {
    (t << 1) ^ ((t >> 127) * 0x87)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(key: &[u8; 64]) -> xts_mode::Xts128<Aes256> {
        xts_mode::Xts128::new(
            Aes256::new_from_slice(&key[..32]).unwrap(),
            Aes256::new_from_slice(&key[32..]).unwrap(),
        )
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// IEEE 1619-2018 Annex B, XTS-AES-256 vector 10 (data unit 0xff, 512 bytes 00..ff twice):
    /// the opening and end of its ciphertext.
    #[test]
    fn ieee_1619_vector_10() {
        let mut key = [0u8; 64];
        key[..32].copy_from_slice(&hex(
            "2718281828459045235360287471352662497757247093699959574966967627",
        ));
        key[32..].copy_from_slice(&hex(
            "3141592653589793238462643383279502884197169399375105820974944592",
        ));
        let plain: Vec<u8> = (0..512).map(|i| i as u8).collect();
        let mut data = plain.clone();
        let xts = Xts256::new(&key);
        xts.encrypt(0xff, &mut data);
        assert_eq!(
            data[..32],
            hex("1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b")[..]
        );
        assert_eq!(
            data[480..],
            hex("773dad38014bd2092fa755c824bb5e54c4f36ffda9fcea70b9c6e693e148c151")[..]
        );
        xts.decrypt(0xff, &mut data);
        assert_eq!(data, plain);
    }

    // IEEE 1619's stealing vectors are XTS-AES-128 only: stealing is checked against
    // `xts-mode` at every length instead.
    proptest! {
        #[test]
        fn matches_xts_mode_at_every_length(
            key in prop::array::uniform32(any::<u8>()),
            key2 in prop::array::uniform32(any::<u8>()),
            unit in any::<u64>(),
            plain in prop::collection::vec(any::<u8>(), 16..1200),
        ) {
            let mut k = [0u8; 64];
            k[..32].copy_from_slice(&key);
            k[32..].copy_from_slice(&key2);
            let ours = Xts256::new(&k);
            let theirs = reference(&k);
            let tweak = xts_mode::get_tweak_default(unit.into());
            let mut a = plain.clone();
            let mut b = plain.clone();
            ours.encrypt(unit.into(), &mut a);
            theirs.encrypt_sector(&mut b, tweak);
            prop_assert_eq!(&a, &b);
            ours.decrypt(unit.into(), &mut a);
            prop_assert_eq!(&a, &plain);
        }
    }

    #[test]
    fn a_4k_unit_and_units_around_the_batch_size_match_xts_mode() {
        let key: [u8; 64] = std::array::from_fn(|i| (i as u8).wrapping_mul(7).wrapping_add(1));
        for len in [16, 17, 255, 256, 257, 271, 272, 273, 4095, 4096, 4097, 8191] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let mut a = plain.clone();
            let mut b = plain.clone();
            Xts256::new(&key).encrypt(u64::MAX.into(), &mut a);
            reference(&key).encrypt_sector(&mut b, xts_mode::get_tweak_default(u64::MAX.into()));
            assert_eq!(a, b, "length {len}");
            Xts256::new(&key).decrypt(u64::MAX.into(), &mut a);
            assert_eq!(a, plain, "length {len}");
        }
    }
}
