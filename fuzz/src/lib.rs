//! Fuzz targets for every parser of untrusted bytes in cloakfs (issue 21, section 3).
//!
//! Each target in [`TARGETS`] is a plain function of a byte slice, used three ways:
//! - by a libFuzzer binary (`fuzz_targets/`, built by `scripts/fuzz.sh` on stable Rust with
//!   LLVM's SanitizerCoverage passes) for long coverage-guided runs;
//! - by `cargo test` (`tests/replay.rs`), which replays the seeds, the corpus and every
//!   regression input, then a bounded number of mutated seeds: what CI runs;
//! - by hand, to reproduce one input.
//!
//! See docs/FUZZING.md.

pub mod fixture;
pub mod records;
pub mod seeds;
pub mod targets;

/// A fuzz target: its name (the directories `corpus/<name>` and `regressions/<name>`), the
/// function, and its seeds.
pub struct Target {
    /// Name of the target (and of its binary, `fuzz_<name>`).
    pub name: &'static str,
    /// Runs one input.
    pub run: fn(&[u8]),
    /// Valid inputs made with the real writers.
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "config",
        run: targets::config,
        seeds: seeds::config,
    },
    Target {
        name: "slots",
        run: targets::slots,
        seeds: seeds::slots,
    },
    Target {
        name: "file",
        run: targets::file,
        seeds: seeds::file,
    },
    Target {
        name: "names",
        run: targets::names,
        seeds: seeds::names,
    },
    Target {
        name: "meta",
        run: targets::meta,
        seeds: seeds::meta,
    },
    Target {
        name: "rekey_journal",
        run: targets::rekey_journal,
        seeds: seeds::rekey_journal,
    },
    Target {
        name: "share",
        run: targets::share,
        seeds: seeds::share,
    },
    Target {
        name: "recovery_key",
        run: targets::recovery_key,
        seeds: seeds::recovery_key,
    },
    Target {
        name: "control",
        run: targets::control,
        seeds: seeds::control,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}
