//! The multi-user daemon end to end: the real `cloakfs daemon` as root, real users made with
//! useradd, real Unix sessions (setsid), every command run as its user (the harness is
//! `common::daemon`). The attacks of issue 22 are in `attacks.rs`.

mod common;

use common::daemon::{user, wait_for, Daemon, Shell, User};
use common::{s, BIN, CHEAP_KDF};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::Command;

/// Alice's volume, attached as `name` from her shell, holding `secret.txt`.
fn attach_alice(d: &Daemon, alice: &User, sh: &mut Shell, name: &str, extra: &str) -> PathBuf {
    d.attach(alice, sh, "cipher", name, extra)
}

/// A new volume `HOME/cipher` made by the shell's user with the passfile `HOME/pass`.
fn new_volume(home: &std::path::Path, sh: &mut Shell) -> PathBuf {
    let c = home.join("cipher");
    sh.ok(&format!(
        "cloakfs init --passfile {h}/pass {kdf} {c}",
        h = s(home),
        kdf = CHEAP_KDF.join(" "),
        c = s(&c)
    ));
    c
}

/// The sessions of attach `name` as JSON, seen by `sh` (which needs the permission).
fn sessions(sh: &mut Shell, name: &str) -> Vec<serde_json::Value> {
    let out = sh.ok(&format!("cloakfs sessions --json {name}"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn session_of(sh: &mut Shell, name: &str, uid: u32) -> serde_json::Value {
    sessions(sh, name)
        .into_iter()
        .find(|s| s["uid"] == uid && s["state"] != "revoked")
        .unwrap_or_else(|| panic!("no session of uid {uid}"))
}

#[test]
fn owner_works_others_are_denied() {
    let d = Daemon::start();
    let (alice, bob) = (user("cfs-alice"), user("cfs-bob"));
    let mut a = d.shell(&alice);
    let plain = attach_alice(&d, &alice, &mut a, "proj", "");
    let p = s(&plain);
    assert_eq!(a.ok(&format!("cat {p}/secret.txt")), "top secret\n");
    assert!(a
        .ok(&format!("stat -c '%U %a' {p}"))
        .starts_with("cfs-alice 700"));
    assert_eq!(d.ls_root(), vec!["proj"]);

    // Another user, and the owner in another session, are refused before any decryption.
    let mut b = d.shell(&bob);
    assert!(b
        .fails(&format!("cat {p}/secret.txt"))
        .contains("ermission denied"));
    b.fails(&format!("ls {p}"));
    let mut a2 = d.shell(&alice);
    a2.fails(&format!("cat {p}/secret.txt"));
    // And the status shows the owner's attach and session.
    let st = a.ok("cloakfs status --json");
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st["attaches"][0]["name"], "proj");
    assert_eq!(st["sessions"][0]["entity"]["id"], a.sid);

    // Nobody, not even root, creates anything in the tree root.
    assert!(std::fs::write(d.root.join("intruder"), b"x").is_err());
    assert!(std::fs::create_dir(d.root.join("intruder")).is_err());
    // Only ciphertext in the cipher directory.
    let out = Command::new("grep")
        .args(["-r", "top secret"])
        .arg(d.work.path().join("cfs-alice/cipher"))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "plaintext found in the cipher directory"
    );
}

#[test]
fn read_only_grant_and_session_binding() {
    let d = Daemon::start();
    let (alice, bob) = (user("cfs-alice"), user("cfs-bob"));
    let mut a = d.shell(&alice);
    let plain = attach_alice(&d, &alice, &mut a, "shared", "");
    let p = s(&plain);
    // Bob shares no group with alice: bypass lets him use her files as their owner.
    let mut b1 = d.shell(&bob);
    let mut b2 = d.shell(&bob);
    a.ok(&format!(
        "cloakfs authz add shared --session {} --perms read,bypass",
        b1.sid
    ));
    let list = a.ok("cloakfs authz list --json shared");
    assert!(list.contains(&format!("\"id\": {}", b1.sid)), "{list}");

    // Not yet authenticated: refused.
    b1.fails(&format!("cat {p}/secret.txt"));
    b1.ok("cloakfs auth shared");
    assert_eq!(b1.ok(&format!("cat {p}/secret.txt")), "top secret\n");
    assert!(b1
        .fails(&format!("echo evil > {p}/secret.txt"))
        .contains("ermission denied"));
    b1.fails(&format!("touch {p}/new"));
    assert_eq!(a.ok(&format!("cat {p}/secret.txt")), "top secret\n");

    // The same user in another session is not covered by the grant.
    b2.fails("cloakfs auth shared");
    b2.fails(&format!("cat {p}/secret.txt"));

    // A grant cannot exceed what the granter holds: bob holds no add-authz at all.
    b1.fails(&format!(
        "cloakfs authz add shared --user {} --perms read",
        bob.uid
    ));
}

#[test]
fn bypass_is_needed_for_files_bob_cannot_touch() {
    let d = Daemon::start();
    let (alice, bob) = (user("cfs-alice"), user("cfs-bob"));
    let mut a = d.shell(&alice);
    let plain = attach_alice(&d, &alice, &mut a, "adhoc", "");
    let p = s(&plain);
    let mut b = d.shell(&bob);
    a.ok("cloakfs authz add adhoc --user cfs-bob --perms read,write");
    b.ok("cloakfs auth adhoc");
    // Lower-level checks run as bob: alice's cipher directory is 0700.
    assert!(b
        .fails(&format!("cat {p}/secret.txt"))
        .contains("ermission denied"));
    // With bypass, bob works on the files as their owner (an ad-hoc group of two).
    let out = a.ok("cloakfs authz add adhoc --user cfs-bob --perms read,write,bypass");
    let id = out
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("no ID in {out:?}"));
    b.ok(&format!("cloakfs auth adhoc --authz {id}"));
    b.ok(&format!("echo from bob > {p}/bob.txt"));
    assert_eq!(a.ok(&format!("cat {p}/bob.txt")), "from bob\n");
    assert!(a
        .ok(&format!("stat -c %U {p}/bob.txt"))
        .starts_with("cfs-alice"));
}

