//! The one source of randomness: the operating system CSPRNG (getrandom(2)).

/// Fills `buf` with random bytes. The OS RNG does not fail on Linux once seeded; if it ever
/// did, continuing with predictable keys would be worse than stopping.
pub fn fill(buf: &mut [u8]) {
    getrandom::getrandom(buf).expect("the operating system random number generator failed");
}

/// `N` random bytes.
pub fn array<const N: usize>() -> [u8; N] {
    let mut a = [0u8; N];
    fill(&mut a);
    a
}
