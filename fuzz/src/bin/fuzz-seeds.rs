//! Writes the seeds of a fuzz target into a directory (the start of a libFuzzer corpus):
//! `fuzz-seeds TARGET DIR`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name, dir] = &args[..] else {
        eprintln!("usage: fuzz-seeds TARGET DIR");
        return ExitCode::from(2);
    };
    let Some(target) = cloakfs_fuzz::target(name) else {
        let names: Vec<&str> = cloakfs_fuzz::TARGETS.iter().map(|t| t.name).collect();
        eprintln!(
            "fuzz-seeds: no target {name:?} (targets: {})",
            names.join(", ")
        );
        return ExitCode::from(2);
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("fuzz-seeds: {dir}: {e}");
        return ExitCode::FAILURE;
    }
    for (i, seed) in (target.seeds)().iter().enumerate() {
        let path = std::path::Path::new(dir).join(format!("seed-{i:03}"));
        if let Err(e) = std::fs::write(&path, seed) {
            eprintln!("fuzz-seeds: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