#[test]
fn revoke_takes_effect_at_once_and_for_good() {
    let d = Daemon::start();
    let (alice, bob) = (user("cfs-alice"), user("cfs-bob"));
    let mut a = d.shell(&alice);
    let plain = attach_alice(&d, &alice, &mut a, "rv", "");
    let p = s(&plain);
    let mut b = d.shell(&bob);
    a.ok("cloakfs authz add rv --user cfs-bob --perms read,bypass");
    b.ok("cloakfs auth rv");
    b.ok(&format!("cd {p} && cat secret.txt"));
    let id = session_of(&mut a, "rv", bob.uid)["id"].as_u64().unwrap();
    a.ok(&format!("cloakfs revoke rv {id}"));
    // The next request fails, even from a working directory inside the attach.
    assert!(b.fails("cat secret.txt").contains("ermission denied"));
    b.fails(&format!("cat {p}/secret.txt"));
    // A revoked session cannot come back.
    b.fails("cloakfs auth rv");
    b.fails(&format!("cat {p}/secret.txt"));
    let st = sessions(&mut a, "rv");
    assert!(st.iter().any(|s| s["id"] == id && s["state"] == "revoked"));
}

/// Bob's session with `--session-ttl 4s --on-timeout behaviour`, timed out, with an open
/// descriptor 3 on `big.bin` taken while it was active. Returns bob's shell.
fn timed_out(d: &Daemon, a: &mut Shell, name: &str, behaviour: &str, extra: &str) -> Shell {
    timed_out_for(d, a, name, behaviour, extra, "cfs-bob")
}

/// [`timed_out`] for user `who`.
fn timed_out_for(
    d: &Daemon,
    a: &mut Shell,
    name: &str,
    behaviour: &str,
    extra: &str,
    who: &'static str,
) -> Shell {
    let bob = user(who);
    let p = d.root.join(name);
    a.ok(&format!(
        "head -c 300000 /dev/urandom > {p}/big.bin && echo second > {p}/other.txt",
        p = s(&p)
    ));
    a.ok(&format!(
        "cloakfs authz add {name} --user {who} --perms read,bypass --session-ttl 4s \
         --on-timeout {behaviour} {extra}"
    ));
    let mut b = d.shell(&bob);
    // The TTL runs from `cloakfs auth`: the descriptor is taken in the same shell command, so
    // it falls inside the TTL even on a loaded machine (two round trips of the test's shell
    // took over 1 s under heavy host steal).
    b.ok(&format!(
        "cloakfs auth {name} && exec 3< {}/big.bin && head -c 1000 <&3 >/dev/null",
        s(&p)
    ));
    let id = session_of(a, name, bob.uid)["id"].clone();
    wait_for("the session to time out", || {
        sessions(a, name)
            .iter()
            .any(|s| s["id"] == id && s["state"] == "timed-out")
    });
    b
}

