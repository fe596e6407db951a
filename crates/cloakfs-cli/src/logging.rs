//! Logging: standard error in the foreground; syslog or a log file once daemonized.
//! Log lines name backing files and blocks, never keys or plaintext names.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::sync::{Mutex, OnceLock};
use tracing::Level;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

enum Sink {
    Stderr,
    Syslog,
    File(File),
}

static SINK: OnceLock<Mutex<Sink>> = OnceLock::new();

fn sink() -> &'static Mutex<Sink> {
    SINK.get_or_init(|| Mutex::new(Sink::Stderr))
}

/// Installs the global subscriber writing to standard error. `CLOAKFS_LOG` (or `RUST_LOG`)
/// sets the filter; the default shows warnings and errors.
pub fn init() {
    let filter = EnvFilter::try_from_env("CLOAKFS_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(LogWriter)
        .with_target(false)
        .with_ansi(false)
        .try_init();
}

/// Sends further log lines to `file`, or to syslog when `None`.
pub fn redirect(file: Option<File>) {
    let mut s = sink().lock().unwrap_or_else(|e| e.into_inner());
    *s = match file {
        Some(f) => Sink::File(f),
        None => {
            let ident = c"cloakfs";
            // SAFETY: `ident` is a 'static C string, as openlog requires it to outlive the
            // connection.
            unsafe { libc::openlog(ident.as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
            Sink::Syslog
        }
    };
}

struct LogWriter;

/// One formatted event; written out in one piece when dropped.
pub struct Line {
    level: Level,
    buf: Vec<u8>,
}

impl Write for Line {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let mut s = sink().lock().unwrap_or_else(|e| e.into_inner());
        match &mut *s {
            Sink::Stderr => {
                let _ = io::stderr().write_all(&self.buf);
            }
            Sink::File(f) => {
                let _ = f.write_all(&self.buf);
            }
            Sink::Syslog => {
                let prio = match self.level {
                    Level::ERROR => libc::LOG_ERR,
                    Level::WARN => libc::LOG_WARNING,
                    Level::INFO => libc::LOG_INFO,
                    _ => libc::LOG_DEBUG,
                };
                let text = String::from_utf8_lossy(&self.buf)
                    .trim_end()
                    .replace('\0', "");
                if let Ok(c) = CString::new(text) {
                    // SAFETY: constant "%s" format with one valid NUL-terminated argument.
                    unsafe { libc::syslog(prio, c"%s".as_ptr(), c.as_ptr()) };
                }
            }
        }
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = Line;
    fn make_writer(&'a self) -> Line {
        Line {
            level: Level::INFO,
            buf: Vec::new(),
        }
    }
    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line {
        Line {
            level: *meta.level(),
            buf: Vec::new(),
        }
    }
}
