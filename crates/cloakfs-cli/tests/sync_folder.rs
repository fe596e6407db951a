//! A volume in a folder that a sync client copies between two devices: two real Syncthing
//! instances on 127.0.0.1 (tests/common/syncthing.rs), each device mounting its copy.

mod common;

use common::syncthing::Pair;
use std::path::Path;

/// Names of the regular files in `dir` that read back as written by `content_of`.
fn readable(dir: &Path, content_of: impl Fn(&str) -> String) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| std::fs::read_to_string(dir.join(n)).ok() == Some(content_of(n)))
        .collect();
    names.sort();
    names
}

fn content(name: &str) -> String {
    format!("contents of {name}\n")
}

/// The same new directory made on both devices while they are apart, 8 files each side,
/// without cloakfs: Syncthing keeps all 16 files (the baseline the volume must match).
#[test]
fn plain_folder_keeps_both_sides_files() {
    let pair = Pair::start();
    pair.pause();
    for (dev, side) in [(&pair.a, "a"), (&pair.b, "b")] {
        let dir = dev.folder.join("docs");
        std::fs::create_dir(&dir).unwrap();
        for i in 0..8 {
            let n = format!("{side}{i}.txt");
            std::fs::write(dir.join(&n), content(&n)).unwrap();
        }
    }
    pair.resume();
    pair.sync();
    for dev in [&pair.a, &pair.b] {
        let got = readable(&dev.folder.join("docs"), content);
        assert_eq!(got.len(), 16, "{}: {got:?}", dev.name);
    }
    pair.stop();
}