#[test]
fn timeout_fail_all_and_callback() {
    let d = Daemon::start();
    let alice = user("cfs-alice");
    let bob = user("cfs-bob");
    let mut a = d.shell(&alice);
    let plain = attach_alice(&d, &alice, &mut a, "fa", "");
    let cb = d.work.path().join("shared/callback.out");
    let mut b = timed_out(
        &d,
        &mut a,
        "fa",
        "fail-all",
        &format!("--callback 'echo \"$1 $2 $(id -u)\" >> {}'", s(&cb)),
    );
    let p = s(&plain);
    b.fails(&format!("cat {p}/other.txt"));
    // Even the descriptor opened before the timeout fails now.
    b.fails("head -c 1000 <&3 | wc -c | grep -qx 1000");
    wait_for("the callback", || {
        std::fs::read_to_string(&cb)
            .unwrap_or_default()
            .contains("fa ")
    });
    // As alice, who set the callback, not as bob, whose session timed out.
    let line = std::fs::read_to_string(&cb).unwrap();
    assert!(line.ends_with(&format!(" {}\n", alice.uid)), "{line}");
    assert_ne!(alice.uid, bob.uid);
    // A timed-out session may re-authenticate.
    b.ok("cloakfs auth fa");
    assert_eq!(b.ok(&format!("cat {p}/other.txt")), "second\n");
}

#[test]
fn timeout_fail_new_keeps_open_files() {
    let d = Daemon::start();
    let alice = user("cfs-alice");
    let mut a = d.shell(&alice);
    let plain = attach_alice(&d, &alice, &mut a, "fn", "");
    let mut b = timed_out(&d, &mut a, "fn", "fail-new", "");
    b.fails(&format!("cat {}/other.txt", s(&plain)));
    assert_eq!(b.ok("head -c 1000 <&3 | wc -c").trim(), "1000");
}

/// Starts `cat other.txt` in bob's shell; it must block until bob re-authenticates.
fn blocked_cat_completes_after_reauth(d: &Daemon, a: &mut Shell, b: &mut Shell, name: &str) {
    let out = d.work.path().join(format!("shared/{name}.cat"));
    let rc = d.work.path().join(format!("shared/{name}.rc"));
    b.ok(&format!(
        "(cat {p}/other.txt > {o}; echo $? > {r}) &",
        p = s(&d.root.join(name)),
        o = s(&out),
        r = s(&rc)
    ));
    wait_for("the cat to block", || {
        assert!(
            !rc.exists(),
            "cat did not block: status {:?}, output {:?}",
            std::fs::read_to_string(&rc),
            std::fs::read_to_string(&out)
        );
        sessions(a, name)
            .iter()
            .any(|s| s["waiting"].as_u64() >= Some(1))
    });
    b.ok(&format!("cloakfs auth {name}"));
    wait_for("the cat to finish", || {
        std::fs::read_to_string(&rc).is_ok_and(|s| s.ends_with('\n'))
    });
    assert_eq!(std::fs::read_to_string(&rc).unwrap(), "0\n");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "second\n");
}

#[test]
fn timeout_sleep_new() {
    let d = Daemon::start();
    let alice = user("cfs-alice");
    let mut a = d.shell(&alice);
    attach_alice(&d, &alice, &mut a, "sn", "");
    let mut b = timed_out(&d, &mut a, "sn", "sleep-new", "");
    // Open files keep working while new opens sleep.
    assert_eq!(b.ok("head -c 1000 <&3 | wc -c").trim(), "1000");
    blocked_cat_completes_after_reauth(&d, &mut a, &mut b, "sn");
}

#[test]
fn timeout_sleep_all() {
    let d = Daemon::start();
    let alice = user("cfs-alice");
    let mut a = d.shell(&alice);
    attach_alice(&d, &alice, &mut a, "sa", "");
    let mut b = timed_out(&d, &mut a, "sa", "sleep-all", "");
    blocked_cat_completes_after_reauth(&d, &mut a, &mut b, "sa");
}

