//! The control server over a real socket, with a fake tree (no FUSE): framing, attach,
//! authorizations, passphrase authentication, sleeping timeouts, revocation, detach.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use cloakfs_core::crypto::kdf::Argon2Params;
use cloakfs_core::crypto::secret::Passphrase;
use cloakfs_core::format::config::VolumeParams;
use cloakfs_core::Volume;
use cloakfs_daemon::client::Client;
use cloakfs_daemon::daemon::Daemon;
use cloakfs_daemon::gate::DaemonGate;
use cloakfs_daemon::peer::session_of;
use cloakfs_daemon::protocol::*;
use cloakfs_daemon::server::{self, Server};
use cloakfs_daemon::shared::Shared;
use cloakfs_daemon::tree::Tree;
use cloakfs_fuse::tree::{Access, AttachId, AttachSpec, Caller, Gate, Need, Verdict};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct FakeState {
    next: AttachId,
    attached: Vec<(AttachId, String)>,
    detached: Vec<AttachId>,
    invalidated: Vec<AttachId>,
}

#[derive(Clone, Default)]
struct FakeTree(Arc<Mutex<FakeState>>);

impl Tree for FakeTree {
    fn attach(&self, spec: AttachSpec) -> io::Result<AttachId> {
        let mut s = self.0.lock().unwrap();
        if s.attached.iter().any(|(_, n)| *n == spec.name) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "taken"));
        }
        s.next += 1;
        let id = s.next;
        s.attached.push((id, spec.name));
        Ok(id)
    }
    fn detach(&self, id: AttachId) -> io::Result<()> {
        let mut s = self.0.lock().unwrap();
        s.attached.retain(|(i, _)| *i != id);
        s.detached.push(id);
        Ok(())
    }
    fn invalidate(&self, id: AttachId) {
        self.0.lock().unwrap().invalidated.push(id);
    }
}

struct Env {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    cipherdir: PathBuf,
    master_key: String,
    tree: FakeTree,
    gate: DaemonGate,
    _server: Server,
}

fn setup() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let cipherdir = dir.path().join("enc");
    std::fs::create_dir(&cipherdir).unwrap();
    let v = Volume::create(
        &cipherdir,
        VolumeParams::default(),
        &Passphrase::new(b"pw".to_vec()),
        Argon2Params::LEAST,
    )
    .unwrap();
    let master_key = B64.encode(v.master_key().expose());
    let socket = dir.path().join("run/control.sock");
    let shared = Arc::new(Shared::new());
    let tree = FakeTree::default();
    let daemon = Daemon::new(shared.clone(), tree.clone(), PathBuf::from("/crypt"))
        .unwrap()
        // Guessing is throttled in tests/attacks.rs of the CLI; not here.
        .with_penalty(Duration::ZERO);
    cloakfs_daemon::timer::start(shared.clone(), tree.clone()).unwrap();
    let listener = server::bind(&socket).unwrap();
    let srv = Server::start(Arc::new(daemon), listener, socket.clone()).unwrap();
    Env {
        _dir: dir,
        socket,
        cipherdir,
        master_key,
        tree,
        gate: DaemonGate::new(shared, Duration::from_secs(30), 4),
        _server: srv,
    }
}

fn me() -> (u32, u32) {
    (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    )
}

fn call(env: &Env, req: &Request) -> Response {
    // An attach is bound to its owner's Unix session. Under a session leader outside our pid
    // namespace (some CI runners) getsid says 0: then start a session of our own (a test
    // binary run by cargo is no process-group leader, so setsid succeeds).
    if session_of(std::process::id()).is_none() {
        let _ = rustix::process::setsid(); // a parallel test may have won the race
    }
    Client::connect(&env.socket).unwrap().call(req).unwrap()
}

fn attach_req(env: &Env, name: &str) -> Request {
    Request::Attach(AttachRequest {
        cipherdir: env.cipherdir.display().to_string(),
        naming: Naming::Given(name.into()),
        hidden: false,
        read_only: false,
        master_key: env.master_key.clone(),
        key_ttl: None,
        callback: None,
        member: None,
    })
}

