//! Two real Syncthing instances on 127.0.0.1 sharing one folder: the sync-folder tests'
//! devices. Each has its own home, GUI/REST and listen ports on 127.0.0.1 and an API key;
//! discovery, relays, NAT traversal, usage and crash reporting and upgrades are off. Each
//! knows the other's device ID and address. Both processes are killed on drop.
//!
//! Syncthing's file-system watcher is off and periodic rescans are rare, so a change is
//! picked up when `sync` asks both sides to rescan: the tests decide when the devices talk.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The folder's ID on both devices.
pub const FOLDER: &str = "cloakfs-sync";

/// How long a wait for a state of the devices may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(120);
/// The pause between two polls of the REST API.
const POLL: Duration = Duration::from_millis(100);

/// One Syncthing instance.
pub struct Device {
    pub name: &'static str,
    pub home: PathBuf,
    /// The shared folder's copy on this device.
    pub folder: PathBuf,
    pub id: String,
    gui_port: u16,
    listen_port: u16,
    api_key: String,
    child: Option<Child>,
}

/// Two devices sharing `FOLDER`.
pub struct Pair {
    pub a: Device,
    pub b: Device,
    _tmp: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Device {
    fn generate(name: &'static str, root: &Path) -> Self {
        let home = root.join(format!("{name}-home"));
        let folder = root.join(format!("{name}-folder"));
        std::fs::create_dir_all(folder.join(".stfolder")).unwrap();
        let out = Command::new("syncthing")
            .args(["generate", "--no-default-folder", "--home"])
            .arg(&home)
            .output()
            .expect("syncthing is installed (scripts/install-deps.sh)");
        assert!(out.status.success(), "syncthing generate: {out:?}");
        let out = Command::new("syncthing")
            .arg("--home")
            .arg(&home)
            .arg("--device-id")
            .output()
            .unwrap();
        assert!(out.status.success(), "syncthing --device-id: {out:?}");
        let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
        Device {
            name,
            home,
            folder,
            id,
            gui_port: free_port(),
            listen_port: free_port(),
            api_key: format!("cloakfs-test-{name}-{}", std::process::id()),
            child: None,
        }
    }

    fn write_config(&self, other: &Device) {
        let device = |d: &Device, address: &str| {
            format!(
                r#"<device id="{}" name="{}" compression="metadata" introducer="false"><address>{address}</address><paused>false</paused><autoAcceptFolders>false</autoAcceptFolders></device>"#,
                d.id, d.name
            )
        };
        let config = format!(
            r#"<configuration version="36">
  <folder id="{FOLDER}" label="{FOLDER}" path="{path}" type="sendreceive" rescanIntervalS="3600" fsWatcherEnabled="false" ignorePerms="false" autoNormalize="true">
    <filesystemType>basic</filesystemType>
    <device id="{me}"></device>
    <device id="{them}"></device>
    <minDiskFree unit="%">0</minDiskFree>
    <versioning></versioning>
    <maxConflicts>10</maxConflicts>
  </folder>
  {my_device}
  {their_device}
  <gui enabled="true" tls="false" debugging="false">
    <address>127.0.0.1:{gui}</address>
    <apikey>{key}</apikey>
    <theme>default</theme>
  </gui>
  <options>
    <listenAddress>tcp://127.0.0.1:{listen}</listenAddress>
    <globalAnnounceEnabled>false</globalAnnounceEnabled>
    <localAnnounceEnabled>false</localAnnounceEnabled>
    <relaysEnabled>false</relaysEnabled>
    <reconnectionIntervalS>1</reconnectionIntervalS>
    <natEnabled>false</natEnabled>
    <startBrowser>false</startBrowser>
    <urAccepted>-1</urAccepted>
    <urSeen>3</urSeen>
    <autoUpgradeIntervalH>0</autoUpgradeIntervalH>
    <crashReportingEnabled>false</crashReportingEnabled>
    <minHomeDiskFree unit="%">0</minHomeDiskFree>
    <setLowPriority>false</setLowPriority>
  </options>
</configuration>
"#,
            path = self.folder.display(),
            me = self.id,
            them = other.id,
            my_device = device(self, "dynamic"),
            their_device = device(other, &format!("tcp://127.0.0.1:{}", other.listen_port)),
            gui = self.gui_port,
            key = self.api_key,
            listen = self.listen_port,
        );
        std::fs::write(self.home.join("config.xml"), config).unwrap();
    }

    fn start(&mut self) {
        let log = std::fs::File::create(self.home.join("syncthing.log")).unwrap();
        use std::os::unix::process::CommandExt;
        // Syncthing runs its work in a process of its own below the one started here: a
        // group of their own, so stop ends both.
        let child = Command::new("syncthing")
            .process_group(0)
            .arg("serve")
            .arg("--home")
            .arg(&self.home)
            .args(["--no-browser", "--no-restart", "--no-upgrade"])
            .env("STNOUPGRADE", "1")
            .env("STNORESTART", "1")
            .env("STNODEFAULTFOLDER", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        wait_until(&format!("{}'s REST API answers", self.name), || {
            self.try_request("GET", "/rest/system/ping").is_some()
        });
    }

    /// One REST call; `None` while the instance does not answer yet.
    fn try_request(&self, method: &str, path: &str) -> Option<serde_json::Value> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.gui_port)).ok()?;
        write!(
            stream,
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nX-API-Key: {}\r\nContent-Length: 0\r\n\r\n",
            self.api_key
        )
        .ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).ok()?;
        let response = String::from_utf8_lossy(&response);
        let (head, body) = response.split_once("\r\n\r\n")?;
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            return None;
        }
        Some(serde_json::from_str(body).unwrap_or(serde_json::Value::Null))
    }

    /// One REST call that must succeed.
    pub fn request(&self, method: &str, path: &str) -> serde_json::Value {
        self.try_request(method, path).unwrap_or_else(|| {
            panic!(
                "{}: {method} {path} failed; see {}",
                self.name,
                self.log_path().display()
            )
        })
    }

    pub fn log_path(&self) -> PathBuf {
        self.home.join("syncthing.log")
    }

    /// Whether this device is connected to `other`.
    fn connected_to(&self, other: &Device) -> bool {
        self.try_request("GET", "/rest/system/connections")
            .map(|c| c["connections"][&other.id]["connected"] == true)
            .unwrap_or(false)
    }

    /// This device's view of the folder, when it is idle with nothing left to fetch.
    fn settled_status(&self) -> Option<serde_json::Value> {
        let st = self.try_request("GET", &format!("/rest/db/status?folder={FOLDER}"))?;
        let idle = st["state"] == "idle" && st["needTotalItems"] == 0 && st["pullErrors"] == 0;
        idle.then_some(st)
    }

    /// Whether this device sees `other` as having everything (completion 100%).
    fn sees_complete(&self, other: &Device) -> bool {
        self.try_request(
            "GET",
            &format!("/rest/db/completion?folder={FOLDER}&device={}", other.id),
        )
        .map(|c| c["completion"] == 100 || c["completion"] == 100.0)
        .unwrap_or(false)
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(group) = rustix::process::Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Polls `cond` until it holds, failing the test with `what` after the deadline.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting until {what}");
        std::thread::sleep(POLL);
    }
}