/// The daemon's sleeping-request slots (its threads but four, 12 here) are shared by every
/// user: one user whose requests sleep on an attach of their own takes half of them at
/// most, so another user's `sleep-new` grant still sleeps instead of failing at once.
#[test]
fn one_users_sleeping_requests_leave_room_for_anothers() {
    let d = Daemon::start();
    let (alice, carol) = (user("cfs-alice"), user("cfs-carol"));
    let mut a = d.shell(&alice);
    attach_alice(&d, &alice, &mut a, "sr", "");
    let mut b = timed_out(&d, &mut a, "sr", "sleep-new", "");
    // Carol's volume, and dave's timed-out sleep-all session on it: every request of his
    // sleeps until he authenticates again (or `--max-wait` ends it).
    let mut c = d.shell(&carol);
    d.attach(&carol, &mut c, "cipher", "cf", "");
    let mut dv = timed_out_for(&d, &mut c, "cf", "sleep-all", "", "cfs-dave");
    const FILLERS: usize = 12;
    let rc = |i: usize| d.work.path().join(format!("shared/fill{i}.rc"));
    for i in 0..FILLERS {
        dv.ok(&format!(
            "(cat {p}/secret.txt > /dev/null 2>&1; echo $? > {r}) &",
            p = s(&d.root.join("cf")),
            r = s(&rc(i))
        ));
    }
    // Half of the slots sleep; the rest are refused at once.
    wait_for("dave's requests to sleep or be refused", || {
        let sleeping: u64 = sessions(&mut c, "cf")
            .iter()
            .filter_map(|s| s["waiting"].as_u64())
            .sum();
        let refused = (0..FILLERS).filter(|&i| rc(i).exists()).count();
        sleeping as usize + refused == FILLERS && sleeping > 0
    });
    let refused = (0..FILLERS).filter(|&i| rc(i).exists()).count();
    assert_eq!(refused, FILLERS / 2, "dave took more than half the slots");
    // Bob's request on alice's attach still sleeps, and goes on once he authenticates.
    blocked_cat_completes_after_reauth(&d, &mut a, &mut b, "sr");
}

#[test]
fn hidden_attach_and_detach() {
    let d = Daemon::start();
    let alice = user("cfs-alice");
    let mut a = d.shell(&alice);
    let plain = attach_alice(&d, &alice, &mut a, "ghost", "--hidden");
    let p = s(&plain);
    assert!(
        d.ls_root().is_empty(),
        "hidden attach listed: {:?}",
        d.ls_root()
    );
    assert_eq!(a.ok(&format!("cat {p}/secret.txt")), "top secret\n");
    // Detach: the name goes, open handles fail, the plaintext is gone.
    a.ok(&format!("exec 4< {p}/secret.txt"));
    a.ok("cloakfs detach ghost");
    a.fails(&format!("cat {p}/secret.txt"));
    a.fails("cat <&4");
    assert!(!plain.exists());
    let st = a.ok("cloakfs status --json");
    assert!(!st.contains("ghost"), "{st}");
}

#[test]
fn generated_names() {
    let d = Daemon::start();
    let alice = user("cfs-alice");
    let mut a = d.shell(&alice);
    let home = d.home(&alice);
    let c = new_volume(&home, &mut a);
    let out = a.ok(&format!(
        "cloakfs attach --passfile {}/pass --name entity {}",
        s(&home),
        s(&c)
    ));
    assert!(out.contains(&format!("u{}", alice.uid)), "{out}");
    let out = a.ok(&format!(
        "cloakfs attach --passfile {}/pass --name entity-session {}",
        s(&home),
        s(&c)
    ));
    assert!(out.contains(&format!("u{}s{}", alice.uid, a.sid)), "{out}");
    a.ok(&format!(
        "cloakfs attach --passfile {}/pass --name random {}",
        s(&home),
        s(&c)
    ));
    assert_eq!(d.ls_root().len(), 3);
    // Taken names and wrong passphrases are refused with one line.
    let out = a.fails(&format!(
        "cloakfs attach --passfile {}/pass {} u{}",
        s(&home),
        s(&c),
        alice.uid
    ));
    assert_eq!(out.lines().count(), 1, "{out}");
    a.ok(&format!("echo wrong > {}/bad", s(&home)));
    a.fails(&format!(
        "cloakfs attach --passfile {}/bad {} other",
        s(&home),
        s(&c)
    ));
    // A user cannot attach a cipher directory they cannot read.
    let bob = user("cfs-bob");
    let mut b = d.shell(&bob);
    // Nor take a name that only looks different from one that exists: case, 0/O, 1/l/I.
    let bob_home = d.home(&bob);
    let bc = new_volume(&bob_home, &mut b);
    let alikes = [
        format!("U{}", alice.uid),
        format!("u{}", alice.uid).replace('1', "l"),
    ];
    for alike in alikes.iter().filter(|n| **n != format!("u{}", alice.uid)) {
        let out = b.fails(&format!(
            "cloakfs attach --passfile {}/pass {} {alike}",
            s(&bob_home),
            s(&bc)
        ));
        assert!(out.contains("is taken"), "{alike}: {out}");
    }
    assert_eq!(d.ls_root().len(), 3);
    b.fails(&format!(
        "cloakfs attach --passfile /dev/null {} stolen",
        s(&c)
    ));
}