fn attach(env: &Env, name: &str) -> AttachId {
    match call(env, &attach_req(env, name)) {
        Response::Attached {
            name: n,
            path,
            session,
        } => {
            assert_eq!(n, name);
            assert_eq!(path, format!("/crypt/{name}"));
            assert!(session >= 1);
        }
        r => panic!("attach: {r:?}"),
    }
    let s = env.tree.0.lock().unwrap();
    s.attached.iter().find(|(_, n)| n == name).unwrap().0
}

fn err(r: Response) -> String {
    match r {
        Response::Error { message } => message,
        r => panic!("expected an error, got {r:?}"),
    }
}

fn grant(name: &str, entity: Entity, perms: &[&str], auth: AuthMethod) -> AuthzAddRequest {
    AuthzAddRequest {
        name: name.into(),
        entity,
        perms: perms.iter().map(|p| p.to_string()).collect(),
        auth,
        expires: None,
        session_ttl: None,
        idle: None,
        on_timeout: OnTimeout::FailAll,
        callback: None,
        any_uid: false,
    }
}

fn add_authz(env: &Env, g: AuthzAddRequest) -> u32 {
    match call(env, &Request::AuthzAdd(g)) {
        Response::AuthzAdded { id } => id,
        r => panic!("authz add: {r:?}"),
    }
}

/// A process of ours in another Unix session (killed on drop).
struct OtherSession(Child);

impl OtherSession {
    fn start() -> Self {
        let child = Command::new("setsid")
            .args(["sleep", "600"])
            .spawn()
            .unwrap();
        let pid = child.id();
        let mine = session_of(std::process::id());
        wait_until("the child's own session", || {
            session_of(pid).is_some_and(|s| Some(s) != mine)
        });
        OtherSession(child)
    }
    fn caller(&self) -> Caller {
        let (uid, gid) = me();
        Caller {
            uid,
            gid,
            pid: self.0.id(),
        }
    }
}