impl Pair {
    /// Starts both devices, connected, sharing an empty folder.
    pub fn start() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let mut a = Device::generate("a", tmp.path());
        let mut b = Device::generate("b", tmp.path());
        a.write_config(&b);
        b.write_config(&a);
        a.start();
        b.start();
        let pair = Pair { a, b, _tmp: tmp };
        pair.wait_connected(true);
        pair
    }

    fn wait_connected(&self, connected: bool) {
        let what = if connected { "connected" } else { "apart" };
        wait_until(&format!("the devices are {what}"), || {
            self.a.connected_to(&self.b) == connected && self.b.connected_to(&self.a) == connected
        });
    }

    /// Parts the devices: each pauses the other, so changes stay on their side.
    pub fn pause(&self) {
        self.a
            .request("POST", &format!("/rest/system/pause?device={}", self.b.id));
        self.b
            .request("POST", &format!("/rest/system/pause?device={}", self.a.id));
        self.wait_connected(false);
    }

    /// Has both devices index their copy (as a file-system watcher would have while apart).
    pub fn scan(&self) {
        let scan = format!("/rest/db/scan?folder={FOLDER}");
        self.a.request("POST", &scan);
        self.b.request("POST", &scan);
    }

    /// Brings the devices back together, each having indexed what changed while apart.
    pub fn resume(&self) {
        self.scan();
        self.a
            .request("POST", &format!("/rest/system/resume?device={}", self.b.id));
        self.b
            .request("POST", &format!("/rest/system/resume?device={}", self.a.id));
        self.wait_connected(true);
    }

    /// Has both devices rescan their copy and waits until they agree: both idle with nothing
    /// to fetch, the same global state, each seeing the other complete, and a rescan finding
    /// nothing new (so a file Syncthing just wrote, such as a conflict copy, is indexed).
    pub fn sync(&self) {
        let scan = format!("/rest/db/scan?folder={FOLDER}");
        wait_until("both devices are in sync", || {
            self.a.request("POST", &scan);
            self.b.request("POST", &scan);
            let (Some(sa), Some(sb)) = (self.a.settled_status(), self.b.settled_status()) else {
                return false;
            };
            let same = [
                "globalFiles",
                "globalDirectories",
                "globalDeleted",
                "globalBytes",
            ]
            .iter()
            .all(|k| sa[k] == sb[k])
                && sa["localFiles"] == sa["globalFiles"]
                && sb["localFiles"] == sb["globalFiles"]
                && sa["localBytes"] == sa["globalBytes"]
                && sb["localBytes"] == sb["globalBytes"];
            same && self.a.sees_complete(&self.b) && self.b.sees_complete(&self.a) && {
                // Nothing changed while we looked: the same global version after a rescan.
                self.a.request("POST", &scan);
                self.b.request("POST", &scan);
                let again = |d: &Device, before: &serde_json::Value| {
                    d.settled_status().is_some_and(|now| {
                        now["globalFiles"] == before["globalFiles"]
                            && now["version"] == before["version"]
                            && now["localBytes"] == before["localBytes"]
                    })
                };
                again(&self.a, &sa) && again(&self.b, &sb)
            }
        });
    }

    /// How many files in the backing folders of both devices have a name that `wanted` takes.
    pub fn count_files(&self, wanted: impl Fn(&str) -> bool) -> usize {
        fn walk(dir: &Path, wanted: &dyn Fn(&str) -> bool) -> usize {
            std::fs::read_dir(dir)
                .unwrap()
                .map(Result::unwrap)
                .map(|e| {
                    if e.file_type().unwrap().is_dir() {
                        walk(&e.path(), wanted)
                    } else {
                        usize::from(wanted(&e.file_name().to_string_lossy()))
                    }
                })
                .sum()
        }
        walk(&self.a.folder, &wanted) + walk(&self.b.folder, &wanted)
    }

    /// Stops both devices.
    pub fn stop(mut self) {
        self.a.stop();
        self.b.stop();
    }
}