#[test]
fn challenge_response_refuses_forged_and_replayed_answers() {
    use cloakfs_daemon::client::Client;
    use cloakfs_daemon::protocol::{Request, Response};
    let d = Daemon::start();
    let alice = user("cfs-alice");
    let mut a = d.shell(&alice);
    let plain = attach_alice(&d, &alice, &mut a, "cr", "");
    let home = d.work.path().join("cfs-alice");
    a.ok(&format!("echo swordfish > {}/authpass", s(&home)));
    // Root (this test process) gets a passphrase authorization.
    a.ok(&format!(
        "cloakfs authz add cr --user 0 --perms read --auth passphrase --passfile {}/authpass \
         --kdf-memory 64 --kdf-iterations 1",
        s(&home)
    ));
    let challenge = |c: &mut Client| match c
        .call(&Request::Auth {
            name: "cr".into(),
            authz: None,
        })
        .unwrap()
    {
        Response::Challenge {
            authz,
            challenge,
            salt,
            memory_kib,
            iterations,
            parallelism,
        } => {
            let params = cloakfs_core::crypto::kdf::Argon2Params {
                memory_kib,
                iterations,
                lanes: parallelism,
            };
            let salt = cloakfs_core::text::unb64(salt.as_bytes()).unwrap();
            let ch = cloakfs_core::text::unb64(challenge.as_bytes()).unwrap();
            let key = cloakfs_daemon::auth::verifier_key(
                &cloakfs_core::crypto::secret::Passphrase::new(b"swordfish".to_vec()),
                &salt,
                &params,
            )
            .unwrap();
            cloakfs_core::text::b64(&cloakfs_daemon::auth::challenge_answer(
                key.expose(),
                "cr",
                authz,
                &ch,
            ))
        }
        r => panic!("expected a challenge, got {r:?}"),
    };
    let answer = |c: &mut Client, answer: String| c.call(&Request::AuthAnswer { answer }).unwrap();
    let is_err = |r: &Response| matches!(r, Response::Error { .. });

    // Nothing before a right answer.
    assert!(std::fs::read(plain.join("secret.txt")).is_err());
    // A right answer works once.
    let mut c = Client::connect(&d.socket).unwrap();
    let good = challenge(&mut c);
    assert!(matches!(
        answer(&mut c, good.clone()),
        Response::Authenticated { .. }
    ));
    assert_eq!(
        std::fs::read(plain.join("secret.txt")).unwrap(),
        b"top secret\n"
    );
    // Replayed on the same connection, or against a fresh challenge: refused.
    assert!(is_err(&answer(&mut c, good.clone())));
    let mut c2 = Client::connect(&d.socket).unwrap();
    let _ = challenge(&mut c2);
    assert!(is_err(&answer(&mut c2, good)));
    // That was a failed guess: a forged answer right after is not even asked for.
    let forged = c2
        .call(&Request::Auth {
            name: "cr".into(),
            authz: None,
        })
        .unwrap();
    assert!(
        matches!(&forged, Response::Error { message } if message.contains("too many failed attempts")),
        "{forged:?}"
    );
    // Asking again and again, as fast as the socket answers: each is refused, and the log
    // grows by one line per user and minute, not one per refusal.
    for _ in 0..300 {
        let r = c2
            .call(&Request::Auth {
                name: "cr".into(),
                authz: None,
            })
            .unwrap();
        assert!(is_err(&r), "{r:?}");
    }
    let log = d.log();
    let lines = log.matches("challenge refused").count();
    assert!(
        (1..=2).contains(&lines),
        "{lines} log lines for 301 refusals"
    );
}

