//! The usual conveniences: `--version`, man pages and shell completions generated from the
//! command-line definition, and the weak-passphrase warning at the prompt.

mod common;

use common::{bin, Fixture, CHEAP_KDF};
use std::process::{Command, Output, Stdio};

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn version_names_the_format_versions_it_reads() {
    let o = bin().arg("--version").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v = stdout(&o);
    assert!(
        v.starts_with(concat!("cloakfs ", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    for part in [
        "volume format 1",
        "config layout 1",
        "file header 1",
        "key share 1",
        "rekey journal 1",
    ] {
        assert!(v.contains(part), "{part} missing from {v}");
    }
}

/// The visible commands, as `cloakfs --help` lists them.
fn commands() -> Vec<String> {
    let o = bin().arg("--help").output().unwrap();
    let help = stdout(&o);
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn man_pages_one_per_command_render_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let o = bin().arg("man-pages").arg(dir.path()).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let cmds = commands();
    assert!(
        cmds.len() > 20 && cmds.iter().any(|c| c == "setup-private"),
        "{cmds:?}"
    );
    let mut pages = vec!["cloakfs.1".to_string(), "cloakfs-slots-add.1".into()];
    pages.extend(cmds.iter().map(|c| format!("cloakfs-{c}.1")));
    for page in &pages {
        let path = dir.path().join(page);
        assert!(path.exists(), "{page} missing");
        // groff with every warning on but line breaking (long synopses): a malformed page
        // fails here.
        let r = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-Wbreak", "-z"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            r.status.success() && r.stderr.is_empty(),
            "{page}: {}",
            stderr(&r)
        );
    }
    let top = std::fs::read_to_string(dir.path().join("cloakfs.1")).unwrap();
    for s in ["EXIT STATUS", "FILES", "known_volumes.json", "130"] {
        assert!(top.contains(s), "cloakfs.1 lacks {s}");
    }
    let mount = std::fs::read_to_string(dir.path().join("cloakfs-mount.1")).unwrap();
    assert!(mount.contains("fstab") && mount.contains("bind"), "{mount}");
    // `cloakfs --help` lists every command, the generator of these pages too.
    assert!(cmds.iter().any(|c| c == "man-pages"), "{cmds:?}");
}

#[test]
fn man_pages_into_an_unwritable_place_is_one_line_and_exit_5() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let o = bin()
        .arg("man-pages")
        .arg(file.join("man"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(stderr(&o).starts_with("cloakfs: writing man pages to "));
}

#[test]
fn completions_for_bash_zsh_and_fish_know_every_command() {
    let cmds = commands();
    for shell in ["bash", "zsh", "fish"] {
        let o = bin().args(["completions", shell]).output().unwrap();
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        for c in &cmds {
            assert!(script.contains(c.as_str()), "{shell} completion lacks {c}");
        }
    }
    // Each script is valid in its shell.
    let o = bin().args(["completions", "bash"]).output().unwrap();
    let check = Command::new("bash")
        .args(["-n", "-c", &stdout(&o)])
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", stderr(&check));
}

#[test]
fn completions_for_an_unknown_shell_is_a_usage_error() {
    let o = bin().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("tcsh"), "{}", stderr(&o));
}

/// Runs `cloakfs ARGS` on a terminal of its own (script(1) makes one), typing INPUT.
fn at_prompt(f: &Fixture, args: &[&str], input: &str) -> Output {
    let mut cmd = vec![common::BIN.to_string()];
    cmd.extend(args.iter().map(|a| a.to_string()));
    let mut child = Command::new("script")
        .args(["-qec", &cmd.join(" "), "/dev/null"])
        .env("CLOAKFS_STATE_DIR", &f.state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn init_and_passwd_warn_about_a_weak_passphrase_typed_at_the_prompt() {
    let f = Fixture::bare();
    let cipher = f.cipher.to_str().unwrap();
    let mut init = vec!["init", cipher];
    init.extend(CHEAP_KDF);
    // script(1) merges the program's output streams onto its terminal.
    let o = at_prompt(&f, &init, "qwerty\nqwerty\n");
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("warning: this passphrase is weak (strength 0 of 4"),
        "{out}"
    );
    assert!(
        f.cipher.join("cloakfs.conf").exists(),
        "a warning must not refuse: {out}"
    );

    let strong = "violet quarry almanac tundra whistle";
    let mut passwd = vec!["passwd", cipher];
    passwd.extend(CHEAP_KDF);
    let o = at_prompt(&f, &passwd, &format!("qwerty\n{strong}\n{strong}\n"));
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    assert!(!out.contains("weak"), "{out}");

    let o = at_prompt(&f, &passwd, &format!("{strong}\nletmein\nletmein\n"));
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("warning: this passphrase is weak"), "{out}");
    // The weak one was set all the same.
    std::fs::write(&f.pass, "letmein\n").unwrap();
    let t = f
        .bin()
        .args(["slots", "test", cipher, "--passfile"])
        .arg(&f.pass)
        .output()
        .unwrap();
    assert!(t.status.success(), "{}", stderr(&t));
}

#[test]
fn a_weak_new_passphrase_from_a_file_or_a_program_is_warned_about_on_one_line() {
    // Nobody may be at a prompt to see it, but a script's log keeps the line; a warning only.
    let f = Fixture::bare();
    std::fs::write(&f.pass, "qwerty\n").unwrap();
    let o = f
        .bin()
        .arg("init")
        .arg(&f.cipher)
        .args(CHEAP_KDF)
        .arg("--passfile")
        .arg(&f.pass)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let warned: Vec<&str> = err.lines().filter(|l| l.contains("weak")).collect();
    assert_eq!(warned.len(), 1, "{err}");
    assert!(
        warned[0].starts_with(
            "cloakfs: warning: the new passphrase from a passfile: this passphrase is weak"
        ),
        "{}",
        warned[0]
    );

    // passwd with the new one from a program (--new-extpass): the unlocking passphrase is
    // not judged, the new one is. The lines that warn of weakness, after a successful passwd:
    let cipher = f.cipher.to_str().unwrap();
    let newpass = f.state.join("new-pass");
    let passwd_warnings = |old: &str, new: &str| -> Vec<String> {
        std::fs::write(&f.pass, format!("{old}\n")).unwrap();
        std::fs::write(&newpass, format!("{new}\n")).unwrap();
        let o = f
            .bin()
            .args(["passwd", cipher, "--passfile"])
            .arg(&f.pass)
            .arg("--new-extpass")
            .arg(format!("cat {}", newpass.display()))
            .args(CHEAP_KDF)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        stderr(&o)
            .lines()
            .filter(|l| l.contains("weak"))
            .map(str::to_string)
            .collect()
    };
    let warned = passwd_warnings("qwerty", "letmein");
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("from an extpass program"),
        "{}",
        warned[0]
    );
    // A strong one: no warning.
    assert!(passwd_warnings("letmein", "violet quarry almanac tundra whistle").is_empty());
}

#[test]
fn fsck_on_a_terminal_shows_no_empty_progress_frame_and_counts_in_words() {
    let f = Fixture::new();
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("a"), vec![7u8; 300_000]).unwrap();
    m.unmount();
    let cipher = f.cipher.to_str().unwrap();
    let pass = f.pass.to_str().unwrap();
    let o = at_prompt(&f, &["fsck", "--passfile", pass, cipher], "");
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    // The bar is drawn once the total is known, never as "0 B/0 B".
    assert!(!out.contains("0 B/0 B"), "{out:?}");

    // One problem is one problem.
    let name = std::fs::read_dir(&f.cipher)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| !n.starts_with("cloakfs"))
        .unwrap();
    let backing = f.cipher.join(name);
    let mut bytes = std::fs::read(&backing).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&backing, bytes).unwrap();
    let o = f
        .bin()
        .args(["fsck", "--passfile", pass, cipher])
        .output()
        .unwrap();
    assert!(
        stderr(&o).contains("1 problem found") && stdout(&o).contains(": 1 problem, 0 repaired"),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
}
