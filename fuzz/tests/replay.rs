//! What CI runs of the fuzz targets: every seed, every corpus file and every regression
//! input of each target, then a bounded number of mutated seeds (proptest). A long
//! coverage-guided run is `scripts/fuzz.sh` (docs/FUZZING.md).

use cloakfs_fuzz::{Target, TARGETS};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::path::{Path, PathBuf};

/// Mutated seeds tried per target in CI.
const CASES: u32 = 300;

fn dir(kind: &str, target: &Target) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(kind)
        .join(target.name)
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .map(|e| e.expect("corpus entry").path())
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."))
        })
        .collect();
    v.sort();
    v
}

fn run_file(target: &Target, path: &Path) {
    let data = std::fs::read(path).expect("corpus file");
    let result = std::panic::catch_unwind(|| (target.run)(&data));
    assert!(
        result.is_ok(),
        "{} fails on {}",
        target.name,
        path.display()
    );
}

#[test]
fn seeds_corpus_and_regressions_replay() {
    for t in TARGETS {
        for seed in (t.seeds)() {
            (t.run)(&seed);
        }
        for kind in ["corpus", "regressions"] {
            for path in files(&dir(kind, t)) {
                run_file(t, &path);
            }
        }
    }
}

#[test]
fn every_target_has_its_directories_and_a_binary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = std::fs::read_to_string(root.join("../scripts/fuzz.sh")).expect("fuzz.sh");
    let listed = script
        .lines()
        .find_map(|l| l.strip_prefix("targets=("))
        .expect("fuzz.sh lists its targets");
    let listed: Vec<&str> = listed.trim_end_matches(')').split_whitespace().collect();
    let names: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
    assert_eq!(listed, names, "scripts/fuzz.sh knows every target");
    for t in TARGETS {
        assert!(!(t.seeds)().is_empty(), "{} has seeds", t.name);
        let bin = root.join("fuzz_targets").join(format!("{}.rs", t.name));
        assert!(bin.is_file(), "{} has a libFuzzer binary", t.name);
        assert!(
            dir("regressions", t).is_dir(),
            "{} has regressions/",
            t.name
        );
    }
}

/// One edit of a seed: where (a fraction of its length), what, and a byte.
fn edit() -> impl Strategy<Value = (u16, u8, u8)> {
    (any::<u16>(), 0u8..6, any::<u8>())
}

fn mutate(seed: &[u8], edits: &[(u16, u8, u8)], splice: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for &(at, op, byte) in edits {
        let i = usize::from(at) * (v.len() + 1) / 65536;
        match op {
            0 if i < v.len() => v[i] ^= 1 << (byte % 8),
            1 if i < v.len() => v[i] = byte,
            2 => v.insert(i, byte),
            3 if i < v.len() => {
                v.remove(i);
            }
            4 => v.truncate(i),
            _ => {
                let n = usize::from(byte) % (splice.len() + 1);
                v.splice(i..i, splice[..n].iter().copied());
            }
        }
    }
    v
}

#[test]
fn mutated_seeds() {
    for t in TARGETS {
        let seeds = (t.seeds)();
        let mut runner = TestRunner::new(Config {
            cases: CASES,
            failure_persistence: None,
            ..Config::default()
        });
        let strategy = (
            0..seeds.len(),
            0..seeds.len(),
            proptest::collection::vec(edit(), 1..8),
        );
        let result = runner.run(&strategy, |(s, other, edits)| {
            let input = mutate(&seeds[s], &edits, &seeds[other]);
            (t.run)(&input);
            Ok(())
        });
        if let Err(e) = result {
            panic!("target {}: {e}", t.name);
        }
    }
}