#[test]
fn malformed_control_messages_do_not_hurt_others() {
    use std::os::unix::net::UnixStream;
    let d = Daemon::start();
    let alice = user("cfs-alice");
    let mut a = d.shell(&alice);
    attach_alice(&d, &alice, &mut a, "robust", "");
    for junk in [
        &b"this is not json\n"[..],
        b"{\"op\":\"attach\"}\n",
        b"{\"op\":\"no-such-op\"}\n",
        b"\xff\xfe\n",
    ] {
        let mut c = UnixStream::connect(&d.socket).unwrap();
        c.write_all(junk).unwrap();
        let mut line = String::new();
        let _ = BufReader::new(&c).read_line(&mut line);
        assert!(
            line.is_empty() || line.contains("error"),
            "answer to junk: {line}"
        );
    }
    // A client that sends half a line and goes away.
    let mut c = UnixStream::connect(&d.socket).unwrap();
    c.write_all(b"{\"op\":").unwrap();
    drop(c);
    // An oversized line.
    let mut c = UnixStream::connect(&d.socket).unwrap();
    let _ = c.write_all(&vec![b'x'; 200_000]);
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    // Everyone else is still served.
    assert!(a.ok("cloakfs status").contains("robust"));
    assert_eq!(
        a.ok(&format!("cat {}/secret.txt", s(&d.root.join("robust")))),
        "top secret\n"
    );
}

#[test]
fn no_daemon_is_one_clear_line() {
    let out = common::cloakfs(&["status", "--socket", "/nonexistent/cloakfs.sock"]);
    assert!(!out.status.success());
    let err = common::stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("daemon"), "{err}");
}