/// A cloakfs volume in the shared folder (`vol` under it), mounted on both devices.
pub struct SyncedVolume {
    pub a: super::Fixture,
    pub b: super::Fixture,
}

impl SyncedVolume {
    /// Makes the volume on device a and waits until device b has it.
    pub fn init(pair: &Pair) -> Self {
        Self::init_with(pair, |a| {
            let out = a.init(&[]);
            assert!(out.status.success(), "init: {}", super::stderr(&out));
        })
    }

    /// The same with a gocryptfs volume of default settings instead (for the comparison in
    /// docs/COMPARISON.md): mount it with `mount_gocryptfs`.
    pub fn init_gocryptfs(pair: &Pair) -> Self {
        Self::init_with(pair, super::Fixture::gocryptfs_init)
    }

    fn init_with(pair: &Pair, make: impl FnOnce(&super::Fixture)) -> Self {
        let mut a = super::Fixture::bare();
        a.cipher = pair.a.folder.join("vol");
        make(&a);
        let mut b = super::Fixture::bare();
        b.cipher = pair.b.folder.join("vol");
        std::fs::copy(&a.pass, &b.pass).unwrap();
        pair.sync();
        SyncedVolume { a, b }
    }

    /// Mounts both copies of a gocryptfs volume: `gocryptfs -passfile P [EXTRA] CIPHER MNT`.
    /// Its default entry and attribute timeouts are 1 s, as `--cache-timeout 1` is cloakfs's.
    pub fn mount_gocryptfs(&self, extra: &[&str]) -> (super::MountGuard, super::MountGuard) {
        (
            self.a.gocryptfs_mounted(extra),
            self.b.gocryptfs_mounted(extra),
        )
    }

    /// Mounts both copies with `--cache-timeout 1`, as USAGE.md advises for sync folders.
    /// `random_dir_ids`: new directories get random IDs, as before derived IDs (a test hook).
    pub fn mount(&self, random_dir_ids: bool) -> (super::MountGuard, super::MountGuard) {
        let mount = |f: &super::Fixture| {
            let out = f
                .bin()
                .env(
                    "CLOAKFS_TEST_RANDOM_DIR_IDS",
                    if random_dir_ids { "1" } else { "0" },
                )
                .args(["mount", "--cache-timeout", "1", "--passfile"])
                .arg(&f.pass)
                .arg(&f.cipher)
                .arg(&f.mnt)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(out.status.success(), "mount: {}", super::stderr(&out));
            assert!(super::is_mounted(&f.mnt));
            super::MountGuard(f.mnt.clone())
        };
        (mount(&self.a), mount(&self.b))
    }
}