impl Drop for OtherSession {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn need(access: Access) -> Need {
    Need {
        access,
        on_open_handle: false,
    }
}

fn own_caller() -> Caller {
    let (uid, gid) = me();
    Caller {
        uid,
        gid,
        pid: std::process::id(),
    }
}

fn status_sessions(env: &Env) -> Vec<SessionInfo> {
    match call(env, &Request::Status) {
        Response::Status { sessions, .. } => sessions,
        r => panic!("status: {r:?}"),
    }
}

#[test]
fn malformed_lines_get_an_error_and_the_connection_goes_on() {
    let env = setup();
    let s = UnixStream::connect(&env.socket).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    for bad in [
        "this is not json",
        "{\"op\":\"fly\"}",
        "{\"op\":\"detach\"}",
        "",
    ] {
        writeln!(w, "{bad}").unwrap();
        line.clear();
        r.read_line(&mut line).unwrap();
        let resp: Response = serde_json::from_str(&line).unwrap();
        assert!(err(resp).contains("malformed request"), "{line}");
    }
    writeln!(w, "{}", serde_json::to_string(&Request::Status).unwrap()).unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    assert!(matches!(
        serde_json::from_str::<Response>(&line).unwrap(),
        Response::Status { .. }
    ));
    // Not UTF-8: an error, then the connection closes; the daemon serves on.
    w.write_all(b"\xff\xfe\n").unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    assert!(err(serde_json::from_str(&line).unwrap()).contains("UTF-8"));
    line.clear();
    assert_eq!(r.read_line(&mut line).unwrap(), 0);

    // Oversized: an error and the connection closes.
    let s = UnixStream::connect(&env.socket).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let big = vec![b'x'; MAX_MESSAGE + 10];
    let _ = w.write_all(&big);
    line.clear();
    r.read_line(&mut line).unwrap();
    assert!(err(serde_json::from_str(&line).unwrap()).contains("longer"));
    assert!(matches!(
        call(&env, &Request::Status),
        Response::Status { .. }
    ));
}

#[test]
fn a_second_daemon_is_refused_and_a_stale_socket_replaced() {
    let env = setup();
    let e = server::bind(&env.socket).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join("s.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    server::bind(&stale).unwrap();
    let e = Client::connect(&dir.path().join("none.sock"))
        .err()
        .unwrap();
    assert!(e.to_string().contains("no cloakfs daemon at"), "{e}");
}

#[test]
fn attach_checks_the_key_and_the_name() {
    let env = setup();
    let id = attach(&env, "proj");
    assert!(err(call(&env, &attach_req(&env, "proj"))).contains("name proj is taken"));
    let Request::Attach(mut bad) = attach_req(&env, "other") else {
        unreachable!()
    };
    bad.master_key = B64.encode([0u8; 32]);
    assert!(err(call(&env, &Request::Attach(bad.clone()))).contains("does not open"));
    bad.master_key = "!!".into();
    assert!(err(call(&env, &Request::Attach(bad.clone()))).contains("base64"));
    let Request::Attach(mut rel) = attach_req(&env, "rel") else {
        unreachable!()
    };
    rel.cipherdir = "enc".into();
    assert!(err(call(&env, &Request::Attach(rel))).contains("absolute"));
    let Request::Attach(mut noisy) = attach_req(&env, "noisy") else {
        unreachable!()
    };
    noisy.callback = Some("x".repeat(1025));
    assert!(err(call(&env, &Request::Attach(noisy))).contains("callback longer than 1024"));
    let Request::Attach(mut missing) = attach_req(&env, "missing") else {
        unreachable!()
    };
    missing.cipherdir = "/nonexistent/cloakfs".into();
    assert!(err(call(&env, &Request::Attach(missing))).contains("/nonexistent/cloakfs"));
    for bad in [
        "a/b",
        "proj ",
        " ",
        "*",
        "pr\u{043e}j",
        "a\u{202e}b",
        ".x",
        "-x",
    ] {
        let e = err(call(&env, &attach_req(&env, bad)));
        assert!(
            e.contains("may hold only") || e.contains("may not start"),
            "{bad:?}: {e}"
        );
    }

    // Entity and random names.
    let Request::Attach(mut ent) = attach_req(&env, "") else {
        unreachable!()
    };
    ent.naming = Naming::Entity { session: false };
    match call(&env, &Request::Attach(ent.clone())) {
        Response::Attached { name, .. } => assert_eq!(name, format!("u{}", me().0)),
        r => panic!("{r:?}"),
    }
    ent.naming = Naming::Random;
    match call(&env, &Request::Attach(ent)) {
        Response::Attached { name, .. } => assert_eq!(name.len(), 16),
        r => panic!("{r:?}"),
    }

    // The owner's session may do everything; the same user in another session nothing.
    assert_eq!(
        env.gate.check(id, &own_caller(), need(Access::Write)),
        Verdict::Allow { bypass: true }
    );
    let other = OtherSession::start();
    assert_eq!(
        env.gate.check(id, &other.caller(), need(Access::Look)),
        Verdict::Deny
    );
    match call(&env, &Request::Status) {
        Response::Status { attaches, sessions } => {
            assert_eq!(attaches.len(), 3);
            assert_eq!(sessions.len(), 3);
            assert!(sessions.iter().all(|s| s.state == "active"));
        }
        r => panic!("{r:?}"),
    }

    assert!(call(
        &env,
        &Request::Detach {
            name: "proj".into()
        }
    )
    .is_ok_response());
}

trait IsOk {
    fn is_ok_response(&self) -> bool;
}
impl IsOk for Response {
    fn is_ok_response(&self) -> bool {
        matches!(self, Response::Ok)
    }
}

#[test]
fn passphrase_auth_replay_timeout_sleep_and_revoke() {
    let env = setup();
    let id = attach(&env, "proj");
    let (uid, _) = me();
    let other = OtherSession::start();

    // A passphrase authorization for the user (any of their sessions).
    let pass = Passphrase::new(b"correct horse".to_vec());
    let method = cloakfs_daemon::auth::passphrase_method(&pass, &Argon2Params::LEAST).unwrap();
    let mut g = grant("proj", Entity::User(uid), &["read"], method);
    // Deadlines count whole seconds, so a TTL of N lasts more than N - 1 s: 3 leaves the
    // steps between an authentication and the checks that rely on it 2 s on a loaded host.
    g.session_ttl = Some(3);
    g.on_timeout = OnTimeout::SleepAll;
    let authz = add_authz(&env, g);
    assert_eq!(authz, 2);
    match call(
        &env,
        &Request::AuthzList {
            name: "proj".into(),
        },
    ) {
        Response::Authorizations { authorizations } => {
            assert_eq!(authorizations.len(), 2);
            assert_eq!(authorizations[1].method, "passphrase");
        }
        r => panic!("{r:?}"),
    }
    assert_eq!(
        env.gate.check(id, &other.caller(), need(Access::Read)),
        Verdict::Deny
    );

    // Challenge, answer; a second answer on the same challenge fails.
    let mut c = Client::connect(&env.socket).unwrap();
    let auth_req = Request::Auth {
        name: "proj".into(),
        authz: Some(authz),
    };
    let answer = |resp: Response, pass: &Passphrase| match resp {
        Response::Challenge {
            authz,
            challenge,
            salt,
            memory_kib,
            iterations,
            parallelism,
        } => cloakfs_daemon::auth::answer_challenge(
            pass,
            "proj",
            authz,
            &challenge,
            &salt,
            memory_kib,
            iterations,
            parallelism,
        )
        .unwrap(),
        r => panic!("expected a challenge: {r:?}"),
    };
    // No challenge yet.
    assert!(err(c
        .call(&Request::AuthAnswer {
            answer: "AAAA".into()
        })
        .unwrap())
    .contains("no challenge"));
    // A wrong passphrase fails.
    let wrong = answer(
        c.call(&auth_req).unwrap(),
        &Passphrase::new(b"wrong".to_vec()),
    );
    assert!(err(c.call(&Request::AuthAnswer { answer: wrong }).unwrap())
        .contains("authentication failed"));
    let a = answer(c.call(&auth_req).unwrap(), &pass);
    let session = match c.call(&Request::AuthAnswer { answer: a.clone() }).unwrap() {
        Response::Authenticated { session } => session,
        r => panic!("{r:?}"),
    };
    assert!(
        err(c.call(&Request::AuthAnswer { answer: a.clone() }).unwrap()).contains("no challenge")
    );
    // Replayed on a fresh challenge: refused.
    let _ = c.call(&auth_req).unwrap();
    assert!(
        err(c.call(&Request::AuthAnswer { answer: a }).unwrap()).contains("authentication failed")
    );

    // The other session of the same user now reads (a User authorization), but not write.
    assert_eq!(
        env.gate.check(id, &other.caller(), need(Access::Read)),
        Verdict::Allow { bypass: false }
    );
    assert_eq!(
        env.gate.check(id, &other.caller(), need(Access::Write)),
        Verdict::Deny
    );

    // The session times out (ttl 3 s, real timer): a request then sleeps until the user
    // authenticates again.
    wait_until("the session to time out", || {
        status_sessions(&env)
            .iter()
            .any(|s| s.id == session && s.state == "timed-out")
    });
    wait_until("an invalidation", || {
        env.tree.0.lock().unwrap().invalidated.contains(&id)
    });
    let caller = other.caller();
    let gate = &env.gate;
    std::thread::scope(|scope| {
        let blocked = scope.spawn(move || gate.check(id, &caller, need(Access::Read)));
        wait_until("a sleeping request", || {
            status_sessions(&env)
                .iter()
                .any(|s| s.id == session && s.waiting == 1)
        });
        let a = answer(c.call(&auth_req).unwrap(), &pass);
        assert!(matches!(
            c.call(&Request::AuthAnswer { answer: a }).unwrap(),
            Response::Authenticated { session: s } if s == session
        ));
        assert_eq!(blocked.join().unwrap(), Verdict::Allow { bypass: false });
    });

    // Revoked: refused at once, and it cannot be re-authenticated.
    assert!(call(
        &env,
        &Request::Revoke {
            name: "proj".into(),
            session
        }
    )
    .is_ok_response());
    assert_eq!(
        env.gate.check(id, &other.caller(), need(Access::Read)),
        Verdict::Deny
    );
    assert!(err(call(&env, &auth_req)).contains("revoked"));
    match call(
        &env,
        &Request::Sessions {
            name: "proj".into(),
        },
    ) {
        Response::Sessions { sessions } => {
            assert!(sessions
                .iter()
                .any(|s| s.id == session && s.state == "revoked"))
        }
        r => panic!("{r:?}"),
    }

    // Detach: the tree drops it and the name is free again.
    assert!(call(
        &env,
        &Request::Detach {
            name: "proj".into()
        }
    )
    .is_ok_response());
    assert_eq!(env.tree.0.lock().unwrap().detached, vec![id]);
    assert!(err(call(
        &env,
        &Request::Detach {
            name: "proj".into()
        }
    ))
    .contains("no attach"));
    assert_eq!(
        env.gate.check(id, &own_caller(), need(Access::Read)),
        Verdict::Deny
    );
}