#[test]
fn the_daemon_checks_cipherdir_access_as_the_user() {
    // Bob holds alice's master key (say, from an old backup of her passphrase) but cannot
    // read her cipher directory: the daemon opens it as bob and refuses.
    let d = Daemon::start();
    let (alice, bob) = (user("cfs-alice"), user("cfs-bob"));
    let mut a = d.shell(&alice);
    attach_alice(&d, &alice, &mut a, "mine", "");
    let cipher = d.work.path().join("cfs-alice/cipher");
    let pass = cloakfs_core::crypto::secret::Passphrase::new(b"correct horse battery".to_vec());
    let volume = cloakfs_core::Volume::unlock(&cipher, &pass).unwrap();
    let request = serde_json::json!({
        "op": "attach",
        "cipherdir": s(&cipher),
        "naming": {"given": "stolen"},
        "master_key": cloakfs_core::text::b64(volume.master_key().expose()),
    });
    let send = |u: &User| {
        // setsid: an attach is bound to the caller's Unix session, and the test runner's
        // session leader may be outside this pid namespace (then getsid says 0).
        let out = Command::new("setsid")
            .args(["--wait", "setpriv"])
            .arg(format!("--reuid={}", u.uid))
            .arg(format!("--regid={}", u.gid))
            .arg("--init-groups")
            // Debian's python, not whatever a root-only PATH entry points to.
            .args([
                "/usr/bin/python3",
                "-c",
                "import socket, sys\n\
                 s = socket.socket(socket.AF_UNIX)\n\
                 s.connect(sys.argv[1])\n\
                 s.sendall(sys.argv[2].encode() + b'\\n')\n\
                 print(s.makefile().readline().strip())",
            ])
            .arg(&d.socket)
            .arg(request.to_string())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", common::stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let answer = send(&bob);
    assert!(answer.contains("\"error\""), "{answer}");
    assert!(!d.ls_root().contains(&"stolen".to_string()));
    // The same request from alice is accepted.
    let answer = send(&alice);
    assert!(answer.contains("attached"), "{answer}");
    assert!(d.ls_root().contains(&"stolen".to_string()));
}

#[test]
fn systemd_unit_is_valid() {
    // systemd-analyze checks the unit's syntax and that its command exists; point ExecStart at
    // the binary under test, as an install would at /usr/local/bin.
    let Ok(st) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze not installed: skipping the unit check");
        return;
    };
    assert!(st.status.success());
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../dist/cloakfs-daemon.service"
    ))
    .unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/cloakfs daemon"));
    assert!(unit.contains("Type=notify"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cloakfs-daemon.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/cloakfs", BIN)).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", s(&path)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(
        common::stderr(&out).trim().is_empty(),
        "{}",
        common::stderr(&out)
    );
}

/// A sharing volume (issue 24) in the multi-user daemon: three real users attach one cipher
/// directory, each with their own age identity, and each file opens only for its recipients.
#[test]
fn sharing_members_attach_with_their_identity() {
    let d = Daemon::start();
    let users = [user("cfs-alice"), user("cfs-bob"), user("cfs-carol")];
    let mut sh: Vec<Shell> = users.iter().map(|u| d.shell(u)).collect();
    let mut public = Vec::new();
    for (u, s) in users.iter().zip(sh.iter_mut()) {
        let home = d.home(u);
        let key = home.join("id.key");
        s.ok(&format!("age-keygen -o {} 2>/dev/null", common::s(&key)));
        public.push(
            s.ok(&format!("age-keygen -y {}", common::s(&key)))
                .trim()
                .to_string(),
        );
    }
    // The team's cipher directory, readable and writable by the three (a shared group would
    // do the same).
    let team = d.work.path().join("team");
    std::fs::create_dir(&team).unwrap();
    let alice_home = d.home(&users[0]);
    let t = s(&team);
    common::daemon::chown_r(&team, &users[0]);
    sh[0].ok(&format!(
        "cloakfs init --sharing --passfile {h}/pass {kdf} {t} && chmod -R a+rwX {t}",
        h = s(&alice_home),
        kdf = CHEAP_KDF.join(" "),
    ));
    for (p, label) in public.iter().zip(["alice", "bob", "carol"]) {
        sh[0].ok(&format!(
            "cloakfs slots add {t} --passfile {h}/pass --recipient {p} --label {label}",
            h = s(&alice_home)
        ));
    }
    // Each member attaches with only their identity (it opens their slot and their files).
    let names = ["team-alice", "team-bob", "team-carol"];
    for ((u, s2), name) in users.iter().zip(sh.iter_mut()).zip(names) {
        let key = d.home(u).join("id.key");
        s2.ok(&format!(
            "cloakfs attach --identity {} {t} {name}",
            common::s(&key)
        ));
    }
    let at = |i: usize, f: &str| format!("{}/{}/{f}", s(&d.root), names[i]);
    sh[0].ok(&format!("echo plan > {}", at(0, "plan.txt")));
    // Bob and carol see the name and the size; open is refused.
    assert!(sh[1]
        .fails(&format!("cat {}", at(1, "plan.txt")))
        .contains("ermission denied"));
    assert_eq!(
        sh[1]
            .ok(&format!("stat -c %s {}", at(1, "plan.txt")))
            .trim(),
        "5"
    );
    // Granted by alice through her attach: bob reads it, carol still cannot.
    sh[0].ok(&format!(
        "cloakfs share add {} --recipient {}",
        at(0, "plan.txt"),
        public[1]
    ));
    assert_eq!(sh[1].ok(&format!("cat {}", at(1, "plan.txt"))), "plan\n");
    assert!(sh[2]
        .fails(&format!("cat {}", at(2, "plan.txt")))
        .contains("ermission denied"));
    // A file bob creates is his: alice cannot open it until he shares it.
    sh[1].ok(&format!("echo notes > {}", at(1, "bob.txt")));
    assert!(sh[0]
        .fails(&format!("cat {}", at(0, "bob.txt")))
        .contains("ermission denied"));
    let listed = sh[1].ok(&format!("cloakfs share list {}", at(1, "bob.txt")));
    assert_eq!(listed.trim(), public[1]);
    // A passphrase-protected ssh key cannot go to the daemon (nobody could type its
    // passphrase there): one clear line, nothing attached. (Member::from_texts refuses it in
    // the daemon too: a unit test in the core.)
    let enc = s(&alice_home.join("enc_ed25519")).to_string();
    sh[0].ok(&format!(
        "ssh-keygen -q -t ed25519 -N secret-words -f {enc}"
    ));
    let err = sh[0].fails(&format!(
        "cloakfs attach --passfile {h}/pass --identity {enc} {t} team-enc </dev/null",
        h = s(&alice_home)
    ));
    assert!(err.contains("passphrase"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!d.ls_root().contains(&"team-enc".to_string()));
}

/// A gpg member of a sharing volume attaches with `--gpg`: the daemon opens their gpg
/// entries, and seals to gpg recipients, by running gpg as the attaching user with their
/// GNUPGHOME (their keyring and gpg-agent, never the daemon's).
#[test]
fn a_gpg_member_attaches_with_their_keyring() {
    let d = Daemon::start();
    let (alice, bob) = (user("cfs-alice"), user("cfs-bob"));
    let (mut sa, mut sb) = (d.shell(&alice), d.shell(&bob));
    let (ha, hb) = (d.home(&alice), d.home(&bob));
    // Bob's keyring: one key without a passphrase; its public half goes to alice, who
    // trusts it.
    let gpg_b = format!("GNUPGHOME={}/gpg", s(&hb));
    let gpg_a = format!("GNUPGHOME={}/gpg", s(&ha));
    for (sh, g, h) in [(&mut sa, &gpg_a, &ha), (&mut sb, &gpg_b, &hb)] {
        sh.ok(&format!(
            "mkdir -m 700 {}/gpg && {g} gpgconf --list-dirs >/dev/null",
            s(h)
        ));
    }
    sb.ok(&format!(
        "{gpg_b} gpg --batch --pinentry-mode loopback --passphrase '' --quick-gen-key \
         'Bob <bob@example.org>' future-default default never 2>/dev/null"
    ));
    let fpr = sb
        .ok(&format!(
            "{gpg_b} gpg --with-colons --list-keys 2>/dev/null | awk -F: '/^fpr/ {{print $10; exit}}'"
        ))
        .trim()
        .to_string();
    assert_eq!(fpr.len(), 40, "{fpr}");
    let public = sb.ok(&format!("{gpg_b} gpg --armor --export {fpr} 2>/dev/null"));
    std::fs::write(ha.join("bob.asc"), public).unwrap();
    common::daemon::chown_r(&ha, &alice);
    sa.ok(&format!(
        "{gpg_a} gpg --batch --import {h}/bob.asc 2>/dev/null && \
         echo {fpr}:6: | {gpg_a} gpg --batch --import-ownertrust 2>/dev/null",
        h = s(&ha)
    ));
    // Alice's team volume: her age key, and bob's gpg key as a member (a gpg key slot).
    let team = d.work.path().join("gteam");
    std::fs::create_dir(&team).unwrap();
    common::daemon::chown_r(&team, &alice);
    let t = s(&team);
    let akey = format!("{}/id.key", s(&ha));
    sa.ok(&format!(
        "age-keygen -o {akey} 2>/dev/null && \
         cloakfs init --sharing --passfile {h}/pass {kdf} {t} && chmod -R a+rwX {t} && \
         cloakfs slots add {t} --passfile {h}/pass --recipient $(age-keygen -y {akey}) && \
         {gpg_a} cloakfs slots add {t} --passfile {h}/pass --gpg-recipient {fpr} --label bob",
        h = s(&ha),
        kdf = CHEAP_KDF.join(" "),
    ));
    sa.ok(&format!(
        "{gpg_a} cloakfs attach --identity {akey} {t} g-alice"
    ));
    // Bob attaches with his gpg key alone: it opens his slot, and his files.
    sb.ok(&format!(
        "{gpg_b} cloakfs attach --gpg {t} g-bob </dev/null"
    ));
    let at = |name: &str, f: &str| format!("{}/{name}/{f}", s(&d.root));
    sa.ok(&format!("echo plan > {}", at("g-alice", "plan.txt")));
    assert!(sb
        .fails(&format!("cat {}", at("g-bob", "plan.txt")))
        .contains("ermission denied"));
    // Alice's attach seals to bob's key with her keyring (gpg run as alice).
    sa.ok(&format!(
        "{gpg_a} cloakfs share add {} --gpg-recipient {fpr}",
        at("g-alice", "plan.txt")
    ));
    assert_eq!(sb.ok(&format!("cat {}", at("g-bob", "plan.txt"))), "plan\n");
    // A file bob makes is his key's alone.
    sb.ok(&format!("echo mine > {}", at("g-bob", "bob.txt")));
    assert_eq!(sb.ok(&format!("cat {}", at("g-bob", "bob.txt"))), "mine\n");
    assert_eq!(
        sb.ok(&format!("cloakfs share list {}", at("g-bob", "bob.txt")))
            .trim(),
        format!("gpg:{fpr}")
    );
    assert!(sa
        .fails(&format!("cat {}", at("g-alice", "bob.txt")))
        .contains("ermission denied"));
    // A keyring without a secret key: one clear line, nothing attached.
    let err = sb.fails(&format!(
        "mkdir -m 700 {h}/empty && GNUPGHOME={h}/empty cloakfs attach --gpg --passfile \
         {h}/pass {t} g-none </dev/null",
        h = s(&hb),
    ));
    assert!(err.contains("no secret key"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!d.ls_root().contains(&"g-none".to_string()));
    for (sh, g) in [(&mut sa, &gpg_a), (&mut sb, &gpg_b)] {
        sh.ok(&format!("{g} gpgconf --kill gpg-agent"));
    }
}
